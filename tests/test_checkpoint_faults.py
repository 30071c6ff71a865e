"""Checkpoints under the faults of issue 25: a resume with another gradient accumulation, a full disk,
a damaged newest checkpoint. Each keeps the run's clock (optimizer updates) and its last good state.

The unit tests build the tiny model once per module and save and restore it directly (no `fit`);
one end-to-end test per fault resumes a copy of the session's trained run (6 updates, accumulation 1).
"""

import dataclasses
import errno
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts import compat
from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_vocabulary
from myxtts.models.xtts import network_for
from myxtts.training.checkpoints import Checkpoints, read_meta
from myxtts.training.optimizers import build_optimizer, current_learning_rate, learning_rate_schedule
from myxtts.training.step import TrainingModel
from myxtts.training.trainer import train

from conftest import tiny_config


@pytest.fixture(scope="module")
def setup(demo_corpus):
    config = tiny_config(demo_corpus, "training.max_steps=20", "training.warmup_steps=4")
    return config, build_vocabulary(read_manifest(demo_corpus), config.data)


def _model(setup, accumulation: int, seed: int = 0) -> TrainingModel:
    """The tiny model with every variable built, its optimizer accumulating `accumulation` micro-batches."""
    config, vocabulary = setup
    keras.utils.set_random_seed(seed)
    model = TrainingModel(network_for(config, len(vocabulary)))
    model.compile(optimizer=build_optimizer(config.training, accumulation), jit_compile=False)
    model.network.build()
    model.optimizer.build(model.network.trainable_variables)
    return model


def _apply_gradients(model) -> None:
    """One micro-batch's worth of optimizer work: a gradient of 0.01 for every trainable weight."""
    variables = model.network.trainable_variables
    model.optimizer.apply([tf.fill(v.shape, 0.01) for v in variables], variables)


def _checkpoints(folder, model) -> Checkpoints:
    return Checkpoints(folder, model.network, model.optimizer, "adamw", "")


# --- 2. A resume with another gradient accumulation continues at the same update --------------------

@pytest.mark.parametrize("before, after", [(1, 2), (2, 3), (2, 1)])
def test_a_resume_with_another_accumulation_keeps_the_update_count_and_the_schedule(setup, tmp_path, before, after):
    """Keras stores its micro-batch count; divided by the new accumulation it rewound the run
    (6 micro-batches of accumulation 2 read back as update 3 under 2 -> 3... or 1.5 under 4)."""
    saved = _model(setup, before)
    for _ in range(3 * before):  # three whole updates, of made-up gradients (a forward pass adds nothing here)
        _apply_gradients(saved)
    assert int(saved.optimizer.iterations) == 3
    path = _checkpoints(tmp_path, saved).save("latest", 3)
    meta = read_meta(path)
    assert (meta["gradient_accumulation_steps"], meta["micro_batches"]) == (before, 3 * before)

    resumed = _model(setup, after, seed=1)
    restored = _checkpoints(tmp_path, resumed).restore()
    assert restored.step == 3 and int(resumed.optimizer.iterations) == 3  # the update count, not 3*before/after
    assert compat.micro_batches_done(resumed.optimizer) == 3 * after
    assert current_learning_rate(resumed.optimizer) == pytest.approx(current_learning_rate(saved.optimizer), rel=1e-6)
    assert f"written with gradient accumulation {before}, continuing with {after}" in restored.message
    for a, b in zip(saved.network.weights, resumed.network.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    # The accumulators start empty, as at the update boundary the checkpoint was written at.
    accumulators = [v for v in resumed.optimizer.variables if v.path.endswith("_gradient_accumulator")]
    assert len(accumulators) == (len(resumed.network.trainable_variables) if after > 1 else 0)
    assert all(not np.any(v.numpy()) for v in accumulators)
    # The next update is update 4, on the schedule where update 4 of the first run would be.
    for _ in range(after):
        _apply_gradients(resumed)
    assert int(resumed.optimizer.iterations) == 4


@pytest.mark.slow
def test_a_resumed_run_with_twice_the_accumulation_continues_its_steps_and_learning_rate(demo_corpus, trained_run,
                                                                                        tmp_path):
    """The session's trained run (6 updates, accumulation 1) resumed with batch 2 x accumulation 2,
    as the out-of-memory back-off does: updates 7 and 8, on the schedule's updates 7 and 8; ckpt-6
    is kept, not overwritten by a rewound step."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config = tiny_config(demo_corpus, "training.max_steps=8", "training.eval_interval=100", "data.batch_size=2",
                         "training.gradient_accumulation_steps=2")
    messages = []
    result = train(config, run, echo=messages.append)
    assert any(m.startswith(f"resumed from {run}/checkpoints/latest/ckpt-6 at step 6 (written with gradient "
                            "accumulation 1, continuing with 2") for m in messages), messages
    assert result.step == 8 and [r["step"] for r in result.history] == [7, 8], messages
    expected = learning_rate_schedule(config.training, 1)
    for record in result.history:
        assert record["learning_rate"] == pytest.approx(float(expected(record["step"])), rel=1e-6), record
    latest = run / "checkpoints" / "latest"
    assert sorted(p.name for p in latest.glob("ckpt-*.index")) == ["ckpt-6.index", "ckpt-8.index"]
    assert read_meta(str(latest / "ckpt-8"))["step"] == 8
    reader = tf.train.load_checkpoint(str(latest / "ckpt-8"))
    iteration = next(k for k in reader.get_variable_to_shape_map() if k.startswith("optimizer/iteration/"))
    assert int(reader.get_tensor(iteration)) == 16  # micro-batches: 8 updates of 2


# --- 3. A full disk is said to be one; the last good checkpoint stays, the failed save is cleaned -----

def _fail_like_a_full_disk_in_tensorflow(monkeypatch):
    """CheckpointManager.save as TensorFlow does it on a full disk (measured on a full tmpfs): the
    `ckpt-<n>_temp` folder with part of a shard, then RESOURCE_EXHAUSTED naming the file."""
    def save(manager, checkpoint_number=None, **kwargs):
        temporary = Path(manager.directory) / f"ckpt-{checkpoint_number}_temp"
        temporary.mkdir()
        (temporary / "part-00000-of-00001.data-00000-of-00001.tempstate123").write_bytes(b"\0" * 100)
        raise tf.errors.ResourceExhaustedError(None, None, f"{{{{function_node __wrapped__SaveV2_dtypes_4_device_/job:"
                                               f"localhost/replica:0/task:0/device:CPU:0}}}} {temporary}/part-00000-of-"
                                               "00001.data-00000-of-00001.tempstate123; No space left on device [Op:SaveV2]")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", save)


def _fail_like_a_full_disk_in_python(monkeypatch):
    """The meta file, written first, finds the disk full: its temporary file stays, half written."""
    from myxtts.training import checkpoints

    def write(path, text):
        path.with_suffix(path.suffix + ".tmp").write_text(text[:10], encoding="utf-8")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(checkpoints, "_write_atomically", write)


@pytest.mark.parametrize("fail", [_fail_like_a_full_disk_in_tensorflow, _fail_like_a_full_disk_in_python])
def test_a_full_disk_during_a_save_is_said_to_be_one_and_keeps_the_last_good_checkpoint(setup, tmp_path, monkeypatch,
                                                                                          fail):
    from myxtts.training.checkpoints import DiskFull

    model = _model(setup, 1)
    checkpoints = _checkpoints(tmp_path, model)
    good = checkpoints.save("latest", 3)
    before = sorted(p.name for p in (tmp_path / "latest").iterdir())
    with monkeypatch.context() as patched:
        fail(patched)
        with pytest.raises(DiskFull) as caught:
            checkpoints.save("latest", 6)
    message = str(caught.value)
    assert not isinstance(caught.value, tf.errors.ResourceExhaustedError)  # which the trainer reads as memory
    assert message.startswith(f"the disk is full: saving checkpoint {tmp_path / 'latest' / 'ckpt-6'} failed")
    assert "No space left on device" in message and "function_node" not in message, message
    assert f"The last good checkpoint, {good}, is kept" in message and "MiB free now" in message, message
    assert sorted(p.name for p in (tmp_path / "latest").iterdir()) == before  # no ckpt-6_temp, meta or .tmp left
    assert checkpoints.latest_path() == good and _checkpoints(tmp_path, _model(setup, 1)).restore().step == 3
    assert checkpoints.save("latest", 7).endswith("ckpt-7")  # space again: saving goes on


def test_a_full_disk_is_not_taken_for_out_of_memory_by_the_batch_back_off(demo_corpus, tmp_path, monkeypatch):
    """TensorFlow reports ENOSPC as RESOURCE_EXHAUSTED; with an automatic batch that used to halve the
    batch and retry (and then rewind, item 2). Here a feature cache file finds the disk full."""
    from myxtts.training import trainer
    from myxtts.training.checkpoints import DiskFull

    attempts = []

    def fit_on_a_full_disk(config, *args, **kwargs):
        attempts.append(config.data.batch_size)
        raise tf.errors.ResourceExhaustedError(None, None, f"{tmp_path}/run/feature_cache/train_0.data-00000-of-00001."
                                               "tempstate42; No space left on device")

    monkeypatch.setattr(trainer, "_fit", fit_on_a_full_disk)
    automatic = tiny_config(demo_corpus, "training.max_steps=1")
    automatic.data.batch_size = 0  # automatic: out of memory would back off
    with pytest.raises(DiskFull, match=r"the disk is full, not the memory: .*feature_cache.*No space left on device"):
        train(automatic, tmp_path / "run", echo=lambda message: None)
    assert len(attempts) == 1  # no back-off


# --- 6. A damaged newest checkpoint: the newest one that loads, the damaged one kept aside -------------

def _truncate(path):
    data = Path(f"{path}.data-00000-of-00001")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


DAMAGES = {  # as a crash or a full disk leaves them; each with words the reason must hold
    "truncated data": (_truncate, "data-00000-of-00001"),
    "empty data": (lambda path: Path(f"{path}.data-00000-of-00001").write_bytes(b""), "0 bytes"),
    "deleted index": (lambda path: Path(f"{path}.index").unlink(), "ckpt-4.index is missing"),
    "empty index": (lambda path: Path(f"{path}.index").write_bytes(b""), "ckpt-4.index cannot be read"),
    "empty meta": (lambda path: Path(f"{path}.meta.json").write_bytes(b""), "ckpt-4.meta.json is empty"),
}


@pytest.fixture(scope="module")
def two_models(setup):
    """Two built models, accumulation 1: the one that saves, and the one restored into (which every
    restore overwrites whole, so tests can share them)."""
    return _model(setup, 1), _model(setup, 1, seed=1)


def _three_checkpoints(two_models, folder):
    """latest at steps 2 and 4, best_mel at 3 (the optimizer's count at each step); ckpt-4's path."""
    model = two_models[0]
    checkpoints = _checkpoints(folder, model)
    for kind, step in (("latest", 2), ("best_mel", 3), ("latest", 4)):
        compat.set_micro_batches_done(model.optimizer, step)
        path = checkpoints.save(kind, step)
    return path


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_newest_checkpoint_is_skipped_named_and_kept_aside(two_models, tmp_path, damage):
    from myxtts.training.checkpoint_fallback import restore_newest

    newest = _three_checkpoints(two_models, tmp_path)
    hurt, reason_words = DAMAGES[damage]
    hurt(newest)
    model = two_models[1]
    resume = restore_newest(_checkpoints(tmp_path, model))
    # best_mel at step 3 is the newest that loads: the optimizer continues from its count.
    assert resume.restored.step == 3 and int(model.optimizer.iterations) == 3
    assert resume.restored.message.startswith(f"resumed from {tmp_path / 'best_mel' / 'ckpt-3'} at step 3")
    skipped = f"skipped {newest} (step 4), which is damaged: "
    line = next((m for m in resume.messages if m.startswith(skipped)), None)
    assert line is not None and reason_words in line and f"moved to {tmp_path / 'damaged' / 'latest-ckpt-4'}" in line, \
        resume.messages
    assert not list((tmp_path / "latest").glob("ckpt-4*"))  # out of the way of the next save of step 4
    assert list((tmp_path / "damaged" / "latest-ckpt-4").iterdir())  # kept for a look
    assert tf.train.latest_checkpoint(str(tmp_path / "latest")).endswith("ckpt-2")  # the state file, rewritten

    # Saving goes on in the repaired folder; the next resume takes the new save.
    again = _checkpoints(tmp_path, model)
    again.save("latest", 5)
    assert sorted(p.name for p in (tmp_path / "latest").glob("*.index")) == ["ckpt-2.index", "ckpt-5.index"]
    assert restore_newest(_checkpoints(tmp_path, two_models[0])).restored.step == 5


def test_an_empty_state_file_is_replaced_and_the_checkpoints_it_listed_still_load(two_models, tmp_path):
    from myxtts.training.checkpoint_fallback import restore_newest

    newest = _three_checkpoints(two_models, tmp_path)
    (tmp_path / "latest" / "checkpoint").write_bytes(b"")  # TensorFlow: "Invalid checkpoint state loaded from ..."
    resume = restore_newest(_checkpoints(tmp_path, two_models[1]))
    assert resume.restored.path == newest and resume.restored.step == 4
    assert any(m.startswith(f"rewrote {tmp_path / 'latest' / 'checkpoint'} to list ckpt-2, ckpt-4") and "is empty" in m
               for m in resume.messages), resume.messages
    assert tf.train.get_checkpoint_state(str(tmp_path / "latest")).all_model_checkpoint_paths[-1].endswith("ckpt-4")
    assert (tmp_path / "damaged" / "latest-checkpoint").exists()


def test_nothing_is_moved_when_no_checkpoint_is_intact_or_an_intact_one_does_not_fit(setup, two_models, tmp_path):
    from myxtts.training.checkpoint_fallback import CheckpointRefused, CheckpointsDamaged, restore_newest

    newest = _three_checkpoints(two_models, tmp_path)
    _truncate(newest)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    # Another vocabulary: best_mel reads, but does not fit. That is the user's config, not damage.
    config, vocabulary = setup
    other = TrainingModel(network_for(config, len(vocabulary) + 1))
    other.compile(optimizer=build_optimizer(config.training, 1))
    other.network.build()
    other.optimizer.build(other.network.trainable_variables)
    with pytest.raises(CheckpointRefused, match=r"does not hold this network's weights.*damaged and skipped: .*ckpt-4"):
        restore_newest(_checkpoints(tmp_path, other))
    for path in (tmp_path / "latest" / "ckpt-2", tmp_path / "best_mel" / "ckpt-3"):
        _truncate(path)
    with pytest.raises(CheckpointsDamaged, match=r"all 3 are damaged: .*ckpt-4: .*ckpt-3: .*ckpt-2: "):
        restore_newest(_checkpoints(tmp_path, two_models[1]))
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before



def test_a_run_switched_to_another_optimizer_resumes_its_own_checkpoints(setup, two_models, tmp_path):
    """A checkpoint of another optimizer loads its weights only and the step restarts at 0; the next
    start took the old optimizer's checkpoints (higher steps) back, losing every update since, and
    restarted at 0 again, at every re-run of the same command."""
    from myxtts.training.checkpoint_fallback import restore_newest

    _three_checkpoints(two_models, tmp_path)  # adamw: latest at 2 and 4, best_mel at 3
    config, vocabulary = setup
    prodigy_config = dataclasses.replace(config.training, optimizer="prodigy", learning_rate=1.0)

    def prodigy(seed):
        keras.utils.set_random_seed(seed)
        model = TrainingModel(network_for(config, len(vocabulary)))
        model.compile(optimizer=build_optimizer(prodigy_config, 1), jit_compile=False)
        model.network.build()
        model.optimizer.build(model.network.trainable_variables)
        return model

    switched = prodigy(2)
    checkpoints = Checkpoints(tmp_path, switched.network, switched.optimizer, "prodigy", "")
    first = restore_newest(checkpoints).restored
    assert (first.step, first.optimizer_restored) == (4, False) and int(switched.optimizer.iterations) == 0
    _apply_gradients(switched)
    _apply_gradients(switched)
    saved = checkpoints.save("latest", 2)  # the new optimizer's step 2: 6 updates in all
    assert read_meta(saved)["earlier_updates"] == 4

    resumed = prodigy(3)
    again = Checkpoints(tmp_path, resumed.network, resumed.optimizer, "prodigy", "")
    restored = restore_newest(again).restored
    assert (restored.path, restored.step, restored.optimizer_restored) == (saved, 2, True)
    assert int(resumed.optimizer.iterations) == 2
    for a, b in zip(switched.network.weights + switched.optimizer.variables, resumed.network.weights + resumed.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert read_meta(again.save("latest", 3))["earlier_updates"] == 4  # and its next checkpoints rank above the old ones too

    # Switched back: the newest is prodigy's, whose weights AdamW starts from, after 7 updates in all.
    back = _model(setup, 1, seed=4)
    restored = restore_newest(_checkpoints(tmp_path, back)).restored
    assert (restored.step, restored.optimizer_restored) == (3, False) and "prodigy" in restored.message

def test_a_run_whose_newest_checkpoint_is_truncated_resumes_from_the_newest_that_loads(demo_corpus, trained_run, tmp_path):
    """The session's trained run (latest at 3 and 6, best_mel and best_wer) with ckpt-6's data cut in
    half, as a full disk leaves it: no traceback, the newest intact checkpoint resumes the run."""
    from myxtts.training.checkpoint_fallback import candidates, damage

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    damaged = run / "checkpoints" / "latest" / "ckpt-6"
    _truncate(damaged)
    intact = next(c for c in candidates(run / "checkpoints") if damage(c.path) is None)
    messages = []
    result = train(tiny_config(demo_corpus, "training.max_steps=7", "training.eval_interval=100"), run,
                   echo=messages.append)
    assert any(m.startswith(f"skipped {damaged} (step 6), which is damaged: its data cannot be read back") for m in messages), \
        messages
    assert f"resumed from {intact.path} at step {intact.step}, the newest checkpoint that loads" in messages, messages
    assert result.step == 7 and result.history[0]["step"] == intact.step + 1
    assert (run / "checkpoints" / "damaged" / "latest-ckpt-6").is_dir()
    assert damage(str(run / "checkpoints" / "latest" / "ckpt-7")) is None


# --- 7. A resumed run keeps its best checkpoints until a validation beats them ----------------------

def test_a_resumed_run_keeps_its_best_checkpoints_until_a_validation_beats_them(setup, tmp_path):
    """One best_* checkpoint is kept; the saver of a resumed run (or of the out-of-memory back-off)
    started its best at infinity, so the first validation after a resume replaced a better one."""
    from myxtts.training.callbacks import CheckpointSaver

    model, messages = _model(setup, 1), []
    checkpoints = _checkpoints(tmp_path, model)

    def run(validation, logs):
        """A run that updates once and validates once (its `fit`, as the saver sees it)."""
        saver = CheckpointSaver(checkpoints, interval=1000, echo=messages.append, validation=validation)
        saver.set_model(model)
        saver.on_train_begin()
        _apply_gradients(model)
        saver.on_epoch_end(0, logs)
        saver.on_train_end()

    def kept(kind):
        path = checkpoints.latest_path(kind)
        return int(path.rsplit("-", 1)[1]), read_meta(path)

    run("clips A", {"val_mel_loss": 2.0, "val_wer": 0.30})
    assert kept("best_mel")[0] == 1 and kept("best_wer")[0] == 1
    run("clips A", {"val_mel_loss": 3.0, "val_wer": 0.20})  # resumed: a worse mel loss, a better WER
    assert kept("best_mel") == (1, {**kept("best_mel")[1], "val_mel_loss": 2.0, "validation": "clips A"})
    assert kept("best_wer")[0] == 2 and kept("best_wer")[1]["val_wer"] == 0.20
    assert messages == []
    # Measured on other sentences, a kept value says nothing about this run's: the next one replaces it.
    run("clips B", {"val_mel_loss": 5.0, "val_wer": 0.50})
    assert kept("best_mel")[0] == 3 and kept("best_wer")[0] == 3
    assert messages[0].startswith(f"best_mel: {tmp_path / 'best_mel' / 'ckpt-1'} was kept for val_mel_loss 2.0000 on other "
                                  "validation sentences"), messages
    assert len(messages) == 2 and messages[1].startswith("best_wer: ")
