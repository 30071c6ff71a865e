"""The neural vocoder's training losses against the recorded segment (`myxtts/training/vocoder_step.py`
sums them): a multi-resolution STFT loss, a compressed complex-spectrum loss and APNet's anti-wrapping
phase losses, and the light spectrogram discriminator with its hinge and feature-matching losses."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

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
