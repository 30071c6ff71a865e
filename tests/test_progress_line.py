"""The training log's progress line (`ProgressLogger`): step time from the steps alone, ETA from the wall clock."""

import types

from myxtts.training import callbacks as callbacks_lib
from myxtts.training.callbacks import ProgressLogger


class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_step_time_leaves_out_validation_and_checkpoints_and_the_eta_counts_them(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(callbacks_lib, "time", clock)
    optimizer = types.SimpleNamespace(iterations=0)
    lines = []
    progress = ProgressLogger(interval=2, max_steps=10, samples_per_update=8, log_dir=str(tmp_path), echo=lines.append)
    progress.set_model(types.SimpleNamespace(optimizer=optimizer))
    progress.on_train_begin()

    def step(seconds, then_outside=0.0):
        progress.on_train_batch_begin(0)
        clock.now += seconds
        optimizer.iterations += 1
        progress.on_train_batch_end(0, {"loss": 1.0})
        clock.now += then_outside  # validation, the speech check, checkpoint saves: between steps

    step(0.1), step(0.1, then_outside=3.0)  # a validation and saves after step 2
    step(0.1), step(0.1)
    assert [round(r["step_time_s"], 6) for r in progress.history] == [0.1, 0.1]  # was 1.6 after the validation
    assert [round(r["samples_per_s"], 6) for r in progress.history] == [80.0, 80.0]
    assert "100 ms/step" in lines[1] and "80.0 samples/s" in lines[1]
    # 3.2 s of wall time over updates 3-4 (the 3 s outside the steps included): 1.6 s each, 6 to go.
    assert lines[1].endswith("ETA 0:00:09"), lines[1]


def test_the_first_line_leaves_out_the_first_step_that_traced_and_compiled(tmp_path, monkeypatch):
    """Its compile (116 s on an H100 under XLA, against 60 ms steps) made the first ETA hours long."""
    clock = _Clock()
    monkeypatch.setattr(callbacks_lib, "time", clock)
    optimizer = types.SimpleNamespace(iterations=0)
    lines = []
    progress = ProgressLogger(interval=4, max_steps=104, samples_per_update=8, log_dir=str(tmp_path), echo=lines.append)
    progress.set_model(types.SimpleNamespace(optimizer=optimizer))
    progress._input_clock = waits = _Waits()  # as `watch_input` sets it
    progress.on_train_begin()
    for seconds, waited in ((120.0, 3.0), *[(0.06, 0.01)] * 7):  # the first step also waited for the pipeline to start
        progress.on_train_batch_begin(0)
        clock.now += seconds
        waits.waited += waited
        optimizer.iterations += 1
        progress.on_train_batch_end(0, {"loss": 1.0})
    assert [round(r["step_time_s"], 6) for r in progress.history] == [0.06, 0.06]
    assert [round(r["input_wait_ms"], 6) for r in progress.history] == [10.0, 10.0]  # never above the step time
    assert lines[0].endswith("ETA 0:00:06"), lines[0]  # 100 updates of 60 ms, not of 30 s


class _Waits:
    def __init__(self):
        self.waited = 0.0

    def read_and_reset(self):
        waited, self.waited = self.waited, 0.0
        return waited
