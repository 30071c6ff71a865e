"""Tests for the numpy GE2E speaker encoder (`myxtts.evaluation.speaker`).

The reference is resemblyzer 0.1.4 itself: `tests/reference/ge2e_reference.npz` holds ten espeak
clips (one per voice of DEMO_VOICES + OTHER_VOICES) and resemblyzer's embeddings of them, recorded
with torch by `tests/reference/record_ge2e_reference.py`. Measured when written: without silence
trimming (pure numerics) every cosine is >= 0.9999999; with it (our energy-based trim against
webrtcvad) the lowest is 0.9924, six of ten are 1.000000. A wrong gate order, a log mel, a missing
bias or a wrong mel basis each drop the numerics far below the 0.99999 bound.
"""

import numpy as np
import pytest

from myxtts.evaluation import speaker
from myxtts.evaluation.speaker import SpeakerEncoder, cosine_similarity, identify

REFERENCE = "tests/reference/ge2e_reference.npz"
SOURCE_RATE = 22_050


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """Tiny recurrent matmuls: BLAS threads only contend on two busy cores (10x slower)."""
    try:
        import threadpoolctl  # comes with librosa's scikit-learn (requirements-dev.txt)
    except ImportError:  # only slower without it
        yield
        return
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as archive:
        stored = dict(archive)
    bounds = np.cumsum(np.concatenate([[0], stored["lengths"]]))
    stored["clips"] = [stored["audio"][start:stop] for start, stop in zip(bounds, bounds[1:])]
    return stored


def _cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_numerics_match_resemblyzer_without_trimming(reference):
    ours = SpeakerEncoder(trim_silence=False).embed_many(reference["clips"], SOURCE_RATE)
    assert ours.shape == (10, 256) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    assert np.all(_cosines(ours, reference["resemblyzer_untrimmed"]) >= 0.99999)


def test_full_pipeline_matches_resemblyzer(reference):
    ours = SpeakerEncoder().embed_many(reference["clips"], SOURCE_RATE)
    cosines = _cosines(ours, reference["resemblyzer_full"])
    assert np.all(cosines >= 0.99), cosines
    # the trimming matters: resemblyzer's own untrimmed embedding of "Good morning, how are you
    # today?" is 0.949 from its trimmed one (another number of partials), so skipping it would fail
    assert np.min(_cosines(reference["resemblyzer_untrimmed"], reference["resemblyzer_full"])) < 0.99


def test_energy_trim_agrees_with_webrtcvad(reference):
    agreements, length_errors = [], []
    for index, clip in enumerate(reference["clips"]):
        wav = speaker.normalize_volume(speaker.resample(clip.astype(np.float32) / 32768, SOURCE_RATE))
        voiced = speaker.voiced_windows(wav)
        agreements.append(np.mean(voiced == reference[f"vad_flags_{index}"]))
        trimmed = speaker.trim_long_silences(wav, voiced)
        length_errors.append(abs(len(trimmed) - reference["trimmed_lengths"][index]) / speaker.VAD_WINDOW)
    assert np.mean(agreements) >= 0.9 and min(agreements) >= 0.85, agreements  # measured 0.925, 0.865
    assert max(length_errors) <= 8, length_errors  # windows of 30 ms; measured 0-7


def test_trim_keeps_short_pauses_and_shortens_long_ones():
    window = speaker.VAD_WINDOW
    tone = 0.3 * np.sin(np.arange(20 * window) * 0.3).astype(np.float32)
    gaps = {}
    for silent_windows in (4, 40):
        wav = np.concatenate([tone, np.zeros(silent_windows * window, np.float32), tone])
        trimmed = speaker.trim_long_silences(wav, speaker.voiced_windows(wav))
        gaps[silent_windows] = len(trimmed) // window - 40
    assert gaps == {4: 4, 40: 5}


def test_trim_smoothing_and_dilation_are_resemblyzers():
    """The mask from the same flags equals resemblyzer's (moving average, round, scipy dilation)."""
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(2)
    window = speaker.VAD_WINDOW
    for _ in range(20):
        flags = np.repeat(rng.random(30) < 0.5, rng.integers(1, 9, 30))  # runs of voice and silence
        padded = np.concatenate((np.zeros(3), flags, np.zeros(4)))
        sums = np.cumsum(padded)
        sums[8:] = sums[8:] - sums[:-8]
        mask = ndimage.binary_dilation(np.round(sums[7:] / 8).astype(bool), np.ones(7))
        wav = np.arange(len(flags) * window + 100, dtype=np.float32)
        np.testing.assert_array_equal(speaker.trim_long_silences(wav, flags), wav[: len(flags) * window][np.repeat(mask, window)])


def test_volume_is_raised_to_minus_30_dbfs_never_lowered(reference):
    def dbfs(wav):
        return 20 * np.log10(np.sqrt(np.mean((wav * speaker.INT16_MAX) ** 2)) / speaker.INT16_MAX)

    quiet = (0.001 * np.sin(np.arange(16_000) * 0.05)).astype(np.float32)
    assert dbfs(speaker.normalize_volume(quiet)) == pytest.approx(-30.0, abs=1e-3)
    loud = quiet * 300
    np.testing.assert_array_equal(speaker.normalize_volume(loud), loud)
    # so a clip's embedding does not depend on how quietly it was recorded, below -30 dBFS
    clip = reference["clips"][4].astype(np.float32) / 32768
    quieter = SpeakerEncoder().embed_many([clip * 0.01, clip * 0.001], SOURCE_RATE)
    assert cosine_similarity(*quieter) >= 0.99999


def test_mel_matches_librosa():
    librosa = pytest.importorskip("librosa")
    wav = (np.random.default_rng(0).standard_normal(16_000 * 2 + 77) * 0.1).astype(np.float32)
    expected = librosa.feature.melspectrogram(y=wav, sr=16_000, n_fft=400, hop_length=160, n_mels=40).T
    ours = speaker.mel_frames(wav)
    assert ours.shape == expected.shape == (201, 40)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-6 * expected.max())


def test_resample_matches_librosa():
    librosa = pytest.importorskip("librosa")
    wav = (np.random.default_rng(1).standard_normal(SOURCE_RATE + 13) * 0.1).astype(np.float32)
    expected = librosa.resample(wav, orig_sr=SOURCE_RATE, target_sr=16_000)  # soxr_hq, length fixed
    np.testing.assert_allclose(speaker.resample(wav, SOURCE_RATE), expected, atol=1e-6)


def test_partial_slices():
    # 77-frame steps (1.3 per second), 160 frames each; a clip shorter than one gets one, padded
    assert speaker.partial_slices(8_000) == [slice(0, 160)]
    slices = speaker.partial_slices(16_000 * 5)
    assert [s.start for s in slices] == [0, 77, 154, 231, 308] and all(s.stop - s.start == 160 for s in slices)
    # the last partial is dropped when less than 75% of it is audio
    assert speaker.partial_slices(154 * 160 + 120 * 160)[-1].start == 154
    assert speaker.partial_slices(154 * 160 + 120 * 160 - 1)[-1].start == 77


def test_identifies_espeak_voices_leave_one_out():
    """3 utterances x 4 voices: each one's nearest voice centroid (without it) is its own voice.

    Utterances of two sentences (~4.7 s): GE2E hears espeak's variants of one synthesizer as
    close, and in single sentences (~2.4 s) the words weigh as much as the voice (measured over
    all ten voices: 96% leave-one-out identification with one sentence, 98% with two, 100% with three).
    """
    from myxtts.data.demo_corpus import SAMPLE_RATE, EspeakEngine

    voices = ("en-us", "en-us+f2", "en-us+f3", "en+m7")
    utterances = (
        "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background.",
        "It is easy to tell the depth of a well. These days a chicken leg is a rare dish.",
        "Rice is often served in round bowls. The juice of lemons makes fine punch.",
    )
    engine = EspeakEngine()
    clips = [np.frombuffer(engine.render_isolated(voice, text).pcm, "<i2") for voice in voices for text in utterances]
    embeddings = SpeakerEncoder().embed_many(clips, SAMPLE_RATE).reshape(len(voices), len(utterances), 256)
    for v, voice in enumerate(voices):
        for u in range(len(utterances)):
            centroids = {
                name: speaker._unit(np.delete(embeddings[n], u, axis=0).mean(axis=0) if n == v else embeddings[n].mean(axis=0))
                for n, name in enumerate(voices)
            }
            scores = {name: cosine_similarity(embeddings[v, u], c) for name, c in centroids.items()}
            assert identify(embeddings[v, u], centroids) == voice
            # measured: own centroid 0.89-0.94, the next voice's 0.78-0.83, a margin >= 0.07
            assert scores[voice] - max(score for name, score in scores.items() if name != voice) >= 0.04


def test_cosine_and_identify_basics():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    assert cosine_similarity(a, a * 3) == pytest.approx(1.0)
    assert cosine_similarity(a, b) == pytest.approx(0.0)
    assert identify(np.array([0.1, 1.0]), {"a": a, "b": b}) == "b"
    with pytest.raises(ValueError):
        identify(a, {})
    with pytest.raises(ValueError, match="silent"):
        SpeakerEncoder().embed(np.zeros(16_000, np.float32), 16_000)


def test_weights_file_holds_the_encoder_only():
    """The converted resemblyzer checkpoint: 3 LSTM layers in torch's gate layout, Linear, float32."""
    weights = speaker.load_weights()
    expected = {"linear_w": (256, 256), "linear_b": (256,)}
    for layer, inputs in enumerate((40, 256, 256)):
        expected.update({f"lstm{layer}_w_ih": (inputs, 1024), f"lstm{layer}_w_hh": (256, 1024), f"lstm{layer}_bias": (1024,)})
    assert {name: array.shape for name, array in weights.items()} == expected
    assert all(array.dtype == np.float32 for array in weights.values())
    with np.load(speaker.WEIGHTS_PATH) as archive:
        assert "Resemblyzer-0.1.4" in str(archive["source"]) and "sha256 39373b86" in str(archive["source"])
