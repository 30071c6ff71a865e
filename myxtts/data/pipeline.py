"""From a manifest to padded, bucketed, prefetched batches, built only from TensorFlow ops.

    paths + model texts -> read_file -> decode_wav -> resample (if the file's rate differs)
      -> trim silence -> tokenise -> length filter -> peak-normalise -> log-mel -> cache
      -> shuffle (every epoch) -> reference clip of the same voice (drawn every epoch)
      -> bucket by length, pad to the bucket's size -> prefetch (to the GPU)

One clip's stages are `clip_features.py`'s (decode, limits, log-mel, the reference's log-mel), the
bucketing and padding `buckets.py`'s; this module puts them in order over a corpus, epoch after epoch.

Nothing in the hot path calls back into Python (tests/test_pipeline.py scans the dataset graph for
PyFunc ops), so the input pipeline scales with cores instead of queueing on the GIL. Batches are
padded to bucket boundaries, not to the longest clip in the batch, so a compiled train step sees
one shape per bucket. The model texts are the rows' phonemes (`data.text_frontend: phonemes`, made
in Python before the graph: by dataset preparation, the demo corpus or `phonemize_utterances`) or
their transcripts; the graph only splits them into characters and looks those up.

Order, every epoch (`Epochs`), so that a manifest sorted by speaker still gives mixed batches:

* features cached in RAM (`data.cache_features`, the default levels): the rows are put in a random
  order once, and every epoch shuffles all cached clips (the shuffle buffer holds the cached
  tensors themselves, not copies, so a full shuffle costs no memory; the first batch waits until
  every clip's features are computed);
* features cached in a file (too big for RAM, `feature_cache.py`): the same random order drawn once,
  then a shuffle within `data.shuffle_buffer_size` clips each epoch (the window lives in RAM);
* no cache: the file list is permuted every epoch before decoding, less the clips that would not
  fill a full batch of their bucket (each bucket's remainder, dropped every training epoch), known
  from the order and every clip's lengths (one decoding pass before the first epoch): they are
  not read at all;
* features from a tf.data service (`data.service_address`, training only; `Epochs.served_examples`):
  the service's workers, on other machines, read and decode the clips and compute their features and
  references, each clip once per epoch, in the order drawn once; this host shuffles within
  `data.shuffle_buffer_size` clips, buckets and batches. No cache: dynamic sharding gives each worker
  other clips every epoch, so a cache on a worker would serve the wrong ones.

Before anything is read, every row's audio path is checked to be a readable, non-empty regular file
(`wav_header.check_audio_files`: a FIFO would block TensorFlow's read for ever). With an `echo` (the
trainer's), the first pass over the clips' lengths, which is also the pass that fills a cache, says
how many clips the length filter leaves out and why (not with a tf.data service: its workers filter).

Each epoch has a key, drawn from the seed and the epoch number, that seeds its shuffle and the
draw of every clip's voice reference (`references.py`). With a cache, every clip's reference crop
is computed once, before the first epoch, and kept in RAM, so an epoch gathers references instead
of decoding them (they are decoded from their files every epoch only without a cache, or when the
crops do not fit in RAM either, `feature_cache.py`).

With a cache, the clips reach the cache and the references reach the batches in a fixed order
(only the first epoch's decoding waits for its slowest clip), so the batches are a function of the
seed and the epoch number: a resumed run (`Epochs.stream(start_batch)`) continues exactly where an
uninterrupted one would be. Without a cache, `data.deterministic: false` lets fast clips overtake
slow ones every epoch.

A batch is a dict:
    mel              float32 [batch, frames, n_mels]   log-mel, padded with log(data.log_floor)
                     (with data.mel_on_device: `audio` float32 [batch, (frames - 1) * hop] instead,
                     zero-padded, which `clip_features.mel_from_audio` turns into `mel` in the compiled step)
    mel_length       int32   [batch]                   true frame counts (mask with these)
    tokens           int32   [batch, text_length]      one id per symbol of the model text, padded with PAD_ID
    text_length      int32   [batch]
    reference_mel    float32 [batch, ref_frames, n_mels]  another clip of the same speaker
    reference_length int32   [batch]
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import socket

import numpy as np
import tensorflow as tf

from myxtts.config import Config, DataConfig
from myxtts.data.buckets import batch_by_bucket, batch_key
from myxtts.data.clip_features import (clip_features, clip_limits, decode_row, mel_frames, reference_log_mel,
                                       within_limits)
from myxtts.data.feature_cache import plan_cache
from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.phonemes import model_texts, phonemize_utterances
from myxtts.data.references import CropTable, ReferenceTable, assign_references  # noqa: F401 (assign_references: public here too)
from myxtts.data.text import Vocabulary
from myxtts.data.wav_header import check_audio_files
from myxtts.hardware.host import usable_cores, usable_ram_bytes
from myxtts.progress import ProgressLine

# Used when `data.batch_size` / `data.num_workers` are 0 ("automatic") and no hardware plan has
# resolved them yet (the trainer writes the plan's values into the config before building datasets).
DEFAULT_BATCH_SIZE = 16
# Clips from which the one decoding pass for their lengths (about 1 ms of CPU a clip) is announced.
LONG_LENGTH_PASS = 5000


def build_dataset(
    config: Config,
    manifest: str | os.PathLike | list[Utterance],
    training: bool = True,
    *,
    vocabulary: Vocabulary | None = None,
    gpu_copy: bool = True,
    fallback_cache_dir: str | os.PathLike | None = None,
    echo=None,
) -> tf.data.Dataset:
    """One pass of batches: for training shuffled, fixed batch size, each iteration a new epoch
    (another order, other references); for evaluation in order, last batch kept, the same each time.

    `manifest` is an LJSpeech folder or metadata.csv, a JSONL manifest, or a list of `Utterance`.
    `vocabulary` defaults to one built from these rows' model texts; pass the training vocabulary
    when building a validation set. With `data.text_frontend: phonemes`, rows without phonemes for
    `data.language` are phonemized here first, in Python (the trainer does it before, with a cache).
    `gpu_copy=False` leaves out the copy to the GPU (`data.prefetch_to_gpu`),
    for a caller that adds stages of its own and then `to_device(dataset, config.data)` last.
    `fallback_cache_dir`: where cached features go when they do not fit in RAM and data.cache_dir is
    empty (without it, that is an error naming the keys to set); see `feature_cache.py`.
    """
    epochs = Epochs(config, manifest, training, vocabulary=vocabulary, fallback_cache_dir=fallback_cache_dir, echo=echo)
    ds = epochs.one_pass()
    return to_device(ds, config.data) if gpu_copy else ds


def shuffle_with_key(ds: tf.data.Dataset, buffer_size: int, key) -> tf.data.Dataset:
    """`ds.shuffle(buffer_size)` in the order set by the int64 tensor `key` alone.

    TensorFlow 2.21 turns a shuffle's seed into (graph seed, seed) and compares that pair with
    (0, 0) in Python, which raises on a tensor seed when the global seed is 0
    (`keras.utils.set_random_seed(0)`, a user's `seed: 0`). Traced without a graph seed, the pair is
    (TensorFlow's fixed default, key): no comparison of a tensor, and the same order whatever the
    global seed.
    """
    graph = tf.compat.v1.get_default_graph()
    saved, graph.seed = graph.seed, None
    try:
        return ds.shuffle(buffer_size, seed=key)
    finally:
        graph.seed = saved


class Epochs:
    """The batches of a manifest, epoch after epoch, in an order set by the seed (module docstring)."""

    def __init__(self, config: Config, manifest: str | os.PathLike | list[Utterance], training: bool, *,
                 vocabulary: Vocabulary | None = None, fallback_cache_dir: str | os.PathLike | None = None, echo=None):
        c = self.data = config.data
        self.seed, self.training = config.seed, training
        utterances = read_manifest(manifest) if isinstance(manifest, (str, os.PathLike)) else list(manifest)
        if not utterances:
            raise ValueError(f"no utterances in {manifest if isinstance(manifest, (str, os.PathLike)) else 'the given list'}")
        check_audio_files([u.audio_path for u in utterances])  # before anything opens them: a FIFO would hang
        if c.text_frontend == "phonemes":
            utterances = phonemize_utterances(utterances, c.language, progress=True)
        # Evaluation stays on this host: it is small and must come in order, the same every time.
        self.service = c.service_address if training else ""
        cached = bool(c.cache_features)
        if self.service and cached:  # config.validate refuses it too; this catches a config built in code
            raise ValueError("data.cache_features does not go with data.service_address: the service's workers compute "
                             "the features every epoch; set data.cache_features to false")
        if self.service:
            check_dispatcher(self.service)
        if training and (cached or self.service):
            # The order the cache keeps (or the service serves every epoch): random, so that neither
            # the window shuffle nor anything else ever sees the manifest's own order (sorted by speaker, say).
            random.Random(self.seed).shuffle(utterances)
        texts = model_texts(utterances, c.text_frontend)
        self.vocabulary = vocabulary or Vocabulary.from_texts(texts, frontend=c.text_frontend)
        self.utterances, self.texts = utterances, texts
        self.batch_size = c.batch_size or DEFAULT_BATCH_SIZE
        self.references = ReferenceTable(utterances)
        # Order-preserving stages cost throughput only where clips take unequal time every epoch: the
        # uncached decoding. With a cache, decoding runs once and the reference is a fixed 3 s.
        self.ordered = c.deterministic or not training or cached
        self.cache = None
        self._cached_features = None
        self._crops = None  # references.CropTable, built on the first one_pass/stream when the plan keeps crops in RAM
        self._clips = None  # ClipTable, from the first pass over the clips that needs it
        self._echo = echo
        if cached:
            self.cache = plan_cache(c, utterances, texts, self.vocabulary.tokens, seed=self.seed, training=training,
                                    fallback_dir=fallback_cache_dir)
            if self.cache.note and echo is not None:
                echo(self.cache.note)
            self._cached_features = self._features(self._rows()).cache(self.cache.path)

    def one_pass(self) -> tf.data.Dataset:
        """One epoch; for training, every iteration of the returned dataset is a new epoch."""
        if self.service:
            # Epoch 0's references on every pass: the service serves one registered dataset. The order differs.
            return self._finish(self._served_batches(0, len(self.utterances)))
        self._prepare_tables()
        if self.training:
            keys = tf.data.Dataset.random(seed=self.seed, rerandomize_each_iteration=True).take(1)
        else:
            keys = tf.data.Dataset.from_tensors(tf.constant(self.seed, tf.int64))  # the same references each time
        return self._finish(keys.flat_map(self.epoch))

    def stream(self, start_batch: int = 0) -> tf.data.Dataset:
        """Training batches without end, from batch `start_batch` of the stream (0 = the start).

        Epoch e is the same at any start, so a resumed run continues where it stopped: the epochs
        before are not replayed, only the batches of the current one before `start_batch`.
        """
        if self.service:
            # Clips come in the order the workers finish them, so no run can be replayed exactly: a
            # resumed one starts after the clips its batches held (filtered and left-over clips aside).
            return self._finish(self._served_batches(start_batch * self.batch_size, tf.int64.max))
        self._prepare_tables()
        first_epoch, skip = divmod(start_batch, self.batches_per_epoch()) if start_batch else (0, 0)
        epochs = tf.data.Dataset.range(first_epoch, tf.int64.max).map(self.epoch_key)
        return self._finish(epochs.flat_map(self.epoch).skip(skip))

    def epoch_key(self, epoch) -> tf.Tensor:
        """The int64 key of epoch number `epoch`: seeds its shuffle and its references."""
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(epoch, tf.int64)])
        return tf.random.stateless_uniform([], seed=seed, minval=0, maxval=tf.int64.max, dtype=tf.int64)

    def batches_per_epoch(self) -> int:
        """Full batches in one epoch (each bucket's last partial batch is dropped). The first call
        decodes every clip once (with a cache, that pass fills it)."""
        keys = self._clip_table().keys
        count = int(np.sum(np.bincount(keys[keys >= 0]) // self.batch_size))
        if count == 0:
            raise NoFullBatch(len(self.utterances), self.data, self.batch_size)
        return count

    def group_sizes(self) -> list[int]:
        """Clips per batching group (length bucket), the length filter's left out. The first call
        decodes every clip once (with a cache, that pass fills it)."""
        keys = self._clip_table().keys
        return np.bincount(keys[keys >= 0]).tolist()

    def clip_lengths(self) -> tuple[list[int], list[int]]:
        """(mel frames, tokens) of every clip the length filter keeps, in clip order. The first call
        decodes every clip once (with a cache, that pass fills it)."""
        table = self._clip_table()
        kept = table.keys >= 0
        return table.frames[kept].tolist(), table.tokens[kept].tolist()

    def _clip_table(self) -> ClipTable:
        """Every clip's lengths and batching group, from one pass over the clips (kept: they never change)."""
        if self._clips is None:
            c, n = self.data, len(self.utterances)
            announced = self._echo is not None and n >= LONG_LENGTH_PASS
            if self._cached_features is not None:  # read from the cache (the first pass fills it)
                if announced:
                    self._echo(f"computing the features of {n} clips once, into the cache, before the first step")
                lengths = self._cached_features.map(lambda ex: (ex["clip"], ex["mel_length"], ex["text_length"]))
            else:  # decoded only: the lengths need no features
                if announced:
                    self._echo(f"reading the lengths of {n} clips once, to leave out of every epoch the clips "
                               "its buckets would drop")
                lengths = self._decoded(self._rows()).map(
                    lambda ex: (ex["clip"], mel_frames(ex["samples"], c), tf.shape(ex["tokens"])[0]),
                    num_parallel_calls=self._parallel_calls, deterministic=False)
            # Filling a cache takes ~10 ms a clip on 2 cores: minutes for a corpus of tens of thousands.
            progress = ProgressLine("the clips' features" if self._cached_features is not None else "the clips' lengths",
                                    n, "clips", enabled=announced)
            table = ClipTable(np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64))
            with_keys = lengths.map(lambda clip, f, t: (clip, f, t, batch_key(f, t, c))).batch(512)
            for clip, frames, tokens, key in with_keys.as_numpy_iterator():
                table.frames[clip], table.tokens[clip], table.keys[clip] = frames, tokens, key
                # The rows are read in order (give or take the parallel calls) and the clips the length
                # filter drops never arrive: the highest clip seen is how far the pass has read.
                progress.update(max(progress.done, int(clip.max(initial=-1)) + 1))
            progress.update(n)
            progress.close()
            self._clips = table
        return self._clips

    def _in_full_batches(self, order: tf.Tensor) -> tf.Tensor:
        """The clips of `order` [N] that will reach a full batch, in the same order.

        Each bucket's last partial batch is dropped every training epoch, and on a small corpus that
        is many clips (43 of 123 in BENCHMARKS.md). A clip's bucket depends only on its lengths, known
        from one pass (`_clip_table`), and the batches are made in this order, so the dropped clips
        are each bucket's last `count % batch_size` here: they are left out before they are read,
        decoded or featurised. (A clip the length filter drops has key -1 and goes too.) The batches
        are the same as without this: the batching would have dropped exactly these.
        """
        c, size = self.data, self.batch_size
        groups = len(c.bucket_mel_lengths) if c.bucketing else 1
        keys = tf.gather(tf.constant(self._clip_table().keys), order)
        member = tf.one_hot(keys, groups, dtype=tf.int32)  # [N, groups]; all zero for key -1
        rank = tf.reduce_sum((tf.cumsum(member, axis=0) - member) * member, axis=1)  # place among its group's clips
        full = tf.reduce_sum(member, axis=0) // size * size  # clips of each group in full batches
        kept = (keys >= 0) & (rank < tf.gather(full, tf.maximum(keys, 0)))
        return tf.boolean_mask(order, kept)

    def epoch(self, key) -> tf.data.Dataset:
        """The batches of the epoch whose int64 key is `key` (a scalar tensor)."""
        c = self.data
        if self._cached_features is not None:
            ds = self._cached_features
            if self.training:
                everything = len(self.utterances) + 1  # more than every clip: reads to the end, which completes the cache
                window = everything if self.cache.in_ram or not c.shuffle_buffer_size else c.shuffle_buffer_size
                ds = shuffle_with_key(ds, window, key)
        else:
            order = None
            if self.training:
                order = tf.random.experimental.stateless_shuffle(tf.range(len(self.utterances), dtype=tf.int64),
                                                                 seed=tf.stack([key, tf.constant(self.seed, tf.int64)]))
                order = self._in_full_batches(order)
            ds = self._features(self._rows(order))
        ds = ds.map(lambda ex: self._with_reference(ex, key), num_parallel_calls=self._parallel_calls,
                    deterministic=self.ordered)
        return batch_by_bucket(ds, c, self.batch_size, drop_remainder=self.training)

    @property
    def _parallel_calls(self):
        return self.data.num_workers or tf.data.AUTOTUNE

    def _row_tensors(self) -> dict:
        return {
            "audio_path": tf.constant([u.audio_path for u in self.utterances]),
            "text": tf.constant(self.texts),
            "clip": tf.range(len(self.utterances), dtype=tf.int64),
        }

    def _rows(self, order=None) -> tf.data.Dataset:
        rows = self._row_tensors()
        if order is not None:
            rows = {key: tf.gather(value, order) for key, value in rows.items()}
        return tf.data.Dataset.from_tensor_slices(rows)

    def served_examples(self, start: int, stop: int) -> tf.data.Dataset:
        """Positions `start` to `stop` - 1 of the endless sequence epoch 0, epoch 1, ... (position p is
        clip p % N of epoch p // N, N clips), each clip's features and reference computed by the workers
        of the tf.data service at `data.service_address`, with its "clip" index. Arrival order is the
        order the workers finish in.

        Dynamic sharding splits a dataset at its source: the dispatcher hands the source's elements,
        one at a time, to whichever worker asks next, and each is processed once. So the source is the
        positions (a `range`), and everything a clip needs, its epoch's reference included, is computed
        from its position after that split, on the worker; only the shuffle window and the bucketing
        (cheap, and what the step's batches must come from) stay here.
        """
        n, c = len(self.utterances), self.data
        table, rows = self.vocabulary.lookup_table(), self._row_tensors()

        def decode(position):
            row = {key: tf.gather(value, position % n) for key, value in rows.items()}
            return decode_row(row, c, table), self.epoch_key(position // n)

        def features(example, key):
            return {**self._with_reference(clip_features(example, c), key), "clip": example["clip"]}

        # AUTOTUNE, not data.num_workers: that was sized for this host's cores; each worker sizes its own.
        ds = tf.data.Dataset.range(start, stop)
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        ds = ds.filter(lambda example, key: within_limits(example, c))
        ds = ds.map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        return ds.apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=self.service))

    def _served_batches(self, start: int, stop: int) -> tf.data.Dataset:
        c, n = self.data, len(self.utterances)
        ds = self.served_examples(start, stop).map(lambda ex: {k: v for k, v in ex.items() if k != "clip"})
        # Every epoch serves the clips in about the same order (the one drawn once), so a window
        # mixes them differently each time, as for a file cache. At most an epoch: a shuffle fills its
        # window before the first clip leaves, and a larger one would only mix epochs.
        ds = ds.shuffle(min(c.shuffle_buffer_size or n, n), seed=self.seed)
        return batch_by_bucket(ds, c, self.batch_size, drop_remainder=True)

    def _features(self, rows: tf.data.Dataset) -> tf.data.Dataset:
        return self._decoded(rows).map(self._clip_features, num_parallel_calls=self._parallel_calls,
                                       deterministic=self.ordered)

    def _decoded(self, rows: tf.data.Dataset) -> tf.data.Dataset:
        """The rows' clips decoded and tokenised, those outside the limits (`within_limits`) left out."""
        c, table = self.data, self.vocabulary.lookup_table()
        ds = rows.map(lambda row: decode_row(row, c, table), num_parallel_calls=self._parallel_calls, deterministic=self.ordered)
        return ds.filter(lambda ex: within_limits(ex, c))

    def _clip_features(self, example) -> dict:
        return clip_features(example, self.data)

    def _prepare_tables(self) -> None:
        """What the epochs' graphs read as constants, computed in Python before they are traced, and
        the count of the clips the length filter leaves out, said with `echo`."""
        if (self.training and self._cached_features is None) or self._echo is not None:
            # Without a cache, for `_in_full_batches`; with one, this pass fills it (the first batch
            # would wait for that anyway with the cache in RAM, whose every epoch shuffles it whole).
            self._clip_table()
            self._report_left_out()
        self._build_crop_table()

    def _report_left_out(self) -> None:
        """Say how many clips the length filter leaves out, and why: the "data:" line counted them."""
        dropped = np.flatnonzero(self._clip_table().keys < 0)
        if self._echo is None or len(dropped) == 0:
            return
        reasons = self.left_out_reasons(dropped)
        counts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]))
        split = "training" if self.training else "validation"
        self._echo(f"data: {len(dropped)} of the {len(self.utterances)} {split} clips are outside the limits "
                   f"and left out ({counts}); {len(self.utterances) - len(dropped)} remain")

    def left_out_reasons(self, clips) -> dict[str, int]:
        """How many of `clips` (indices) are outside each limit, by the first they fail: these
        clips are decoded once more (the filter kept nothing of them, and they are few)."""
        c, table = self.data, self.vocabulary.lookup_table()
        reasons = []  # the limits' words, set when `map` traces `first_failed`

        def first_failed(row):
            limits = clip_limits(decode_row(row, c, table), c)  # the filter's own limits
            reasons[:] = [reason for reason, _ in limits]
            return tf.argmin(tf.cast(tf.stack([holds for _, holds in limits]), tf.int32), output_type=tf.int32)

        rows = self._rows(tf.constant(np.asarray(clips, np.int64)))
        failed = list(rows.map(first_failed, num_parallel_calls=self._parallel_calls).as_numpy_iterator())
        return dict(collections.Counter(reasons[i] for i in failed))

    def _build_crop_table(self) -> None:
        if self._crops is None and self.cache is not None and self.cache.crops_in_ram:
            c = self.data
            self._crops = CropTable([u.audio_path for u in self.utterances], lambda path: reference_log_mel(path, c),
                                    c.reference_frames, c.n_mels, self._parallel_calls)

    def _with_reference(self, example, key) -> dict:
        if self._crops is not None:  # gathered from RAM
            reference, reference_length = self._crops.gather(self.references.reference_clip(example["clip"], key))
        else:  # decoded from its file
            reference, reference_length = reference_log_mel(self.references.reference_path(example["clip"], key), self.data)
        features = {k: v for k, v in example.items() if k != "clip"}
        return {**features, "reference_mel": reference, "reference_length": reference_length}

    def in_order(self) -> tf.data.Dataset:
        """Every clip's features in manifest order with the seed's references: no cache, no shuffle, no batching."""
        return self._features(self._rows()).map(lambda ex: self._with_reference(ex, tf.constant(self.seed, tf.int64)))

    def _finish(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        c = self.data
        ds = ds.with_options(dataset_options(c, self.training, ordered=self.ordered))
        return ds.prefetch(c.prefetch_buffer_size or tf.data.AUTOTUNE)


@dataclasses.dataclass
class ClipTable:
    """Per clip, by index: mel frames, tokens and batching group (`batch_key`); -1 where the length filter drops it."""
    frames: np.ndarray
    tokens: np.ndarray
    keys: np.ndarray


def check_dispatcher(address: str, timeout_s: float = 10.0) -> None:
    """Raise ValueError unless something accepts connections at the dispatcher `address`
    ([grpc://]host:port). TensorFlow itself retries registering a dataset for up to an hour, printing
    only log lines, so a typo or a dispatcher not started yet would look like a hung run."""
    host, _, port = address.removeprefix("grpc://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ValueError(f"no tf.data service dispatcher answers at data.service_address {address} ({error}): start one "
                         f"with `python utilities/data_service.py dispatcher --bind {host} --port {port}` on {host} (it "
                         f"listens only on its --bind address) and workers beside it, or set "
                         f"data.service_address to \"\" to compute the features on this host") from None


class NoFullBatch(ValueError):
    """The training clips fill no batch: training, and anything that times it, has nothing to run."""

    def __init__(self, clips: int, d: DataConfig, batch_size: int | None = None):
        super().__init__(
            f"the {clips} training clips do not fill one batch of {batch_size or d.batch_size}: clips outside "
            f"data.min_duration_s / data.max_duration_s ({d.min_duration_s}-{d.max_duration_s} s) or with more than "
            f"{d.bucket_text_lengths[-1]} tokens (data.max_chars_per_second x the last of data.bucket_boundaries_s) are "
            "dropped, and with data.bucketing each length bucket fills its own batches; lower data.batch_size "
            "(--batch-size) or add data")


def first_batch(config: Config, rows: list[Utterance], vocabulary: Vocabulary) -> dict:
    """A training-shaped batch of the first clips, to build a model's variables from; `NoFullBatch`
    when the clips fill no batch. Decodes only what one batch needs: no cache, no shuffle."""
    c = dataclasses.replace(config.data, cache_features=False)
    epochs = Epochs(dataclasses.replace(config, data=c), rows, training=False, vocabulary=vocabulary)
    ds = epochs.in_order()
    batch = next(iter(batch_by_bucket(ds, c, epochs.batch_size, drop_remainder=True).take(1)), None)
    if batch is None:
        raise NoFullBatch(len(rows), config.data)
    return batch


def build_vocabulary(utterances: list[Utterance], c: DataConfig) -> Vocabulary:
    """The vocabulary `build_dataset` makes of these rows by default (phonemized first if needed)."""
    if c.text_frontend == "phonemes":
        utterances = phonemize_utterances(utterances, c.language, progress=True)
    return Vocabulary.from_texts(model_texts(utterances, c.text_frontend), frontend=c.text_frontend)


def dataset_options(c: DataConfig, training: bool, ordered: bool | None = None) -> tf.data.Options:
    """Threading and autotuning sized to the cores and memory this process may use. `ordered`: keep
    the order (default: for evaluation and with data.deterministic; `Epochs` decides for its own)."""
    cores = usable_cores()
    options = tf.data.Options()
    options.deterministic = (c.deterministic or not training) if ordered is None else ordered
    options.autotune.enabled = True
    options.autotune.cpu_budget = cores
    options.autotune.ram_budget = usable_ram_bytes() // 2
    options.threading.private_threadpool_size = cores
    # One function call per clip instead of one per stage (decode, length filter, features,
    # reference): about 25% more clips per CPU second on one core (BENCHMARKS.md, 2026-11-24).
    options.experimental_optimization.map_fusion = True
    options.experimental_optimization.map_and_filter_fusion = True
    return options


def copies_to_gpu(c: DataConfig) -> bool:
    """Whether `to_device` copies batches to the GPU: `data.prefetch_to_gpu` and a GPU TensorFlow sees."""
    return bool(c.prefetch_to_gpu) and bool(tf.config.list_logical_devices("GPU"))


def to_device(ds: tf.data.Dataset, c: DataConfig) -> tf.data.Dataset:
    """`ds` with the next batches copied into GPU memory while the current step runs (with
    `copies_to_gpu`; else unchanged). It must be the pipeline's last stage: stages after it would
    bring the batches back through the host."""
    if not copies_to_gpu(c):
        return ds
    return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0", buffer_size=c.prefetch_buffer_size or None))
