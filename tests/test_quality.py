"""The sound-quality measures rank a recording, its Griffin-Lim copy and noise as they should."""

import numpy as np
import pytest

from myxtts.config import load_config
from myxtts.data.manifest import read_manifest
from myxtts.evaluation import quality


@pytest.fixture(scope="module")
def copy(demo_corpus):
    return quality.copy_synthesis(read_manifest(demo_corpus)[0].audio_path, load_config().data)


def _noise(like):
    return np.random.default_rng(0).normal(0.0, 0.1, like.shape).astype(np.float32)


def test_copy_synthesis_is_the_clip_and_its_vocoded_log_mel_of_one_length(copy):
    assert copy.recording.shape == copy.vocoded.shape and len(copy.recording) > copy.sample_rate  # over a second
    assert np.abs(copy.recording).max() == pytest.approx(load_config().data.peak_normalize, abs=1e-3)
    assert not np.allclose(copy.recording, copy.vocoded, atol=1e-3)  # Griffin-Lim does not give the clip back


def test_stoi_ranks_the_clip_its_copy_and_noise(copy):
    rate = copy.sample_rate
    itself, vocoded, noise = (quality.stoi(copy.recording, x, rate) for x in (copy.recording, copy.vocoded, _noise(copy.recording)))
    assert itself == pytest.approx(1.0, abs=1e-6)
    assert 0.8 < vocoded < itself and noise < 0.6, (vocoded, noise)


def test_dnsmos_scores_speech_above_noise(copy):
    speech, noise = quality.dnsmos(copy.recording, copy.sample_rate), quality.dnsmos(_noise(copy.recording), copy.sample_rate)
    assert set(speech) == {"ovrl", "sig", "bak", "p808"}
    assert speech["ovrl"] > noise["ovrl"] + 0.5 and speech["p808"] > noise["p808"] + 0.5, (speech, noise)


def test_pesq_ranks_the_copy_above_noise(copy):
    pytest.importorskip("pesq")  # optional: it compiles C sources at install (requirements-quality.txt)
    vocoded = quality.pesq_wb(copy.recording, copy.vocoded, copy.sample_rate)
    noise = quality.pesq_wb(copy.recording, _noise(copy.recording), copy.sample_rate)
    assert 1.0 <= noise < vocoded <= 4.65, (vocoded, noise)


def test_pesq_is_none_without_the_package(copy, monkeypatch):
    monkeypatch.setattr(quality, "pesq_available", lambda: False)
    assert quality.pesq_wb(copy.recording, copy.vocoded, copy.sample_rate) is None
    report = quality.QualityReport(1, 0.9, None, {"ovrl": 2, "sig": 3, "bak": 3, "p808": 3}, {"ovrl": 3, "sig": 3, "bak": 3, "p808": 3})
    assert "PESQ-WB not measured (pip install pesq)" in report.line()
