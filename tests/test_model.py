"""The XTTS network and its losses on hand-built batches with the pipeline's exact keys and dtypes.

Everything runs the `tiny` size on small shapes; a few models are built once per module.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data.text import PAD_ID
from myxtts.models import losses as losses_lib
from myxtts.models import sizes
from myxtts.models.losses import compute_losses
from myxtts.models.sizes import MODEL_SIZES, ModelSize, parameter_count
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
    tokens = rng.integers(4, VOCAB, (batch, text)).astype(np.int32)
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
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", max_text_length=64, max_mel_frames=96)
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
    assert set(outputs) == {"text_logits", "mel_before", "mel_after", "stop_logits"}
    assert outputs["text_logits"].shape == (2, 16, VOCAB)
    assert outputs["mel_before"].shape == (2, 32, N_MELS)
    assert outputs["mel_after"].shape == (2, 32, N_MELS)
    assert outputs["stop_logits"].shape == (2, 32)
    assert all(v.dtype == tf.float32 for v in outputs.values())
    # The tiny size has a postnet, so mel_after is a real correction of mel_before.
    assert not np.allclose(outputs["mel_after"], outputs["mel_before"])
    assert model.conditioning_latents(batch["reference_mel"], batch["reference_length"]).shape == (2, 4, 64)


def test_get_config_round_trip_gives_the_same_outputs(model):
    config = model.get_config()
    assert {k: config[k] for k in ("vocab_size", "n_mels", "size", "max_text_length", "max_mel_frames")} == {
        "vocab_size": VOCAB, "n_mels": N_MELS, "size": "tiny", "max_text_length": 64, "max_mel_frames": 96,
    }
    clone = XTTS.from_config(config)
    batch = make_batch(seed=1)
    clone(batch)
    clone.set_weights(model.get_weights())
    expected, actual = _numpy(model(batch)), _numpy(clone(batch))
    for key in expected:
        np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5, atol=1e-5, err_msg=key)
    # The alignment prior's slope is part of the config, and of what the network computes.
    slower = XTTS.from_config({**config, "frames_per_token": 2 * config["frames_per_token"]})
    slower(batch)
    slower.set_weights(model.get_weights())
    assert not np.allclose(_numpy(slower(batch))["mel_before"], expected["mel_before"], atol=1e-5)


def test_saved_model_file_loads_with_the_same_outputs(model, tmp_path):
    path = tmp_path / "xtts.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, XTTS)
    batch = make_batch(seed=1)
    expected, actual = _numpy(model(batch)), _numpy(loaded(batch))
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def test_unknown_size_and_bad_reduction_factor_are_rejected(monkeypatch):
    with pytest.raises(ValueError, match="tiny, small, base"):
        XTTS(VOCAB, N_MELS, size="huge")
    bad = ModelSize(**{**vars(MODEL_SIZES["tiny"]), "reduction_factor": 3})
    monkeypatch.setitem(sizes.MODEL_SIZES, "tiny", bad)
    with pytest.raises(ValueError, match="must divide 8"):
        XTTS(VOCAB, N_MELS, size="tiny")


def test_too_long_inputs_fail_with_what_to_change(model):
    with pytest.raises(ValueError, match="max_mel_frames"):
        model(make_batch(frames=128, mel_lengths=(128, 19)))


def test_parameter_count_counts_the_built_model(model):
    count = parameter_count("tiny", VOCAB, N_MELS, max_text_length=64, max_mel_frames=96)
    assert count == sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert 0.2e6 < count < 0.5e6  # tiny stays tiny
    assert 95e6 < parameter_count("base", 40, 80) < 110e6  # base is the promised ~100M


def test_mel_prediction_is_causal_and_shifted_by_one_group(model):
    """Group g (frames 4g..4g+3) is predicted from groups < g only: never from itself (that would
    be copying the target) and never from the future."""
    batch = make_batch(mel_lengths=(32, 32))
    changed = batch["mel"].numpy()
    changed[:, 12:16] += 3.0  # group 3
    before = model(batch)["mel_before"].numpy()
    after = model({**batch, "mel": tf.constant(changed)})["mel_before"].numpy()
    np.testing.assert_allclose(after[:, :16], before[:, :16], atol=1e-5)  # groups 0-3 unchanged
    assert np.abs(after[:, 16:20] - before[:, 16:20]).max() > 1e-3  # group 4 reads group 3


def test_padded_text_and_reference_do_not_influence_real_positions(model):
    batch = make_batch()
    noisy = {k: v.numpy().copy() for k, v in batch.items()}
    noisy["tokens"][1, 9:] = 5  # past text_length 9
    noisy["reference_mel"][1, 13:] = 7.0  # past reference_length 13
    noisy["mel"][1, 19:] = 4.0  # past mel_length 19
    expected, actual = model(batch), model({k: tf.constant(v) for k, v in noisy.items()})
    np.testing.assert_allclose(actual["text_logits"][1, :9], expected["text_logits"][1, :9], atol=1e-5)
    np.testing.assert_allclose(actual["mel_after"][1, :19], expected["mel_after"][1, :19], atol=1e-5)
    np.testing.assert_allclose(actual["stop_logits"][1, :19], expected["stop_logits"][1, :19], atol=1e-5)


def _per_example_losses(model, batch):
    return {k: v.numpy() for k, v in compute_losses(batch, model(batch), per_example=True).items()}


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
    outputs = {
        "text_logits": tf.constant(rng.normal(size=(2, 16, VOCAB)), tf.float32),
        "mel_before": tf.constant(rng.normal(-4, 2, (2, 32, N_MELS)), tf.float32),
        "mel_after": tf.constant(rng.normal(-4, 2, (2, 32, N_MELS)), tf.float32),
        "stop_logits": tf.constant(rng.normal(size=(2, 32)), tf.float32),
    }
    got = {k: v.numpy() for k, v in compute_losses(batch, outputs, per_example=True).items()}
    b = {k: v.numpy() for k, v in batch.items()}
    o = {k: v.numpy().astype(np.float64) for k, v in outputs.items()}
    for i in range(2):
        t, m = b["text_length"][i], b["mel_length"][i]
        logits = o["text_logits"][i, : t - 1]
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        text = -np.mean(log_probs[np.arange(t - 1), b["tokens"][i, 1:t]])
        target_mel = b["mel"][i, :m]
        mel = np.mean(np.abs(o["mel_before"][i, :m] - target_mel)) + np.mean(np.abs(o["mel_after"][i, :m] - target_mel))
        target = np.zeros(m)
        target[m - 1] = 1.0
        p = 1 / (1 + np.exp(-o["stop_logits"][i, :m]))
        stop = np.mean(-(losses_lib.STOP_POSITIVE_WEIGHT * target * np.log(p) + (1 - target) * np.log(1 - p)))
        np.testing.assert_allclose(got["text_loss"][i], text, rtol=1e-5)
        np.testing.assert_allclose(got["mel_loss"][i], mel, rtol=1e-5)
        np.testing.assert_allclose(got["stop_loss"][i], stop, rtol=1e-5)
        np.testing.assert_allclose(
            got["loss"][i], losses_lib.TEXT_WEIGHT * text + mel + losses_lib.STOP_WEIGHT * stop, rtol=1e-5
        )


def test_one_and_two_second_clips_have_their_stop_target_at_their_last_frame():
    c = DataConfig()
    one, two = c.frames_for_samples(c.sample_rate), c.frames_for_samples(2 * c.sample_rate)  # 87, 173
    frames = 176
    targets = losses_lib.stop_targets(tf.constant([one, two]), frames).numpy()
    assert targets.sum(axis=1).tolist() == [1.0, 1.0]
    assert targets[0, one - 1] == 1.0 and targets[1, two - 1] == 1.0
    logits = tf.zeros([2, frames])
    per_example = losses_lib.stop_loss(tf.constant([one, two]), logits).numpy()
    # Same logits, different targets: with logit 0 everywhere, BCE = (positive weight + n - 1) ln 2 / n.
    expected = [(losses_lib.STOP_POSITIVE_WEIGHT + n - 1) * math.log(2) / n for n in (one, two)]
    np.testing.assert_allclose(per_example, expected, rtol=1e-5)


def test_conditioning_encoder_receives_gradients(model):
    batch = make_batch()
    with tf.GradientTape() as tape:
        loss = compute_losses(batch, model(batch, training=True))["loss"]
    variables = model.conditioning_encoder.trainable_variables
    gradients = tape.gradient(loss, variables)
    assert len(variables) > 10
    for variable, gradient in zip(variables, gradients):
        assert gradient is not None and float(tf.norm(gradient)) > 0, variable.path


def test_different_references_give_different_outputs_and_latents_average(model):
    batch = make_batch()
    other = {**batch, "reference_mel": make_batch(seed=5)["reference_mel"]}
    first, second = model(batch), model(other)
    assert np.abs(first["mel_before"] - second["mel_before"]).max() > 1e-3
    latents = model.conditioning_latents(batch["reference_mel"], batch["reference_length"])
    averaged = model.conditioning_latents(batch["reference_mel"], batch["reference_length"], average=True)
    assert averaged.shape == (1, 4, 64)
    np.testing.assert_allclose(averaged[0], tf.reduce_mean(latents, axis=0), atol=1e-6)


def test_xla_compiled_forward_and_losses_match_eager(model):
    batch = make_batch()
    compiled = tf.function(lambda b: compute_losses(b, model(b)), jit_compile=True)
    eager = compute_losses(batch, model(batch))
    for name, value in compiled(batch).items():
        np.testing.assert_allclose(float(value), float(eager[name]), rtol=1e-4, err_msg=name)


# Unit roundoff of the half formats: bfloat16 keeps 8 significant bits, float16 11. Twice that bounds
# the losses' relative error against float32: they are means over many elements, where the roundings
# of the layers mostly cancel (measured on the tiny model: at most 1.7e-3 in bf16, 2.7e-4 in fp16);
# an op that loses range or precision in half (a softmax or norm not kept in float32) exceeds it.
HALF_LOSS_RTOL = {"mixed_bfloat16": 2 * 2.0**-8, "mixed_float16": 2 * 2.0**-11}


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_computes_in_half_and_matches_float32_losses(policy, model):
    batch = make_batch()
    reference = {name: float(value) for name, value in compute_losses(batch, model(batch, training=False)).items()}
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        half = XTTS(VOCAB, N_MELS, size="tiny", max_text_length=64, max_mel_frames=96)
        half(batch)
        half.set_weights(model.get_weights())  # the same float32 weights, computed in half
        outputs = half(batch, training=False)
        losses = compute_losses(batch, outputs)
    finally:
        keras.config.set_dtype_policy(previous)
    assert half.compute_dtype == policy.removeprefix("mixed_") and half.blocks[0].ff_in.kernel.dtype == "float32"
    assert all(v.dtype == tf.float32 for v in outputs.values())
    for name, value in losses.items():
        assert value.dtype == tf.float32, name
        np.testing.assert_allclose(float(value), reference[name], rtol=HALF_LOSS_RTOL[policy], err_msg=name)


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
    assert last["stop_loss"] < first["stop_loss"] and last["text_loss"] < first["text_loss"]


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
        model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny_dropout", max_text_length=64, max_mel_frames=96,
                     gradient_checkpointing=checkpointing)
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
