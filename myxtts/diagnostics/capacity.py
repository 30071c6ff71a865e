"""Will this host feed a GPU? The capacity plan of a config on its own corpus, for one or more GPUs.

    corpus rows -> host calibration (timed once per corpus, settings and CPU model; cached)
      -> for each GPU: the hardware plan's precision, batch and input cores for that card
      -> GPU demand against the host's supply on each route -> the route that keeps it fed

`utilities/capacity_plan.py` prints it; `python -m myxtts.hardware` prints the same from the cached
calibration alone (it may not import the data or model code that the calibration needs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from myxtts.config import Config
from myxtts.data.pipeline import build_vocabulary
from myxtts.data.splits import load_splits
from myxtts.diagnostics.calibration import SAMPLE_CLIPS, SECONDS_PER_ROUTE, calibrate
from myxtts.hardware.capacity import DEFAULT_MFU, LOOP_ITERATION_S, LOOP_SOURCE, CapacityPlan, plan_capacity
from myxtts.hardware.capacity_record import ROUTE_LABELS, ROUTES, CapacityCache, CapacityRecord
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.devices import DeviceSpec


def host_calibration(config: Config, *, cache: CapacityCache | None = None, recalibrate: bool = False,
                     clips: int = SAMPLE_CLIPS, seconds: float = SECONDS_PER_ROUTE,
                     progress: Callable[[str], None] = lambda message: None) -> CapacityRecord:
    """The config's training split, calibrated (or read from the cache)."""
    rows, _ = load_splits(config)
    vocabulary = build_vocabulary(rows, config.data)
    corpus = str(Path(config.data.train_data).resolve())
    return calibrate(config, rows, vocabulary, corpus=corpus, cache=cache, recalibrate=recalibrate, clips=clips,
                     seconds=seconds, progress=progress)


def capacity_plans(config: Config, record: CapacityRecord, devices: list[DeviceSpec], facts: MachineFacts,
                   mfu: float = DEFAULT_MFU, loop_iteration_s: float = LOOP_ITERATION_S,
                   loop_source: str = LOOP_SOURCE, gpus: int = 1) -> list[CapacityPlan]:
    """One capacity plan per GPU model for the config's model, batch and precision on this host,
    with `gpus` cards of it fed by this host's one input pipeline."""
    return [plan_capacity(record, device, facts, config.model.size, batch_size=config.data.batch_size,
                          precision=config.training.precision or "auto", mfu=mfu, loop_iteration_s=loop_iteration_s,
                          loop_source=loop_source, gpus=gpus)
            for device in devices]


def capacity_table(plans: list[CapacityPlan]) -> list[str]:
    """Several GPUs side by side: their demand, and the input cores each route would need."""
    record = plans[0].record
    rates = "  ".join(f"{ROUTE_LABELS[r]} {record.routes[r].audio_s_per_cpu_s:,.0f}" for r in ROUTES)
    lines = [f"Host supply per core, measured (audio-s per CPU-second): {rates}",
             f"{'GPU':<16}{'precision':<16}{'batch':>6}{'GPU eats':>11}{'no-loop bound':>15}"
             + "".join(f"{'cores: ' + ROUTE_LABELS[r]:>24}" for r in ROUTES) + "  route"]
    for plan in plans:
        demand = plan.demand
        needed = "".join(f"{s.cores_needed:>24}" for s in plan.choice.supplies)
        route = ROUTE_LABELS[plan.choice.route] + ("" if plan.choice.feeds else " (input-bound)")
        lines.append(f"{demand.device.key:<16}{demand.precision:<16}{demand.batch:>6}{demand.audio_s_per_s:>11,.0f}"
                     f"{demand.compute_bound_audio_s_per_s:>15,.0f}{needed}  {route}")
    return lines
