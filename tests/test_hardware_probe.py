"""Tests for myxtts.hardware.probe: memory fit, batch choice, the measuring loop and the JSON cache."""

from __future__ import annotations

import json
import logging

import pytest

from myxtts.hardware.probe import (
    ProbeCache,
    ProbeKey,
    ProbeOutOfMemory,
    ProbePoint,
    ProbeResult,
    candidate_batch_sizes,
    choose_batch,
    config_hash,
    default_cache_dir,
    fit_memory,
    is_out_of_memory,
    largest_fitting_batch,
    run_probe,
)

GIB = 2**30

# Synthesized points for a 24 GiB card (round numbers made up, not measured on a GPU): peak = 3 GiB +
# 1.25 GiB per sample, batch 20 ran out of memory.
SYNTHESIZED = [
    ProbePoint(4, int(8.0 * GIB), 40.0),
    ProbePoint(8, int(13.0 * GIB), 70.0),
    ProbePoint(12, int(18.0 * GIB), 73.0),
    ProbePoint(20, None, None),
]


def test_fit_recovers_the_line_and_ignores_oom_points():
    fit = fit_memory(SYNTHESIZED)
    assert fit.intercept == pytest.approx(3 * GIB)
    assert fit.slope == pytest.approx(1.25 * GIB)


def test_fit_is_least_squares_on_noisy_points():
    points = [ProbePoint(2, 10, 1.0), ProbePoint(4, 14, 1.0), ProbePoint(6, 22, 1.0)]
    fit = fit_memory(points)
    assert fit.slope == pytest.approx(3.0) and fit.intercept == pytest.approx(10 / 3)


def test_single_point_fit_goes_through_origin():
    fit = fit_memory([ProbePoint(8, 16 * GIB, 10.0)])
    assert (fit.intercept, fit.slope) == (0.0, 2 * GIB)


def test_largest_batch_under_ninety_percent_of_free():
    # 0.9 * 24 GiB = 21.6 GiB; (21.6 - 3) / 1.25 = 14.88 -> 14, below the OOM at 20.
    assert largest_fitting_batch(SYNTHESIZED, 24 * GIB) == 14
    # With more memory the fit would allow 30, but batch 20 ran out of memory: stay below it.
    assert largest_fitting_batch(SYNTHESIZED, 40 * GIB) == 19
    assert largest_fitting_batch(SYNTHESIZED, 40 * GIB, max_batch=16) == 16
    assert largest_fitting_batch(SYNTHESIZED, 3 * GIB) == 0


def test_choose_batch_needs_five_percent_gain():
    assert choose_batch([ProbePoint(8, 1, 100.0), ProbePoint(16, 1, 104.9)]) == 8
    assert choose_batch([ProbePoint(8, 1, 100.0), ProbePoint(16, 1, 105.0)]) == 16
    # Gains are measured against the current choice, so 4% + 4% adds up past the threshold.
    assert choose_batch([ProbePoint(8, 1, 100.0), ProbePoint(12, 1, 104.0), ProbePoint(16, 1, 108.2)]) == 16
    assert choose_batch(SYNTHESIZED) == 8  # 73 vs 70 at batch 12 is only +4.3%
    assert choose_batch([ProbePoint(4, 1, 50.0), ProbePoint(8, 1, 90.0), ProbePoint(16, 1, 200.0)], max_batch=8) == 8
    with pytest.raises(ValueError):
        choose_batch([ProbePoint(4, None, None)])


def test_oom_detection_without_tensorflow_types():
    class ResourceExhaustedError(Exception):
        pass

    assert is_out_of_memory(ResourceExhaustedError("x"))
    assert is_out_of_memory(RuntimeError("OOM when allocating tensor with shape[16,1024]"))
    assert is_out_of_memory(RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"))
    assert is_out_of_memory(ProbeOutOfMemory())
    assert not is_out_of_memory(ValueError("zoom level must be positive"))
    assert not is_out_of_memory(ValueError("shapes (3,) and (4,) are incompatible"))


def fake_measure(free_bytes, calls, intercept=3 * GIB, slope=1.25 * GIB, throughput=None):
    """A model whose peak is linear in the batch and which runs out of memory beyond free memory."""

    def measure(batch):
        calls.append(batch)
        peak = intercept + slope * batch
        if peak > free_bytes:
            raise ProbeOutOfMemory(f"batch {batch}")
        return peak, (throughput or {}).get(batch, 10.0 * batch)

    return measure


def test_run_probe_stops_at_first_oom():
    calls = []
    result = run_probe(fake_measure(16 * GIB, calls), [4, 8, 12, 16, 24], free_bytes=16 * GIB)
    # After 4 and 8 the fit predicts 18 GiB at batch 12, over 0.9 * 16 GiB: 12 is skipped, not crashed into.
    assert calls == [4, 8]
    assert result.memory_limit_batch == 9  # (14.4 - 3) / 1.25 = 9.1
    assert result.chosen_batch == 8


def test_run_probe_records_an_oom_point_and_chooses_by_throughput():
    calls = []
    # Peak accounting that reads 2 GiB low: the fit predicts batch 16 fits, the real run OOMs.
    measure = fake_measure(19 * GIB, calls, throughput={4: 40.0, 8: 70.0, 12: 72.0})

    def optimistic(batch):
        peak, samples = measure(batch)
        return peak - 2 * GIB, samples

    result = run_probe(optimistic, [4, 8, 12, 16], free_bytes=24 * GIB)
    assert calls == [4, 8, 12, 16]
    assert result.points[-1] == ProbePoint(16, None, None)
    assert result.memory_limit_batch == 15  # fit allows more, but 16 ran out of memory
    assert result.chosen_batch == 8  # 72 vs 70 at batch 12 is below the 5% bar
    assert "memory allows up to 15" in result.reason


def test_run_probe_lets_real_errors_through():
    def broken(batch):
        raise ValueError("shape mismatch in the model")

    with pytest.raises(ValueError, match="shape mismatch"):
        run_probe(broken, [2, 4], free_bytes=GIB)


def test_run_probe_when_nothing_fits():
    with pytest.raises(ProbeOutOfMemory, match="gradient_checkpointing"):
        run_probe(fake_measure(GIB, []), [1, 2], free_bytes=GIB)


def test_candidate_batch_sizes():
    assert candidate_batch_sizes(8, 32) == [4, 8, 12, 16, 24, 32]
    assert candidate_batch_sizes(16, 32) == [8, 16, 24, 32]
    assert candidate_batch_sizes(1, 32) == [1, 2, 3, 4]


def key(**changes):
    fields = dict(gpu_name="NVIDIA GeForce RTX 3090", total_memory_bytes=24 * GIB,
                  model_config={"d_model": 512, "layers": 8}, precision="mixed_bfloat16",
                  max_lengths={"mel_frames": 800, "text_tokens": 200})
    fields.update(changes)
    return ProbeKey.create(**fields)


def test_cache_round_trip_and_keying(tmp_path):
    cache = ProbeCache(tmp_path / "probe")
    result = ProbeResult(points=tuple(SYNTHESIZED), memory_limit_batch=14, chosen_batch=8, reason="test")
    assert cache.load(key()) is None
    path = cache.store(key(), result)
    assert path.parent == tmp_path / "probe" and json.loads(path.read_text())["result"]["chosen_batch"] == 8
    assert cache.load(key()) == result
    # Same setup written in another key order: same entry.
    assert cache.load(key(model_config={"layers": 8, "d_model": 512},
                          max_lengths={"text_tokens": 200, "mel_frames": 800})) == result
    other = ProbeResult(points=(ProbePoint(2, GIB, 5.0),), memory_limit_batch=2, chosen_batch=2, reason="other")
    cache.store(key(precision="mixed_float16"), other)  # a second setup gets its own entry
    assert cache.load(key()) == result and cache.load(key(precision="mixed_float16")) == other
    for change in ({"gpu_name": "NVIDIA A10"}, {"total_memory_bytes": 12 * GIB}, {"model_config": {"d_model": 768}},
                   {"precision": "float32"}, {"max_lengths": {"mel_frames": 1000, "text_tokens": 200}}):
        assert cache.load(key(**change)) is None, change


def test_damaged_cache_is_reported_and_ignored(tmp_path, caplog):
    cache = ProbeCache(tmp_path)
    cache.path_for(key()).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert cache.load(key()) is None
    assert "unreadable" in caplog.text


def test_default_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    assert default_cache_dir({"MYXTTS_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "myxtts"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir({}) == tmp_path / "home" / ".cache" / "myxtts"
    monkeypatch.delenv("MYXTTS_CACHE_DIR", raising=False)  # the suite sets it (conftest.py)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ProbeCache().directory == tmp_path / "xdg" / "myxtts" / "probe"


def test_config_hash_is_order_independent():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


@pytest.mark.parametrize("store", ["probe", "capacity"])
def test_two_runs_storing_one_cache_entry_at_once_both_succeed(store, tmp_path, monkeypatch):
    """Both wrote the entry beside itself under one name (".tmp"): the run renaming second found it
    gone and stopped at its start in FileNotFoundError (train_main.py: "error: [Errno 2] ...")."""
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    from myxtts.hardware.capacity_record import CapacityCache
    from tests.test_hardware_capacity import record

    if store == "probe":
        cache = ProbeCache(tmp_path / "probe")
        ours = (key(), ProbeResult(points=tuple(SYNTHESIZED), memory_limit_batch=14, chosen_batch=8, reason="ours"))
        theirs = (key(), ProbeResult(points=tuple(SYNTHESIZED), memory_limit_batch=14, chosen_batch=4, reason="theirs"))
    else:
        cache, ours, theirs = CapacityCache(tmp_path / "capacity"), (record(),), (record(),)
    other = ("import pickle, sys; cache, entry = pickle.loads(bytes.fromhex(sys.argv[1])); cache.store(*entry)")
    write_text, others = Path.write_text, []

    def another_run_meanwhile(self, *args, **kwargs):  # as ours is written, another process stores the same entry
        written = write_text(self, *args, **kwargs)
        if not others:
            others.append(subprocess.run([sys.executable, "-c", other, pickle.dumps((cache, theirs)).hex()],
                                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]))
        return written

    monkeypatch.setattr(Path, "write_text", another_run_meanwhile)
    path = cache.store(*ours)
    assert others[0].returncode == 0, others[0].stderr
    monkeypatch.undo()
    assert json.loads(path.read_text()) and sorted(p.name for p in path.parent.iterdir()) == [path.name]
    if store == "probe":
        assert cache.load(ours[0]) == ours[1]  # ours, renamed last
