"""The XTTS network and its losses on hand-built batches with the pipeline's exact keys and dtypes.

Everything runs the `tiny` size on small shapes; a few models are built once per module.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.data.text import PAD_ID
from myxtts.models import losses as losses_lib
from myxtts.models import sizes
from myxtts.models.losses import compute_losses
from myxtts.models.sizes import MODEL_SIZES, parameter_count
from myxtts.models.xtts import XTTS

VOCAB = 12
N_MELS = 20
SILENCE = math.log(1e-5)  # the pipeline's padding value, log(data.log_floor)


def make_batch(seed=0, batch=2, frames=32, text=16, reference=24, mel_lengths=(32, 19), text_lengths=(16, 9),
               reference_lengths=(24, 13)):
    """A batch shaped like the pipeline's: padded with SILENCE and PAD_ID past the true lengths."""
    rng = np.random.default_rng(seed)
    mel_lengths, text_lengths, reference_lengths = (
        np.array(x[:batch], np.int32) for x in (mel_lengths, text_lengths, reference_lengths)
    )
    mel = rng.normal(-4.0, 2.0, (batch, frames, N_MELS)).astype(np.float32)
    mel[np.arange(frames)[None, :] >= mel_lengths[:, None]] = SILENCE
    tokens = rng.integers(2, VOCAB, (batch, text)).astype(np.int32)
    tokens[np.arange(text)[None, :] >= text_lengths[:, None]] = PAD_ID
    reference_mel = rng.normal(-4.0, 2.0, (batch, reference, N_MELS)).astype(np.float32)
    reference_mel[np.arange(reference)[None, :] >= reference_lengths[:, None]] = SILENCE
    return {
        "mel": tf.constant(mel),
        "mel_length": tf.constant(mel_lengths),
        "tokens": tf.constant(tokens),
        "text_length": tf.constant(text_lengths),
        "reference_mel": tf.constant(reference_mel),
        "reference_length": tf.constant(reference_lengths),
    }


def tiny_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny")
    model(make_batch())
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _numpy(outputs):
    return {k: v.numpy() for k, v in outputs.items()}


def test_outputs_have_exact_shapes_and_float32(model):
    batch = make_batch()
    outputs = model(batch)
    assert set(outputs) == {"mel", "mel_target", "mel_target_length", "alignment_scores", "aligned_length", "durations",
                            "log_durations"}
    assert outputs["mel"].shape == (2, 32, N_MELS) and outputs["mel_target"] is batch["mel"]
    assert outputs["alignment_scores"].shape == (2, 32, 16)
    assert outputs["durations"].shape == (2, 16) and outputs["durations"].dtype == tf.int32
    assert outputs["log_durations"].shape == (2, 16)
    assert all(outputs[k].dtype == tf.float32 for k in ("mel", "alignment_scores", "log_durations"))
    durations = outputs["durations"].numpy()
    # The recording's alignment: every frame on one token, every real token at least one frame.
    assert durations.sum(axis=1).tolist() == [32, 19]
    assert (durations[0] >= 1).all() and (durations[1, :9] >= 1).all() and (durations[1, 9:] == 0).all()
    assert model.voice(batch["reference_mel"], batch["reference_length"]).shape == (2, 64)


def test_get_config_round_trip_gives_the_same_outputs(model):
    config = model.get_config()
    assert {k: config[k] for k in ("vocab_size", "n_mels", "size", "gradient_checkpointing")} == {
        "vocab_size": VOCAB, "n_mels": N_MELS, "size": "tiny", "gradient_checkpointing": False}
    clone = XTTS.from_config(config)
    batch = make_batch(seed=1)
    clone(batch)
    clone.set_weights(model.get_weights())
    expected, actual = _numpy(model(batch)), _numpy(clone(batch))
    for key in expected:
        np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_saved_model_file_loads_with_the_same_outputs(model, tmp_path):
    path = tmp_path / "xtts.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, XTTS)
    batch = make_batch(seed=1)
    expected, actual = _numpy(model(batch)), _numpy(loaded(batch))
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def test_unknown_size_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match="tiny, small, base"):
        XTTS(VOCAB, N_MELS, size="huge")


def test_parameter_count_counts_the_built_model(model):
    count = parameter_count("tiny", VOCAB, N_MELS)
    assert count == sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert 0.1e6 < count < 0.4e6  # tiny stays tiny
    assert 1.4e6 < parameter_count("small", 90, 80) < 2.0e6  # the sizes promised in sizes.py
    assert 22e6 < parameter_count("base", 90, 80) < 28e6


def test_padded_text_mel_and_reference_do_not_influence_real_positions(model):
    batch = make_batch()
    noisy = {k: v.numpy().copy() for k, v in batch.items()}
    noisy["tokens"][1, 9:] = 5  # past text_length 9
    noisy["reference_mel"][1, 13:] = 7.0  # past reference_length 13
    noisy["mel"][1, 19:] = 4.0  # past mel_length 19
    expected, actual = model(batch), model({k: tf.constant(v) for k, v in noisy.items()})
    np.testing.assert_allclose(actual["mel"][1, :19], expected["mel"][1, :19], atol=1e-5)
    np.testing.assert_allclose(actual["alignment_scores"][1, :19, :9], expected["alignment_scores"][1, :19, :9], atol=1e-5)
    np.testing.assert_array_equal(actual["durations"], expected["durations"])
    np.testing.assert_allclose(actual["log_durations"][1, :9], expected["log_durations"][1, :9], atol=1e-5)


def test_each_frame_is_decoded_from_its_own_tokens_neighbourhood(model):
    """The decoder is local: changing the last token moves frames near its span, not the first ones."""
    batch = make_batch(mel_lengths=(32, 32), text_lengths=(8, 8))
    outputs = model(batch)
    last_start = int(np.cumsum(outputs["durations"][0])[6])  # first frame of token 7
    changed = batch["tokens"].numpy()
    changed[0, 7] = (changed[0, 7] + 1) % VOCAB or 2
    text = model.encode_text(tf.constant(changed), batch["text_length"], model.voice(batch["reference_mel"], batch["reference_length"]))
    original = model.encode_text(batch["tokens"], batch["text_length"], model.voice(batch["reference_mel"], batch["reference_length"]))
    mel_changed = model.decode(text, outputs["durations"], 32, batch["mel_length"]).numpy()
    mel_original = model.decode(original, outputs["durations"], 32, batch["mel_length"]).numpy()
    assert np.abs(mel_changed[0, last_start:] - mel_original[0, last_start:]).max() > 1e-3
    # The text encoder's attention spreads the change over the sentence a little, but the frames of
    # the first token, far from token 7's span, move far less than those of token 7.
    reach = 2 * 2 * 5  # two decoder blocks of kernel 5 (tiny), dilations 1, 2
    if last_start > reach:
        far = np.abs(mel_changed[0, :4] - mel_original[0, :4]).max()
        near = np.abs(mel_changed[0, last_start:] - mel_original[0, last_start:]).max()
        assert far < near


def _per_example_losses(model, batch):
    return {k: v.numpy() for k, v in compute_losses(batch, model(batch), per_example=True).items()}


def test_a_decoder_window_decodes_one_stretch_of_each_clip_as_the_whole_clip_would():
    batch = make_batch()  # clips of 32 and 19 frames
    keras.utils.set_random_seed(0)
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", decoder_window=20)  # tiny has no dropout
    model(batch)
    whole = _numpy(model(batch, training=False))
    starts = set()
    for _ in range(4):
        windowed = _numpy(model(batch, training=True))
        assert windowed["mel"].shape == windowed["mel_target"].shape == (2, 20, N_MELS)
        np.testing.assert_array_equal(windowed["mel_target_length"], [20, 19])  # the short clip is whole
        np.testing.assert_array_equal(windowed["mel_target"][1, :19], batch["mel"][1, :19])
        long_clip = batch["mel"][0].numpy()
        start = [s for s in range(13) if np.array_equal(windowed["mel_target"][0], long_clip[s : s + 20])]
        assert len(start) == 1, "the target is not a stretch of the clip"
        starts.add(start[0])
        # Frames further from the window's edges than the decoder's receptive field (2 blocks,
        # kernel 5, dilations 1 and 2: 6 frames) are decoded exactly as in the whole clip.
        s = start[0]
        np.testing.assert_allclose(windowed["mel"][0, 6:14], whole["mel"][0, s + 6 : s + 14], atol=1e-5)
        np.testing.assert_allclose(windowed["mel"][1, 6:13], whole["mel"][1, 6:13], atol=1e-5)
    assert len(starts) > 1, "every draw took the same window"


def test_the_silent_token_gets_no_frames_and_the_others_share_the_clip():
    batch = make_batch()
    silent = 3
    tokens = batch["tokens"].numpy()
    tokens[0, [2, 5, 9]] = silent  # word spaces inside the first sentence
    tokens[1, 4] = silent
    batch = {**batch, "tokens": tf.constant(tokens)}
    keras.utils.set_random_seed(0)
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", silent_token=silent)
    outputs = _numpy(model(batch))
    durations = outputs["durations"]
    np.testing.assert_array_equal(outputs["aligned_length"], [13, 8])
    assert durations.sum(axis=1).tolist() == [32, 19]  # every frame on a sounding token
    assert (durations[tokens == silent] == 0).all()
    sounding = (tokens != silent) & (np.arange(16)[None] < np.array([16, 9])[:, None])
    assert (durations[sounding] >= 1).all() and (durations[~sounding] == 0).all()
    # The scores are over the sounding tokens packed in order: the first row's token 3 is its 3rd.
    packed = [t for t in tokens[0] if t != silent]
    expected = model.alignment_scores(batch["mel"][:1], batch["mel_length"][:1], tf.constant([packed]), tf.constant([13]))
    np.testing.assert_allclose(outputs["alignment_scores"][0, :, :13], expected.numpy()[0], atol=1e-5)
    assert np.isfinite(compute_losses(batch, model(batch))["align_loss"].numpy())


def test_losses_ignore_padding_content_and_padding_length(model):
    batch = make_batch()
    expected = _per_example_losses(model, batch)
    # Garbage in the padding.
    noisy = {k: v.numpy().copy() for k, v in batch.items()}
    noisy["mel"][1, 19:] = 9.0
    noisy["tokens"][1, 9:] = 7
    noisy["reference_mel"][1, 13:] = -2.0
    # More padding: the next bucket up (8 more frames, text and reference positions).
    longer = make_batch(frames=40, text=24, reference=32)
    for key in ("mel", "tokens", "reference_mel"):
        padded = longer[key].numpy()
        padded[:, : noisy[key].shape[1]] = noisy[key]
        noisy[key] = padded
    actual = _per_example_losses(model, {k: tf.constant(v) for k, v in noisy.items()})
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_batch_loss_is_the_mean_of_single_example_losses(model):
    """What gradient accumulation needs: each example counted by its own length, then a plain mean."""
    batch = make_batch()
    together = compute_losses(batch, model(batch))
    alone = []
    for i in range(2):
        m, t, r = int(batch["mel_length"][i]), int(batch["text_length"][i]), int(batch["reference_length"][i])
        single = {
            "mel": batch["mel"][i : i + 1, : -(-m // 8) * 8],  # each in its own bucket
            "mel_length": batch["mel_length"][i : i + 1],
            "tokens": batch["tokens"][i : i + 1, : -(-t // 8) * 8],
            "text_length": batch["text_length"][i : i + 1],
            "reference_mel": batch["reference_mel"][i : i + 1, :r],
            "reference_length": batch["reference_length"][i : i + 1],
        }
        alone.append(compute_losses(single, model(single)))
    for name, value in together.items():
        assert value.dtype == tf.float32 and value.shape == ()
        np.testing.assert_allclose(float(value), np.mean([float(a[name]) for a in alone]), rtol=1e-5, err_msg=name)


def test_losses_match_a_numpy_reference():
    rng = np.random.default_rng(3)
    batch = make_batch()
    durations = np.array([[2] * 16, [3, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    scores = np.log(np.full((2, 32, 16), 1 / 16))
    outputs = {
        "mel": tf.constant(rng.normal(-4, 2, (2, 32, N_MELS)), tf.float32),
        "alignment_scores": tf.constant(scores, tf.float32),
        "durations": tf.constant(durations),
        "log_durations": tf.constant(rng.normal(1, 0.5, (2, 16)), tf.float32),
        "mel_target": batch["mel"],
        "mel_target_length": batch["mel_length"],
        "aligned_length": batch["text_length"],
    }
    got = {k: v.numpy() for k, v in compute_losses(batch, outputs, per_example=True).items()}
    b = {k: v.numpy() for k, v in batch.items()}
    o = {k: v.numpy().astype(np.float64) for k, v in outputs.items()}
    for i in range(2):
        t, m = b["text_length"][i], b["mel_length"][i]
        mel = np.mean(np.abs(o["mel"][i, :m] - b["mel"][i, :m]))
        duration = np.mean((o["log_durations"][i, :t] - np.log1p(durations[i, :t])) ** 2)
        # Uniform scores: every monotonic path has probability (1/16)^m; there are C(m-1, t-1) of them.
        align = -(math.log(math.comb(m - 1, t - 1)) + m * math.log(1 / 16)) / m
        np.testing.assert_allclose(got["mel_loss"][i], mel, rtol=1e-5)
        np.testing.assert_allclose(got["duration_loss"][i], duration, rtol=1e-5)
        np.testing.assert_allclose(got["align_loss"][i], align, rtol=1e-4)
        np.testing.assert_allclose(
            got["loss"][i], mel + losses_lib.ALIGN_WEIGHT * align + losses_lib.DURATION_WEIGHT * duration, rtol=1e-5)


def test_every_part_learns_from_its_own_loss(model):
    """The classifier from the alignment loss only, the duration predictor from the duration loss
    only (its input is a stop-gradient copy), and the text and voice encoders from the mel loss."""
    batch = make_batch()

    def gradients(loss_name, layer):
        with tf.GradientTape() as tape:
            loss = compute_losses(batch, model(batch, training=True))[loss_name]
        return [g for g in tape.gradient(loss, layer.trainable_variables)]

    def reached(grads):
        return all(g is not None and float(tf.norm(tf.convert_to_tensor(g))) > 0 for g in grads)

    def untouched(grads):
        return all(g is None or float(tf.norm(tf.convert_to_tensor(g))) == 0 for g in grads)

    assert reached(gradients("align_loss", model.frame_classifier)) and untouched(gradients("mel_loss", model.frame_classifier))
    assert reached(gradients("duration_loss", model.duration_predictor))
    assert untouched(gradients("duration_loss", model.text_embedding))
    assert len(model.conditioning_encoder.trainable_variables) > 10
    assert reached(gradients("mel_loss", model.conditioning_encoder)) and reached(gradients("mel_loss", model.text_embedding))


def test_the_speaker_loss_rewards_a_reference_that_matches_its_clips_voice():
    # InfoNCE over the batch: matched voices score low, the same voices paired wrongly score high,
    # one clip alone has nothing to contrast (loss 0); against a direct formula for two clips.
    rng = np.random.default_rng(3)
    voices = tf.constant(rng.normal(size=(4, 8)).astype(np.float32))
    matched = losses_lib.speaker_loss(voices, voices)
    shuffled = losses_lib.speaker_loss(voices, tf.roll(voices, 1, axis=0))
    assert float(tf.reduce_max(matched)) < float(tf.reduce_min(shuffled))
    assert float(losses_lib.speaker_loss(voices[:1], voices[:1])[0]) == pytest.approx(0.0, abs=1e-6)
    a, b = voices[:2].numpy(), voices[2:].numpy()
    a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
    logits = a @ b.T / losses_lib.SPEAKER_TEMPERATURE
    rows = -np.log(np.exp(logits[0, 0]) / np.exp(logits[0]).sum())
    columns = -np.log(np.exp(logits[0, 0]) / np.exp(logits[:, 0]).sum())
    assert float(losses_lib.speaker_loss(voices[:2], voices[2:])[0]) == pytest.approx(0.5 * (rows + columns), rel=1e-5)


def test_a_speaker_weight_trains_the_conditioning_encoder_on_both_clips(model):
    keras.utils.set_random_seed(0)
    network = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", speaker_loss_weight=0.5, reference_frames=16)
    batch = make_batch()
    network(batch)
    with tf.GradientTape() as tape:
        outputs = network(batch, training=True)
        losses = compute_losses(batch, outputs, speaker_weight=0.5)
    assert outputs["voice"].shape == outputs["clip_voice"].shape == (2, network.spec.d_model)
    assert float(losses["loss"]) == pytest.approx(float(losses["mel_loss"] + losses["align_loss"]
                                                        + 0.1 * losses["duration_loss"] + 0.5 * losses["speaker_loss"]), rel=1e-5)
    gradients = tape.gradient(losses["speaker_loss"], network.conditioning_encoder.trainable_variables)
    assert all(g is not None for g in gradients) and float(tf.linalg.global_norm(gradients)) > 0
    # Off (the default), nothing changes: no voices in the outputs, no speaker_loss.
    plain = model(batch, training=True)
    assert "clip_voice" not in plain and "speaker_loss" not in compute_losses(batch, plain)


def test_different_references_give_different_outputs_and_voices_average(model):
    batch = make_batch()
    other = {**batch, "reference_mel": make_batch(seed=5)["reference_mel"]}
    first, second = model(batch), model(other)
    assert np.abs(first["mel"] - second["mel"]).max() > 1e-3
    latents = model.conditioning_encoder(batch["reference_mel"], batch["reference_length"])
    averaged = model.voice(batch["reference_mel"], batch["reference_length"], average=True)
    assert averaged.shape == (1, 64)
    expected = model.voice_projection(tf.reduce_mean(latents, axis=[0, 1])[None])
    np.testing.assert_allclose(averaged, expected, atol=1e-5)


def test_xla_compiled_forward_and_losses_match_eager(model):
    batch = make_batch()
    compiled = tf.function(lambda b: compute_losses(b, model(b)), jit_compile=True)
    eager = compute_losses(batch, model(batch))
    for name, value in compiled(batch).items():
        np.testing.assert_allclose(float(value), float(eager[name]), rtol=1e-4, err_msg=name)


# Mixed precision against float32 with the same weights. The tolerances are what the formats
# allow through the network: bfloat16 keeps 8 significant bits (relative rounding 2^-8 = 0.4%) and
# float16 11 (0.05%); after a dozen layers, each adding such an error, the mel loss (an average of
# |error| over thousands of values, which cancels much of it) moves by well under 10x one
# rounding: 4% and 0.5%. The alignment scores pass through the classifier only (3 layers).
@pytest.mark.parametrize("policy, tolerance", [("mixed_bfloat16", 0.04), ("mixed_float16", 0.005)])
def test_mixed_precision_matches_float32_within_its_rounding(policy, tolerance):
    batch = make_batch()
    reference = tiny_model(seed=3)
    expected = _numpy(reference(batch))
    expected_losses = {k: float(v) for k, v in compute_losses(batch, reference(batch)).items()}
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = XTTS(VOCAB, N_MELS, size="tiny")
        model(batch)
        model.set_weights(reference.get_weights())
        outputs = model(batch)
        losses = compute_losses(batch, outputs)
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.compute_dtype == policy.removeprefix("mixed_") and model.decoder_blocks[0].conv.kernel.dtype == "float32"
    assert all(outputs[k].dtype == tf.float32 for k in ("mel", "alignment_scores", "log_durations"))
    for name in ("loss", "mel_loss", "align_loss"):
        assert float(losses[name]) == pytest.approx(expected_losses[name], rel=tolerance), name
    scale = np.abs(expected["mel"]).mean()
    assert np.abs(outputs["mel"].numpy() - expected["mel"]).mean() < 10 * tolerance * scale


def _fused_adam(variables, learning_rate):
    """Adam as TensorFlow's fused kernel, one op per variable. Tracing Keras's Adam (dozens of ops
    per variable) into the step would take most of this test's time on a 2-core machine."""
    slots = [(tf.Variable(tf.zeros(v.shape)), tf.Variable(tf.zeros(v.shape))) for v in variables]
    step = tf.Variable(0.0)
    beta1, beta2 = 0.9, 0.999

    def apply(gradients):
        step.assign_add(1.0)
        for variable, gradient, (m, v) in zip(variables, gradients, slots):
            tf.raw_ops.ResourceApplyAdam(
                var=variable.handle, m=m.handle, v=v.handle, beta1_power=beta1**step, beta2_power=beta2**step,
                lr=learning_rate, beta1=beta1, beta2=beta2, epsilon=1e-7, grad=tf.convert_to_tensor(gradient),
            )

    return apply


def test_loss_goes_down_on_a_fixed_batch():
    model = tiny_model(seed=1)
    batch = make_batch(seed=2)
    apply_adam = _fused_adam(model.trainable_variables, 3e-3)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            losses = compute_losses(batch, model(batch, training=True))
        apply_adam(tape.gradient(losses["loss"], model.trainable_variables))
        return losses

    history = [{k: float(v) for k, v in train_step().items()} for _ in range(30)]
    first, last = history[0], history[-1]
    assert last["loss"] < 0.5 * first["loss"], (first, last)
    assert last["mel_loss"] < 0.5 * first["mel_loss"]
    assert last["align_loss"] < first["align_loss"] and last["duration_loss"] < first["duration_loss"]


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gradient_checkpointing_gives_the_same_gradients(dropout, monkeypatch):
    # With dropout, the recomputed blocks must drop the units the forward pass dropped; a fresh
    # mask in the recomputation gives gradients of another network than the loss was computed on.
    import dataclasses

    monkeypatch.setitem(MODEL_SIZES, "tiny_dropout", dataclasses.replace(MODEL_SIZES["tiny"], dropout=dropout))
    batch = make_batch()
    results = []
    for checkpointing in (False, True):
        keras.utils.set_random_seed(0)  # the same weights and the same dropout seeds in both models
        model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny_dropout", gradient_checkpointing=checkpointing)
        model(batch)
        if results:
            model.set_weights(results[0][2])
        with tf.GradientTape() as tape:
            loss = compute_losses(batch, model(batch, training=True))["loss"]
        grads = tape.gradient(loss, model.trainable_variables)
        results.append((float(loss), [tf.convert_to_tensor(g).numpy() for g in grads], model.get_weights()))
    assert all(np.abs(g).sum() > 0 for g in results[0][1][:3])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert XTTS.from_config(model.get_config()).gradient_checkpointing is True


@pytest.mark.parametrize("jit_compile,frames_per_iteration,expected", [
    (False, 0, (1, True)),  # a graph step on this CPU: one frame per iteration, the loops compiled alone
    (True, 0, (1, False)),  # an XLA step compiles the loops with everything else
    (True, 4, (4, False)),  # the config's setting wins
    ("eager", 0, (1, False)),  # --enable-eager-debug: every op as written
])
def test_compiling_the_step_sets_how_the_alignment_loops_run(jit_compile, frames_per_iteration, expected):
    from myxtts.training.step import TrainingModel

    network = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", alignment_frames_per_iteration=frames_per_iteration)
    model = TrainingModel(network)
    if jit_compile == "eager":
        model.compile(optimizer="sgd", jit_compile=False, run_eagerly=True)
    else:
        model.compile(optimizer="sgd", jit_compile=jit_compile)
    loops = network.alignment_loops
    assert (loops.frames_per_iteration, loops.compile) == expected
    # and the step runs them: the loss is the same as with the default loops
    batch = make_batch()
    outputs = network(batch, training=False)
    ours = compute_losses(batch, outputs, loops=loops)["align_loss"]
    assert float(ours) == pytest.approx(float(compute_losses(batch, outputs)["align_loss"]), rel=1e-5)
