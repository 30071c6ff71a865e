"""Writes the utilization series the diagnostics tests replay (run once; the JSON files are committed).

    python tests/data/gpu_samples/generate.py

Each file holds what `nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, 0)` returns, as
JSON: `value_type` (NVML_VALUE_TYPE_UNSIGNED_INT = 1) and `samples`, a list of
[timeStamp in microseconds since the epoch, utilization percent]. The driver samples about every
1/6 s with a little jitter, which is reproduced here.

No GPU was available when these were made, so they are synthesized in the shapes a real run
shows (see README.md in this folder); a real recording in the same format can replace any of them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
START_US = 1_760_000_000_000_000  # an arbitrary epoch time; the sampler only looks at differences
PERIOD_US = 166_667  # the driver's sampling interval on recent NVIDIA cards (about 6 Hz)
SECONDS = 20.0


def timestamps(rng: random.Random) -> list[int]:
    times, now = [], START_US
    while now < START_US + SECONDS * 1e6:
        times.append(now)
        now += PERIOD_US + rng.randint(-2_000, 2_000)  # scheduling jitter of the driver's sampler
    return times


def steady_90(rng: random.Random, t: int) -> int:
    # A compute-bound run: kernels back to back, a point or two of noise.
    return min(100, max(0, round(90 + rng.gauss(0, 1.5))))


def sawtooth_2_40(rng: random.Random, t: int) -> int:
    # An input-bound run: the GPU waits for each batch, then works through it. Over NVML's
    # averaging window that reads as a ramp from ~2% to ~40% and a drop, once per 1.5 s step.
    phase = ((t - START_US) / 1e6 % 1.5) / 1.5
    return round(2 + 38 * phase + rng.uniform(-1, 1))


def idle(rng: random.Random, t: int) -> int:
    # Nothing launched at all (for instance a run stuck before its first step).
    return 0


def main() -> None:
    for name, shape, description in (
        ("steady_90", steady_90, "compute-bound: steady 90% with +-1.5 points of noise"),
        ("sawtooth_2_40", sawtooth_2_40, "input-bound: a 2-40% sawtooth with a 1.5 s period"),
        ("idle", idle, "idle: 0% throughout"),
    ):
        rng = random.Random(name)
        samples = [[t, shape(rng, t)] for t in timestamps(rng)]
        record = {
            "description": description,
            "provenance": "synthesized by generate.py in the format nvmlDeviceGetSamples returns (no GPU was available)",
            "value_type": 1,
            "samples": samples,
        }
        (HERE / f"{name}.json").write_text(json.dumps(record) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
