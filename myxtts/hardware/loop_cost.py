"""What one frame of an alignment loop costs on this GPU model: measured once at start, else the H100's figure.

The capacity plan's GPU demand is mostly the alignment's sequential loops for this model
(`capacity.py`), so their cost per frame decides the plan. It differs by GPU model, TensorFlow
version and frames per loop iteration, and no spec sheet gives it: the training process times the
loops on its own device before the plan is made (`diagnostics/alignment_timing.time_loop_frames`,
a few seconds) and keeps the answer here, one JSON file per key under `<cache dir>/loops/`. Where
nothing was measured for a GPU model (planning a card the host does not have), the plan falls back
to the H100's measured `LOOP_ITERATION_S`.

This module only keeps the numbers; it imports nothing that runs a model (the timing lives in
`diagnostics`, above the model code).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Iterable, Mapping

from myxtts.hardware.capacity import LOOP_ITERATION_S, LOOP_SOURCE
from myxtts.hardware.devices import DeviceSpec, device_for_gpu_name
from myxtts.hardware.probe import ProbeCache, config_hash

CACHE_FOLDER = "loops"
# Frames each loop iteration steps through on a GPU (`models/alignment.AlignmentLoops.for_device`):
# on an H100 a frame cost 2.5-3.9x less at 16 than at one (BENCHMARKS.md, "On an H100").
GPU_FRAMES_PER_ITERATION = 16
# The batch the loops are timed on at start: the plan's batch prior on large cards, frames about one
# long clip's (a frame's cost does not depend on the length), tokens a long sentence's.
TIMING_SHAPE = (16, 512, 100)


@dataclass(frozen=True)
class LoopCostKey:
    """What a loop timing depends on; a change in any field means timing again."""

    device: str  # the GPU's name as NVML gives it
    frames_per_iteration: int
    jit_compile: bool  # timed inside an XLA-compiled function (the capacity plan's step) or not
    shape: tuple[int, int, int]  # [batch, frames, tokens] of the timed scores
    tensorflow: str

    def digest(self) -> str:
        return config_hash(dataclasses.asdict(self))


@dataclass(frozen=True)
class LoopCost:
    """Seconds per frame of one loop (the plan's unit), and where that number comes from."""

    seconds_per_frame: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoopCost":
        return cls(seconds_per_frame=float(data["seconds_per_frame"]), source=str(data["source"]))


FALLBACK = LoopCost(LOOP_ITERATION_S, LOOP_SOURCE)


def loop_cost_cache(directory=None) -> ProbeCache:
    return ProbeCache(directory, folder=CACHE_FOLDER, result_type=LoopCost)


def tensorflow_version() -> str:
    """The installed TensorFlow's version, read from its package (no import of TensorFlow)."""
    for name in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def key_for(device: str, frames_per_iteration: int, jit_compile: bool) -> LoopCostKey:
    return LoopCostKey(device, frames_per_iteration, jit_compile, TIMING_SHAPE, tensorflow_version())


def cost_on_host(device: DeviceSpec, gpu_names: Iterable[str], frames_per_iteration: int = GPU_FRAMES_PER_ITERATION,
                 cache: ProbeCache | None = None) -> LoopCost:
    """What a training run's start measured on this host's card of `device`'s model (`gpu_names`: the
    host's GPUs as NVML names them; the XLA timing the capacity plan uses), else the H100's figure."""
    names = [name for name in gpu_names if device_for_gpu_name(name) == device]
    if not names:
        return FALLBACK
    return (cache or loop_cost_cache()).load(key_for(names[0], frames_per_iteration, True)) or FALLBACK
