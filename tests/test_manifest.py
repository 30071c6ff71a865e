"""Tests for myxtts.data.manifest: LJSpeech and JSONL parsing, strict errors, the train/val split."""

from __future__ import annotations

import json
import os

import pytest

from myxtts.data.manifest import (
    ManifestError,
    Utterance,
    iter_manifest_rows,
    read_manifest,
    split_train_val,
    write_jsonl,
)


def write_ljspeech(folder, content: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wavs").mkdir(exist_ok=True)
    (folder / "metadata.csv").write_bytes(content)
    return folder


AWKWARD_TEXTS = [
    'He said, "I can\'t," and left.',
    "Café crème, señor — “quoted” text…",
    "Commas, commas, and more, commas",
    '"Starts and ends with quotes"',
]


def test_ljspeech_awkward_text_survives_byte_for_byte(tmp_path):
    corpus = tmp_path / "MyCorpus"
    rows = [f"utt{i}|raw {i}|{text}" for i, text in enumerate(AWKWARD_TEXTS)]
    write_ljspeech(corpus, ("\n".join(rows) + "\n").encode("utf-8"))

    utterances = read_manifest(corpus)

    assert [u.text for u in utterances] == AWKWARD_TEXTS
    assert [u.audio_path for u in utterances] == [
        str(corpus / "wavs" / f"utt{i}.wav") for i in range(len(AWKWARD_TEXTS))
    ]
    assert all(os.path.isabs(u.audio_path) for u in utterances)
    # Without a 4th field the speaker is the corpus folder's name.
    assert {u.speaker for u in utterances} == {"MyCorpus"}
    assert all(u.duration_s is None for u in utterances)


def test_ljspeech_bom_crlf_blank_lines_and_metadata_file_path(tmp_path):
    corpus = tmp_path / "c"
    content = "\ufeffa|Raw one.|Normalized one.\r\n\r\nb|Only raw, “text”.|\r\n   \r\nc|x|y".encode("utf-8")
    write_ljspeech(corpus, content)

    from_folder = read_manifest(corpus)
    from_file = read_manifest(corpus / "metadata.csv")

    assert from_folder == from_file
    assert [u.text for u in from_folder] == ["Normalized one.", "Only raw, “text”.", "y"]
    # The BOM must not end up in the first id, i.e. the first path.
    assert from_folder[0].audio_path == str(corpus / "wavs" / "a.wav")
    # Line numbers count blank lines, as an editor shows them.
    assert [row.line for row in iter_manifest_rows(corpus)] == [1, 3, 5]


def test_ljspeech_fourth_field_is_the_speaker(tmp_path):
    corpus = write_ljspeech(tmp_path / "multi", b"a|t|n|alice\nb|t|n| bob \nc|t|n\n")
    assert [u.speaker for u in read_manifest(corpus)] == ["alice", "bob", "multi"]


@pytest.mark.parametrize(
    "bad_row, needle",
    [
        ("only|two", "found 2"),
        ("a|b|c|d|e", "found 5"),
        ("a|text with | pipe|norm|spk|x", "found 6"),
        ("|text|norm", "id"),
        ("a|text|norm|   ", "speaker"),
    ],
)
def test_ljspeech_malformed_row_names_file_and_line(tmp_path, bad_row, needle):
    corpus = write_ljspeech(tmp_path / "c", f"ok|fine|fine\n\n{bad_row}\nok2|fine|fine\n".encode())
    with pytest.raises(ManifestError) as caught:
        read_manifest(corpus)
    message = str(caught.value)
    assert str(corpus / "metadata.csv") in message
    assert "line 3" in message
    assert needle in message
    assert caught.value.line == 3


def test_ljspeech_empty_transcript_is_an_error(tmp_path):
    corpus = write_ljspeech(tmp_path / "c", b"a|t|n\nb| | \n")
    with pytest.raises(ManifestError, match=r"line 2: .*empty"):
        read_manifest(corpus)


def test_undecodable_utf8_names_line(tmp_path):
    corpus = write_ljspeech(tmp_path / "c", b"a|fine|fine\nb|caf\xe9 latin-1|caf\xe9\n")
    with pytest.raises(ManifestError, match=r"line 2: not valid UTF-8 \(byte 0xe9"):
        read_manifest(corpus)
    # The lenient iterator still names the audio the bad row belongs to.
    rows = list(iter_manifest_rows(corpus))
    assert rows[0].utterance is not None
    assert rows[1].problem.reason == "undecodable_text"
    assert rows[1].problem.audio_path == str(corpus / "wavs" / "b.wav")


def test_lenient_rows_report_every_problem_with_line_numbers(tmp_path):
    corpus = write_ljspeech(tmp_path / "c", b"a|t|n\nbroken\nc||\na|again|again\nd|t|n\n")
    rows = list(iter_manifest_rows(corpus))
    summary = [(row.line, row.problem.reason if row.problem else "ok") for row in rows]
    assert summary == [(1, "ok"), (2, "malformed_row"), (3, "empty_text"), (4, "duplicate_row"), (5, "ok")]
    assert "line 1" in rows[3].problem.detail


def test_empty_manifest_is_an_error(tmp_path):
    corpus = write_ljspeech(tmp_path / "c", b"\n\n")
    with pytest.raises(ManifestError, match="no rows"):
        read_manifest(corpus)


def test_unknown_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_manifest(tmp_path / "nope")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ManifestError, match="metadata.csv"):
        read_manifest(tmp_path / "empty_dir")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ManifestError, match="unknown manifest type"):
        read_manifest(tmp_path / "notes.txt")


def test_jsonl_paths_speakers_durations_and_extra_keys(tmp_path):
    folder = tmp_path / "set1"
    folder.mkdir()
    absolute = tmp_path / "elsewhere" / "x.flac"
    lines = [
        {"audio_path": "clips/a.wav", "text": "Relative, “path”.", "extra": [1, 2]},
        {"audio_path": str(absolute), "text": "Absolute", "speaker": "spk", "duration": 1.5},
        {"audio_path": "../up.wav", "text": "Up", "duration": 2, "speaker": None},
    ]
    manifest = folder / "list.jsonl"
    manifest.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n\n", encoding="utf-8")

    utterances = read_manifest(manifest)

    assert utterances == [
        Utterance(str(folder / "clips" / "a.wav"), "Relative, “path”.", "set1", None),
        Utterance(str(absolute), "Absolute", "spk", 1.5),
        Utterance(str(tmp_path / "up.wav"), "Up", "set1", 2.0),
    ]


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"audio_path": "a.wav", "text": "x"', "invalid JSON"),
        ('["a.wav", "x"]', "JSON object"),
        ('{"text": "x"}', "'audio_path' is missing"),
        ('{"audio_path": "a.wav"}', "'text' is missing"),
        ('{"audio_path": "a.wav", "text": null}', "'text' is null; write the transcript"),  # was "missing"
        ('{"audio_path": null, "text": "x"}', "'audio_path' is not a non-empty string"),
        ('{"audio_path": "a.wav", "text": 5}', "'text' must be a string"),
        ('{"audio_path": "a.wav", "text": "  "}', "'text' is empty"),
        ('{"audio_path": "a.wav", "text": "x", "duration": -1}', "'duration'"),
        ('{"audio_path": "a.wav", "text": "x", "duration": true}', "'duration'"),
        ('{"audio_path": "a.wav", "text": "x", "speaker": ""}', "'speaker'"),
        ('{"audio_path": "a.wav", "text": "x", "phonemes": " "}', "'phonemes' must be a non-empty string"),
        ('{"audio_path": "a.wav", "text": "x", "phonemes": "ɛks", "language": 1}', "'language' must be"),
        ('{"audio_path": "a.wav", "text": "x", "language": "en-us"}', "'language' without 'phonemes'"),
    ],
)
def test_jsonl_errors_name_file_line_and_key(tmp_path, line, needle):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"audio_path": "ok.wav", "text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ManifestError) as caught:
        read_manifest(manifest)
    assert f"{manifest}, line 2" in str(caught.value)
    assert needle in str(caught.value)


def test_write_jsonl_round_trips_non_ascii(tmp_path):
    utterances = [
        Utterance(str(tmp_path / "a.wav"), "Señor “x” — it's, \"quoted\"", "spk", 1.25),
        Utterance(str(tmp_path / "b.wav"), "plain", "spk2", None),
        Utterance(str(tmp_path / "c.wav"), "Hello, world!", "spk2", 1.0, "həlˈoʊ, wˈɜːld!", "en-us"),
        Utterance(str(tmp_path / "d.wav"), "by hand", "spk2", 1.0, "baɪ hænd", None),
    ]
    path = tmp_path / "out" / "manifest.jsonl"
    write_jsonl(utterances, path)

    raw = path.read_text(encoding="utf-8")
    assert "Señor “x” —" in raw and "həlˈoʊ" in raw  # ensure_ascii=False: readable, not \\u escapes
    assert set(json.loads(raw.splitlines()[0])) == {"audio_path", "text", "speaker", "duration"}
    assert set(json.loads(raw.splitlines()[2])) == {"audio_path", "text", "speaker", "duration", "phonemes", "language"}
    assert read_manifest(path) == utterances
    assert read_manifest(path.parent) == utterances  # a prepared folder is a valid input too


def make_utterances(count, speaker="spk"):
    return [Utterance(f"/data/{speaker}/wavs/utt{i:04d}.wav", f"text {i}", speaker) for i in range(count)]


def test_split_is_deterministic_disjoint_and_order_preserving():
    utterances = make_utterances(400)
    train, val = split_train_val(utterances, 0.1, seed=3)
    assert (train, val) == split_train_val(list(utterances), 0.1, seed=3)
    assert len(train) + len(val) == 400
    assert set(train).isdisjoint(val)
    assert 20 <= len(val) <= 60  # about 10 %
    assert train == [u for u in utterances if u in set(train)]
    # Another seed gives another split.
    assert split_train_val(utterances, 0.1, seed=4)[1] != val


def test_split_is_stable_when_rows_are_added_or_moved():
    utterances = make_utterances(300)
    _, val = split_train_val(utterances, 0.1, seed=0)
    _, val_more = split_train_val(utterances + make_utterances(300, speaker="other"), 0.1, seed=0)
    assert set(val) <= set(val_more)
    # The decision does not depend on the folder or the extension (a FLAC converted to WAV
    # elsewhere stays on its side), nor on the row order.
    moved = [Utterance(u.audio_path.replace("/data/spk/wavs/", "/mnt/x/audio/").replace(".wav", ".flac"),
                       u.text, u.speaker) for u in utterances]
    _, val_moved = split_train_val(list(reversed(moved)), 0.1, seed=0)
    assert sorted(os.path.basename(u.audio_path)[:-5] for u in val_moved) == sorted(
        os.path.basename(u.audio_path)[:-4] for u in val
    )


def test_split_val_never_empty_and_train_never_empty():
    for count in (2, 3, 5):
        train, val = split_train_val(make_utterances(count), 0.001, seed=0)
        assert len(val) == 1 and len(train) == count - 1
    train, val = split_train_val(make_utterances(2), 0.99, seed=0)
    assert len(train) == 1 and len(val) == 1
    assert split_train_val(make_utterances(1), 0.5, seed=0)[0] == make_utterances(1)
    assert split_train_val(make_utterances(10), 0.0, seed=0) == (make_utterances(10), [])
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(make_utterances(10), 1.0, seed=0)
