"""Will this host feed the GPU? The GPU's appetite in audio-seconds per second against the host's supply.

    GPU demand  = 1 / (FLOPs per audio-second / (peak x utilization)      the arithmetic
                       + loop frames per audio-second / batch x t         the alignment's loops
                       + fixed cost per step / audio-seconds per batch)    launches, small kernels
    host supply = audio-seconds per CPU-second of a route x input cores   (measured, per route)

The FLOPs come from `models/flops.py` on the corpus's own clip shapes, the peaks from the spec
sheets in `devices.py`, the host rates from a calibration on the user's data
(`capacity_record.py`). The utilization is an assumption (`DEFAULT_MFU`), capped by the roofline:
where the products' arithmetic intensity is below the GPU's ridge point, memory bandwidth, not
arithmetic, sets the pace. The alignment's frame-by-frame loops are sequential whatever the batch;
on a GPU each loop iteration has a fixed cost far above one frame's arithmetic, so a frame costs
what its share of an iteration does (`LOOP_ITERATION_S`, per frame of one loop at the GPU's 16
frames per iteration). For this model that matters more than its FLOPs, so the demand is given
with and without them. What is left of a measured step beyond both is a fixed cost per step
(`STEP_OVERHEAD_S`: kernels too small to fill the GPU, their launches). The demand is that of an XLA
step, the fastest route and so the most a host must feed (a short run's graph-mode step, see
`plan.py`, eats about 2.5x less).

The route chosen is the simplest that keeps the GPU fed: on the fly, else cached features, else
mel_on_device. Every line printed says where its number comes from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from myxtts.hardware.capacity_record import ROUTE_LABELS, ROUTES, CapacityRecord, ModelCost
from myxtts.hardware.detect import GpuFacts, MachineFacts
from myxtts.hardware.devices import DeviceSpec
from myxtts.hardware.plan import RequestedSettings, plan_for_machine

DEFAULT_MFU = 0.40
MFU_SOURCE = ("assumed: well-tuned large transformers train at 40-50% of dense peak (PaLM: 46% MFU on TPU v4; "
              "Megatron-LM: ~50% of A100 peak); a small model with conv blocks and scans usually reaches less")
# Seconds per frame of one alignment loop on a GPU, with the loops stepping through 16 frames per
# iteration (training.alignment_frames_per_iteration's GPU default).
LOOP_ITERATION_S = 8.3e-6
LOOP_SOURCE = ("measured on an H100 under XLA (TensorFlow 2.21, utilities/benchmark_alignment.py, [16, 700, 100]): "
               "forward-sum + gradient 20.3 us and Viterbi 13.0 us a frame at 16 frames per iteration, two loops "
               "each: 8.3 us per loop frame (a bare log-add loop took 2.4 us there)")
# What an XLA train step of the small model took on an H100 (bf16, batch 16 at the longest bucket,
# 1,040 frames: 38 ms) beyond its loops (1,040 x 33.3 us = 34.6 ms) and its arithmetic at the MFU
# (~0.2 ms). Measured for `small` only; a graph-mode step's rest was ~77 ms (94 ms at 520 frames).
STEP_OVERHEAD_S = 0.003
STEP_OVERHEAD_SOURCE = ("measured on an H100: the small model's XLA step (38 ms at batch 16 x 1,040 frames) less its "
                        "loops and arithmetic; other sizes and GPUs assumed the same")
# Bytes per activation and weight in the products: 2 under mixed precision, 4 in float32.
_ITEMSIZE = {"mixed_bfloat16": 2, "mixed_float16": 2, "float32": 4}


@dataclass(frozen=True)
class GpuDemand:
    """How fast one GPU would train on this corpus, in audio-seconds per second."""

    model_size: str
    device: DeviceSpec
    precision: str
    path: str  # which peak: "bf16 tensor cores", ...
    peak_flops: float
    mfu: float  # the assumed model FLOPs utilization
    utilization: float  # what is used: the MFU, or the roofline cap when that is lower
    roofline_cap: float  # intensity / ridge point (>= 1: arithmetic-bound)
    batch: int
    flops_per_audio_s: float
    compute_s_per_audio_s: float
    loop_s_per_audio_s: float
    overhead_s_per_audio_s: float = 0.0

    @property
    def audio_s_per_s(self) -> float:
        return 1.0 / (self.compute_s_per_audio_s + self.loop_s_per_audio_s + self.overhead_s_per_audio_s)

    @property
    def compute_bound_audio_s_per_s(self) -> float:
        """The demand if the alignment loops cost nothing: the most the GPU could ever take."""
        return 1.0 / self.compute_s_per_audio_s


def gpu_demand(record: CapacityRecord, model_size: str, device: DeviceSpec, precision: str, tf32: bool, batch: int,
               mfu: float = DEFAULT_MFU, loop_iteration_s: float = LOOP_ITERATION_S,
               mel_on_device: bool = False, step_overhead_s: float = STEP_OVERHEAD_S) -> GpuDemand:
    """The GPU's appetite for `model_size` trained at `precision` in batches of `batch` clips."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
    if model_size not in record.models:
        raise ValueError(f"the calibration has no cost for model size {model_size!r}; it has {sorted(record.models)}")
    cost: ModelCost = record.models[model_size]
    peak, path = device.peak_flops(precision, tf32)
    utilization, cap = roofline_utilization(device, peak, cost.intensity, precision, mfu)
    flops = cost.flops_per_audio_s + (cost.mel_on_device_flops_per_audio_s if mel_on_device else 0.0)
    return GpuDemand(
        model_size=model_size, device=device, precision=precision, path=path, peak_flops=peak, mfu=mfu,
        utilization=utilization, roofline_cap=cap, batch=batch, flops_per_audio_s=flops,
        compute_s_per_audio_s=flops / (peak * utilization),
        loop_s_per_audio_s=record.loop_iterations_per_audio_s / batch * loop_iteration_s,
        overhead_s_per_audio_s=step_overhead_s / (batch * record.audio_seconds / max(record.clips, 1)),
    )


def roofline_utilization(device: DeviceSpec, peak: float, intensity: float, precision: str,
                         mfu: float) -> tuple[float, float]:
    """(utilization to use, roofline cap): the MFU, unless the products' arithmetic intensity (FLOPs per
    byte, counted at 2-byte activations) is below the ridge point, where bandwidth caps it lower."""
    # Float32 moves twice the bytes of the 2-byte count.
    cap = intensity * 2 / _ITEMSIZE.get(precision, 4) / (peak / device.memory_bandwidth)
    return min(mfu, cap), cap


@dataclass(frozen=True)
class RouteSupply:
    route: str
    per_core: float  # audio-seconds per CPU-second, measured
    supply: float  # with the input cores the plan gives the pipeline
    demand: float  # the GPU's demand on this route (mel_on_device adds the STFT to the step)
    cores_needed: int  # input cores that would match the demand

    @property
    def feeds(self) -> bool:
        return self.supply >= self.demand


@dataclass(frozen=True)
class RouteChoice:
    route: str  # the route to use
    feeds: bool  # whether it keeps the GPU fed
    supplies: tuple[RouteSupply, ...]
    advice: str
    gpus: int = 1  # the GPUs whose demand the supplies were measured against


def choose_route(record: CapacityRecord, demand: GpuDemand, mel_demand: GpuDemand, input_cores: int,
                 gpus: int = 1) -> RouteChoice:
    """The simplest route whose supply meets the demand of `gpus` such GPUs, fed by one input pipeline
    (on the fly < cached features < mel_on_device), or, when none does, the one that comes closest."""
    supplies = []
    for route in ROUTES:
        rate = record.routes[route].audio_s_per_cpu_s
        need = gpus * (mel_demand if route == "mel_on_device" else demand).audio_s_per_s
        supplies.append(RouteSupply(route, rate, rate * input_cores, need, max(1, math.ceil(need / rate))))
    feeding = [s for s in supplies if s.feeds]
    if feeding:
        first = feeding[0]
        others = [ROUTE_LABELS[s.route] for s in feeding[1:]]
        if first.route == "on_the_fly":
            advice = "every route keeps it fed; on the fly is enough"
        else:
            advice = f"use {ROUTE_LABELS[first.route]}" + (f" or {' or '.join(others)}" if others else "")
            if first.route == "cached_features":
                advice += " (the first epoch, which fills the cache, runs at the on-the-fly rate)"
        return RouteChoice(first.route, True, tuple(supplies), advice, gpus)
    best = max(supplies, key=lambda s: s.supply / s.demand)
    advice = (f"no route keeps it fed: {ROUTE_LABELS[best.route]} comes closest ({best.supply / best.demand:.0%} of "
              f"the demand); it needs {best.cores_needed} input cores, or a smaller GPU")
    return RouteChoice(best.route, False, tuple(supplies), advice, gpus)


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def _cores(count: int) -> str:
    return f"{count} input core{'s' if count != 1 else ''}"


def summary_line(demand: GpuDemand, choice: RouteChoice, input_cores: int) -> str:
    """One sentence: the appetite, the host's on-the-fly supply and the route."""
    on_the_fly = choice.supplies[0]
    together = f" ({_rate(on_the_fly.demand)} for the {choice.gpus} of them)" if choice.gpus > 1 else ""
    return (f"{demand.model_size} model on {demand.device.key} ({demand.path.split()[0]}) at {demand.mfu:.0%} MFU eats "
            f"~{_rate(demand.audio_s_per_s)} audio-s/s{together}; this host delivers {_rate(on_the_fly.supply)} on the fly with "
            f"{_cores(input_cores)}: {choice.advice}")


def capacity_lines(record: CapacityRecord, demand: GpuDemand, choice: RouteChoice, input_cores: int,
                   loop_iteration_s: float = LOOP_ITERATION_S, loop_source: str = LOOP_SOURCE) -> list[str]:
    """The capacity plan as printed, every number with its source."""
    device, cost = demand.device, record.models[demand.model_size]
    cap_text = ("at or above the ridge: arithmetic-bound" if demand.roofline_cap >= 1 else
                f"at most {demand.roofline_cap:.0%} of peak from memory bandwidth")
    used = "the MFU stands" if demand.utilization == demand.mfu else f"{demand.utilization:.0%} used instead"
    lines = [
        f"Capacity plan: {demand.model_size} model on {device.name} ({device.key}), batch {demand.batch}",
        f"  GPU peak: {demand.path} {demand.peak_flops / 1e12:,.1f} TFLOP/s dense, memory {device.memory_bandwidth / 1e9:,.0f} GB/s"
        f"  [from spec sheets: {device.source}]",
        f"  utilization: {demand.mfu:.0%} MFU  [{MFU_SOURCE}]",
        f"  roofline: the products' intensity {cost.intensity * 2 / _ITEMSIZE.get(demand.precision, 4):,.0f} FLOP/byte "
        f"against the ridge {demand.peak_flops / device.memory_bandwidth:,.0f}: {cap_text}; {used}"
        "  [models/flops.py: each product's operands and result moved once]",
        f"  training arithmetic: {demand.flops_per_audio_s / 1e9:,.2f} GFLOP per audio-second (forward "
        f"{cost.forward_flops_per_audio_s / 1e9:,.2f})  [models/flops.py on {record.clips} clips of {record.corpus}: "
        f"{record.tokens_per_audio_s:.1f} tokens per audio-second, padding x{record.padding:.2f}, "
        f"{_settings_text(record)}]",
        f"  alignment loops: {record.loop_iterations_per_audio_s / demand.batch:,.2f} sequential loop frames per "
        f"audio-second at batch {demand.batch}, {loop_iteration_s * 1e6:.1f} us each  [{loop_source}]",
        f"  fixed cost per step: {STEP_OVERHEAD_S * 1000:.0f} ms, {demand.overhead_s_per_audio_s * 1e6:,.0f} us per "
        f"audio-second at batch {demand.batch}  [{STEP_OVERHEAD_SOURCE}]",
        f"  GPU consumes ~{_rate(demand.audio_s_per_s)} audio-s/s (~{_rate(demand.compute_bound_audio_s_per_s)} if "
        "its loops and fixed costs were free)",
        f"  Host: {record.cpu_model}, measured {record.created_utc} with {_parallel(record)} parallel calls, load "
        f"{record.load_average[0]:.1f} -> {record.load_average[1]:.1f}; per core = audio-seconds per CPU-second used; "
        f"the plan gives the pipeline {_cores(input_cores)}",
        f"    {'route':<16}{'per core':>12}{'with ' + _cores(input_cores).split(' input')[0] + ' core(s)':>16}"
        f"{'GPU eats':>12}{'cores needed':>14}",
    ]
    for supply in choice.supplies:
        mark = "  <- " + ("use" if choice.feeds else "closest") if supply.route == choice.route else ""
        lines.append(f"    {ROUTE_LABELS[supply.route]:<16}{_rate(supply.per_core):>12}{_rate(supply.supply):>16}"
                     f"{_rate(supply.demand):>12}{supply.cores_needed:>14}{mark}")
    lines.append(f"  -> {summary_line(demand, choice, input_cores)}")
    return lines


def _parallel(record: CapacityRecord) -> int:
    return max(rate.parallel_calls for rate in record.routes.values())


def _settings_text(record: CapacityRecord) -> str:
    window = record.settings.get("decoder_window", 0)
    return f"decoder_window {window or 'off'}" + (", gradient checkpointing" if record.settings.get(
        "gradient_checkpointing") else "")


@dataclass(frozen=True)
class CapacityPlan:
    """The capacity plan for one GPU: its demand on the routes, the host's supply, the route chosen."""

    demand: GpuDemand
    mel_demand: GpuDemand  # with data.mel_on_device the step also computes the log-mel
    choice: RouteChoice
    input_cores: int
    record: CapacityRecord
    loop_iteration_s: float
    loop_source: str = LOOP_SOURCE

    def lines(self) -> list[str]:
        return capacity_lines(self.record, self.demand, self.choice, self.input_cores, self.loop_iteration_s,
                              self.loop_source)

    def summary(self) -> str:
        return summary_line(self.demand, self.choice, self.input_cores)

    def to_dict(self) -> dict:
        d = self.demand
        return {
            "gpu": d.device.key, "gpu_name": d.device.name, "spec_source": d.device.source, "model_size": d.model_size,
            "precision": d.precision, "peak_flops": d.peak_flops, "peak_path": d.path, "mfu": d.mfu,
            "mfu_source": MFU_SOURCE, "utilization": d.utilization, "batch": d.batch,
            "flops_per_audio_s": d.flops_per_audio_s, "loop_iteration_s": self.loop_iteration_s,
            "loop_source": self.loop_source, "gpu_audio_s_per_s": d.audio_s_per_s,
            "gpu_compute_bound_audio_s_per_s": d.compute_bound_audio_s_per_s, "input_cores": self.input_cores,
            "routes": [{"route": s.route, "per_core": s.per_core, "supply": s.supply, "demand": s.demand,
                        "cores_needed": s.cores_needed, "feeds": s.feeds} for s in self.choice.supplies],
            "route": self.choice.route, "feeds": self.choice.feeds, "advice": self.choice.advice,
            "summary": self.summary(), "calibration": {"created_utc": self.record.created_utc,
                                                       "cpu_model": self.record.cpu_model, "corpus": self.record.corpus},
        }


def gpu_facts_for(device: DeviceSpec, index: int = 0) -> GpuFacts:
    """A GPU as NVML would describe an idle card of this model, for planning one the host does not have."""
    return GpuFacts(index=index, name=device.name, total_memory_bytes=device.memory_bytes,
                    free_memory_bytes=device.memory_bytes, compute_capability=device.compute_capability)


def plan_capacity(record: CapacityRecord, device: DeviceSpec, facts: MachineFacts, model_size: str, *,
                  batch_size: int = 0, precision: str = "auto", mfu: float = DEFAULT_MFU,
                  loop_iteration_s: float = LOOP_ITERATION_S, loop_source: str = LOOP_SOURCE,
                  gpus: int = 1) -> CapacityPlan:
    """The capacity plan of this host (`facts`: its cores and RAM) driving `gpus` of `device`.

    Precision, batch and the pipeline's cores are the hardware plan's for that GPU, so the numbers are
    those of the run the plan would make: `batch_size` 0 takes the plan's batch prior for the card.
    """
    plan = plan_for_machine(dataclasses.replace(facts, gpus=(gpu_facts_for(device),)), model_size,
                            RequestedSettings(batch_size=batch_size, precision=precision))
    demand = gpu_demand(record, model_size, device, plan.precision, plan.tf32, plan.batch_size, mfu, loop_iteration_s)
    mel = gpu_demand(record, model_size, device, plan.precision, plan.tf32, plan.batch_size, mfu, loop_iteration_s,
                     mel_on_device=True)
    # The input's cores are the pipeline's thread pool (it keeps two calls in flight on each).
    choice = choose_route(record, demand, mel, plan.private_threadpool_size, gpus)
    return CapacityPlan(demand, mel, choice, plan.private_threadpool_size, record, loop_iteration_s, loop_source)
