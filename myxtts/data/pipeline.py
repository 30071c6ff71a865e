"""From a manifest to padded, bucketed, prefetched batches, built only from TensorFlow ops.

    paths + model texts -> read_file -> decode_wav -> resample (if the file's rate differs)
      -> peak-normalise -> tokenise -> length filter -> log-mel (+ reference clip of the same voice)
      -> cache -> shuffle -> bucket by length, pad to the bucket's size -> prefetch (to the GPU)

Nothing in the hot path calls back into Python (tests/test_pipeline.py scans the dataset graph for
PyFunc ops), so the input pipeline scales with cores instead of queueing on the GIL. Batches are
padded to bucket boundaries, not to the longest clip in the batch, so a compiled train step sees
one shape per bucket. The model texts are the rows' phonemes (`data.text_frontend: phonemes`, made
in Python before the graph: by dataset preparation, the demo corpus or `phonemize_utterances`) or
their transcripts; the graph only splits them into characters and looks those up.

A batch is a dict:
    mel              float32 [batch, frames, n_mels]   log-mel, padded with log(data.log_floor)
                     (with data.mel_on_device: `audio` float32 [batch, (frames - 1) * hop] instead,
                     zero-padded, which `mel_from_audio` turns into `mel` inside the compiled step)
    mel_length       int32   [batch]                   true frame counts (mask with these)
    tokens           int32   [batch, text_length]      one id per symbol of the model text, padded with PAD_ID
    text_length      int32   [batch]
    reference_mel    float32 [batch, ref_frames, n_mels]  another clip of the same speaker
    reference_length int32   [batch]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import defaultdict
from pathlib import Path

import tensorflow as tf

from myxtts.config import Config, DataConfig
from myxtts.data import audio
from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.phonemes import model_texts, phonemize_utterances
from myxtts.data.text import PAD_ID, Vocabulary, tokenize
from myxtts.hardware.host import usable_cores, usable_ram_bytes

# Used when `data.batch_size` / `data.num_workers` are 0 ("automatic") and no hardware plan has
# resolved them yet (the trainer writes the plan's values into the config before building datasets).
DEFAULT_BATCH_SIZE = 16


def assign_references(utterances: list[Utterance], seed: int) -> list[str]:
    """For each utterance, the audio path of another utterance by the same speaker (itself if alone).

    Chosen once, deterministically from the seed; this is cheap Python over a list of paths, done
    before the graph is built, not per batch.
    """
    by_speaker: dict[str, list[int]] = defaultdict(list)
    for index, utterance in enumerate(utterances):
        by_speaker[utterance.speaker].append(index)
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


def build_dataset(
    config: Config,
    manifest: str | os.PathLike | list[Utterance],
    training: bool = True,
    *,
    vocabulary: Vocabulary | None = None,
    gpu_copy: bool = True,
) -> tf.data.Dataset:
    """Batches for training (shuffled, fixed batch size) or evaluation (in order, last batch kept).

    `manifest` is an LJSpeech folder or metadata.csv, a JSONL manifest, or a list of `Utterance`.
    `vocabulary` defaults to one built from these rows' model texts; pass the training vocabulary
    when building a validation set. With `data.text_frontend: phonemes`, rows without phonemes for
    `data.language` are phonemized here first, in Python (the trainer does it before, with a cache).
    `gpu_copy=False` leaves out the copy to the GPU (`data.prefetch_to_gpu`),
    for a caller that adds stages of its own and then `to_device(dataset, config.data)` last.
    """
    c = config.data
    utterances = read_manifest(manifest) if isinstance(manifest, (str, os.PathLike)) else list(manifest)
    if not utterances:
        raise ValueError(f"no utterances in {manifest if isinstance(manifest, (str, os.PathLike)) else 'the given list'}")
    if c.text_frontend == "phonemes":
        utterances = phonemize_utterances(utterances, c.language, progress=True)
    texts = model_texts(utterances, c.text_frontend)
    vocabulary = vocabulary or Vocabulary.from_texts(texts, frontend=c.text_frontend)
    batch_size = c.batch_size or DEFAULT_BATCH_SIZE
    parallel_calls = c.num_workers or tf.data.AUTOTUNE

    ds = tf.data.Dataset.from_tensor_slices(
        {
            "audio_path": [u.audio_path for u in utterances],
            "reference_path": assign_references(utterances, config.seed),
            "text": texts,
        }
    )
    cache = bool(c.cache_features)
    if training and not cache:
        # Without a cache every epoch recomputes features anyway, so shuffle the cheap file list.
        ds = ds.shuffle(len(utterances), seed=config.seed, reshuffle_each_iteration=True)

    table = vocabulary.lookup_table()
    ds = ds.map(lambda row: _decode(row, c, table), num_parallel_calls=parallel_calls)
    ds = ds.filter(lambda ex: within_limits(ex, c))
    ds = ds.map(lambda ex: _features(ex, c), num_parallel_calls=parallel_calls)
    if cache:
        ds = ds.cache(_cache_path(c, utterances, texts, vocabulary, training))
        if training:
            ds = ds.shuffle(min(c.shuffle_buffer_size or len(utterances), len(utterances)), seed=config.seed)
    ds = batch_by_bucket(ds, c, batch_size, drop_remainder=training)
    ds = ds.with_options(dataset_options(c, training)).prefetch(c.prefetch_buffer_size or tf.data.AUTOTUNE)
    return to_device(ds, c) if gpu_copy else ds


def build_vocabulary(utterances: list[Utterance], c: DataConfig) -> Vocabulary:
    """The vocabulary `build_dataset` makes of these rows by default (phonemized first if needed)."""
    if c.text_frontend == "phonemes":
        utterances = phonemize_utterances(utterances, c.language, progress=True)
    return Vocabulary.from_texts(model_texts(utterances, c.text_frontend), frontend=c.text_frontend)


def _decode(row, c: DataConfig, table) -> dict:
    samples, rate = audio.load_wav(row["audio_path"])
    samples = audio.resample_to(samples, rate, c.sample_rate, source=row["audio_path"])
    if c.trim_silence_db > 0:
        samples = audio.trim_silence(samples, c.trim_silence_db)
    tokens = tokenize(row["text"], table, frontend=c.text_frontend)
    return {
        "samples": audio.peak_normalize(samples, c.peak_normalize),
        "tokens": tokens,
        "reference_path": row["reference_path"],
    }


def within_limits(example, c: DataConfig) -> tf.Tensor:
    """Whether a decoded clip fits `data.min/max_duration_s` and the longest text bucket, and has
    at least as many mel frames as tokens (the alignment gives every token a frame of its own)."""
    num_samples = tf.shape(example["samples"])[0]
    num_tokens = tf.shape(example["tokens"])[0]
    return (
        (num_samples >= int(c.min_duration_s * c.sample_rate))
        & (num_samples <= int(c.max_duration_s * c.sample_rate))
        & (num_tokens <= c.bucket_text_lengths[-1])
        & (num_tokens >= 1)
        & (1 + num_samples // c.hop_length >= num_tokens)
    )


def _features(example, c: DataConfig) -> dict:
    reference, reference_length = reference_log_mel(example["reference_path"], c)
    if c.mel_on_device:
        # The waveform travels instead; the compiled step turns it into the same log-mel.
        signal = {"audio": example["samples"], "mel_length": 1 + tf.shape(example["samples"])[0] // c.hop_length}
    else:
        mel = audio.log_mel(example["samples"], c)  # [frames, n_mels]
        signal = {"mel": mel, "mel_length": tf.shape(mel)[0]}
    return {
        **signal,
        "tokens": example["tokens"],
        "text_length": tf.shape(example["tokens"])[0],
        "reference_mel": reference,
        "reference_length": reference_length,
    }


def reference_log_mel(path, c: DataConfig):
    """The middle `reference_duration_s` of a clip (away from leading and trailing silence), as a
    log-mel padded to a fixed number of frames: ([reference_frames, n_mels], true frames)."""
    samples, rate = audio.load_wav(path, middle_seconds=c.reference_duration_s)
    samples = audio.resample_to(samples, rate, c.sample_rate, source=path)[: c.reference_samples]
    mel = audio.log_mel(audio.peak_normalize(samples, c.peak_normalize), c)  # [frames <= reference_frames, n_mels]
    frames = tf.shape(mel)[0]
    mel = tf.pad(mel, [[0, c.reference_frames - frames], [0, 0]], constant_values=math.log(c.log_floor))
    return tf.ensure_shape(mel, [c.reference_frames, c.n_mels]), frames


def mel_from_audio(batch: dict, c: DataConfig) -> dict:
    """With `data.mel_on_device`, replace the batch's padded waveforms by their log-mel (in the step).

    A bucket's waveforms are padded to (frames - 1) * hop samples, so the centred STFT gives exactly
    the bucket's frame count; frames inside each clip's `mel_length` equal the per-clip features.
    """
    if "audio" not in batch:
        return batch
    features = {k: v for k, v in batch.items() if k != "audio"}
    features["mel"] = audio.log_mel(batch["audio"], c)  # [batch, frames, n_mels], float32
    return features


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


def _cache_path(c: DataConfig, utterances, texts, vocabulary: Vocabulary, training: bool) -> str:
    """In memory when `data.cache_dir` is empty; else a file named after everything that shapes the
    features, so changing the corpus or a feature setting never reads a stale cache."""
    if not c.cache_dir:
        return ""
    feature_keys = {
        k: v
        for k, v in vars(c).items()
        if k not in {"batch_size", "num_workers", "prefetch_buffer_size", "prefetch_to_gpu", "cache_dir", "bucketing",
                     "shuffle_buffer_size", "deterministic", "train_data", "val_data", "val_fraction"}
    }
    key = json.dumps([feature_keys, [(u.audio_path, text, u.speaker) for u, text in zip(utterances, texts)], vocabulary.tokens])
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    Path(c.cache_dir).mkdir(parents=True, exist_ok=True)
    return str(Path(c.cache_dir) / f"{'train' if training else 'eval'}-{digest}")


def dataset_options(c: DataConfig, training: bool) -> tf.data.Options:
    """Threading and autotuning sized to the cores and memory this process may use."""
    cores = usable_cores()
    options = tf.data.Options()
    # Order only matters for evaluation and reproducibility tests; elsewhere let fast clips overtake.
    options.deterministic = c.deterministic or not training
    options.autotune.enabled = True
    options.autotune.cpu_budget = cores
    options.autotune.ram_budget = usable_ram_bytes() // 2
    options.threading.private_threadpool_size = cores
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
