"""Log-mel back to a waveform without a neural vocoder: filterbank inversion plus Griffin-Lim.

    log-mel -> exp -> linear spectrum (non-negative least squares against the mel filterbank)
      -> magnitude (square root first if data.power == 2) -> fast Griffin-Lim phase recovery
      -> waveform

Good enough to hear what a model has learned (words, pitch contour, voice) on a machine without
a vocoder; expect the phasey, metallic sound Griffin-Lim is known for. The STFT matches the
feature pipeline exactly (`myxtts.data.audio`): centered frames with zero padding of n_fft / 2, a
periodic Hann window of win_length centred in n_fft, hop_length between frames.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import tensorflow as tf

from myxtts.data.audio import _centered_window, mel_filterbank

# Projected-gradient refinements of the pseudo-inverse: it alone rings (negative side lobes
# clipped to 0 leave holes between filters); a few steps of NNLS fill them in for almost no cost.
_NNLS_STEPS = 20


def log_mel_to_audio(log_mel, data_config, iterations: int = 32, *, momentum: float = 0.99, seed: int = 0) -> tf.Tensor:
    """Waveform [..., samples] float32 of log-mels [..., frames, n_mels] (as `audio.log_mel` makes them).

    Output length is (frames - 1) * hop_length samples; `seed` fixes the random initial phase.
    """
    if tf.executing_eagerly():
        # Called eagerly, every op of the 32 iterations would be dispatched from Python (about 15 ms
        # an iteration on the 2-core CPU); one traced graph per setting runs them in TensorFlow.
        traced = _traced(_setting(data_config), data_config, iterations, momentum, seed)
        return traced(tf.convert_to_tensor(log_mel, tf.float32))
    magnitude = mel_to_magnitude(log_mel, data_config)
    return griffin_lim(magnitude, data_config, iterations, momentum=momentum, seed=seed)


def _setting(c) -> tuple:
    """The data keys Griffin-Lim reads: configs equal in these share one traced function."""
    return (c.sample_rate, c.n_fft, c.hop_length, c.win_length, c.n_mels, float(c.fmin), float(c.mel_fmax),
            c.mel_scale, float(c.power))


_TRACED = {}


def _traced(setting: tuple, data_config, iterations: int, momentum: float, seed: int):
    key = (setting, iterations, float(momentum), seed)
    if key not in _TRACED:
        _TRACED[key] = tf.function(lambda log_mel: log_mel_to_audio(log_mel, data_config, iterations, momentum=momentum,
                                                                     seed=seed), reduce_retracing=True)
    return _TRACED[key]


def mel_to_magnitude(log_mel, data_config) -> tf.Tensor:
    """[..., frames, n_mels] log-mel -> [..., frames, n_fft // 2 + 1] STFT magnitude, >= 0."""
    c = data_config
    mel = tf.exp(tf.convert_to_tensor(log_mel, tf.float32))  # undo the log; the floor becomes ~0
    filters, inverse, step = _filterbank_inverse(
        c.sample_rate, c.n_fft, c.n_mels, float(c.fmin), float(c.mel_fmax), c.mel_scale == "htk"
    )
    spectrum = tf.nn.relu(tf.matmul(mel, inverse))  # [..., frames, bins]: pseudo-inverse, clipped at 0
    for _ in range(_NNLS_STEPS):
        residual = tf.matmul(spectrum, filters) - mel  # [..., frames, n_mels]
        spectrum = tf.nn.relu(spectrum - step * tf.matmul(residual, filters, transpose_b=True))
    if c.power == 2.0:
        spectrum = tf.sqrt(spectrum)  # power -> magnitude
    return spectrum


@functools.lru_cache(maxsize=None)
def _filterbank_inverse(sample_rate, n_fft, n_mels, fmin, fmax, htk):
    """(filters [bins, n_mels], pseudo-inverse [n_mels, bins], NNLS step size), as constants."""
    filters = mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax, htk).astype(np.float64)
    # 1 / (largest eigenvalue of F F^T): the largest step for which projected gradient descent
    # on ||S F - mel||^2 cannot diverge.
    step = 1.0 / np.linalg.eigvalsh(filters.T @ filters).max()
    return filters.astype(np.float32), np.linalg.pinv(filters).astype(np.float32), np.float32(step)


def griffin_lim(magnitude, data_config, iterations: int = 32, *, momentum: float = 0.99, seed: int = 0) -> tf.Tensor:
    """Waveform [..., samples] whose STFT magnitude approximates `magnitude` [..., frames, bins].

    The fast variant (Perraudin et al. 2013): each phase estimate is pushed past the previous one
    by `momentum`, which converges in far fewer iterations than plain Griffin-Lim; 0 is plain.
    """
    phase = griffin_lim_phase(magnitude, data_config, iterations, momentum=momentum, seed=seed)
    return istft(tf.cast(magnitude, tf.complex64) * phase, data_config)


def griffin_lim_phase(magnitude, data_config, iterations: int = 32, *, momentum: float = 0.99, seed: int = 0) -> tf.Tensor:
    """The phase `griffin_lim` ends with: complex64 of modulus 1, shaped like `magnitude`."""
    magnitude = tf.convert_to_tensor(magnitude, tf.float32)
    angles = initial_angles(magnitude, seed)
    phase = tf.exp(tf.complex(tf.zeros_like(angles), angles))
    magnitude = tf.cast(magnitude, tf.complex64)
    previous = tf.zeros_like(phase)
    factor = tf.complex(momentum / (1.0 + momentum), 0.0)

    def body(i, phase, previous):
        rebuilt = stft(istft(magnitude * phase, data_config), data_config)
        pushed = rebuilt - factor * previous
        return i + 1, unit_phase(pushed), rebuilt

    _, phase, _ = tf.while_loop(lambda i, *_: i < iterations, body, (tf.constant(0), phase, previous))
    return phase


def unit_phase(spectrum) -> tf.Tensor:
    """`spectrum` (complex64) scaled to modulus 1 bin by bin: its phase alone (a bin of exactly 0 stays 0)."""
    return spectrum / tf.cast(tf.maximum(tf.abs(spectrum), 1e-8), tf.complex64)


# Random initial phases come from one table, repeated along time for longer inputs: the same for a
# given seed in every runtime, including TFLite, whose built-in ops have no random generator.
_ANGLE_TABLE_FRAMES = 1024


@functools.lru_cache(maxsize=4)
def _angle_table(bins: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 2.0 * np.pi, (_ANGLE_TABLE_FRAMES, bins)).astype(np.float32)


def initial_angles(magnitude, seed: int) -> tf.Tensor:
    """Phase angles shaped like `magnitude` [..., frames, bins]: rows of a seeded table, the same
    for every leading index."""
    frames, bins = tf.shape(magnitude)[-2], int(magnitude.shape[-1])
    table = tf.constant(_angle_table(bins, seed))
    repeats = (frames + _ANGLE_TABLE_FRAMES - 1) // _ANGLE_TABLE_FRAMES
    return tf.broadcast_to(tf.tile(table, tf.stack([repeats, 1]))[:frames], tf.shape(magnitude))


def stft(signal, data_config) -> tf.Tensor:
    """Complex STFT [..., frames, bins] of [..., samples], framed exactly like `audio.mel_spectrogram`."""
    c = data_config
    half = c.n_fft // 2
    padded = tf.pad(signal, [[0, 0]] * (signal.shape.rank - 1) + [[half, half]])
    return tf.signal.stft(padded, c.n_fft, c.hop_length, c.n_fft, window_fn=_window_fn(c))


def istft(spectrum, data_config) -> tf.Tensor:
    """Inverse of `stft`: [..., frames, bins] -> [..., (frames - 1) * hop_length samples].

    Least-squares overlap-add: windowed frames summed, divided by the summed squared windows.
    """
    c = data_config
    half = c.n_fft // 2
    frames = tf.shape(spectrum)[-2]
    num_samples = (frames - 1) * c.hop_length
    signal = tf.signal.inverse_stft(spectrum, c.n_fft, c.hop_length, c.n_fft, window_fn=_window_fn(c))
    window = tf.constant(_centered_window(c.n_fft, c.win_length))
    # Computed for this number of frames rather than the steady state, so the first and last
    # frames (covered by fewer windows) come out right too.
    envelope = tf.signal.overlap_and_add(tf.tile(tf.square(window)[None], tf.stack([frames, 1])), c.hop_length)
    envelope = envelope[half : half + num_samples]  # [samples]
    # Where no window reaches (never, for hop <= win_length) the sample stays 0.
    return tf.math.divide_no_nan(signal[..., half : half + num_samples], tf.where(envelope > 1e-8, envelope, 0.0))


def _window_fn(c):
    window = _centered_window(c.n_fft, c.win_length)
    return lambda length, dtype: tf.constant(window, dtype)


def write_wav(path, samples, sample_rate: int) -> None:
    """Write float samples [samples] (mono) or [samples, channels] as a 16-bit PCM WAV file.

    Written beside `path` and renamed over it, so a write cut short (a full disk, Ctrl-C) leaves the
    file that was there; OSError("cannot write PATH: why") when it cannot be written. The file beside
    it is this process's own: two syntheses to one --out shared one, so one renamed the other's
    half-written file into place and the other said it could not write (No such file or directory)."""
    samples = tf.clip_by_value(tf.convert_to_tensor(samples, tf.float32), -1.0, 1.0)
    if samples.shape.rank == 1:
        samples = samples[:, None]
    path = os.fspath(path)
    partial = f"{path}.partial-{os.getpid()}"
    try:
        directory = os.path.dirname(path)
        if directory:
            tf.io.gfile.makedirs(directory)
        tf.io.write_file(partial, tf.audio.encode_wav(samples, sample_rate))
        tf.io.gfile.rename(partial, path, overwrite=True)
    except tf.errors.OpError as error:
        if tf.io.gfile.exists(partial):
            tf.io.gfile.remove(partial)
        why = error.message.split("; ")[-1].strip()  # TensorFlow's "<file>; No space left on device"
        raise OSError(f"cannot write {path}: {why}") from None
