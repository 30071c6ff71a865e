"""The bottleneck diagnosis: verdicts on pipelines and steps slow on purpose, the report, --apply, the CLIs."""

import importlib.util
import json
import time
from pathlib import Path

import keras
import pytest
import tensorflow as tf
import yaml

from myxtts.config import DataConfig, load_config
from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary
from myxtts.diagnostics import report_schema
from myxtts.diagnostics.bottleneck import diagnose, gpu_section
from myxtts.diagnostics.config_patch import patched_path, write_patched_config
from myxtts.diagnostics.gpu_sampler import GpuSeries
from myxtts.diagnostics.profile_trace import capture_trace
from myxtts.diagnostics.report import _gpu_lines, format_report
from myxtts.diagnostics.static_checks import cpu_check, describe_function, static_checks
from myxtts.diagnostics.timeline_plot import plot_timeline
from myxtts.diagnostics.timing import CompiledStep
from myxtts.diagnostics.verdict import Verdict, decide, larger_batch_reason, recommend

ROOT = Path(__file__).resolve().parent.parent
MACHINE = {"usable_cpu_cores": 2, "gpus": [], "notes": []}
# A config file the way a user writes one: these settings make input-side recommendations possible.
USER_YAML = {
    "data": {"cache_features": False, "deterministic": True, "num_workers": 1, "batch_size": 4,
             "max_duration_s": 6.0, "bucket_boundaries_s": [3.0, 6.0]},
    "model": {"size": "tiny"},
    "training": {"enable_xla_compilation": False, "precision": "fp32", "gradient_accumulation_steps": 1},
}


def _load_utility(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "utilities" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="module")
def corpus(demo_corpus):
    rows = read_manifest(demo_corpus)
    return demo_corpus, rows, build_vocabulary(rows, DataConfig())


def _user_config(tmp_path, corpus_dir):
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(USER_YAML), encoding="utf-8")
    return path, load_config(path, overrides=[f"data.train_data={corpus_dir}"])


def _cheap_step(extra_seconds=0.0):
    """A step that reads the batch, plus an optional sleep standing in for a heavy model."""

    def sleep(value):
        time.sleep(extra_seconds)
        return value

    @tf.function
    def run(batch):
        loss = tf.reduce_mean(batch["mel"])
        if extra_seconds:
            loss = tf.numpy_function(sleep, [loss], tf.float32, name="heavy_model")
        return {"loss": loss}

    return CompiledStep(run=run, finish=lambda outputs: float(outputs["loss"]))


def _diagnose(dataset, step, static, **kwargs):
    return diagnose(dataset, step, num_batches=8, static=static, machine=MACHINE,
                    config_info={"path": None, "overrides": []}, step_repeats=3, **kwargs)


def test_sleeping_numpy_function_is_found_and_diagnosed_input_bound(tmp_path, corpus):
    corpus_dir, rows, vocabulary = corpus
    path, config = _user_config(tmp_path, corpus_dir)
    original = path.read_bytes()

    def wait_for_disk(mel):
        time.sleep(0.06)
        return mel

    def slow_batch(batch):
        mel = tf.numpy_function(wait_for_disk, [batch["mel"]], tf.float32, name="sleepy_loader")
        return {**batch, "mel": tf.ensure_shape(mel, batch["mel"].shape)}

    # Sequential map after the prefetch: each batch waits its 60 ms while the consumer waits.
    dataset = build_dataset(config, rows, vocabulary=vocabulary).map(slow_batch)
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False)
    (op,) = static["python_ops"]
    assert (op["op"], op["node"], op["stage"]) == ("PyFunc", "sleepy_loader", "Dataset.map(slow_batch)")
    assert op["dataset_node"].endswith("(MapDataset)")
    assert any("sleepy_loader" in finding for finding in static["findings"])

    report = _diagnose(dataset, _cheap_step(), static)
    training = report["measurements"]["training"]
    assert report["verdict"]["kind"] == "input-bound"
    assert training["input_share"] >= 0.5 and training["input_classification"] == "highly"
    assert training["input_wait"]["p50_ms"] >= 50
    assert report["measurements"]["input_pipeline"]["p50_ms"] >= 50
    assert report["measurements"]["step_alone"]["steps_per_s"] > 2 * report["measurements"]["input_pipeline"]["batches_per_s"]
    changes = [item["change"] for item in report["recommendations"]]
    assert "sleepy_loader" in changes[0] and report["recommendations"][0]["key"] is None
    assert changes[1:] == ["data.cache_features: true", "data.num_workers: 2", "data.deterministic: false"]
    assert report_schema.schema_errors(report) == []
    assert "INPUT-BOUND" in format_report(report)

    # --apply on this report: a patched copy beside the original, which stays byte for byte.
    patched, applied = write_patched_config(path, report["recommendations"])
    assert patched == tmp_path / "user.diagnosed.yaml" and path.read_bytes() == original
    assert applied == changes[1:]
    reloaded = load_config(patched)
    assert (reloaded.data.cache_features, reloaded.data.num_workers, reloaded.data.deterministic) == (True, 2, False)
    assert reloaded.model.size == "tiny" and reloaded.data.bucket_boundaries_s == [3.0, 6.0]  # the rest is kept


def test_native_cached_pipeline_with_a_heavy_step_is_compute_bound(tmp_path, corpus):
    corpus_dir, rows, vocabulary = corpus
    config = load_config(overrides=[f"data.train_data={corpus_dir}", "model.size=tiny", "data.batch_size=4",
                                    "data.max_duration_s=6.0", "data.bucket_boundaries_s=[3.0, 6.0]",
                                    "data.cache_features=true", "training.enable_xla_compilation=false"])
    dataset = build_dataset(config, rows, vocabulary=vocabulary)
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False,
                           audio_paths=[u.audio_path for u in rows])
    assert static["python_ops"] == [] and static["graph"]["cache"] and static["graph"]["bucketing"]
    assert static["read_throughput"]["files"] >= 1 and static["read_throughput"]["mb_per_s"] > 0

    report = _diagnose(dataset, _cheap_step(extra_seconds=0.08), static)
    training = report["measurements"]["training"]
    assert report["verdict"]["kind"] == "compute-bound"
    assert training["input_share"] < 0.05 and training["compiled_step"]["share"] > 0.9
    assert training["compiled_step"]["p50_ms"] >= 80
    # Nothing on the input side is worth changing; without a GPU no precision or XLA advice either.
    assert report["recommendations"] == []
    assert report_schema.schema_errors(report) == []


def test_slow_host_work_is_host_overhead_bound_and_plots_with_a_gpu_series(tmp_path, corpus):
    corpus_dir, rows, vocabulary = corpus
    config = load_config(overrides=[f"data.train_data={corpus_dir}", "data.batch_size=4", "data.max_duration_s=6.0",
                                    "data.bucket_boundaries_s=[3.0, 6.0]"])
    dataset = build_dataset(config, rows, vocabulary=vocabulary)
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False)
    # A step that costs the same whatever the batch: twice the batch, timed, moves about twice the clips.
    report = _diagnose(dataset, _cheap_step(0.02), static, host_work=lambda outputs: time.sleep(0.04), larger_batch=True)
    assert report["verdict"]["kind"] == "host-overhead-bound"
    assert report["measurements"]["training"]["host_other"]["share"] > 0.5
    keys = [item["key"] for item in report["recommendations"]]
    assert keys[0] == "training.steps_per_execution" and "data.batch_size" in keys
    larger = report["measurements"]["larger_batch"]
    assert larger["batch"] == 8 and larger["samples_per_s_gain"] > 1.5, larger
    advice = next(item for item in report["recommendations"] if item["key"] == "data.batch_size")
    assert advice["value"] == 8 and "twice the batch measured" in advice["reason"]
    assert any(reason.startswith("twice the batch (8 clips) timed alone") for reason in report["verdict"]["reasons"])
    assert "twice the batch (8)" in format_report(report)

    # The same report as if a GPU had been sampled: still valid, and the plot gets its upper panel.
    origin = report["measurements"]["training"]["per_step"][0]["start_s"]
    series = GpuSeries(source="polling", device="Fake GPU", times_s=[origin + 0.05 * i for i in range(40)],
                       utilization=[90.0 if i % 4 else 5.0 for i in range(40)], memory_used_bytes=[2**30],
                       memory_total_bytes=16 * 2**30, memory_controller=[10.0])
    report["gpu"] = gpu_section(series, None, origin)
    assert report_schema.schema_errors(report) == []
    assert "Fake GPU, 40 samples (polling)" in format_report(report)
    plot_timeline(report, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_the_plans_own_worker_count_is_no_finding():
    # Two calls in flight per input core is the hardware plan's choice (30 on 16 cores): on the H100
    # the diagnosis flagged that very count as a problem. Another count above the cores still is one.
    planned = cpu_check(30, 16, planned_workers=30)
    assert not planned["oversubscribed"] and "two calls in flight" in planned["note"]
    other = cpu_check(40, 16, planned_workers=30)
    assert other["oversubscribed"] and "take turns" in other["note"]
    assert cpu_check(30, 16)["oversubscribed"]  # no plan known: above the cores is a finding


def _training(input_share, host_share=0.01):
    return {"input_share": input_share, "input_classification": "not", "host_other": {"share": host_share},
            "compiled_step": {"share": 1 - input_share - host_share}, "compile_steps": 0, "steps": 10}


def _gpu(mean, memory_used=0.3, controller=20.0, reserved=0.99):
    """A sampled 80 GiB GPU: TensorFlow's peak at `memory_used` of it, NVML's used memory at `reserved`."""
    return {"available": True, "utilization": {"mean": mean, "p10": mean, "p90": mean, "below_30_share": 0.0},
            "oscillation": {"score": 0.0, "period_s": None}, "memory_used_bytes": int(reserved * 80 * 2**30),
            "memory_total_bytes": 80 * 2**30, "memory_controller_mean": controller,
            "tensorflow_peak_bytes": None if memory_used is None else int(memory_used * 80 * 2**30)}


def _static(**settings):
    base = {"graph_mode": True, "xla": False, "precision": "auto", "dtype_policy": "float32", "batch_size": 16,
            "steps_per_execution": 1, "num_workers": 0, "prefetch_buffer_size": 0, "prefetch_to_gpu": False,
            "cache_features": True, "bucketing": True, "deterministic": False, "mel_on_device": False}
    return {"settings": {**base, **settings}, "python_ops": [], "cpu": {"usable_cores": 8, "note": ""},
            "read_throughput": None}


# A step timed under XLA (run with --set training.enable_xla_compilation=true): XLA ran here.
XLA_RAN = {"step_alone": {"xla": True, "steps_per_s": 5.0}}
XLA_SET = {"overridden": {"training.enable_xla_compilation"}}


def test_gpu_verdicts_and_their_recommendations():
    # Busy GPU, fp32 on an Ampere-class card: bf16 first, then a bigger batch (memory is roomy); XLA
    # only where an XLA step ran in the diagnosis (tests/test_diagnostics_loops.py has the rule).
    verdict = decide(_training(0.01), _gpu(75))
    assert verdict.kind == "compute-bound"
    changes = [r["change"] for r in recommend(verdict, _static(), {"training": _training(0.01)}, _gpu(75), (8, 0))]
    assert changes == ["training.precision: bf16", "data.batch_size: 32"]
    changes = [r["change"] for r in recommend(verdict, _static(), {"training": _training(0.01), **XLA_RAN}, _gpu(75),
                                              (8, 0), **XLA_SET)]
    assert changes == ["training.precision: bf16", "training.enable_xla_compilation: true", "data.batch_size: 32"]
    # Volta gets fp16 (with loss scaling) instead.
    assert recommend(verdict, _static(), {"training": _training(0.01)}, _gpu(75), (7, 0))[0]["value"] == "fp16"
    # Batches ready, GPU mostly idle: launching work is the cost. With the host's round trip between
    # steps at 1% of the step (as on the H100, where steps_per_execution: 4 gained nothing), fewer
    # round trips are not advised; at 8% they are.
    verdict = decide(_training(0.02), _gpu(35))
    assert verdict.kind == "host-overhead-bound"
    keys = [r["key"] for r in recommend(verdict, _static(), {"training": _training(0.02), **XLA_RAN}, _gpu(35),
                                        (9, 0), **XLA_SET)]
    assert keys[:2] == ["training.enable_xla_compilation", "data.batch_size"]
    round_trips = _training(0.02, host_share=0.08)
    keys = [r["key"] for r in recommend(decide(round_trips, _gpu(35)), _static(), {"training": round_trips, **XLA_RAN},
                                        _gpu(35), (9, 0), **XLA_SET)]
    assert keys[:2] == ["training.steps_per_execution", "training.enable_xla_compilation"]
    # A saturated memory controller, or a full card.
    assert decide(_training(0.01), _gpu(95, controller=75)).kind == "memory-bound"
    full = _gpu(95, memory_used=0.97)
    verdict = decide(_training(0.01), full)
    assert verdict.kind == "memory-bound"
    changes = [r["change"] for r in recommend(verdict, _static(), {"training": _training(0.01), **XLA_RAN}, full,
                                              (9, 0), **XLA_SET)]
    assert changes == ["training.precision: bf16", "training.enable_xla_compilation: true", "data.batch_size: 8"]
    # The input share wins over everything at >= 20%; values already set are never recommended.
    verdict = decide(_training(0.3), _gpu(20))
    assert verdict.kind == "input-bound"
    changes = [r["change"] for r in recommend(verdict, _static(prefetch_to_gpu=True), {"training": _training(0.3)},
                                              _gpu(20), (9, 0))]
    assert changes == []  # cache on, prefetch to GPU on, workers automatic: nothing left to set
    changes = [r["change"] for r in recommend(verdict, _static(num_workers=16), {"training": _training(0.3)},
                                              _gpu(20), (9, 0))]
    assert changes == ["data.num_workers: 0", "data.prefetch_to_gpu: true"]
    changes = [r["change"] for r in recommend(verdict, _static(prefetch_to_gpu=True, cache_features=False),
                                              {"training": _training(0.3)}, _gpu(20), (9, 0))]
    assert changes == ["data.cache_features: true", "data.mel_on_device: true"]


def test_a_larger_batch_is_advised_only_where_its_timing_paid():
    # On the H200 the diagnosis advised batch 32 without having run it. Timed: 1.8x the samples/s is
    # advised, with the figure; 1.02x, or a batch that ran out of memory, is not.
    verdict = decide(_training(0.02), _gpu(35))
    assert verdict.kind == "host-overhead-bound"

    def advice(larger):
        measured = {"training": _training(0.02), "larger_batch": larger}
        return [r for r in recommend(verdict, _static(), measured, _gpu(35), (9, 0)) if r["key"] == "data.batch_size"]

    paid = advice({"batch": 32, "p50_ms": 81.0, "warmup_ms": 900.0, "samples_per_s_gain": 1.8})
    assert [r["value"] for r in paid] == [32] and "measured 1.80x the samples/s here (81 ms a step)" in paid[0]["reason"]
    assert advice({"batch": 32, "p50_ms": 143.0, "warmup_ms": 900.0, "samples_per_s_gain": 1.02}) == []
    assert advice({"batch": 32, "note": "out of memory: OOM when allocating"}) == []
    assert len(advice(None)) == 1  # a report without the timing (an older one, a unit test) keeps the advice
    assert "not advised (under 1.1x)" in larger_batch_reason({"batch": 32, "p50_ms": 143.0, "samples_per_s_gain": 1.02})


def test_memory_verdict_rests_on_tensorflows_peak_not_on_what_nvml_sees_reserved():
    # Without memory growth TensorFlow reserves the card: NVML says 99% used on a run that holds 30%.
    healthy = _gpu(95, memory_used=0.30, reserved=0.99)
    verdict = decide(_training(0.01), healthy)
    assert verdict.kind == "compute-bound"
    keys = [r["key"] for r in recommend(verdict, _static(), {"training": _training(0.01)}, healthy, (9, 0))]
    assert "data.batch_size" not in keys  # 95% busy: no bigger batch either, and never a smaller one
    roomy = _gpu(60, memory_used=0.30, reserved=0.99)
    changes = [r["change"] for r in recommend(decide(_training(0.01), roomy), _static(), {"training": _training(0.01)},
                                              roomy, (9, 0))]
    assert "data.batch_size: 32" in changes  # TensorFlow held 30%: room to grow, whatever NVML shows
    # TensorFlow itself near the limit: memory-bound, and the batch is halved.
    full = _gpu(95, memory_used=0.97, reserved=0.97)
    verdict = decide(_training(0.01), full)
    assert verdict.kind == "memory-bound" and "TensorFlow's peak was 97%" in verdict.reasons[-1]
    # Peak unknown: NVML's figure alone never makes a memory verdict, and the reasons say why.
    unknown = _gpu(95, memory_used=None, reserved=0.99)
    verdict = decide(_training(0.01), unknown)
    assert verdict.kind == "compute-bound"
    assert any("TensorFlow's memory peak was not measured" in reason for reason in verdict.reasons)
    report = {"available": True, **unknown, "device": "Fake GPU", "samples": 1, "source": "polling", "note": None,
              "idle_reason_share": None}
    assert "TensorFlow's peak not measured (NVML: 79.2 GiB in use" in "\n".join(_gpu_lines({"gpu": report}))


def test_diagnose_reads_tensorflows_peak_over_the_training_measurement_only():
    events = []

    class FakeDeviceMemory:
        def reset(self):
            events.append("reset")

        def peak_bytes(self):
            events.append("peak")
            return 3 * 2**30

    step = _cheap_step()
    counted = CompiledStep(run=lambda batch: (events.append("step"), step.run(batch))[1], finish=step.finish)
    dataset = tf.data.Dataset.from_tensor_slices({"mel": tf.ones([8, 4, 3])}).batch(2)
    static = static_checks(load_config(), dataset, policy="float32", usable_cores=2, gpu_available=False)
    report = _diagnose(dataset, counted, static, device_memory=FakeDeviceMemory())
    assert report["gpu"]["tensorflow_peak_bytes"] == 3 * 2**30 and report_schema.schema_errors(report) == []
    # Reset after the compile and step-alone runs, read after (c): the peak is that of training only.
    first_reset, peak = events.index("reset"), events.index("peak")
    assert events.count("reset") == events.count("peak") == 1
    assert events[first_reset + 1:peak].count("step") == 8 + 1  # (c)'s untimed first step and its 8
    assert "step" in events[:first_reset]


def test_memory_growth_is_set_for_every_gpu_and_a_started_runtime_is_reported():
    from myxtts.hardware.gpu_memory import TensorFlowPeakMemory, allow_memory_growth

    class FakeDevice:
        def __init__(self, name):
            self.name = name

    class FakeConfig:
        def __init__(self, fail_on=()):
            self.grown, self.fail_on, self.calls = [], fail_on, []
            self.experimental = self

        def list_physical_devices(self, kind):
            return [FakeDevice("/physical_device:GPU:0"), FakeDevice("/physical_device:GPU:1")] if kind == "GPU" else []

        def set_memory_growth(self, device, enabled):
            if device.name in self.fail_on:
                raise RuntimeError("Physical devices cannot be modified after being initialized")
            self.grown.append((device.name, enabled))

        def reset_memory_stats(self, device):
            self.calls.append(("reset", device))

        def get_memory_info(self, device):
            self.calls.append(("info", device))
            return {"current": 1, "peak": 5 * 2**30}

    config, lines = FakeConfig(), []
    assert allow_memory_growth(lines.append, tf_config=config) == 2
    assert config.grown == [("/physical_device:GPU:0", True), ("/physical_device:GPU:1", True)] and lines == []
    started = FakeConfig(fail_on=("/physical_device:GPU:1",))
    assert allow_memory_growth(lines.append, tf_config=started) == 1
    assert lines == ["note: GPU memory growth not changed for /physical_device:GPU:1: Physical devices cannot be "
                     "modified after being initialized"]
    memory = TensorFlowPeakMemory("GPU:1", tf_config=config)
    memory.reset()
    assert memory.peak_bytes() == 5 * 2**30 and config.calls == [("reset", "GPU:1"), ("info", "GPU:1")]


def test_the_diagnosis_enables_memory_growth_before_any_gpu_work(monkeypatch):
    from myxtts.diagnostics import training_setup
    from myxtts.hardware import gpu_memory
    from myxtts.training import run_setup

    order = []

    class Stop(Exception):
        pass

    def plan_for_machine(*args, **kwargs):  # the hardware plan, whose batch probe is the first GPU work
        order.append("plan")
        raise Stop

    # Reading the machine's facts (NVML, /proc) comes first: it starts no TensorFlow runtime, and the
    # persistent XLA cache is set from them before the runtime starts (run_setup.resolve_plan).
    monkeypatch.setattr(gpu_memory, "allow_memory_growth", lambda echo: order.append("growth"))
    monkeypatch.setattr(run_setup, "plan_for_machine", plan_for_machine)
    with pytest.raises(Stop):
        training_setup.prepare_run(load_config())
    assert order == ["growth", "plan"]


def test_xla_without_bucketing_is_flagged_whatever_the_verdict():
    static = _static(xla=True, bucketing=False)
    recs = recommend(Verdict("compute-bound"), static, {"training": _training(0.0)}, None)
    assert [r["change"] for r in recs] == ["data.bucketing: true"]


def test_xla_compiling_longer_than_it_pays_back_on_a_cpu():
    measurements = {"training": _training(0.0), "precompile": {"shapes": 2, "seconds": 120.0},
                    "step_alone": {"steps_per_s": 2.0}}
    recs = recommend(Verdict("compute-bound"), _static(xla=True), measurements, None)
    assert [r["change"] for r in recs] == ["training.enable_xla_compilation: false"]
    assert "60 s" in recs[0]["reason"]
    quick = {**measurements, "precompile": {"shapes": 2, "seconds": 4.0}}
    assert recommend(Verdict("compute-bound"), _static(xla=True), quick, None) == []
    on_gpu = recommend(Verdict("compute-bound"), _static(xla=True), measurements, _gpu(90), (9, 0))
    assert "training.enable_xla_compilation: false" not in [r["change"] for r in on_gpu]


def test_function_names_become_transformations():
    assert describe_function("__inference_Dataset_map_slow_fn_9") == "Dataset.map(slow_fn)"
    assert describe_function("__inference_Dataset_flat_map_flat_map_fn_50") == "Dataset.flat_map(flat_map_fn)"
    assert describe_function("__inference_Dataset_filter_lambda_17") == "Dataset.filter(<lambda>)"
    assert describe_function("__inference_Dataset_from_generator_generator_next_fn_42") == "Dataset.from_generator"
    assert describe_function("something_else") == "something_else"


def test_generator_pipelines_are_found():
    dataset = tf.data.Dataset.from_generator(lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int64))
    config = load_config()
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False)
    stages = {op["stage"] for op in static["python_ops"]}
    assert stages == {"Dataset.from_generator"}
    assert all(op["dataset_node"].endswith("(FlatMapDataset)") for op in static["python_ops"])


def test_schema_is_documented_and_checks_what_it_claims():
    documentation = report_schema.__doc__
    # A field is documented when the docstring names it in backticks: `name`, `a.name`, `name[]`, ...
    missing = sorted({name for name in report_schema.field_names()
                      if not any(f"{before}{name}{after}" in documentation
                                 for before in ("`", ".") for after in ("`", ".", "[]"))})
    assert missing == []
    errors = report_schema.schema_errors({"schema_version": 1, "verdict": {"kind": "slow"}})
    assert any("missing 'gpu'" in e for e in errors)
    assert any("'slow' is not one of" in e for e in errors)
    assert report_schema.schema_errors(True, {"type": "integer"}) != []  # booleans are not JSON integers


def test_apply_refuses_a_copy_that_does_not_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  batch_size: 4\n", encoding="utf-8")
    bad = [{"key": "data.batch_size", "value": "many", "change": "data.batch_size: many", "reason": "test"}]
    with pytest.raises(ValueError, match="batch_size"):
        write_patched_config(path, bad)
    assert not patched_path(path).exists()
    assert path.read_text() == "data:\n  batch_size: 4\n"
    assert write_patched_config(path, []) == (None, [])
    # An earlier copy (perhaps edited since) was removed by the next one that did not load.
    good = [{"key": "data.batch_size", "value": 8, "change": "data.batch_size: 8", "reason": "test"}]
    assert write_patched_config(path, good) == (patched_path(path), ["data.batch_size: 8"])
    earlier = patched_path(path).read_text()
    with pytest.raises(ValueError, match="batch_size"):
        write_patched_config(path, bad)
    assert patched_path(path).read_text() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["c.diagnosed.yaml", "c.yaml"]


@pytest.mark.slow
def test_cli_end_to_end_on_the_tiny_model(tmp_path, corpus, capsys, monkeypatch):
    from myxtts.diagnostics import training_setup

    corpus_dir, _, _ = corpus
    # Every batch the CLI's pipeline delivers waits 0.7 s on a "slow disk", on the consumer's thread:
    # several times the tiny step (which ran up to ~250 ms on the loaded 2-core machine, and the
    # prefetched batch is fetched while it runs), so exactly one verdict is right (input-bound).
    def slow_disk(mel):
        time.sleep(0.7)
        return mel

    def slow_batches(config, rows, **kwargs):
        def delayed(batch):
            mel = tf.numpy_function(slow_disk, [batch["mel"]], tf.float32, name="slow_disk")
            return {**batch, "mel": tf.ensure_shape(mel, batch["mel"].shape)}
        return build_dataset(config, rows, **kwargs).map(delayed)

    monkeypatch.setattr(training_setup, "build_dataset", slow_batches)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump({**USER_YAML, "data": {**USER_YAML["data"], "bucket_boundaries_s": [6.0]}}),
                           encoding="utf-8")
    original = config_path.read_bytes()
    cli = _load_utility("diagnose_gpu_bottleneck")
    code = cli.main(["--config", str(config_path), "--train-data", str(corpus_dir), "--num-batches", "4",
                     "--step-repeats", "2", "--json", str(tmp_path / "out" / "report.json"),
                     "--plot", str(tmp_path / "out" / "timeline.png"), "--apply"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report_schema.schema_errors(report) == []
    assert report["verdict"]["kind"] == "input-bound"
    assert report["measurements"]["training"]["input_classification"] == "highly"
    assert report["measurements"]["training"]["input_wait"]["p50_ms"] >= 300
    assert report["gpu"]["available"] is False and report["gpu"]["note"].startswith("no GPU to sample")
    assert report["gpu"]["tensorflow_peak_bytes"] is None  # no GPU TensorFlow sees: nothing to measure
    assert report["static"]["settings"]["model_size"] == "tiny"
    assert [op["node"] for op in report["static"]["python_ops"]] == ["slow_disk"]
    assert "slow_disk" in report["recommendations"][0]["change"]
    training = report["measurements"]["training"]
    assert training["steps"] == 4 and len(training["per_step"]) == 4
    assert report["measurements"]["precompile"]["shapes"] == 1  # one bucket: one program
    # The alignment's loops timed alone on (b)'s batch, as the CPU step runs them (1 frame per
    # iteration, each loop compiled alone: the step is not XLA), and the capacity plan's workers.
    loops, alone = report["measurements"]["alignment_loops"], report["measurements"]["step_alone"]
    assert loops["median_ms"] > 0 and loops["frames"] == alone["batch_shape"]["mel"][1]
    assert (loops["frames_per_iteration"], loops["compiled"], loops["jit_compile"], alone["xla"]) == (1, True, False, False)
    assert loops["share_of_step"] == pytest.approx(loops["median_ms"] / alone["p50_ms"])
    assert "its alignment loops alone" in out
    # The same step traced by the profiler: its work split into the loops, matrix products and the rest.
    split = report["measurements"]["step_profile"]
    assert split["source"] == "cpu ops" and split["steps"] == 3 and split["loops_ms"] > 0 and split["matmuls_ms"] > 0
    assert split["busy_ms"] == pytest.approx(split["loops_ms"] + split["matmuls_ms"] + split["other_ms"])
    assert "its profile" in out and "alignment loops" in out.split("its profile")[1].splitlines()[0]
    from myxtts.hardware.detect import detect_machine
    from myxtts.hardware.plan import plan_for_machine
    planned = plan_for_machine(detect_machine(), "tiny").num_parallel_calls
    assert report["machine"]["input_plan"]["num_workers"] == planned
    assert all(r["value"] >= planned for r in report["recommendations"] if r["key"] == "data.num_workers")
    assert training["compile_steps"] == 0  # it was compiled before timing
    assert (tmp_path / "out" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Verdict: {report['verdict']['kind'].upper()}" in out and "(a) input pipeline alone" in out
    assert config_path.read_bytes() == original
    patched = load_config(patched_path(config_path))  # input-bound: cache_features (off in USER_YAML) among others
    assert patched.data.cache_features is True


def test_profiler_trace_is_written(tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices({"mel": tf.ones([6, 4, 3])}).batch(2)
    trace = capture_trace(dataset, _cheap_step(), 3, tmp_path / "logs")
    assert trace.parent == tmp_path / "logs" / "plugins" / "profile"
    assert list(trace.glob("*.xplane.pb"))
    profiler = _load_utility("gpu_profiler")
    assert profiler.default_logdir(Path("configs/demo.yaml")) == ROOT / "runs" / "demo" / "logs"


@pytest.mark.parametrize("tool", ["diagnose_gpu_bottleneck", "capacity_plan"])
def test_the_gpu_planning_tools_name_a_damaged_clip_in_one_line(tool, tmp_path, capsys, monkeypatch):
    # Both ended in TensorFlow's InvalidArgumentError traceback, where training names the file.
    monkeypatch.setenv("MYXTTS_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.wav").write_text("a text file, not audio")
    (corpus / "manifest.jsonl").write_text('{"audio_path": "a.wav", "text": "Hello there."}\n')
    assert _load_utility(tool).main(["--train-data", str(corpus), "--batch-size", "1",
                                     "--set", "training.precision=fp32"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"error: not a WAV file (no RIFF/WAVE header): {corpus / 'a.wav'} - check or convert the corpus with " \
                   "utilities/prepare_dataset.py", last
