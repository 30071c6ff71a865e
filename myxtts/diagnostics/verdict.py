"""From measurements to a verdict and to ranked config changes.

The verdict is the first rule that holds, in this order:

1. **input-bound**: the input share (input wait / step time) is >= 20%, the TensorBoard
   profiler's "highly input bound"; or it is >= 5% ("moderately") and the GPU's utilization
   oscillates (score >= 0.3), the sawtooth of a device that waits for every batch.
2. **host-overhead-bound**: the host's own work between steps is >= 20% of the step.
3. **loop-bound**: the alignment's frame loops take >= 40% of the step, timed alone on the
   step-alone batch (`alignment_timing.py`) or inside the step by TensorFlow's profiler (their
   share of the device's busy time, `step_profile.py`). Checked before the low-utilization rule
   below: a GPU idles between the loops' tiny sequential iterations, which looks like launch
   overhead (an H100 run that was almost all loops was called host-overhead-bound, and XLA was
   recommended, which had crashed there).
4. **host-overhead-bound**: a GPU was sampled, averaged below 50% and the input share is below
   20%: batches were ready, yet the device idled, so the time goes to launching work (many small
   kernels, one step per call).
5. **memory-bound**: a GPU was sampled and its memory controller was busy >= 60% of the time on
   average, or TensorFlow's own allocator peak reached >= 95% of the card: the step waits on memory
   traffic, or has no room to grow. NVML's used memory is not the measure: it counts what the
   allocator reserved, which without memory growth is the whole card on a healthy run.
6. **compute-bound**: otherwise. The step's own math is the limit, which is where training should be.

Each recommendation names one config key and the value to set (`key` and `value`, written as a
YAML line in `change`), or for Python inside the pipeline, the code to replace (`key` null). They
are ranked: first those that address the verdict, then the smaller findings (a moderate input
share under another verdict, audio read slower than the step needs, XLA compiling for longer than
it can pay back on a CPU, XLA without bucketing). A key already at the recommended value is
never recommended.

Nothing is recommended that did not run here: `training.enable_xla_compilation: true` only when the
step timed in this diagnosis was XLA-compiled (`measurements.step_alone.xla`), whatever the verdict;
otherwise the verdict's reasons say how to try it (run the diagnosis again with
`--set training.enable_xla_compilation=true`). And `data.num_workers` is never recommended below the
capacity plan's own count for the machine (`hardware/plan.py`, `machine.input_plan`), so the plan
and the diagnosis do not pull a run in opposite directions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Collection

from myxtts.diagnostics.gpu_sampler import OSCILLATING_SCORE
from myxtts.diagnostics.timing import HIGHLY_INPUT_BOUND, MODERATELY_INPUT_BOUND
# Frames per loop iteration on a GPU (the automatic value of AlignmentLoops.for_device): under XLA on
# an H100, 20.3 / 13.0 us a frame (forward-sum + gradient / Viterbi) against 50.0 / 50.7 at one.
from myxtts.hardware.loop_cost import GPU_FRAMES_PER_ITERATION

VERDICTS = ("input-bound", "host-overhead-bound", "loop-bound", "memory-bound", "compute-bound")
HOST_OVERHEAD_SHARE = 0.20
# steps_per_execution only saves the host's round trip between steps ("host, everything else"). On an
# H100 the demo's graph step was launch-bound inside the step with that round trip at 0.5% of it, and
# steps_per_execution: 4 measured no gain (compiled step 105 ms against 100): recommended from 5% on.
ROUND_TRIP_SHARE = 0.05
# A larger batch is advised only where the diagnosis timed it (`measurements.larger_batch`) and it gave
# at least this many times the samples per second; a report without that timing keeps the advice.
LARGER_BATCH_GAIN = 1.1
# The alignment's loops at this share of the step alone, or more, make the step loop-bound. Their
# iterations run one after another, each too small to fill a GPU, so no batch, precision or input
# change moves them: only fewer iterations (frames per iteration) or cheaper ones (XLA) do. At 40%
# they are the step's largest part, and halving them gains a fifth of the step or more.
LOOP_BOUND_SHARE = 0.40
XLA_KEY = "training.enable_xla_compilation"
# How to measure XLA before it is recommended (an XLA step crashed at its first step on an H100).
TRY_XLA = f"run the diagnosis again with --set {XLA_KEY}=true"
LOW_GPU_UTILIZATION = 50.0
MEMORY_CONTROLLER_BUSY = 60.0
GPU_MEMORY_FULL = 0.95
GPU_MEMORY_ROOMY = 0.50
# Without a GPU, an XLA compilation per shape that costs this many steps is not worth it: XLA speeds
# a CPU step up by a few percent at most (measured in FACTS.md), so it never pays the compile back
# within a short run.
CPU_XLA_COMPILE_STEPS = 20
# Read throughput below this multiple of what training consumes leaves no margin for a cold disk.
READ_MARGIN = 2.0


@dataclass
class Verdict:
    kind: str
    reasons: list[str] = field(default_factory=list)


def decide(training: dict, gpu: dict | None, pipeline: dict | None = None, step_alone: dict | None = None,
           alignment_loops: dict | None = None, step_profile: dict | None = None) -> Verdict:
    """The verdict from the training split (`timing.summarize_training`) and the GPU summary.

    `pipeline` and `step_alone`, the two measurements on their own, add a line to the reasons: the
    verdict rests on what happened when both ran together. `alignment_loops`
    (`alignment_timing.AlignmentLoopsTimer.measure`, with `share_of_step`) and `step_profile`
    (`step_profile.profile_step`: the loops' share of the traced step) each make a loop-bound verdict.
    Where the verdict's remedy includes XLA and the timed step ran without it, the reasons say
    how to measure it (XLA is recommended only after it ran here).
    """
    verdict = _decide(training, gpu, pipeline, step_alone, alignment_loops, step_profile)
    gpu_on = gpu_present(gpu)
    if _wants_xla(verdict.kind, gpu_on) and (step_alone or {}).get("xla") is False:
        verdict.reasons.append(f"XLA did not run in this diagnosis (the step was timed without it), so it is not "
                               f"recommended: to try it, {TRY_XLA}")
    return verdict


def _wants_xla(kind: str, gpu_on: bool) -> bool:
    """Whether XLA is part of the remedy for a verdict: on a GPU, for all but an input-bound step (fewer,
    larger kernels; cheaper loop iterations). On a CPU it gains a few percent and compiles for long."""
    return gpu_on and kind != "input-bound"


def xla_ran(step_alone: dict | None) -> bool:
    """Whether the step timed in this diagnosis was XLA-compiled, and so ran here under XLA."""
    return bool((step_alone or {}).get("xla")) and (step_alone or {}).get("steps_per_s") is not None


def loop_reason(loops: dict) -> str:
    """The loop-bound reason: the loops, their time and share, frames and frames per iteration."""
    how = ("inside the XLA-compiled step" if loops["jit_compile"] else
           "each compiled alone by XLA" if loops["compiled"] else "in graph mode")
    return (f"the alignment's frame loops (forward-sum loss + its gradient, Viterbi; models/alignment.py) took "
            f"{loops['median_ms']:.1f} ms, {loops['share_of_step']:.0%} of the step alone (timed alone on the same "
            f"batch): {loops['frames']} frames at {loops['frames_per_iteration']} per iteration, "
            f"{loops['iterations']} sequential iterations per step, {how}; each iteration's arithmetic is tiny "
            f"next to its fixed cost, and the device idles between them")


def profile_reason(split: dict) -> str:
    """What the profiler's trace of the step says about the loops (`step_profile.profile_step`)."""
    shares = split["shares"]
    return (f"TensorFlow's profiler traced the step: of its {split['busy_ms']:.1f} ms of {split['source']} a step, the "
            f"alignment's loops took {shares['loops']:.0%}, matrix products {shares['matmuls']:.0%}, "
            f"the rest {shares['other']:.0%}")


def _decide(training, gpu, pipeline, step_alone, alignment_loops, step_profile) -> Verdict:
    share = training["input_share"]
    host_share = training["host_other"]["share"]
    utilization = (gpu or {}).get("utilization")
    oscillation = (gpu or {}).get("oscillation") or {}
    score = oscillation.get("score") or 0.0
    reasons = [f"input wait is {share:.0%} of the step ({training['input_classification']} input-bound by "
               f"the TensorBoard profiler's thresholds: >= {MODERATELY_INPUT_BOUND:.0%} moderately, "
               f">= {HIGHLY_INPUT_BOUND:.0%} highly)"]
    supply, demand = (pipeline or {}).get("batches_per_s"), (step_alone or {}).get("steps_per_s")
    if supply and demand:
        reasons.append(f"on their own, the input pipeline supplies {supply:.1f} batches/s and the step consumes "
                       f"{demand:.1f}/s: the pipeline has {supply / demand:.1f}x the step's need")
    loops = alignment_loops or {}
    timed_bound = loops.get("share_of_step") is not None and loops["share_of_step"] >= LOOP_BOUND_SHARE
    if loops.get("share_of_step") is not None and not timed_bound:
        reasons.append(f"the alignment's frame loops took {loops['median_ms']:.1f} ms, {loops['share_of_step']:.0%} of "
                       f"the step alone (loop-bound from {LOOP_BOUND_SHARE:.0%})")
    # The profiler sees the loops as the step runs them (inside its XLA program, say), where the timing
    # alone compiles them on their own: either one at the threshold makes the step loop-bound.
    profiled = step_profile if step_profile and "shares" in step_profile else None
    profiled_bound = profiled is not None and profiled["shares"]["loops"] >= LOOP_BOUND_SHARE
    if profiled is not None:
        reasons.append(profile_reason(profiled) + ("" if profiled_bound else f" (loop-bound from {LOOP_BOUND_SHARE:.0%})"))
    if utilization:
        reasons.append(f"GPU utilization averaged {utilization['mean']:.0f}% (p10 {utilization['p10']:.0f}%, "
                       f"p90 {utilization['p90']:.0f}%), below 30% for {utilization['below_30_share']:.0%} of the time; "
                       f"oscillation score {score:.2f}")

    if share >= HIGHLY_INPUT_BOUND:
        return Verdict("input-bound", reasons + ["the step waits for its batch: the input pipeline is the limit"])
    if share >= MODERATELY_INPUT_BOUND and score >= OSCILLATING_SCORE:
        period = oscillation.get("period_s")
        return Verdict("input-bound", reasons + [
            f"the GPU's utilization swings with a period of {period:.2f} s while the step waits for input: "
            "the device starves between batches" if period else
            "the GPU's utilization swings while the step waits for input"])
    if host_share >= HOST_OVERHEAD_SHARE:
        return Verdict("host-overhead-bound", reasons + [
            f"host work outside the compiled step is {host_share:.0%} of the step"])
    # Before the low-utilization rule: a GPU idling between the loops' iterations is not launch overhead.
    if timed_bound or profiled_bound:
        cpu = [] if (gpu or {}).get("available") or (gpu or {}).get("simulated") else [
            "no GPU: on a CPU one frame per loop iteration is the fastest measured (16 compiled for 94 s under XLA "
            "there and ran 10x slower; 0, automatic, gives 1), so a GPU is the fix"]
        named = [loop_reason(loops)] if timed_bound else [
            "the alignment's frame loops (forward-sum loss + its gradient, Viterbi; models/alignment.py) are most of "
            "the step: their iterations run one after another, each too small to fill the device"]
        return Verdict("loop-bound", reasons + named + cpu)
    if utilization and utilization["mean"] < LOW_GPU_UTILIZATION:
        return Verdict("host-overhead-bound", reasons + [
            f"batches were ready (input wait {share:.0%}) yet the GPU averaged {utilization['mean']:.0f}%: "
            "the time goes to launching work, not to doing it"])
    if gpu and gpu.get("available"):
        memory_busy = gpu.get("memory_controller_mean")
        held = memory_share(gpu)
        if held is None:
            reasons.append("TensorFlow's memory peak was not measured, so how full the GPU is stays unknown "
                           "(NVML's used memory counts what TensorFlow reserved, not what the steps held)")
        if memory_busy is not None and memory_busy >= MEMORY_CONTROLLER_BUSY:
            return Verdict("memory-bound", reasons + [
                f"the memory controller was busy {memory_busy:.0f}% of the time: the step waits on memory traffic"])
        if held is not None and held >= GPU_MEMORY_FULL:
            return Verdict("memory-bound", reasons + [
                f"TensorFlow's peak was {held:.0%} of GPU memory: no room for a larger batch, close to running out"])
    compiled_share = training["compiled_step"]["share"]
    simulated = (gpu or {}).get("simulated")
    where = "" if gpu and gpu.get("available") else (
        f" (a simulated {simulated['device']}: each batch held for its predicted step time)" if simulated else
        " (no GPU: the step runs on the CPU, so a GPU is the fix)")
    return Verdict("compute-bound", reasons + [
        f"the compiled step is {compiled_share:.0%} of the step: the model's own math is the limit{where}"])


def gpu_present(gpu: dict | None) -> bool:
    """Whether the report's `gpu` section stands for a GPU: one sampled, or a simulated one."""
    return bool(gpu and (gpu.get("available") or gpu.get("simulated")))


def memory_share(gpu: dict | None) -> float | None:
    """TensorFlow's allocator peak over the card's memory, or None when either is unknown."""
    peak, total = (gpu or {}).get("tensorflow_peak_bytes"), (gpu or {}).get("memory_total_bytes")
    return peak / total if peak is not None and total else None


def larger_batch_reason(larger: dict) -> str:
    """What the timing of twice the batch found, for the verdict's reasons."""
    if larger.get("samples_per_s_gain") is None:
        return f"a batch of {larger['batch']} could not be timed ({larger.get('note', 'no time')}), so it is not advised"
    gain = larger["samples_per_s_gain"]
    verdict = "advised" if gain >= LARGER_BATCH_GAIN else f"not advised (under {LARGER_BATCH_GAIN:.1f}x)"
    return (f"twice the batch ({larger['batch']} clips) timed alone: {larger['p50_ms']:.0f} ms a step, "
            f"{gain:.2f}x the samples/s: {verdict}")


def _larger_batch_advice(out, settings: dict, measurements: dict, reason: str) -> None:
    """data.batch_size doubled, unless the diagnosis timed twice the batch and it did not pay."""
    batch, larger = settings["batch_size"], measurements.get("larger_batch")
    if larger is not None:
        gain = larger.get("samples_per_s_gain")
        if gain is None or gain < LARGER_BATCH_GAIN:
            return
        reason = f"twice the batch measured {gain:.2f}x the samples/s here ({larger['p50_ms']:.0f} ms a step); " + reason
    out.key("data.batch_size", 2 * batch, reason, batch)


def _change(key: str, value: Any) -> str:
    """The YAML line, e.g. `data.cache_features: true` (JSON spells booleans and numbers as YAML does)."""
    return f"{key}: {value if isinstance(value, str) else json.dumps(value)}"


class _Ranked:
    """Collects recommendations in order, skipping a key already recommended or already set."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.items: list[dict] = []

    def key(self, key: str, value: Any, reason: str, current: Any = None) -> None:
        if any(item["key"] == key for item in self.items) or current == value:
            return
        self.items.append({"key": key, "value": value, "change": _change(key, value), "reason": reason})

    def code(self, change: str, reason: str) -> None:
        self.items.append({"key": None, "value": None, "change": change, "reason": reason})

    def ranked(self) -> list[dict]:
        return [{"rank": rank, **item} for rank, item in enumerate(self.items, 1)]


def recommend(verdict: Verdict, static: dict, measurements: dict, gpu: dict | None,
              compute_capability: tuple[int, int] | None = None, *, input_plan: dict | None = None,
              overridden: Collection[str] = ()) -> list[dict]:
    """Ranked changes for the verdict, then for the smaller findings. See the module docstring.

    `input_plan`: the capacity plan's own input parallelism for this machine (`num_workers`,
    `source`; `machine.input_plan`), the floor of any data.num_workers recommended. `overridden`:
    config keys set on the command line (--set): the config file may hold another value, so a key
    measured here under its override is recommended even though the run already had it.
    """
    settings = static["settings"]
    training = measurements["training"]
    out = _Ranked(settings)
    # A simulated GPU counts for the advice that only makes sense with one (prefetch to it, mel on it).
    gpu_on = gpu_present(gpu)
    held = memory_share(gpu)

    def xla_on(reason: str):
        # Never a setting that did not run here: recommended from runs without it, XLA crashed at the
        # first step on an H100. When it did not run, decide() says in the reasons how to try it.
        if xla_ran(measurements.get("step_alone")):
            out.key(XLA_KEY, True, f"{reason} (an XLA step ran in this diagnosis)",
                    None if XLA_KEY in overridden else settings["xla"])

    def workers_change():
        workers, cores = settings["num_workers"], static["cpu"]["usable_cores"]
        planned = (input_plan or {}).get("num_workers")
        if planned:
            # The capacity plan's own count (hardware/plan.py: two calls in flight per input core, half the
            # cores on a CPU, capped by RAM) is what the diagnosis moves a run to, never below it: the plan
            # and the diagnosis must not pull a run in opposite directions. A count above both the plan's
            # and the cores is lowered to the plan's (its threads take turns on the same cores).
            plan = f"the capacity plan gives this machine {planned} ({input_plan.get('source', 'hardware/plan.py')})"
            if workers < planned:
                out.key("data.num_workers", planned, f"only {workers} calls prepare batches; {plan}", workers)
            elif workers > max(planned, cores):
                out.key("data.num_workers", planned, f"{static['cpu']['note']}; {plan}", workers)
        elif workers > cores:
            out.key("data.num_workers", 0, f"{static['cpu']['note']}; 0 sizes the parallel calls automatically", workers)
        elif 0 < workers < cores:
            # An explicit count: 0 ("automatic") would let the hardware plan pick the same number again.
            out.key("data.num_workers", cores, f"only {workers} of {cores} usable cores prepare batches", workers)

    def input_changes():
        for op in static["python_ops"]:
            out.code(f"replace the {op['op']} '{op['node']}' in {op['stage']} with TensorFlow ops",
                     "Python in the pipeline runs under the GIL, one element at a time, whatever data.num_workers says")
        out.key("data.cache_features", True, "features computed once and read from memory from the second epoch on",
                settings["cache_features"])
        workers_change()
        if settings["prefetch_buffer_size"] and settings["prefetch_buffer_size"] < 2:
            out.key("data.prefetch_buffer_size", 0, "a buffer of one batch cannot hide a slow batch; 0 = autotune",
                    settings["prefetch_buffer_size"])
        if gpu_on:
            out.key("data.prefetch_to_gpu", True, "copies the next batches to the GPU while the current step runs",
                    settings["prefetch_to_gpu"])
            if not settings["cache_features"] or static["python_ops"]:
                out.key("data.mel_on_device", True, "the step computes the log-mel on the GPU and the host only "
                        "decodes audio (where the feature cache is off or does not fit in RAM)",
                        settings.get("mel_on_device", False))
        if settings["deterministic"]:
            out.key("data.deterministic", False, "ordered output makes every batch wait for its slowest clip", True)

    if verdict.kind == "input-bound":
        input_changes()
    elif verdict.kind == "loop-bound":
        loops = measurements.get("alignment_loops") or {}
        if loops.get("frames_per_iteration") == 1 and settings.get("gpu_available"):
            out.key("training.alignment_frames_per_iteration", GPU_FRAMES_PER_ITERATION,
                    f"one frame per loop iteration pays a GPU's fixed cost per iteration {loops['iterations']} times a "
                    f"step; {GPU_FRAMES_PER_ITERATION} frames per iteration made a frame 2.5-3.9x cheaper on an H100 "
                    "(20.3 / 13.0 us against 50.0 / 50.7 under XLA; 0, automatic, also gives 16 on a GPU)", 1)
        xla_on("the loops' iterations become XLA loop iterations inside one program, the cheapest kind")
    elif verdict.kind == "host-overhead-bound":
        out.key("training.enable_graph_mode", True, "eager steps dispatch every op from Python", settings["graph_mode"])
        if training["host_other"]["share"] >= ROUND_TRIP_SHARE:
            out.key("training.steps_per_execution", 4, "several steps per compiled call: one host round trip for "
                    f"four steps (the round trip is {training['host_other']['share']:.0%} of the step)",
                    settings["steps_per_execution"])
        if gpu_on:
            xla_on("XLA fuses the step into fewer, larger kernels: fewer launches")
        if held is None or held < GPU_MEMORY_ROOMY:
            batch = settings["batch_size"]
            _larger_batch_advice(out, settings, measurements, f"more work per launch ({batch} -> {2 * batch} clips); "
                                 "automatic gradient accumulation keeps the effective batch")
    elif verdict.kind == "memory-bound":
        _precision_change(out, settings, compute_capability, "half-precision activations halve the memory traffic")
        xla_on("XLA fuses element-wise ops, saving round trips through memory")
        if held is not None and held >= GPU_MEMORY_FULL:
            batch = settings["batch_size"]
            out.key("data.batch_size", max(batch // 2, 1), "leave memory headroom; automatic gradient accumulation "
                    "keeps the effective batch", batch)
    else:  # compute-bound
        if gpu_on:
            _precision_change(out, settings, compute_capability, "tensor cores run half precision several times faster")
            xla_on("XLA fuses the step's kernels")
            utilization = (gpu or {}).get("utilization") or {}
            if held is not None and held < GPU_MEMORY_ROOMY and utilization.get("mean", 100) < 80:
                _larger_batch_advice(out, settings, measurements, f"the GPU is not full (TensorFlow's peak {held:.0%} "
                                     "of memory) and not always busy: a larger batch fills it")

    # Smaller findings, whatever the verdict.
    if verdict.kind != "input-bound" and training["input_share"] >= MODERATELY_INPUT_BOUND:
        input_changes()
    elif verdict.kind != "input-bound" and static["python_ops"]:
        for op in static["python_ops"]:
            out.code(f"replace the {op['op']} '{op['node']}' in {op['stage']} with TensorFlow ops",
                     "not the limit today, but it caps the pipeline at about one core")
    throughput, alone = static.get("read_throughput"), measurements.get("step_alone") or {}
    if throughput and throughput.get("mb_per_s") and throughput.get("mean_file_bytes") and alone.get("steps_per_s"):
        needed = throughput["mean_file_bytes"] * 2 * settings["batch_size"] * alone["steps_per_s"] / 1e6  # clip + reference
        if throughput["mb_per_s"] < READ_MARGIN * needed:
            out.key("data.cache_features", True, f"reading the audio gives {throughput['mb_per_s']:.0f} MB/s, the step "
                    f"alone would consume about {needed:.0f} MB/s", settings["cache_features"])
    compiled = measurements.get("precompile") or {}
    if not gpu_on and settings["xla"] and compiled.get("shapes") and alone.get("steps_per_s"):
        per_shape = compiled["seconds"] / compiled["shapes"]
        if per_shape * alone["steps_per_s"] >= CPU_XLA_COMPILE_STEPS:
            out.key("training.enable_xla_compilation", False, f"without a GPU, XLA took {per_shape:.0f} s to compile "
                    f"each batch shape, the time of {per_shape * alone['steps_per_s']:.0f} steps, and gains little "
                    "on a CPU", True)
    if settings["xla"] and not settings["bucketing"]:
        out.key("data.bucketing", True, f"XLA compiles one program per shape; {training['compile_steps']} of "
                f"{training['steps']} measured steps compiled", False)
    return out.ranked()


def _precision_change(out: _Ranked, settings: dict, compute_capability, reason: str) -> None:
    if settings["dtype_policy"] != "float32" or compute_capability is None:
        return
    if compute_capability >= (8, 0):
        out.key("training.precision", "bf16", reason + " (bf16 needs no loss scaling)", settings["precision"])
    elif compute_capability >= (7, 0):
        out.key("training.precision", "fp16", reason + " (with loss scaling)", settings["precision"])
