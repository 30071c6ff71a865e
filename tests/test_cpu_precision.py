"""The CPU precision probe: the decision from the child's step times, the cache and its key
(myxtts.hardware.cpu_precision), and the real child timing both policies (myxtts.training.precision_probe).

The decision is tested with a fake child: a module written to tmp_path and named as the child, which
prints the JSON line the test gives it and logs each start, so every test sees real processes, real
JSON and the real cache without timing a model. One test runs the real child on the tiny model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from myxtts.config import load_config
from myxtts.hardware.cpu_precision import (MIN_BF16_GAIN, PrecisionTiming, cached_timings, precision_cache,
                                           precision_key, probe_cpu_precision)
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import RequestedSettings, plan_for_machine

ROOT = Path(__file__).resolve().parents[1]
EPYC = dataclasses.replace(MachineFacts.from_json_file(ROOT / "tests" / "data" / "device_profiles" / "cpu_only.json"),
                           cpu_model="AMD EPYC 9B14", cpu_bf16_flags=("avx512_bf16",))
XEON = dataclasses.replace(EPYC, cpu_model="Intel(R) Xeon(R) CPU @ 2.50GHz", cpu_bf16_flags=())

FAKE_CHILD = """
import json, os, sys
import yaml

config = yaml.safe_load(open(sys.argv[sys.argv.index("--config") + 1]))
with open(os.environ["FAKE_CHILD_LOG"], "a") as log:
    log.write(json.dumps({"batch_size": config["data"]["batch_size"],
                          "accumulation": config["training"]["gradient_accumulation_steps"]}) + "\\n")
answer = os.environ["FAKE_CHILD_ANSWER"]
if answer == "crash":
    sys.exit("RuntimeError: the fake child crashed")
print("some TensorFlow chatter on stdout")
print(answer)
"""


def _line(fp32, bf16, errors=None):
    seconds = {"float32": fp32, **({"mixed_bfloat16": bf16} if bf16 else {})}
    return json.dumps({"steps": len(fp32), "seconds": seconds, "errors": errors or {}, "bucket_frames": 520})


@pytest.fixture
def child(tmp_path, monkeypatch):
    """probe(facts, answer) runs probe_cpu_precision with the fake child answering `answer`;
    `starts()` lists the configs the child was started with. The machine's load reads 0.4."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.5, 0.5))
    (tmp_path / "fake_precision_child.py").write_text(FAKE_CHILD)
    log = tmp_path / "child.log"
    cache = precision_cache(tmp_path / "cache")
    config = load_config(overrides=["model.size=small", "data.batch_size=0", "training.effective_batch_size=16",
                                    "training.enable_xla_compilation=false"])

    class Child:
        def __init__(self):
            self.messages: list[str] = []

        def probe(self, facts, answer, plan=None):
            environ = dict(os.environ, PYTHONPATH=str(tmp_path), FAKE_CHILD_LOG=str(log), FAKE_CHILD_ANSWER=answer)
            environ.pop("TF_CONFIG", None)
            plan = plan or plan_for_machine(facts, "small", RequestedSettings(batch_size=16, effective_batch_size=16,
                                                                              xla=False))
            return probe_cpu_precision(config, plan, facts, child_module="fake_precision_child", cache=cache,
                                       environ=environ, echo=self.messages.append)

        @staticmethod
        def starts():
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    Child.cache, Child.config = cache, config
    return Child()


def test_bf16_is_chosen_when_it_is_at_least_ten_percent_faster(child, monkeypatch):
    plan = child.probe(EPYC, _line([1.04, 1.10, 1.02, 1.04, 1.30], [0.93, 0.90, 0.95, 0.93, 1.20]))
    assert plan.precision == "mixed_bfloat16" and not plan.probe_precision and not plan.loss_scaling
    path = child.cache.path_for(precision_key(child.config, plan, EPYC))
    assert plan.sources["precision"] == (
        f"auto: measured on AMD EPYC 9B14 (load 0.4 on 2 cores): bf16 0.93 s/step vs fp32 1.04 s/step (median of 5): "
        f"bf16 is 11% faster (>= 10%) (cached in {path})")
    assert child.starts() == [{"batch_size": 16, "accumulation": 1}]  # the plan's batch is what is timed
    assert json.loads(path.read_text())["key"]["cpu_model"] == "AMD EPYC 9B14"

    # The same setup again: the cache answers, no child starts (this one would crash).
    again = child.probe(EPYC, "crash")
    assert (again.precision, again.sources["precision"]) == (plan.precision, plan.sources["precision"])
    assert len(child.starts()) == 1
    assert child.messages[-1] == "precision: mixed_bfloat16, " + plan.sources["precision"].removeprefix("auto: ")

    assert not any("busy" in message for message in child.messages)

    # Another CPU model is another entry: timed afresh, where bf16 is slower; on a busy machine, which
    # the choice says, with how to time again.
    monkeypatch.setattr(os, "getloadavg", lambda: (3.2, 3.0, 3.0))
    xeon = child.probe(XEON, _line([1.0, 1.0, 1.0], [2.5, 2.4, 2.6]))
    assert xeon.precision == "float32" and "bf16 is 150% slower: float32" in xeon.sources["precision"]
    assert xeon.sources["precision"].startswith("auto: measured on Intel(R) Xeon(R) CPU @ 2.50GHz (load 3.2 on 2 cores)")
    xeon_path = child.cache.path_for(precision_key(child.config, xeon, XEON))
    assert f"busy while timing (load 3.2 on 2 cores), so the choice may be noise; delete {xeon_path}" in child.messages[-2]
    assert len(child.starts()) == 2 and len(list(child.cache.directory.glob("*.json"))) == 2
    assert [line.split(":")[0] for line in cached_timings(EPYC, child.cache)] == ["small at batch 16 (load 0.4 on 2 cores)"]


def test_a_gain_below_the_margin_keeps_float32(child):
    plan = child.probe(EPYC, _line([1.00, 1.00, 1.00], [0.92, 0.91, 0.93]))
    assert plan.precision == "float32"
    assert "bf16 0.92 s/step vs fp32 1.00 s/step (median of 3): bf16 is only 8% faster (< 10%): float32" \
        in plan.sources["precision"]
    # The margin's edge: exactly 10% faster is enough, a hair less is not.
    assert PrecisionTiming((1.0,), (1 - MIN_BF16_GAIN,)).chosen() == "mixed_bfloat16"
    assert PrecisionTiming((1.0,), (1 - MIN_BF16_GAIN + 1e-6,)).chosen() == "float32"


def test_bf16_failing_alone_is_an_answer_float32(child):
    plan = child.probe(EPYC, _line([1.0, 1.1], [], {"mixed_bfloat16": "NotFoundError: no bfloat16 kernel"}))
    assert plan.precision == "float32" and plan.sources["precision"].startswith("auto: measured on AMD EPYC 9B14")
    assert "bf16 failed (NotFoundError: no bfloat16 kernel): float32" in plan.sources["precision"]


@pytest.mark.parametrize("answer, why", [("crash", "exit 1: RuntimeError: the fake child crashed"),
                                         ('{"seconds": {"float32": [-1.0]}}', "unreadable answer")])
def test_a_failed_child_keeps_the_flags_rule_with_a_warning(child, answer, why):
    with pytest.warns(RuntimeWarning, match="precision probe failed"):
        epyc = child.probe(EPYC, answer)
    assert epyc.precision == "mixed_bfloat16" and why in epyc.sources["precision"]
    assert epyc.sources["precision"].startswith("auto: not measured (the probe failed: ")
    assert epyc.sources["precision"].endswith("CPU flags rule: bf16 natively (avx512_bf16)")
    with pytest.warns(RuntimeWarning):
        xeon = child.probe(XEON, answer)
    assert xeon.precision == "float32" and "measured on" not in xeon.sources["precision"]
    assert list(child.cache.directory.glob("*.json")) == []  # a failure is not cached: the next run tries again


def test_nothing_is_timed_on_gpus_for_a_fixed_precision_or_on_several_hosts(child, monkeypatch):
    fixed = plan_for_machine(EPYC, "small", RequestedSettings(precision="fp32"))
    gpu = plan_for_machine(MachineFacts.from_json_file(ROOT / "tests" / "data" / "device_profiles" / "l4.json"),
                           "small")
    assert not fixed.probe_precision and not gpu.probe_precision
    for plan in (fixed, gpu):
        assert child.probe(EPYC, "crash", plan=plan) is plan
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]}}))
    hosts = probe_cpu_precision(child.config, plan_for_machine(EPYC, "small"), EPYC, child_module="fake_precision_child",
                                cache=child.cache, echo=child.messages.append)
    assert hosts.precision == "mixed_bfloat16" and hosts.sources["precision"].startswith("auto: not measured (several")
    assert child.starts() == []


def test_the_key_holds_what_a_timing_depends_on(child):
    plan = plan_for_machine(EPYC, "small")
    key = precision_key(child.config, plan, EPYC, versions="tensorflow 2.21.0, keras 3.15.1")
    same = precision_key(child.config, plan, dataclasses.replace(EPYC, ram_bytes=1), versions=key.versions)
    assert same.digest() == key.digest()
    others = [
        precision_key(child.config, plan, XEON, versions=key.versions),
        precision_key(child.config, plan, dataclasses.replace(EPYC, usable_cpu_cores=8), versions=key.versions),
        precision_key(load_config(overrides=["model.size=tiny"]), plan, EPYC, versions=key.versions),
        precision_key(child.config, plan_for_machine(EPYC, "small", RequestedSettings(batch_size=8)), EPYC,
                      versions=key.versions),
        precision_key(child.config, plan, EPYC, versions="tensorflow 2.22.0, keras 3.15.1"),
    ]
    assert len({key.digest()} | {other.digest() for other in others}) == 1 + len(others)


def test_the_real_child_times_both_policies():
    # Eager steps: the child's path is the same (both models built, warmed, timed alternately), without
    # two ~17 s graph traces that would make this test slow.
    overrides = ["model.size=tiny", "data.batch_size=2", "training.gradient_accumulation_steps=1",
                 "training.enable_xla_compilation=false", "training.enable_graph_mode=false",
                 "data.bucket_boundaries_s=[0.5, 1.0, 1.5]", "data.max_duration_s=1.5"]
    command = [sys.executable, "-m", "myxtts.training.precision_probe", "--steps", "2"]
    done = subprocess.run(command + [arg for override in overrides for arg in ("--set", override)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["errors"] == {} and set(line["seconds"]) == {"float32", "mixed_bfloat16"}
    assert all(len(times) == 2 and min(times) > 0 for times in line["seconds"].values())
    assert line["bucket_frames"] == load_config(overrides=overrides).data.bucket_mel_lengths[1]  # the middle bucket
    timing = PrecisionTiming.from_child(line, probe_seconds=1.0)  # what the parent reads from it
    assert timing.chosen() in ("float32", "mixed_bfloat16") and timing.bfloat16_median > 0
