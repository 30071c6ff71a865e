"""Which clip lends each training clip its voice reference: another clip of the same speaker.

The choice is made in the graph, per epoch, from a key and the clip's index alone:

    reference of clip i in an epoch = a uniform draw, seeded by (epoch key, i), among the other
    clips of i's speaker (i itself when the speaker has one clip)

so every epoch pairs a clip with another reference (the model cannot learn one fixed pairing),
and the pairing does not depend on the order in which parallel decoding delivered the clips: a
resumed run draws the same references as an uninterrupted one. Only TensorFlow ops run per clip
(tests/test_pipeline.py scans the graph); the speaker tables are built once, in Python, from the
rows. With cached features the pipeline also keeps every clip's reference crop in RAM
(`CropTable`), so an epoch gathers references instead of decoding them from their files.

`assign_references` is the same rule drawn once in Python, for callers outside the pipeline
(synthesis of a validation sentence, the pipeline benchmark).
"""

from __future__ import annotations

import random
from collections import defaultdict

import tensorflow as tf

from myxtts.data.manifest import Utterance


def assign_references(utterances: list[Utterance], seed: int) -> list[str]:
    """For each utterance, the audio path of another utterance by the same speaker (itself if alone),
    chosen once, deterministically from the seed."""
    by_speaker = _groups(utterances)
    rng = random.Random(seed)
    references = []
    position = {index: pos for group in by_speaker.values() for pos, index in enumerate(group)}
    for index, utterance in enumerate(utterances):
        group = by_speaker[utterance.speaker]
        if len(group) == 1:
            references.append(utterance.audio_path)
            continue
        pick = rng.randrange(len(group) - 1)  # any other member of the group, uniformly
        other = group[pick if pick < position[index] else pick + 1]
        references.append(utterances[other].audio_path)
    return references


def _groups(utterances: list[Utterance]) -> dict[str, list[int]]:
    by_speaker: dict[str, list[int]] = defaultdict(list)
    for index, utterance in enumerate(utterances):
        by_speaker[utterance.speaker].append(index)
    return by_speaker


class ReferenceTable:
    """The speakers' clip lists as constant tensors, and the per-epoch draw over them."""

    def __init__(self, utterances: list[Utterance]):
        members, start, count, position = [], [0] * len(utterances), [0] * len(utterances), [0] * len(utterances)
        for group in _groups(utterances).values():
            for pos, index in enumerate(group):
                start[index], count[index], position[index] = len(members), len(group), pos
            members.extend(group)
        self._paths = [u.audio_path for u in utterances]
        self._members, self._start, self._count, self._position = members, start, count, position

    def reference_path(self, clip, key) -> tf.Tensor:
        """The audio path of clip `clip`'s reference in the epoch of int64 `key` (scalar tensors)."""
        return tf.gather(tf.constant(self._paths, tf.string), self.reference_clip(clip, key))

    def reference_clip(self, clip, key) -> tf.Tensor:
        """The index of the clip that lends clip `clip` its reference in the epoch of int64 `key`."""
        clip = tf.cast(clip, tf.int64)
        count = tf.gather(tf.constant(self._count, tf.int64), clip)
        position = tf.gather(tf.constant(self._position, tf.int64), clip)
        draw = tf.random.stateless_uniform([], seed=tf.stack([tf.cast(key, tf.int64), clip]), minval=0,
                                           maxval=tf.int64.max, dtype=tf.int64)
        pick = draw % tf.maximum(count - 1, 1)  # among the others: skip the clip's own position
        other = tf.where(count > 1, tf.where(pick >= position, pick + 1, pick), position)  # alone: itself
        start = tf.gather(tf.constant(self._start, tf.int64), clip)
        return tf.gather(tf.constant(self._members, tf.int64), start + other)


class CropTable:
    """Every clip's reference crop (its middle `data.reference_duration_s` as a padded log-mel), held in
    variables in host RAM and gathered by clip index: [clips, reference_frames, n_mels] float32.

    Variables, not a tensor captured by the pipeline: tf.data serializes captured tensors into its
    graph (for its optimizations, for the graph scan), which a large table would not survive (measured
    with 166 MB: 5x slower iteration and a copy in RAM; protobuf stops at 2 GB). Built with one pass of
    `crop` over the paths, in TensorFlow ops.
    """

    def __init__(self, paths: list[str], crop, frames: int, n_mels: int, parallel_calls):
        if tf.distribute.has_strategy():
            raise RuntimeError("build the input pipeline outside strategy.scope(): the reference crops would be "
                               "copied to every replica's device")
        with tf.device("/cpu:0"):
            self.mels = tf.Variable(tf.zeros([len(paths), frames, n_mels]), trainable=False, name="reference_crops")
            self.lengths = tf.Variable(tf.zeros([len(paths)], tf.int32), trainable=False, name="reference_crop_lengths")
        crops = tf.data.Dataset.from_tensor_slices(paths).map(crop, num_parallel_calls=parallel_calls).batch(256)
        start = 0
        for mels, lengths in crops:  # a few hundred clips per assignment
            count = int(lengths.shape[0])
            self.mels[start : start + count].assign(mels)
            self.lengths[start : start + count].assign(lengths)
            start += count

    def gather(self, clip) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.gather(self.mels, clip), tf.gather(self.lengths, clip)
