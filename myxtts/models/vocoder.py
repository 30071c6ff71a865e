"""A neural vocoder, log-mel -> waveform, in the style of Vocos (Siuzdenko 2023) and FreeV (2024).

    log-mel [B, T, n_mels] --pseudo-inverse (griffin_lim.mel_to_magnitude)--> prior magnitude [B, T, bins]
      \\--> Conv1D -> ConvNeXt blocks at the frame rate -> LayerNorm
              -> log-magnitude residual (added to the prior's log)  \\
              -> phase as a 2-vector per bin (normalised)           -> spectrum -> inverse STFT -> [B, (T-1) * hop]

With `phase_prior="griffin-lim"` (`train_vocoder.py --phase-prior griffin-lim`) the phase head turns
the phase that 32 iterations of Griffin-Lim find for the prior magnitude instead of phase zero, and
the network reads that phase as its turns over frames and bins (`phase_features`): an untrained
vocoder then speaks Griffin-Lim's audio exactly, and training starts from there. Measured first
(`utilities/magnitude_or_phase.py`): with the clip's own phase the prior magnitude alone scores PESQ
3.87-4.01 where Griffin-Lim's phase gives 2.90-3.03, and a young vocoder's phase is far below
Griffin-Lim's; its audio is where a vocoder loses.

Everything runs at the mel frame rate (no upsampling convolutions), and the inverse STFT is the
same fixed, exact overlap-add as Griffin-Lim's (`griffin_lim.istft`), so the network only predicts
what a frame's spectrum is. Starting from the mel's own pseudo-inverse magnitude leaves it the
residual and the phase to learn (FreeV's observation: far fewer parameters for the same quality).
The heads start at zero residual and phase zero, so an untrained vocoder gives the prior magnitude.

Training (`myxtts/training/vocoder_step.py`; its clips and segments `myxtts/training/vocoder_clips.py`,
its losses and discriminator `myxtts/models/vocoder_losses.py`): random segments of each clip of a waveform batch (the
feature pipeline with `data.mel_on_device`), their log-mel computed in the step, and two losses against the segment:
L1 between log-mels, and a multi-resolution STFT loss (spectral convergence + log magnitude at three
FFT sizes); optionally (`phase_weight`) a third on the compressed complex spectrum, which sees the
phase; optionally (`adversarial_weight`) a light multi-resolution spectrogram discriminator
(`SpectrogramDiscriminator`: five narrow 2-D convs over the log-magnitude at three FFT sizes, hinge
losses and feature matching), trained in the same step with its own optimizer.

A trained vocoder is a folder (`save_vocoder` / `load_vocoder`: weights + the features it was trained
for); `waveform_maker` turns one, or None for Griffin-Lim, into the log-mel -> samples function that
synthesis, validation, the free-running check and the exports call (`synthesis.vocoder_folder` says
which folder a run speaks through). Trained by `utilities/train_vocoder.py` with Keras' `fit` and the
same parts as the acoustic model's step: XLA on a GPU (measured slower for it on a CPU), mixed
precision (bf16, or fp16 with a LossScaleOptimizer per network; the weights stay float32 and are
saved so), Keras' gradient accumulation, the skip of a non-finite update, several GPUs through
`training/distribute.py` (gradients averaged across replicas in the step), `BackupAndRestore`;
BENCHMARKS.md, "Sound quality", has what it measures against Griffin-Lim.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import keras
import tensorflow as tf

from myxtts.models.griffin_lim import griffin_lim_phase, istft, log_mel_to_audio, mel_to_magnitude

# (width, blocks): `tiny` for tests; `base` is Vocos' width with half its depth; `small` a quarter of its cost.
VOCODER_SIZES = {"tiny": (32, 2), "small": (256, 4), "base": (512, 4)}
# What the phase head turns: "none", phase zero (Vocos, FreeV); "griffin-lim", the phase that 32
# iterations of Griffin-Lim find for the prior magnitude (`utilities/magnitude_or_phase.py` measured the
# phase as where a young vocoder loses most against Griffin-Lim; BENCHMARKS.md, "Sound quality").
PHASE_PRIORS = ("none", "griffin-lim")
# Log magnitudes are clipped here before exp: a wild early update must not overflow the spectrum.
_MAX_LOG_MAGNITUDE = 8.0


class ConvNeXtBlock(keras.layers.Layer):
    """Depthwise conv (7 frames) -> LayerNorm -> pointwise MLP (4x, GELU) -> scaled residual."""

    def __init__(self, dim: int, scale: float, **kwargs):
        super().__init__(**kwargs)
        self.depthwise = keras.layers.DepthwiseConv1D(7, padding="same")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.expand = keras.layers.Dense(4 * dim, activation="gelu")
        self.project = keras.layers.Dense(dim)
        self.dim, self.initial_scale = dim, scale

    def build(self, input_shape):
        self.depthwise.build(input_shape)
        self.norm.build(input_shape)
        self.expand.build(input_shape)
        self.project.build((*input_shape[:-1], 4 * self.dim))
        self.scale = self.add_weight(shape=(self.dim,), initializer=keras.initializers.Constant(self.initial_scale), name="scale")

    def call(self, x):
        return x + self.scale * self.project(self.expand(self.norm(self.depthwise(x))))


class Vocoder(keras.Model):
    """log-mel [B, T, n_mels] (as `audio.log_mel` makes it) -> waveform [B, (T - 1) * hop_length]."""

    def __init__(self, data_config, size: str = "base", phase_prior: str = "none", **kwargs):
        # Under a mixed policy Keras would cast the float32 log-mel to bf16 on the way in; the prior
        # magnitude is computed from it in float32 (`spectrum`), and each layer casts for itself.
        super().__init__(autocast=False, **kwargs)
        if size not in VOCODER_SIZES:
            raise ValueError(f"vocoder size {size!r}: one of {', '.join(VOCODER_SIZES)}")
        if phase_prior not in PHASE_PRIORS:
            raise ValueError(f"vocoder phase prior {phase_prior!r}: one of {', '.join(PHASE_PRIORS)}")
        dim, blocks = VOCODER_SIZES[size]
        self.data_config, self.size, self.dim, self.phase_prior = data_config, size, dim, phase_prior
        self.bins = data_config.n_fft // 2 + 1
        self.embed = keras.layers.Conv1D(dim, 7, padding="same")
        if phase_prior == "griffin-lim":  # what the network sees of the phase it turns (`phase_features`)
            self.phase_embed = keras.layers.Dense(dim, name="phase_embed")
        self.blocks = [ConvNeXtBlock(dim, 1.0 / blocks, name=f"block_{i}") for i in range(blocks)]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.magnitude_head = keras.layers.Dense(self.bins, kernel_initializer="zeros")
        # Phase as (cos, sin)-like pairs, starting at (1, 0): phase zero everywhere.
        self.phase_head = keras.layers.Dense(2 * self.bins, kernel_initializer="zeros",
                                             bias_initializer=keras.initializers.Constant(
                                                 [1.0] * self.bins + [0.0] * self.bins))

    def build(self, input_shape=None):
        shape = (None, None, self.data_config.n_mels)
        self.embed.build(shape)
        dim = self.dim
        if self.phase_prior == "griffin-lim":
            self.phase_embed.build((None, None, 4 * self.bins))
        for block in self.blocks:
            block.build((None, None, dim))
        self.norm.build((None, None, dim))
        self.magnitude_head.build((None, None, dim))
        self.phase_head.build((None, None, dim))
        self.built = True

    def call(self, log_mel, training=False):
        real, imaginary = self.spectrum(log_mel)
        return istft(tf.complex(real, imaginary), self.data_config)

    def spectrum(self, log_mel, training=False):
        """The frames' spectrum as (real, imaginary) float32 [B, T, bins]: what `call` inverts. Kept
        real so that the TFLite export (no complex kernels there) inverts it with DFT matrices."""
        magnitude, cosine, sine = self.polar(log_mel, training=training)
        return magnitude * cosine, magnitude * sine

    def polar(self, log_mel, training=False, phase=None):
        """(magnitude, cos phase, sin phase), float32 [B, T, bins] each: the spectrum in polar form, so
        that a loss on the phase angle need not divide by a magnitude that may be ~0.

        With the "griffin-lim" phase prior, `phase` ((cos, sin), float32 [B, T, bins] each; real, so
        that the TFLite export computes it too) is the prior's phase when the caller has it (training:
        computed once per clip, `with_griffin_lim_phase`); None computes it here, over the frames
        given (synthesis: the whole utterance)."""
        log_mel = tf.cast(log_mel, tf.float32)
        prior = mel_to_magnitude(log_mel, self.data_config)  # [B, T, bins], >= 0
        x = self.embed(tf.cast(log_mel, self.compute_dtype))
        if self.phase_prior == "griffin-lim":
            if phase is None:
                found = griffin_lim_phase(prior, self.data_config)
                phase = tf.math.real(found), tf.math.imag(found)
            x = x + self.phase_embed(tf.cast(phase_features(*phase, prior, self.data_config), self.compute_dtype))
        elif phase is not None:
            raise ValueError("a phase was given to a vocoder without a phase prior")
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        log_magnitude = tf.math.log(prior + 1e-5) + tf.cast(self.magnitude_head(x), tf.float32)
        magnitude = tf.exp(tf.minimum(log_magnitude, _MAX_LOG_MAGNITUDE))
        real, imaginary = tf.split(tf.cast(self.phase_head(x), tf.float32), 2, axis=-1)
        norm = tf.maximum(tf.sqrt(real * real + imaginary * imaginary), 1e-6)
        cosine, sine = real / norm, imaginary / norm
        if phase is not None:  # the head's unit vector turns the prior phase (untrained: by nothing)
            prior_cosine, prior_sine = phase
            cosine, sine = prior_cosine * cosine - prior_sine * sine, prior_cosine * sine + prior_sine * cosine
        return magnitude, cosine, sine


# Below this magnitude (~30 dB under a peak-normalised clip's loud bins) a bin's phase fades out of
# `phase_features`: Griffin-Lim's phase there is chaotic (TFLite's real-arithmetic iterations and
# TensorFlow's end up to 2.7 rad apart in bins of magnitude 0.01, 0.5 rad at 0.1, measured on a demo
# clip), and it would reach every output through the network.
_PHASE_FEATURE_MAGNITUDE = 0.3


def phase_features(cosine, sine, magnitude, data_config) -> tf.Tensor:
    """What a network can read of a phase ((cos, sin) float32 [..., T, bins]) wherever it lies:
    [..., T, 4 * bins], the cos and sin of each bin's turn since the previous frame less its centre
    frequency's turn (how far the instantaneous frequency is from the bin's), and of its turn from
    the bin below less pi (a centred window's lobe turns by pi a bin: the group delay's part), each
    weighted by m^2 / (m^2 + 0.3^2) of the bin's `magnitude` m (quiet bins' phase is noise). The raw
    angle, uniform over the circle, says nothing by itself. Real arithmetic (TFLite has no complex)."""
    c = data_config
    bins = int(cosine.shape[-1])
    centre = tf.constant(2.0 * math.pi * c.hop_length / c.n_fft) * tf.range(bins, dtype=tf.float32)

    def turn(a_cos, a_sin, b_cos, b_sin):  # a * conj(b)
        return a_cos * b_cos + a_sin * b_sin, a_sin * b_cos - a_cos * b_sin

    def earlier(x, axis):  # the previous frame (axis -2) or bin (axis -1); the first is its own
        first = x[..., :1, :] if axis == -2 else x[..., :1]
        rest = x[..., :-1, :] if axis == -2 else x[..., :-1]
        return tf.concat([first, rest], axis=axis)

    time_cos, time_sin = turn(cosine, sine, earlier(cosine, -2), earlier(sine, -2))
    time_cos, time_sin = turn(time_cos, time_sin, tf.cos(centre), tf.sin(centre))
    bin_cos, bin_sin = turn(cosine, sine, earlier(cosine, -1), earlier(sine, -1))
    power = tf.square(magnitude)
    weight = power / (power + _PHASE_FEATURE_MAGNITUDE ** 2)
    return tf.concat([time_cos, time_sin, -bin_cos, -bin_sin], axis=-1) * tf.tile(weight, [1] * (weight.shape.rank - 1) + [4])


# A vocoder folder (utilities/train_vocoder.py's --output-dir, or RUN/vocoder): the weights, and what
# they were trained for. The features are checked against the acoustic run's before use: a vocoder
# trained on other mels (another rate, hop, band count, floor) would speak noise without complaint.
WEIGHTS_FILE, SETTINGS_FILE = "vocoder.weights.h5", "vocoder.json"
FEATURE_KEYS = ("sample_rate", "n_fft", "hop_length", "win_length", "n_mels", "fmin", "mel_fmax", "mel_scale",
                "power", "log_floor")


def features_of(data_config) -> dict:
    """The settings of `data_config` that shape the log-mel a vocoder is trained on (its folder records them)."""
    return {key: getattr(data_config, key) for key in FEATURE_KEYS}


class VocoderMismatch(ValueError):
    """The vocoder folder's features differ from the run's."""


def save_vocoder(vocoder: Vocoder, folder) -> None:
    """Write the vocoder folder. Each file is written beside itself and renamed into place, so a save
    cut short (a full disk, a kill) leaves the vocoder that was there, never half of a new one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"size": vocoder.size, "phase_prior": vocoder.phase_prior, "features": features_of(vocoder.data_config)}
    weights = folder / f"incomplete.{WEIGHTS_FILE}"  # Keras wants the name to end in .weights.h5
    described = folder / f"incomplete.{SETTINGS_FILE}"
    try:
        vocoder.save_weights(str(weights))
        described.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        # Weights first: a vocoder replaced in place (train_vocoder.py --init-from FOLDER) keeps its settings.
        os.replace(weights, folder / WEIGHTS_FILE)
        os.replace(described, folder / SETTINGS_FILE)
    finally:
        for path in (weights, described):
            path.unlink(missing_ok=True)


def is_vocoder_folder(folder) -> bool:
    return (Path(folder) / WEIGHTS_FILE).is_file() and (Path(folder) / SETTINGS_FILE).is_file()


def vocoder_settings(folder, griffin_lim: str = "griffin-lim") -> dict:
    """What `save_vocoder` recorded in `folder` ("size", "phase_prior" (absent: "none", as saved before
    there were priors), "features"); FileNotFoundError naming what a vocoder folder lacks, and
    `griffin_lim`, how the caller asks for Griffin-Lim instead."""
    folder = Path(folder)
    for name in (SETTINGS_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} is not a vocoder folder (no {name}); pass the --output-dir of "
                                    f"utilities/train_vocoder.py, or {griffin_lim}")
    try:
        settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
    except ValueError as error:
        raise VocoderMismatch(f"{folder / SETTINGS_FILE} is not a vocoder's settings ({error})") from None
    return {"phase_prior": "none", **settings}


def check_features(folder, settings: dict, data_config) -> None:
    """VocoderMismatch naming every feature key in which the vocoder `settings` (of `folder`) differ from `data_config`."""
    wanted = features_of(data_config)
    differ = [f"data.{key}: vocoder {settings['features'].get(key)!r}, run {value!r}"
              for key, value in wanted.items() if settings["features"].get(key) != value]
    if differ:
        raise VocoderMismatch(f"{folder} was trained on other features than this run's ({'; '.join(differ)}); "
                              "train a vocoder with the run's data settings (train_vocoder.py --run RUN)")


def load_vocoder(folder, data_config, policy: str = "float32") -> Vocoder:
    """The vocoder saved in `folder` by `save_vocoder`, for mels made with `data_config`, computing in
    `policy` (float32 whatever the global policy, unless told: a training run sets mixed_bfloat16, and
    the vocoder was measured in float32; training it on from here may ask for mixed precision).

    Raises FileNotFoundError naming what is missing, VocoderMismatch naming every feature key that differs."""
    folder = Path(folder)
    settings = vocoder_settings(folder)
    check_features(folder, settings, data_config)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)  # every layer's, not only the outer model's
    try:
        vocoder = Vocoder(data_config, size=settings["size"], phase_prior=settings["phase_prior"])
        vocoder.build()
    finally:
        keras.config.set_dtype_policy(previous)
    try:
        vocoder.load_weights(str(folder / WEIGHTS_FILE))
    except (OSError, ValueError) as error:  # truncated or not HDF5 (h5py's OSError names no file), other shapes
        raise VocoderMismatch(f"{folder / WEIGHTS_FILE} cannot be read as this vocoder's weights "
                              f"({str(error).splitlines()[0][:200]}): train it again (utilities/train_vocoder.py), "
                              "or pass --vocoder griffin-lim") from None
    vocoder.folder = str(folder)  # where it came from, for reports
    return vocoder


def waveform_maker(data_config, vocoder: Vocoder | None = None):
    """log-mel [frames, n_mels] -> samples float32 [(frames - 1) * hop]: through `vocoder`, or
    Griffin-Lim (32 iterations, seed 0) when there is none. One traced function per maker."""
    if vocoder is None:
        return lambda log_mel: log_mel_to_audio(log_mel, data_config)
    traced = tf.function(lambda log_mel: vocoder(log_mel[None])[0], reduce_retracing=True)
    return lambda log_mel: traced(tf.convert_to_tensor(log_mel, tf.float32))
