"""The training losses, masked by true lengths: text cross-entropy, mel L1 and stop-token BCE.

Every loss is first a mean over one example's own valid positions (its `text_length` or
`mel_length`, never the padded length), then a plain mean over the batch. That makes the loss of
a batch the mean of its examples' losses, whatever bucket they were padded to, so four
accumulated micro-batches of 4 give exactly the loss (and gradients) of one batch of 16.

    loss = TEXT_WEIGHT * text_loss + mel_loss + STOP_WEIGHT * stop_loss

- text_loss: the decoder's auxiliary next-token prediction over the text segment. Text is given
  in full at synthesis, so this only helps shape the text representations; XTTS and Tortoise
  weight it 0.01 against the audio objective, and the same 0.01 keeps it from competing with
  the mel here.
- mel_loss: L1 in log-mel space on mel_before plus L1 on mel_after. L1 rather than L2 because
  log-mel errors are heavy-tailed (silence at the log floor). The first term trains the decoder
  (its prediction is what synthesis feeds back), the second the postnet alone (XTTS.refine).
- stop_loss: BCE with target 1 at frame mel_length - 1 only. That is one positive among hundreds
  of frames, so positives are weighted STOP_POSITIVE_WEIGHT times: without it the cheapest
  solution keeps the stop probability under 0.5 everywhere and synthesis never stops. Its size
  (an O(0.05) BCE next to an O(1) L1) needs no further weight, so STOP_WEIGHT = 1.

All outputs are float32 scalars (the model's heads are float32 under every dtype policy).
"""

from __future__ import annotations

import tensorflow as tf

TEXT_WEIGHT = 0.01
STOP_WEIGHT = 1.0
STOP_POSITIVE_WEIGHT = 5.0


def compute_losses(batch: dict, outputs: dict, *, per_example: bool = False) -> dict:
    """Losses of the model's `outputs` on `batch`: float32 scalars, or [B] vectors with `per_example`."""
    text = text_loss(batch["tokens"], batch["text_length"], outputs["text_logits"])
    mel = mel_loss(batch["mel"], batch["mel_length"], outputs["mel_before"], outputs["mel_after"])
    stop = stop_loss(batch["mel_length"], outputs["stop_logits"])
    losses = {
        "loss": TEXT_WEIGHT * text + mel + STOP_WEIGHT * stop,
        "text_loss": text,
        "mel_loss": mel,
        "stop_loss": stop,
    }
    if per_example:
        return losses
    return {name: tf.reduce_mean(value) for name, value in losses.items()}


def _masked_mean(values, valid, count):
    """Per example: the sum of `values` [B, N] where `valid`, over `count` [B] (at least 1)."""
    total = tf.reduce_sum(tf.where(valid, values, 0.0), axis=1)  # where, not *, so NaN padding stays out
    return total / tf.maximum(tf.cast(count, tf.float32), 1.0)


def text_loss(tokens, text_length, text_logits) -> tf.Tensor:
    """[B]: cross-entropy of token t + 1 given positions <= t, over the text_length - 1 real targets."""
    logits = tf.cast(text_logits, tf.float32)[:, :-1]  # [B, L - 1, V]: the last position has no target
    targets = tokens[:, 1:]  # [B, L - 1]
    entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    count = text_length - 1
    return _masked_mean(entropy, tf.sequence_mask(count, tf.shape(targets)[1]), count)


def mel_loss(mel, mel_length, mel_before, mel_after) -> tf.Tensor:
    """[B]: L1 of mel_before plus L1 of mel_after, each averaged over mel bands and valid frames."""
    mel = tf.cast(mel, tf.float32)
    error = tf.abs(tf.cast(mel_before, tf.float32) - mel) + tf.abs(tf.cast(mel_after, tf.float32) - mel)
    per_frame = tf.reduce_mean(error, axis=-1)  # [B, T]
    return _masked_mean(per_frame, tf.sequence_mask(mel_length, tf.shape(mel)[1]), mel_length)


def stop_targets(mel_length, frames) -> tf.Tensor:
    """[B, frames] float32: 1 at frame mel_length - 1, else 0."""
    return tf.one_hot(mel_length - 1, frames, dtype=tf.float32)


def stop_loss(mel_length, stop_logits) -> tf.Tensor:
    """[B]: positive-weighted BCE of the stop logits over the valid frames."""
    logits = tf.cast(stop_logits, tf.float32)
    frames = tf.shape(logits)[1]
    bce = tf.nn.weighted_cross_entropy_with_logits(stop_targets(mel_length, frames), logits, STOP_POSITIVE_WEIGHT)
    return _masked_mean(bce, tf.sequence_mask(mel_length, frames), mel_length)
