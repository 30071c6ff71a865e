"""Synthesis: text + a voice -> log-mel in one parallel pass, no decoding loop.

    reference clip(s) -> voice vector -> text encoding -> predicted durations -> decoder -> (mel, length)

The durations are the duration predictor's log(1 + frames), rounded; a token predicted at zero
frames (a word boundary, usually) is skipped. `duration_scale` stretches every token alike: 1.2 is
20% slower speech. One `tf.function` per model is kept, so repeated calls reuse the trace.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from myxtts.data.text import PAD_ID

_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def predicted_durations(log_durations, text_length, duration_scale: float = 1.0) -> tf.Tensor:
    """Frames per token [B, L] int32 from the predictor's log(1 + frames), 0 past text_length."""
    frames = tf.math.round(tf.math.expm1(tf.cast(log_durations, tf.float32)) * duration_scale)
    valid = tf.sequence_mask(text_length, tf.shape(log_durations)[1])
    return tf.where(valid, tf.cast(tf.maximum(frames, 0.0), tf.int32), 0)


def generate(model, tokens, reference_mel=None, reference_length=None, *, voice=None,
             average_references: bool = False, duration_scale: float = 1.0, max_frames: int | None = None):
    """Synthesize log-mels: (mel [B, frames, n_mels] float32, length [B] int32).

    tokens: [L] or [B, L] int ids padded with PAD_ID. The voice is `voice` [1 or B, d] from
    `model.voice`, or else reference_mel [B, R, n_mels] with reference_length [B]: one clip per
    row, or with `average_references=True` any number of clips of one voice, averaged into one
    voice for every row. `frames` is the longest row's length; frames of a row past its own
    `length` are zero. `max_frames` caps every row.
    """
    if not model.built:
        model.build()
    tokens = tf.convert_to_tensor(tokens, tf.int32)
    if tokens.shape.rank == 1:
        tokens = tokens[None]
    if voice is None:
        voice = model.voice(tf.convert_to_tensor(reference_mel, tf.float32),
                            tf.convert_to_tensor(reference_length, tf.int32), average=average_references)
    voice = tf.broadcast_to(voice, tf.stack([tf.shape(tokens)[0], tf.shape(voice)[1]]))
    if model not in _COMPILED:
        model_ref = weakref.ref(model)  # a closure holding the model would keep its entry alive forever
        _COMPILED[model] = tf.function(lambda *args: _synthesize(model_ref(), *args), reduce_retracing=True)
    limit = tf.constant(max_frames or 2**30, tf.int32)
    return _COMPILED[model](tokens, voice, tf.constant(duration_scale, tf.float32), limit)


def synthesize_sentence(model, tokens, reference_mel, reference_length, max_frames):
    """`generate` for a caller that traces it into its own graph (the exported models): one sentence's
    tokens [L] in the voice averaged from every reference clip [N, R, n_mels] -> mel [frames, n_mels],
    at most `max_frames`."""
    voice = model.voice(reference_mel, reference_length, average=True)  # [1, d]
    mel, length = _synthesize(model, tf.expand_dims(tokens, 0), voice, tf.constant(1.0), max_frames)
    return mel[0, : length[0]]


def _synthesize(model, tokens, voice, duration_scale, max_frames):
    text_length = tf.reduce_sum(tf.cast(tokens != PAD_ID, tf.int32), axis=1)  # [B]
    text = model.encode_text(tokens, text_length, voice)
    durations = predicted_durations(model.predict_log_durations(text, text_length), text_length, duration_scale)
    length = tf.minimum(tf.reduce_sum(durations, axis=1), max_frames)
    mel = model.decode(text, durations, tf.maximum(tf.reduce_max(length), 1), length)
    return mel, length
