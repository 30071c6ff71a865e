"""Synthesis: the compiled decoding loop, its stopping rule, and Griffin-Lim against the feature pipeline."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data import audio
from myxtts.models import griffin_lim
from myxtts.models.inference import autoregress, end_silence, generate
from myxtts.models.xtts import XTTS

VOCAB = 12
N_MELS = 20
MAX_FRAMES = 22  # not a multiple of r = 4: the last step's extra frames must be cut


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny", max_text_length=32, max_mel_frames=64)
    model.build()
    return model


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(0)
    tokens = np.array([[2, 5, 6, 7, 8, 9, 3, 0], [2, 9, 8, 7, 3, 0, 0, 0]], np.int32)  # BOS ... EOS, PAD
    reference = rng.normal(-4.0, 2.0, (3, 24, N_MELS)).astype(np.float32)
    return tf.constant(tokens), tf.constant(reference), tf.constant([24, 20, 17])


def _force_stop(model, per_frame_bias):
    """Make the stop head ignore its input: stop probability sigmoid(bias) for each frame of a group."""
    model.stop_head.kernel.assign(tf.zeros_like(model.stop_head.kernel))
    model.stop_head.bias.assign(tf.constant(per_frame_bias, tf.float32))


def test_generation_stops_at_once_when_the_stop_head_is_forced_high(model, prompt):
    tokens, reference, lengths = prompt
    _force_stop(model, [10.0] * 4)
    mel, length = generate(model, tokens, reference[:2], lengths[:2], max_frames=MAX_FRAMES)
    assert length.numpy().tolist() == [1, 1]
    assert mel.shape == (2, 1, N_MELS) and mel.dtype == tf.float32


def test_generation_runs_to_max_frames_when_the_stop_head_is_forced_low(model, prompt):
    tokens, reference, lengths = prompt
    _force_stop(model, [-10.0] * 4)
    mel, length = generate(model, tokens, reference[:2], lengths[:2], max_frames=MAX_FRAMES)
    assert length.numpy().tolist() == [MAX_FRAMES, MAX_FRAMES]
    assert mel.shape == (2, MAX_FRAMES, N_MELS)
    assert np.all(np.isfinite(mel.numpy()))


def test_length_ends_at_the_first_frame_over_the_threshold(model, prompt):
    tokens, reference, lengths = prompt
    # Within each group of r = 4 frames only the third may stop: 0.5 < sigmoid(0.2) < 0.6.
    _force_stop(model, [-10.0, -10.0, 0.2, 10.0])
    _, length = generate(model, tokens, reference[:2], lengths[:2], max_frames=MAX_FRAMES, stop_threshold=0.5)
    assert length.numpy().tolist() == [3, 3]
    _, length = generate(model, tokens, reference[:2], lengths[:2], max_frames=MAX_FRAMES, stop_threshold=0.6)
    assert length.numpy().tolist() == [4, 4]


class ScriptedSpeaker:
    """Stands in for XTTS in the decoding loop: speaks a fixed log-mel energy per frame (one
    row per batch row) and never fires its stop head, so only the silence rule can end a row."""

    reduction_factor = 4
    n_mels = 3

    def __init__(self, energies):
        self.energies = tf.constant(energies, tf.float32)  # [B, frames]

    def decode(self, latents, tokens, text_length, mel, training=False):
        frames = tf.shape(mel)[1]
        energy = self.energies[:, :frames]
        mel_before = tf.tile(energy[:, :, None], [1, 1, self.n_mels]) - tf.constant([0.0, 3.0, 5.0])  # loudest band first
        return {"mel_before": mel_before, "stop_logits": tf.fill(tf.shape(energy), -10.0)}


def test_a_silence_after_speech_ends_the_row_where_it_began():
    loud, quiet, frames = 1.0, -8.0, 48
    speaks_then_stops = [loud] * 13 + [quiet] * (frames - 13)  # silent from frame 13 on
    pauses = [loud] * 8 + [quiet] * 9 + [loud] * 8 + [quiet] * 9 + [loud] * (frames - 34)  # pauses shorter than 10
    starts_silent = [quiet] * frames  # never louder than itself: not a silence after speech
    speaker = ScriptedSpeaker([speaks_then_stops, pauses, starts_silent])
    tokens = tf.constant([[2, 5, 3]] * 3)
    rule = {"silence_frames": 10, "silence_depth": 6.9}  # 60 dB of a magnitude mel
    _, length = autoregress(speaker, tf.zeros([3, 1, 2]), tokens, tf.constant([3, 3, 3]), frames, **rule)
    assert length.numpy().tolist() == [13, frames, frames]
    # A shallower drop than the depth is not silence; and with the rule off nothing stops.
    _, length = autoregress(speaker, tf.zeros([3, 1, 2]), tokens, tf.constant([3, 3, 3]), frames,
                            silence_frames=10, silence_depth=9.5)
    assert length.numpy().tolist() == [frames] * 3
    _, length = autoregress(speaker, tf.zeros([3, 1, 2]), tokens, tf.constant([3, 3, 3]), frames)
    assert length.numpy().tolist() == [frames] * 3


def test_end_silence_is_the_trimming_threshold_in_log_mel_units():
    rule = end_silence(DataConfig(trim_silence_db=60.0))
    assert rule["silence_depth"] == pytest.approx(3 * math.log(10))  # 60 dB of magnitude: a factor 1000
    assert rule["silence_frames"] == round(0.5 * DataConfig().frames_per_second)
    assert end_silence(DataConfig(trim_silence_db=60.0, power=2.0))["silence_depth"] == pytest.approx(6 * math.log(10))
    assert end_silence(DataConfig(trim_silence_db=0.0))["silence_frames"] == 0  # untrimmed clips: stop head only


def test_each_step_matches_teacher_forcing_on_the_generated_frames(model, prompt):
    """The loop is autoregressive: decoding the finished mel with teacher forcing reproduces it."""
    tokens, reference, lengths = prompt
    _force_stop(model, [-10.0] * 4)
    text_length = tf.reduce_sum(tf.cast(tokens != 0, tf.int32), axis=1)
    latents = model.conditioning_latents(reference[:2], lengths[:2])
    mel, length = autoregress(model, latents, tokens, text_length, MAX_FRAMES)
    assert mel.shape == (2, MAX_FRAMES, N_MELS)
    replayed = model.decode(latents, tokens, text_length, mel)["mel_before"]
    np.testing.assert_allclose(replayed.numpy(), mel.numpy(), atol=1e-4)
    # And the frames are not a constant: each group depends on what came before.
    assert np.abs(mel[:, 4:8] - mel[:, 0:4]).max() > 1e-3


def test_averaged_references_make_one_voice_for_every_row(model, prompt):
    tokens, reference, lengths = prompt
    _force_stop(model, [-10.0] * 4)
    averaged, _ = generate(model, tokens, reference, lengths, max_frames=MAX_FRAMES, average_references=True)
    latents = tf.reduce_mean(model.conditioning_latents(reference, lengths), axis=0, keepdims=True)
    explicit, _ = generate(model, tokens, None, None, max_frames=MAX_FRAMES, latents=latents)
    np.testing.assert_allclose(averaged.numpy(), explicit.numpy(), atol=1e-5)
    single, _ = generate(model, tokens, reference[:2], lengths[:2], max_frames=MAX_FRAMES)
    assert np.abs(single.numpy() - averaged.numpy()).max() > 1e-3


# --------------------------------------------------------------------------------------------------
# Griffin-Lim


def _voiced_signal(c: DataConfig, seconds=1.0):
    """A speech-like test signal: a glottal-pulse-rich 120-180 Hz tone with a moving formant."""
    t = np.arange(int(seconds * c.sample_rate)) / c.sample_rate
    f0 = 150.0 + 30.0 * np.sin(2 * np.pi * 2.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / c.sample_rate
    formant = 700.0 + 500.0 * t / seconds
    harmonics = [np.sin(k * phase) * np.exp(-(((k * f0) - formant) / 400.0) ** 2) / k**0.5 for k in range(1, 40)]
    signal = np.sum(harmonics, axis=0)
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def test_stft_matches_the_pipeline_and_inverts_exactly():
    c = DataConfig()
    signal = tf.constant(_voiced_signal(c, 0.5))
    spectrum = griffin_lim.stft(signal, c)
    filters = audio.mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, c.fmin, c.mel_fmax)
    np.testing.assert_allclose(tf.matmul(tf.abs(spectrum), filters), audio.mel_spectrogram(signal, c), atol=1e-4)
    rebuilt = griffin_lim.istft(spectrum, c)
    assert rebuilt.shape[0] == (spectrum.shape[0] - 1) * c.hop_length
    np.testing.assert_allclose(rebuilt, signal[: rebuilt.shape[0]], atol=1e-5)


def test_griffin_lim_reproduces_the_log_mel(tmp_path):
    c = DataConfig()
    signal = _voiced_signal(c)
    log_mel = audio.log_mel(signal, c)
    waveform = griffin_lim.log_mel_to_audio(log_mel, c, iterations=32)
    assert waveform.shape == ((log_mel.shape[0] - 1) * c.hop_length,)
    rms = float(tf.sqrt(tf.reduce_mean(tf.square(waveform))))
    assert 0.5 < rms / np.sqrt(np.mean(signal**2)) < 1.5  # not silent, not blown up

    def error(samples):
        again = audio.log_mel(samples, c)[: log_mel.shape[0]]
        loud = log_mel > math.log(1e-2)  # bins with energy; the floor is all alike
        return float(tf.reduce_mean(tf.abs(again - log_mel)[loud]))

    random_phase = error(griffin_lim.log_mel_to_audio(log_mel, c, iterations=0))
    recovered = error(waveform)
    assert recovered < 0.35 and recovered < 0.5 * random_phase, (recovered, random_phase)

    path = tmp_path / "out" / "gl.wav"
    griffin_lim.write_wav(path, waveform, c.sample_rate)
    samples, rate = audio.load_wav(str(path))
    assert int(rate) == c.sample_rate
    np.testing.assert_allclose(samples, np.clip(waveform, -1, 1), atol=1.0 / 32767)
