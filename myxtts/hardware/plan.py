"""The plan: which precision, batch, accumulation and input parallelism fit this machine.

`plan_for_machine` is a pure function of the detected facts, the model size and what the user asked
for, so every rule below is tested against device profiles built from spec sheets
(tests/data/device_profiles). Each value carries its source ("config" or "auto: <reason>") so the
training log says why it runs the way it does.

Rules, in one place:
- Precision: mixed_bfloat16 from compute capability 8.0 (Ampere and newer have bf16 tensor cores and
  need no loss scaling), mixed_float16 with loss scaling on 7.x (fp16 tensor cores only), float32 below
  7.0. On a CPU the answer differs by CPU (bf16 was 1.2-1.4x faster than float32 on an AMD EPYC with
  AVX512_BF16, 2.5x slower on an Intel Xeon without it), so training times both
  (`cpu_precision.py`, `probe_precision`); the plan's own value is the prior that stands when that
  cannot run: mixed_bfloat16 where the CPU lists AVX512_BF16 or AMX flags, else float32.
- TF32 on from CC 8.0. XLA on a GPU where the run is long enough to pay back its compiles: measured on
  an H100 (small model, bf16, batch 16), XLA compiled the train step for 106-160 s per batch shape and
  then ran it in 38 ms at the longest bucket (1,040 frames), against 94-101 ms at 520 frames in graph
  mode with the alignment's loops compiled alone, whose shapes compile in seconds: at least 56 ms
  saved. So XLA is chosen when the run's micro-batch steps exceed `XLA_PAYBACK_STEPS_PER_SHAPE` per
  compiled shape (one per train bucket: validation runs in graph mode); the 1,400-step demo
  stays in graph mode (406 s on the H100; with XLA it had done 2 steps after 428 s). A run whose length
  is unknown (the hardware report) is taken as long.
- Batch prior: a per-GPU batch for the `base` model (~100M parameters) looked up from the GPU's free
  memory (table `_BASE_BATCH_BY_FREE_GIB`); `small` takes twice and `tiny` four times that batch
  (their per-sample activations are roughly half and a quarter of base's), capped at the effective
  batch. It is a prior: `probe.py` measures and can refine it.
- Accumulation: ceil(effective / (batch * replicas)), by `batch_plan.BatchPlan`, the one owner of
  batch x accumulation x replicas. When the batch does not divide the target the effective batch
  comes out above it (16 GB: 6 x 6 = 36 >= 32), never below.
- Explicit values always win; derived ones are recomputed around them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from myxtts.hardware.batch_plan import BatchPlan
from myxtts.hardware.detect import GpuFacts, MachineFacts

_GIB = 2**30

# XLA's break-even on a GPU, measured on an H100 on 2026-11-24 (BENCHMARKS.md, "On an H100"): ~130 s
# of compiling per batch shape, ~60 ms saved per step against graph mode with compiled loops.
XLA_COMPILE_S_PER_SHAPE = 130.0
XLA_SAVED_S_PER_STEP = 0.06
XLA_PAYBACK_STEPS_PER_SHAPE = math.ceil(XLA_COMPILE_S_PER_SHAPE / XLA_SAVED_S_PER_STEP)

# Free GPU memory (GiB, lower bound) -> per-GPU batch for the base model. Thresholds sit below the
# nominal sizes because NVML reports e.g. 22.5 GiB for a "24 GB" A10/L4 and ~15 GiB free on a T4.
_BASE_BATCH_BY_FREE_GIB: tuple[tuple[float, int], ...] = (
    (120.0, 32),  # H200 141 GB, B200 180 GB
    (60.0, 16),  # A100/H100 80 GB, 96 GB Blackwell workstation cards
    (32.0, 12),  # A100 40 GB, 48 GB cards
    (20.0, 8),  # 24 GB cards (RTX 3090/4090, A10, L4)
    (13.0, 6),  # 16 GB cards (V100, T4)
    (9.5, 4),  # 12 GB and 11 GB cards
    (5.5, 2),  # 8 GB and 6 GB cards
    (0.0, 1),
)
# Below this much free memory batch 1 of base is close to not fitting at all.
_TIGHT_FREE_GIB = 5.5
_TOO_SMALL_FREE_GIB = 3.0

# How many base-sized samples one sample of each model size is worth, in memory.
MODEL_SIZE_BATCH_MULTIPLIER: Mapping[str, int] = {"base": 1, "small": 2, "tiny": 4}

# Each input worker (decode, resample, log-mel of one utterance in flight, plus its buffers) is given
# this much of the RAM budget; on small-RAM machines this caps the worker count before the cores do.
_RAM_PER_INPUT_WORKER = 512 * 2**20
_DEFAULT_RAM_BUDGET = 2 * _GIB  # when RAM could not be read

PRECISION_ALIASES: Mapping[str, str] = {
    "auto": "auto",
    "bf16": "mixed_bfloat16",
    "mixed_bfloat16": "mixed_bfloat16",
    "fp16": "mixed_float16",
    "mixed_float16": "mixed_float16",
    "fp32": "float32",
    "float32": "float32",
}


def _auto_int(name: str, value: int | str) -> int:
    if value == "auto":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer or 'auto' (0 = auto), got {value!r}")
    return value


@dataclass(frozen=True)
class RequestedSettings:
    """What the user configured; 0 or 'auto' (None for the booleans) means "decide for me"."""

    batch_size: int | str = 0
    gradient_accumulation_steps: int | str = 0
    num_workers: int | str = 0
    precision: str = "auto"
    effective_batch_size: int | str = 0  # 0 / 'auto': 32
    tf32: bool | None = None
    xla: bool | None = None
    # For XLA's payback on a GPU: the run's optimizer updates and the step shapes XLA would compile
    # (one per train bucket; validation runs in graph mode). None: unknown, taken as a long run.
    planned_updates: int | None = None
    compiled_shapes: int = 6

    def __post_init__(self) -> None:
        for name in ("batch_size", "gradient_accumulation_steps", "num_workers", "effective_batch_size"):
            object.__setattr__(self, name, _auto_int(name, getattr(self, name)))
        if self.precision not in PRECISION_ALIASES:
            raise ValueError(f"precision must be one of {sorted(PRECISION_ALIASES)}, got {self.precision!r}")
        object.__setattr__(self, "precision", PRECISION_ALIASES[self.precision])


@dataclass(frozen=True)
class Plan:
    """The decisions, each with its source in `sources` (same keys as the fields)."""

    device: str  # "gpu" or "cpu"
    gpu_indices: tuple[int, ...]
    num_replicas: int
    model_size: str
    precision: str  # a Keras dtype policy name
    loss_scaling: bool
    tf32: bool
    xla: bool
    batch_size: int  # per replica
    gradient_accumulation_steps: int
    effective_batch_size: int  # batch_size * gradient_accumulation_steps * num_replicas
    target_effective_batch_size: int
    num_parallel_calls: int
    private_threadpool_size: int
    autotune_cpu_budget: int
    autotune_ram_budget_bytes: int
    probe_batch_size: bool  # True when the batch is automatic on a GPU, so measuring can refine it
    probe_precision: bool = False  # True when the precision is automatic on a CPU: timing decides
    sources: Mapping[str, str] = field(default_factory=dict)
    recommendations: tuple[str, ...] = ()

    @property
    def batch_plan(self) -> BatchPlan:
        """batch x accumulation x replicas as one object, to derive any other batch from."""
        return BatchPlan(self.batch_size, self.gradient_accumulation_steps, self.num_replicas,
                         self.target_effective_batch_size,
                         fixed_accumulation=self.sources.get("gradient_accumulation_steps") == "config")

    def with_batch_plan(self, batch_plan: BatchPlan, **changes) -> "Plan":
        """This plan with `batch_plan`'s batch, accumulation and replicas, and their sources."""
        sources = dict(self.sources)
        sources["gradient_accumulation_steps"] = batch_plan.accumulation_source()
        sources["effective_batch_size"] = batch_plan.describe()
        sources.update(changes.pop("sources", {}))
        return dataclasses.replace(self, batch_size=batch_plan.batch_size, num_replicas=batch_plan.replicas,
                                   gradient_accumulation_steps=batch_plan.accumulation,
                                   effective_batch_size=batch_plan.samples_per_update, sources=sources, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpu_indices"] = list(self.gpu_indices)
        data["recommendations"] = list(self.recommendations)
        data["sources"] = dict(self.sources)
        return data

    def describe_lines(self) -> list[str]:
        """One "name = value  (source)" line per decision, for the training log."""
        names = [f.name for f in dataclasses.fields(self) if f.name in self.sources]
        def shown(name: str) -> str:
            value = getattr(self, name)
            return f"{value / _GIB:.1f} GiB" if name.endswith("_bytes") else str(value)

        return [f"{name} = {shown(name)}  ({self.sources[name]})" for name in names]


def base_batch_for_memory(free_bytes: int) -> int:
    """The per-GPU batch prior for the base model with this much free memory."""
    free_gib = free_bytes / _GIB
    return next(batch for threshold, batch in _BASE_BATCH_BY_FREE_GIB if free_gib >= threshold)


def _usable_memory(gpu: GpuFacts) -> int:
    # Free memory already excludes other processes and the driver's reserve; a zero (unknown) falls
    # back to the total.
    return gpu.free_memory_bytes if gpu.free_memory_bytes > 0 else gpu.total_memory_bytes


def _precision(gpus: tuple[GpuFacts, ...], requested: RequestedSettings, notes: list[str],
               cpu_bf16: tuple[str, ...] = ()) -> tuple[str, str]:
    min_cc = min((g.compute_capability for g in gpus), default=None)
    if requested.precision != "auto":
        if min_cc is None and requested.precision != "float32" and not (cpu_bf16 and requested.precision == "mixed_bfloat16"):
            notes.append(f"precision {requested.precision} on this CPU is emulated and usually slower than "
                         "float32; precision: auto times both and keeps the faster")
        elif min_cc is not None and requested.precision == "mixed_bfloat16" and min_cc < (8, 0):
            notes.append(f"bf16 on CC {min_cc[0]}.{min_cc[1]} has no tensor-core support and runs slower "
                         "than fp16; precision: auto picks mixed_float16 there")
        return requested.precision, "config"
    if min_cc is None and cpu_bf16:
        return "mixed_bfloat16", f"auto: CPU flags rule, until timed: the CPU computes bf16 natively ({', '.join(cpu_bf16)})"
    if min_cc is None:
        return "float32", "auto: CPU flags rule, until timed: no native bf16 (no AVX512_BF16 or AMX flags)"
    cc_text = f"{min_cc[0]}.{min_cc[1]}"
    if min_cc >= (8, 0):
        return "mixed_bfloat16", f"auto: CC {cc_text} has bf16 tensor cores; no loss scaling needed"
    if min_cc >= (7, 0):
        return "mixed_float16", f"auto: CC {cc_text} has fp16 tensor cores only; loss scaling on"
    return "float32", f"auto: CC {cc_text} has no tensor cores"


def _batch_prior(gpus: tuple[GpuFacts, ...], multiplier: int, target: int) -> tuple[int, str, int]:
    """(per-replica batch, reason, free bytes it was sized for) before any user override.

    Capped so that one step of all replicas does not exceed the effective batch by itself.
    """
    if not gpus:
        batch = min(multiplier, target)
        return batch, "auto: CPU, smallest batch that keeps steps short (accumulation reaches the target)", 0
    cap = max(1, math.ceil(target / len(gpus)))
    free = min(_usable_memory(g) for g in gpus)
    if free == 0:  # listed by TensorFlow after NVML failed: the memory is unknown
        return (min(multiplier, cap), "auto: GPU memory unknown (NVML failed), the smallest prior; set "
                "data.batch_size", 0)
    base = base_batch_for_memory(free)
    batch = min(base * multiplier, cap)
    reason = f"auto: prior for {free / _GIB:.1f} GiB free GPU memory"
    if multiplier > 1:
        reason += f" (base batch {base} x {multiplier} for this model size, at most {cap} per replica)"
    elif batch < base:
        reason += f" (at most {cap} per replica)"
    return batch, reason, free


def _input_parallelism(facts: MachineFacts, requested: RequestedSettings, on_gpu: bool) -> dict[str, Any]:
    cores = max(1, facts.usable_cpu_cores)
    if on_gpu:
        # One core stays with the Python thread that dispatches train steps to the GPU.
        input_cores, why = max(1, cores - 1), f"{cores} usable cores minus one for the step loop"
    else:
        # On CPU the model's own ops need cores too; the input pipeline gets half.
        input_cores, why = max(1, cores // 2), f"half of {cores} usable cores (the model trains on CPU)"
    if facts.ram_bytes:
        ram_budget = facts.ram_bytes // 2
        ram_why = f"auto: half of {facts.ram_bytes / _GIB:.1f} GiB usable RAM"
    else:
        ram_budget, ram_why = _DEFAULT_RAM_BUDGET, "auto: RAM unknown, 2 GiB"
    ram_cap = max(1, ram_budget // _RAM_PER_INPUT_WORKER)
    # Two calls in flight per input core: with one, each core idles while a clip's call hands over
    # to the next (measured on one pinned core: 64 -> 119-143 clips/s, BENCHMARKS.md "Input pipeline").
    in_flight = 2 * input_cores
    if requested.num_workers:
        workers, workers_why = requested.num_workers, "config"
    elif ram_cap < in_flight:
        workers, workers_why = ram_cap, f"auto: RAM budget allows {ram_cap} workers of 512 MiB"
    else:
        workers, workers_why = in_flight, f"auto: two calls in flight per input core, {why}"
    pool = input_cores if not requested.num_workers else max(input_cores, workers)
    return {
        "num_parallel_calls": (workers, workers_why),
        "private_threadpool_size": (pool, f"auto: {why}" if pool == input_cores else "auto: num_parallel_calls"),
        "autotune_cpu_budget": (pool, "auto: same as the private thread pool"),
        "autotune_ram_budget_bytes": (ram_budget, ram_why),
    }


def kernel_support(compute_capability: tuple[int, int], build_capabilities: tuple[str, ...]) -> str:
    """'native', 'ptx-jit' or 'none': how a TensorFlow build's CUDA kernels reach this GPU.

    A cubin for sm_XY runs on the same major version with minor >= Y; PTX for compute_XY is compiled
    by the driver for any CC >= XY, at start-up, which can take minutes.
    """
    major, minor = compute_capability
    ptx_ok = False
    for entry in build_capabilities:
        kind, _, digits = entry.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        build_cc = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and build_cc[0] == major and build_cc[1] <= minor:
            return "native"
        if kind == "compute" and build_cc <= (major, minor):
            ptx_ok = True
    return "ptx-jit" if ptx_ok else "none"


def _gpu_recommendations(facts: MachineFacts, gpus: tuple[GpuFacts, ...], free: int, model_size: str) -> list[str]:
    notes = []
    for gpu in gpus:
        if gpu.architecture == "Blackwell" and facts.tensorflow_cuda_capabilities is None:
            notes.append(f"GPU {gpu.index} {gpu.name} is Blackwell (CC {gpu.cc_text}): it needs a TensorFlow "
                         f"build with sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]} kernels; check "
                         "tf.sysconfig.get_build_info()['cuda_compute_capabilities'] (a build with only older "
                         "PTX JIT-compiles at start-up, slowly, if at all)")
        if facts.tensorflow_cuda_capabilities is not None:
            support = kernel_support(gpu.compute_capability, facts.tensorflow_cuda_capabilities)
            caps = ", ".join(facts.tensorflow_cuda_capabilities)
            if support == "none":
                notes.append(f"this TensorFlow build ({caps}) has no kernels for CC {gpu.cc_text} "
                             f"({gpu.name}): install a build that lists sm_{gpu.compute_capability[0]}"
                             f"{gpu.compute_capability[1]}")
            elif support == "ptx-jit":
                notes.append(f"this TensorFlow build ({caps}) reaches CC {gpu.cc_text} only through PTX: the "
                             "driver JIT-compiles its kernels on first start (minutes); keep them cached with "
                             "CUDA_CACHE_MAXSIZE=4294967296")
        if gpu.mig_mode:
            notes.append(f"MIG is enabled on GPU {gpu.index}: a MIG slice has only part of the memory this plan "
                         "assumes; set batch_size explicitly or let the probe measure")
        others = gpu.other_processes_memory_bytes
        if others and others > _GIB // 2:
            notes.append(f"other processes hold {others / _GIB:.1f} GiB on GPU {gpu.index}; the batch is sized "
                         f"for the {_usable_memory(gpu) / _GIB:.1f} GiB left")
    if len({g.name for g in gpus}) > 1:
        notes.append("the chosen GPUs differ: a mirrored step runs at the slowest card's pace and the batch "
                     "is sized for the smallest free memory")
    if facts.tensorflow_gpus is not None and not facts.tensorflow_gpus:
        notes.append(f"TensorFlow sees no GPU although NVML lists {len(facts.gpus)}: TensorFlow 2.21 needs "
                     "the CUDA 12 libraries (pip install 'tensorflow[and-cuda]')")
    if free == 0:
        notes.append("GPU memory unknown (NVML failed): the batch is the smallest prior and is not probed; set "
                     "data.batch_size to what fits")
    elif free / _GIB < _TOO_SMALL_FREE_GIB and model_size == "base":
        notes.append(f"only {free / _GIB:.1f} GiB free GPU memory: the base model may not fit even at batch 1; "
                     "set training.gradient_checkpointing: true and consider model size small")
    elif free / _GIB < _TIGHT_FREE_GIB and model_size == "base":
        notes.append(f"{free / _GIB:.1f} GiB free GPU memory: batch 1 barely fits the base model; set "
                     "training.gradient_checkpointing: true to trade recompute time for activation memory")
    return notes


def _platform_recommendations(facts: MachineFacts) -> list[str]:
    if facts.platform == "wsl2":
        return ["WSL2: Windows keeps part of the GPU memory for its desktop and files under /mnt/<drive> are "
                "read through a slow bridge; keep the dataset and caches on the Linux filesystem, and raise "
                "the VM's RAM limit in %UserProfile%\\.wslconfig if the input pipeline runs short"]
    if facts.platform == "windows":
        return ["native Windows: TensorFlow after 2.10 has no GPU support there; run under WSL2"]
    if facts.platform == "macos":
        return ["macOS: no CUDA GPU; this plan trains on CPU, which only suits smoke tests"]
    return []


def _xla(requested: RequestedSettings, on_gpu: bool, accumulation: int) -> tuple[bool, str]:
    if requested.xla is not None:
        return requested.xla, "config"
    if not on_gpu:
        return False, ("auto: not on a CPU, where XLA made the small model's step slower and compiles each "
                       "bucket shape for 20-60 s")
    payback = XLA_PAYBACK_STEPS_PER_SHAPE * requested.compiled_shapes
    measured = (f"on an H100 XLA compiled ~{XLA_COMPILE_S_PER_SHAPE:.0f} s per batch shape and saved "
                f"~{XLA_SAVED_S_PER_STEP * 1000:.0f} ms per step")
    if requested.planned_updates is None:
        return True, (f"auto: {measured}; pays back after ~{payback:,} steps for {requested.compiled_shapes} "
                      "shapes, and the run's length is unknown here")
    steps = requested.planned_updates * accumulation
    if steps >= payback:
        return True, f"auto: {steps:,} steps pay back its compiles ({measured}: ~{payback:,} steps needed)"
    return False, (f"auto: {steps:,} steps are too few to pay back XLA's compiles ({measured}: ~{payback:,} "
                   f"steps for {requested.compiled_shapes} shapes); graph mode, the alignment's loops "
                   "compiled alone. training.enable_xla_compilation: true forces it (the XLA cache "
                   "keeps the compiles for later runs)")


def plan_for_machine(facts: MachineFacts, model_size: str = "base",
                     requested: RequestedSettings | None = None) -> Plan:
    """Decides precision, TF32, XLA, batch, accumulation and input parallelism for `facts.gpus`.

    `facts.gpus` are the GPUs training will use (restrict with `MachineFacts.with_gpus` after
    selection); with several, `batch_size` is per replica and the plan is sized for the smallest.
    """
    if model_size not in MODEL_SIZE_BATCH_MULTIPLIER:
        raise ValueError(f"model size must be one of {sorted(MODEL_SIZE_BATCH_MULTIPLIER)}, got {model_size!r}")
    requested = requested or RequestedSettings()
    gpus = facts.gpus
    on_gpu = bool(gpus)
    replicas = max(1, len(gpus))
    notes: list[str] = []
    sources: dict[str, str] = {}

    precision, sources["precision"] = _precision(gpus, requested, notes, facts.cpu_bf16_flags)
    sources["loss_scaling"] = "auto: needed by float16 only" if precision == "mixed_float16" else \
        "auto: not needed by " + precision
    min_cc = min((g.compute_capability for g in gpus), default=None)
    if requested.tf32 is not None:
        tf32, sources["tf32"] = requested.tf32, "config"
    elif min_cc is not None and min_cc >= (8, 0):
        tf32, sources["tf32"] = True, "auto: CC >= 8.0 runs float32 matmuls on tensor cores (TF32)"
    else:
        tf32, sources["tf32"] = False, "auto: no TF32 before CC 8.0" if on_gpu else "auto: no TF32 on CPU"
    target = requested.effective_batch_size or 32
    sources["target_effective_batch_size"] = "config" if requested.effective_batch_size else "auto: default 32"
    prior, prior_why, free = _batch_prior(gpus, MODEL_SIZE_BATCH_MULTIPLIER[model_size], target)
    if requested.batch_size:
        batch, sources["batch_size"] = requested.batch_size, "config"
        fits = base_batch_for_memory(free) * MODEL_SIZE_BATCH_MULTIPLIER[model_size] if on_gpu else batch
        if batch > fits:
            notes.append(f"batch_size {batch} from config is above the prior {fits} for {free / _GIB:.1f} GiB "
                         "free; if it runs out of memory lower it, or set it to auto so the probe measures")
    else:
        batch, sources["batch_size"] = prior, prior_why
    batches = BatchPlan.reaching(target, batch, replicas, requested.gradient_accumulation_steps or None)
    accumulation, effective = batches.accumulation, batches.samples_per_update
    sources["gradient_accumulation_steps"] = batches.accumulation_source()
    sources["effective_batch_size"] = batches.describe()
    if requested.batch_size and requested.gradient_accumulation_steps and effective != target:
        notes.append(f"batch_size x gradient_accumulation_steps x replicas = {effective} differs from "
                     f"effective_batch_size {target}; the fixed values win")

    xla, sources["xla"] = _xla(requested, on_gpu, accumulation)
    parallel = _input_parallelism(facts, requested, on_gpu)
    for name, (_, why) in parallel.items():
        sources[name] = why

    if on_gpu:
        notes.extend(_gpu_recommendations(facts, gpus, free, model_size))
    else:
        notes.append("no GPU: training on CPU suits smoke tests only, and XLA gains little there")
    notes.extend(_platform_recommendations(facts))

    sources["device"] = f"auto: {len(gpus)} GPU(s) chosen" if on_gpu else "auto: no GPU detected or chosen"
    memory_known = all(g.total_memory_bytes > 0 for g in gpus)
    probe = on_gpu and not requested.batch_size and memory_known
    probe_precision = not on_gpu and requested.precision == "auto"
    sources["probe_precision"] = ("auto: precision is automatic on a CPU: float32 and bf16 train steps are "
                                  "timed at training start (cached per CPU and model)" if probe_precision else
                                  "auto: precision fixed by config" if not on_gpu else
                                  "auto: on GPUs the compute capability decides")
    sources["probe_batch_size"] = ("auto: batch is automatic, measuring can refine it" if probe else
                                   "auto: batch fixed by config" if on_gpu and requested.batch_size else
                                   "auto: GPU memory unknown, nothing to fit the probe to" if on_gpu else
                                   "auto: no probing on CPU")
    return Plan(
        device="gpu" if on_gpu else "cpu",
        gpu_indices=tuple(g.index for g in gpus),
        num_replicas=replicas,
        model_size=model_size,
        precision=precision,
        loss_scaling=precision == "mixed_float16",
        tf32=tf32,
        xla=xla,
        batch_size=batch,
        gradient_accumulation_steps=accumulation,
        effective_batch_size=effective,
        target_effective_batch_size=target,
        num_parallel_calls=parallel["num_parallel_calls"][0],
        private_threadpool_size=parallel["private_threadpool_size"][0],
        autotune_cpu_budget=parallel["autotune_cpu_budget"][0],
        autotune_ram_budget_bytes=parallel["autotune_ram_budget_bytes"][0],
        probe_batch_size=probe,
        probe_precision=probe_precision,
        sources=sources,
        recommendations=tuple(notes),
    )


def with_measured_batch(plan: Plan, batch_size: int, reason: str) -> Plan:
    """The plan with the probe's batch in place of the prior, accumulation recomputed to the target."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return plan.with_batch_plan(plan.batch_plan.with_batch(batch_size), probe_batch_size=False,
                                sources={"batch_size": f"auto: measured ({reason})"})


def with_precision(plan: Plan, precision: str, source: str) -> Plan:
    """The plan with `precision` (a Keras policy name) decided by `source`; nothing left to time."""
    if precision not in ("float32", "mixed_bfloat16", "mixed_float16"):
        raise ValueError(f"precision must be a Keras policy name, got {precision!r}")
    sources = {**plan.sources, "precision": source,
               "loss_scaling": "auto: needed by float16 only" if precision == "mixed_float16" else
               "auto: not needed by " + precision}
    return dataclasses.replace(plan, precision=precision, loss_scaling=precision == "mixed_float16",
                               probe_precision=False, sources=sources)


def vocoder_precision(facts: MachineFacts, requested: str = "auto") -> tuple[str, str, list[str]]:
    """(Keras policy, why, notes) for training the neural vocoder (utilities/train_vocoder.py).

    On GPUs the acoustic model's rule (bf16 from CC 8.0, fp16 with loss scaling on 7.x). On a CPU
    float32 unless asked: on an AVX512_BF16 EPYC the small vocoder's update was 19% faster in bf16,
    but after the same 1,500 updates it measured a little worse (PESQ 2.52 against 2.58; BENCHMARKS.md,
    "The vocoder in mixed precision"), so the CPU flags that make bf16 the acoustic model's prior do
    not count here."""
    notes: list[str] = []
    settings = RequestedSettings(precision=requested)
    if not facts.gpus and settings.precision == "auto":
        return "float32", "auto: a CPU, where bf16 measured faster but worse for the vocoder", notes
    policy, reason = _precision(facts.gpus, settings, notes, facts.cpu_bf16_flags)
    return policy, reason, notes
