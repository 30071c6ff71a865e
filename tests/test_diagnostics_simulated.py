"""`--simulate-gpu`: the real pipeline against a consumer that sleeps each batch's predicted step time,
judged by the same accounting and verdict as a real run."""

import dataclasses
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from myxtts.config import load_config
from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary
from myxtts.diagnostics import report_schema, timing, training_setup
from myxtts.diagnostics.bottleneck import diagnose
from myxtts.diagnostics.report import format_report
from myxtts.diagnostics.simulated_gpu import simulated_gpu
from myxtts.diagnostics.static_checks import static_checks
from myxtts.hardware.capacity import LOOP_ITERATION_S, STEP_OVERHEAD_S
from myxtts.hardware.devices import DeviceSpec, device_by_key
from myxtts.models.flops import alignment_loop_iterations, clip_training_flops

ROOT = Path(__file__).resolve().parent.parent
# Slow by design, with no Python in it: features computed every epoch on one core, one clip at a time.
SLOW_PIPELINE = ["model.size=tiny", "data.batch_size=8", "data.cache_features=false", "data.num_workers=1",
                 "training.enable_xla_compilation=false"]


@pytest.fixture(scope="module")
def slow_pipeline(demo_corpus):
    config = load_config(overrides=[f"data.train_data={demo_corpus}", *SLOW_PIPELINE])
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    dataset = build_dataset(config, rows, vocabulary=vocabulary)
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False)
    return config, len(vocabulary), dataset, static


def _diagnose(dataset, static, simulation):
    return diagnose(dataset, simulation.compiled_step(), num_batches=4, static=static,
                    machine={"usable_cpu_cores": 2, "gpus": [], "notes": []},
                    config_info={"path": None, "overrides": []}, precompile=False, step_repeats=2,
                    no_sampler_note="simulated: nothing to sample", simulated=simulation.describe())


def test_the_step_is_the_batchs_flops_at_the_cards_rate_plus_its_loops(slow_pipeline):
    config, vocab_size, _, _ = slow_pipeline
    h100 = simulated_gpu(config, device_by_key("H100"), vocab_size, mfu=0.4)
    assert (h100.precision, h100.tf32) == ("mixed_bfloat16", True)  # the plan's rule for CC 9.0
    assert h100.describe()["loop_source"].startswith("measured on an H100")  # the fallback, named
    shape = lambda *dims: SimpleNamespace(shape=dims)  # noqa: E731 - only the shapes are read
    batch = {"mel": shape(8, 520, 80), "tokens": shape(8, 152), "reference_mel": shape(8, 259, 80)}
    flops = clip_training_flops("tiny", frames=520, tokens=152, reference_frames=259, n_mels=80,
                                vocab_size=vocab_size).scaled(8)
    # The tiny model's products are too thin for the H100: bandwidth caps it below the assumed 40%.
    utilization = flops.intensity / (989.4e12 / 3350e9)
    assert utilization < 0.4
    expected = (flops.total / (989.4e12 * utilization) + alignment_loop_iterations(520) * LOOP_ITERATION_S
                + STEP_OVERHEAD_S)
    assert h100.step_seconds(batch) == pytest.approx(expected)
    # The same clips as waveforms (data.mel_on_device): the same frames, plus the STFT in the step.
    waveforms = {**batch, "audio": shape(8, 519 * 256)}
    del waveforms["mel"]
    assert expected < h100.step_seconds(waveforms) < 1.01 * expected


def test_slow_pipeline_is_input_bound_against_a_fast_gpu_and_compute_bound_against_a_slow_one(slow_pipeline):
    config, vocab_size, dataset, static = slow_pipeline
    # The H100 with its alignment loops free: the fastest it could be (its FLOPs alone), which no pipeline
    # decoding on one core keeps up with.
    fast = dataclasses.replace(simulated_gpu(config, device_by_key("H100"), vocab_size, mfu=0.4), loop_iteration_s=0.0)
    report = _diagnose(dataset, static, fast)
    training = report["measurements"]["training"]
    assert report["verdict"]["kind"] == "input-bound" and training["input_share"] >= 0.2
    changes = [item["change"] for item in report["recommendations"]]
    # With a (simulated) GPU, moving the log-mel onto it is advice worth giving.
    assert changes[:2] == ["data.cache_features: true", "data.num_workers: 2"] and "data.mel_on_device: true" in changes
    assert report["gpu"]["simulated"]["device"] == "H100" and report_schema.schema_errors(report) == []
    assert "GPU: simulated NVIDIA H100 80GB HBM3 (H100)" in format_report(report)

    # A test-only card whose peak is so low that one batch takes 0.3 s: the pipeline keeps ahead.
    one_batch = next(iter(dataset))
    unit = dataclasses.replace(fast, loop_iteration_s=0.0, step_overhead_s=0.0, device=DeviceSpec(
        "SLOW", "test-only slow GPU", (8, 0), 2**30, 1.0, 1.0, 1.0, 1.0, memory_bandwidth=1.0, source="this test"))
    peak = unit.step_seconds(one_batch) / 0.3  # at 1 FLOP/s the step takes FLOPs / MFU seconds
    slow = dataclasses.replace(unit, device=dataclasses.replace(unit.device, bf16_flops=peak, memory_bandwidth=peak))
    assert slow.step_seconds(one_batch) == pytest.approx(0.3)
    report = _diagnose(dataset, static, slow)
    training = report["measurements"]["training"]
    assert report["verdict"]["kind"] == "compute-bound", report["verdict"]["reasons"]
    assert training["input_share"] < 0.05 and training["compiled_step"]["p50_ms"] >= 150
    assert any("simulated SLOW" in reason for reason in report["verdict"]["reasons"])
    # Nothing on the input side; and no XLA either, though a GPU's step may want it: no XLA step ran
    # here (a simulated card runs nothing), and XLA is recommended only where one did.
    assert [item["change"] for item in report["recommendations"]] == []
    assert report_schema.schema_errors(report) == []
    # The sleep is the predicted time: the step alone on one batch takes it.
    alone = timing.measure_step_alone(slow.compiled_step(), one_batch, 2)
    assert alone["p50_ms"] == pytest.approx(slow.step_seconds(one_batch) * 1e3, rel=0.2)


def test_cli_simulates_without_building_a_model(tmp_path, demo_corpus, capsys, monkeypatch):
    monkeypatch.setattr(training_setup, "build_training_setup", lambda *a, **k: pytest.fail("built a model"))
    # Nor is this CPU's precision timed (a minute, for a model that never runs here).
    from myxtts.hardware import cpu_precision

    monkeypatch.setattr(cpu_precision, "time_in_child", lambda *a, **k: pytest.fail("timed the CPU's precision"))
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump({"model": {"size": "tiny"}, "data": {"batch_size": 4}}), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("diagnose_gpu_bottleneck", ROOT / "utilities" / "diagnose_gpu_bottleneck.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    code = cli.main(["--config", str(config_path), "--train-data", str(demo_corpus), "--num-batches", "3",
                     "--step-repeats", "2", "--simulate-gpu", "T4", "--loop-iteration-us", "5",
                     "--json", str(tmp_path / "report.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gpu"]["simulated"]["precision"] == "mixed_float16"  # the plan's rule for CC 7.5
    assert report["gpu"]["simulated"]["spec_source"].startswith("from spec sheets: NVIDIA T4")
    # The loop cost the user set is the one used, and named as theirs (not the H100's measurement).
    assert report["gpu"]["simulated"]["loop_iteration_s"] == pytest.approx(5e-6)
    assert report["gpu"]["simulated"]["loop_source"] == "set by --loop-iteration-us"
    assert report["measurements"]["alignment_loops"] is None  # no model here: the loops are not timed
    assert report["measurements"]["step_alone"]["xla"] is None
    assert report["measurements"]["precompile"]["shapes"] == 0 and report["verdict"]["kind"] in (
        "input-bound", "compute-bound", "host-overhead-bound")
    assert "GPU: simulated Tesla T4 (T4)" in out and "Verdict:" in out
    with pytest.raises(SystemExit):
        cli.parse_arguments(["--simulate-gpu", "H1000"])
