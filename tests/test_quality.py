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


def test_copy_synthesis_of_many_clips_says_how_far_it_is(demo_corpus, monkeypatch, capsys):
    """A clip costs seconds on a CPU (DNSMOS, PESQ, 32 Griffin-Lim iterations): train_vocoder.py's closing
    measure and free_running_check.py --quality went silent for minutes over a validation split."""
    monkeypatch.setattr(quality, "dnsmos", lambda samples, rate: {"ovrl": 3.0, "sig": 3.0, "bak": 3.0, "p808": 3.0})
    data, paths = load_config().data, [row.audio_path for row in read_manifest(demo_corpus)[:2]]
    noise = np.random.default_rng(0).normal(0, 0.1, data.hop_length * 2000).astype(np.float32)
    quality.measure_copy_synthesis(paths, data, vocoder=lambda log_mel: noise[: data.hop_length * len(log_mel)],
                                   label="noise")
    assert "noise copy-synthesis: 2/2 clips" in capsys.readouterr().err
    quality.measure_copy_synthesis(paths[:1], data, vocoder=lambda log_mel: noise[: data.hop_length * len(log_mel)])
    assert capsys.readouterr().err == ""  # no label, no line (a caller that prints its own)


def test_measure_quality_puts_a_vocoder_beside_griffin_lim_on_the_same_clips(demo_corpus, tmp_path, capsys, monkeypatch):
    from conftest import make_vocoder_folder
    from utilities import measure_quality

    # The measures themselves are tested above; this checks what the tool hands them (the real
    # measurement of one clip by two vocoders costs ~30 s here).
    calls, labels = [], []

    def measure(paths, data_config, vocoder=None, label=None, scorer=None, texts=None, recordings=None):
        calls.append((list(paths), vocoder, recordings))
        labels.append(label)
        assert scorer is None and texts is None  # without --wer
        return quality.QualityReport(len(paths), 0.9 + 0.01 * len(calls), None, *[{"ovrl": 2, "sig": 3, "bak": 3, "p808": 3}] * 2)

    monkeypatch.setattr(quality, "measure_copy_synthesis", measure)
    expected = make_vocoder_folder(load_config().data, tmp_path / "vocoder")
    report = tmp_path / "quality.json"
    assert measure_quality.main(["--corpus", str(demo_corpus), "--clips", "3", "--vocoder", str(tmp_path / "vocoder"),
                                 "--json", str(report)]) == 0
    (gl_paths, gl, gl_recordings), (vocoder_paths, vocoder, vocoder_recordings) = calls
    assert gl is None and gl_paths == vocoder_paths and len(gl_paths) == 3  # Griffin-Lim and the vocoder, same clips
    assert isinstance(gl_recordings, quality.RecordingScores) and vocoder_recordings is gl_recordings  # scored once
    assert labels == ["Griffin-Lim", str(tmp_path / "vocoder")]  # each measure's progress line names its vocoder
    log_mel = np.random.default_rng(0).normal(-4, 1, (20, load_config().data.n_mels)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(vocoder(log_mel)), np.asarray(expected(log_mel[None])[0]), atol=1e-5)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" copy-synthesis")[0] for line in lines] == ["Griffin-Lim", str(tmp_path / "vocoder")]
    written = __import__("json").loads(report.read_text())
    assert written["clips"] == gl_paths
    assert {name: r["stoi"] for name, r in written["vocoders"].items()} == {"Griffin-Lim": 0.91, str(tmp_path / "vocoder"): 0.92}


def test_the_copies_words_are_counted_against_the_clips_texts(demo_corpus):
    from myxtts.evaluation.intelligibility import IntelligibilityScorer, normalize_text, word_error_rate

    class Recognizer:  # hears "the" in every copy and the whole sentence in every recording
        unpronounceable = ()

        def transcribe(self, audio, sample_rate):
            heard.append(len(audio))
            return normalize_text(texts[0]) if len(heard) % 2 == 0 else "the"

    heard = []
    rows = read_manifest(demo_corpus)[:1]
    texts = [rows[0].text]
    scorer = IntelligibilityScorer(texts, "en-us", workers=1)
    scorer.recognizer = Recognizer()
    report = quality.measure_copy_synthesis([rows[0].audio_path], load_config().data, scorer=scorer, texts=texts)
    assert report.wer == pytest.approx(word_error_rate(texts, ["the"])) and report.wer > 0.5
    assert report.wer_recordings == pytest.approx(0.0, abs=1e-9) and len(heard) == 2
    assert f"WER {report.wer:.3f} (the recordings 0.000)" in report.line()


def test_several_vocoders_score_the_recordings_once(demo_corpus, monkeypatch):
    from myxtts.evaluation.intelligibility import IntelligibilityScorer

    class Recognizer:
        unpronounceable = ()

        def transcribe(self, audio, sample_rate):
            heard.append(len(audio))
            return "the"

    scored = []
    monkeypatch.setattr(quality, "dnsmos", lambda samples, rate: scored.append(len(samples)) or
                        {"ovrl": 3.0, "sig": 3.0, "bak": 3.0, "p808": float(len(scored))})
    heard, rows = [], read_manifest(demo_corpus)[:2]
    paths, texts = [row.audio_path for row in rows], [row.text for row in rows]
    scorer = IntelligibilityScorer(texts, "en-us", workers=1)
    scorer.recognizer = Recognizer()
    recordings, data = quality.RecordingScores(), load_config().data
    first = quality.measure_copy_synthesis(paths, data, scorer=scorer, texts=texts, recordings=recordings)
    assert len(scored) == 4 and len(heard) == 4  # two copies and two recordings
    noise = np.random.default_rng(0).normal(0, 0.1, data.hop_length * 2000).astype(np.float32)
    second = quality.measure_copy_synthesis(paths, data, vocoder=lambda log_mel: noise[: data.hop_length * len(log_mel)],
                                            scorer=scorer, texts=texts, recordings=recordings)
    assert len(scored) == 6 and len(heard) == 6  # only the two new copies
    assert second.dnsmos_recordings == first.dnsmos_recordings and second.wer_recordings == first.wer_recordings
    assert set(recordings.dnsmos) == set(paths)


def test_measure_quality_with_wer_hands_a_recognizer_of_the_corpus_and_each_clips_text(demo_corpus, monkeypatch, capsys):
    from myxtts.evaluation import intelligibility
    from utilities import measure_quality

    built, handed = [], []
    monkeypatch.setattr(intelligibility, "Recognizer", lambda sentences: built.append(list(sentences)) or "recognizer")

    def measure(paths, data_config, vocoder=None, label=None, scorer=None, texts=None, recordings=None):
        handed.append((list(paths), scorer.recognizer, texts))
        return quality.QualityReport(len(paths), 0.9, None, *[{"ovrl": 2, "sig": 3, "bak": 3, "p808": 3}] * 2, 0.1, 0.0)

    monkeypatch.setattr(quality, "measure_copy_synthesis", measure)
    assert measure_quality.main(["--corpus", str(demo_corpus), "--clips", "2", "--wer"]) == 0
    rows = read_manifest(demo_corpus)
    (paths, recognizer, texts), = handed
    assert built == [[row.text for row in rows]] and recognizer == "recognizer"
    assert texts == [next(row.text for row in rows if row.audio_path == path) for path in paths]
    assert "WER 0.100 (the recordings 0.000)" in capsys.readouterr().out


def test_measure_quality_refuses_a_vocoder_of_other_features_before_measuring(demo_corpus, tmp_path, capsys):
    import dataclasses

    from conftest import make_vocoder_folder
    from utilities import measure_quality

    make_vocoder_folder(dataclasses.replace(load_config().data, n_mels=64), tmp_path / "vocoder")
    assert measure_quality.main(["--corpus", str(demo_corpus), "--vocoder", str(tmp_path / "vocoder")]) == 2
    captured = capsys.readouterr()
    assert "data.n_mels: vocoder 64, run 80" in captured.err and captured.out == ""


def test_the_spectrum_mixes_give_the_clip_back_and_a_true_phase_beats_griffin_lims(copy):
    from myxtts.models.vocoder import Vocoder

    data = load_config().data
    untrained = Vocoder(data, size="tiny")  # speaks the prior magnitude at phase zero
    mixes = quality.spectrum_mixes(copy.recording, data, vocoder=untrained)
    assert set(mixes) == {f"{m} magnitude, {p} phase" for m in ("prior", "true", "vocoder") for p in ("Griffin-Lim", "true")} | {
        f"{m} magnitude, vocoder phase" for m in ("prior", "true", "vocoder")}
    itself = mixes["true magnitude, true phase"]
    np.testing.assert_allclose(itself, copy.recording[: len(itself)], atol=1e-4)
    np.testing.assert_allclose(mixes["vocoder magnitude, true phase"], mixes["prior magnitude, true phase"], atol=1e-3)

    def score(name):
        return quality.stoi(copy.recording[: len(mixes[name])], mixes[name], copy.sample_rate)

    # The mel's own magnitude with the clip's phase beats it with Griffin-Lim's (0.995 against 0.966 on 10 demo clips).
    assert score("prior magnitude, true phase") > score("prior magnitude, Griffin-Lim phase") + 0.01


def test_magnitude_or_phase_names_a_missing_corpus_and_vocoder(demo_corpus, tmp_path, capsys):
    from utilities import magnitude_or_phase

    missing = tmp_path / "no_corpus"
    assert magnitude_or_phase.main(["--corpus", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "Traceback" not in err, err
    assert magnitude_or_phase.main(["--corpus", str(demo_corpus), "--vocoder", str(tmp_path / "no_vocoder")]) == 2
    err = capsys.readouterr().err
    assert "no_vocoder is not a vocoder folder" in err, err
