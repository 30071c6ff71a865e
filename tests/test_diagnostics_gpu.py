"""The NVML sampler thread and the utilization statistics, on synthesized series (tests/data/gpu_samples,
made by generate.py, never recorded on a GPU) served by a fake pynvml."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from myxtts.diagnostics.bottleneck import gpu_section
from myxtts.diagnostics.gpu_sampler import UtilizationSampler, oscillation, even_grid, summarize_utilization
from myxtts.diagnostics.verdict import decide

SAMPLES = Path(__file__).parent / "data" / "gpu_samples"


def recording(name):
    record = json.loads((SAMPLES / f"{name}.json").read_text())
    assert record["value_type"] == 1
    return [(int(t), int(v)) for t, v in record["samples"]]


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class FakeNvml:
    """Replays a synthesized series the way the driver serves it, on the sampler's clock.

    `nvmlDeviceGetSamples` returns the samples newer than the timestamp asked for and not in the
    future (NOT_FOUND when there are none), so the sampler has to track what it has seen. The
    recording is moved in time so that it starts 0.2 s after the first question.
    """

    NVMLError = FakeNVMLError
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksThrottleReasonGpuIdle = 0x1

    def __init__(self, samples, clock, buffered=True):
        self.samples, self.clock, self.buffered = samples, clock, buffered
        self.offset_us = None
        self.sample_calls = 0
        self.shutdowns = 0

    def _rebase(self, now_us):
        if self.offset_us is None:
            self.offset_us = now_us + 200_000 - self.samples[0][0]

    def _value_now(self):
        now_us = int(self.clock() * 1e6)
        self._rebase(now_us)
        past = [v for t, v in self.samples if t + self.offset_us <= now_us]
        return past[-1] if past else self.samples[0][1]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetName(self, handle):
        return b"Fake H100"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 * 2**30, used=12 * 2**30, free=68 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        value = self._value_now()
        return SimpleNamespace(gpu=value, memory=value // 3)

    def nvmlDeviceGetSamples(self, handle, kind, last_seen_us):
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        self.sample_calls += 1
        if not self.buffered:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        now_us = int(self.clock() * 1e6)
        self._rebase(last_seen_us)
        fresh = [(t + self.offset_us, v) for t, v in self.samples if last_seen_us < t + self.offset_us <= now_us]
        if not fresh:
            raise FakeNVMLError(self.NVML_ERROR_NOT_FOUND)
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in fresh]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.nvmlClocksEventReasonGpuIdle if self._value_now() == 0 else 0


class OldDriverNvml(FakeNvml):
    """Bindings from before driver 535 know only the 'throttle reasons' name."""

    nvmlDeviceGetCurrentClocksEventReasons = None

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.nvmlClocksThrottleReasonGpuIdle if self._value_now() == 0 else 0


def warped_clock(speed):
    """Epoch seconds running `speed` times faster than real time, so 20 s replay in a fraction."""
    real_start, mono_start = time.time(), time.monotonic()
    return lambda: real_start + (time.monotonic() - mono_start) * speed


def replay(name, fake_class=FakeNvml, speed=50.0):
    samples = recording(name)
    clock = warped_clock(speed)
    fake = fake_class(samples, clock)
    sampler = UtilizationSampler(nvml=fake, poll_hz=50, clock=clock)
    assert sampler.start() is None
    duration_s = (samples[-1][0] - samples[0][0]) / 1e6 + 0.5
    time.sleep(duration_s / speed + 0.05)
    series = sampler.stop()
    assert fake.shutdowns == 1
    return samples, series


@pytest.mark.parametrize("name", ["steady_90", "sawtooth_2_40", "idle"])
def test_sampler_reads_every_buffered_sample_once_in_order(name):
    samples, series = replay(name)
    assert series.source == "driver_buffer"
    assert series.device == "Fake H100"
    assert series.utilization == [float(v) for _, v in samples]
    assert np.all(np.diff(series.times_s) > 0)
    assert series.errors == 0
    assert max(series.memory_used_bytes) == 12 * 2**30


def test_synthesized_series_statistics():
    steady = gpu_section(replay("steady_90")[1], None, 0.0)
    assert steady["utilization"]["mean"] == pytest.approx(90, abs=1)
    assert steady["utilization"]["below_30_share"] == 0
    assert steady["oscillation"]["score"] < 0.1
    assert steady["oscillation"]["period_s"] is None
    assert steady["idle_reason_share"] == 0

    sawtooth = gpu_section(replay("sawtooth_2_40")[1], None, 0.0)
    assert sawtooth["oscillation"]["score"] > 0.6
    assert sawtooth["oscillation"]["period_s"] == pytest.approx(1.5, rel=0.05)
    assert 2 <= sawtooth["utilization"]["p10"] < 10 and 30 < sawtooth["utilization"]["p90"] <= 41
    assert sawtooth["utilization"]["below_30_share"] == pytest.approx(28 / 38, abs=0.08)

    idle = gpu_section(replay("idle")[1], None, 0.0)
    assert idle["utilization"]["mean"] == 0
    assert idle["utilization"]["below_30_share"] == 1
    assert idle["oscillation"]["score"] == 0
    assert idle["idle_reason_share"] == 1


def test_old_bindings_fall_back_to_throttle_reasons():
    _, series = replay("idle", OldDriverNvml)
    assert series.reason_ticks > 0 and series.idle_reason_ticks == series.reason_ticks


def test_polling_when_the_driver_refuses_its_buffer():
    samples = recording("steady_90")
    fake = FakeNvml(samples, time.time, buffered=False)
    sampler = UtilizationSampler(nvml=fake, poll_hz=40)
    assert sampler.start() is None
    time.sleep(0.6)
    series = sampler.stop()
    assert series.source == "polling"
    assert len(series.utilization) >= 6
    assert np.median(np.diff(series.times_s)) <= 0.1  # at least 10 Hz
    assert np.mean(series.utilization) == pytest.approx(90, abs=3)


def test_poll_rate_below_10_hz_is_refused():
    with pytest.raises(ValueError, match="poll_hz"):
        UtilizationSampler(nvml=FakeNvml(recording("idle"), time.time), poll_hz=5)


def test_missing_nvml_is_one_line():
    class Broken:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    note = UtilizationSampler(nvml=Broken()).start()
    assert note.startswith("no GPU sampling: NVML unavailable") and "Shared Library" in note
    assert "\n" not in note
    pytest.importorskip("pynvml")
    real = UtilizationSampler().start()  # this machine has no NVIDIA driver
    if real is None:
        pytest.skip("this machine has a GPU")
    assert real.startswith("no GPU sampling") and "\n" not in real


def test_oscillation_score_on_synthetic_shapes():
    t = np.arange(0, 30, 0.1)
    assert oscillation(np.full(t.size, 90.0), 0.1) == (0.0, None)
    score, period = oscillation(2 + 38 * ((t % 2.0) / 2.0), 0.1)
    assert score > 0.8 and period == pytest.approx(2.0, abs=0.1)
    # The same shape with a swing of one point is noise-sized: the score scales with the swing.
    small, _ = oscillation(89.5 + ((t % 2.0) / 2.0), 0.1)
    assert small < 0.05
    noise = np.random.default_rng(0).uniform(0, 100, t.size)
    assert oscillation(noise, 0.1)[0] < 0.3


def test_even_grid_weights_time_not_samples():
    # 10 samples of 100% in the first 0.1 s, then one 0% sample held for 1 s: mostly idle.
    times = list(np.linspace(0, 0.09, 10)) + [0.1, 1.1]
    values = [100] * 10 + [0, 0]
    grid, step = even_grid(times, values)
    summary = summarize_utilization(times, values)
    assert step == pytest.approx(0.01)
    assert summary["mean"] < 15
    assert grid.size == pytest.approx(111, abs=1)


def test_sawtooth_with_moderate_input_wait_is_input_bound():
    gpu = gpu_section(replay("sawtooth_2_40")[1], None, 0.0)
    training = {"input_share": 0.08, "input_classification": "moderately",
                "host_other": {"share": 0.01}, "compiled_step": {"share": 0.91}}
    assert decide(training, gpu).kind == "input-bound"
    steady = gpu_section(replay("steady_90")[1], None, 0.0)
    assert decide(training, steady).kind == "compute-bound"
