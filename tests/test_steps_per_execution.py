"""Several steps per call (`training.steps_per_execution`, the `experimental` level): Keras calls the
callbacks once per call, so the optimizer step jumps 4, 8, 12; every interval must still fire, at the
first call that crosses it."""

import types

import keras
import pytest

from myxtts.config import load_config
from myxtts.training import callbacks as callbacks_lib
from myxtts.training.callbacks import CheckpointSaver, ProgressLogger, ValidationSchedule, crossed
from myxtts.training.checkpoints import Checkpoints
from myxtts.training.trainer import steps_per_call, train


def _config(corpus, *overrides):
    return load_config(overrides=[
        f"data.train_data={corpus}", "model.size=tiny", "data.batch_size=4", "data.deterministic=true",
        "data.max_duration_s=6.0", "data.bucket_boundaries_s=[3.0, 6.0]", "training.gradient_accumulation_steps=1",
        "training.precision=fp32", "training.enable_xla_compilation=false", "training.warmup_steps=2",
        "training.log_samples=false", "training.wer_sentences=0", *overrides])


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


def test_crossing_an_interval():
    assert [step for step in (4, 8, 12, 16) if crossed(step - 4, step, 3)] == [4, 8, 12, 16]
    assert [step for step in (4, 8, 12, 16) if crossed(step - 4, step, 5)] == [8, 12, 16]
    assert not crossed(7, 9, 5) and crossed(9, 10, 5) and not crossed(10, 10, 5)


@pytest.mark.slow
def test_four_steps_per_call_logs_checkpoints_and_validates_at_every_crossing(demo_corpus, tmp_path, monkeypatch):
    saved = []
    real_save = Checkpoints.save
    monkeypatch.setattr(Checkpoints, "save", lambda self, kind, step, **extra: (
        saved.append((kind, step)), real_save(self, kind, step, **extra))[1])
    config = _config(demo_corpus, "training.steps_per_execution=4", "training.max_steps=20", "training.log_interval=3",
                     "training.checkpoint_interval=5", "training.eval_interval=5")
    result = train(config, tmp_path / "run")
    assert result.step == 20
    # Calls end at 4, 8, ..., 20; `step % 3 == 0` would log at 12 only.
    assert [r["step"] for r in result.history] == [4, 8, 12, 16, 20]
    # Checkpoint interval 5: crossed at 8 (5), 12 (10), 16 (15) and 20; `step % 5` saved at 20 only.
    assert [step for kind, step in saved if kind == "latest"] == [8, 12, 16, 20]
    # Validation interval 5: the untrained baseline, then every call that crossed one. (Epochs of 5
    # micro-batches would run 8 each at 4 per call and validate at 8, 16 and the end only.)
    assert [v["step"] for v in result.validation_history] == [0, 8, 12, 16, 20]


class _Optimizer:
    """Just what the callbacks read: updates (`iterations`) and micro-batches (`_iterations`)."""

    def __init__(self, accumulation):
        self.gradient_accumulation_steps = accumulation
        self.iterations = self._iterations = 0


def test_with_accumulation_a_crossing_waits_for_an_update_boundary(monkeypatch):
    # 4 micro-batches per call, 3 per update: calls end at micro-batch 4, 8, 12, 16 (updates 1, 2, 4, 5),
    # inside an update except at 12. Saving inside one would store half-accumulated gradients.
    optimizer = _Optimizer(accumulation=3)
    model = types.SimpleNamespace(optimizer=optimizer, stop_training=False)
    saved = []
    saver = CheckpointSaver(types.SimpleNamespace(save=lambda kind, step: saved.append(step) or "path"), interval=2)
    saver.set_model(model)
    saver._last_saved = 0
    schedule = ValidationSchedule(saver, eval_interval=2, start_step=0, every_epoch=False)
    monkeypatch.setattr(callbacks_lib, "optimizer_step", lambda model: model.optimizer.iterations)
    validated = []
    for micro in (4, 8, 12, 16):
        optimizer._iterations, optimizer.iterations = micro, micro // 3
        saver.on_train_batch_end(0)
        if 0 in schedule:
            validated.append(optimizer.iterations)
    assert saved == [4] and validated == [4]  # update 2 was crossed at micro-batch 8, mid-update: wait for 12


def test_a_call_ends_at_max_steps_and_within_a_checkpoint_interval():
    # Keras runs a call whole: 4 per call from 20 of 22 would end at 24, so calls of 2.
    assert steps_per_call(4, 22, 200) == 2
    assert steps_per_call(4, 20, 200) == 4
    assert steps_per_call(4, 3, 200) == 3  # a resume 3 micro-batches short of the end
    assert steps_per_call(4, 2001, 200) == 3
    assert steps_per_call(4, 2003, 200) == 1  # a prime: one per call
    # 100000 per call ran a whole run of 2000 in one call, deaf to Ctrl-C and SIGTERM: at most an interval.
    assert steps_per_call(100000, 2000, 200) == 200
    assert steps_per_call(4, 0, 200) == 1


@pytest.mark.slow
def test_four_steps_per_call_stop_at_max_steps_not_after(demo_corpus, tmp_path):
    lines = []
    config = _config(demo_corpus, "training.steps_per_execution=4", "training.max_steps=6", "training.log_interval=1",
                     "training.eval_interval=100", "training.checkpoint_interval=100")
    result = train(config, tmp_path / "run", echo=lines.append)
    assert result.step == 6  # was 8: two calls of 4
    assert [r["step"] for r in result.history] == [3, 6]  # the largest divisor of 6 up to 4
    assert any("training.steps_per_execution 4 -> 3" in line and "training.max_steps (6)" in line for line in lines)


def test_the_line_says_why_and_which_max_steps_keep_the_calls():
    from myxtts.training.trainer import _fit_calls_to_max_steps

    def lowered(max_steps, done, accumulation, requested, checkpoint_interval=200):
        lines, model = [], types.SimpleNamespace(steps_per_execution=requested)
        training = types.SimpleNamespace(max_steps=max_steps, checkpoint_interval=checkpoint_interval)
        _fit_calls_to_max_steps(model, training, done, accumulation, lines.append)
        return model.steps_per_execution, lines

    assert lowered(20, 0, 1, 4) == (4, [])
    per_call, [line] = lowered(1237, 0, 1, 4)  # --epochs can make any max_steps
    assert per_call == 1 and line.endswith("1 divides the 1237 micro-batches left (training.max_steps 1236 or 1240 keeps 4)")
    per_call, [line] = lowered(10, 0, 3, 4)  # 30 micro-batches at accumulation 3: 24 and 36 are whole calls
    assert per_call == 3 and line.endswith("(training.max_steps 8 or 12 keeps 4)")
    per_call, [line] = lowered(2000, 0, 1, 100000, checkpoint_interval=200)
    assert per_call == 200 and "kept within training.checkpoint_interval (200 updates)" in line
