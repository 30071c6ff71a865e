"""The training loop on the tiny model: accumulation, faults, precision, compilation, checkpoints."""

import dataclasses
import json
import math
import re
import types
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from myxtts import config as config_lib
from myxtts.config import load_config
from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary
from myxtts.models.losses import LOSS_NAMES
from myxtts.models.xtts import network_for
from myxtts.training.step import TrainingModel
from myxtts.training.run_folder import prepare_text
from myxtts.training.optimizers import build_optimizer
from myxtts.training.trainer import train

from conftest import TRAINED_RUN, tiny_config


_config = tiny_config


@pytest.fixture(scope="module")
def setup(demo_corpus):
    config = _config(demo_corpus)
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    batch = next(iter(build_dataset(config, rows, training=False, vocabulary=vocabulary)))
    return config, vocabulary, batch


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


def _model(vocabulary, config, optimizer, seed=0):
    keras.utils.set_random_seed(seed)
    network = network_for(config, len(vocabulary))  # model.size is tiny in _config
    model = TrainingModel(network)
    model.compile(optimizer=optimizer, jit_compile=False)
    return model


def _weights(model):
    return [w.numpy().copy() for w in model.network.trainable_variables]


def _slice(batch, start, stop):
    return {k: v[start:stop] for k, v in batch.items()}


def test_accumulation_matches_one_big_batch(setup):
    config, vocabulary, batch = setup
    # SGD makes the update proportional to the gradient, so the comparison is of the accumulation
    # itself (Adam's first step is +-lr per element and would amplify rounding near zero).
    big = _model(vocabulary, config, keras.optimizers.SGD(0.5))
    small = _model(vocabulary, config, keras.optimizers.SGD(0.5, gradient_accumulation_steps=2))
    for model in (big, small):
        model(batch)
        model.optimizer.build(model.network.trainable_variables)
    small.network.set_weights(big.network.get_weights())
    big.train_step(batch)  # one update from 4 clips
    before = _weights(small)
    small.train_step(_slice(batch, 0, 2))  # accumulates, does not update yet
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(small)))
    small.train_step(_slice(batch, 2, 4))  # the update from the average of the two micro-batches
    for a, b in zip(_weights(big), _weights(small)):
        np.testing.assert_allclose(a, b, atol=1e-6)  # fp32 summation order only


def test_validation_runs_in_graph_mode_when_the_train_step_is_xla_compiled(setup, monkeypatch):
    # XLA compiles a program per batch shape (minutes each on an H100); validation meets every bucket
    # too, for a few batches per evaluation. Keras reads jit_compile when it builds each function.
    config, vocabulary, batch = setup
    model = _model(vocabulary, config, keras.optimizers.AdamW(1e-3))
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    built, real = [], tf.function

    def spy(*args, **kwargs):
        built.append(kwargs.get("jit_compile"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tf, "function", spy)
    model.make_train_function(force=True)
    train = built[:]
    built.clear()
    model.make_test_function(force=True)
    monkeypatch.undo()
    assert True in train and True not in built and False in built, (train, built)
    assert model.jit_compile is True  # only the validation function was built without it
    # It evaluates what a model without XLA evaluates (its loops compiled alone, as in graph mode).
    plain = _model(vocabulary, config, keras.optimizers.AdamW(1e-3))
    model(batch), plain(batch)  # every variable built before the weights are copied
    plain.network.set_weights(model.network.get_weights())
    dataset = tf.data.Dataset.from_tensors(batch)
    ours = model.evaluate(dataset, verbose=0, return_dict=True)
    theirs = plain.evaluate(dataset, verbose=0, return_dict=True)
    assert ours.keys() == theirs.keys() and np.isfinite(ours["loss"])
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, err_msg=name)


def test_nonfinite_loss_skips_the_update(setup):
    config, vocabulary, batch = setup
    model = _model(vocabulary, config, keras.optimizers.AdamW(1e-3))
    model(batch)
    model.optimizer.build(model.network.trainable_variables)
    poisoned = dict(batch, mel=tf.tensor_scatter_nd_update(batch["mel"], [[0, 0, 0]], [math.nan]))
    before = _weights(model)
    logs = model.train_step(poisoned)
    assert int(logs["nonfinite_in_a_row"]) == 1 and not math.isfinite(float(logs["grad_norm"]))
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(model)))
    logs = model.train_step(batch)
    assert int(logs["nonfinite_in_a_row"]) == 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, _weights(model)))


@pytest.mark.slow
def test_the_update_compiled_alone_as_on_a_gpu_moves_the_weights_as_the_graphs_does(setup):
    # A GPU runs the graph-mode step's optimizer update (norm, finite check, clipping, AdamW) as one XLA
    # program (TrainingModel.compile); a CPU keeps it in the step's graph. Both must train alike,
    # a non-finite step skipped included.
    config, vocabulary, batch = setup
    poisoned = dict(batch, mel=tf.tensor_scatter_nd_update(batch["mel"], [[0, 0, 0]], [math.nan]))
    runs = {}
    for compiled in (False, True):
        # FusedAdamW with clipping, at its full rate from the first update.
        model = _model(vocabulary, config, build_optimizer(dataclasses.replace(config.training, warmup_steps=0), 1))
        model(batch)
        model.optimizer.build(model.network.trainable_variables)
        start = _weights(model)
        assert model.update_compiled is None  # a CPU
        if compiled:
            model.update_compiled = tf.function(model._update, jit_compile=True)
        step = tf.function(model.train_step)
        logs = [{name: float(value) for name, value in step(b).items()} for b in (batch, poisoned, batch, batch)]
        runs[compiled] = logs, _weights(model), int(model.optimizer.iterations)
        assert max(np.abs(a - b).max() for a, b in zip(_weights(model), start)) > 1e-3  # it trained
    (graph_logs, graph_weights, graph_updates), (xla_logs, xla_weights, xla_updates) = runs[False], runs[True]
    assert graph_updates == xla_updates == 3
    assert [log["nonfinite_in_a_row"] for log in xla_logs] == [0, 1, 0, 0]
    for graph_log, xla_log in zip(graph_logs, xla_logs):
        np.testing.assert_allclose(xla_log["grad_norm"], graph_log["grad_norm"], rtol=1e-4)  # summation order
    for a, b in zip(graph_weights, xla_weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)  # an update moves a weight by ~1e-3


def test_fp16_loss_scaling_step_matches_float32(setup):
    config, vocabulary, batch = setup
    steps = {}
    for policy in ("float32", "mixed_float16"):
        keras.config.set_dtype_policy(policy)
        optimizer = keras.optimizers.AdamW(1e-3, global_clipnorm=1.0)
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model = _model(vocabulary, config, optimizer)
        model(batch)
        model.optimizer.build(model.network.trainable_variables)
        if policy == "float32":
            weights = model.network.get_weights()
        else:
            model.network.set_weights(weights)  # the same float32 weights
        logs = model.train_step(batch)  # eagerly: the same ops, without paying for a trace
        steps[policy] = {name: float(value) for name, value in logs.items()}
    fp16, fp32 = steps["mixed_float16"], steps["float32"]
    assert fp16["loss_scale"] > 1 and fp32["loss_scale"] == 1 and fp16["nonfinite_in_a_row"] == 0
    # Twice float16's unit roundoff (2**-11): the losses are means and the gradient norm a root of a
    # sum over every weight, where roundings mostly cancel (measured: at most 2.5e-4 relative). A
    # gradient norm reported before unscaling would be loss_scale (32768) times too large.
    for name in (*LOSS_NAMES, "grad_norm"):
        np.testing.assert_allclose(fp16[name], fp32[name], rtol=2 * 2.0**-11, err_msg=name)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_waveform_batch_builds_the_training_model_in_mixed_precision(demo_corpus, policy):
    """data.mel_on_device (the experimental level, a GPU's capacity route) under bf16 or fp16 stopped every run
    before its first step: Keras casts the batch a model is called on to the policy's dtype, and the STFT takes
    float32 only ("Tensor conversion requested dtype float32 for Tensor with dtype float16")."""
    from myxtts.training.trainer import build_training_model

    config = _config(demo_corpus, "data.mel_on_device=true")
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    batch = next(iter(build_dataset(config, rows, training=False, vocabulary=vocabulary)))
    assert "audio" in batch and "mel" not in batch
    keras.config.set_dtype_policy(policy)
    model = build_training_model(config, len(vocabulary), policy, batch)  # calls the model on the batch
    assert model.optimizer.built


def test_a_checkpoint_holds_every_weight_and_optimizer_variable(setup, tmp_path):
    """Saved, then loaded into a second network and optimizer built from other random numbers: every
    variable comes back exactly. (Keras' own object graph once saved 41 of 89 weights, silently.)"""
    from myxtts.training.checkpoints import Checkpoints, CheckpointError, restore_network
    from myxtts.training.optimizers import build_optimizer

    config, vocabulary, batch = setup
    models = []
    for seed in (0, 1):
        model = _model(vocabulary, config, build_optimizer(config.training, 10), seed=seed)
        model.train_step(batch)  # builds the optimizer and fills its moments
        models.append(model)
    saved, loaded = models
    # Another seed: every randomly initialised weight starts different (biases and norms are constants).
    random = [(a, b) for a, b in zip(_weights(saved), _weights(loaded)) if np.std(a) > 0]
    assert len(random) > 30 and all(not np.array_equal(a, b) for a, b in random)
    path = Checkpoints(tmp_path / "a", saved.network, saved.optimizer, "adamw", "").save("latest", 7)
    reader = tf.train.load_checkpoint(path)
    stored = [n for n in reader.get_variable_to_shape_map() if n != "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
              and not n.startswith("_CHECKPOINTABLE")]
    assert len(stored) == len(saved.network.weights) + len(saved.optimizer.variables)
    # Names without the model's own ("training_model/xtts", "xtts_1"...), which vary between runs.
    assert not any("xtts" in name or "training_model" in name for name in stored), stored[:5]
    assert any(name.startswith("network/text_attention_0.Sattention") for name in stored), stored[:5]
    restored = Checkpoints(tmp_path / "a", loaded.network, loaded.optimizer, "adamw", "").restore()
    assert restored.step == 7 and restored.optimizer_restored
    for a, b in zip(saved.network.weights + saved.optimizer.variables, loaded.network.weights + loaded.optimizer.variables):
        if a.path.split("/")[-1] == "iteration":  # adam_w/iteration, or adam_w_8/... in a busy process
            # Keras' micro-batch counter is restored from the update count (step 7 x accumulation 10),
            # so that a resume with another accumulation keeps the step (issue 25, item 2).
            assert int(b.numpy()) == 7 * 10
            continue
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    # A checkpoint of another model size is a clear error, not random weights.
    other = network_for(load_config(overrides=["model.size=small"]), len(vocabulary))
    other.build()
    with pytest.raises(CheckpointError, match="does not hold this network's weights"):
        restore_network(other, path)


def test_a_loss_scaled_optimizer_is_checkpointed_whole(setup, tmp_path):
    """training.precision: fp16 stopped every run before its first step ("two variables named 'iteration'"):
    Keras' LossScaleOptimizer has an `iteration` and a `learning_rate` of its own, named as its inner optimizer's."""
    from myxtts.training.checkpoints import Checkpoints
    from myxtts.training.optimizers import build_optimizer

    config, vocabulary, batch = setup
    models = []
    for seed in (0, 1):
        model = _model(vocabulary, config, keras.optimizers.LossScaleOptimizer(build_optimizer(config.training, 1)),
                       seed=seed)
        model(batch)
        model.optimizer.build(model.network.trainable_variables)
        model.train_step(batch)  # fills the moments
        models.append(model)
    saved, loaded = models
    saved.optimizer.dynamic_scale.assign(1024.0)
    Checkpoints(tmp_path, saved.network, saved.optimizer, "adamw", "").save("latest", 3)
    assert Checkpoints(tmp_path, loaded.network, loaded.optimizer, "adamw", "").restore().optimizer_restored
    assert float(loaded.optimizer.dynamic_scale.numpy()) == 1024.0
    for a, b in zip(saved.optimizer.variables, loaded.optimizer.variables):
        if a.path.split("/")[-1] != "iteration":  # the inner one is set from the update count (see above)
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)



def test_a_run_resumes_in_fp16_from_fp32_and_back(setup, tmp_path):
    """--precision fp16 on a run trained in fp32 (or bf16) was refused as "another model size, or
    written by an older MyXTTS": the checkpoint has no loss scale. It starts at its initial value."""
    from myxtts.training.checkpoints import Checkpoints
    from myxtts.training.optimizers import build_optimizer

    config, vocabulary, batch = setup
    plain = _model(vocabulary, config, build_optimizer(config.training, 1), seed=0)
    plain(batch)
    variables = plain.network.trainable_variables
    plain.optimizer.apply([tf.fill(v.shape, 0.01) for v in variables], variables)  # moments to restore
    Checkpoints(tmp_path / "fp32", plain.network, plain.optimizer, "adamw", "").save("latest", 3)
    scaled = _model(vocabulary, config, keras.optimizers.LossScaleOptimizer(build_optimizer(config.training, 1)), seed=1)
    scaled(batch)
    scaled.optimizer.build(scaled.network.trainable_variables)
    restored = Checkpoints(tmp_path / "fp32", scaled.network, scaled.optimizer, "adamw", "").restore()
    assert restored.step == 3 and restored.optimizer_restored and "loss scaling" in restored.message
    assert int(scaled.optimizer.iterations) == 3 and float(scaled.optimizer.dynamic_scale.numpy()) == 2.0**15
    for a, b in zip(plain.network.weights + plain.optimizer.variables,
                    scaled.network.weights + scaled.optimizer.inner_optimizer.variables):
        if a.path.split("/")[-1] != "iteration":  # set from the update count (see above)
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    # And an fp16 checkpoint resumed in fp32: its loss scale is left out.
    Checkpoints(tmp_path / "fp16", scaled.network, scaled.optimizer, "adamw", "").save("latest", 4)
    again = _model(vocabulary, config, build_optimizer(config.training, 1), seed=2)
    again(batch)
    again.optimizer.build(again.network.trainable_variables)
    assert Checkpoints(tmp_path / "fp16", again.network, again.optimizer, "adamw", "").restore().step == 4
    for a, b in zip(scaled.network.weights, again.network.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)

def test_raw_rows_are_phonemized_once_and_a_run_keeps_its_text_frontend(tmp_path, monkeypatch):
    from myxtts.data import phonemes

    rows = [Utterance(f"/a/{i}.wav", text, "s") for i, text in enumerate(["Hello, world!", "How are you?", "Fine."])]
    config = load_config()  # phonemes, en-us
    text = prepare_text(config, tmp_path, rows[:2], rows[2:])
    assert [u.phonemes for u in text.train_rows + text.val_rows] == ["h|ə|l|ˈoʊ|, w|ˈɜː|l|d|!", "h|ˈaʊ ɑːɹ j|uː|?", "f|ˈaɪ|n|."]
    assert text.vocabulary.symbols == sorted({"h", "ə", "l", "ˈoʊ", ",", " ", "w", "ˈɜː", "d", "!", "ˈaʊ", "ɑːɹ", "j", "uː", "?"})
    assert list(tmp_path.iterdir()) == []  # nothing written until the trainer knows the folder is this run's
    text.save(tmp_path)
    assert (tmp_path / "vocab.txt").is_file() and (tmp_path / "phonemes.json").is_file()
    config_lib.save_config(config, tmp_path / "config.yaml")  # as train() does

    # Resumed: the cache answers and vocab.txt is read back; espeak-ng is not asked again.
    monkeypatch.setattr(phonemes, "phonemize", lambda *arguments: pytest.fail("phonemized again"))
    again = prepare_text(config, tmp_path, rows[:2], rows[2:], keep_vocabulary=True)
    assert (again.train_rows, again.val_rows, again.vocabulary.tokens) == (text.train_rows, text.val_rows, text.vocabulary.tokens)

    # vocab.txt holds phonemes: the run cannot go on reading characters, unless it starts over.
    characters = load_config(overrides=["data.text_frontend=characters"])
    with pytest.raises(ValueError, match="data.text_frontend=phonemes.*--reset-training"):
        prepare_text(characters, tmp_path, rows[:2], rows[2:], keep_vocabulary=True)
    rebuilt = prepare_text(characters, tmp_path, rows[:2], rows[2:]).vocabulary
    assert "h" in rebuilt.symbols and "ˈ" not in rebuilt.symbols



@pytest.mark.parametrize("change", ["data.sample_rate=16000", "data.hop_length=200", "data.fmax=7000.0",
                                    "data.mel_scale=htk"])
def test_a_resumed_run_keeps_its_log_mel_settings(tmp_path, change):
    # Another sample rate, hop or mel scale leaves every weight's shape as it was: the run resumed
    # without a word and trained its weights on spectrograms of other settings.
    rows = [Utterance(f"/a/{i}.wav", text, "s", phonemes=p, language="en-us") for i, (text, p) in
            enumerate([("Hello.", "h|ə|l|ˈoʊ|."), ("Fine.", "f|ˈaɪ|n|.")])]
    config = load_config()
    prepare_text(config, tmp_path, rows[:1], rows[1:]).save(tmp_path)
    config_lib.save_config(config, tmp_path / "config.yaml")  # as train() does
    before = sorted(p.name for p in tmp_path.iterdir())
    key = change.split("=")[0]
    with pytest.raises(ValueError, match=rf"{re.escape(key)}: .* then, .* now.*--reset-training"):
        prepare_text(load_config(overrides=[change]), tmp_path, rows[:1], rows[1:], keep_vocabulary=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # Said before the hardware probes (up to a minute), which training runs after starting_point.
    from myxtts.training.run_setup import starting_point

    (tmp_path / "checkpoints" / "latest").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest" / "ckpt-4.index").write_bytes(b"")
    with pytest.raises(ValueError, match=rf"{re.escape(key)}: .* then, .* now"):
        starting_point(load_config(overrides=[change]), tmp_path)
    assert starting_point(config, tmp_path) == (True, None)
    # The run's config.yaml edited to the new settings and passed back as --config (the run's own
    # settings): the checkpoint's meta file still says what it was trained on.
    meta = {"step": 4, "optimizer": "adamw", "config": yaml.safe_dump(config_lib.to_dict(config))}
    (tmp_path / "checkpoints" / "latest" / "ckpt-4.meta.json").write_text(json.dumps(meta), encoding="utf-8")
    config_lib.save_config(load_config(overrides=[change]), tmp_path / "config.yaml")
    with pytest.raises(ValueError, match=rf"{re.escape(key)}: .* then, .* now"):
        starting_point(load_config(overrides=[change]), tmp_path)
    (tmp_path / "checkpoints" / "latest" / "ckpt-4.meta.json").unlink()
    # fmax 0 is the Nyquist frequency: the same filterbank as the 11025 Hz it means at 22050 Hz.
    nyquist = load_config(overrides=["data.fmax=0"])
    config_lib.save_config(load_config(overrides=["data.fmax=11025.0"]), tmp_path / "config.yaml")
    prepare_text(nyquist, tmp_path, rows[:1], rows[1:], keep_vocabulary=True)


def test_fine_tuning_starts_only_from_a_run_of_the_same_log_mel_settings():
    # Only another n_mels changes a weight's shape: a source of another sample rate, hop or mel
    # scale was fine-tuned on spectrograms of other settings without a word.
    from myxtts.data.text import Vocabulary
    from myxtts.training.init_from import InitSource, check_same_inputs

    source = InitSource("runs/base/checkpoints/best_mel/ckpt-4", Vocabulary(["a"]), config_lib.to_dict(load_config()))
    check_same_inputs(source, load_config())
    nyquist = InitSource(source.checkpoint, source.vocabulary, config_lib.to_dict(load_config(overrides=["data.fmax=11025.0"])))
    check_same_inputs(nyquist, load_config(overrides=["data.fmax=0"]))  # 0 is the Nyquist frequency: the same bands
    with pytest.raises(ValueError, match=r"training.init_from: .*data.sample_rate: 22050 then, 16000 now; "
                                         r"data.hop_length: 256 then, 200 now.*config.yaml"):
        check_same_inputs(source, load_config(overrides=["data.sample_rate=16000", "data.hop_length=200"]))

@pytest.mark.slow
def test_end_to_end_resume_and_no_recompilation(demo_corpus, trained_run, trained_result, tmp_path):
    # One test, because every train() call pays for tracing the step: keep their number small.
    # Straight (the session's trained run): 6 updates. Split: 3 updates, stop, then resume to 6 in
    # the same folder. Under the default data.deterministic: false, with parallel decoding: the
    # feature cache keeps the order.
    import shutil

    unordered = ("data.deterministic=false", "data.num_workers=4")
    config = _config(demo_corpus, *TRAINED_RUN)
    straight = types.SimpleNamespace(**trained_result)
    shutil.copytree(trained_run, tmp_path / "straight")
    sample_events = (tmp_path / "straight" / "logs" / "samples").glob("events.out.tfevents.*")
    tags = {v.tag for f in sample_events for e in tf.compat.v1.train.summary_iterator(str(f)) for v in e.summary.value}
    assert {"sample/generated", "sample/generated_mel", "sample/recording_mel"} <= tags, tags
    assert straight.step == 6 and len(straight.history) == 6
    train_events = (tmp_path / "straight" / "logs" / "train").glob("events.out.tfevents.*")
    train_tags = {v.tag for f in train_events for e in tf.compat.v1.train.summary_iterator(str(f)) for v in e.summary.value}
    assert {"step_time_s", "samples_per_s", "input_wait_ms"} <= train_tags, train_tags
    assert all(0 <= r["input_wait_ms"] <= 1000 * r["step_time_s"] for r in straight.history), straight.history
    shapes = {tuple(b["mel"].shape) for b in build_dataset(config, read_manifest(demo_corpus)).as_numpy_iterator()}
    assert 1 <= straight.train_function_traces <= len(shapes) <= 2  # no retracing per batch
    assert all(math.isfinite(r["loss"]) for r in straight.history)
    assert set(straight.validation) >= {"val_loss", "val_mel_loss", "val_align_loss", "val_duration_loss", "val_wer"}
    assert 0.0 <= straight.validation["val_wer"] <= 2.0  # measured by the recognizer (an untrained model: ~1)
    # The two unseen voices, one sentence each, measured by the independent speaker encoder.
    assert -1.0 <= straight.validation["val_speaker_similarity"] <= 1.0
    assert straight.validation["val_speaker_identified"] in (0.0, 0.5, 1.0)
    for kind in ("latest", "best_mel", "best_wer"):
        assert list((tmp_path / "straight" / "checkpoints" / kind).glob("ckpt-*.index")), kind
    assert (tmp_path / "straight" / "vocab.txt").exists() and (tmp_path / "straight" / "config.yaml").exists()

    first = train(_config(demo_corpus, "training.max_steps=3", "training.eval_interval=3", *unordered), tmp_path / "split")
    assert first.step == 3
    resumed = train(_config(demo_corpus, "training.max_steps=6", "training.eval_interval=3", *unordered), tmp_path / "split")
    assert resumed.step == 6 and [r["step"] for r in resumed.history] == [4, 5, 6]
    # Same data order and optimizer state after the resume: the same losses and weights. Parallel CPU
    # kernels may sum in another order between runs, hence a tolerance rather than equality.
    np.testing.assert_allclose([r["loss"] for r in resumed.history], [r["loss"] for r in straight.history[3:]], rtol=1e-4)
    straight_ckpt, split_ckpt = (_checkpoint_tensors(tmp_path / name) for name in ("straight", "split"))
    # Every variable: the tiny model's weights, AdamW's two moments of each and its step count
    # (the learning rate is a schedule of the step, not a variable).
    weights = sum(name.startswith("network/") for name in straight_ckpt)
    assert weights > 50 and straight_ckpt.keys() == split_ckpt.keys() and len(straight_ckpt) == 3 * weights + 1
    assert int(straight_ckpt["optimizer/iteration"]) == int(split_ckpt["optimizer/iteration"]) == 6
    for name, value in straight_ckpt.items():
        np.testing.assert_allclose(split_ckpt[name], value, atol=1e-5, err_msg=name)



def test_a_run_ends_by_saying_where_its_time_went(trained_result):
    # The shared run: 6 updates, validated at step 0 (before fit), 3 and 6, a checkpoint at 3 and 6.
    def seconds(text):
        minutes, _, rest = text.rpartition(" min ")
        return 60 * int(minutes or 0) + float(rest.removesuffix(" s"))

    lines = [line for line in trained_result["log"] if line.startswith("time: ")]
    assert len(lines) == 1, trained_result["log"]
    total, _, parts = lines[0].removeprefix("time: ").partition(" in all: ")
    named = {name: seconds(value) for name, value in
             re.findall(r"([a-z][a-z0-9 ,-]*?) ((?:\d+ min )?[\d.]+ s)(?:, |$)", parts)}
    assert list(named) == ["start-up", "validation at step 0", "compiling", "training steps", "validation",
                           "speech checks, checkpoints and logs"], lines[0]
    assert all(value > 0 for value in named.values()), lines[0]
    # The parts are the whole run, each rounded to 0.05-0.5 s.
    assert abs(sum(named.values()) - seconds(total)) <= 1.5, lines[0]


@pytest.mark.slow
def test_a_checkpoint_of_another_optimizer_loads_its_weights_only(demo_corpus, trained_run, tmp_path):
    import shutil

    shutil.copytree(trained_run, tmp_path / "run")
    messages = []
    switched = train(_config(demo_corpus, "training.max_steps=1", "training.optimizer=prodigy", "training.learning_rate=1.0"),
                     tmp_path / "run", echo=messages.append)
    assert any("trained with adamw" in m and "weights only" in m for m in messages), messages
    assert switched.step == 1  # the fresh optimizer counts from 0 again


@pytest.mark.slow
def test_synthesis_and_the_free_running_check_of_a_trained_run(demo_corpus, trained_run, tmp_path):
    _check_synthesis_from_the_run(trained_run, demo_corpus, tmp_path)


def test_synthesize_takes_one_checkpoint_folder_of_a_run(demo_corpus, trained_run, tmp_path, monkeypatch):
    # configs/voices.yaml's best speaker similarity is in `latest`, not the default best_wer.
    from myxtts.training import checkpoints
    from utilities import synthesize

    restored, original = [], checkpoints.restore_network
    monkeypatch.setattr(checkpoints, "restore_network", lambda network, path: restored.append(path) or original(network, path))
    reference = str(sorted((demo_corpus / "wavs").glob("*.wav"))[0])
    latest = trained_run / "checkpoints" / "latest"
    assert synthesize.main(["--checkpoint", str(latest), "--text", "Hello there.", "--reference", reference,
                            "--out", str(tmp_path / "latest.wav")]) == 0
    assert restored == [str(latest / "ckpt-6")]


def _check_synthesis_from_the_run(run_dir, corpus, tmp_path):
    """utilities/synthesize.py end to end on the tiny run: a WAV comes out; bad input is a clear error."""
    import soundfile

    from utilities import synthesize

    reference = str(sorted((corpus / "wavs").glob("*.wav"))[0])
    out = tmp_path / "hello.wav"
    assert synthesize.main(["--checkpoint", str(run_dir), "--text", "Hello there.", "--reference", reference, "--out", str(out)]) == 0
    info = soundfile.info(out)
    assert info.samplerate == 22050 and info.frames > 0 and info.subtype == "PCM_16"
    # The voice fitted to the reference clip's own words (voice_fit.py): a WAV too.
    fitted = tmp_path / "fitted.wav"
    from myxtts.data.manifest import read_manifest

    reference_text = next(u.text for u in read_manifest(corpus) if u.audio_path == reference)
    assert synthesize.main(["--checkpoint", str(run_dir), "--text", "Hello there.", "--reference", reference,
                            "--reference-text", reference_text, "--fit-steps", "3", "--out", str(fitted)]) == 0
    assert soundfile.info(fitted).frames > 0
    # ... and with a mel head of its own: a WAV too, and not the voice-only one.
    headed = tmp_path / "headed.wav"
    assert synthesize.main(["--checkpoint", str(run_dir), "--text", "Hello there.", "--reference", reference,
                            "--reference-text", reference_text, "--fit-steps", "3", "--fit-head", "--out", str(headed)]) == 0
    assert soundfile.read(headed)[0].shape != soundfile.read(fitted)[0].shape or not np.allclose(
        soundfile.read(headed)[0], soundfile.read(fitted)[0])
    with pytest.raises(SystemExit):  # a head needs the clips' words
        synthesize.main(["--checkpoint", str(run_dir), "--text", "Hi.", "--reference", reference, "--fit-head"])
    for argv in (
        ["--checkpoint", str(run_dir), "--text", "Hi.", "--reference", reference, "--reference", reference,
         "--reference-text", reference_text],  # two clips, the words of one
        ["--checkpoint", str(tmp_path / "no_such_run"), "--text", "Hi.", "--reference", reference],
        ["--checkpoint", str(run_dir), "--text", "   ", "--reference", reference],
        ["--checkpoint", str(run_dir), "--text", "Hi.", "--reference", str(tmp_path / "missing.wav")],
    ):
        assert synthesize.main([*argv, "--out", str(tmp_path / "x.wav")]) == 2
    _check_free_running_report(run_dir, tmp_path)


def _check_free_running_report(run_dir, tmp_path):
    import contextlib
    import io
    import json

    from utilities import free_running_check

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert free_running_check.main(["--run", str(run_dir), "--sentences", "1", "--json", str(tmp_path / "r.json"),
                                        "--fit-voice", "3", "--fit-head", "3", "--quality"]) == 0
    text = printed.getvalue()
    assert "syntheses:  intelligibility: WER" in text and "recordings: intelligibility: WER" in text, text
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sentences"] == len(report["per_sentence"]) == 1
    assert 0.0 <= report["recordings_wer"] < report["wer"] <= 2.0  # 6 tiny updates do not speak yet
    # The demo corpus has espeak-ng's timings: the learned alignment is measured against them.
    assert report["alignment"]["clips"] >= 1 and report["alignment"]["median_ms"] >= 0, report["alignment"]
    # The run's two unseen voices, two sentences each: each voice's own similarity, and their mean.
    voices = report["unseen_voices"]
    assert voices["sentences"] == 4 and len(voices["per_voice"]) == 2 and voices["heard"] == []
    assert np.mean(list(voices["per_voice"].values())) == pytest.approx(voices["similarity"], abs=1e-6)
    assert voices["fitted"]["steps"] == 3 and sorted(voices["fitted"]["per_voice"]) == sorted(voices["per_voice"])
    assert voices["fitted_head"]["head_ridge"] == 3.0 and voices["fitted"]["head_ridge"] is None
    assert voices["fitted_head"]["similarity"] != voices["fitted"]["similarity"]  # the head changed the sound
    for route in (voices, voices["fitted"], voices["fitted_head"]):  # each route's words and sound, measured
        assert 0.0 <= route["wer"] <= 2.0 and 1.0 <= route["dnsmos"]["ovrl"] <= 5.0, route
    assert voices["fitted_head"]["dnsmos"] != voices["fitted"]["dnsmos"]
    assert free_running_check.main(["--run", str(tmp_path / "no_such_run")]) == 2
    # A run whose corpus has moved: a clear error naming the path and what to change, not a traceback.
    import shutil

    moved = tmp_path / "moved_run"
    shutil.copytree(run_dir, moved)
    corpus_path = config_lib.load_run_config(moved / "config.yaml").data.train_data
    (moved / "config.yaml").write_text((moved / "config.yaml").read_text().replace(corpus_path, str(tmp_path / "gone")))
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        assert free_running_check.main(["--run", str(moved), "--sentences", "1"]) == 2
    assert str(tmp_path / "gone") in printed.getvalue() and "data.train_data" in printed.getvalue(), printed.getvalue()
    # The training corpus's own voices are refused as "unseen" unless asked for with --heard-voices.
    corpus = config_lib.load_run_config(run_dir / "config.yaml").data.train_data
    with contextlib.redirect_stderr(printed):
        assert free_running_check.main(["--run", str(run_dir), "--sentences", "1", "--unseen-voices", corpus]) == 2
    assert "voices that training uses" in printed.getvalue() and "--heard-voices" in printed.getvalue()


def _checkpoint_tensors(workdir):
    """Every numeric tensor of the run's latest checkpoint (network and optimizer state), without
    `save_counter`: how many saves a run made is bookkeeping, and a resumed run makes more."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir / "checkpoints" / "latest")))
    tensors = {name.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"): reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    return {name: value for name, value in tensors.items()
            if name != "save_counter" and not isinstance(value, bytes)}


@pytest.mark.slow
def test_a_run_of_nonfinite_losses_stops_and_keeps_the_last_good_checkpoint(demo_corpus, trained_run, tmp_path):
    import shutil

    shutil.copytree(trained_run, tmp_path, dirs_exist_ok=True)  # a good run of 6 updates
    saved = _checkpoint_tensors(tmp_path)
    # Resumed with an absurd learning rate: AdamW moves every weight by about 1e30 in update 7, the
    # forward pass then overflows, and updates 8, 9, 10 are skipped as non-finite: the guard trips.
    messages = []
    bad = train(_config(demo_corpus, "training.max_steps=20", "training.eval_interval=100", "training.learning_rate=1e30",
                        "training.max_nonfinite_steps=3"), tmp_path, echo=messages.append)
    assert bad.stopped_for_nonfinite and bad.step == 7, (bad.step, messages)
    assert any("3 non-finite losses in a row" in m and "learning_rate" in m for m in messages), messages
    assert any("latest checkpoint stays at step 6" in m for m in messages), messages
    kept = _checkpoint_tensors(tmp_path)  # the state before the diverging update, loadable and finite
    assert int(kept["optimizer/iteration"]) == 6
    for name, value in saved.items():
        np.testing.assert_array_equal(kept[name], value, err_msg=name)


@pytest.mark.slow
def test_a_run_whose_fp16_steps_overflow_still_makes_max_steps_updates(demo_corpus, tmp_path, monkeypatch):
    """fp16's loss scale overflows now and then (on a GPU's first updates, and after each growth), and the
    update is skipped: a run then stopped short of training.max_steps ("finished at step 7" of 8), fit having
    counted micro-batches, the skipped ones too."""

    class OverflowingFirst(keras.optimizers.LossScaleOptimizer):
        def __init__(self, inner_optimizer, **kwargs):
            # The tiny model's loss times 2**20 is past float16's largest number: the first update overflows.
            super().__init__(inner_optimizer, initial_scale=2.0**20, **kwargs)

    monkeypatch.setattr(keras.optimizers, "LossScaleOptimizer", OverflowingFirst)
    result = train(_config(demo_corpus, "training.precision=fp16", "training.max_steps=3", "training.eval_interval=3",
                           "training.checkpoint_interval=3"), tmp_path / "run")
    assert result.step == 3  # it was 0: the 3 micro-batches all overflowed
    assert result.history[-1]["loss_scale"] < 2.0**20  # halved: updates were skipped
    # The run's precision does not outlive it: the demo's closing sample was spoken in float16.
    assert keras.config.dtype_policy().name == "float32"


def test_too_few_clips_for_one_batch_is_a_clear_error(demo_corpus, tmp_path):
    # 24 short demo clips, at most 1 s each kept, in batches of 8: no batch forms.
    config = _config(demo_corpus, "data.max_duration_s=1.0", "data.min_duration_s=0.5", "data.batch_size=8",
                     "data.bucket_boundaries_s=[1.0]")
    with pytest.raises(ValueError, match=r"do not fill one batch of 8.*lower data.batch_size"):
        train(config, tmp_path / "few")


@pytest.mark.slow
def test_eager_debug_mode_trains(demo_corpus, tmp_path):
    # training.enable_graph_mode: false (--enable-eager-debug) runs the step as plain Python; it once
    # failed on the first step because a log value was a variable, which Keras' eager loop cannot carry.
    # No validation set: eager evaluation runs the alignment's frame loops in Python too (half the cost).
    result = train(_config(demo_corpus, "training.enable_graph_mode=false", "training.max_steps=2",
                           "training.eval_interval=100", "data.val_fraction=0.0"), tmp_path / "eager")
    assert result.step == 2 and result.train_function_traces == 2  # eager: the step's Python runs every time
    assert all(math.isfinite(r["loss"]) for r in result.history)


@pytest.mark.slow
def test_out_of_memory_backs_off_to_half_the_batch_with_twice_the_accumulation_or_keeps_a_fixed_batchs_updates(
        demo_corpus, tmp_path, monkeypatch):
    from myxtts.training import trainer

    real_fit = trainer._fit
    attempts = []

    def fit_that_runs_out_of_memory_above_batch_2(config, *args, **kwargs):
        attempts.append((config.data.batch_size, config.training.gradient_accumulation_steps))
        if config.data.batch_size > 2:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
        return real_fit(config, *args, **kwargs)

    monkeypatch.setattr(trainer, "_fit", fit_that_runs_out_of_memory_above_batch_2)
    messages = []
    automatic = _config(demo_corpus, "data.batch_size=4", "training.gradient_accumulation_steps=1", "training.max_steps=1")
    automatic.data.batch_size = 0  # automatic: the plan picks, and may back off
    automatic.training.gradient_accumulation_steps = 0
    automatic.training.effective_batch_size = 8
    result = train(automatic, tmp_path / "auto", echo=messages.append)
    first_batch, first_accumulation = attempts[0]
    assert first_batch > 2 and first_batch * first_accumulation >= 8
    assert attempts[-1][0] <= 2 and attempts[-1][0] * attempts[-1][1] == first_batch * first_accumulation
    assert (result.batch_size, result.gradient_accumulation_steps) == attempts[-1] and result.step == 1
    assert any("out of memory at batch" in m for m in messages)

    # A fixed batch is the user's call. Out of memory in the middle of that run: an error inside `fit`
    # skips Keras' `on_train_end`, where the last save is, so the updates since the last interval's
    # checkpoint (up to training.checkpoint_interval) were lost; they are saved first now.
    from myxtts.training import callbacks
    from myxtts.training.checkpoints import read_meta

    monkeypatch.setattr(trainer, "_fit", real_fit)
    stop_at_step = callbacks.StopAtStep.on_train_batch_end

    def out_of_memory_after_step_3(self, batch, logs=None):  # as if step 4 asked for more than the GPU has
        if callbacks.optimizer_step(self.model) == 3:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
        stop_at_step(self, batch, logs)

    monkeypatch.setattr(callbacks.StopAtStep, "on_train_batch_end", out_of_memory_after_step_3)
    messages, run = [], tmp_path / "fixed"
    with pytest.raises(trainer.OutOfMemory, match="data.batch_size 4"):
        train(_config(demo_corpus, "training.max_steps=6", "training.checkpoint_interval=100"), run,
              echo=messages.append)
    latest = str(run / "checkpoints" / "latest" / "ckpt-3")
    assert f"out of memory after step 3: saved {latest}, where a run of this folder goes on from" in messages, messages
    assert read_meta(latest)["step"] == 3


# --- A run folder is never silently overwritten; fine-tuning from another run --------------------

NEW_TOKEN = "ʘ"  # a click: in no demo sentence


@pytest.fixture
def tiny_run(trained_run):
    """A run folder of the tiny model (its checkpoints, vocab.txt, config.yaml): the session's trained run."""
    return trained_run


def _manifest_with_a_new_token(corpus, path):
    """The demo rows, each phoneme string ending in a word of NEW_TOKEN (so the training split surely holds it)."""
    import json

    lines = [json.dumps({"audio_path": u.audio_path, "text": u.text, "speaker": u.speaker, "duration": u.duration_s,
                         "phonemes": u.phonemes + " " + NEW_TOKEN, "language": u.language}, ensure_ascii=False)
             for u in read_manifest(corpus)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _snapshot(folder):
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_a_reset_whose_new_run_cannot_start_leaves_the_old_run_as_it_was(demo_corpus, trained_run, tmp_path):
    # --reset-training deleted the run's checkpoints and vocab.txt at once; a mistyped --train-data
    # then stopped the new run, and the trained one was gone for nothing.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = _snapshot(run)
    messages = []
    with pytest.raises(FileNotFoundError, match="missing_corpus"):
        train(_config(tmp_path / "missing_corpus", "training.max_steps=1"), run, resume="reset", echo=messages.append)
    assert _snapshot(run) == before, messages
    assert any("set aside" in m for m in messages) and any("are back in" in m for m in messages), messages

    # A reset whose run was killed before it wrote (the old run still set aside): the next start
    # without --reset-training puts it back and resumes it.
    from myxtts.training.run_folder import RESET_ASIDE

    (run / RESET_ASIDE).mkdir()
    for name in ("checkpoints", "vocab.txt"):
        (run / name).rename(run / RESET_ASIDE / name)
    messages.clear()
    resumed = train(_config(demo_corpus, *TRAINED_RUN), run, echo=messages.append)
    assert resumed.step == 6 and not (run / RESET_ASIDE).exists()
    assert any("are back in" in m for m in messages), messages



@pytest.mark.parametrize("inside", ["", "checkpoints/latest/ckpt-4"])
def test_a_reset_that_would_fine_tune_from_its_own_folder_is_named_before_anything_moves(demo_corpus, tmp_path, inside):
    # --reset-training --init-from <the same run>: the reset set the checkpoints aside first, and the
    # run stopped saying there was no checkpoint at a folder that has one.
    run = tmp_path / "run"
    (run / "checkpoints" / "latest").mkdir(parents=True)
    (run / "checkpoints" / "latest" / "ckpt-4.index").write_bytes(b"")
    (run / "vocab.txt").write_text("a\n", encoding="utf-8")
    before = _snapshot(run)
    source = run / inside if inside else run
    with pytest.raises(ValueError, match=rf"training.init_from \({re.escape(str(source))}\) names a checkpoint of "
                                         r".*--output-dir NEW.*Nothing .* was moved or deleted"):
        train(_config(demo_corpus, f"training.init_from={source}"), run, resume="reset", echo=lambda m: None)
    after = _snapshot(run)
    after.pop("train.lock", None)  # the lock the start took
    assert after == before

def test_fine_tuning_keeps_the_rows_of_shared_tokens_and_starts_new_ones_fresh(tiny_run, setup):
    from myxtts.data.text import Vocabulary
    from myxtts.training.checkpoints import CheckpointMismatch, named_weights, stored_weights
    from myxtts.training.init_from import extended_vocabulary, initialize_from, load_source

    config, _, batch = setup
    source = load_source(tiny_run)  # a run folder: its best_mel or latest checkpoint, and its vocab.txt
    vocabulary = extended_vocabulary(source.vocabulary, Vocabulary([NEW_TOKEN, *source.vocabulary.symbols[:3]]))
    assert vocabulary.tokens == source.vocabulary.tokens + [NEW_TOKEN]  # old ids unchanged, the new one last
    model = _model(vocabulary, config, keras.optimizers.AdamW(1e-3), seed=3)
    model(batch)
    weights = named_weights(model.network)
    fresh = {name: keras.ops.convert_to_numpy(variable).copy() for name, variable in weights.items()}
    report = initialize_from(model.network, source, vocabulary)
    assert report.new_tokens == [NEW_TOKEN] and report.weights == len(weights)
    assert report.kept_tokens == len(source.vocabulary) and report.mapped  # the token embedding at least
    assert repr(NEW_TOKEN) in report.message()

    reader, keys = stored_weights(source.checkpoint)
    old, new = len(source.vocabulary), len(vocabulary)
    for name, variable in weights.items():
        stored, loaded = reader.get_tensor(keys[name]), keras.ops.convert_to_numpy(variable)
        if name not in report.mapped:
            np.testing.assert_array_equal(loaded, stored, err_msg=name)
            continue
        axis = next(a for a in range(loaded.ndim) if stored.shape[a] == old and loaded.shape[a] == new)
        np.testing.assert_array_equal(np.take(loaded, range(old), axis), stored, err_msg=name)  # shared rows: the run's
        np.testing.assert_array_equal(np.take(loaded, [old], axis), np.take(fresh[name], [old], axis), err_msg=name)  # new: as initialized

    # Another model size is refused, naming weights, not loaded in part.
    small = network_for(load_config(overrides=["model.size=small"]), len(vocabulary))
    small.build()
    with pytest.raises(CheckpointMismatch, match=r"another model size.*model\.size.*'size': 'tiny'"):
        initialize_from(small, source, vocabulary)


@pytest.mark.slow
def test_a_run_folder_that_does_not_fit_is_left_untouched_and_reset_with_init_from_starts_over(tiny_run, demo_corpus,
                                                                                                 tmp_path):
    import shutil

    from myxtts.training.checkpoints import CheckpointError

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = _snapshot(run)
    messages = []

    def refused(error, *overrides, resume="auto", corpus=demo_corpus):
        with pytest.raises(error) as caught:
            train(_config(corpus, "training.max_steps=2", *overrides), run, resume=resume, echo=messages.append)
        assert _snapshot(run) == before  # no config.yaml, vocab.txt, phonemes cache or checkpoint written or deleted
        return str(caught.value)

    # Another model size: a mismatch that names what differs and the ways out, auto or --resume alike.
    for resume in ("auto", "require"):
        message = refused(CheckpointError, "model.size=small", resume=resume)
        assert "does not hold this network's weights" in message and "model.size: 'tiny' then, 'small' now" in message
        assert all(way in message for way in (f"--config {run}/config.yaml", "--output-dir", "--reset-training",
                                              "Nothing in it was written or deleted")), message
    # A checkpoint without its meta file is not "no checkpoint".
    meta = Path(tf.train.latest_checkpoint(str(run / "checkpoints" / "latest")) + ".meta.json")
    hidden = meta.rename(tmp_path / meta.name)
    before = _snapshot(run)
    assert "meta.json is missing" in refused(CheckpointError)
    hidden.rename(meta)
    before = _snapshot(run)
    # New tokens in the data of a resumed run: named, not read as <unk>.
    extended = _manifest_with_a_new_token(demo_corpus, tmp_path / "manifest.jsonl")
    message = refused(ValueError, corpus=extended)
    assert f"'{NEW_TOKEN}'" in message and "--init-from" in message and "<unk>" in message

    # --reset-training starts over: checkpoints, vocab.txt and the phonemes cache go; with
    # training.init_from the new run starts from the other run's weights, the new token added.
    (run / "phonemes.json").write_text("{}", encoding="utf-8")
    messages.clear()
    result = train(_config(extended, "training.max_steps=1", "training.eval_interval=100", "training.learning_rate=1e-9",
                           f"training.init_from={tiny_run}"), run, resume="reset", echo=messages.append)
    assert result.step == 1  # from step 0, not from the old run's 1
    for removed in ("checkpoints", "vocab.txt", "phonemes.json"):
        assert f"--reset-training: removed {run / removed}" in messages, messages
    assert not (run / "phonemes.json").exists()  # the rows carry phonemes: no cache was needed again
    old_tokens = (tiny_run / "vocab.txt").read_text(encoding="utf-8")
    assert (run / "vocab.txt").read_text(encoding="utf-8") == old_tokens + NEW_TOKEN + "\n"
    assert any(m.startswith(f"initialized from {tiny_run}") and f"'{NEW_TOKEN}'" in m and "step 0" in m for m in messages), messages
    fine_tuned, base = _checkpoint_tensors(run), _checkpoint_tensors(tiny_run)
    assert int(fine_tuned["optimizer/iteration"]) == 1  # a new optimizer: one update of its own
    for name, value in base.items():
        if name.startswith("network/"):
            tuned = fine_tuned[name]
            shared = tuple(slice(0, n) for n in value.shape)  # the old rows of a mapped weight, all of any other
            np.testing.assert_allclose(tuned[shared], value, atol=1e-7, err_msg=name)  # learning rate 1e-9


def test_the_schedule_without_a_hold_is_keras_cosine_decay_and_with_one_holds_the_peak():
    from myxtts.training.optimizers import WarmupHoldDecay

    keras_cosine = keras.optimizers.schedules.CosineDecay(0.0, warmup_target=2e-3, warmup_steps=100, decay_steps=900, alpha=0.1)
    ours = WarmupHoldDecay(2e-3, warmup_steps=100, total_steps=1000, decay_steps=900)
    steps = [0, 1, 50, 99, 100, 101, 400, 700, 999, 1000, 1200]
    np.testing.assert_allclose([float(ours(s)) for s in steps], [float(keras_cosine(s)) for s in steps], rtol=1e-5, atol=1e-9)
    held = WarmupHoldDecay(2e-3, warmup_steps=100, total_steps=1000, decay_steps=300)
    assert [float(held(s)) for s in (100, 400, 700)] == pytest.approx([2e-3] * 3)
    assert float(held(850)) == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5), rel=1e-5)  # half way down the cosine
    assert float(held(1000)) == pytest.approx(2e-4) and float(held(5000)) == pytest.approx(2e-4)
    assert WarmupHoldDecay.from_config(held.get_config()).get_config() == held.get_config()


def test_the_diagnosis_starts_a_fine_tuning_run_as_training_does(tiny_run, demo_corpus, tmp_path):
    # One run setup (run_setup.prepare_run) for train(), the diagnosis and the evaluations: the
    # diagnosis once built its own vocabulary from the data, a model of another size than the one
    # training fine-tunes.
    from myxtts.diagnostics import training_setup
    from myxtts.training.run_setup import prepare_run

    extended = _manifest_with_a_new_token(demo_corpus, tmp_path / "manifest.jsonl")
    config = _config(extended, f"training.init_from={tiny_run}")
    diagnosed = training_setup.prepare_run(config, echo=lambda m: None)
    trained = prepare_run(config, tmp_path / "new", echo=lambda m: None)
    old = (tiny_run / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert diagnosed.vocabulary.tokens == trained.vocabulary.tokens == old + [NEW_TOKEN]
    assert [u.phonemes for u in diagnosed.rows] == [u.phonemes for u in trained.text.train_rows]
    assert list((tmp_path / "new").glob("*")) == []  # preparing writes nothing

    # A trained run's evaluations read its rows with its own vocabulary, and need its checkpoint.
    evaluated = prepare_run(config_lib.load_run_config(tiny_run / "config.yaml"), tiny_run, resume="require",
                            echo=lambda m: None)
    assert evaluated.resuming and evaluated.vocabulary.tokens == old
    from myxtts.training.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        prepare_run(config, tmp_path / "new", resume="require", echo=lambda m: None)


def test_validation_clips_that_are_training_clips_are_said(demo_corpus, tmp_path):
    """data.val_data naming the training clips themselves ran on without a word: its loss and WER,
    "held out", were those of clips the model trained on."""
    from myxtts.training.run_setup import prepare_run

    from myxtts.data.manifest import write_jsonl

    write_jsonl(read_manifest(demo_corpus)[:3], tmp_path / "val.jsonl")
    said = []
    prepare_run(tiny_config(demo_corpus, f"data.val_data={tmp_path / 'val.jsonl'}"), tmp_path / "run", echo=said.append)
    assert [line for line in said if "not held out" in line] == [
        "data: 3 of the 3 validation clips are training clips too (the same audio files in data.train_data and "
        "data.val_data): their loss and WER are not held out; remove them from one"]
    said.clear()
    prepare_run(tiny_config(demo_corpus), tmp_path / "run", echo=said.append)  # held out of the training rows
    assert not [line for line in said if "not held out" in line]
