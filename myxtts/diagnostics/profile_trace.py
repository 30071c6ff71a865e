"""A TensorBoard profiler trace of N training steps, for the profiler's input-pipeline analysis.

Each step runs inside `tf.profiler.experimental.Trace("train", step_num=i, _r=1)`: the step
markers are what the profiler's overview and input-pipeline analyzer group time by, and they are
the same markers `Model.fit` emits. The batch shapes the data produces are compiled before the
trace starts, so the trace shows steady steps, not XLA compiling. The trace lands in `<logdir>/plugins/profile/<timestamp>/`, where
TensorBoard's Profile tab finds it.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

from myxtts.diagnostics.timing import CompiledStep, measure_input_pipeline, run_once, signal_shape


def capture_trace(dataset: tf.data.Dataset, step: CompiledStep, steps: int, logdir: str | os.PathLike, *,
                  precompile: bool = True, progress=lambda message: None) -> Path:
    """Trace `steps` training steps into `logdir`; returns the folder the profiler wrote.

    With `precompile`, a first, untraced pass over `steps` batches finds the batch shapes the
    data produces and compiles the step for each, so the traced steps run compiled programs; a
    shape that pass did not meet still compiles inside the trace, where it shows as a long step.
    """
    logdir = Path(logdir)
    profile_root = logdir / "plugins" / "profile"
    before = set(profile_root.iterdir()) if profile_root.is_dir() else set()
    if precompile:
        _, shapes = measure_input_pipeline(dataset, steps)
        for index, batch in enumerate(shapes, 1):
            progress(f"compiling the step for batch shape {index}/{len(shapes)} ({signal_shape(batch)})")
            run_once(step, batch)
    iterator = iter(dataset.repeat())
    run_once(step, next(iterator))  # the pipeline's start-up stays out of the trace
    progress(f"tracing {steps} steps into {logdir}")
    tf.profiler.experimental.start(str(logdir))
    try:
        for number in range(steps):
            with tf.profiler.experimental.Trace("train", step_num=number, _r=1):
                batch = next(iterator)
                step.finish(step.run(batch))
    finally:
        tf.profiler.experimental.stop()
    written = sorted(set(profile_root.iterdir()) - before) if profile_root.is_dir() else []
    if not written:
        raise RuntimeError(f"the profiler wrote nothing under {profile_root}")
    return written[-1]


def how_to_open(logdir: str | os.PathLike) -> str:
    return (
        "Open it with TensorBoard's profiler plugin:\n"
        "    pip install tensorboard-plugin-profile   # once; the Profile tab comes from it\n"
        f"    tensorboard --logdir {logdir}\n"
        "then http://localhost:6006 -> PROFILE -> Tools: input_pipeline_analyzer (input-bound share, the slowest\n"
        "tf.data stages), overview_page (step-time breakdown) and trace_viewer (each step on a timeline)."
    )
