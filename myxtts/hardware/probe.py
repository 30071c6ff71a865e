"""Probe, don't guess: measure a few batch sizes, fit memory, pick the batch that pays for itself.

The plan's batch is a prior from a table. The probe refines it on the real model: it runs a handful of
steps at increasing batch sizes through a caller-supplied `measure(batch_size) -> (peak_bytes,
samples_per_s)`, stops at the first out-of-memory, fits peak ~ a + b * batch by least squares, and
keeps the largest batch under 90% of free memory. Among the batches that fit, a larger one must earn
its place: it is chosen only if it gives at least 5% more samples/s than the current choice, because a
smaller batch means more optimizer steps per epoch and more headroom for long utterances.

Everything here is pure Python so it is tested with synthesized points; the caller owns running the model
(ideally in a subprocess, since an OOM can leave TensorFlow's allocator in a poor state). Results are
cached as JSON under the user's cache directory, keyed by GPU, memory, model config, precision and
maximum lengths, so the probe runs once per setup. On CPU there is nothing to probe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

LOGGER = logging.getLogger(__name__)

MEMORY_FRACTION = 0.9  # leave 10% for allocator fragmentation and longer-than-probed batches
MIN_THROUGHPUT_GAIN = 0.05


class ProbeOutOfMemory(RuntimeError):
    """Raised by a `measure` callable to say "this batch does not fit" without TensorFlow types."""


def is_out_of_memory(error: BaseException) -> bool:
    """Recognises OOM from our own exception, TensorFlow's ResourceExhaustedError or XLA/CUDA messages.

    Matching by name and text keeps TensorFlow out of this module's imports.
    """
    if isinstance(error, (ProbeOutOfMemory, MemoryError)):
        return True
    if type(error).__name__ == "ResourceExhaustedError":
        return True
    return re.search(r"out of memory|resource[_ ]exhausted|\boom\b", str(error), re.IGNORECASE) is not None


@dataclass(frozen=True)
class ProbePoint:
    """One measurement; `samples_per_s is None` means the batch ran out of memory."""

    batch_size: int
    peak_bytes: int | None
    samples_per_s: float | None

    @property
    def out_of_memory(self) -> bool:
        return self.samples_per_s is None


@dataclass(frozen=True)
class MemoryFit:
    """peak_bytes ~ intercept + slope * batch_size."""

    intercept: float
    slope: float

    def predict(self, batch_size: int) -> float:
        return self.intercept + self.slope * batch_size


def fit_memory(points: Iterable[ProbePoint]) -> MemoryFit:
    """Least-squares line through the (batch, peak) points that fitted in memory.

    With a single batch size measured the line goes through the origin and that point: an upper
    bound on the per-sample cost (the fixed part is counted per sample), so extrapolation errs small.
    """
    fitted = [(p.batch_size, p.peak_bytes) for p in points if not p.out_of_memory and p.peak_bytes is not None]
    if not fitted:
        raise ValueError("no probe point fitted in memory; cannot fit a memory model")
    n = len(fitted)
    mean_x = sum(x for x, _ in fitted) / n
    mean_y = sum(y for _, y in fitted) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in fitted)
    if var_x == 0:
        return MemoryFit(intercept=0.0, slope=mean_y / mean_x)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in fitted) / var_x
    return MemoryFit(intercept=mean_y - slope * mean_x, slope=slope)


def largest_fitting_batch(points: Sequence[ProbePoint], free_bytes: int, *,
                          memory_fraction: float = MEMORY_FRACTION, max_batch: int | None = None) -> int:
    """The largest batch whose predicted peak stays under `memory_fraction` of free memory.

    Also strictly below the smallest batch that actually ran out of memory, whatever the fit says, and
    at most `max_batch`. Returns 0 when not even batch 1 is predicted to fit.
    """
    fit = fit_memory(points)
    budget = memory_fraction * free_bytes
    ooms = [p.batch_size for p in points if p.out_of_memory]
    limit = min(ooms) - 1 if ooms else None
    if fit.slope <= 0:
        # Peak does not grow with batch (noise, or all points in one allocator bucket): only the
        # measured evidence bounds the batch.
        candidate = max(p.batch_size for p in points if not p.out_of_memory)
    else:
        candidate = math.floor((budget - fit.intercept) / fit.slope)
    for cap in (limit, max_batch):
        if cap is not None:
            candidate = min(candidate, cap)
    return max(0, candidate)


def choose_batch(points: Sequence[ProbePoint], *, max_batch: int | None = None,
                 min_gain: float = MIN_THROUGHPUT_GAIN) -> int:
    """Smallest-first: a larger batch replaces the current choice only if it is >= `min_gain` faster.

    Comparing with the current choice, not the previous point, means several small gains that add up
    past the threshold still win.
    """
    usable = sorted((p for p in points if not p.out_of_memory and (max_batch is None or p.batch_size <= max_batch)),
                    key=lambda p: p.batch_size)
    if not usable:
        raise ValueError("no measured batch fits; nothing to choose from")
    chosen = usable[0]
    for point in usable[1:]:
        # The 1e-9 keeps "exactly 5% faster" from failing on float rounding.
        if point.samples_per_s >= chosen.samples_per_s * (1 + min_gain) * (1 - 1e-9):
            chosen = point
    return chosen.batch_size


def candidate_batch_sizes(prior: int, max_batch: int) -> list[int]:
    """Batches to measure around the plan's prior: half, 1x, 1.5x, 2x, 3x, 4x, within [1, max_batch]."""
    raw = {max(1, prior // 2), prior, prior * 3 // 2, prior * 2, prior * 3, prior * 4}
    return sorted(b for b in raw if 1 <= b <= max_batch)


@dataclass(frozen=True)
class ProbeResult:
    points: tuple[ProbePoint, ...]
    memory_limit_batch: int
    chosen_batch: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["points"] = [dataclasses.asdict(p) for p in self.points]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProbeResult":
        return cls(points=tuple(ProbePoint(**p) for p in data["points"]),
                   memory_limit_batch=int(data["memory_limit_batch"]),
                   chosen_batch=int(data["chosen_batch"]), reason=str(data["reason"]))


def run_probe(measure: Callable[[int], tuple[int, float]], candidates: Sequence[int], free_bytes: int, *,
              is_oom: Callable[[BaseException], bool] = is_out_of_memory,
              memory_fraction: float = MEMORY_FRACTION, min_gain: float = MIN_THROUGHPUT_GAIN) -> ProbeResult:
    """Measures `candidates` in increasing order and decides.

    Stops at the first OOM, and skips a candidate the fit already predicts over budget (there is no need
    to crash the allocator to learn that). Exceptions that are not OOM propagate: a bug in the model is
    not a memory limit.
    """
    points: list[ProbePoint] = []
    for batch in sorted(set(candidates)):
        fitted = [p for p in points if not p.out_of_memory]
        if len({p.batch_size for p in fitted}) >= 2 and \
                fit_memory(fitted).predict(batch) > memory_fraction * free_bytes:
            break
        try:
            peak, throughput = measure(batch)
        except Exception as exc:  # noqa: BLE001 - re-raised below unless it is an OOM
            if not is_oom(exc):
                raise
            LOGGER.info("probe: batch %d ran out of memory (%s)", batch, exc)
            points.append(ProbePoint(batch, None, None))
            break
        points.append(ProbePoint(batch, int(peak), float(throughput)))
    if not any(not p.out_of_memory for p in points):
        raise ProbeOutOfMemory(f"even the smallest probed batch ({min(candidates)}) ran out of memory; "
                               "set training.gradient_checkpointing: true or use a smaller model size")
    limit = largest_fitting_batch(points, free_bytes, memory_fraction=memory_fraction)
    smallest = min(p.batch_size for p in points if not p.out_of_memory)
    if limit >= smallest:
        chosen = choose_batch(points, max_batch=limit, min_gain=min_gain)
        headroom = f"memory allows up to {limit}"
    else:
        # It ran, but the fit leaves less than the safety margin: keep the smallest that ran.
        chosen, headroom = smallest, "below the memory margin at every measured batch"
    throughput = {p.batch_size: p.samples_per_s for p in points}
    reason = (f"batch {chosen} at {throughput[chosen]:.1f} samples/s; {headroom} "
              f"(under {memory_fraction:.0%} of {free_bytes / 2**30:.1f} GiB free)")
    return ProbeResult(points=tuple(points), memory_limit_batch=limit, chosen_batch=chosen, reason=reason)


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$MYXTTS_CACHE_DIR`, else `$XDG_CACHE_HOME/myxtts`, else `~/.cache/myxtts`."""
    environ = os.environ if environ is None else environ
    if environ.get("MYXTTS_CACHE_DIR"):
        return Path(environ["MYXTTS_CACHE_DIR"])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "myxtts"
    return Path.home() / ".cache" / "myxtts"


def config_hash(model_config: Mapping[str, Any]) -> str:
    """A stable hash of a JSON-able model config: key order does not matter, any value change does."""
    canonical = json.dumps(model_config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ProbeKey:
    """What a probe result depends on; a change in any field means measuring again."""

    gpu_name: str
    total_memory_bytes: int
    model_config_hash: str
    precision: str
    max_lengths: tuple[tuple[str, int], ...]  # e.g. (("mel_frames", 800), ("text_tokens", 200))

    @classmethod
    def create(cls, gpu_name: str, total_memory_bytes: int, model_config: Mapping[str, Any], precision: str,
               max_lengths: Mapping[str, int]) -> "ProbeKey":
        return cls(gpu_name, int(total_memory_bytes), config_hash(model_config), precision,
                   tuple(sorted((str(k), int(v)) for k, v in max_lengths.items())))

    def digest(self) -> str:
        return config_hash(dataclasses.asdict(self))


class ProbeCache:
    """Probe results as one JSON file per key under `<cache dir>/<folder>/`.

    Any frozen dataclass key with `digest()` and result with `to_dict()` / `from_dict()` fit: the batch
    probe's `ProbeKey` / `ProbeResult` (folder "probe") and the CPU precision probe's (folder "precision").
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, folder: str = "probe",
                 result_type: type = ProbeResult) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir() / folder
        self.result_type = result_type

    def path_for(self, key: ProbeKey) -> Path:
        return self.directory / f"{key.digest()}.json"

    def load(self, key: ProbeKey) -> ProbeResult | None:
        path = self.path_for(key)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("key") != json.loads(json.dumps(dataclasses.asdict(key))):
                LOGGER.warning("probe cache %s belongs to another setup; measuring again", path)
                return None
            return self.result_type.from_dict(data["result"])
        except (ValueError, KeyError, TypeError) as exc:
            # A damaged cache only costs a re-measurement; say so instead of failing the run.
            LOGGER.warning("probe cache %s unreadable (%s); measuring again", path, exc)
            return None

    def store(self, key: ProbeKey, result: ProbeResult) -> Path:
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"key": dataclasses.asdict(key), "result": result.to_dict()}
        # this process's own: two runs starting at once shared one ".tmp", and the one renaming second
        # stopped in FileNotFoundError (or renamed the other's half-written file into place)
        temporary = path.with_suffix(f".tmp-{os.getpid()}")
        temporary.write_text(json.dumps(payload, indent=2))
        temporary.replace(path)  # atomic, so a concurrent reader never sees half a file
        return path
