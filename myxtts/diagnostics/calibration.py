"""Calibrate the host: what the real input pipeline delivers per core on the user's own data, per route.

Three routes, each the real `pipeline.Epochs` with the config's settings and one change:

    on the fly       data.cache_features: false   decode, log-mel and reference every epoch
    cached features  data.cache_features: true    (in RAM) the epochs after the one that fills it
    mel_on_device    data.cache_features: false, data.mel_on_device: true: decode and reference
                     on the host, the clip's log-mel in the step (counted there, not here)

On a sample of the corpus (`SAMPLE_CLIPS` clips drawn with the config's seed), each route reads the
endless stream training reads (`Epochs.stream`): one untimed epoch (file cache, graph tracing, the
cache fill), then at least `MIN_EPOCHS` whole epochs and `SECONDS_PER_ROUTE`, with `data.num_workers` =
every usable core. (Not `one_pass` epoch after epoch: a new iterator per epoch cost about twice the
epoch's own CPU time on a 128-clip sample, which training, reading one stream, never pays.) The rate counts the audio an epoch delivers in full batches: those are the
only clips an epoch reads (each bucket's last partial batch is known from the clips' lengths and
left unread, `Epochs._in_full_batches`). Per core = audio-seconds per CPU-second the
process used, i.e. the wall-clock rate divided by the cores actually kept busy: on a shared machine
the wall-clock rate sinks with the others' load, the CPU cost of the work much less.

The same pass records the clips' lengths, from which the training FLOPs per audio-second of every
model size are counted (`models/flops.py`) at the sizes the pipeline pads them to. The result is
cached (`hardware/capacity_record.py`), keyed by corpus, data and training settings and CPU model:
a second call returns it without timing anything.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
import time
from collections import Counter
from typing import Callable

import numpy as np

from myxtts.config import Config
from myxtts.data.audio import mel_filterbank
from myxtts.data.manifest import Utterance
from myxtts.data.pipeline import Epochs
from myxtts.data.text import Vocabulary
from myxtts.hardware.capacity_record import (ROUTE_LABELS, CapacityCache, CapacityRecord, ModelCost, RouteRate,
                                             record_key)
from myxtts.hardware.host import cpu_model_name, usable_cores
from myxtts.models.flops import alignment_loop_iterations, clip_training_flops, stft_flops
from myxtts.models.sizes import MODEL_SIZES

SAMPLE_CLIPS = 128
SECONDS_PER_ROUTE = 3.0
# Whole epochs timed at least. An epoch's batches come out before all its clips are decoded (a bucket
# fills before the epoch ends) and the pipeline works ahead into the next, so counting epochs by their
# batches is exact only to about one epoch: at least this many keep that error near 1/8.
MIN_EPOCHS = 8
ROUTE_SETTINGS = {
    "cached_features": {"cache_features": True, "mel_on_device": False, "cache_dir": ""},
    "on_the_fly": {"cache_features": False, "mel_on_device": False},
    "mel_on_device": {"cache_features": False, "mel_on_device": True},
}


def padded_shape(frames: int, tokens: int, config: Config) -> tuple[int, int]:
    """(frames, tokens) a clip is padded to: its bucket's (`buckets.bucket_index`), or its own without bucketing."""
    c = config.data
    if not c.bucketing:
        return frames, tokens
    for mel_size, text_size in zip(c.bucket_mel_lengths, c.bucket_text_lengths):
        if frames <= mel_size and tokens <= text_size:
            return mel_size, text_size
    raise ValueError(f"a clip of {frames} frames and {tokens} tokens fits no bucket; the length filter should have "
                     "dropped it")


def filterbank_bins(config: Config) -> int:
    """The STFT bins the log-mel reads (those below fmax, as `audio.mel_spectrogram` slices them)."""
    c = config.data
    filters = mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, float(c.fmin), float(c.mel_fmax), c.mel_scale == "htk")
    return int(np.max(np.nonzero(filters.any(axis=1)))) + 1


def model_costs(config: Config, frames: list[int], tokens: list[int], vocab_size: int) -> dict[str, ModelCost]:
    """Training FLOPs per audio-second of every model size on these clips, padded as the pipeline pads them."""
    c, t = config.data, config.training
    audio = _audio_seconds(frames, c)
    shapes = Counter(padded_shape(f, n, config) for f, n in zip(frames, tokens))
    bins = filterbank_bins(config)
    costs = {}
    for name in MODEL_SIZES:
        total = forward = mel = moved = 0.0
        for (padded_frames, padded_tokens), count in shapes.items():
            step = clip_training_flops(name, frames=padded_frames, tokens=padded_tokens,
                                       reference_frames=c.reference_frames, n_mels=c.n_mels, vocab_size=vocab_size,
                                       decoder_window=t.decoder_window,
                                       gradient_checkpointing=t.gradient_checkpointing)
            total += count * step.total
            forward += count * step.forward
            moved += count * step.matmul_bytes
            mel += count * (stft_flops(padded_frames, c.n_fft) + 2 * padded_frames * bins * c.n_mels)
        costs[name] = ModelCost(total / audio, forward / audio, mel / audio, total / moved)
    return costs


def calibrate(config: Config, rows: list[Utterance], vocabulary: Vocabulary, *, corpus: str,
              cache: CapacityCache | None = None, recalibrate: bool = False, clips: int = SAMPLE_CLIPS,
              seconds: float = SECONDS_PER_ROUTE, progress: Callable[[str], None] = lambda message: None
              ) -> CapacityRecord:
    """The host's per-core rate on every route, and the model costs on these clips; from `cache`
    when it holds this corpus, these settings and this CPU (unless `recalibrate`)."""
    cache = cache if cache is not None else CapacityCache()
    sample = random.Random(config.seed).sample(rows, min(clips, len(rows)))
    settings = _settings(config, len(sample))
    cpu = cpu_model_name()
    key = record_key(corpus, cpu, settings)
    if not recalibrate:
        cached = cache.load(key)
        if cached is not None:
            progress(f"host calibration from the cache: {cache.path_for(key)} ({cached.created_utc})")
            return cached

    began = time.perf_counter()
    parallel = usable_cores()
    load_before = os.getloadavg()[0]
    routes, lengths = {}, None
    # The cached route first: the pass that fills its cache also gives every clip's lengths.
    for route, changes in ROUTE_SETTINGS.items():
        data = dataclasses.replace(config.data, num_workers=parallel, prefetch_to_gpu=False, **changes)
        epochs = Epochs(dataclasses.replace(config, data=data), sample, training=True, vocabulary=vocabulary)
        if lengths is None:
            progress(f"calibrating the host on {len(sample)} clips of {corpus}: filling the feature cache")
            lengths = epochs.clip_lengths()
            audio = _audio_seconds(lengths[0], config.data)
            batches = epochs.batches_per_epoch()  # from the lengths the pass above recorded
        routes[route] = _time_route(route, epochs, batches, parallel, seconds, progress)
    frames, tokens = lengths
    padded = sum(padded_shape(f, n, config)[0] for f, n in zip(frames, tokens))
    loops = sum(alignment_loop_iterations(padded_shape(f, n, config)[0]) for f, n in zip(frames, tokens))
    record = CapacityRecord(
        key=key,
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        cpu_model=cpu,
        usable_cores=parallel,
        load_average=(load_before, os.getloadavg()[0]),
        corpus=corpus,
        clips=len(frames),
        audio_seconds=audio,
        tokens_per_audio_s=sum(tokens) / audio,
        padding=padded / sum(frames),
        batch_size=config.data.batch_size,
        loop_iterations_per_audio_s=loops / audio,
        settings=settings,
        routes=routes,
        models=model_costs(config, frames, tokens, len(vocabulary)),
    )
    path = cache.store(record)
    progress(f"host calibration saved to {path} (took {time.perf_counter() - began:.0f} s, once per corpus, settings and CPU)")
    return record


def _time_route(route: str, epochs: Epochs, batches_per_epoch: int, parallel: int, seconds: float,
                progress) -> RouteRate:
    """Whole epochs of the endless stream training reads (`Epochs.stream`), after one untimed epoch."""
    iterator = iter(epochs.stream())

    c = epochs.data

    def one_epoch() -> float:
        """The audio-seconds of one epoch's full batches."""
        # An epoch yields the same number of full batches every time (the buckets keep their clips), so
        # this many batches are one epoch's work, give or take what prefetching runs ahead.
        frames = [next(iterator)["mel_length"].numpy() for _ in range(batches_per_epoch)]
        return _audio_seconds(np.concatenate(frames).tolist(), c)

    one_epoch()  # untimed: file cache, tracing, thread start-up, the reference crops
    count, audio, wall, cpu = 0, 0.0, time.perf_counter(), time.process_time()
    while count < MIN_EPOCHS or time.perf_counter() - wall < seconds:
        audio += one_epoch()
        count += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rate = RouteRate(route=route, audio_s_per_cpu_s=audio / cpu, audio_s_per_s=audio / wall,
                     cores_busy=cpu / wall, parallel_calls=parallel, epochs=count, seconds=wall)
    progress(f"  {ROUTE_LABELS[route]}: {rate.audio_s_per_s:,.0f} audio-s/s with {parallel} parallel calls, "
             f"{rate.cores_busy:.1f} cores busy: {rate.audio_s_per_cpu_s:,.0f} audio-s per CPU-second")
    return rate


def _audio_seconds(frames: list[int], c) -> float:
    # A clip of n samples has 1 + n // hop frames: n lies in [(frames - 1) * hop, frames * hop), whose middle is taken.
    return sum(f - 0.5 for f in frames) * c.hop_length / c.sample_rate


def _settings(config: Config, clips: int) -> dict:
    """What the record depends on besides the corpus and the CPU: every data setting that changes the
    work (not the route keys the calibration sets itself), and the training settings of the FLOP count."""
    data = {k: v for k, v in dataclasses.asdict(config.data).items()
            if k not in {"train_data", "val_data", "num_workers", "cache_features", "cache_dir", "mel_on_device",
                         "prefetch_to_gpu", "prefetch_buffer_size"}}
    return {"data": data, "decoder_window": config.training.decoder_window,
            "gradient_checkpointing": config.training.gradient_checkpointing, "clips": clips}
