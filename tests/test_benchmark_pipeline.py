"""utilities/benchmark_pipeline.py: its baseline does the native pipeline's work, and a tiny run reports."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from myxtts.config import load_config
from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPOSITORY_ROOT / "utilities" / "benchmark_pipeline.py"


def load_script():
    spec = importlib.util.spec_from_file_location("benchmark_pipeline_cli", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baseline_builds_the_same_batches_as_the_native_pipeline(demo_corpus):
    # The speedup only means something if both sides compute the same thing: same clips in the same
    # buckets, same tokens, and features equal up to float rounding (librosa vs TensorFlow FFTs).
    config = load_config(overrides=["data.batch_size=4", "data.deterministic=true", "data.cache_features=false",
                                    "data.num_workers=2"])
    utterances = read_manifest(demo_corpus)[:16]
    vocabulary = build_vocabulary(utterances, config.data)
    native = list(build_dataset(config, utterances, training=True, vocabulary=vocabulary).as_numpy_iterator())
    baseline = list(load_script().baseline_epochs(config, utterances, vocabulary).one_pass().as_numpy_iterator())

    assert len(native) == len(baseline) >= 2
    for ours, theirs in zip(native, baseline):
        assert set(ours) == set(theirs)
        for key in ("mel_length", "tokens", "text_length", "reference_length"):
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
        for key in ("mel", "reference_mel"):
            assert ours[key].shape == theirs[key].shape, key
            error = np.linalg.norm(ours[key] - theirs[key]) / np.linalg.norm(theirs[key])
            assert error < 1e-3, (key, error)


@pytest.mark.slow
def test_tiny_run_reports_positive_rates_as_json(demo_corpus):
    # `--cores all` skips the one-core runs: three fresh TensorFlow processes instead of six keeps
    # this near half a minute.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--corpus", str(demo_corpus), "--json", "--limit", "16", "--epochs", "1",
         "--batch-size", "4", "--cores", "all"],
        capture_output=True, text=True, timeout=240, cwd=REPOSITORY_ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("native_utt_per_s", "baseline_utt_per_s", "cached_utt_per_s", "native_audio_s_per_s",
                "speedup_vs_baseline", "cached_speedup_vs_baseline"):
        assert report[key] > 0, key
    assert report["same_clips_on_every_side"] and report["utterances"] == 16
    (column,) = report["by_cores"].values()
    for measurement in ("native", "baseline", "cached"):
        assert len(column[measurement]["epoch_seconds"]) == 1
        assert column[measurement]["utterances_per_epoch"] > 0
    assert report["machine"]["cpu_model"] and report["machine"]["tensorflow"]


def test_missing_corpus_says_how_to_build_the_demo(tmp_path, capsys):
    assert load_script().main(["--corpus", str(tmp_path / "nowhere")]) == 2
    assert "utilities/make_demo_corpus.py --out" in capsys.readouterr().err
