"""Tests for the intelligibility measure: word error arithmetic, the recognizer on real espeak-ng
speech against white noise, the English-only skip, and pronunciations for words the dictionary lacks.

The speech tests decode about a minute of audio in all (pocketsphinx, ~0.1 s per audio second).
"""

import os
import random
import wave
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest

from myxtts.data.demo_corpus import SAMPLE_RATE, EspeakEngine
from myxtts.data.manifest import read_manifest
from myxtts.data.sentences import generate_sentences
from myxtts.evaluation.intelligibility import (
    IntelligibilityScorer,
    Recognizer,
    default_workers,
    read_pcm16,
    normalize_text,
    score_intelligibility,
    skip_reason,
    utterance_word_errors,
    word_edits,
    word_error_rate,
)
from myxtts.evaluation.pronunciation import bundled_dictionary_path, pronunciations_for, read_dictionary


@pytest.fixture(scope="module")
def dictionary():
    return read_dictionary(bundled_dictionary_path())


def _read_wav(path):
    with wave.open(str(path), "rb") as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768.0, wav.getframerate()


# ------------------------------------------------------------------------------ word error arithmetic

def test_word_edits_on_textbook_cases():
    # One substitution (sat -> sit) and one deletion (the second "the"): 2 errors over 6 words.
    edits = word_edits("the cat sat on the mat".split(), "the cat sit on mat".split())
    assert (edits.substitutions, edits.deletions, edits.insertions, edits.errors) == (1, 1, 0, 2)
    assert word_edits("a b c".split(), "a x b c d".split()) == type(edits)(0, 0, 2)
    assert word_edits([], "a b".split()).errors == 2 and word_edits("a b".split(), []).errors == 2
    # "kitten" -> "sitting" is the classic distance 3 (two substitutions and an insertion).
    assert word_edits(list("kitten"), list("sitting")) == type(edits)(2, 0, 1)


def test_word_edits_match_a_brute_force_distance():
    def distance(a, b):  # the recursive definition, independent of the dynamic programme
        if not a or not b:
            return len(a) + len(b)
        return min(distance(a[1:], b) + 1, distance(a, b[1:]) + 1, distance(a[1:], b[1:]) + (a[0] != b[0]))

    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 6))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 6))]
        assert word_edits(a, b).errors == distance(a, b), (a, b)


def test_word_error_rate_pools_words_and_normalizes_both_sides():
    references = ["The cat sat on the mat.", "Can't stop!"]
    hypotheses = ["the cat sit on mat", "cant stop now"]
    # (2 + 2) / (6 + 2), not the mean of 2/6 and 2/2.
    assert word_error_rate(references, hypotheses) == pytest.approx(0.5)
    rows = utterance_word_errors(references, hypotheses)
    assert [(r.errors, r.words) for r in rows] == [(2, 6), (2, 2)]
    assert rows[0].rate == pytest.approx(1 / 3)
    assert word_error_rate(["Well, that's twenty-five!"], ["well that's twenty five"]) == 0.0
    assert normalize_text("\u201cRosa\u2019s o'clock,\u201d she said -- 'yes'.") == "rosa's o'clock she said yes"
    with pytest.raises(ValueError, match="no words"):
        word_error_rate(["..."], ["a"])
    with pytest.raises(ValueError, match="pair up"):
        word_error_rate(["a"], [])


# ---------------------------------------------------------------------------------- real speech

def test_recordings_score_low_and_white_noise_near_one(demo_corpus):
    utterances = read_manifest(demo_corpus)
    recognizer = Recognizer([u.text for u in utterances])  # the corpus's own 24 sentences
    clips = [(*_read_wav(u.audio_path), u.text) for u in utterances[:6]]
    speech = score_intelligibility(clips, recognizer)
    rng = np.random.default_rng(0)
    noise = score_intelligibility([(0.1 * rng.standard_normal(len(a)), rate, text) for a, rate, text in clips], recognizer)
    assert speech.wer <= 0.35, speech.rows
    assert noise.wer >= 0.9, noise.rows
    assert len(speech.rows) == 6 and speech.audio_seconds == pytest.approx(sum(len(a) / r for a, r, _ in clips))
    assert 0 < speech.seconds_per_audio_second < 1.0  # faster than real time, or it cannot run at every validation
    assert speech.summary().startswith(f"intelligibility: WER {speech.wer:.3f}")


def test_decoding_in_worker_processes_hears_what_one_process_hears(demo_corpus):
    utterances = read_manifest(demo_corpus)
    clips = [(*_read_wav(u.audio_path), u.text) for u in utterances[:4]]
    one = IntelligibilityScorer([u.text for u in utterances], workers=1)
    two = IntelligibilityScorer([u.text for u in utterances], workers=2)
    try:
        alone, beside = one.score(iter(clips)), two.score(iter(clips))  # a generator, as validation passes it
        assert two._pool is not None  # it did decode in processes
        again = two.score(clips)  # the processes are kept for the next validation
    finally:
        two.close()
    assert [r.hypothesis for r in beside.rows] == [r.hypothesis for r in alone.rows] == [r.hypothesis for r in again.rows]
    assert beside.wer == alone.wer and beside.audio_seconds == pytest.approx(alone.audio_seconds)
    assert beside.decode_seconds > 0 and two._pool is None
    with pytest.raises(ValueError, match="workers"):
        IntelligibilityScorer(["a sentence"], workers=0)
    # A process per 4 clips at most, up to the usable cores and 8: a few clips decode sooner in this one.
    cores = len(os.sched_getaffinity(0))
    assert default_workers(3) == 1 and default_workers(24) == min(cores, 6, 8) and default_workers() == min(cores, 8)

    # Processes that die (killed; a script without its main guard) cost the speed, not the validation.
    class Broken:
        def submit(self, *args):
            raise BrokenProcessPool("a process in the pool was terminated abruptly")

        def shutdown(self, **kwargs):
            pass

    two._pool = Broken()
    with pytest.warns(UserWarning, match="decoding processes failed"):
        fallen = two.score(iter(clips))
    assert [r.hypothesis for r in fallen.rows] == [r.hypothesis for r in alone.rows] and two.workers == 1


def test_read_pcm16_reads_as_soundfile_does_and_names_another_format(demo_corpus, tmp_path):
    import soundfile

    path = read_manifest(demo_corpus)[0].audio_path
    samples, rate = read_pcm16(path)
    expected, expected_rate = soundfile.read(path, dtype="float32")
    assert rate == expected_rate and np.array_equal(samples, expected)
    stereo = tmp_path / "stereo.wav"
    soundfile.write(stereo, np.zeros((100, 2), np.float32), 16_000, subtype="PCM_16")
    with pytest.raises(ValueError, match="stereo.wav: 16-bit mono WAV expected"):
        read_pcm16(stereo)
    # A damaged file or a missing one ended measure_recordings_wer.py in wave's EOFError traceback.
    (tmp_path / "stub.wav").write_bytes(b"x")
    (tmp_path / "text.wav").write_text("not audio, but long enough to hold a RIFF header")
    for name, message in (("stub.wav", "not a readable WAV file"), ("text.wav", "not a readable WAV file"),
                          ("missing.wav", "cannot be read")):
        with pytest.raises(ValueError, match=f"{name}: {message}"):
            read_pcm16(tmp_path / name)


def test_transcribe_resamples_and_checks_its_input(demo_corpus):
    utterance = read_manifest(demo_corpus)[1]
    recognizer = Recognizer([utterance.text, "something else entirely"])
    samples, rate = _read_wav(utterance.audio_path)
    assert rate == SAMPLE_RATE != 16_000
    import soxr

    at_16k = soxr.resample(samples, rate, 16_000)
    heard = recognizer.transcribe(samples, rate)
    assert heard == recognizer.transcribe(0.01 * at_16k, 16_000)  # level and rate do not matter
    assert word_error_rate([utterance.text], [heard]) <= 0.35
    assert recognizer.transcribe(np.zeros(0, np.float32), rate) == ""
    with pytest.raises(ValueError, match="mono"):
        recognizer.transcribe(np.zeros((100, 2), np.float32), rate)


# ------------------------------------------------------------------------------------- languages

@pytest.mark.parametrize("language", ["fa", "ko", "de", "cmn"])
def test_non_english_is_skipped_with_one_line(language):
    scorer = IntelligibilityScorer(["این یک جمله است"], language=language)
    result = scorer.score([(np.zeros(16_000, np.float32), 16_000, "این یک جمله است")])
    assert scorer.recognizer is None and result.wer is None
    summary = result.summary()
    assert "skipped" in summary and repr(language) in summary and "\n" not in summary


@pytest.mark.parametrize("language", ["en", "en-us", "en-gb", "en-gb-x-rp", "EN_US", "en-029"])
def test_english_codes_are_measured(language):
    assert skip_reason(language) is None


# -------------------------------------------------------------------------------- pronunciations

def test_every_word_of_the_demo_sentence_generator_is_in_the_dictionary(dictionary):
    words = {w for text in generate_sentences(3000, seed=0) for w in normalize_text(text).split()}
    result = pronunciations_for(words, dictionary)
    assert len(words) > 250 and result.unpronounceable == () and result.derived == {}
    assert {"neighbour", "harbour", "o'clock", "that's"} <= words


def test_missing_words_get_derived_pronunciations(dictionary):
    words = ["flavour", "organised", "sceptical", "modelled", "manoeuvre", "harbourmaster", "basket's", "janice's",
             "colourful", "sharnbrook", "zxqvy"]
    assert not set(words) & set(dictionary)  # all missing, or this test checks nothing
    result = pronunciations_for(words, dictionary, extra={"Sharnbrook": "sh aa r n b r uh k"})
    assert result.entries["flavour"] == dictionary["flavor"]
    assert result.entries["organised"] == dictionary["organized"]
    assert result.entries["sceptical"] == dictionary["skeptical"]
    assert result.entries["modelled"] == dictionary["modeled"]
    assert result.entries["manoeuvre"] == dictionary["maneuver"]  # two rewrites together
    assert result.entries["harbourmaster"] == [f"{dictionary['harbour'][0]} {dictionary['master'][0]}"]
    # The English -s ending: IH Z after a sibilant, S after another voiceless consonant, Z after a vowel.
    assert result.entries["janice's"] == [phones + " IH Z" for phones in dictionary["janice"]]
    assert result.entries["basket's"] == [phones + " S" for phones in dictionary["basket"]]
    assert pronunciations_for(["lucys"], dictionary).entries["lucys"] == [p + " Z" for p in dictionary["lucy"]]
    assert result.entries["sharnbrook"] == ["SH AA R N B R UH K"]
    assert result.unpronounceable == ("zxqvy",)


def test_a_word_missing_from_the_dictionary_is_still_recognized(tmp_path):
    sentences = ["The harbourmaster liked the flavour of the soup.", "A colourful boat stood near the old bridge.",
                 "Clara found a small lamp in the kitchen."]
    engine = EspeakEngine()
    pcm = np.frombuffer(engine.render("en-us", sentences[0])[0], "<i2").astype(np.float32) / 32768.0
    recognizer = Recognizer(sentences + ["The zxqvy sang."], directory=tmp_path)
    assert recognizer.unpronounceable == ("zxqvy",)
    assert "flavour" in (tmp_path / "corpus.dict").read_text() and "zxqvy" not in (tmp_path / "corpus.lm").read_text()
    heard = recognizer.transcribe(pcm, SAMPLE_RATE).split()
    assert "harbourmaster" in heard and "flavour" in heard, heard
    # A word with no pronunciation stays in the reference, counted as an error, and is reported.
    result = score_intelligibility([(pcm, SAMPLE_RATE, "The zxqvy sang.")], recognizer)
    assert result.rows[0].reference == "the zxqvy sang" and result.rows[0].errors >= 1
    assert "zxqvy" in result.summary()


def test_measure_recordings_wer_names_a_folder_without_a_manifest_and_a_damaged_clip(tmp_path, capsys):
    # It was a ManifestError traceback.
    from utilities import measure_recordings_wer

    assert measure_recordings_wer.main(["--corpus", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path}: folder has neither metadata.csv" in error and "Traceback" not in error, error
    # A damaged WAV in the corpus: one line naming it, not wave's EOFError traceback.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.wav").write_bytes(b"x")
    (corpus / "manifest.jsonl").write_text('{"audio_path": "a.wav", "text": "hi"}\n')
    assert measure_recordings_wer.main(["--corpus", str(corpus)]) == 2
    error = capsys.readouterr().err
    assert f"error: {corpus / 'a.wav'}: not a readable WAV file" in error and "Traceback" not in error, error


def test_measure_recordings_wer_counts_the_clips_of_each_row(demo_corpus, capsys, monkeypatch):
    """A whole corpus's row decodes every clip (about a second each on a CPU): the 400-clip demo's two
    took ten silent minutes. Each row now has its progress line (the recognizer is faked: the count is tested)."""
    import types

    from myxtts.config import load_config
    from myxtts.data.manifest import split_train_val
    from myxtts.evaluation import intelligibility
    from utilities import measure_recordings_wer

    def score(clips, recognizer):
        count = sum(1 for _ in clips)
        return types.SimpleNamespace(wer=0.0, rows=[], seconds_per_audio_second=0.0, count=count)

    monkeypatch.setattr(intelligibility, "score_intelligibility", score)
    monkeypatch.setattr(measure_recordings_wer, "_griffin_lim_of_recording", lambda d, n: lambda samples, rate: samples)
    assert measure_recordings_wer.main(["--corpus", str(demo_corpus)]) == 0
    error = capsys.readouterr().err
    config = load_config()
    val = len(split_train_val(read_manifest(demo_corpus), config.data.val_fraction, config.seed)[1])
    assert f"validation ({val}), white noise, training split only: {val}/{val} clips" in error, error
    assert "all (24), Griffin-Lim, all sentences: 24/24 clips" in error, error
