"""The TFLite model of a run: tokens + reference mels -> mel and audio, TFLite built-in ops only.

    inputs (by name):  tokens int32 [L], reference_mel float32 [N, R, n_mels],
                       reference_length int32 [N], max_frames int32 []
    outputs (in order): audio float32 [samples], mel float32 [frames, n_mels]

Every dimension but n_mels is dynamic: resize the inputs to the sentence's, then allocate. Unlike the
SavedModel's `synthesize`, this model does not check its inputs (TFLite's built-in ops cannot raise an
error of ours): a client applies the same rules (`export.checked_inputs`: 1 to settings.json's
`max_tokens` ids, none of them 0 or 1, none past assets/vocab.txt's last line).

The network is the SavedModel's (`export.py`), its weights folded in as constants
(`compat.frozen_function`), and so is the neural vocoder when the export has one: its network is
TFLite's ordinary ops, and its inverse STFT is the DFT-matrix `_istft` below. What differs is
Griffin-Lim (or the vocoder's inverse STFT). TFLite has a kernel for
the forward real FFT but none for its inverse, nor for complex division, so here the STFT and its
inverse are products with the real DFT matrices (cosines and sines of n_fft x n_fft // 2 + 1), and
the phase is kept as two real tensors. It is the same algorithm as `models.griffin_lim` (same window,
framing, least-squares overlap-add, momentum and seeded initial phase), computed in another order of
floating-point operations, so its audio matches the SavedModel's within rounding
(tests/test_export.py states the tolerance). Overlap-add is written as shifted block sums because
`tf.signal.overlap_and_add` lowers to a strided slice TFLite rejects; framing needs n_fft to be a
multiple of hop_length (true of every config shipped: 1024 and 256).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from myxtts.compat import frozen_function
from myxtts.data.audio import _centered_window
from myxtts.models.griffin_lim import initial_angles, mel_to_magnitude
from myxtts.models.inference import synthesize_sentence

ITERATIONS, MOMENTUM, SEED = 32, 0.99, 0  # as `griffin_lim.log_mel_to_audio`'s defaults


def convert(network, data_config, vocoder=None) -> bytes:
    """The TFLite flatbuffer of `network` + `vocoder` (a models.vocoder.Vocoder; None: real-arithmetic
    Griffin-Lim) for `data_config`."""
    d = data_config
    if d.n_fft % d.hop_length:
        raise ValueError(f"TFLite export needs data.n_fft ({d.n_fft}) to be a multiple of data.hop_length ({d.hop_length})")

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, None, d.n_mels], tf.float32),
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])
    def synthesize(tokens, reference_mel, reference_length, max_frames):
        mel = synthesize_sentence(network, tokens, reference_mel, reference_length, max_frames)
        return {"audio": griffin_lim_real(mel_to_magnitude(mel, d), d) if vocoder is None else neural_real(vocoder, mel, d),
                "mel": mel}

    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen_function(synthesize.get_concrete_function())])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def griffin_lim_real(magnitude, d, iterations: int = ITERATIONS, momentum: float = MOMENTUM, seed: int = SEED):
    """`griffin_lim.griffin_lim` of a magnitude [frames, bins], in real arithmetic (module docstring)."""
    real, imag = griffin_lim_phase_real(magnitude, d, iterations, momentum, seed)
    return _istft(magnitude * real, magnitude * imag, d, *_dft(d.n_fft))


def griffin_lim_phase_real(magnitude, d, iterations: int = ITERATIONS, momentum: float = MOMENTUM, seed: int = SEED):
    """`griffin_lim.griffin_lim_phase` as (cos, sin) [frames, bins], in real arithmetic."""
    cos, sin = _dft(d.n_fft)
    angles = initial_angles(magnitude, seed)
    real, imag = tf.cos(angles), tf.sin(angles)
    previous_real, previous_imag = tf.zeros_like(real), tf.zeros_like(imag)
    factor = momentum / (1.0 + momentum)

    def body(i, real, imag, previous_real, previous_imag):
        signal = _istft(magnitude * real, magnitude * imag, d, cos, sin)
        rebuilt_real, rebuilt_imag = _stft(signal, d, cos, sin)
        pushed_real, pushed_imag = rebuilt_real - factor * previous_real, rebuilt_imag - factor * previous_imag
        size = tf.maximum(tf.sqrt(pushed_real * pushed_real + pushed_imag * pushed_imag), 1e-8)
        return i + 1, pushed_real / size, pushed_imag / size, rebuilt_real, rebuilt_imag

    _, real, imag, _, _ = tf.while_loop(lambda i, *_: i < iterations, body,
                                        (tf.constant(0), real, imag, previous_real, previous_imag))
    return real, imag


def neural_real(vocoder, log_mel, d):
    """`vocoder(log_mel[None])[0]` with the inverse STFT (and a Griffin-Lim phase prior's iterations)
    in real arithmetic: [(frames - 1) * hop] samples."""
    phase = None
    if vocoder.phase_prior == "griffin-lim":
        real, imag = griffin_lim_phase_real(mel_to_magnitude(log_mel, d), d)
        phase = real[None], imag[None]
    magnitude, cosine, sine = vocoder.polar(log_mel[None], phase=phase)
    return _istft(magnitude[0] * cosine[0], magnitude[0] * sine[0], d, *_dft(d.n_fft))


def _dft(n_fft: int):
    """cos, sin [n_fft, n_fft // 2 + 1] of 2 pi k n / n_fft (n rows, k columns)."""
    n = np.arange(n_fft)[:, None]
    k = np.arange(n_fft // 2 + 1)[None, :]
    angle = 2.0 * np.pi * ((n * k) % n_fft) / n_fft  # reduced first: exact arguments for large n * k
    return tf.constant(np.cos(angle), tf.float32), tf.constant(np.sin(angle), tf.float32)


def _stft(signal, d, cos, sin):
    """(real, imag) [frames, bins] of `griffin_lim.stft`: centred frames, zero padding of n_fft / 2."""
    half = d.n_fft // 2
    window = tf.constant(_centered_window(d.n_fft, d.win_length), tf.float32)
    frames = tf.signal.frame(tf.pad(signal, [[half, half]]), d.n_fft, d.hop_length) * window
    return tf.matmul(frames, cos), -tf.matmul(frames, sin)


def _istft(real, imag, d, cos, sin):
    """`griffin_lim.istft` of (real, imag) [frames, bins]: [(frames - 1) * hop_length samples]."""
    n_fft, hop, half = d.n_fft, d.hop_length, d.n_fft // 2
    weights = np.full(n_fft // 2 + 1, 2.0, np.float32)
    weights[0] = weights[-1] = 1.0  # DC and Nyquist appear once in a real signal's spectrum
    weights = tf.constant(weights / n_fft)
    window = tf.constant(_centered_window(n_fft, d.win_length), tf.float32)
    frames = (tf.matmul(real * weights, cos, transpose_b=True) - tf.matmul(imag * weights, sin, transpose_b=True)) * window
    count = tf.shape(real)[0]
    signal = _overlap_add(frames, hop)
    envelope = _overlap_add(tf.tile(tf.square(window)[None], tf.stack([count, 1])), hop)
    num_samples = (count - 1) * hop
    signal, envelope = signal[half : half + num_samples], envelope[half : half + num_samples]
    return tf.where(envelope > 1e-8, signal / tf.maximum(envelope, 1e-8), 0.0)


def _overlap_add(frames, hop: int):
    """Frames [F, n_fft] summed at `hop` apart: [(F - 1) * hop + n_fft]; n_fft a multiple of hop."""
    per_frame = int(frames.shape[-1]) // hop
    blocks = tf.reshape(frames, [-1, per_frame, hop])  # block j of frame f lands at block f + j
    total = 0.0
    for j in range(per_frame):
        total += tf.pad(blocks[:, j], [[j, per_frame - 1 - j], [0, 0]])
    return tf.reshape(total, [-1])
