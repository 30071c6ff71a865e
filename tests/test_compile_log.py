"""The compile times the log reports, read off step times (myxtts/training/compile_log.py)."""

from myxtts.training import compile_log


def test_the_first_step_and_steps_far_above_the_median_count_as_compiling(monkeypatch):
    durations = [5.0] + [0.1] * 12 + [30.0] + [0.1, 0.12, 1.5] + [40.0]  # 1.5 s: slow, under minimum_s
    clock = iter(t for d in durations for t in (0.0, d))
    monkeypatch.setattr(compile_log.time, "perf_counter", lambda: next(clock))
    lines = []
    timer = compile_log.CompileTimer(lines.append, xla=True)
    for batch in range(len(durations)):
        timer.on_train_batch_begin(batch)
        timer.on_train_batch_end(batch)
    timer.on_train_end()

    assert timer.compile_seconds == [5.0, 30.0, 40.0]
    assert lines[0].startswith("first step: 5.0 s (tracing and XLA-compiling")
    assert lines[1].startswith("a step took 30.0 s against a median of 100 ms")
    assert lines[1].endswith("XLA-compiling a new batch shape")
    assert lines[-1].startswith("compiling: 3 batch shapes took 75 s")


def _timed(monkeypatch, durations, **options):
    clock = iter(t for d in durations for t in (0.0, d))
    monkeypatch.setattr(compile_log.time, "perf_counter", lambda: next(clock))
    lines = []
    timer = compile_log.CompileTimer(lines.append, **options)
    for batch in range(len(durations)):
        timer.on_train_batch_begin(batch)
        timer.on_train_batch_end(batch)
    timer.on_train_end()
    return timer, lines


def test_the_first_steps_compiling_one_shape_after_another_are_each_counted(monkeypatch):
    # The H200 demo's start: six bucket shapes in its first steps, the second traced again (15 s),
    # the others compiling the loops alone (4-5 s); a step otherwise ~80 ms. Judged one by one, the
    # 15 s became the norm and only the first step was reported.
    durations = [26.2, 15.0, 0.08, 4.4, 0.08, 4.8, 0.077, 5.0, 0.08, 3.8] + [0.077] * 40 + [6.0]
    timer, lines = _timed(monkeypatch, durations)
    assert timer.compile_seconds == [26.2, 15.0, 4.4, 4.8, 5.0, 3.8, 6.0]
    assert lines[1].startswith("a step took 15.0 s against the fastest of the first 10 of 77 ms: tracing")
    assert lines[-1].startswith("compiling: 7 batch shapes took 65 s")
    # A run shorter than the warm-up still has its steps judged.
    timer, lines = _timed(monkeypatch, [12.0, 0.1, 3.0, 0.1], xla=True)
    assert timer.compile_seconds == [12.0, 3.0] and lines[-1].startswith("compiling: 2 batch shapes took 15 s")


def test_the_run_clock_splits_a_run_into_its_parts(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(compile_log.time, "perf_counter", lambda: now[0])
    lines = []
    timer = compile_log.CompileTimer(lines.append)
    clock = compile_log.RunClock(timer, lines.append, started=0.0)
    now[0] = 10.0
    with clock.timed("at step 0"):  # the untrained model's validation, before fit
        now[0] = 13.0
    now[0] = 20.0  # the rest of the start: 17 s

    def step(seconds):
        clock.on_train_batch_begin(0)
        timer.on_train_batch_begin(0)
        now[0] += seconds
        timer.on_train_batch_end(0)

    step(5.0)  # the first step: compiling
    for _ in range(12):
        step(0.5)
    now[0] += 1.0  # a checkpoint
    clock.on_test_begin()
    now[0] += 4.0  # Keras' validation pass
    clock.on_test_end()
    now[0] += 2.0  # the speech check
    timer.on_train_end()
    clock.on_train_end()

    assert lines[-1] == ("time: 38 s in all: start-up 17 s, validation at step 0 3.0 s, compiling 5.0 s, "
                         "training steps 6.0 s, validation 4.0 s, speech checks, checkpoints and logs 3.0 s")
    assert compile_log._seconds(612.4) == "10 min 12 s" and compile_log._seconds(59.4) == "59 s"
