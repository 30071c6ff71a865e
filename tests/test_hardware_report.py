"""Tests for myxtts.hardware.report and `python -m myxtts.hardware`, including runs without TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from myxtts.config import load_config
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import plan_for_machine
from myxtts.hardware.report import build_report, format_report, short_summary
from myxtts.hardware.select import GpuSelection

REPO = Path(__file__).resolve().parents[1]
PROFILES = Path(__file__).parent / "data" / "device_profiles"

# Stand-ins put first on PYTHONPATH: a `tensorflow` whose import fails (as on the GPU machine, which has
# no TensorFlow) and a `pynvml` with two H100s (as that machine's NVML would report them).
BLOCKED_TENSORFLOW = "raise ImportError('TensorFlow is not installed here (test stand-in)')\n"
FAKE_PYNVML = textwrap.dedent("""
    from types import SimpleNamespace

    class NVMLError(Exception):
        pass

    def nvmlInit(): pass
    def nvmlShutdown(): pass
    def nvmlSystemGetDriverVersion(): return "570.124.06"
    def nvmlSystemGetCudaDriverVersion(): return 12080
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetName(h): return "NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=81559 * 2**20, free=81000 * 2**20)
    def nvmlDeviceGetCudaComputeCapability(h): return (9, 0)
    def nvmlDeviceGetMigMode(h): return [0, 0]
    def nvmlDeviceGetUUID(h): return f"GPU-{h}"
    def nvmlDeviceGetComputeRunningProcesses(h): return []
    def nvmlDeviceGetGraphicsRunningProcesses(h): return []
""")


def load(name: str) -> MachineFacts:
    return MachineFacts.from_json_file(PROFILES / f"{name}.json")


def run_module(tmp_path: Path, *args: str, fake_nvml: bool) -> subprocess.CompletedProcess:
    stubs = tmp_path / "stubs"
    (stubs / "tensorflow").mkdir(parents=True, exist_ok=True)
    (stubs / "tensorflow" / "__init__.py").write_text(BLOCKED_TENSORFLOW)
    if fake_nvml:
        (stubs / "pynvml.py").write_text(FAKE_PYNVML)
    # The cache under XDG_CACHE_HOME: without the suite's MYXTTS_CACHE_DIR (conftest.py), which would win.
    env = {key: value for key, value in os.environ.items() if key not in ("CUDA_VISIBLE_DEVICES", "MYXTTS_CACHE_DIR")}
    env.update(PYTHONPATH=f"{stubs}{os.pathsep}{REPO}", HOME=str(tmp_path / "home"),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "myxtts.hardware", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_json_report_without_tensorflow(tmp_path):
    # Timings training cached on this CPU are listed (the report has no run config to pick one by);
    # another CPU's are not.
    from myxtts.hardware.cpu_precision import PrecisionTiming, precision_cache, precision_key
    from myxtts.hardware.detect import detect_machine

    facts = detect_machine(nvml_module=None)
    cache = precision_cache(tmp_path / "cache" / "myxtts" / "precision")  # under XDG_CACHE_HOME, as run_module sets
    config, plan = load_config(overrides=["model.size=small"]), plan_for_machine(facts, "small")
    timing = PrecisionTiming(float32_s=(1.04,), bfloat16_s=(0.93,), load_average=0.7)
    cache.store(precision_key(config, plan, facts), timing)
    cache.store(precision_key(config, plan, dataclasses.replace(facts, cpu_model="another CPU")), timing)

    result = run_module(tmp_path, "--json", fake_nvml=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["machine"]["tensorflow_gpus"] is None
    assert report["plan"]["effective_batch_size"] >= 32
    assert set(report) == {"machine", "plan", "selection", "precision_timings", "capacity"}
    assert report["capacity"] == {"note": "no GPU"}  # nothing to plan for, and no --capacity-gpu
    assert report["plan"]["probe_precision"] is True
    expected = (f"small at batch {plan.batch_size} (load 0.7 on {facts.usable_cpu_cores} cores): bf16 0.93 s/step "
                "vs fp32 1.04 s/step (median of 1): bf16 is 11% faster (>= 10%)")
    assert [line.split(" (/")[0] for line in report["precision_timings"]] == [expected]
    text = run_module(tmp_path, fake_nvml=False).stdout
    assert "precision probe: training times float32 against bf16" in text
    assert f"    cached: {expected}" in text and text.count("cached: ") == 1


def test_json_report_with_nvml_and_no_tensorflow(tmp_path):
    # The GPU machine's situation: NVML present, TensorFlow absent, even when TensorFlow is asked for.
    result = run_module(tmp_path, "--json", "--tensorflow", "--model-size", "small", fake_nvml=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [g["architecture"] for g in report["machine"]["gpus"]] == ["Hopper", "Hopper"]
    plan = report["plan"]
    assert (plan["precision"], plan["num_replicas"], plan["batch_size"], plan["gradient_accumulation_steps"]) == (
        "mixed_bfloat16", 2, 16, 1)  # small would take 32 per GPU; capped so 2 x 16 meets the target
    assert report["selection"]["source"] == "default"
    assert any("TensorFlow not importable" in n for n in report["machine"]["notes"])
    assert report["capacity"] == {"note": "no host calibration"}  # the cache under tmp_path is empty


def test_text_report_and_gpu_flag(tmp_path):
    result = run_module(tmp_path, "--gpu", "1", fake_nvml=True)
    assert result.returncode == 0, result.stderr
    assert "GPU 1: NVIDIA H100 80GB HBM3, Hopper (CC 9.0)" in result.stdout
    assert "batch 16 per replica x accumulation 2 x 1 replica(s) = effective batch 32" in result.stdout
    bad = run_module(tmp_path, "--gpu", "5", fake_nvml=True)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_format_report_lists_everything():
    facts = load("rtx_pro_6000_blackwell")
    plan = plan_for_machine(facts, "base")
    text = format_report(facts, plan, GpuSelection((0,), "only GPU"))
    for expected in ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "Blackwell (CC 12.0)", "95.6 GiB total",
                     "mixed_bfloat16", "TF32 on", "XLA on", "32 usable of 32 logical cores", "platform: linux",
                     "batch 16 per replica x accumulation 2", "Recommendations:", "sm_120"):
        assert expected in text, expected
    cpu_text = format_report(load("cpu_only"), plan_for_machine(load("cpu_only")))
    assert "none (CPU only)" in cpu_text and "Detection notes:" in cpu_text


def test_short_summary_is_two_lines():
    facts = load("t4")
    summary = short_summary(plan_for_machine(facts, "base"), facts)
    first, second = summary.splitlines()
    assert first == "GPU 0:Tesla T4 | mixed_float16 + loss scaling, TF32 off, XLA on"
    assert second.startswith("batch 6 x accum 6 x 1 = 36 | input 6 workers")  # two calls on each of 3 input cores
    assert short_summary(plan_for_machine(load("cpu_only"))).startswith("CPU | float32")


def test_build_report_is_json_serializable():
    facts = load("h100_80gb")
    report = build_report(facts, plan_for_machine(facts))
    assert json.loads(json.dumps(report))["plan"]["batch_size"] == 16
