"""The Kokoro corpus builder (myxtts/data/kokoro.py) without the model: its symbols, model assembly,
voice files and corpus layout, with a stand-in for the ONNX session."""

import hashlib
import importlib
import json

import numpy as np
import pytest
import soundfile

from myxtts.data import kokoro
from myxtts.data.manifest import read_manifest
from myxtts.data.phonemes import phonemize
from myxtts.data.sentences import generate_sentences


def test_espeak_phonemes_become_kokoro_symbols_with_an_id_each():
    assert kokoro.kokoro_symbols("h|ə|l|ˈoʊ w|ˈɜː|l|d|.") == "həlˈO wˈɜɹld."
    assert kokoro.kokoro_symbols("dʒ|ˈʌ|m|p|s f|ˈɑː|k|s") == "ʤˈʌmps fˈɑks"
    # Every symbol the front end gives for the demo's sentences has an id: none is dropped.
    symbols = {s for text in generate_sentences(150, seed=3) for s in kokoro.kokoro_symbols(phonemize(text, "en-us"))}
    assert symbols - set(kokoro.VOCABULARY) == set()
    assert len(kokoro.token_ids("ðə kwˈɪk")) == len("ðə kwˈɪk")


def _fake_parts(tmp_path, monkeypatch, contents):
    # Packages of their own names: the real ones may be installed.
    monkeypatch.setattr(kokoro, "MODEL_PACKAGES", tuple(f"fake_kokoro_part_{i}" for i in range(1, 5)))
    for i, data in enumerate(contents, start=1):
        package = tmp_path / "site" / f"fake_kokoro_part_{i}"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "part.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_the_model_is_joined_from_its_packages_once_and_checked(tmp_path, monkeypatch):
    contents = [b"part one ", b"two ", b"three ", b"four"]
    _fake_parts(tmp_path, monkeypatch, contents)
    monkeypatch.setattr(kokoro, "MODEL_SHA256", hashlib.sha256(b"".join(contents)).hexdigest())
    model = kokoro.assemble_model(tmp_path / "cache")
    assert model.read_bytes() == b"".join(contents)
    assert kokoro.assemble_model(tmp_path / "cache") == model  # reused

    monkeypatch.setattr(kokoro, "MODEL_SHA256", "0" * 64)
    with pytest.raises(kokoro.KokoroMissing, match="SHA-256"):
        kokoro.assemble_model(tmp_path / "other_cache")
    assert list((tmp_path / "other_cache").iterdir()) == []  # nothing half-made is left


def test_a_missing_model_package_is_named_with_how_to_install_it(tmp_path, monkeypatch):
    _fake_parts(tmp_path, monkeypatch, [b"1", b"2", b"3"])  # part 4 missing
    with pytest.raises(kokoro.KokoroMissing, match="fake-kokoro-part-4 is not installed.*requirements-kokoro.txt"):
        kokoro.assemble_model(tmp_path / "cache")
    (tmp_path / "site" / "fake_kokoro_part_4").mkdir()  # installed, its data gone
    (tmp_path / "site" / "fake_kokoro_part_4" / "__init__.py").write_text("")
    importlib.invalidate_caches()
    with pytest.raises(kokoro.KokoroMissing, match="fake_kokoro_part_4/part.bin is missing: reinstall"):
        kokoro.assemble_model(tmp_path / "cache")


def test_voice_files_are_read_and_bad_ones_named(tmp_path):
    voices = tmp_path / "voices"
    voices.mkdir()
    table = np.arange(kokoro.STYLE_ROWS * kokoro.STYLE_WIDTH, dtype=np.float32)
    table.tofile(voices / "af_test.bin")
    assert kokoro.load_voice(voices, "af_test")[3, 0] == 3 * kokoro.STYLE_WIDTH
    with pytest.raises(kokoro.KokoroMissing, match="no voice 'am_none'.*af_test"):
        kokoro.load_voice(voices, "am_none")
    np.zeros(10, np.float32).tofile(voices / "short.bin")
    with pytest.raises(kokoro.KokoroMissing, match="holds 10 floats"):
        kokoro.load_voice(voices, "short")
    with pytest.raises(kokoro.KokoroMissing, match="npm pack kokoro-js"):
        kokoro.load_voice(tmp_path / "nowhere", "af_test")


class _Session:
    """Kokoro's ONNX session's interface: 0.1 s of a 24 kHz tone per input token, and the inputs it got."""

    def __init__(self):
        self.calls = []

    def run(self, outputs, feeds):
        self.calls.append(feeds)
        tokens = feeds["tokens"].shape[1]
        return [0.5 * np.sin(np.arange(tokens * 2400) * 0.05).astype(np.float32)]


def test_a_voice_feeds_the_tokens_padded_and_the_style_for_their_count_and_gives_22050_hz():
    session = _Session()
    style = np.arange(kokoro.STYLE_ROWS, dtype=np.float32)[:, None] * np.ones(kokoro.STYLE_WIDTH, np.float32)
    audio, ipa = kokoro.KokoroVoice(session, style)("Hello world.")
    feeds = session.calls[0]
    tokens = kokoro.token_ids(kokoro.kokoro_symbols(ipa))
    assert feeds["tokens"].tolist() == [[0, *tokens, 0]]
    assert feeds["style"].shape == (1, kokoro.STYLE_WIDTH) and feeds["style"][0, 0] == len(tokens) - 1
    assert abs(len(audio) - (len(tokens) + 2) * 2400 * 22050 / 24000) <= 2


def test_the_corpus_is_laid_out_as_the_demos_and_kept_when_complete(tmp_path):
    spoken = []

    def speak(voice):
        def say(text):
            spoken.append((voice, text))
            words = len(text.split())
            return np.full(int(0.25 * words * kokoro.SAMPLE_RATE), 0.1, np.float32), f"ipa of {text}"
        return say

    out = kokoro.make_kokoro_corpus(tmp_path / "corpus", 5, ["af_a", "bm_b"], seed=2, speak=speak, progress=False)
    rows = read_manifest(out)
    assert [r.speaker for r in rows] == ["kokoro_af_a", "kokoro_bm_b", "kokoro_af_a", "kokoro_bm_b", "kokoro_af_a"]
    for row in rows:
        info = soundfile.info(out / row.audio_path)
        assert info.samplerate == 22050 and info.subtype == "PCM_16"
        assert kokoro.MIN_DURATION_S <= info.duration <= kokoro.MAX_DURATION_S
        assert row.phonemes == f"ipa of {row.text}" and row.language == "en-us"
    assert json.loads((out / kokoro.STAMP_FILENAME).read_text())["num_utterances"] == 5

    count = len(spoken)
    assert kokoro.make_kokoro_corpus(out, 5, ["af_a", "bm_b"], seed=2, speak=speak, progress=False) == out
    assert len(spoken) == count  # complete: nothing spoken again
    with pytest.raises(FileExistsError, match="not a Kokoro corpus of these arguments"):
        kokoro.make_kokoro_corpus(out, 6, ["af_a", "bm_b"], seed=2, speak=speak, progress=False)
    a_file = tmp_path / "corpus.txt"
    a_file.write_text("not a folder")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):  # was a NotADirectoryError traceback
        kokoro.make_kokoro_corpus(a_file, 5, ["af_a"], seed=2, speak=speak, progress=False)


def test_an_interrupted_build_leaves_no_corpus_that_looks_complete_and_goes_on_from_where_it_stopped(tmp_path):
    # It used to start over: 12-27 minutes of synthesis on 2 cores lost to one Ctrl-C.
    def speak(voice):
        def say(text):
            if len(spoken) == stop_at:
                raise KeyboardInterrupt
            spoken.append(text)
            return np.full(int(2.0 * kokoro.SAMPLE_RATE), 0.1, np.float32), f"ipa of {text}"
        return say

    spoken, stop_at = [], 2
    with pytest.raises(KeyboardInterrupt):
        kokoro.make_kokoro_corpus(tmp_path / "corpus", 5, ["af_a", "bm_b"], speak=speak, progress=False)
    assert not (tmp_path / "corpus").exists()
    stop_at = 3
    with pytest.raises(KeyboardInterrupt):  # and again, one utterance further
        kokoro.make_kokoro_corpus(tmp_path / "corpus", 5, ["af_a", "bm_b"], speak=speak, progress=False)
    assert len(set(spoken)) == len(spoken) == 3  # the first two were not spoken again
    first_three = list(spoken)
    record = next((tmp_path / "corpus.partial").glob("*.jsonl"))
    with open(record, "a", encoding="utf-8") as cut_short:
        cut_short.write('{"audio_path": "wavs/kok')  # a line the interruption cut short
    stop_at = None
    out = kokoro.make_kokoro_corpus(tmp_path / "corpus", 5, ["af_a", "bm_b"], speak=speak, progress=False)
    assert len(set(spoken)) == len(spoken) == 5 and spoken[:3] == first_three
    rows = read_manifest(out)
    assert [r.speaker for r in rows] == ["kokoro_af_a", "kokoro_bm_b"] * 2 + ["kokoro_af_a"]
    assert all(r.phonemes == f"ipa of {r.text}" for r in rows) and not (tmp_path / "corpus.partial").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([kokoro.STAMP_FILENAME, "manifest.jsonl", "wavs"])
    # The same sentences as a build never interrupted.
    spoken.clear()
    whole = kokoro.make_kokoro_corpus(tmp_path / "whole", 5, ["af_a", "bm_b"], speak=speak, progress=False)
    assert [r.text for r in read_manifest(whole)] == [r.text for r in rows]

    # Asked for fewer (or more) utterances, it goes on from what was spoken: utterance i does not
    # depend on the count. It used to start over.
    spoken.clear()
    stop_at = 3
    with pytest.raises(KeyboardInterrupt):
        kokoro.make_kokoro_corpus(tmp_path / "other", 6, ["af_a"], speak=speak, progress=False)
    spoken.clear()
    stop_at = None
    fewer = kokoro.make_kokoro_corpus(tmp_path / "other", 2, ["af_a"], speak=speak, progress=False)
    assert len(spoken) == 0 and len(read_manifest(fewer)) == 2 and len(list((fewer / "wavs").iterdir())) == 2
    # An interrupted build of other arguments (another seed) is not resumed: it starts over afresh.
    spoken.clear()
    stop_at = 2
    with pytest.raises(KeyboardInterrupt):
        kokoro.make_kokoro_corpus(tmp_path / "seeded", 4, ["af_a"], speak=speak, progress=False)
    spoken.clear()
    stop_at = None
    assert len(read_manifest(kokoro.make_kokoro_corpus(tmp_path / "seeded", 3, ["af_a"], seed=5, speak=speak,
                                                       progress=False))) == 3
    assert len(spoken) == 3


def test_the_tool_names_a_missing_voices_folder_and_how_to_get_it(tmp_path, capsys):
    from utilities import make_kokoro_corpus

    assert make_kokoro_corpus.main(["--out", str(tmp_path / "c"), "--kokoro-voices", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert "no Kokoro voices folder" in error and "npm pack kokoro-js@1.2.1" in error
