"""Audio ops against independent references: soundfile (decoding), librosa (mels), soxr (resampling).

All comparisons run on real demo speech synthesized by espeak-ng (the session fixture).
"""

import re
import struct

import numpy as np
import pytest
import soundfile
import soxr
import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data import audio


@pytest.fixture(scope="module")
def speech(demo_corpus):
    files = sorted((demo_corpus / "wavs").glob("*.wav"))[:4]
    return np.concatenate([soundfile.read(f, dtype="float32")[0] for f in files])


def _librosa_log_mel(samples, c: DataConfig):
    import librosa

    mel = librosa.feature.melspectrogram(
        y=samples, sr=c.sample_rate, n_fft=c.n_fft, hop_length=c.hop_length, win_length=c.win_length,
        n_mels=c.n_mels, fmin=c.fmin, fmax=c.mel_fmax, power=c.power, htk=c.mel_scale == "htk",
    )
    return np.log(np.maximum(mel, c.log_floor)).T  # [frames, n_mels]


def test_load_wav_matches_soundfile(demo_corpus):
    path = sorted((demo_corpus / "wavs").glob("*.wav"))[0]
    samples, rate = audio.load_wav(str(path))
    expected, expected_rate = soundfile.read(path, dtype="float32")
    assert int(rate) == expected_rate == 22050
    np.testing.assert_array_equal(samples.numpy(), expected)


def test_load_wav_averages_channels(tmp_path):
    stereo = np.stack([np.full(1000, 0.5), np.full(1000, -0.25)], axis=1)
    soundfile.write(tmp_path / "stereo.wav", stereo, 16000, subtype="PCM_16")
    samples, rate = audio.load_wav(str(tmp_path / "stereo.wav"))
    assert int(rate) == 16000 and samples.shape == (1000,)
    np.testing.assert_allclose(samples.numpy(), 0.125, atol=1e-4)


PARAMETER_SETS = [
    {},  # the defaults: 1024/256, 80 Slaney mels up to 8 kHz, magnitude
    {"n_fft": 512, "win_length": 400, "hop_length": 160, "n_mels": 64, "fmax": 0.0, "power": 2.0},
    {"mel_scale": "htk", "n_mels": 100, "fmin": 50.0, "fmax": 11025.0, "hop_length": 128},
]


@pytest.mark.parametrize("params", PARAMETER_SETS)
def test_log_mel_matches_librosa(speech, params):
    c = DataConfig(**params)
    ours = audio.log_mel(speech, c).numpy()
    expected = _librosa_log_mel(speech, c)
    assert ours.shape == expected.shape == (1 + len(speech) // c.hop_length, c.n_mels)
    relative_error = np.linalg.norm(ours - expected) / np.linalg.norm(expected)
    assert relative_error < 1e-3, relative_error


def test_filterbank_matches_librosa():
    import librosa

    for htk in (False, True):
        ours = audio.mel_filterbank(22050, 1024, 80, 0.0, 8000.0, htk)
        expected = librosa.filters.mel(sr=22050, n_fft=1024, n_mels=80, fmin=0.0, fmax=8000.0, htk=htk).T
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-7)


def test_log_mel_is_the_same_eagerly_in_a_dataset_and_batched(speech):
    c = DataConfig()
    clips = [speech[:30000], speech[30000:60000]]
    eager = [audio.log_mel(x, c).numpy() for x in clips]
    mapped = list(tf.data.Dataset.from_tensor_slices(np.stack(clips)).map(lambda x: audio.log_mel(x, c)).as_numpy_iterator())
    batched = audio.log_mel(np.stack(clips), c).numpy()  # [2, frames, n_mels], the mel-on-device route
    for i in range(2):
        np.testing.assert_allclose(mapped[i], eager[i], atol=1e-5)
        np.testing.assert_allclose(batched[i], eager[i], atol=1e-4)


def _snr_db(ours, reference):
    return 10 * np.log10(np.sum(reference**2) / np.sum((ours - reference) ** 2))


@pytest.mark.parametrize("from_rate, to_rate", [(44100, 22050), (16000, 22050), (48000, 24000)])
def test_resample_matches_soxr(speech, from_rate, to_rate):
    source = soxr.resample(speech, 22050, from_rate).astype(np.float32)  # speech at the source rate
    expected = soxr.resample(source, from_rate, to_rate)
    ours = audio.resample(source, from_rate, to_rate).numpy()
    assert ours.shape == expected.shape  # round(n * to / from), like soxr
    assert _snr_db(ours, expected) >= 50.0


def test_resample_preserves_a_tone_and_its_length():
    t = np.arange(16000) / 16000
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    out = audio.resample(tone, 16000, 22050).numpy()
    expected = np.sin(2 * np.pi * 440 * np.arange(22050) / 22050)
    assert out.shape == (22050,)
    np.testing.assert_allclose(out[500:-500], expected[500:-500], atol=2e-3)


def test_resample_to_converts_supported_rates_and_names_the_file_otherwise(tmp_path):
    tone = np.sin(np.linspace(0, 200, 16000)).astype(np.float32)
    samples = audio.resample_to(tone, tf.constant(16000), 22050, source="a.wav").numpy()
    np.testing.assert_allclose(samples, audio.resample(tone, 16000, 22050).numpy())
    assert audio.resample_to(tone, tf.constant(22050), 22050).shape == (16000,)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)unsupported sample rate.*12345.*odd\.wav.*prepare_dataset"):
        audio.resample_to(tone, tf.constant(12345), 22050, source="odd.wav")


def test_datasets_that_resample_share_one_trace_of_the_resampler():
    # Seven branches of filters took ~0.4 s to trace per dataset map, six times per train() start
    # (2.8 s of a tiny run's 27 s). Now each graph calls one function traced once per target rate.
    resampler = audio._resampler_to(24000)  # a rate no other test uses, so the count starts here
    paths = tf.data.Dataset.from_tensor_slices(["a.wav", "b.wav"])
    for _ in range(3):
        paths.map(lambda path: audio.resample_to(*audio.load_wav(path), 24000, source=path))
    assert resampler.experimental_get_tracing_count() == 1


def test_peak_normalize():
    x = np.array([0.1, -0.4, 0.2], np.float32)
    np.testing.assert_allclose(audio.peak_normalize(x, 0.8).numpy(), [0.2, -0.8, 0.4], rtol=1e-6)
    assert np.all(audio.peak_normalize(np.zeros(4, np.float32), 0.8).numpy() == 0)
    np.testing.assert_array_equal(audio.peak_normalize(x, 0.0), x)


def test_a_file_that_is_not_a_wav_fails_naming_the_file(tmp_path):
    # TensorFlow's own decode_wav error says "Header mismatch" and names no file: in a corpus of
    # thousands, the user could not tell which one to fix.
    for name, contents in [("garbage.wav", b"RIFF but not a wave file at all" * 4), ("empty.wav", b""),
                           ("short.wav", b"RIF")]:
        path = tmp_path / name
        path.write_bytes(contents)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"not a WAV file.*{name}"):
            tf.function(audio.load_wav)(tf.constant(str(path)))
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"not a WAV file.*{name}"):
            tf.function(lambda p: audio.load_wav(p, middle_seconds=3.0))(tf.constant(str(path)))


def test_data_problem_is_a_checks_message_alone_and_none_for_other_errors(tmp_path):
    # The pipeline's own checks fail inside TensorFlow; train_main prints their message alone
    # (exit 2, through audio.data_problem), not a traceback. Other TensorFlow errors stay whole:
    # they are bugs to read in full.
    bad = tmp_path / "clip_0007.wav"
    bad.write_bytes(b"not audio at all" * 8)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        tf.function(audio.load_wav)(tf.constant(str(bad)))
    assert audio.data_problem(caught.value) == (
        f"not a WAV file (no RIFF/WAVE header): {bad} - check or convert the corpus with utilities/prepare_dataset.py")
    # Run eagerly (synthesis reads a reference clip so), the check words its message differently.
    with pytest.raises(tf.errors.InvalidArgumentError) as eager:
        audio.load_wav(tf.constant(str(bad)))
    assert audio.data_problem(eager.value) == audio.data_problem(caught.value)
    with pytest.raises(tf.errors.InvalidArgumentError) as other:
        tf.reshape(tf.range(3), [2])
    assert audio.data_problem(other.value) is None


def test_trim_silence_cuts_where_librosa_does(demo_corpus):
    import librosa

    rng = np.random.default_rng(0)
    files = sorted((demo_corpus / "wavs").glob("*.wav"))[:6]
    trimmed_any = False
    for path in files:
        clip = soundfile.read(path, dtype="float32")[0]
        # Real speech, plus the same clip between stretches of low noise and of digital silence.
        padded = np.concatenate([rng.normal(0, 1e-4, 9000), np.zeros(3000), clip, np.zeros(7000)]).astype(np.float32)
        for samples in (clip, padded):
            for top_db in (60.0, 30.0):
                expected, (start, end) = librosa.effects.trim(samples, top_db=top_db)
                ours = audio.trim_silence(tf.constant(samples), top_db).numpy()
                np.testing.assert_array_equal(ours, expected, err_msg=f"{path.name} top_db={top_db}")
                trimmed_any |= len(expected) < len(samples)
            # Frames that are not a whole number of hops take the general path.
            np.testing.assert_array_equal(audio.trim_silence(tf.constant(samples), 40.0, 2000, 512).numpy(),
                                          librosa.effects.trim(samples, top_db=40.0, frame_length=2000, hop_length=512)[0])
    assert trimmed_any  # the comparison covered real cuts, not only untouched clips
    # Edge cases: all digital silence stays whole (librosa's rule), a click in silence is kept alone.
    for samples in (np.zeros(5000, np.float32), np.r_[np.zeros(3000), np.ones(100), np.zeros(7000)].astype(np.float32)):
        np.testing.assert_array_equal(audio.trim_silence(tf.constant(samples), 60.0).numpy(),
                                      librosa.effects.trim(samples, top_db=60.0)[0])


@pytest.mark.parametrize("subtype, channels", [("PCM_16", 1), ("PCM_16", 2), ("PCM_24", 1), ("FLOAT", 1)])
def test_load_wav_fast_and_fallback_paths_match_soundfile(tmp_path, subtype, channels):
    rng = np.random.default_rng(0)
    audio_in = rng.uniform(-0.9, 0.9, (4410, channels))
    path = tmp_path / f"{subtype}_{channels}.wav"
    soundfile.write(path, audio_in, 22050, subtype=subtype)
    expected = soundfile.read(path, dtype="float32", always_2d=True)[0].mean(axis=1)
    if subtype in ("PCM_24", "FLOAT"):  # tf.audio.decode_wav reads neither: the caller must convert them
        with pytest.raises(tf.errors.InvalidArgumentError):
            audio.load_wav(str(path))
        return
    samples, rate = audio.load_wav(str(path))
    assert int(rate) == 22050
    np.testing.assert_allclose(samples.numpy(), expected, atol=1e-7)
    middle, _ = audio.load_wav(str(path), middle_seconds=0.1)  # 2205 of 4410 frames, centred
    np.testing.assert_allclose(middle.numpy(), expected[1102:3307], atol=1e-7)


def test_load_wav_falls_back_to_decode_wav_for_other_layouts(tmp_path):
    # 16-bit PCM with a LIST chunk between fmt and data: not the canonical 44-byte header, so the
    # raw fast path must not be taken (it would read the LIST bytes as samples).
    import struct

    data = (np.arange(1000) % 200 - 100).astype("<i2").tobytes()
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, 16000, 32000, 2, 16)
    listing = b"LIST" + struct.pack("<I", 8) + b"INFOxxxx"
    body = b"WAVE" + fmt + listing + b"data" + struct.pack("<I", len(data)) + data
    path = tmp_path / "list_chunk.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    samples, rate = audio.load_wav(str(path))
    assert int(rate) == 16000
    np.testing.assert_array_equal(samples.numpy(), (np.arange(1000) % 200 - 100) / 32768.0)


def _wav_bytes(*chunks, riff=b"RIFF", wave=b"WAVE"):
    """A RIFF/WAVE file of the given (id, body) chunks, each size field as its body's length."""
    import struct

    body = b"".join(cid + struct.pack("<I", len(data)) + data for cid, data in chunks)
    return riff + struct.pack("<I", 4 + len(body)) + wave + body


def _odd_sized(contents):
    """`contents` with its LIST chunk of "INFOabc" and a pad byte declared as the 7 bytes it is, as RIFF writes it."""
    return contents.replace(b"LIST\x08\0\0\0INFOabc\0", b"LIST\x07\0\0\0INFOabc\0")


def _fmt(tag=1, channels=1, rate=16000, bits=16, extra=b"", block=None, byte_rate=None):
    import struct

    block = channels * bits // 8 if block is None else block
    byte_rate = block * rate if byte_rate is None else byte_rate
    return b"fmt ", struct.pack("<HHIIHH", tag, channels, rate, byte_rate, block, bits) + extra


_PCM = (np.arange(200, dtype=np.int16) * 50).tobytes()  # 200 mono frames


# Each layout: (name, bytes). TensorFlow's decode_wav decides which it reads; the test checks
# `wav_refusal` agrees on every one, so a file decode_wav refuses never reaches it unnamed.
_LAYOUTS = [
    ("plain", _wav_bytes(_fmt(), (b"data", _PCM))),
    ("fmt of 18 bytes", _wav_bytes(_fmt(extra=b"\0\0"), (b"data", _PCM))),
    ("JUNK before fmt", _wav_bytes((b"JUNK", b"\0" * 28), _fmt(), (b"data", _PCM))),
    ("LIST before fmt", _wav_bytes((b"LIST", b"INFOabcd"), _fmt(), (b"data", _PCM))),
    ("LIST between fmt and data", _wav_bytes(_fmt(), (b"LIST", b"INFOabcd"), (b"data", _PCM))),
    ("LIST after data", _wav_bytes(_fmt(), (b"data", _PCM), (b"LIST", b"INFOabcd"))),
    ("stereo", _wav_bytes(_fmt(channels=2), (b"data", _PCM))),
    ("8-bit", _wav_bytes(_fmt(bits=8), (b"data", _PCM))),
    ("24-bit", _wav_bytes(_fmt(bits=24), (b"data", _PCM[:300]))),
    ("float", _wav_bytes(_fmt(tag=3, bits=32), (b"fact", b"\x64\0\0\0"), (b"data", _PCM))),
    ("extensible 16-bit", _wav_bytes(_fmt(tag=0xFFFE, extra=b"\x16\0\x10\0\x04\0\0\0\x01\0" + b"\0" * 14),
                                     (b"data", _PCM))),
    ("frame size disagrees", _wav_bytes(_fmt(block=4), (b"data", _PCM))),
    ("no data chunk", _wav_bytes(_fmt(), (b"LIST", b"INFOabcd"))),
    ("two data chunks", _wav_bytes(_fmt(), (b"data", _PCM), (b"data", _PCM))),
    ("three stray bytes at the end", _wav_bytes(_fmt(), (b"data", _PCM)) + b"abc"),
    ("cut off inside fmt", _wav_bytes(_fmt())[:30]),
    ("no fmt chunk", _wav_bytes((b"JUNK", b"\0" * 4))),
    ("truncated after an 18-byte fmt", _wav_bytes(_fmt(extra=b"\0\0"), (b"data", _PCM))[:-150]),
    ("truncated with a LIST before data", _wav_bytes(_fmt(), (b"LIST", b"INFOabcd"), (b"data", _PCM))[:-150]),
    ("odd-sized LIST before data", _odd_sized(_wav_bytes(_fmt(), (b"LIST", b"INFOabc\0"), (b"data", _PCM)))),
    ("odd-sized LIST after data", _odd_sized(_wav_bytes(_fmt(), (b"fact", b"\xc8\0\0\0"), (b"data", _PCM),
                                                        (b"LIST", b"INFOabc\0")))),
    ("data of unknown length", _wav_bytes(_fmt(), (b"fact", b"\xc8\0\0\0"), (b"data", _PCM)).replace(
        b"data\x90\x01\0\0", b"data\xff\xff\xff\xff")),
]


@pytest.mark.parametrize("name, contents", _LAYOUTS, ids=[name for name, _ in _LAYOUTS])
def test_wav_refusal_refuses_exactly_what_decode_wav_refuses(name, contents):
    try:
        tf.audio.decode_wav(tf.constant(contents))
        reads = True
    except tf.errors.InvalidArgumentError:
        reads = False
    refusal, broken = tf.function(audio.wav_refusal)(tf.constant(contents))
    assert (refusal.numpy() == b"") == reads, (name, refusal.numpy())


def test_an_unusable_wav_fails_naming_the_file_and_what_to_do(tmp_path):
    # TensorFlow's own errors name no file ("Can only read 16-bit WAV files, but received 8"), and
    # a truncated canonical file was read up to its end without a word: half a clip, trained on.
    # Each is refused naming the file; a format TensorFlow does not read is converted once, a
    # damaged file is re-exported or left out.
    tone = (0.5 * np.sin(np.arange(16000) / 10)).astype(np.float32)
    soundfile.write(tmp_path / "whole.wav", tone, 16000, subtype="PCM_16")
    whole = (tmp_path / "whole.wav").read_bytes()
    cases = {
        "eight_bit.wav": (None, "PCM_U8", "WAV of 8-bit integer samples"),
        "float.wav": (None, "FLOAT", "WAV of 32-bit float samples"),
        "cut.wav": (whole[: len(whole) // 2], None, r"truncated WAV \(its header promises 32000 bytes of samples, the file holds 15978 bytes\)"),
        "cut_long_fmt.wav": (_wav_bytes(_fmt(extra=b"\0\0"), (b"data", _PCM))[:-200], None,
                             r"truncated WAV \(its header promises 400 bytes of samples, the file holds 200 bytes\)"),
        "list_first.wav": (_wav_bytes((b"LIST", b"INFOabcd"), _fmt(), (b"data", _PCM)), None,
                           "WAV with a 'LIST' chunk before its 'fmt ' chunk"),
        # Legal files decode_wav misreads were called damaged, to be re-exported or left out, where
        # prepare_dataset.py converts them.
        "odd_list.wav": (_odd_sized(_wav_bytes(_fmt(), (b"LIST", b"INFOabc\0"), (b"data", _PCM))), None,
                         "WAV with an odd-sized 'LIST' chunk, whose pad byte TensorFlow does not skip"),
        "odd_list_after.wav": (_odd_sized(_wav_bytes(_fmt(), (b"fact", b"\xc8\0\0\0"), (b"data", _PCM), (b"LIST", b"INFOabc\0"))),
                               None, "WAV with an odd-sized 'LIST' chunk, whose pad byte TensorFlow does not skip"),
        "stray_bytes.wav": (_wav_bytes(_fmt(), (b"LIST", b"INFOabcd"), (b"data", _PCM)) + b"abc", None,
                            "WAV with stray bytes after its last chunk"),
        "streamed.wav": (_wav_bytes(_fmt(), (b"LIST", b"INFOabcd"), (b"data", _PCM)).replace(
            b"data" + struct.pack("<I", len(_PCM)), b"data\xff\xff\xff\xff"), None, r"WAV of unknown length \(its data size is 0xFFFFFFFF"),
    }
    load = tf.function(audio.load_wav)
    for name, (contents, subtype, what) in cases.items():
        path = tmp_path / name
        if contents is None:
            soundfile.write(path, tone, 16000, subtype=subtype)
        else:
            path.write_bytes(contents)
        todo = ("re-export or remove the file" if what.startswith("truncated")
                else "convert the corpus once with utilities/prepare_dataset.py")
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            load(tf.constant(str(path)))
        problem = audio.data_problem(caught.value)
        assert problem is not None and re.fullmatch(f"{what}.*: {re.escape(str(path))} - {todo}.*", problem), problem
    # The reference crop reads the same way.
    with pytest.raises(tf.errors.InvalidArgumentError, match="truncated WAV"):
        tf.function(lambda p: audio.load_wav(p, middle_seconds=0.2))(tf.constant(str(tmp_path / "cut.wav")))


def test_data_problem_keeps_a_file_name_with_brackets_quotes_and_accents_whole(tmp_path):
    # Assert prints every piece in brackets and escapes computed strings' quotes: a name holding
    # either came back cut ("take [1") or with backslashes.
    path = tmp_path / "café 'take' [1].wav"
    path.write_bytes(_wav_bytes((b"LIST", b"INFOabcd"), _fmt(), (b"data", _PCM)))
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        tf.function(audio.load_wav)(tf.constant(str(path)))
    assert audio.data_problem(caught.value) == (
        f"WAV with a 'LIST' chunk before its 'fmt ' chunk, which TensorFlow does not read: {path} - "
        "convert the corpus once with utilities/prepare_dataset.py")
