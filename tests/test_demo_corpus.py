"""Tests for the sentence generator and the espeak-ng demo corpus builder.

The corpus tests synthesize a dozen utterances for real (about a second per build), since
what they guard, byte-identical audio, the WAV format and the phoneme timings, only shows in
real renderings.
"""

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from myxtts.data.demo_corpus import (
    MANIFEST_FILENAME,
    MAX_DURATION_S,
    MIN_DURATION_S,
    SAMPLE_RATE,
    STAMP_FILENAME,
    make_demo_corpus,
    total_audio_seconds,
)
from myxtts.data.manifest import read_manifest
from myxtts.data.phoneme_timing import phoneme_frames, read_timing, timing_path
from myxtts.data.phonemes import phonemize
from myxtts.data.sentences import generate_sentences, number_to_words, ordinal_to_words, year_to_words
from myxtts.data.text import split_symbols

NUM_UTTERANCES = 12


def _read_rows(corpus_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (corpus_dir / MANIFEST_FILENAME).read_text(encoding="utf-8").splitlines()]


def _file_bytes(corpus_dir: Path) -> dict[str, bytes]:
    return {str(path.relative_to(corpus_dir)): path.read_bytes() for path in sorted(corpus_dir.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_demo_corpus(tmp_path_factory.mktemp("demo") / "corpus", NUM_UTTERANCES, seed=0, progress=False)


def test_number_words_match_spoken_english():
    expected = {
        0: "zero", 13: "thirteen", 40: "forty", 42: "forty-two", 100: "one hundred",
        342: "three hundred and forty-two", 1005: "one thousand and five",
        2300: "two thousand three hundred", 999_999: "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
    }
    assert {number: number_to_words(number) for number in expected} == expected
    assert [ordinal_to_words(n) for n in (1, 2, 3, 12, 20, 23, 31)] == [
        "first", "second", "third", "twelfth", "twentieth", "twenty-third", "thirty-first",
    ]
    assert [year_to_words(y) for y in (1905, 1984, 2000, 2007, 2015)] == [
        "nineteen oh five", "nineteen eighty-four", "two thousand", "two thousand and seven", "twenty fifteen",
    ]
    with pytest.raises(ValueError, match="999,999"):
        number_to_words(1_000_000)


def test_sentence_generator_is_deterministic_digit_free_and_varied():
    sentences = generate_sentences(300, seed=0)
    assert sentences == generate_sentences(300, seed=0)
    assert sentences != generate_sentences(300, seed=1)
    assert all(sentence.strip() and sentence[0].isupper() for sentence in sentences)
    assert not any(character.isdigit() for sentence in sentences for character in sentence)
    assert all(sentence[-1] in ".?!" for sentence in sentences)
    assert "|" not in "".join(sentences)  # the metadata separator
    for mark in (",", "?", "!", "'"):
        assert any(mark in sentence for sentence in sentences), mark
    word_counts = [len(sentence.split()) for sentence in sentences]
    # Spoken at ~3 words/s, this spans about one to twelve seconds.
    assert min(word_counts) <= 3 and max(word_counts) >= 28
    assert sum(count <= 6 for count in word_counts) > 30 and sum(count >= 20 for count in word_counts) > 30
    assert len(set(sentences)) > 250


def test_corpus_layout_audio_format_and_text(corpus):
    rows = _read_rows(corpus)
    assert len(rows) == NUM_UTTERANCES
    assert all(set(row) == {"audio_path", "text", "speaker", "duration", "phonemes", "language"} for row in rows), rows
    ids = [f"demo_{index:04d}" for index in range(1, NUM_UTTERANCES + 1)]
    assert [row["audio_path"] for row in rows] == [f"wavs/{i}.wav" for i in ids]  # relative: the folder can move
    assert sorted(path.name for path in (corpus / "wavs").iterdir()) == sorted(
        [f"{i}.wav" for i in ids] + [f"{i}.timing.json" for i in ids])
    assert not (corpus / "metadata.csv").exists()
    speakers = {row["speaker"] for row in rows}
    assert len(speakers) >= 4 and all(re.fullmatch(r"spk_[a-z0-9_-]+", speaker) for speaker in speakers)
    texts = [row["text"] for row in rows]
    assert all(text.strip() for text in texts)
    assert not re.search(r"\d", "".join(texts))
    assert "," in "".join(texts) and re.search(r"[?!]", "".join(texts))
    # The phonemes are the front end's, for the corpus's language: what training and synthesis use.
    assert all(row["language"] == "en-us" and row["phonemes"] == phonemize(row["text"], "en-us") for row in rows)

    total = 0.0
    for row in rows:
        wav_path = corpus / row["audio_path"]
        info = soundfile.info(wav_path)
        assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16"), wav_path
        assert MIN_DURATION_S <= info.duration <= MAX_DURATION_S, (wav_path, info.duration)
        assert row["duration"] == pytest.approx(info.duration)
        samples, _ = soundfile.read(wav_path, dtype="int16")
        assert np.abs(samples).max() > 1000, f"{wav_path} is (nearly) silent"
        total += info.duration
    assert total_audio_seconds(corpus) == pytest.approx(total)
    stamp = json.loads((corpus / STAMP_FILENAME).read_text())
    assert (stamp["num_utterances"], stamp["seed"]) == (NUM_UTTERANCES, 0)
    assert stamp["total_seconds"] == pytest.approx(total, abs=1e-3)


def test_the_folder_reads_as_a_manifest_with_phonemes(corpus):
    utterances = read_manifest(corpus)
    assert len(utterances) == NUM_UTTERANCES
    assert all(Path(u.audio_path).is_absolute() and Path(u.audio_path).is_file() for u in utterances)
    assert all(u.phonemes and u.language == "en-us" and "ˈ" in u.phonemes for u in utterances)


def test_timing_frames_sum_to_each_clip_and_name_what_was_said(corpus):
    for row in _read_rows(corpus):
        wav_path = corpus / row["audio_path"]
        record = json.loads(timing_path(wav_path).read_text(encoding="utf-8"))
        num_samples = soundfile.info(wav_path).frames
        assert record["num_samples"] == num_samples and record["sample_rate"] == SAMPLE_RATE
        assert record["hop_length"] == 256 and record["num_frames"] == 1 + num_samples // 256
        assert len(record["phonemes"]) == len(record["start_samples"]) == len(record["frames"]) > 10
        assert sum(record["frames"]) == 1 + num_samples // 256, wav_path
        assert min(record["frames"]) >= 0
        starts = record["start_samples"]
        assert starts == sorted(starts) and 0 <= starts[0] and starts[-1] <= num_samples
        assert "_" in record["phonemes"] and all(record["phonemes"])  # pauses are named
        # Another hop: the counts still sum to that hop's frames.
        assert sum(read_timing(timing_path(wav_path)).frames(200)) == 1 + num_samples // 200
        # For the American voices (the corpus's phoneme language) the events are the manifest's
        # phoneme symbols one for one, pauses, stress marks, word spaces and punctuation aside:
        # what lets a learned alignment be scored phoneme by phoneme.
        if record["voice"].startswith("en-us"):
            spoken = [re.sub("[ˈˌ]", "", name) for name in record["phonemes"] if name != "_"]
            symbols = [re.sub("[ˈˌ]", "", s) for s in split_symbols(row["phonemes"], "phonemes") if s not in " ,.?!;:"]
            assert spoken == symbols, wav_path


def test_phoneme_frames_assign_each_frame_to_the_phoneme_at_its_centre():
    # hop 100, 1 + 950 // 100 = 10 frames centred on samples 0, 100, ..., 900.
    assert phoneme_frames([30, 250, 250, 700], 950, 100) == [3, 0, 4, 3]
    assert phoneme_frames([0], 99, 100) == [1]
    assert phoneme_frames([0, 960], 960, 100) == [10, 0]  # a last event at the very end: no frames
    with pytest.raises(ValueError, match="hop_length"):
        phoneme_frames([0], 10, 0)


def test_same_seed_is_byte_identical_whatever_the_worker_count(corpus, tmp_path):
    # One worker renders every utterance in sequence, two interleave them: identical bytes
    # prove that no espeak state leaks from one rendering into the next.
    single_worker = make_demo_corpus(tmp_path / "one", NUM_UTTERANCES, seed=0, progress=False, num_workers=1)
    assert _file_bytes(single_worker) == _file_bytes(corpus)


def test_different_seed_gives_different_corpus(corpus, tmp_path):
    other = make_demo_corpus(tmp_path / "other", NUM_UTTERANCES, seed=1, progress=False)
    assert [row["text"] for row in _read_rows(other)] != [row["text"] for row in _read_rows(corpus)]
    assert (other / "wavs" / "demo_0001.wav").read_bytes() != (corpus / "wavs" / "demo_0001.wav").read_bytes()


def test_second_call_is_a_no_op(corpus):
    mtimes = {path: path.stat().st_mtime_ns for path in corpus.rglob("*")}
    start = time.monotonic()
    assert make_demo_corpus(corpus, NUM_UTTERANCES, seed=0, progress=False) == corpus
    assert time.monotonic() - start < 1.0
    assert {path: path.stat().st_mtime_ns for path in corpus.rglob("*")} == mtimes


def test_failed_build_leaves_no_stamp_and_rebuilds_cleanly(tmp_path):
    out_dir = tmp_path / "corpus"
    make_demo_corpus(out_dir, 6, seed=0, progress=False)
    assert (out_dir / STAMP_FILENAME).is_file()

    # en-gb+m3 is rejected by the bundled espeak data: the error must name it, and the
    # stamp of the earlier build must not survive to vouch for a half-rewritten corpus.
    with pytest.raises(RuntimeError, match=re.escape("'en-gb+m3'")):
        make_demo_corpus(out_dir, 4, seed=0, progress=False, voices=("en-us", "en-gb+m3"))
    assert not (out_dir / STAMP_FILENAME).exists()

    make_demo_corpus(out_dir, 4, seed=0, progress=False)
    assert len(_read_rows(out_dir)) == 4
    assert sorted(path.name for path in (out_dir / "wavs").iterdir()) == sorted(
        f"demo_000{i}{suffix}" for i in range(1, 5) for suffix in (".wav", ".timing.json"))

    # A file deleted after the stamp was written is noticed and rebuilt.
    (out_dir / "wavs" / "demo_0002.wav").unlink()
    (out_dir / "wavs" / "demo_0003.timing.json").unlink()
    make_demo_corpus(out_dir, 4, seed=0, progress=False)
    assert soundfile.info(out_dir / "wavs" / "demo_0002.wav").samplerate == SAMPLE_RATE
    assert (out_dir / "wavs" / "demo_0003.timing.json").is_file()


def test_a_format_1_corpus_is_rebuilt_and_its_metadata_removed(tmp_path):
    out_dir = tmp_path / "corpus"
    (out_dir / "wavs").mkdir(parents=True)
    (out_dir / "metadata.csv").write_text("demo_0001|Old text.|Old text.|spk_en-us\n")
    (out_dir / STAMP_FILENAME).write_text(json.dumps({"format_version": 1, "num_utterances": 2, "seed": 0}))
    make_demo_corpus(out_dir, 2, seed=0, progress=False)
    assert not (out_dir / "metadata.csv").exists()  # it would be read instead of manifest.jsonl
    assert len(read_manifest(out_dir)) == 2


def test_other_voices_and_an_unknown_language(tmp_path):
    other = make_demo_corpus(tmp_path / "other", 2, seed=3, progress=False, voices=("en-us+f4", "en-us+m5"))
    assert {row["speaker"] for row in _read_rows(other)} == {"spk_en-us_f4", "spk_en-us_m5"}
    with pytest.raises(ValueError, match="language: 'xx-yy'"):
        make_demo_corpus(tmp_path / "bad", 2, progress=False, language="xx-yy")


def test_the_synthesis_workers_do_not_import_tensorflow():
    # Each worker process imports this module; with TensorFlow behind it (through text.py's
    # separator constant) every build paid ~5 s of imports per worker: 6.1 s for 2 clips, now 0.3 s.
    import subprocess
    import sys

    check = "import sys, myxtts.data.demo_corpus, myxtts.data.phonemes; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_an_out_that_is_a_file_or_cannot_be_written_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    from myxtts.data import demo_corpus
    from utilities import make_demo_corpus as tool

    a_file = tmp_path / "corpus.txt"
    a_file.write_text("not a folder")
    assert tool.main(["--out", str(a_file), "--num-utterances", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{a_file} is a file, not a folder" in err and "Traceback" not in err, err

    inside_a_file = a_file / "corpus"  # was a NotADirectoryError traceback
    assert tool.main(["--out", str(inside_a_file), "--num-utterances", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{a_file} is a file, so the folder cannot be made" in err and "Traceback" not in err, err

    def refused(out_dir, *args):  # a folder it may not write to (root may write anywhere: raised here)
        raise PermissionError(13, "Permission denied", str(out_dir / "wavs"))

    monkeypatch.setattr(demo_corpus, "_build", refused)
    assert tool.main(["--out", str(tmp_path / "locked"), "--num-utterances", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the corpus to {tmp_path / 'locked'}: Permission denied ({tmp_path / 'locked' / 'wavs'})" in err, err


def test_a_folder_holding_anything_a_build_did_not_write_is_refused_and_left_as_it_was(tmp_path, capsys):
    # `--out my_corpus` on a user's own corpus overwrote its manifest.jsonl with the demo's rows.
    from utilities import make_demo_corpus as tool

    mine = tmp_path / "mine"
    (mine / "wavs").mkdir(parents=True)
    (mine / "wavs" / "mine_0001.wav").write_bytes(b"RIFF a user's recording")
    (mine / "manifest.jsonl").write_text('{"audio_path": "wavs/mine_0001.wav", "text": "My words.", "speaker": "me"}\n')
    (mine / "notes.txt").write_text("my notes")
    before = {path: path.read_bytes() for path in mine.rglob("*") if path.is_file()}
    assert tool.main(["--out", str(mine), "--num-utterances", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (f"{mine} holds files no demo corpus build wrote (manifest.jsonl (rows of other clips), notes.txt, "
            "wavs/mine_0001.wav)") in err and "Traceback" not in err, err
    assert {path: path.read_bytes() for path in mine.rglob("*") if path.is_file()} == before

    (tmp_path / "empty").mkdir()  # an empty folder is the corpus's to fill
    assert len(read_manifest(make_demo_corpus(tmp_path / "empty", 2, seed=0, progress=False))) == 2
