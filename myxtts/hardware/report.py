"""Human and JSON renderings of the machine facts and the plan.

`format_report` is what `python -m myxtts.hardware` prints; `short_summary` is the one- or two-line
form for the start of a training log; `build_report` is the JSON object behind `--json`.
"""

from __future__ import annotations

from typing import Any, Sequence

from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import Plan
from myxtts.hardware.select import GpuSelection

_GIB = 2**30


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / _GIB:.1f} GiB"


def build_report(facts: MachineFacts, plan: Plan, selection: GpuSelection | None = None,
                 precision_timings: Sequence[str] | None = None) -> dict[str, Any]:
    """One JSON-able object: the detected machine, the GPU choice, the plan with its sources and,
    when given, the CPU precision timings cached for this CPU (`cpu_precision.cached_timings`)."""
    report: dict[str, Any] = {"machine": facts.to_dict(), "plan": plan.to_dict()}
    if precision_timings is not None:
        report["precision_timings"] = list(precision_timings)
    if selection is not None:
        report["selection"] = {"indices": list(selection.indices), "source": selection.source,
                               "messages": list(selection.messages)}
    return report


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def format_report(facts: MachineFacts, plan: Plan, selection: GpuSelection | None = None,
                  precision_timings: Sequence[str] = ()) -> str:
    """The readable report: GPUs, precision, CPU/RAM/platform, the plan, notes and recommendations.

    `precision_timings`: lines for the CPU precision timings cached for this CPU, shown under the
    precision probe (the report has no run config, so it cannot tell which one a run will use).
    """
    lines = ["MyXTTS hardware report", "", "GPUs:"]
    if not facts.gpus:
        lines.append("  none (CPU only)")
    for gpu in facts.gpus:
        used = "  [used]" if gpu.index in plan.gpu_indices else ""
        lines.append(f"  GPU {gpu.index}: {gpu.name}, {gpu.architecture} (CC {gpu.cc_text}), "
                     f"{_gib(gpu.total_memory_bytes)} total, {_gib(gpu.free_memory_bytes)} free{used}")
    if facts.gpus:
        first = facts.gpus[0]
        lines.append(f"  driver {first.driver_version or 'unknown'}, "
                     f"CUDA (driver) {first.cuda_driver_version or 'unknown'}")
    if facts.tensorflow_gpus is not None:
        lines.append(f"  TensorFlow sees: {', '.join(facts.tensorflow_gpus) or 'no GPU'}")
    if selection is not None and selection.messages:
        lines.extend(f"  {message}" for message in selection.messages)
    lines += [
        "",
        f"Precision: {plan.precision} (loss scaling {_on_off(plan.loss_scaling)}), TF32 {_on_off(plan.tf32)}, "
        f"XLA {_on_off(plan.xla)}",
        f"CPU: {facts.cpu_model + ', ' if facts.cpu_model else ''}{facts.usable_cpu_cores} usable of "
        f"{facts.logical_cpu_count} logical cores; "
        f"RAM: {_gib(facts.ram_bytes)} usable of {_gib(facts.physical_ram_bytes)}; platform: {facts.platform}",
        "",
        f"Plan for model size '{plan.model_size}' on {plan.device.upper()}"
        + (f" {list(plan.gpu_indices)}" if plan.gpu_indices else "") + ":",
        f"  batch {plan.batch_size} per replica x accumulation {plan.gradient_accumulation_steps} x "
        f"{plan.num_replicas} replica(s) = effective batch {plan.effective_batch_size} "
        f"(target {plan.target_effective_batch_size})",
        f"  input pipeline: {plan.num_parallel_calls} parallel calls (workers), private thread pool "
        f"{plan.private_threadpool_size}, autotune CPU budget {plan.autotune_cpu_budget}, RAM budget "
        f"{_gib(plan.autotune_ram_budget_bytes)}",
        "  batch probe: " + ("will measure to refine the batch" if plan.probe_batch_size else "not needed"),
        "  precision probe: " + ("training times float32 against bf16 at its start, once per CPU and model"
                                 if plan.probe_precision else "not needed"),
    ]
    lines.extend(f"    cached: {line}" for line in precision_timings)
    lines += [
        "",
        "Why:",
    ]
    lines.extend(f"  {line}" for line in plan.describe_lines())
    if facts.notes:
        lines += ["", "Detection notes:"] + [f"  - {note}" for note in facts.notes]
    if plan.recommendations:
        lines += ["", "Recommendations:"] + [f"  - {note}" for note in plan.recommendations]
    return "\n".join(lines)


def short_summary(plan: Plan, facts: MachineFacts | None = None) -> str:
    """Two lines for the training log's start: device and numerics, then batch and input pipeline."""
    if plan.device == "gpu":
        if facts is not None:
            by_index = {g.index: g for g in facts.gpus}
            names = ", ".join(f"{i}:{by_index[i].name}" for i in plan.gpu_indices if i in by_index)
        else:
            names = ",".join(map(str, plan.gpu_indices))
        device = f"GPU {names}"
    else:
        device = "CPU"
    first = (f"{device} | {plan.precision}{' + loss scaling' if plan.loss_scaling else ''}, "
             f"TF32 {_on_off(plan.tf32)}, XLA {_on_off(plan.xla)}")
    second = (f"batch {plan.batch_size} x accum {plan.gradient_accumulation_steps} x {plan.num_replicas} = "
              f"{plan.effective_batch_size} | input {plan.num_parallel_calls} workers, "
              f"RAM budget {_gib(plan.autotune_ram_budget_bytes)}")
    return f"{first}\n{second}"
