"""A host calibration as stored: what this CPU's input pipeline delivers per core on a corpus, per route.

The calibration itself (`myxtts.diagnostics.calibration`) times the real pipeline; what it found is
kept here as plain numbers, so `python -m myxtts.hardware` can print the capacity plan without
TensorFlow, the data or the model code. A record holds:

- per route (on the fly, cached features, mel_on_device): audio-seconds processed per CPU-second
  (the per-core rate; measured with `parallel_calls` parallel calls, it is the wall-clock rate
  divided by the cores the process actually kept busy, which a shared machine's load barely moves);
- the corpus's clip shapes as the pipeline pads them: tokens per audio-second, padding, and for each
  model size the training FLOPs per audio-second (`models/flops.py`, computed when calibrating);
- the alignment loops' iterations per audio-second (at batch 1: a batch runs them once for all its
  clips).

One JSON file per corpus, data settings and CPU model under `<cache dir>/capacity/` (the probe's
cache directory: `$MYXTTS_CACHE_DIR`, else `~/.cache/myxtts`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from myxtts.hardware.probe import config_hash, default_cache_dir

LOGGER = logging.getLogger(__name__)

ROUTES = ("on_the_fly", "cached_features", "mel_on_device")
ROUTE_LABELS = {
    "on_the_fly": "on the fly",
    "cached_features": "cached features",
    "mel_on_device": "mel_on_device",
}
# Bumped when a field changes meaning, so an old file is measured again rather than misread.
# 2: route rates count the audio delivered in full batches, not every clip the length filter keeps.
RECORD_VERSION = 2


@dataclass(frozen=True)
class RouteRate:
    """One route's measured throughput on this host."""

    route: str
    audio_s_per_cpu_s: float  # the per-core rate: audio-seconds per CPU-second used
    audio_s_per_s: float  # wall clock, with `parallel_calls` parallel calls
    cores_busy: float  # CPU-seconds per wall-second during the timing
    parallel_calls: int
    epochs: int
    seconds: float


@dataclass(frozen=True)
class ModelCost:
    """One model size's training arithmetic on this corpus's clips, padded as the pipeline pads them."""

    flops_per_audio_s: float  # forward + backward (+ recompute), per audio-second
    forward_flops_per_audio_s: float
    mel_on_device_flops_per_audio_s: float  # what data.mel_on_device adds: STFT and filterbank
    intensity: float  # FLOPs per byte of the products, at 2-byte activations


@dataclass(frozen=True)
class CapacityRecord:
    key: str
    created_utc: str
    cpu_model: str
    usable_cores: int
    load_average: tuple[float, float]  # 1-minute load before and after the calibration
    corpus: str
    clips: int  # clips kept by the length filter in the calibration sample
    audio_seconds: float  # their audio, processed once per epoch
    tokens_per_audio_s: float
    padding: float  # padded frames / true frames (bucketing)
    batch_size: int  # data.batch_size it was configured with (0: automatic)
    loop_iterations_per_audio_s: float  # alignment loop iterations per audio-second at batch 1
    settings: Mapping[str, Any]  # the data and training settings the numbers depend on
    routes: Mapping[str, RouteRate] = field(default_factory=dict)
    models: Mapping[str, ModelCost] = field(default_factory=dict)
    version: int = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["load_average"] = list(self.load_average)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CapacityRecord":
        values = dict(data)
        if values.get("version") != RECORD_VERSION:
            raise ValueError(f"record version {values.get('version')!r}, expected {RECORD_VERSION}")
        values["load_average"] = tuple(values["load_average"])
        values["routes"] = {name: RouteRate(**rate) for name, rate in values["routes"].items()}
        values["models"] = {name: ModelCost(**cost) for name, cost in values["models"].items()}
        return cls(**values)


def record_key(corpus: str, cpu_model: str, settings: Mapping[str, Any]) -> str:
    """What a record depends on: the corpus, the CPU model and the settings that change the work."""
    return config_hash({"corpus": corpus, "cpu_model": cpu_model, "settings": dict(settings)})


class CapacityCache:
    """Records as one JSON file per key under `<cache dir>/capacity/`."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir() / "capacity"

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> CapacityRecord | None:
        path = self.path_for(key)
        return self._read(path) if path.exists() else None

    def store(self, record: CapacityRecord) -> Path:
        path = self.path_for(record.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # this process's own: two runs starting at once shared one ".tmp", and the one renaming second
        # stopped in FileNotFoundError (or renamed the other's half-written file into place)
        temporary = path.with_suffix(f".tmp-{os.getpid()}")
        temporary.write_text(json.dumps(record.to_dict(), indent=2))
        temporary.replace(path)  # atomic: a concurrent reader never sees half a file
        return path

    def latest_for_cpu(self, cpu_model: str) -> CapacityRecord | None:
        """The newest record measured on a CPU of this model (any corpus), or None."""
        records = [r for r in map(self._read, sorted(self.directory.glob("*.json"))) if r and r.cpu_model == cpu_model]
        return max(records, key=lambda r: r.created_utc, default=None)

    def _read(self, path: Path) -> CapacityRecord | None:
        try:
            return CapacityRecord.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A damaged or outdated record only costs a new calibration; say so instead of failing.
            LOGGER.warning("capacity record %s unreadable (%s); calibrate again", path, exc)
            return None
