"""GPU utilization while training runs: an NVML sampler thread and what its series says.

Two ways to get utilization out of NVML, best first:

* the driver's own buffer (`nvmlDeviceGetSamples` with `NVML_GPU_UTILIZATION_SAMPLES`): the driver
  samples the GPU at its own rate (about 6 Hz on recent cards) and keeps the last second or so;
  asking with the timestamp of the last sample seen returns only newer ones, so nothing is lost
  between our polls and Python's scheduling jitter does not bend the series;
* polling `nvmlDeviceGetUtilizationRates` at `poll_hz` (>= 10 Hz), where the buffer is refused
  (some virtualised GPUs, old drivers).

Each tick also reads used memory, the memory controller's busy percentage and the "GPU idle"
clock-event reason (`nvmlDeviceGetCurrentClocksEventReasons`, called `...ThrottleReasons` before
driver 535), which the driver sets when it lowered clocks because no work arrived.

`summarize_utilization` turns a series into mean, p10, p90, the share of time below 30% and an
oscillation score. The score is the height of the autocorrelation's first peak after its first
zero crossing (how periodic the series is), times min(1, standard deviation / 10 points) (how big
the swing is), on the series resampled to an even grid and de-meaned. So a steady 90% or an idle
0% scores about 0, while a GPU that waits for every batch, seen by NVML as a 2-40% sawtooth,
scores near 1, and the peak's lag is the period of the swing (usually a step or a few steps).
"""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# A swing smaller than this (standard deviation, percentage points) is noise, not oscillation.
OSCILLATION_FULL_SWING = 10.0
# At or above this score the report calls the utilization oscillating.
OSCILLATING_SCORE = 0.3
LOW_UTILIZATION_PERCENT = 30.0
# How often the driver's buffer is read. It holds a second or more of samples, so 4 Hz loses none.
BUFFER_READ_HZ = 4.0


@dataclass
class GpuSeries:
    """What the sampler saw. Times are seconds on the sampler's clock (epoch seconds by default)."""

    source: str  # "driver_buffer" or "polling"
    device: str
    times_s: list[float] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)  # percent, one per sample
    memory_used_bytes: list[int] = field(default_factory=list)  # one per tick
    memory_total_bytes: int | None = None
    memory_controller: list[float] = field(default_factory=list)  # percent busy, one per tick
    idle_reason_ticks: int = 0  # ticks where the "GPU idle" clock-event reason was set
    reason_ticks: int = 0  # ticks where the reasons could be read at all
    errors: int = 0  # NVML calls that failed during the run (the first is in `first_error`)
    first_error: str | None = None


class UtilizationSampler:
    """Samples one GPU in a background thread between `start()` and `stop()`.

    `nvml` is the `pynvml` module (tests pass a fake); `clock` returns seconds since the epoch,
    the time base of the driver's sample timestamps (microseconds since the epoch).
    """

    def __init__(self, nvml: Any | None = None, nvml_index: int = 0, poll_hz: float = 20.0,
                 clock: Callable[[], float] = time.time):
        if poll_hz < 10:
            raise ValueError(f"poll_hz must be >= 10 to see step-length swings, got {poll_hz}")
        self._nvml = nvml
        self.nvml_index = nvml_index
        self.poll_hz = poll_hz
        self.clock = clock
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._series: GpuSeries | None = None
        self._handle = None
        self._last_seen_us = 0
        self._last_buffer_read = -np.inf

    def start(self) -> str | None:
        """Begin sampling; returns None, or one line saying why there is no GPU to sample."""
        try:
            nvml = self._nvml or importlib.import_module("pynvml")
        except ImportError:
            return "no GPU sampling: nvidia-ml-py (pynvml) is not installed"
        try:
            nvml.nvmlInit()
        # Any NVML failure here (no driver, a library mismatch) means "no GPU to watch", which the
        # report states in one line instead of stopping the diagnosis.
        except Exception as error:  # noqa: BLE001
            return f"no GPU sampling: NVML unavailable ({type(error).__name__}: {error})"
        self._nvml = nvml
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.nvml_index)
            name = nvml.nvmlDeviceGetName(self._handle)
            total = int(nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        except nvml.NVMLError as error:
            nvml.nvmlShutdown()
            return f"no GPU sampling: NVML has no GPU {self.nvml_index} ({error})"
        source = "driver_buffer" if self._buffer_supported() else "polling"
        self._series = GpuSeries(source=source, device=name.decode() if isinstance(name, bytes) else str(name),
                                 memory_total_bytes=total)
        self._last_seen_us = int(self.clock() * 1e6)
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return None

    def stop(self) -> GpuSeries | None:
        """Stop the thread, read the driver's buffer one last time and return the series."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._series.source == "driver_buffer":
            self._guarded(self._read_buffer)
        self._nvml.nvmlShutdown()
        return self._series

    # ----------------------------------------------------------------------------------------------

    def _buffer_supported(self) -> bool:
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetSamples"):
            return False
        try:
            nvml.nvmlDeviceGetSamples(self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, int(self.clock() * 1e6))
        except nvml.NVMLError as error:
            # NOT_FOUND only means "no sample newer than that timestamp yet": the call itself works.
            return _error_code(error) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
        return True

    def _run(self) -> None:
        period = 1.0 / self.poll_hz
        while not self._stop.is_set():
            self._guarded(self._tick)
            self._stop.wait(period)

    def _tick(self) -> None:
        nvml, series = self._nvml, self._series
        rates = nvml.nvmlDeviceGetUtilizationRates(self._handle)
        now = self.clock()
        if series.source == "polling":
            series.times_s.append(now)
            series.utilization.append(float(rates.gpu))
        elif now - self._last_buffer_read >= 1.0 / BUFFER_READ_HZ:
            self._last_buffer_read = now
            self._read_buffer()
        series.memory_controller.append(float(rates.memory))
        series.memory_used_bytes.append(int(nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
        idle = self._idle_reason()
        if idle is not None:
            series.reason_ticks += 1
            series.idle_reason_ticks += int(idle)

    def _read_buffer(self) -> None:
        nvml = self._nvml
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(
                self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_seen_us)
        except nvml.NVMLError as error:
            if _error_code(error) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
                return  # nothing new since the last read
            raise
        for sample in sorted(samples, key=lambda s: s.timeStamp):
            if sample.timeStamp <= self._last_seen_us:
                continue
            self._last_seen_us = int(sample.timeStamp)
            self._series.times_s.append(sample.timeStamp / 1e6)
            self._series.utilization.append(_sample_value(nvml, value_type, sample.sampleValue))

    def _idle_reason(self) -> bool | None:
        nvml = self._nvml
        # Renamed from "throttle" to "clocks event" reasons in driver 535; older bindings have only
        # the old names, newer ones keep them as aliases.
        for call_name, bit_name in (
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlClocksEventReasonGpuIdle"),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlClocksThrottleReasonGpuIdle"),
        ):
            call = getattr(nvml, call_name, None)
            if call is None:
                continue
            try:
                reasons = call(self._handle)
            except nvml.NVMLError:
                continue
            return bool(reasons & getattr(nvml, bit_name, 0x1))
        return None

    def _guarded(self, action: Callable[[], None]) -> None:
        # One failed NVML read must not end the sampling (a driver hiccup mid-run); failures are
        # counted and the first is kept, so the report can say the series has gaps.
        try:
            action()
        except self._nvml.NVMLError as error:
            self._series.errors += 1
            if self._series.first_error is None:
                self._series.first_error = f"{type(error).__name__}: {error}"


def _error_code(error: Exception) -> int | None:
    return getattr(error, "value", None)


def _sample_value(nvml: Any, value_type: int, value: Any) -> float:
    """Reads the member of NVML's value union that `value_type` names."""
    members = {
        getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }
    return float(getattr(value, members.get(value_type, "uiVal")))


# --------------------------------------------------------------------------------------------------
# What a series says


def even_grid(times_s, values) -> tuple[np.ndarray, float]:
    """The series held from sample to sample on an even grid at its median sample interval.

    Returns (values on the grid, grid step in seconds). Statistics on the grid are time-weighted,
    so a burst of closely spaced samples does not outvote a long quiet stretch.
    """
    times = np.asarray(times_s, dtype=float)
    values = np.asarray(values, dtype=float)
    if times.size < 2:
        return values, 0.0
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    step = float(np.median(np.diff(times)))
    if step <= 0:
        return values, 0.0
    grid = np.arange(times[0], times[-1] + step / 2, step)
    held = np.clip(np.searchsorted(times, grid, side="right") - 1, 0, times.size - 1)
    return values[held], step


def oscillation(values: np.ndarray, step_s: float) -> tuple[float, float | None]:
    """(score in [0, 1], period in seconds or None) of an evenly sampled series; see the module doc."""
    values = np.asarray(values, dtype=float)
    if values.size < 8 or step_s <= 0:
        return 0.0, None
    centred = values - values.mean()
    spread = float(centred.std())
    if spread < 1e-9:
        return 0.0, None
    # Autocorrelation through the FFT, zero-padded to twice the length so it is linear, not circular.
    spectrum = np.fft.rfft(centred, 2 * values.size)
    correlation = np.fft.irfft(spectrum * np.conj(spectrum))[: values.size]
    correlation = correlation / correlation[0]
    usable = correlation[: values.size // 2 + 1]  # a period must repeat at least twice to count
    below = np.flatnonzero(usable < 0)
    if below.size == 0:
        return 0.0, None
    after = usable[below[0]:]
    lag = int(below[0] + np.argmax(after))
    peak = float(usable[lag])
    if peak <= 0:
        return 0.0, None
    score = peak * min(1.0, spread / OSCILLATION_FULL_SWING)
    return round(score, 4), lag * step_s


def summarize_utilization(times_s, values) -> dict | None:
    """Mean, p10, p90, share of time below 30%, oscillation score and period of a series."""
    if len(values) == 0:
        return None
    grid, step = even_grid(times_s, values)
    score, period = oscillation(grid, step)
    return {
        "mean": float(np.mean(grid)),
        "p10": float(np.percentile(grid, 10)),
        "p90": float(np.percentile(grid, 90)),
        "below_30_share": float(np.mean(grid < LOW_UTILIZATION_PERCENT)),
        "oscillation_score": score,
        # A noise series has an autocorrelation peak too; its lag is meaningless, so no period.
        "oscillation_period_s": period if score >= OSCILLATING_SCORE else None,
    }
