"""The host calibration on a small corpus: every route timed, the padded shapes the pipeline really
makes, the cache, and utilities/capacity_plan.py on top of it."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from myxtts.config import load_config
from myxtts.data.pipeline import Epochs, build_vocabulary
from myxtts.diagnostics import calibration
from myxtts.diagnostics.calibration import padded_shape
from myxtts.diagnostics.capacity import host_calibration
from myxtts.hardware.capacity_record import ROUTES, CapacityCache, record_key
from myxtts.data.splits import load_splits

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = ["model.size=tiny", "data.batch_size=3", "data.max_duration_s=6.0", "data.bucket_boundaries_s=[3.0, 6.0]"]


@pytest.fixture(scope="module")
def calibrated(demo_corpus, tmp_path_factory):
    config = load_config(overrides=[f"data.train_data={demo_corpus}", *OVERRIDES])
    cache = CapacityCache(tmp_path_factory.mktemp("capacity"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "MIN_EPOCHS", 3)  # the test's time; the error bound is not what is tested
        lines = []
        record = host_calibration(config, cache=cache, seconds=0.0, progress=lines.append)
    # The last line says where the record went and how long the calibration took (a first GPU run waits on it).
    assert re.fullmatch(r"host calibration saved to .* \(took \d+ s, once per corpus, settings and CPU\)", lines[-1]), lines
    return config, cache, record


def test_every_route_is_timed_and_the_cache_is_the_fastest(calibrated):
    _, _, record = calibrated
    assert set(record.routes) == set(ROUTES)
    for rate in record.routes.values():
        assert rate.epochs >= 3 and rate.audio_s_per_cpu_s > 0 and rate.parallel_calls >= 1
    per_core = {name: rate.audio_s_per_cpu_s for name, rate in record.routes.items()}
    # Reading cached features skips decoding and both STFTs: measured ~25x cheaper here, 3x is a loose floor.
    assert per_core["cached_features"] > 3 * per_core["on_the_fly"]
    assert 0 < record.clips <= 24 and record.audio_seconds > record.clips * 0.5
    assert 5 < record.tokens_per_audio_s < 30 and record.padding >= 1.0
    # Four loops over each clip's padded frames (~86 per second, times the padding).
    assert record.loop_iterations_per_audio_s == pytest.approx(4 * 22050 / 256 * record.padding, rel=0.05)
    flops = [record.models[size].flops_per_audio_s for size in ("tiny", "small", "base")]
    assert flops == sorted(flops) and flops[0] > 0
    assert record.models["base"].mel_on_device_flops_per_audio_s < 0.01 * flops[2]


def test_padded_shapes_are_those_of_the_pipelines_batches(calibrated, demo_corpus):
    config, _, _ = calibrated
    rows, _ = load_splits(config)
    epochs = Epochs(config, rows, training=True, vocabulary=build_vocabulary(rows, config.data))
    seen = 0
    for batch in epochs.one_pass():
        frames, tokens = batch["mel"].shape[1], batch["tokens"].shape[1]
        for mel_length, text_length in zip(batch["mel_length"].numpy(), batch["text_length"].numpy()):
            assert padded_shape(int(mel_length), int(text_length), config) == (frames, tokens)
            seen += 1
    assert seen >= 6


def test_route_rates_count_the_audio_of_full_batches(calibrated):
    # An epoch computes features only for the clips that reach a full batch, so that is the audio a
    # rate may count; every clip the length filter keeps (the old count) would overstate the supply.
    config, _, record = calibrated
    rows, _ = load_splits(config)
    kept = len(Epochs(config, rows, training=True, vocabulary=build_vocabulary(rows, config.data)).clip_lengths()[0])
    delivered = 3 * Epochs(config, rows, training=True, vocabulary=build_vocabulary(rows, config.data)).batches_per_epoch()
    assert delivered < kept  # this split leaves partial buckets, so the two counts differ
    for name, rate in record.routes.items():
        per_epoch = rate.audio_s_per_s * rate.seconds / rate.epochs
        # Which clips fill the dropped remainders changes every epoch, so only about the clips' share.
        assert 0.6 * delivered / kept < per_epoch / record.audio_seconds < 1.0, name


def test_a_second_call_reads_the_cache_and_other_settings_do_not(calibrated, monkeypatch):
    config, cache, record = calibrated
    monkeypatch.setattr(calibration, "_time_route", lambda *args: pytest.fail("timed again despite the cache"))
    assert host_calibration(config, cache=cache) == record
    windowed = dataclasses.replace(config, training=dataclasses.replace(config.training, decoder_window=64))
    assert record_key(record.corpus, record.cpu_model, calibration._settings(windowed, record.clips)) != record.key


def test_capacity_plan_utility_prints_the_plan_and_the_table(calibrated, demo_corpus, monkeypatch, capsys):
    config, cache, _ = calibrated
    monkeypatch.setenv("MYXTTS_CACHE_DIR", str(cache.directory.parent))
    (cache.directory.parent / "capacity").mkdir(exist_ok=True)
    for path in cache.directory.glob("*.json"):  # the module's record, where the utility's default cache looks
        (cache.directory.parent / "capacity" / path.name).write_text(path.read_text())
    monkeypatch.setattr(calibration, "_time_route", lambda *args: pytest.fail("timed again despite the cache"))
    spec = importlib.util.spec_from_file_location("capacity_plan", ROOT / "utilities" / "capacity_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    overrides = [item for override in OVERRIDES for item in ("--set", override)]
    assert module.main(["--train-data", str(demo_corpus), *overrides, "--gpu", "H100", "--gpu", "T4"]) == 0
    out = capsys.readouterr().out
    assert "Capacity plan: tiny model on NVIDIA H100 80GB HBM3 (H100), batch 3" in out
    assert "Capacity plan: tiny model on Tesla T4 (T4), batch 3" in out
    assert "cores: on the fly" in out and out.count("  -> tiny model on ") == 2
    assert out.count("8.3 us each  [measured on an H100 under XLA") == 2  # no card here: the H100's figure


def test_capacity_plan_utility_takes_the_loop_cost_a_run_measured_on_this_hosts_card(calibrated, demo_corpus,
                                                                                    monkeypatch, capsys):
    from myxtts.hardware import detect
    from myxtts.hardware.capacity import gpu_facts_for
    from myxtts.hardware.devices import device_by_key
    from myxtts.hardware.loop_cost import LoopCost, key_for, loop_cost_cache

    config, cache, _ = calibrated
    monkeypatch.setenv("MYXTTS_CACHE_DIR", str(cache.directory.parent))
    (cache.directory.parent / "capacity").mkdir(exist_ok=True)
    for path in cache.directory.glob("*.json"):
        (cache.directory.parent / "capacity" / path.name).write_text(path.read_text())
    h100 = gpu_facts_for(device_by_key("H100"))
    monkeypatch.setattr(detect, "detect_machine", lambda: detect.MachineFacts(gpus=(h100,), usable_cpu_cores=16))
    # What a training run's start measured on this host's H100 (16 frames per iteration, XLA).
    loop_cost_cache(cache.directory.parent / "loops").store(
        key_for(h100.name, 16, True), LoopCost(12.5e-6, "measured on this H100 (test)"))
    spec = importlib.util.spec_from_file_location("capacity_plan", ROOT / "utilities" / "capacity_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    overrides = [item for override in OVERRIDES for item in ("--set", override)]
    assert module.main(["--train-data", str(demo_corpus), *overrides, "--gpu", "H100", "--gpu", "T4"]) == 0
    h100_plan, t4_plan = capsys.readouterr().out.split("Capacity plan: ")[1:3]
    assert "12.5 us each  [measured on this H100 (test)]" in h100_plan
    assert "8.3 us each  [measured on an H100 under XLA" in t4_plan  # a card this host does not have
    assert module.main(["--train-data", str(demo_corpus), *overrides, "--gpu", "H100", "--loop-iteration-us", "30"]) == 0
    assert "30.0 us each  [set by --loop-iteration-us]" in capsys.readouterr().out
