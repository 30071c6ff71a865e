"""How long compiling took, said in the log: the first step, and every later step that compiled a
new batch shape; and, as a run ends, where all of its time went (`RunClock`).

A compiled step is traced, and under XLA compiled, once per batch shape, inside the first call
that sees the shape: on an H100 that call took 116 s where a step takes 60 ms, and with six
bucket shapes a run spends its first minutes compiling. No TensorFlow API reports that time to
Python (its XLA metrics live in a registry Python cannot read), so it is read off the steps: the
first step, and any step that took over `factor` times the recent median and at least
`minimum_s`, are counted as compiling. The first step's time also holds the input pipeline's
start (the shuffle buffer filling), and is reported as such.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque

import keras


class CompileTimer(keras.callbacks.Callback):
    def __init__(self, echo=print, xla: bool = False, factor: float = 10.0, minimum_s: float = 2.0, warmup: int = 10):
        super().__init__()
        self.echo, self.xla, self.factor, self.minimum_s, self.warmup = echo, xla, factor, minimum_s, warmup
        self.compile_seconds: list[float] = []  # one per step counted as compiling
        self.step_seconds = 0.0  # every step's, compiling or not
        self._recent: deque[float] = deque(maxlen=50)  # ordinary steps
        self._first_steps: list[float] = []  # steps 2 .. warmup, judged together
        self._steps = 0
        self._started = None

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def _what(self) -> str:
        return "tracing and XLA-compiling" if self.xla else "tracing"

    def _judge(self, took: float, typical: float, against: str) -> None:
        if took > max(self.minimum_s, self.factor * typical):
            self.compile_seconds.append(took)
            self.echo(f"a step took {took:.1f} s against {against} of {typical * 1000:.0f} ms: {self._what()} a new batch shape")
        else:
            self._recent.append(took)

    def on_train_batch_end(self, batch, logs=None):
        took = time.perf_counter() - self._started
        self._steps += 1
        self.step_seconds += took
        if self._steps == 1:
            self.compile_seconds.append(took)
            self.echo(f"first step: {took:.1f} s ({self._what()} the step for its batch shape, and the input pipeline starting)")
        elif self._steps <= self.warmup:
            # The first steps meet most batch shapes: judged against the fastest of them once they are
            # over (judged one by one, a second shape's compile became the norm, and the H200 demo's
            # log named none of the five compiles after its first step).
            self._first_steps.append(took)
            if self._steps == self.warmup:
                self._judge_first_steps()
        else:
            self._judge(took, statistics.median(self._recent) if self._recent else took, "a median")

    def _judge_first_steps(self) -> None:
        fastest = min(self._first_steps)
        for earlier in self._first_steps:
            self._judge(earlier, fastest, f"the fastest of the first {self._steps}")

    def on_train_end(self, logs=None):
        if self._first_steps and self._steps < self.warmup:  # a run shorter than the warm-up
            self._judge_first_steps()
        if len(self.compile_seconds) > 1:
            self.echo(f"compiling: {len(self.compile_seconds)} batch shapes took {sum(self.compile_seconds):.0f} s "
                      f"of this run (the first step and {len(self.compile_seconds) - 1} more)")


class RunClock(keras.callbacks.Callback):
    """Where a run's time went, said in one line as training ends: start-up (from `started`, a
    `time.perf_counter()` reading taken when the run began, to its first step), the validation of the
    untrained model (`timed("at step 0")`), compiling (the steps `timer` counted as compiling), the
    other steps, Keras' validation passes, and what ran between steps (the speech check, checkpoints,
    logs). On a GPU the budget of a whole run is spent in these, and the step log shows only the steps.
    Placed after the checkpoint saver, its last line also counts the final save."""

    def __init__(self, timer: CompileTimer, echo, started: float):
        super().__init__()
        self.timer, self.echo, self.started = timer, echo, started
        self.before: dict[str, float] = {}  # named spans before the first step, not start-up
        self.first_step_at = None
        self.validation = 0.0
        self._test_started = None

    @contextlib.contextmanager
    def timed(self, name: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.before[name] = self.before.get(name, 0.0) + time.perf_counter() - began

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()

    def on_test_begin(self, logs=None):
        self._test_started = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._test_started is not None:
            self.validation += time.perf_counter() - self._test_started
            self._test_started = None

    def summary(self) -> str:
        now = time.perf_counter()
        first = self.first_step_at if self.first_step_at is not None else now
        start_up = first - self.started - sum(self.before.values())
        compiling = sum(self.timer.compile_seconds)
        steps = self.timer.step_seconds - compiling
        between = max((now - first) - self.timer.step_seconds - self.validation, 0.0)
        parts = [f"start-up {_seconds(start_up)}"]
        parts += [f"validation {name} {_seconds(value)}" for name, value in self.before.items()]
        parts += [f"compiling {_seconds(compiling)}", f"training steps {_seconds(steps)}",
                  f"validation {_seconds(self.validation)}", f"speech checks, checkpoints and logs {_seconds(between)}"]
        return f"time: {_seconds(now - self.started)} in all: " + ", ".join(parts)

    def on_train_end(self, logs=None):
        self.echo(self.summary())


def _seconds(value: float) -> str:
    value = max(value, 0.0)
    if value < 60:
        return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes} min {seconds:02d} s"
