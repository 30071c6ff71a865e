"""The diagnosis: run the three measurements, sample the GPU, decide, recommend, build the report.

    static checks (done by the caller) -> (a) input pipeline alone -> compile every bucket shape
      -> (b) step alone on one batch -> the alignment's loops alone on that batch
      -> (c) real training, split per step, GPU sampled meanwhile
      -> verdict -> ranked recommendations -> report (validated against REPORT_SCHEMA)

`diagnose` takes a dataset and a `CompiledStep`, not a config, so a test can hand it a pipeline
slowed by a sleeping `tf.numpy_function`, or a step that is slow on purpose, and check the
verdict. `utilities/diagnose_gpu_bottleneck.py` builds the real ones from a config.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, Protocol

import numpy as np
import tensorflow as tf

from myxtts.diagnostics import step_profile, timing
from myxtts.diagnostics.gpu_sampler import GpuSeries, summarize_utilization
from myxtts.diagnostics.report_schema import SCHEMA_VERSION, validate_report
from myxtts.diagnostics.verdict import decide, gpu_present, larger_batch_reason, recommend


class Sampler(Protocol):
    def start(self) -> str | None: ...
    def stop(self) -> GpuSeries | None: ...


class LoopsTimer(Protocol):
    """Times the step's alignment loops alone (`alignment_timing.AlignmentLoopsTimer`)."""

    def measure(self, batch: Any, repeats: int, progress: Callable[[str], None]) -> dict: ...


class DeviceMemory(Protocol):
    """TensorFlow's allocator peak on the trained device (`hardware.gpu_memory.TensorFlowPeakMemory`)."""

    def reset(self) -> None: ...
    def peak_bytes(self) -> int: ...


def gpu_section(series: GpuSeries | None, note: str | None, origin_s: float, end_s: float | None = None,
                tensorflow_peak_bytes: int | None = None, simulated: dict | None = None) -> dict:
    """The report's `gpu` part; `origin_s` (epoch seconds, the first timed step) is time zero.

    Utilization samples outside [origin_s, end_s] (the untimed first step, the thread's start and
    stop) are left out, so the GPU numbers describe the same steps as the timing split.
    `tensorflow_peak_bytes` is TensorFlow's allocator peak over those steps, the memory figure the
    verdict uses (NVML's used memory counts what the allocator reserved). `simulated` describes the
    GPU a simulated consumer stood for (`simulated_gpu.SimulatedGpu.describe`), None for a real run.
    """
    if series is None:
        return {"available": False, "note": note, "source": None, "device": None, "samples": 0,
                "utilization": None, "oscillation": None, "memory_used_bytes": None, "memory_total_bytes": None,
                "tensorflow_peak_bytes": tensorflow_peak_bytes,
                "memory_controller_mean": None, "idle_reason_share": None, "errors": 0, "series": [],
                "simulated": simulated}
    end_s = np.inf if end_s is None else end_s
    kept = [(t, u) for t, u in zip(series.times_s, series.utilization) if origin_s <= t <= end_s]
    times, values = [t for t, _ in kept], [u for _, u in kept]
    summary = summarize_utilization(times, values)
    return {
        "available": True,
        "note": (f"{series.errors} NVML reads failed, first: {series.first_error}" if series.errors else None),
        "source": series.source,
        "device": series.device,
        "samples": len(values),
        "utilization": None if summary is None else {k: summary[k] for k in ("mean", "p10", "p90", "below_30_share")},
        "oscillation": None if summary is None else {"score": summary["oscillation_score"],
                                                     "period_s": summary["oscillation_period_s"]},
        "memory_used_bytes": max(series.memory_used_bytes) if series.memory_used_bytes else None,
        "memory_total_bytes": series.memory_total_bytes,
        "tensorflow_peak_bytes": tensorflow_peak_bytes,
        "memory_controller_mean": float(np.mean(series.memory_controller)) if series.memory_controller else None,
        "idle_reason_share": series.idle_reason_ticks / series.reason_ticks if series.reason_ticks else None,
        "errors": series.errors,
        "series": [[round(t - origin_s, 4), float(u)] for t, u in kept],
        "simulated": simulated,
    }


def diagnose(
    dataset: tf.data.Dataset,
    step: timing.CompiledStep,
    *,
    num_batches: int,
    static: dict,
    machine: dict,
    config_info: dict,
    precompile: bool = True,
    sampler: Sampler | None = None,
    no_sampler_note: str | None = None,
    device_memory: DeviceMemory | None = None,
    step_repeats: int | None = None,
    host_work: Callable[[Any], Any] = lambda outputs: None,
    compute_capability: tuple[int, int] | None = None,
    simulated: dict | None = None,
    alignment_loops: LoopsTimer | None = None,
    profile: bool = False,
    larger_batch: bool = False,
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    """Measure, decide and recommend; returns the report (see `report_schema`).

    `device_memory`, when given, has its peak reset before (c) and read after it: the memory the
    training steps really held, which the memory verdict rests on. `simulated`: the description of
    the GPU a simulated `step` stands for (`--simulate-gpu`), reported as `gpu.simulated`.
    `alignment_loops`: times the step's alignment loops alone on (b)'s batch, with their share of
    (b)'s median step (`measurements.alignment_loops`; null without it, e.g. for a simulated GPU).
    `profile`: traces a few of (b)'s steps with TensorFlow's profiler and splits their device time
    into the alignment's loops, matrix products and the rest (`step_profile.py`;
    `measurements.step_profile`, null without it or where the profiler failed, with a note).
    `machine["input_plan"]`, when present, is the capacity plan's own data.num_workers for the
    machine, below which no recommendation goes. `larger_batch`: where the verdict would advise a
    larger batch, (b) is timed again on twice the batch (`measurements.larger_batch`), and the advice
    stands only if that gave at least `verdict.LARGER_BATCH_GAIN` times the samples per second (on the
    H200 the diagnosis advised batch 32 without having run it).
    """
    progress(f"(a) input pipeline alone: {num_batches} batches")
    pipeline, seen = timing.measure_input_pipeline(dataset, num_batches, progress)
    progress(f"    {pipeline['batches_per_s']:.1f} batches/s, p50 {pipeline['p50_ms']:.0f} ms, p95 {pipeline['p95_ms']:.0f} ms")

    # Compile every shape (a) met before anything is timed: a compilation inside (c) would both
    # count as a slow step and give the pipeline idle seconds to fill its buffers.
    started = time.perf_counter()
    shapes = seen if precompile else []
    for index, batch in enumerate(shapes, 1):
        progress(f"compiling the step for batch shape {index}/{len(shapes)} ({timing.signal_shape(batch)})")
        seconds = timing.run_once(step, batch)
        progress(f"    {seconds:.1f} s")
    compiled = {"shapes": len(shapes), "seconds": time.perf_counter() - started}

    repeats = step_repeats or max(5, min(num_batches, 20))
    progress(f"(b) train step alone on one batch: {repeats} steps")
    step_alone = timing.measure_step_alone(step, seen[0], repeats, progress)
    loops = None
    if alignment_loops is not None:
        progress(f"    the alignment's loops alone on the same batch: {repeats} runs")
        loops = alignment_loops.measure(seen[0], repeats, progress)
        step_ms = step_alone["p50_ms"]
        loops["share_of_step"] = loops["median_ms"] / step_ms if step_ms else None
    split = None
    if profile:
        progress("    the same step traced by TensorFlow's profiler: 3 steps")
        try:
            split = step_profile.profile_step(step, seen[0], repeats=3)
        except (RuntimeError, ImportError, tf.errors.OpError) as error:  # the profiler is optional here
            split = {"note": f"the profiler failed: {(str(error).splitlines() or [''])[0][:200]}"}
        else:
            shares = split["shares"]
            progress(f"    {split['busy_ms']:.1f} ms of {split['source']} per step: loops {shares['loops']:.0%}, "
                     f"matmuls {shares['matmuls']:.0%}, other {shares['other']:.0%}")

    progress(f"(c) real training: {num_batches} steps, each split into input wait / compiled step / host")
    note = sampler.start() if sampler is not None else no_sampler_note
    if sampler is not None and note is None:
        progress("    sampling GPU utilization through NVML")
    series = None
    if device_memory is not None:
        device_memory.reset()
    try:
        records = timing.measure_training(dataset, step, num_batches, host_work, progress)
    finally:
        # Stop the thread even when training fails, so NVML is shut down and the error surfaces.
        if sampler is not None and note is None:
            series = sampler.stop()
    peak = device_memory.peak_bytes() if device_memory is not None else None
    training = timing.summarize_training(records)
    origin = records[0].start_s if records else time.time()
    end = records[-1].start_s + records[-1].total_s if records else origin
    gpu = gpu_section(series, note, origin, end, tensorflow_peak_bytes=peak, simulated=simulated)

    measurements = {"input_pipeline": pipeline, "precompile": compiled, "step_alone": step_alone,
                    "alignment_loops": loops, "step_profile": split, "training": training}
    verdict = decide(training, gpu, pipeline, step_alone, loops, split)
    measurements["larger_batch"] = None
    # The verdicts that can advise a larger batch (`verdict.recommend`); compute-bound only on a GPU.
    if larger_batch and (verdict.kind == "host-overhead-bound" or (verdict.kind == "compute-bound" and gpu_present(gpu))):
        measurements["larger_batch"] = _larger_batch(step, seen[0], step_alone, repeats, progress)
        verdict.reasons.append(larger_batch_reason(measurements["larger_batch"]))
    overridden = {override.split("=", 1)[0].strip() for override in config_info.get("overrides", [])}
    report = {
        "schema_version": SCHEMA_VERSION,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config_info,
        "machine": machine,
        "static": static,
        "measurements": measurements,
        "gpu": gpu,
        "verdict": {"kind": verdict.kind, "input_classification": training["input_classification"],
                    "reasons": verdict.reasons},
        "recommendations": recommend(verdict, static, measurements, gpu, compute_capability,
                                     input_plan=machine.get("input_plan"), overridden=overridden),
    }
    validate_report(report)
    return report


def _larger_batch(step, batch, step_alone: dict, repeats: int, progress) -> dict:
    """(b) again on `batch` doubled: its batch size, step time and samples per second against (b)'s."""
    larger = timing.doubled(batch)
    size = int(next(iter(larger.values())).shape[0])
    progress(f"(b') the step alone on twice the batch ({size} clips): {repeats} steps")
    try:
        timed = timing.measure_step_alone(step, larger, repeats, progress)
    except tf.errors.ResourceExhaustedError as error:
        return {"batch": size, "note": f"out of memory: {(str(error).splitlines() or [''])[0][:200]}"}
    gain = (2 * step_alone["p50_ms"] / timed["p50_ms"]) if timed["p50_ms"] and step_alone["p50_ms"] else None
    return {"batch": size, "p50_ms": timed["p50_ms"], "warmup_ms": timed["warmup_ms"], "samples_per_s_gain": gain}
