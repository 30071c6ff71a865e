"""Where the time of a training step goes: the input pipeline alone, the step alone, and both together.

Three measurements, each on its own so one cannot hide the other:

* `measure_input_pipeline`: batches pulled from the dataset with no training at all: the most the
  pipeline can supply (batches/s) and its batch latency (p50, p95).
* `measure_step_alone`: the compiled step on one batch held in memory, repeated: the most the step
  can consume (steps/s), with no input pipeline in the way.
* `measure_training`: real training, each step split into three blocks,

      input wait   blocked in `next(iterator)` waiting for the next batch
      compiled     inside the compiled step, until a scalar it returned is read (on a GPU the call
                   returns once the work is queued; reading the scalar waits for the device)
      host other   everything else on the host: the loop, reading the metrics as the callbacks do

  The input share, input wait / step time, is classified with the TensorBoard profiler's
  thresholds: >= 20% highly, >= 5% moderately input-bound.

Steps that traced or compiled a new program (a new bucket shape) take seconds and say nothing about
the steady state; they are marked `compile` and left out of the shares and rates. The first step
of a training run (iterator start-up) is run before timing begins.

Everything here takes a dataset and a `CompiledStep`, so tests can time a deliberately slow
pipeline or step without building a model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import tensorflow as tf

# The TensorBoard profiler's input-pipeline analysis uses these cut-offs on the input share.
HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05
# A step this much slower than the median compiled time, and at least this long, is a compilation
# (XLA compiles a new shape without retracing, so the trace counter alone misses it).
COMPILE_OUTLIER_FACTOR = 10.0
COMPILE_OUTLIER_MIN_S = 1.0


@dataclass
class CompiledStep:
    """One training step as the timing loop drives it.

    `run(batch)` calls the compiled step and may return before the device has finished; `finish`
    blocks until it has (by reading a scalar the step returned); `traces()` counts how often the
    step's Python code has been traced so far, so a step that traced can be told apart. `xla`:
    whether the step is XLA-compiled (None when it is no model's step: a fake, a simulated GPU);
    XLA is recommended only where a step ran with it.
    """

    run: Callable[[Any], Any]
    finish: Callable[[Any], Any]
    traces: Callable[[], int] = lambda: 0
    xla: bool | None = None


@dataclass
class StepRecord:
    start_s: float  # epoch seconds, to line the steps up with the GPU samples
    input_wait_s: float
    compiled_s: float
    host_s: float
    compile: bool = False

    @property
    def total_s(self) -> float:
        return self.input_wait_s + self.compiled_s + self.host_s


def input_classification(share: float) -> str:
    """'highly', 'moderately' or 'not' input-bound, by the profiler's thresholds."""
    if share >= HIGHLY_INPUT_BOUND:
        return "highly"
    if share >= MODERATELY_INPUT_BOUND:
        return "moderately"
    return "not"


def _latency_summary(seconds: Iterable[float]) -> dict:
    values = np.asarray(list(seconds), dtype=float)
    if values.size == 0:
        return {"total_s": 0.0, "mean_ms": None, "p50_ms": None, "p95_ms": None}
    return {
        "total_s": float(values.sum()),
        "mean_ms": float(values.mean() * 1e3),
        "p50_ms": float(np.percentile(values, 50) * 1e3),
        "p95_ms": float(np.percentile(values, 95) * 1e3),
    }


def batch_shapes(batch: dict) -> dict:
    return {key: [int(d) for d in value.shape] for key, value in batch.items()}


def signal_shape(batch: dict) -> str:
    """`mel [16, 520, 80]`, or `audio [16, ...]` for waveform batches (data.mel_on_device)."""
    for key in ("mel", "audio"):
        if key in batch:
            return f"{key} {[int(d) for d in batch[key].shape]}"
    key = sorted(batch)[0]
    return f"{key} {[int(d) for d in batch[key].shape]}"


def shape_key(batch: dict) -> tuple:
    return tuple((key, tuple(value.shape)) for key, value in sorted(batch.items()))


def measure_input_pipeline(dataset: tf.data.Dataset, num_batches: int,
                           progress=lambda message: None) -> tuple[dict, list]:
    """Pull `num_batches` batches (after a first, untimed one) with nothing else running.

    Returns (summary, one batch of each shape seen, the first batch first): the first is reused
    by the step-alone measurement, and all of them let the step compile every shape training will
    meet before it is timed.
    """
    iterator = iter(dataset.repeat())
    started = time.perf_counter()
    first = next(iterator)
    first_batch_s = time.perf_counter() - started
    by_shape = {shape_key(first): first}
    latencies = []
    for index in range(num_batches):
        before = time.perf_counter()
        batch = next(iterator)
        latencies.append(time.perf_counter() - before)
        by_shape.setdefault(shape_key(batch), batch)
        if (index + 1) % 10 == 0:
            progress(f"  input pipeline: {index + 1}/{num_batches} batches")
    total = sum(latencies)
    summary = {
        "batches": num_batches,
        "batches_per_s": num_batches / total if total > 0 else None,
        "first_batch_ms": first_batch_s * 1e3,
        **{k: v for k, v in _latency_summary(latencies).items() if k in ("p50_ms", "p95_ms", "mean_ms")},
    }
    return summary, list(by_shape.values())


def run_once(step: CompiledStep, batch) -> float:
    """One step to completion; returns its seconds (used to compile shapes before timing)."""
    started = time.perf_counter()
    step.finish(step.run(batch))
    return time.perf_counter() - started


def doubled(batch: dict) -> dict:
    """`batch` with every clip twice: a batch of twice the size, of the same bucket shape."""
    return {key: tf.concat([value, value], 0) if len(value.shape) else value for key, value in batch.items()}


def measure_step_alone(step: CompiledStep, batch, repeats: int, progress=lambda message: None) -> dict:
    """The step on the same in-memory batch `repeats` times, after one untimed warm-up call."""
    warmup_s = run_once(step, batch)
    durations = [run_once(step, batch) for _ in range(repeats)]
    progress(f"  step alone: {repeats} steps in {sum(durations):.2f} s (warm-up {warmup_s:.2f} s)")
    total = sum(durations)
    return {
        "steps": repeats,
        "steps_per_s": repeats / total if total > 0 else None,
        "warmup_ms": warmup_s * 1e3,
        **{k: v for k, v in _latency_summary(durations).items() if k in ("p50_ms", "p95_ms", "mean_ms")},
        "batch_shape": batch_shapes(batch),
        "xla": step.xla,
    }


def measure_training(
    dataset: tf.data.Dataset,
    step: CompiledStep,
    num_batches: int,
    host_work: Callable[[Any], Any] = lambda outputs: None,
    progress=lambda message: None,
) -> list[StepRecord]:
    """Train for `num_batches` steps, timing input wait, compiled step and host work separately.

    `host_work(outputs)` is what the caller does per step outside the compiled step (the CLI reads
    every metric to Python, as the training callbacks do).
    """
    iterator = iter(dataset.repeat())
    # One untimed step first: a fresh iterator starts its threads and fills its shuffle buffer,
    # which a real run pays once, not once per `num_batches` steps.
    started = time.perf_counter()
    run_once(step, next(iterator))
    startup_s = time.perf_counter() - started
    progress(f"  training: iterator start-up and first step {startup_s:.2f} s (not timed)")
    # perf_counter is the precise clock; the offset converts its readings to epoch seconds so the
    # steps line up with NVML's sample timestamps.
    to_epoch = time.time() - time.perf_counter()
    records: list[StepRecord] = []
    previous_end = time.perf_counter()
    for index in range(num_batches):
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            progress(f"  the dataset ended after {index} batches")
            break
        got_batch = time.perf_counter()
        traces_before = step.traces()
        outputs = step.run(batch)
        step.finish(outputs)
        finished = time.perf_counter()
        host_work(outputs)
        end = time.perf_counter()
        records.append(StepRecord(
            start_s=start + to_epoch,
            input_wait_s=got_batch - start,
            compiled_s=finished - got_batch,
            # The loop's own time between two steps counts as host time too.
            host_s=(end - finished) + (start - previous_end),
            compile=step.traces() != traces_before,
        ))
        previous_end = end
        if (index + 1) % 10 == 0:
            progress(f"  training: {index + 1}/{num_batches} steps")
    mark_compile_outliers(records)
    return records


def mark_compile_outliers(records: list[StepRecord]) -> None:
    """Marks steps whose compiled time is a compilation, not a step (see COMPILE_OUTLIER_*)."""
    steady = [r.compiled_s for r in records if not r.compile]
    if not steady:
        return
    limit = max(COMPILE_OUTLIER_FACTOR * float(np.median(steady)), COMPILE_OUTLIER_MIN_S)
    for record in records:
        if record.compiled_s > limit:
            record.compile = True


def summarize_training(records: list[StepRecord]) -> dict:
    """Rates and shares over the steady steps (compile steps excluded, unless there is nothing else)."""
    steady = [r for r in records if not r.compile]
    compile_steps = len(records) - len(steady)
    used = steady or records
    total = sum(r.total_s for r in used)
    wait = sum(r.input_wait_s for r in used)
    compiled = sum(r.compiled_s for r in used)
    host = sum(r.host_s for r in used)
    share = wait / total if total > 0 else 0.0
    return {
        "steps": len(records),
        "compile_steps": compile_steps,
        "steady_steps": len(steady),
        "steps_per_s": len(used) / total if total > 0 else None,
        "step_ms": _latency_summary(r.total_s for r in used),
        "input_wait": {**_latency_summary(r.input_wait_s for r in used), "share": share},
        "compiled_step": {**_latency_summary(r.compiled_s for r in used),
                          "share": compiled / total if total > 0 else 0.0},
        "host_other": {**_latency_summary(r.host_s for r in used), "share": host / total if total > 0 else 0.0},
        "input_share": share,
        "input_classification": input_classification(share),
        "per_step": [
            {"start_s": r.start_s, "input_wait_ms": r.input_wait_s * 1e3, "compiled_ms": r.compiled_s * 1e3,
             "host_ms": r.host_s * 1e3, "compile": r.compile}
            for r in records
        ],
    }
