"""The neural vocoder's training step (`myxtts/models/vocoder.py` has the network,
`myxtts/models/vocoder_losses.py` its losses, `vocoder_clips.py` its segments), as `step.py` is the
acoustic model's: Keras' `fit` drives it, with the same parts (skip of a non-finite update, loss
scaling under fp16, Keras' gradient accumulation, gradients averaged across replicas).
`utilities/train_vocoder.py` builds and runs it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from myxtts.data import audio
from myxtts.models.griffin_lim import istft, stft
from myxtts.models.vocoder import Vocoder
from myxtts.models.vocoder_losses import (SpectrogramDiscriminator, adversarial_losses, compressed_spectrum_loss,
                                          multi_resolution_stft_loss, phase_angle_losses)
from myxtts.training.distribute import all_reduce_mean, reducible_logs
from myxtts.training.step import applied, loss_scale
from myxtts.training.vocoder_clips import mel_segments, segment_starts, waveform_segments


class VocoderTrainer(keras.Model):
    """Trains a `Vocoder` on waveform batches ({"audio": [B, n], "mel_length": [B]}): `fit` drives it.
    With a "mel" [B, T, n_mels] in the batch, that is the vocoder's input (the acoustic model's own
    mels, `teacher_forced_mels`); the losses still compare with the recording.

    `adversarial_weight` > 0 adds a `SpectrogramDiscriminator`, trained in the same step by
    `discriminator_optimizer` (one forward pass of it on the real and the vocoded segments serves both
    updates), and adds to the vocoder's loss `adversarial_weight` x (its hinge loss + 2 x feature
    matching): with the reconstruction at weight 1, HiFi-GAN's ratios (1 : 2 : 45 for adversarial :
    feature matching : mel L1) are about 0.02 here."""

    def __init__(self, vocoder: Vocoder, segment_frames: int = 32, phase_weight: float = 0.0,
                 adversarial_weight: float = 0.0, discriminator_optimizer=None, phase_angle_weight: float = 0.0,
                 **kwargs):
        super().__init__(**kwargs)
        self.vocoder, self.segment_frames, self.phase_weight = vocoder, segment_frames, phase_weight
        self.phase_angle_weight = phase_angle_weight
        self.adversarial_weight = adversarial_weight
        if adversarial_weight:
            self.discriminator = SpectrogramDiscriminator(name="discriminator")
            self.discriminator_optimizer = discriminator_optimizer or keras.optimizers.AdamW(2e-4, beta_1=0.8, beta_2=0.99)
        names = (("loss", "mel_loss", "stft_loss") + (("phase_loss",) if phase_weight else ())
                 + (("phase_angle_loss",) if phase_angle_weight else ())
                 + (("adversarial_loss", "feature_loss", "discriminator_loss") if adversarial_weight else ()))
        self.trackers = {name: keras.metrics.Mean(name=name) for name in names}
        # Updates skipped since the last finite one (int64: TensorFlow keeps int32 variables on the host).
        self.nonfinite_in_a_row = keras.Variable(0, dtype="int64", trainable=False, name="nonfinite_in_a_row")

    @property
    def metrics(self):
        return list(self.trackers.values())

    def call(self, log_mel, training=False):
        return self.vocoder(log_mel, training=training)

    def build(self, input_shape=None):
        for part in (self.vocoder, self.discriminator) if self.adversarial_weight else (self.vocoder,):
            if not part.built:  # a vocoder loaded from a folder (--init-from) comes built
                part.build()
        self.built = True

    def build_for_training(self) -> None:
        """Every variable (the vocoder's, the discriminator's, both optimizers') before a backup is restored."""
        self.build()
        self.optimizer.build(self.vocoder.trainable_variables)
        if self.adversarial_weight:
            self.discriminator_optimizer.build(self.discriminator.trainable_variables)

    def losses_of(self, batch, training=False) -> dict:
        start = segment_starts(batch["mel_length"], self.segment_frames)
        segment = waveform_segments(batch["audio"], start, self.segment_frames, self.vocoder.data_config.hop_length)
        given = mel_segments(batch["mel"], start, self.segment_frames) if "mel" in batch else None
        phase = None
        if "phase" in batch:  # the clip's Griffin-Lim phase (`with_griffin_lim_phase`), as angles
            angle = tf.cast(mel_segments(batch["phase"], start, self.segment_frames), tf.float32)
            phase = tf.cos(angle), tf.sin(angle)
        return self.segment_losses(segment, training=training, input_mel=given, input_phase=phase)

    def segment_losses(self, segment, training=False, input_mel=None, input_phase=None) -> dict:
        """The losses of vocoding the log-mel of `segment` [B, samples] (or `input_mel`, frames of the
        same stretch) back into it; `input_phase`: the vocoder's phase prior for those frames."""
        c = self.vocoder.data_config
        target_mel = audio.log_mel(segment, c)  # [B, frames, n_mels]
        magnitude, cosine, sine = self.vocoder.polar(target_mel if input_mel is None else input_mel, training=training,
                                                     phase=input_phase)
        real, imaginary = magnitude * cosine, magnitude * sine
        predicted = istft(tf.complex(real, imaginary), c)
        mel_loss = tf.reduce_mean(tf.abs(audio.log_mel(predicted, c) - target_mel))
        stft_loss = multi_resolution_stft_loss(segment, predicted)
        losses = {"loss": mel_loss + stft_loss, "mel_loss": mel_loss, "stft_loss": stft_loss}
        if self.phase_weight:
            # The frames' spectrum against the segment's own, frame for frame (the same framing).
            losses["phase_loss"] = compressed_spectrum_loss(stft(segment, c), real, imaginary)
            losses["loss"] += self.phase_weight * losses["phase_loss"]
        if self.phase_angle_weight:
            # The same framing again: frame t of the segment's STFT is the frame the vocoder predicted.
            losses["phase_angle_loss"] = tf.add_n(list(phase_angle_losses(stft(segment, c), cosine, sine).values()))
            losses["loss"] += self.phase_angle_weight * losses["phase_angle_loss"]
        if self.adversarial_weight:
            adversarial = adversarial_losses(self.discriminator(segment), self.discriminator(predicted))
            losses.update({f"{name}_loss": value for name, value in adversarial.items()})
            losses["loss"] += self.adversarial_weight * (adversarial["adversarial"] + 2.0 * adversarial["feature"])
        return losses

    def train_step(self, batch):
        adversarial = bool(self.adversarial_weight)
        with tf.GradientTape(persistent=adversarial) as tape:
            losses = self.losses_of(batch, training=True)
            # Under mixed_float16 the optimizers are LossScaleOptimizers: the gradients come scaled
            # (each optimizer its own scale) and are unscaled in `apply`; otherwise the scale is 1.
            scaled = [self.optimizer.scale_loss(losses["loss"])]
            if adversarial:
                scaled.append(self.discriminator_optimizer.scale_loss(losses["discriminator_loss"]))
        variables = self.vocoder.trainable_variables
        gradients = [tape.gradient(scaled[0], variables)]
        if adversarial:
            # The discriminator's loss differentiated for its own weights only: the vocoded audio in it
            # is a constant to it, as if stopped.
            critic_variables = self.discriminator.trainable_variables
            gradients.append(tape.gradient(scaled[1], critic_variables))
            del tape
        # Several replicas (train_vocoder.py on several GPUs): from here on every replica holds the
        # global batch's mean gradients and losses, so clipping and the finite check are one device's
        # (training/distribute.py; unchanged with one replica).
        gradients, losses = all_reduce_mean((gradients, losses))
        norms = [tf.linalg.global_norm(gradients[0]) / loss_scale(self.optimizer)]
        if adversarial:
            norms.append(tf.linalg.global_norm(gradients[1]) / loss_scale(self.discriminator_optimizer))
        # A non-finite update is skipped, as the acoustic model's step does (training/step.py): one
        # NaN applied makes every weight NaN, and the run would go on training, backing up and
        # saving a vocoder that speaks nothing (seen once at step ~1,550 of 10,800 on 343 voices).
        # A LossScaleOptimizer skips it itself and halves its scale (normal now and then in fp16).
        finite = tf.reduce_all(tf.math.is_finite(tf.stack([losses["loss"], *norms])))
        self._apply_if(finite, gradients[0], variables, self.optimizer)
        if adversarial:
            self._apply_if(finite, gradients[1], critic_variables, self.discriminator_optimizer)
        self.nonfinite_in_a_row.assign(tf.where(finite, tf.constant(0, tf.int64), self.nonfinite_in_a_row + 1))
        for name, tracker in self.trackers.items():
            tracker.update_state(tf.where(finite, losses[name], 0.0), sample_weight=tf.cast(finite, tf.float32))
        logs = {name: tracker.result() for name, tracker in self.trackers.items()}
        return reducible_logs({**logs, "nonfinite_in_a_row": tf.identity(self.nonfinite_in_a_row.value)})

    @staticmethod
    def _apply_if(finite, gradients, variables, optimizer):
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer.apply(gradients, variables)
        else:
            tf.cond(finite, lambda: applied(gradients, variables, optimizer), lambda: tf.constant(False))

    def test_step(self, batch):
        losses = self.losses_of(batch)
        for name, tracker in self.trackers.items():
            tracker.update_state(losses[name])
        return {name: tracker.result() for name, tracker in self.trackers.items()}
