"""The training losses, masked by true lengths: mel L1, the alignment's forward-sum, durations.

Every loss is first a mean over one example's own valid positions (its `mel_length` or
`text_length`, never the padded length), then a plain mean over the batch. That makes the loss of
a batch the mean of its examples' losses, whatever bucket they were padded to, so four
accumulated micro-batches of 4 give exactly the loss (and gradients) of one batch of 16.

    loss = mel_loss + ALIGN_WEIGHT * align_loss + DURATION_WEIGHT * duration_loss

- mel_loss: L1 in log-mel space, averaged over bands and valid frames (of the decoded window, with
  `training.decoder_window`). L1 rather than L2 because
  log-mel errors are heavy-tailed (silence at the log floor).
- align_loss: the forward-sum objective (`alignment.forward_sum_loss`), nats per frame: how
  unlikely the text is given the audio, over every monotonic alignment. It trains only the frame
  classifier (nothing else feeds the alignment scores).
- duration_loss: squared error of log(1 + frames) per token against the durations the alignment
  found. It trains only the duration predictor, which reads a stop-gradient copy of the text
  encoding, so its weight sets that predictor's step size and nothing else; 0.1 keeps its
  gradients from dominating the global clipping norm early on, when they are largest.

- speaker_loss (only with `training.speaker_loss_weight` > 0): a contrastive objective for the
  conditioning encoder. Within the batch, the voice of each clip's reference should be nearer (cosine,
  temperature `SPEAKER_TEMPERATURE`) the voice of the clip itself than the other clips' voices:
  cross-entropy both ways, averaged. Clips of one speaker in a batch count as negatives (the batch
  carries no speaker ids), and the loss depends on the batch's other clips, so it is the one loss
  that accumulated micro-batches do not reproduce exactly.

All outputs are float32 scalars (the model's outputs are float32 under every dtype policy).
"""

from __future__ import annotations

import tensorflow as tf

from myxtts.models.alignment import DEFAULT_LOOPS, AlignmentLoops, forward_sum_loss

ALIGN_WEIGHT = 1.0
DURATION_WEIGHT = 0.1
LOSS_NAMES = ("loss", "mel_loss", "align_loss", "duration_loss")
SPEAKER_LOSS = "speaker_loss"
SPEAKER_TEMPERATURE = 0.1


def compute_losses(batch: dict, outputs: dict, *, per_example: bool = False,
                   loops: AlignmentLoops = DEFAULT_LOOPS, speaker_weight: float = 0.0) -> dict:
    """Losses of the model's `outputs` on `batch`: float32 scalars, or [B] vectors with `per_example`.
    `loops`: how the forward-sum's frame loops run (the network's `alignment_loops`). With
    `speaker_weight` > 0 (and the network's voices in `outputs`), speaker_loss joins the total."""
    mel = mel_loss(outputs["mel_target"], outputs["mel_target_length"], outputs["mel"])
    align = forward_sum_loss(outputs["alignment_scores"], batch["mel_length"], outputs["aligned_length"], loops)
    duration = duration_loss(outputs["durations"], outputs["log_durations"], batch["text_length"])
    losses = {
        "loss": mel + ALIGN_WEIGHT * align + DURATION_WEIGHT * duration,
        "mel_loss": mel,
        "align_loss": align,
        "duration_loss": duration,
    }
    if speaker_weight > 0:
        losses[SPEAKER_LOSS] = speaker_loss(outputs["voice"], outputs["clip_voice"])
        losses["loss"] = losses["loss"] + speaker_weight * losses[SPEAKER_LOSS]
    if per_example:
        return losses
    return {name: tf.reduce_mean(value) for name, value in losses.items()}


def _masked_mean(values, valid, count):
    """Per example: the sum of `values` [B, N] where `valid`, over `count` [B] (at least 1)."""
    total = tf.reduce_sum(tf.where(valid, values, 0.0), axis=1)  # where, not *, so NaN padding stays out
    return total / tf.maximum(tf.cast(count, tf.float32), 1.0)


def mel_loss(mel, mel_length, predicted) -> tf.Tensor:
    """[B]: L1 averaged over mel bands and valid frames."""
    error = tf.reduce_mean(tf.abs(tf.cast(predicted, tf.float32) - tf.cast(mel, tf.float32)), axis=-1)  # [B, T]
    return _masked_mean(error, tf.sequence_mask(mel_length, tf.shape(error)[1]), mel_length)


def duration_loss(durations, log_durations, text_length) -> tf.Tensor:
    """[B]: squared error of the predicted log(1 + frames) per valid token."""
    target = tf.math.log1p(tf.cast(durations, tf.float32))
    error = tf.square(tf.cast(log_durations, tf.float32) - target)  # [B, L]
    return _masked_mean(error, tf.sequence_mask(text_length, tf.shape(error)[1]), text_length)


def speaker_loss(voice, clip_voice) -> tf.Tensor:
    """[B]: InfoNCE between the references' voices [B, d] and the clips' own voices [B, d], both ways."""
    a = tf.math.l2_normalize(tf.cast(voice, tf.float32), axis=-1)
    b = tf.math.l2_normalize(tf.cast(clip_voice, tf.float32), axis=-1)
    logits = tf.matmul(a, b, transpose_b=True) / SPEAKER_TEMPERATURE  # [B, B], matches on the diagonal
    labels = tf.range(tf.shape(logits)[0])
    forward = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    backward = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.transpose(logits))
    return 0.5 * (forward + backward)
