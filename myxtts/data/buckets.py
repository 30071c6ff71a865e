"""Batches of clips of similar length: each clip's bucket (the smallest whose frames and tokens both
hold it), and padded batches per bucket, padded to the bucket's boundaries so that a compiled step
sees one shape per bucket (with `data.bucketing: false`, one group padded to its longest clip)."""

from __future__ import annotations

import math

import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data.text import PAD_ID


def padding_values(c: DataConfig) -> dict:
    silence = tf.constant(math.log(c.log_floor), tf.float32)
    zero = tf.constant(0, tf.int32)
    return {
        "audio" if c.mel_on_device else "mel": tf.constant(0.0) if c.mel_on_device else silence,
        "mel_length": zero,
        "tokens": tf.constant(PAD_ID, tf.int32),
        "text_length": zero,
        "reference_mel": silence,
        "reference_length": zero,
    }


def batch_key(mel_length, text_length, c: DataConfig) -> tf.Tensor:
    """The group a clip is batched in: its bucket, or one group for all with data.bucketing off."""
    return bucket_index(mel_length, text_length, c) if c.bucketing else tf.constant(0, tf.int64)


def bucket_index(mel_length, text_length, c: DataConfig) -> tf.Tensor:
    """The smallest bucket whose mel and text sizes both fit this example."""
    by_mel = tf.searchsorted(tf.constant(c.bucket_mel_lengths, tf.int32), tf.reshape(mel_length, [1]), side="left")
    by_text = tf.searchsorted(tf.constant(c.bucket_text_lengths, tf.int32), tf.reshape(text_length, [1]), side="left")
    return tf.cast(tf.maximum(by_mel, by_text)[0], tf.int64)


def batch_by_bucket(ds: tf.data.Dataset, c: DataConfig, batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
    """Padded batches of clips of similar length, padded to bucket boundaries (one shape per bucket,
    so XLA compiles one program each); with `data.bucketing: false`, padded to the longest in the batch."""
    if not c.bucketing:
        signal = {"audio": [None]} if c.mel_on_device else {"mel": [None, c.n_mels]}
        shapes = {**signal, "tokens": [None], "reference_mel": [c.reference_frames, c.n_mels]}
        shapes.update({k: [] for k in ("mel_length", "text_length", "reference_length")})
        return ds.padded_batch(batch_size, shapes, padding_values(c), drop_remainder=drop_remainder)

    mel_sizes = tf.constant(c.bucket_mel_lengths, tf.int64)
    text_sizes = tf.constant(c.bucket_text_lengths, tf.int64)

    def batch_one_bucket(bucket, window):
        if c.mel_on_device:
            signal = {"audio": tf.reshape((mel_sizes[bucket] - 1) * c.hop_length, [1])}
        else:
            signal = {"mel": tf.stack([mel_sizes[bucket], c.n_mels])}
        shapes = {
            **signal,
            "tokens": tf.reshape(text_sizes[bucket], [1]),
            "reference_mel": [c.reference_frames, c.n_mels],
            "mel_length": [],
            "text_length": [],
            "reference_length": [],
        }
        return window.padded_batch(batch_size, shapes, padding_values(c), drop_remainder=drop_remainder)

    return ds.group_by_window(
        key_func=lambda ex: bucket_index(ex["mel_length"], ex["text_length"], c),
        reduce_func=batch_one_bucket,
        window_size=batch_size,
    )
