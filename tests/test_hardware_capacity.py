"""The capacity plan's arithmetic and route choice on made-up calibrations, the spec-sheet table, the
record cache, and `python -m myxtts.hardware --capacity-gpu`."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from myxtts.hardware.capacity import DEFAULT_MFU, LOOP_ITERATION_S, STEP_OVERHEAD_S, choose_route, gpu_demand, gpu_facts_for, plan_capacity
from myxtts.hardware.capacity_record import CapacityCache, CapacityRecord, ModelCost, RouteRate
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.devices import DEVICES, DeviceSpec, device_by_key, device_for_gpu_name
from myxtts.hardware.host import cpu_model_name
from myxtts.hardware.loop_cost import FALLBACK, LoopCost
from myxtts.hardware.plan import plan_for_machine

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "tests" / "data" / "device_profiles"


def record(on_the_fly=500.0, cached=10_000.0, mel_on_device=700.0, flops=5e9, intensity=300.0, loops=400.0,
           cpu="Test CPU", created="2026-11-23T00:00:00+00:00") -> CapacityRecord:
    rates = {"on_the_fly": on_the_fly, "cached_features": cached, "mel_on_device": mel_on_device}
    return CapacityRecord(
        key=f"key-{cpu}-{created}".replace(" ", "_").replace(":", ""), created_utc=created, cpu_model=cpu,
        usable_cores=2, load_average=(1.0, 1.0), corpus="/data/corpus", clips=100, audio_seconds=600.0,
        tokens_per_audio_s=15.0, padding=1.1, batch_size=0, loop_iterations_per_audio_s=loops,
        settings={"decoder_window": 0},
        routes={name: RouteRate(name, rate, rate * 0.8, 1.6, 2, 3, 3.0) for name, rate in rates.items()},
        models={"base": ModelCost(flops, flops / 3, 0.01 * flops, intensity)},
    )


def test_every_profiled_gpu_is_in_the_table_or_said_to_be_missing():
    names = {json.loads(path.read_text())["gpus"][0]["name"]
             for path in PROFILES.glob("*.json") if json.loads(path.read_text())["gpus"]}
    missing = {name for name in names if device_for_gpu_name(name) is None}
    assert missing == {"NVIDIA GeForce RTX 3060", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"}
    assert device_for_gpu_name("NVIDIA A100-SXM4-80GB").key == "A100-80GB"
    assert device_for_gpu_name("NVIDIA A10").key == "A10"  # not taken for an A100, nor an A100 for it
    assert device_for_gpu_name("NVIDIA GeForce RTX 2080 Ti") is None  # another card than the RTX 2080
    assert device_by_key("h100") is device_by_key("NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="known: H100"):
        device_by_key("H1000")


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.key)
def test_the_plans_precision_gets_the_cards_tensor_cores(device):
    plan = plan_for_machine(MachineFacts(gpus=(gpu_facts_for(device),), usable_cpu_cores=8), "base")
    peak, path = device.peak_flops(plan.precision, plan.tf32)
    assert path == ("bf16 tensor cores" if device.compute_capability >= (8, 0) else "fp16 tensor cores")
    assert peak > 1.9 * device.fp32_flops  # dense tensor-core rates: ~2x (GeForce) to 15x the CUDA cores
    assert device.peak_flops("float32", tf32=True)[1] == ("TF32 tensor cores" if device.tf32_flops else
                                                          "fp32 (no tensor cores)")


def test_demand_is_arithmetic_time_plus_loop_time_plus_fixed_cost_per_audio_second():
    h100 = device_by_key("H100")
    demand = gpu_demand(record(), "base", h100, "mixed_bfloat16", True, batch=16)
    compute = 5e9 / (989.4e12 * DEFAULT_MFU)
    loops = 400.0 / 16 * LOOP_ITERATION_S
    fixed = STEP_OVERHEAD_S / (16 * 600.0 / 100)  # a batch holds 16 clips of 6 s on average
    assert demand.audio_s_per_s == pytest.approx(1 / (compute + loops + fixed))
    assert demand.compute_bound_audio_s_per_s == pytest.approx(1 / compute)
    # A larger batch runs the loops once for more clips.
    assert gpu_demand(record(), "base", h100, "mixed_bfloat16", True, batch=32).audio_s_per_s > demand.audio_s_per_s
    # Below the ridge point the bandwidth, not the assumed MFU, sets the utilization.
    starved = dataclasses.replace(h100, memory_bandwidth=h100.bf16_flops / 1000)  # ridge 1000 FLOP/byte
    capped = gpu_demand(record(intensity=100.0), "base", starved, "mixed_bfloat16", True, batch=16)
    assert capped.utilization == pytest.approx(0.1) and capped.roofline_cap == pytest.approx(0.1)
    with pytest.raises(ValueError, match="--mfu"):
        gpu_demand(record(), "base", h100, "mixed_bfloat16", True, batch=16, mfu=0.0)


def _slow_gpu(flops_per_s: float) -> DeviceSpec:
    return DeviceSpec("SLOW", "Slow GPU", (8, 0), 16 * 2**30, flops_per_s, flops_per_s, flops_per_s, flops_per_s,
                      1e15, "test device")


def test_route_choice_takes_the_simplest_route_that_feeds():
    calibration = record(loops=0.0)

    def choice(audio_s_per_s, cores=1):
        demand = gpu_demand(calibration, "base", _slow_gpu(audio_s_per_s * 5e9 / 0.4), "mixed_bfloat16", True, 16,
                            step_overhead_s=0.0)
        assert demand.audio_s_per_s == pytest.approx(audio_s_per_s)
        return choose_route(calibration, demand, demand, cores)

    assert choice(400).route == "on_the_fly"
    assert choice(400).advice == "every route keeps it fed; on the fly is enough"
    high = choice(2_000)
    assert (high.route, high.feeds) == ("cached_features", True) and "first epoch" in high.advice
    assert [s.cores_needed for s in high.supplies] == [4, 1, 3]
    assert choice(2_000, cores=4).route == "on_the_fly"  # four cores of 500 each
    hopeless = choice(50_000)
    assert (hopeless.route, hopeless.feeds) == ("cached_features", False)
    assert "no route keeps it fed" in hopeless.advice and "needs 5 input cores" in hopeless.advice


def test_plan_capacity_uses_the_hardware_plan_for_the_card_and_prints_every_source():
    facts = MachineFacts(usable_cpu_cores=16, ram_bytes=64 * 2**30)
    plan = plan_capacity(record(), device_by_key("H100"), facts, "base")
    assert (plan.demand.precision, plan.demand.batch, plan.input_cores) == ("mixed_bfloat16", 16, 15)
    text = "\n".join(plan.lines())
    for expected in ("from spec sheets: NVIDIA H100 Tensor Core GPU datasheet", "40% MFU  [assumed:",
                     "measured on an H100 under XLA", "models/flops.py on 100 clips of /data/corpus", "Host: Test CPU, measured",
                     "per core = audio-seconds per CPU-second used", "with 15 input cores"):
        assert expected in text, expected
    assert "measured" not in next(line for line in text.splitlines() if "GPU peak" in line)  # spec sheets, not measured
    assert plan.summary().startswith("base model on H100 (bf16) at 40% MFU eats ~")
    assert json.loads(json.dumps(plan.to_dict()))["route"] == plan.choice.route


def test_cache_round_trip_and_latest_record_of_this_cpu(tmp_path, caplog):
    cache = CapacityCache(tmp_path)
    old, new = record(created="2026-11-01T00:00:00+00:00"), record(created="2026-11-20T00:00:00+00:00")
    for item in (new, old, record(cpu="Other CPU", created="2026-11-30T00:00:00+00:00")):
        cache.store(item)
    assert cache.load(old.key) == old
    assert cache.latest_for_cpu("Test CPU") == new
    (tmp_path / "broken.json").write_text("{")
    assert cache.latest_for_cpu("Test CPU") == new and "unreadable" in caplog.text
    assert cache.load("absent") is None


def test_hardware_module_prints_the_capacity_plan_for_a_card_it_does_not_have(tmp_path):
    calibration = record(cpu=cpu_model_name())
    CapacityCache(tmp_path / "cache" / "capacity").store(calibration)
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    env.update(PYTHONPATH=str(REPO), MYXTTS_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-m", "myxtts.hardware", "--capacity-gpu", "T4", "--mfu", "0.3"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Capacity plan: base model on Tesla T4 (T4), batch 6" in result.stdout
    assert "fp16 tensor cores 65.0 TFLOP/s dense" in result.stdout
    summary = next(line for line in result.stdout.splitlines() if line.startswith("  -> "))
    expected = 1 / (5e9 / (65e12 * 0.3) + 400.0 / 6 * LOOP_ITERATION_S + STEP_OVERHEAD_S / (6 * 6.0))
    assert f"eats ~{expected:,.0f} audio-s/s" in summary and math.isfinite(expected)


def test_hardware_module_plans_the_hosts_card_with_the_loop_cost_a_run_measured_on_it(tmp_path, monkeypatch):
    from myxtts.hardware import __main__ as module
    from myxtts.hardware.loop_cost import GPU_FRAMES_PER_ITERATION, key_for, loop_cost_cache

    monkeypatch.setenv("MYXTTS_CACHE_DIR", str(tmp_path))
    cache = CapacityCache(tmp_path / "capacity")
    cache.store(record(cpu=cpu_model_name()))
    h100 = gpu_facts_for(device_by_key("H100"))
    facts = MachineFacts(gpus=(h100,), usable_cpu_cores=16)
    loop_cost_cache().store(key_for(h100.name, GPU_FRAMES_PER_ITERATION, True), LoopCost(12.5e-6, "measured here (test)"))
    args = module.parse_args(["--capacity-gpu", "H100"])
    lines, _ = module.capacity_section(facts, [h100.name], args, cache=cache)
    assert any("12.5 us each  [measured here (test)]" in line for line in lines), lines
    # A card this host does not have: the H100's figure.
    lines, _ = module.capacity_section(facts, [h100.name], module.parse_args(["--capacity-gpu", "T4"]), cache=cache)
    assert any("8.3 us each  [measured on an H100 under XLA" in line for line in lines), lines


def test_training_takes_the_capacity_plans_route_on_a_known_gpu():
    from myxtts.config import load_config
    from myxtts.training.run_setup import apply_input_route

    h100 = MachineFacts(gpus=(gpu_facts_for(device_by_key("H100")),), usable_cpu_cores=16, ram_bytes=64 * 2**30)
    cpu_only = MachineFacts(usable_cpu_cores=16, ram_bytes=64 * 2**30)
    config = load_config(overrides=["model.size=base", "data.batch_size=16"])  # enhanced: the level caches features
    calibrated = []

    def host(**rates):
        def calibrate(config, progress):
            calibrated.append(config.data.train_data)
            return record(**rates)
        return calibrate

    def route(config, facts, calibrate=None):
        data = apply_input_route(config, facts, echo=lambda line: None, calibrate=calibrate,
                                 loop_cost=lambda config, progress: FALLBACK).data
        return data.cache_features, data.mel_on_device

    # The simplest route whose supply meets the H100's demand (~13,800 audio-s/s for these made-up costs).
    assert route(config, h100, host(on_the_fly=1e6, cached=1e7, mel_on_device=1e6)) == (False, False)
    assert route(config, h100, host(on_the_fly=10.0, cached=1e7, mel_on_device=20.0)) == (True, False)
    assert route(config, h100, host(on_the_fly=10.0, cached=20.0, mel_on_device=1e7)) == (False, True)
    assert len(calibrated) == 3
    # Eight of them from one input pipeline eat eight times as much: what feeds one H100 on the fly
    # (1,000 audio-s/s per core x 15 input cores, against ~13,800 for one) no longer feeds eight.
    eight = dataclasses.replace(h100, gpus=h100.gpus * 8)
    lines = []
    assert route(config, h100, host(on_the_fly=1000.0, cached=1e7, mel_on_device=1000.0)) == (False, False)
    assert apply_input_route(config, eight, echo=lines.append,
                             calibrate=host(on_the_fly=1000.0, cached=1e7, mel_on_device=1000.0),
                             loop_cost=lambda config, progress: FALLBACK).data.cache_features
    assert any("for 8 GPUs" in line and "for the 8 of them" in line for line in lines), lines
    assert not any("graph mode" in line for line in lines)  # an XLA step's appetite, said as such
    lines.clear()
    apply_input_route(config, h100, echo=lines.append, calibrate=host(on_the_fly=1000.0, cached=1e7, mel_on_device=1000.0),
                      loop_cost=lambda config, progress: FALLBACK, graph_mode=True)
    assert any(line.startswith("input route:") and "this run steps in graph mode" in line for line in lines), lines
    del calibrated[3:]
    del calibrated[3:]
    # A calibration that fails (its sample fills no batch, say) leaves the keys to the run, which says why.
    def failing(config, progress):
        raise ValueError("the 3 training clips do not fill one batch of 16")
    lines.clear()
    assert apply_input_route(config, h100, echo=lines.append, calibrate=failing,
                             loop_cost=lambda config, progress: FALLBACK).data.cache_features
    assert any("calibration failed" in line and "fill one batch" in line for line in lines), lines
    # No GPU, or input from a tf.data service: the keys stand and nothing is calibrated.
    assert route(config, cpu_only, host(on_the_fly=10.0)) == (True, False)
    served = load_config(overrides=["model.size=base", "data.service_address=grpc://localhost:5050"])
    assert route(served, h100, host(on_the_fly=10.0)) == (False, False)
    assert len(calibrated) == 3
    # A named route is taken anywhere; `keys` keeps the keys even on a known GPU.
    named = load_config(overrides=["model.size=base", "hardware.input_route=mel_on_device"])
    assert route(named, cpu_only) == (False, True)
    keys = load_config(overrides=["model.size=base", "hardware.input_route=keys", "data.cache_features=false"])
    assert route(keys, h100, host(on_the_fly=10.0)) == (False, False)
    assert len(calibrated) == 3


def test_the_input_route_plans_with_the_loop_cost_measured_on_this_gpu():
    from myxtts.config import load_config
    from myxtts.training.run_setup import apply_input_route

    h100 = MachineFacts(gpus=(gpu_facts_for(device_by_key("H100")),), usable_cpu_cores=16, ram_bytes=64 * 2**30)
    config = load_config(overrides=["model.size=base", "data.batch_size=16"])
    slow = LoopCost(FALLBACK.seconds_per_frame * 10, "measured on NVIDIA H100 80GB HBM3 at the start of a run (test)")
    # A host whose on-the-fly supply lies between what the H100 eats with the fallback's loops and
    # with loops ten times slower: the measured cost decides the route.
    demands = [plan_capacity(record(), device_by_key("H100"), h100, "base", batch_size=16,
                             loop_iteration_s=cost.seconds_per_frame).demand.audio_s_per_s for cost in (FALLBACK, slow)]
    cores = plan_for_machine(h100, "base").private_threadpool_size
    per_core = math.sqrt(demands[0] * demands[1]) / cores

    def route(loop_cost):
        lines = []
        data = apply_input_route(config, h100, echo=lines.append, loop_cost=loop_cost,
                                 calibrate=lambda config, progress: record(on_the_fly=per_core, cached=1e7)).data
        return (data.cache_features, data.mel_on_device), lines

    assert route(lambda config, progress: FALLBACK)[0] == (True, False)  # on the fly is too slow: cached features
    assert route(lambda config, progress: slow)[0] == (False, False)  # slower loops eat less: on the fly feeds them

    def failing(config, progress):
        raise RuntimeError("XLA compilation failed: out of memory")
    taken, lines = route(failing)
    assert taken == (True, False)  # the H100's figure stands in
    assert any("timing them failed (XLA compilation failed" in line and "8.3 us per loop frame" in line
               for line in lines), lines


def test_the_batch_probe_measures_the_step_of_the_chosen_route(monkeypatch, demo_corpus):
    # mel_on_device puts waveforms and the STFT in the step: the GPU batch must be probed with them.
    from myxtts.config import load_config
    from myxtts.diagnostics import alignment_timing, capacity
    from myxtts.hardware import gpu_memory
    from myxtts.training import run_setup

    class Probed(Exception):
        pass

    def probe_batch_size(config, plan, facts, **kwargs):
        raise Probed(config.data.mel_on_device)

    h100 = MachineFacts(gpus=(gpu_facts_for(device_by_key("H100")),), usable_cpu_cores=16, ram_bytes=64 * 2**30)
    monkeypatch.setattr(gpu_memory, "allow_memory_growth", lambda echo: None)
    monkeypatch.setattr(run_setup, "detect_machine", lambda: h100)
    monkeypatch.setattr(capacity, "host_calibration",
                        lambda config, progress: record(on_the_fly=10.0, cached=20.0, mel_on_device=1e7))
    monkeypatch.setattr(run_setup, "probe_batch_size", probe_batch_size)
    monkeypatch.setattr(alignment_timing, "startup_loop_cost", lambda device, loops, progress: FALLBACK)
    config = load_config(overrides=[f"data.train_data={demo_corpus}", "model.size=base"])
    assert not config.data.mel_on_device
    with pytest.raises(Probed) as probed:
        run_setup.resolve_plan(config, echo=lambda line: None)
    assert probed.value.args == (True,)
