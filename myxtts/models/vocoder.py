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

Training (`myxtts/training/vocoder_step.py`): random segments of each clip of a waveform batch (the
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
import random
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


# (n_fft, hop) of the multi-resolution STFT loss: around the features' own 1024 / 256.
STFT_RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))


def multi_resolution_stft_loss(target, predicted) -> tf.Tensor:
    """Mean over resolutions of spectral convergence + L1 of log magnitudes, [B, n] waveforms."""
    total = 0.0
    for n_fft, hop in STFT_RESOLUTIONS:  # tf.signal.stft's default window: periodic Hann
        t = tf.abs(tf.signal.stft(target, n_fft, hop, n_fft))
        p = tf.abs(tf.signal.stft(predicted, n_fft, hop, n_fft))
        convergence = tf.norm(t - p) / tf.maximum(tf.norm(t), 1e-7)
        log_magnitude = tf.reduce_mean(tf.abs(tf.math.log(t + 1e-5) - tf.math.log(p + 1e-5)))
        total += convergence + log_magnitude
    return total / len(STFT_RESOLUTIONS)


def compressed_spectrum_loss(target, real, imaginary, power: float = 0.3) -> tf.Tensor:
    """Mean squared distance between power-law compressed spectra |S|^power e^(i angle S): unlike
    the magnitude losses it sees the phase, weighted towards the loud bins where the phase is heard."""
    target_real, target_imaginary = tf.math.real(target), tf.math.imag(target)

    def compressed(re, im):
        scale = tf.pow(tf.sqrt(re * re + im * im) + 1e-5, power - 1.0)
        return re * scale, im * scale

    target_real, target_imaginary = compressed(tf.stop_gradient(target_real), tf.stop_gradient(target_imaginary))
    real, imaginary = compressed(real, imaginary)
    return tf.reduce_mean(tf.square(real - target_real) + tf.square(imaginary - target_imaginary))


def anti_wrapped(x) -> tf.Tensor:
    """|x| after wrapping x into [-pi, pi]: the distance of two angles whose difference is x."""
    turn = 2.0 * math.pi
    return tf.abs(x - turn * tf.round(x / turn))


def phase_angle_losses(target, cosine, sine) -> dict:
    """APNet's (Ai & Ling 2023) anti-wrapping losses between the phase of the complex spectrum `target`
    and the predicted one (cos, sin) [B, T, bins]: the angle itself ("instantaneous"), its difference
    between neighbouring bins ("group_delay") and between neighbouring frames ("frequency"), each a mean
    over frames and bins. The magnitude losses see the phase only through what the overlap-add makes of
    it; these see it directly, which FreeV and APNet found is what makes phase prediction learn fast."""
    truth = tf.stop_gradient(tf.math.angle(target))
    predicted = tf.math.atan2(sine, cosine)
    return {
        "instantaneous": tf.reduce_mean(anti_wrapped(predicted - truth)),
        "group_delay": tf.reduce_mean(anti_wrapped(tf.experimental.numpy.diff(predicted, axis=-1)
                                                   - tf.experimental.numpy.diff(truth, axis=-1))),
        "frequency": tf.reduce_mean(anti_wrapped(tf.experimental.numpy.diff(predicted, axis=-2)
                                                 - tf.experimental.numpy.diff(truth, axis=-2))),
    }


def random_segments(waveforms, mel_length, segment_frames: int, hop_length: int, seed=None) -> tf.Tensor:
    """[B, (segment_frames - 1) * hop] samples: a random stretch of each clip inside its `mel_length`
    frames (from the start, zero-padded, for a clip shorter than the segment)."""
    start = segment_starts(mel_length, segment_frames, seed)
    return waveform_segments(waveforms, start, segment_frames, hop_length)


def segment_starts(mel_length, segment_frames: int, seed=None) -> tf.Tensor:
    """[B] int32: a random first frame per clip, with `segment_frames` frames inside its `mel_length`."""
    return first_frames(tf.random.uniform(tf.shape(mel_length), 0.0, 1.0, seed=seed), mel_length, segment_frames)


def first_frames(draw, mel_length, segment_frames: int) -> tf.Tensor:
    """int32 first frames for uniform `draw`s in [0, 1), shaped like `mel_length`: every start that
    leaves `segment_frames` frames inside the clip equally likely (0 for a shorter clip)."""
    last_start = tf.maximum(mel_length - segment_frames, 0)
    return tf.cast(tf.floor(draw * tf.cast(last_start + 1, tf.float32)), tf.int32)


def waveform_segments(waveforms, start, segment_frames: int, hop_length: int) -> tf.Tensor:
    """The samples of frames start .. start + segment_frames - 1 (frame t is centred on sample t * hop)."""
    length = (segment_frames - 1) * hop_length
    padded = tf.pad(waveforms, [[0, 0], [0, length]])
    index = (start * hop_length)[:, None] + tf.range(length)[None]
    return tf.gather(padded, index, batch_dims=1)


def mel_segments(mel, start, segment_frames: int) -> tf.Tensor:
    """Frames start .. start + segment_frames - 1 of each clip's mel [B, T, n_mels] (past T: the last frame)."""
    index = tf.minimum(start[:, None] + tf.range(segment_frames)[None], tf.shape(mel)[1] - 1)
    return tf.gather(mel, index, batch_dims=1)


def teacher_forced_mels(network, batches, data_config) -> dict:
    """The acoustic `network`'s own mels of every clip of `batches` (waveform batches, `data.mel_on_device`),
    decoded on the recording's alignment so that frame t still belongs with the samples around t * hop:
    held in memory as `held_clips` holds them ("mel": the model's).

    A vocoder fine-tuned on these (`VocoderTrainer` takes the batch's "mel" as its input) learns the
    acoustic model's smoothed mels instead of meeting them for the first time at synthesis."""
    from myxtts.data.pipeline import mel_from_audio

    # Traced: called eagerly, the alignment's loops would dispatch every frame's ops from Python.
    decode = tf.function(lambda batch: network(mel_from_audio(batch, data_config), training=False)["mel"],
                         reduce_retracing=True)
    return held_clips([(batch["audio"], batch["mel_length"], decode(batch)) for batch in batches], data_config)


def recorded_mels(batches, data_config) -> dict:
    """Every clip of `batches` (waveform batches, `data.mel_on_device`) with its log-mel, as
    `teacher_forced_mels` gives the model's (`held_clips`)."""
    from myxtts.data.pipeline import mel_from_audio

    mels = tf.function(lambda batch: mel_from_audio(batch, data_config)["mel"], reduce_retracing=True)
    return held_clips([(batch["audio"], batch["mel_length"], mels(batch)) for batch in batches], data_config)


def held_clips(batches, data_config) -> dict:
    """[(audio [B, n], mel_length [B], mel [B, T, n_mels])] -> the clips held in memory, unpadded:
    {"audio" ragged [N, (samples)], "mel_length" [N], "mel" ragged [N, (frames), n_mels]}.
    `clip_stream` makes training batches of them. Ragged, not padded to the longest clip: padded, the
    demo corpus's 376 clips with their phase (`with_griffin_lim_phase`) held 869 MB."""
    audio, mel, lengths = [], [], []
    for audio_batch, frames_batch, mel_batch in batches:
        for i in range(int(tf.shape(frames_batch)[0])):
            frames = int(frames_batch[i])
            audio.append(audio_batch[i, : (frames - 1) * data_config.hop_length])
            mel.append(mel_batch[i, :frames])
            lengths.append(frames)
    lengths = tf.constant(lengths, tf.int32)
    return {"audio": tf.RaggedTensor.from_row_lengths(tf.concat(audio, 0), (lengths - 1) * data_config.hop_length),
            "mel_length": lengths,
            "mel": tf.RaggedTensor.from_row_lengths(tf.concat(mel, 0), lengths)}


def with_griffin_lim_phase(clips: dict, data_config, progress=None) -> dict:
    """`clips` (as `held_clips` makes them) and "phase": the angle (float16, ragged [N, (frames), bins])
    of Griffin-Lim's phase for each clip's prior magnitude, computed over the clip alone as synthesis
    computes it, once: 32 iterations for every segment of every epoch would make a training step ~1.5x
    as long."""
    find = tf.function(lambda mel: tf.math.angle(griffin_lim_phase(mel_to_magnitude(mel, data_config), data_config)),
                       reduce_retracing=True)
    angles, count = [], int(clips["mel_length"].shape[0])
    for i in range(count):
        angles.append(tf.cast(find(clips["mel"][i]), tf.float16))
        if progress is not None:
            progress(i + 1, count)
    return {**clips, "phase": tf.RaggedTensor.from_row_lengths(tf.concat(angles, 0), clips["mel_length"])}


def clip_stream(clips: dict, batch_size: int, data_config, segment_frames: int, seed=None, shard: int = 0,
                shards: int = 1):
    """Endless shuffled batches of held `clips`, one segment of `segment_frames` frames from each at a
    random first frame (as `segment_starts` draws it; a short clip's frames past its end are the log
    floor and silence), as `VocoderTrainer` takes them. Cut here, not in the step, so that every batch
    has one shape: padded to each batch's longest clip, an XLA-compiled step compiled again at every
    batch (on an H200 the first 50 updates had not finished 150 s in; BENCHMARKS.md)."""
    floor = float(tf.math.log(data_config.log_floor))
    hop = data_config.hop_length
    samples = (segment_frames - 1) * hop  # what `waveform_segments` cuts for these frames

    def cut(values, begin, size, padding):  # values[begin : begin + size], padded past the end to size
        piece = values[begin:begin + size]
        rank = len(values.shape)
        piece = tf.pad(piece, [[0, size - tf.shape(piece)[0]]] + [[0, 0]] * (rank - 1),
                       constant_values=tf.cast(padding, values.dtype))
        return tf.ensure_shape(piece, [size] + values.shape[1:].as_list())

    # Each element's first frame drawn from (seed, its index): the same batches for the same seed, however
    # many map calls run at once (a stateful random op in a parallel map draws in any order).
    base = random.randrange(2**31) if seed is None else int(seed)

    def segment(index, clip):  # a ragged clip sliced out of `clips` holds one uniform row: dense first
        clip = {key: value.to_tensor() if isinstance(value, tf.RaggedTensor) else value for key, value in clip.items()}
        draw = tf.random.stateless_uniform([], seed=tf.stack([tf.constant(base, tf.int64), index]))
        start = first_frames(draw, clip["mel_length"], segment_frames)
        cut_clip = {"audio": cut(clip["audio"], start * hop, samples, 0.0),
                    "mel_length": tf.minimum(clip["mel_length"], segment_frames)}  # the step's own draw is then 0
        for key, padding in (("mel", floor), ("phase", 0.0)):
            if key in clip:
                cut_clip[key] = cut(clip[key], start, segment_frames, padding)
        return cut_clip

    count = int(clips["mel_length"].shape[0])
    return (tf.data.Dataset.from_tensor_slices(clips).shard(shards, shard).shuffle(count, seed=seed).repeat().enumerate()
            .map(segment, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size, drop_remainder=True).prefetch(2))


class SpectrogramDiscriminator(keras.Model):
    """Real or vocoded? Waveforms [B, n] -> at each FFT size of `resolutions`, the log-magnitude
    [B, frames, bins, 1] through four narrow 2-D convs (3 frames x 5 bins, every one halving the
    bins) and a 3 x 3 one to a map of logits. Narrow on purpose: the GAN vocoders' discriminators
    (HiFi-GAN's, Vocos') are sized for GPUs. On two CPU cores this one at 8 channels makes the
    small vocoder's update 1.7x as long (210 -> 360 ms; at 16 channels 2.8x; `benchmark_vocoder.py
    --train --discriminator`).

    `call` returns, per resolution, (logits [B, frames, bins'], [each hidden layer's output]): the
    feature-matching loss compares the hidden layers on real and vocoded audio."""

    def __init__(self, resolutions=STFT_RESOLUTIONS, channels: int = 8, **kwargs):
        super().__init__(autocast=False, **kwargs)  # waveforms stay float32: the STFT takes no bf16
        self.resolutions, self.channels = tuple(resolutions), channels

        def stack(n_fft):
            convs = [keras.layers.Conv2D(channels, (3, 5), strides=(1, 2), padding="same", name=f"r{n_fft}_down{i}")
                     for i in range(4)]
            convs += [keras.layers.Conv2D(channels, (3, 3), padding="same", name=f"r{n_fft}_mix")]
            return convs, keras.layers.Conv2D(1, (3, 3), padding="same", name=f"r{n_fft}_out")

        self.stacks = [stack(n_fft) for n_fft, _ in self.resolutions]

    def build(self, input_shape=None):
        for (n_fft, _), (convs, out) in zip(self.resolutions, self.stacks):
            shape = [None, None, n_fft // 2 + 1, 1]
            for conv in convs:
                conv.build(shape)
                shape = conv.compute_output_shape(shape)
            out.build(shape)
        self.built = True

    def call(self, waveforms):
        outputs = []
        for (n_fft, hop), (convs, out) in zip(self.resolutions, self.stacks):
            x = tf.math.log(tf.abs(tf.signal.stft(waveforms, n_fft, hop, n_fft)) + 1e-5)[..., None]
            features = []
            for conv in convs:
                x = tf.nn.leaky_relu(conv(x), 0.1)
                features.append(x)
            # float32 out whatever the policy: the losses are summed in float32.
            outputs.append((tf.cast(tf.squeeze(out(x), -1), tf.float32), [tf.cast(f, tf.float32) for f in features]))
        return outputs


def adversarial_losses(real_outputs, fake_outputs) -> dict:
    """Hinge losses and feature matching from a `SpectrogramDiscriminator`'s outputs on real and vocoded
    audio, each a mean over resolutions: "discriminator" (real above +1, vocoded below -1),
    "adversarial" (the vocoder's: vocoded above +1), "feature" (L1 between their hidden layers, each
    scaled by the real layer's mean magnitude so that no layer dominates)."""
    discriminator = adversarial = feature = 0.0
    for (real, real_features), (fake, fake_features) in zip(real_outputs, fake_outputs):
        discriminator += tf.reduce_mean(tf.nn.relu(1.0 - real)) + tf.reduce_mean(tf.nn.relu(1.0 + fake))
        adversarial += tf.reduce_mean(tf.nn.relu(1.0 - fake))
        for r, f in zip(real_features, fake_features):
            r = tf.stop_gradient(r)
            feature += tf.reduce_mean(tf.abs(r - f)) / (tf.reduce_mean(tf.abs(r)) + 1e-5) / len(real_features)
    count = len(real_outputs)
    return {"discriminator": discriminator / count, "adversarial": adversarial / count, "feature": feature / count}
