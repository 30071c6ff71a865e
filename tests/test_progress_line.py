"""The training log's progress line (`ProgressLogger`): step time from the steps alone, ETA from the wall clock."""

import types

from myxtts.training import callbacks as callbacks_lib
from myxtts.training.callbacks import ProgressLogger


class _FakeRun:
    """A ProgressLogger driven step by step on a clock of our own (and, when asked, an input clock)."""

    def __init__(self, tmp_path, monkeypatch, interval, max_steps, input_wait=False):
        self.now = 0.0
        monkeypatch.setattr(callbacks_lib, "time", types.SimpleNamespace(perf_counter=lambda: self.now))
        self.optimizer = types.SimpleNamespace(iterations=0)
        self.lines, self.waited = [], 0.0
        self.progress = ProgressLogger(interval=interval, max_steps=max_steps, samples_per_update=8,
                                       log_dir=str(tmp_path), echo=self.lines.append)
        self.progress.set_model(types.SimpleNamespace(optimizer=self.optimizer))
        if input_wait:
            self.progress._input_clock = self  # as `watch_input` sets it: read_and_reset()
        self.progress.on_train_begin()

    def read_and_reset(self):
        waited, self.waited = self.waited, 0.0
        return waited

    def step(self, seconds, then_outside=0.0, waited=0.0):
        self.progress.on_train_batch_begin(0)
        self.now += seconds
        self.waited += waited
        self.optimizer.iterations += 1
        self.progress.on_train_batch_end(0, {"loss": 1.0})
        self.now += then_outside  # validation, the speech check, checkpoint saves: between steps

    def history(self, key):
        return [round(r[key], 6) for r in self.progress.history]


def test_step_time_leaves_out_validation_and_checkpoints_and_the_eta_counts_them(tmp_path, monkeypatch):
    run = _FakeRun(tmp_path, monkeypatch, interval=2, max_steps=10)
    run.step(0.1), run.step(0.1, then_outside=3.0)  # a validation and saves after step 2
    run.step(0.1), run.step(0.1)
    assert run.history("step_time_s") == [0.1, 0.1]  # was 1.6 after the validation
    assert run.history("samples_per_s") == [80.0, 80.0]
    assert "100 ms/step" in run.lines[1] and "80.0 samples/s" in run.lines[1]
    # 3.2 s of wall time over updates 3-4 (the 3 s outside the steps included): 1.6 s each, 6 to go.
    assert run.lines[1].endswith("ETA 0:00:09"), run.lines[1]


def test_the_first_line_leaves_out_the_first_step_that_traced_and_compiled(tmp_path, monkeypatch):
    """Its compile (116 s on an H100 under XLA, against 60 ms steps) made the first ETA hours long."""
    run = _FakeRun(tmp_path, monkeypatch, interval=4, max_steps=104, input_wait=True)
    run.step(120.0, waited=3.0)  # the first step also waited for the pipeline to start
    for _ in range(7):
        run.step(0.06, waited=0.01)
    assert run.history("step_time_s") == [0.06, 0.06]
    assert run.history("input_wait_ms") == [10.0, 10.0]  # never above the step time
    assert run.lines[0].endswith("ETA 0:00:06"), run.lines[0]  # 100 updates of 60 ms, not of 30 s
