"""Tests for myxtts.data.prepare and utilities/prepare_dataset.py on real, deliberately broken files."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.prepare import prepare_dataset
from myxtts.data.wav_header import BadAudioFile, read_wav_header

RATE = 22050
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def tone(seconds, rate, channels=1, amplitude=0.5):
    """A chirp-ish test signal: [frames] or [frames, channels], each channel different."""
    t = np.arange(int(round(seconds * rate))) / rate
    columns = [amplitude * np.sin(2 * np.pi * (220 + 110 * c) * t * (1 + t)) for c in range(channels)]
    signal = np.stack(columns, axis=1).astype(np.float32)
    return signal[:, 0] if channels == 1 else signal


def write_wav(path, seconds=1.0, rate=RATE, channels=1, subtype="PCM_16", fmt=None, amplitude=0.5):
    soundfile.write(path, tone(seconds, rate, channels, amplitude), rate, subtype=subtype, format=fmt)


def build_corpus(folder: Path, rows: list[str]) -> Path:
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    (folder / "metadata.csv").write_bytes(b"".join(row.encode("utf-8") + b"\n" for row in rows))
    return folder


def read_rejections(path):
    with open(path, encoding="utf-8") as handle:
        header, *lines = handle.read().splitlines()
    assert header.split("\t") == ["line", "audio_path", "reason", "detail"]
    rows = [line.split("\t") for line in lines]
    assert all(len(row) == 4 and row[3] for row in rows)
    assert [int(row[0]) for row in rows] == sorted(int(row[0]) for row in rows)  # in manifest order
    return {int(row[0]): (row[1], row[2]) for row in rows}


@pytest.fixture
def broken_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    wavs = corpus / "wavs"
    wavs.mkdir(parents=True)
    write_wav(wavs / "good.wav", 1.0)
    (wavs / "not_audio.wav").write_text("this is a text file, not a RIFF header\n" * 20)
    write_wav(wavs / "cut.wav", 2.0)
    data = (wavs / "cut.wav").read_bytes()
    (wavs / "cut.wav").write_bytes(data[: len(data) // 2])  # header still claims 2 s
    soundfile.write(wavs / "cut_flac.flac", tone(2.0, 44100), 44100)
    data = (wavs / "cut_flac.flac").read_bytes()
    (wavs / "cut_flac.flac").write_bytes(data[: len(data) // 2])
    (wavs / "empty.wav").write_bytes(b"")
    write_wav(wavs / "no_frames.wav", 0.0)
    write_wav(wavs / "short.wav", 0.2)
    write_wav(wavs / "long.wav", 3.0)
    write_wav(wavs / "empty_text.wav")
    write_wav(wavs / "bad_text.wav")
    (corpus / "metadata.csv").write_bytes(
        b"good|Good, \"fine\" row.|Good, \"fine\" row.\n"   # 1
        b"missing|Missing file.|Missing file.\n"           # 2
        b"not_audio|Text file.|Text file.\n"               # 3
        b"cut|Truncated.|Truncated.\n"                     # 4
        b"empty|Empty file.|Empty file.\n"                 # 5
        b"no_frames|No frames.|No frames.\n"               # 6
        b"short|Too short.|Too short.\n"                   # 7
        b"long|Too long.|Too long.\n"                      # 8
        b"empty_text| | \n"                                # 9
        b"bad_text|caf\xe9|caf\xe9\n"                      # 10
        b"only|two fields\n"                               # 11
    )
    jsonl_row = {"audio_path": "wavs/cut_flac.flac", "text": "Cut FLAC."}
    (corpus / "extra.jsonl").write_text(json.dumps(jsonl_row) + "\n")
    return corpus


def test_every_reject_reason_on_real_files(broken_corpus, tmp_path, capsys):
    report = prepare_dataset(
        broken_corpus, tmp_path / "out", min_duration_s=0.5, max_duration_s=2.5, workers=1, progress=True
    )

    rejected = read_rejections(report.rejected_path)
    reasons = {line: reason for line, (_, reason) in rejected.items()}
    assert reasons == {
        2: "missing_file",
        3: "not_audio",
        4: "truncated",
        5: "zero_length",
        6: "zero_length",
        7: "too_short",
        8: "too_long",
        9: "empty_text",
        10: "undecodable_text",
        11: "malformed_row",
    }
    assert rejected[2][0] == str(broken_corpus / "wavs" / "missing.wav")
    assert rejected[10][0] == str(broken_corpus / "wavs" / "bad_text.wav")  # named although undecodable
    assert report.kept == 1 and report.rows == 11
    assert report.rejected_by_reason["zero_length"] == 2
    assert read_manifest(report.manifest_path) == [
        Utterance(str(broken_corpus / "wavs" / "good.wav"), 'Good, "fine" row.', "corpus", 1.0)
    ]
    captured = capsys.readouterr()
    assert "checking audio: 8/8 files" in captured.err
    assert "kept 1" in captured.out and "rejected too_long: 1" in captured.out

    # A truncated FLAC fails to decode partway; a header-vs-data check or a decode error
    # must catch it, never a silently shortened clip.
    flac_report = prepare_dataset(broken_corpus / "extra.jsonl", tmp_path / "out_flac", workers=1, progress=False)
    assert flac_report.kept == 0
    assert [r.reason for r in flac_report.rejections] in (["corrupt"], ["truncated"])
    assert not list((tmp_path / "out_flac").glob("audio/**/*.wav*"))  # no half-written output


@pytest.mark.skipif("MP3" not in soundfile.available_formats(), reason="libsndfile without MP3")
def test_cut_mp3_is_truncated_but_a_whole_one_is_kept(tmp_path):
    soundfile.write(tmp_path / "whole.mp3", tone(2.0, 44100), 44100, format="MP3")
    data = (tmp_path / "whole.mp3").read_bytes()
    (tmp_path / "cut.mp3").write_bytes(data[: len(data) // 2])  # the Xing header still says 2 s
    rows = [{"audio_path": "whole.mp3", "text": "a"}, {"audio_path": "cut.mp3", "text": "b"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    report = prepare_dataset(tmp_path / "m.jsonl", tmp_path / "out", workers=1, progress=False)

    assert report.kept == 1
    assert [(r.line, r.reason) for r in report.rejections] == [(2, "truncated")]


def test_wav_header_check_compares_claimed_and_held_frames(tmp_path):
    path = tmp_path / "a.wav"
    write_wav(path, 1.0)
    header = read_wav_header(str(path))
    assert (header.frames, header.sample_rate, header.channels) == (RATE, RATE, 1)
    assert header.decodable_by_tf(RATE) and not header.decodable_by_tf(16000)
    path.write_bytes(path.read_bytes()[:-2])  # one frame short
    with pytest.raises(BadAudioFile, match="holds only 22049") as caught:
        read_wav_header(str(path))
    assert caught.value.reason == "truncated"
    (tmp_path / "b.wav").write_bytes(b"not a wav")
    assert read_wav_header(str(tmp_path / "b.wav")) is None


@pytest.mark.parametrize(
    "change",
    [
        {"format_tag": 0xFFFE},  # WAVE_FORMAT_EXTENSIBLE: tf.audio.decode_wav wants tag 1
        {"fmt_chunk_size": 40},  # ... and a 16- or 18-byte fmt chunk
        {"bits_per_sample": 24},
        {"channels": 2, "block_align": 4},
        {"sample_rate": 44100},
        {"data_size": 2 * RATE + 1},  # not a whole number of frames
        {"layout_ok_for_tf": False},
    ],
)
def test_each_header_field_decides_whether_tf_can_decode(tmp_path, change):
    write_wav(tmp_path / "a.wav")
    header = read_wav_header(str(tmp_path / "a.wav"))
    assert header.decodable_by_tf(RATE)
    assert not dataclasses.replace(header, **change).decodable_by_tf(RATE)


def odd_chunk_wav(path):
    """A valid RIFF file with an odd-sized chunk before the data, which tf.audio.decode_wav misreads."""
    write_wav(path, 1.0)
    data = path.read_bytes()
    extra = b"LIST" + struct.pack("<I", 5) + b"INFOx" + b"\0"  # pad byte, as RIFF requires
    data = data[:36] + extra + data[36:]
    path.write_bytes(data[:4] + struct.pack("<I", len(data) - 8) + data[8:])


def rechunked_wav(path, before_fmt=b"", before_data=b"", after_data=b""):
    """A 1 s 16-bit WAV with these (whole, padded) chunks inserted around its "fmt " and "data"."""
    write_wav(path, 1.0)
    data = path.read_bytes()
    body = b"WAVE" + before_fmt + data[12:36] + before_data + data[36:] + after_data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def streamed_wav(path):
    """A 1 s 16-bit WAV whose RIFF and data sizes are 0xFFFFFFFF, as ffmpeg leaves them writing to a pipe."""
    write_wav(path, 1.0)
    data = path.read_bytes()
    path.write_bytes(data[:4] + b"\xff" * 4 + data[8:40] + b"\xff" * 4 + data[44:])


def list_chunk(text: bytes) -> bytes:
    return b"LIST" + struct.pack("<I", len(text)) + text + b"\0" * (len(text) % 2)  # pad byte, as RIFF requires


CONVERSIONS = {
    "flac_44k.flac": lambda p: soundfile.write(p, tone(1.0, 44100), 44100),
    "pcm24.wav": lambda p: write_wav(p, subtype="PCM_24"),
    "float.wav": lambda p: write_wav(p, subtype="FLOAT", amplitude=1.3),  # over full scale: must clip
    "stereo.wav": lambda p: write_wav(p, channels=2),
    "rate_44k.wav": lambda p: write_wav(p, rate=44100),
    "wavex.wav": lambda p: write_wav(p, fmt="WAVEX"),
    "odd_chunk.wav": odd_chunk_wav,
    # Legal RIFF that decode_wav refuses: a chunk it does not skip before "fmt ", and (the file not in
    # the canonical layout the pipeline reads without it) an odd-sized chunk after the data.
    "list_before_fmt.wav": lambda p: rechunked_wav(p, before_fmt=list_chunk(b"INFOISFT")),
    "odd_chunk_after.wav": lambda p: rechunked_wav(p, before_data=b"fact" + struct.pack("<II", 4, RATE),
                                                   after_data=list_chunk(b"INFOx")),
    "streamed.wav": streamed_wav,  # the samples run to the end of the file: not truncated
    "vorbis.ogg": lambda p: soundfile.write(p, tone(1.0, 48000), 48000),
}
if "MP3" in soundfile.available_formats():  # libsndfile >= 1.1 built with mpg123 and LAME
    CONVERSIONS["mpeg.mp3"] = lambda p: soundfile.write(p, tone(1.0, 44100), 44100, format="MP3")


def fingerprint(folder):
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_conversions_originals_and_rerun(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name, make in CONVERSIONS.items():
        make(source / name)
    write_wav(source / "compliant.wav")
    names = [*CONVERSIONS, "compliant.wav"]
    manifest = source / "list.jsonl"
    manifest.write_text("".join(json.dumps({"audio_path": n, "text": n}) + "\n" for n in names))
    before = fingerprint(source)
    out = tmp_path / "out"

    report = prepare_dataset(manifest, out, workers=2, progress=False)

    n = len(CONVERSIONS)
    assert (report.kept, report.converted, report.in_place, report.skipped_conversions) == (n + 1, n, 1, 0)
    assert report.workers == 2  # the conversions really ran in worker processes
    utterances = {os.path.basename(u.text): u for u in read_manifest(report.manifest_path)}
    assert utterances["compliant.wav"].audio_path == str(source / "compliant.wav")  # in place, no copy
    for name in CONVERSIONS:
        converted = utterances[name].audio_path
        assert converted == str(out / "audio" / (os.path.splitext(name)[0] + ".wav"))
        info = soundfile.info(converted)
        assert (info.format, info.subtype, info.channels, info.samplerate) == ("WAV", "PCM_16", 1, RATE), name
        assert read_wav_header(converted).decodable_by_tf(RATE)
        assert utterances[name].duration_s == pytest.approx(1.0, abs=0.01)
        assert utterances[name].duration_s == info.frames / RATE
    assert fingerprint(source) == before  # originals never modified

    # Against an independent reference: channel average, then soxr at the same quality.
    for name, rate in (("stereo.wav", RATE), ("rate_44k.wav", 44100), ("flac_44k.flac", 44100)):
        original, _ = soundfile.read(source / name, dtype="float32", always_2d=True)
        expected = soxr.resample(original.mean(axis=1), rate, RATE, quality="HQ")
        converted, _ = soundfile.read(utterances[name].audio_path, dtype="float32")
        np.testing.assert_allclose(converted, expected, atol=2.0 / 32768, err_msg=name)
    clipped, _ = soundfile.read(utterances["float.wav"].audio_path, dtype="float32")
    original, _ = soundfile.read(source / "float.wav", dtype="float32")
    assert original.max() > 1.2  # the case under test: samples beyond full scale
    np.testing.assert_allclose(clipped, np.clip(original, -1, 1), atol=2.0 / 32768)  # clipped, not wrapped

    # Rerun: every conversion is skipped, outputs untouched.
    outputs_before = fingerprint(out / "audio")
    rerun = prepare_dataset(manifest, out, workers=1, progress=False)
    assert (rerun.converted, rerun.skipped_conversions, rerun.in_place) == (0, n, 1)
    assert fingerprint(out / "audio") == outputs_before
    assert read_manifest(rerun.manifest_path) == read_manifest(report.manifest_path)
    assert f"{n} skipped as already converted" in rerun.summary()

    # A source edited after its conversion is converted again; so is everything at a new rate.
    stereo = source / "stereo.wav"
    os.utime(stereo, ns=(stereo.stat().st_atime_ns, os.stat(out / "audio" / "stereo.wav").st_mtime_ns + 10**9))
    assert prepare_dataset(manifest, out, workers=1, progress=False).converted == 1
    resampled = prepare_dataset(manifest, out, sample_rate=16000, workers=1, progress=False)
    assert (resampled.converted, resampled.in_place) == (n + 1, 0)
    assert soundfile.info(str(out / "audio" / "compliant.wav")).samplerate == 16000


def test_a_conversion_is_reused_only_for_the_source_it_was_made_from(tmp_path):
    """A conversion newer than its source was reused whatever it was made from: a second corpus
    prepared into the same --output (its own wavs/0001.wav, older) trained on the first one's audio,
    as did a source restored from a backup with its older mtime."""
    def corpus(name, amplitude, mtime_ns=None):
        folder = build_corpus(tmp_path / name, [f"0001|{name} speaking.|{name} speaking."])
        write_wav(folder / "wavs" / "0001.wav", rate=44100, amplitude=amplitude)  # needs converting
        if mtime_ns is not None:
            os.utime(folder / "wavs" / "0001.wav", ns=(mtime_ns, mtime_ns))
        return folder

    def heard(report):
        (row,) = read_manifest(report.manifest_path)
        samples, _ = soundfile.read(row.audio_path)
        return row.text, round(float(np.abs(samples).max()), 2)

    first = corpus("first", 0.5)
    second = corpus("second", 0.2, mtime_ns=first.joinpath("wavs", "0001.wav").stat().st_mtime_ns - 10**12)  # older
    out = tmp_path / "out"
    assert heard(prepare_dataset(first, out, workers=1, progress=False)) == ("first speaking.", 0.5)
    report = prepare_dataset(second, out, workers=1, progress=False)
    assert (report.converted, report.skipped_conversions) == (1, 0)
    assert heard(report) == ("second speaking.", 0.2)  # its own audio, not the first corpus's
    rerun = prepare_dataset(second, out, workers=1, progress=False)
    assert (rerun.converted, rerun.skipped_conversions) == (0, 1)  # its own conversion is still reused

    # The same source path, other audio restored with its older mtime (a backup, `cp -p`, `rsync -a`).
    source = second / "wavs" / "0001.wav"
    mtime_ns = source.stat().st_mtime_ns
    write_wav(source, rate=44100, amplitude=0.3)
    os.utime(source, ns=(mtime_ns - 10**12, mtime_ns - 10**12))
    again = prepare_dataset(second, out, workers=1, progress=False)
    assert (again.converted, heard(again)) == (1, ("second speaking.", 0.3))


def test_header_verdict_matches_tensorflow_and_every_output_decodes(tmp_path):
    tf = pytest.importorskip("tensorflow")

    def tf_decodes(path):
        try:
            audio, rate = tf.audio.decode_wav(tf.io.read_file(str(path)))
        except tf.errors.InvalidArgumentError:
            return None
        return tuple(audio.shape), int(rate)

    source = tmp_path / "src"
    source.mkdir()
    for name, make in CONVERSIONS.items():
        make(source / name)
    write_wav(source / "compliant.wav")
    for path in source.glob("*.wav"):
        header = read_wav_header(str(path))
        assert header.decodable_by_tf(RATE) == (tf_decodes(path) == ((RATE, 1), RATE)), path.name

    rows = [{"audio_path": p.name, "text": p.name} for p in sorted(source.iterdir())]
    (source / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare_dataset(source / "m.jsonl", tmp_path / "out", workers=1, progress=False)
    assert report.kept == len(rows)
    for utterance in read_manifest(report.manifest_path):
        assert tf_decodes(utterance.audio_path) == ((round(utterance.duration_s * RATE), 1), RATE)


def test_clashing_and_outside_names_do_not_overwrite(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    soundfile.write(source / "a.flac", tone(1.0, RATE), RATE)
    soundfile.write(source / "a.ogg", tone(1.0, RATE), RATE)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    soundfile.write(outside / "b.flac", tone(1.0, RATE), RATE)
    rows = [{"audio_path": "a.flac", "text": "x"}, {"audio_path": "a.ogg", "text": "y"},
            {"audio_path": str(outside / "b.flac"), "text": "z"}]
    (source / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    report = prepare_dataset(source / "m.jsonl", tmp_path / "out", workers=1, progress=False)

    paths = [u.audio_path for u in read_manifest(report.manifest_path)]
    assert len(set(paths)) == 3 and all(p.startswith(str(tmp_path / "out" / "audio")) for p in paths)
    assert paths[0].endswith("a.flac.wav") and paths[1].endswith("a.ogg.wav")


def load_cli():
    spec = importlib.util.spec_from_file_location("prepare_dataset_cli", REPOSITORY_ROOT / "utilities" / "prepare_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_exit_codes_and_config(tmp_path, capsys):
    cli = load_cli()
    assert cli.main(["--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err

    corpus = build_corpus(tmp_path / "bad", ["x|missing|missing"])
    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "o"), "--quiet"]) == 1
    assert "every one of the 1 rows was rejected (missing_file: 1)" in capsys.readouterr().err

    corpus = build_corpus(tmp_path / "ok", ["a|one|one", "b|two|two"])
    write_wav(corpus / "wavs" / "a.wav", 1.0)
    write_wav(corpus / "wavs" / "b.wav", 4.5)
    config = tmp_path / "config.yaml"
    config.write_text("data:\n  sample_rate: 16000\n  min_duration_s: 0.3\n  max_duration_s: 4.0\n")
    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "o"), "--config", str(config),
                     "--workers", "1", "--quiet"]) == 0
    assert capsys.readouterr().out == ""  # --quiet
    (kept,) = read_manifest(tmp_path / "o")
    assert soundfile.info(kept.audio_path).samplerate == 16000  # the config's rate, not the default
    assert read_rejections(tmp_path / "o" / "rejected.tsv")[2][1] == "too_long"


def test_demo_corpus_is_used_in_place(demo_corpus, tmp_path):
    report = prepare_dataset(demo_corpus, tmp_path / "out", workers=1, progress=False)
    assert (report.rows, report.kept, report.in_place, report.converted) == (24, 24, 24, 0)
    prepared = read_manifest(report.manifest_path)
    assert [(u.audio_path, u.text, u.speaker) for u in prepared] == [
        (u.audio_path, u.text, u.speaker) for u in read_manifest(demo_corpus)
    ]
    assert len({u.speaker for u in prepared}) > 1  # the 4th metadata field, not the folder name


def test_cli_phonemizes_in_the_configured_language_and_rejects_texts_without_phonemes(tmp_path, capsys):
    cli = load_cli()
    corpus = build_corpus(tmp_path / "c", ["a|Hello, world!|Hello, world!", "b|...|...", "c|سلام، خوبم.|سلام، خوبم."])
    for name in "abc":
        write_wav(corpus / "wavs" / f"{name}.wav", 1.0)

    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "en"), "--workers", "1", "--quiet"]) == 0
    kept = read_manifest(tmp_path / "en")
    assert [(u.text, u.phonemes, u.language) for u in kept][0] == ("Hello, world!", "h|ə|l|ˈoʊ|, w|ˈɜː|l|d|!", "en-us")
    assert read_rejections(tmp_path / "en" / "rejected.tsv")[2][1] == "no_phonemes"  # "..." says nothing

    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "fa"), "--language", "fa",
                     "--workers", "1", "--quiet"]) == 0
    persian = read_manifest(tmp_path / "fa")[-1]
    assert (persian.phonemes, persian.language) == ("s|a|l|ˈɑ|m|, x|ˈuː|b|a|m|.", "fa")

    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "chars"), "--text-frontend", "characters",
                     "--workers", "1", "--quiet"]) == 0
    assert all(u.phonemes is None for u in read_manifest(tmp_path / "chars"))
    assert '"phonemes"' not in (tmp_path / "chars" / "manifest.jsonl").read_text(encoding="utf-8")

    capsys.readouterr()
    assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "x"), "--language", "xx-yy", "--quiet"]) == 2
    assert "--language: 'xx-yy' is not an espeak-ng voice or language code" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before any work


def test_an_output_folder_that_would_overwrite_the_input_or_the_users_files_is_refused(tmp_path, capsys):
    """--output equal to the input's folder replaced the user's manifest.jsonl with the kept rows: the
    rejected rows' transcripts were gone."""
    cli = load_cli()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_wav(corpus / "a.wav", 1.0)
    rows = [{"audio_path": "a.wav", "text": "kept"}, {"audio_path": "missing.wav", "text": "only copy of this transcript"}]
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ljspeech = build_corpus(tmp_path / "lj", ["a|one|one"])
    write_wav(ljspeech / "wavs" / "a.wav", 1.0)
    own = tmp_path / "own"  # a folder of the user's, with a manifest of its own
    own.mkdir()
    (own / "manifest.jsonl").write_text('{"audio_path": "x.wav", "text": "mine"}\n')
    own_audio = tmp_path / "own_audio"
    (own_audio / "audio").mkdir(parents=True)
    (own_audio / "audio" / "a.wav").write_bytes(b"mine")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")

    def every_file():
        return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    before = every_file()

    for source, out, message in ((corpus, corpus, "the input's own folder"),
                                 (corpus / "manifest.jsonl", corpus, "the input's own folder"),
                                 (ljspeech, ljspeech, "the input's own folder"),
                                 (corpus, own, "which no earlier preparation wrote"),
                                 (corpus, own_audio, "which no earlier preparation wrote"),
                                 (corpus, a_file, "is a file, not a folder"),
                                 (corpus, a_file / "prepared", "is a file, so the folder cannot be made")):
        with pytest.raises(ValueError, match=message):
            prepare_dataset(source, out, workers=1, progress=False)
        assert cli.main(["--input", str(source), "--output", str(out), "--workers", "1", "--quiet"]) == 2
        assert f"--output {out}" in capsys.readouterr().err
    assert every_file() == before  # nothing written, nothing replaced

    # A folder of its own is fine, and so is rerunning into it: its outputs are its own.
    for _ in range(2):
        assert cli.main(["--input", str(corpus), "--output", str(tmp_path / "prepared"), "--workers", "1", "--quiet"]) == 0
    assert [u.text for u in read_manifest(tmp_path / "prepared")] == ["kept"]
    assert read_rejections(tmp_path / "prepared" / "rejected.tsv")[2][1] == "missing_file"


def test_silent_clips_are_rejected_in_place_or_converted(tmp_path):
    """A digitally silent WAV already in the target format was kept (only its header is read), and
    with its transcript it taught the model to say the words with silence."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    frames = RATE * 2
    speech = tone(2.0, RATE)
    hiss = np.random.default_rng(0).uniform(-1, 1, frames) * 10 ** (-66 / 20)  # -66 dBFS at its loudest
    burst = np.zeros(frames, dtype=np.float32)
    # Sound only between the probe blocks: found by the whole read, not the probes.
    burst[frames // 14 + 2000: frames // 14 + 2400] = speech[:400]
    clips = {"speech.wav": speech, "zeros.wav": np.zeros(frames), "hiss.wav": hiss, "burst.wav": burst}
    for name, samples in clips.items():
        soundfile.write(corpus / name, samples, RATE, subtype="PCM_16")
    soundfile.write(corpus / "zeros_44k.flac", np.zeros(44100 * 2), 44100)  # converted, then found silent
    soundfile.write(corpus / "old.flac", speech, 44100)  # its earlier conversion is silent (see below)
    names = [*clips, "zeros_44k.flac", "old.flac"]
    (corpus / "list.jsonl").write_text("".join(json.dumps({"audio_path": n, "text": n}) + "\n" for n in names))
    out = tmp_path / "out"
    (out / "audio").mkdir(parents=True)
    (out / "rejected.tsv").write_text("line\taudio_path\treason\tdetail\n")  # an earlier preparation's folder
    # By a release that neither checked for silence nor stamped its conversions: converted again.
    soundfile.write(out / "audio" / "old.wav", np.zeros(frames), RATE, subtype="PCM_16")

    report = prepare_dataset(corpus / "list.jsonl", out, workers=1, progress=False)

    assert sorted(u.text for u in read_manifest(report.manifest_path)) == ["burst.wav", "old.flac", "speech.wav"]
    assert np.abs(soundfile.read(out / "audio" / "old.wav")[0]).max() > 0.4
    rejected = {r.audio_path: (r.reason, r.detail) for r in report.rejections}
    assert {os.path.basename(path): reason for path, (reason, _) in rejected.items()} == {
        "zeros.wav": "silent", "hiss.wav": "silent", "zeros_44k.flac": "silent"}
    assert rejected[str(corpus / "zeros.wav")][1].startswith("silent (every sample is zero, below -60 dBFS)")
    assert "its loudest sample is at -66 dBFS" in rejected[str(corpus / "hiss.wav")][1]
    assert not (out / "audio" / "zeros_44k.wav").exists()  # nothing written for it
    assert report.rejected_by_reason == {"silent": 3}


def test_float_samples_that_are_not_numbers_are_rejected(tmp_path):
    """A float WAV holding NaN was converted with zeros in their place and one holding infinity with a
    full-scale burst, kept without a word; an all-NaN one was called silent."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    speech = tone(1.0, RATE)
    for name, bad in (("nan.wav", np.nan), ("inf.wav", -np.inf), ("all_nan.wav", None)):
        samples = np.full_like(speech, np.nan) if bad is None else speech.copy()
        if bad is not None:
            samples[1000:1100] = bad
        soundfile.write(corpus / name, samples, RATE, subtype="FLOAT")
    soundfile.write(corpus / "float.wav", speech, RATE, subtype="FLOAT")
    names = ["nan.wav", "inf.wav", "all_nan.wav", "float.wav"]
    (corpus / "list.jsonl").write_text("".join(json.dumps({"audio_path": n, "text": n}) + "\n" for n in names))

    report = prepare_dataset(corpus / "list.jsonl", tmp_path / "out", workers=1, progress=False)

    assert [u.text for u in read_manifest(report.manifest_path)] == ["float.wav"]
    assert {os.path.basename(r.audio_path): (r.reason, r.detail) for r in report.rejections} == {
        "nan.wav": ("corrupt", "100 samples are not numbers (NaN or infinite); the file is damaged, re-export it"),
        "inf.wav": ("corrupt", "100 samples are not numbers (NaN or infinite); the file is damaged, re-export it"),
        "all_nan.wav": ("corrupt", f"{RATE} samples are not numbers (NaN or infinite); the file is damaged, re-export it")}
    assert sorted(p.name for p in (tmp_path / "out" / "audio").iterdir()) == ["float.wav", "float.wav.source"]
