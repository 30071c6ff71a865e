"""The native tf.data pipeline: no Python in the graph, exact batch shapes, buckets, determinism."""

import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import load_config
from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.buckets import bucket_index
from myxtts.data.pipeline import Epochs, NoFullBatch, assign_references, build_dataset, shuffle_with_key
from myxtts.data.text import PAD_ID
from myxtts.diagnostics.graph_scan import find_python_ops

BATCH_KEYS = {"mel", "mel_length", "tokens", "text_length", "reference_mel", "reference_length"}


def _config(*overrides, level="enhanced"):
    return load_config(overrides=["data.batch_size=4", "data.deterministic=true", *overrides], optimization_level=level)


@pytest.fixture(scope="module")
def utterances(demo_corpus):
    return read_manifest(demo_corpus)


@pytest.fixture(scope="module")
def batches(utterances):
    return list(build_dataset(_config(), utterances, training=True).as_numpy_iterator())


def test_dataset_graph_has_no_python_ops(utterances):
    for level in ("basic", "enhanced"):
        assert find_python_ops(build_dataset(_config(level=level), utterances)) == []
    # The characters front end normalises in the graph: still no Python there.
    assert find_python_ops(build_dataset(_config("data.text_frontend=characters"), utterances)) == []


def test_the_pipeline_avoids_its_two_measured_slow_paths(utterances):
    # Both found by utilities/profile_features.py and utilities/benchmark_pipeline.py (BENCHMARKS.md,
    # 2026-11-24): the complex `tf.abs` (ComplexAbs) cost 3x the written-out magnitude, and unfused
    # map stages ~25% of the clips per CPU second. Speed is measured there, not here; this keeps them out.
    from myxtts.diagnostics.graph_scan import dataset_ops

    for level in ("basic", "enhanced"):
        ds = build_dataset(_config("data.cache_features=false", level=level), utterances)
        assert "ComplexAbs" not in dataset_ops(ds)
        assert {"RFFT", "MatMul"} <= dataset_ops(ds)  # the log-mel is in this graph, so the scan saw it
        optimization = ds.options().experimental_optimization
        assert optimization.map_fusion and optimization.map_and_filter_fusion


def test_tokens_are_the_rows_phonemes(utterances):
    # The demo rows carry their phonemes; each batch row is one of them, id for id, with the
    # vocabulary's own Python encoding (so stress marks and punctuation are tokens, nothing folded).
    from myxtts.data.pipeline import build_vocabulary

    vocabulary = build_vocabulary(utterances, _config().data)
    encoded = {tuple(vocabulary.encode(u.phonemes, "phonemes")) for u in utterances}
    batches = build_dataset(_config(), utterances, training=False, vocabulary=vocabulary).as_numpy_iterator()
    rows = [tuple(b["tokens"][i, : b["text_length"][i]].tolist()) for b in batches for i in range(len(b["tokens"]))]
    assert len(rows) == len(utterances) and set(rows) <= encoded
    symbols = set(vocabulary.symbols)
    assert {"ˈaɪ", ",", ".", " "} <= symbols and not set("ABCDEFGHIJKLMNOPQRSTUVWXYZ|ˈ") & symbols


def test_graph_scan_finds_a_numpy_function():
    # The scan above must be able to fail: a pipeline with a numpy_function is caught, by name.
    ds = tf.data.Dataset.range(3).map(lambda x: tf.numpy_function(lambda v: v * 2, [x], tf.int64, name="slow_librosa"))
    found = find_python_ops(ds)
    assert [op.op for op in found] == ["PyFunc"] and "slow_librosa" in found[0].describe()
    generated = tf.data.Dataset.from_generator(lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32))
    assert any(op.op == "GeneratorDataset" for op in find_python_ops(generated))


def test_batches_have_exact_shapes_from_the_bucket_boundaries(batches):
    c = _config().data
    allowed = set(zip(c.bucket_mel_lengths, c.bucket_text_lengths))
    assert len(batches) >= 3
    for batch in batches:
        assert set(batch) == BATCH_KEYS
        b = 4
        frames, text = batch["mel"].shape[1], batch["tokens"].shape[1]
        assert (frames, text) in allowed
        assert batch["mel"].shape == (b, frames, c.n_mels) and batch["mel"].dtype == np.float32
        assert batch["tokens"].shape == (b, text) and batch["tokens"].dtype == np.int32
        assert batch["reference_mel"].shape == (b, c.reference_frames, c.n_mels)
        for key in ("mel_length", "text_length", "reference_length"):
            assert batch[key].shape == (b,) and batch[key].dtype == np.int32
        # Each example sits in the smallest bucket that fits it.
        for mel_length, text_length in zip(batch["mel_length"], batch["text_length"]):
            assert int(bucket_index(mel_length, text_length, c)) == c.bucket_mel_lengths.index(frames)


def test_padding_is_silence_and_pad_tokens_beyond_the_true_lengths(batches):
    floor = math.log(_config().data.log_floor)
    for batch in batches:
        for i in range(batch["mel"].shape[0]):
            n, t, r = batch["mel_length"][i], batch["text_length"][i], batch["reference_length"][i]
            assert np.all(batch["mel"][i, n:] == np.float32(floor)) and np.any(batch["mel"][i, :n] > floor)
            assert np.all(batch["tokens"][i, t:] == PAD_ID) and np.all(batch["tokens"][i, :t] > PAD_ID)
            assert t <= n  # at least one frame per token: the alignment needs it
            assert np.all(batch["reference_mel"][i, r:] == np.float32(floor))


def test_mel_lengths_are_the_true_clip_lengths(utterances):
    import librosa
    import soundfile

    c = _config().data
    # Each clip as soundfile reads it, trimmed of trailing/leading silence by librosa's rule.
    clips = [librosa.effects.trim(soundfile.read(u.audio_path, dtype="float32")[0], top_db=c.trim_silence_db)[0]
             for u in utterances]
    expected = sorted(1 + len(clip) // c.hop_length for clip in clips)
    eval_batches = build_dataset(_config(), utterances, training=False)
    got = sorted(int(n) for b in eval_batches.as_numpy_iterator() for n in b["mel_length"])
    assert got == expected  # evaluation keeps every clip, including each bucket's last partial batch


@pytest.mark.parametrize("bucketing, clips", [("true", 24), ("false", 23)])  # 23: one partial batch of the single group
def test_an_epoch_computes_no_features_for_the_clips_its_batching_drops(utterances, bucketing, clips):
    # Each bucket's last partial batch is dropped every training epoch. Without a cache, the pipeline
    # works out which clips those are from the order and the clips' lengths, and leaves them unread
    # (BENCHMARKS.md: 43 of 123 clips on a small corpus); the batches stay the same.
    from myxtts.data.pipeline import Epochs

    config = _config("data.cache_features=false", f"data.bucketing={bucketing}")
    utterances = utterances[:clips]

    class Counting(Epochs):
        """Counts the clips whose features are computed."""

        def __init__(self, *args, skip_dropped, **kwargs):
            super().__init__(*args, **kwargs)
            self.featurized = tf.Variable(0, dtype=tf.int64)
            self.skip_dropped = skip_dropped

        def _in_full_batches(self, order):
            return super()._in_full_batches(order) if self.skip_dropped else order

        def _clip_features(self, example):
            with tf.control_dependencies([self.featurized.assign_add(1)]):
                return {k: tf.identity(v) for k, v in super()._clip_features(example).items()}

    def one_epoch(skip_dropped):
        epochs = Counting(config, utterances, training=True, skip_dropped=skip_dropped)
        epochs._prepare_tables()
        batches = list(epochs.epoch(epochs.epoch_key(0)).as_numpy_iterator())
        return batches, int(epochs.featurized.numpy())

    batches, featurized = one_epoch(skip_dropped=True)
    usual_batches, usual_featurized = one_epoch(skip_dropped=False)
    delivered = sum(len(b["mel_length"]) for b in batches)
    assert featurized == delivered == len(batches) * 4
    assert usual_featurized > delivered  # this corpus has partial buckets, so the check can fail
    assert len(batches) == len(usual_batches)
    for batch, usual in zip(batches, usual_batches):
        assert batch.keys() == usual.keys()
        for key in batch:
            np.testing.assert_array_equal(batch[key], usual[key])


def test_same_seed_same_batches_other_seed_other_order(utterances):
    def first_batches(seed):
        ds = build_dataset(_config(f"seed={seed}"), utterances, training=True)
        return [b["mel_length"].tolist() for b in ds.take(3).as_numpy_iterator()]

    assert first_batches(1) == first_batches(1)
    assert first_batches(1) != first_batches(2)


def test_epochs_are_reshuffled(utterances):
    ds = build_dataset(_config("data.cache_features=false"), utterances, training=True)
    epochs = [[b["mel_length"].tolist() for b in ds.as_numpy_iterator()] for _ in range(2)]
    assert epochs[0] != epochs[1]


def test_references_come_from_another_clip_of_the_same_speaker():
    utterances = [Utterance(f"/a/{s}{i}.wav", "x", s) for s in "pq" for i in range(5)] + [Utterance("/a/solo.wav", "x", "r")]
    references = assign_references(utterances, seed=0)
    for utterance, reference in zip(utterances, references):
        if utterance.speaker == "r":
            assert reference == utterance.audio_path  # alone: a crop of itself
        else:
            assert reference != utterance.audio_path and reference.startswith(f"/a/{utterance.speaker}")
    assert references == assign_references(utterances, seed=0) != assign_references(utterances, seed=1)


def test_reference_mel_is_the_reference_clip(utterances):
    # With one speaker per clip, the reference is the middle of the clip itself: compare directly.
    from myxtts.data import audio

    solo = [Utterance(u.audio_path, u.text, f"solo{i}") for i, u in enumerate(utterances[:4])]
    c = _config("data.bucketing=false").data
    batch = next(build_dataset(_config("data.bucketing=false"), solo, training=False).as_numpy_iterator())
    samples, _ = audio.load_wav(solo[0].audio_path)
    start = (len(samples) - c.reference_samples) // 2
    expected = audio.log_mel(audio.peak_normalize(samples[start : start + c.reference_samples], c.peak_normalize), c).numpy()
    np.testing.assert_allclose(batch["reference_mel"][0, : len(expected)], expected, atol=1e-4)


def test_length_filter_drops_clips_outside_the_limits(utterances):
    config = _config("data.min_duration_s=3.0", "data.max_duration_s=6.0")
    kept = [n for b in build_dataset(config, utterances, training=False).as_numpy_iterator() for n in b["mel_length"]]
    seconds = [(n - 1) * 256 / 22050 for n in kept]
    assert kept and all(2.98 <= s <= 6.0 for s in seconds)
    assert len(kept) < len(utterances)


def test_no_full_batch_names_the_text_limit_too(utterances):
    # With data.max_chars_per_second: 0.1 every clip had too many tokens, and the error named the durations alone.
    epochs = Epochs(_config("data.max_chars_per_second=0.1"), utterances, training=True)
    with pytest.raises(NoFullBatch, match=re.escape("or with more than 8 tokens (data.max_chars_per_second x the last of "
                                                    "data.bucket_boundaries_s) are dropped")):
        epochs.batches_per_epoch()


def test_keys_change_what_is_built(utterances, tmp_path):
    base = next(build_dataset(_config(), utterances, training=True).as_numpy_iterator())
    changed = next(
        build_dataset(
            _config("data.batch_size=2", "data.n_mels=40", "data.reference_duration_s=1.0",
                    f"data.cache_dir={tmp_path}"),
            utterances,
            training=True,
        ).as_numpy_iterator()
    )
    assert base["mel"].shape[0] == 4 and changed["mel"].shape[0] == 2
    assert base["mel"].shape[2] == 80 and changed["mel"].shape[2] == 40
    assert changed["reference_mel"].shape[1] == 1 + 22050 // 256
    assert any(p.name.startswith("train-") for p in tmp_path.iterdir())  # the on-disk cache was written

    # Without bucketing, batches are padded to their own longest clip instead of a bucket size.
    c = _config().data
    unbucketed = build_dataset(_config(level="basic"), utterances, training=True)
    lengths = [(b["mel"].shape[1], int(b["mel_length"].max())) for b in unbucketed.as_numpy_iterator()]
    assert all(padded == longest for padded, longest in lengths)
    assert any(padded not in c.bucket_mel_lengths for padded, _ in lengths)


def test_empty_manifest_is_an_error():
    with pytest.raises(ValueError, match="no utterances"):
        build_dataset(_config(), [])


def test_mel_on_device_gives_the_same_features(utterances):
    from myxtts.data.clip_features import mel_from_audio

    for level in ("enhanced", "basic"):  # bucketed and batch-padded
        host = list(build_dataset(_config(level=level), utterances, training=False).as_numpy_iterator())
        device = list(build_dataset(_config("data.mel_on_device=true", level=level), utterances, training=False))
        assert len(host) == len(device)
        for h, d in zip(host, device):
            assert "mel" not in d and d["audio"].dtype == tf.float32
            mel = mel_from_audio(d, _config().data)["mel"].numpy()
            assert mel.shape == h["mel"].shape
            np.testing.assert_array_equal(d["mel_length"].numpy(), h["mel_length"])
            for i, n in enumerate(h["mel_length"]):
                np.testing.assert_allclose(mel[i, :n], h["mel"][i, :n], atol=2e-3)


# --- Order and references at scale: a manifest sorted by speaker -----------------------------------


def _by_speaker(utterances):
    return sorted(utterances, key=lambda u: (u.speaker, u.audio_path))


def _expected_speakers_per_batch(speaker_counts, batch):
    """E[distinct speakers] in `batch` clips drawn at random without replacement (hypergeometric)."""
    total = sum(speaker_counts)
    return sum(1 - math.comb(total - n, batch) / math.comb(total, batch) for n in speaker_counts)


def _speakers_of_batches(dataset, utterances, vocabulary, epochs):
    speaker_of = {tuple(vocabulary.encode(u.phonemes, "phonemes")): u.speaker for u in utterances}
    assert len(speaker_of) == len(utterances)  # every sentence differs: tokens name the clip
    per_batch = []
    for _ in range(epochs):
        for batch in dataset.as_numpy_iterator():
            per_batch.append({speaker_of[tuple(row[:n])] for row, n in zip(batch["tokens"], batch["text_length"])})
    return per_batch


@pytest.mark.parametrize("cache", ["ram", "file"])
def test_a_speaker_sorted_manifest_gives_batches_of_mixed_speakers(utterances, cache, tmp_path):
    """A window shuffle (here 4 clips, standing for 2,048 of a corpus far larger) over a manifest sorted
    by speaker gave single-speaker batches. Both caches must give about as many speakers per batch as
    random order does. (Without a cache the file list is permuted whole every epoch, as before.)"""
    from myxtts.data.pipeline import build_vocabulary

    sorted_rows = _by_speaker(utterances)
    settings = {"ram": [], "file": [f"data.cache_dir={tmp_path}"]}[cache]
    config = _config("data.bucketing=false", "data.shuffle_buffer_size=4", *settings)
    vocabulary = build_vocabulary(sorted_rows, config.data)
    batches = _speakers_of_batches(build_dataset(config, sorted_rows, training=True, vocabulary=vocabulary),
                                   sorted_rows, vocabulary, epochs=10)
    counts = [sum(u.speaker == s for u in sorted_rows) for s in sorted({u.speaker for u in sorted_rows})]
    expected = _expected_speakers_per_batch(counts, 4)  # 3.2 for 5 speakers of 4-5 clips
    observed = np.mean([len(speakers) for speakers in batches])
    # 60 batches; one batch's count has a standard deviation of about 0.6, so 0.35 is several standard
    # errors. The manifest's own order gives about 1.6.
    assert abs(observed - expected) < 0.35, (observed, expected)


def test_references_are_another_clip_of_the_speaker_drawn_again_each_epoch(utterances):
    from myxtts.data.clip_features import reference_log_mel
    from myxtts.data.pipeline import build_vocabulary

    config = _config("data.bucketing=false")
    c = config.data
    rows = _by_speaker(utterances)
    vocabulary = build_vocabulary(rows, c)
    crops = [reference_log_mel(u.audio_path, c)[0].numpy() for u in rows]  # what each clip lends as a reference
    clip_of = {tuple(vocabulary.encode(u.phonemes, "phonemes")): i for i, u in enumerate(rows)}

    def references(dataset):
        """{clip: index of the clip whose crop is its reference} for one epoch."""
        chosen = {}
        for batch in dataset.as_numpy_iterator():
            for row, n, reference in zip(batch["tokens"], batch["text_length"], batch["reference_mel"]):
                matches = [j for j, crop in enumerate(crops) if np.allclose(crop, reference, atol=1e-5)]
                assert len(matches) == 1
                chosen[clip_of[tuple(row[:n])]] = matches[0]
        return chosen

    dataset = build_dataset(config, rows, training=True, vocabulary=vocabulary)
    epochs = [references(dataset) for _ in range(3)]
    for chosen in epochs:
        for clip, reference in chosen.items():
            assert rows[reference].speaker == rows[clip].speaker and reference != clip
    shared = set(epochs[0]) & set(epochs[1]) & set(epochs[2])
    redrawn = [clip for clip in shared if len({epochs[e][clip] for e in range(3)}) > 1]
    # Each speaker has 4 or 5 clips, so a reference repeats in the next epoch with p = 1/3 or 1/4.
    assert len(redrawn) >= len(shared) // 2, (len(redrawn), len(shared))
    # data.deterministic: true: the same seed gives the same epochs, references included.
    again = build_dataset(config, rows, training=True, vocabulary=vocabulary)
    assert [references(again) for _ in range(3)] == epochs


@pytest.mark.parametrize("settings", [["data.deterministic=false", "data.num_workers=4"],
                                      ["data.cache_features=false", "data.deterministic=true"]])
def test_a_stream_started_mid_way_continues_the_uninterrupted_one(utterances, settings):
    """What a resumed run trains on: batch k onwards of the stream started at k equals batch k onwards of
    the stream started at 0, two epochs in. With the default levels (a feature cache) that holds with
    data.deterministic: false too (parallel decoding may finish clips in any order)."""
    from myxtts.data.pipeline import Epochs, build_vocabulary

    config = _config("data.bucketing=false", *settings)
    rows = utterances[:12]  # three batches an epoch
    vocabulary = build_vocabulary(rows, config.data)

    def as_lists(dataset, count):
        return [{k: v.tolist() for k, v in b.items()} for b in dataset.take(count).as_numpy_iterator()]

    resumed = Epochs(config, rows, training=True, vocabulary=vocabulary)  # a new process would build its own
    per_epoch = resumed.batches_per_epoch()
    assert per_epoch == 3
    start = per_epoch + 2  # into the second epoch: the first is not replayed
    uninterrupted = as_lists(Epochs(config, rows, training=True, vocabulary=vocabulary).stream(0), start + 3)
    assert as_lists(resumed.stream(start), 3) == uninterrupted[start:]
    assert uninterrupted[:3] != uninterrupted[per_epoch : per_epoch + 3]  # epochs differ


def test_features_that_do_not_fit_in_ram_are_cached_in_a_file(utterances, tmp_path, monkeypatch):
    from myxtts.data import feature_cache

    config = _config("data.bucketing=false")
    c = config.data
    features = feature_cache.estimate_cache_bytes(c, utterances, [u.phonemes for u in utterances])
    crops = feature_cache.crop_table_bytes(c, len(utterances))  # the references kept in RAM
    # RAM for the crops and half the features: the features go to disk, the crops stay in RAM.
    monkeypatch.setattr(feature_cache, "usable_ram_bytes", lambda: 2 * (crops + features // 2))
    with pytest.raises(ValueError, match=r"do not fit in 50% of the RAM.*set data\.cache_dir.*data\.cache_features: false"):
        build_dataset(config, utterances, training=True)
    notes = []
    dataset = build_dataset(config, utterances, training=True, fallback_cache_dir=tmp_path / "cache", echo=notes.append)
    assert len(notes) == 1 and str(tmp_path / "cache") in notes[0] and "from their files" not in notes[0]
    on_disk = list(dataset.as_numpy_iterator())
    assert len(on_disk) == len(utterances) // 4
    data_files = list((tmp_path / "cache").glob("train-*.data-*"))
    assert len(data_files) == 1
    # The estimate from the manifest's durations against what the cache file holds: trimmed
    # silence makes the features shorter than the clips, tensor framing adds a little.
    assert 0.8 < features / data_files[0].stat().st_size < 1.6, (features, data_files[0].stat().st_size)
    # Not even the crops fit: references are decoded from their files every epoch, said once.
    monkeypatch.setattr(feature_cache, "usable_ram_bytes", lambda: crops)
    notes.clear()
    from_files = list(build_dataset(config, utterances, training=True, fallback_cache_dir=tmp_path / "cache",
                                    echo=notes.append).as_numpy_iterator())
    assert len(notes) == 1 and "reads them from their files" in notes[0] and len(from_files) == len(on_disk)
    # Within the budget, everything stays in RAM: no file.
    monkeypatch.setattr(feature_cache, "usable_ram_bytes", lambda: 4 * (features + crops))
    list(build_dataset(config, utterances, training=True, fallback_cache_dir=tmp_path / "unused").as_numpy_iterator())
    assert not (tmp_path / "unused").exists()


def test_an_epoch_shuffle_keyed_by_a_tensor_ignores_the_global_seed():
    # A global seed of 0 made TensorFlow compare a tensor seed in Python (a crash at the first epoch
    # of a run with `seed: 0`); any global seed must give the order the key alone sets.
    def epoch(key):
        return shuffle_with_key(tf.data.Dataset.range(20), 20, key)

    def order(key):
        return [int(i) for i in tf.data.Dataset.from_tensors(tf.constant(key, tf.int64)).flat_map(epoch).as_numpy_iterator()]

    orders = {}
    try:
        for global_seed in (0, 7):
            tf.random.set_seed(global_seed)
            orders[global_seed] = [order(5), order(5), order(6)]
    finally:
        tf.random.set_seed(None)
    first = orders[0][0]
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert orders[0] == orders[7] and orders[0][1] == first != orders[0][2]


@pytest.mark.parametrize("cache", ["false", "true"])
def test_the_clips_the_length_filter_leaves_out_are_counted_with_their_reasons(demo_corpus, utterances, cache):
    # The "data: N training clips" line counted clips the length filter then left out without a
    # word: here 16 of 24 (the demo's clips run 1.2 to 11.7 s, the limits are 2 to 6 s).
    from conftest import tiny_config

    config = tiny_config(demo_corpus, "data.min_duration_s=2.0", f"data.cache_features={cache}")
    lines = []
    build_dataset(config, utterances, training=True, echo=lines.append)
    # What the filter keeps, seen from a pass over it (evaluation keeps every clip it lets through).
    kept = sum(len(b["mel_length"]) for b in build_dataset(config, utterances, training=False).as_numpy_iterator())
    left_out = len(utterances) - kept
    assert 2 <= left_out < len(utterances)
    # The one clip under 2 s (1.24 s); the rest are over 6 s.
    assert lines == [f"data: {left_out} of the 24 training clips are outside the limits and left out "
                     f"({left_out - 1} longer than data.max_duration_s (6.0 s), 1 shorter than data.min_duration_s "
                     f"(2.0 s, silence trimmed)); {kept} remain"]


def test_a_silent_clip_of_an_unprepared_corpus_is_left_out_and_counted(demo_corpus, utterances, tmp_path):
    # A digitally silent clip kept its transcript and trained: the silence trim keeps such a clip
    # whole (its own loudest frame is its reference), and nothing else looked at its level.
    import dataclasses

    import soundfile

    from conftest import tiny_config

    config = tiny_config(demo_corpus)
    kept_before = sum(len(b["mel_length"]) for b in build_dataset(config, utterances, training=False).as_numpy_iterator())
    fits = [u for u in utterances if 2.0 <= u.duration_s <= 5.0]  # inside every other limit
    silent = tmp_path / "silent.wav"
    soundfile.write(silent, np.zeros(int(fits[0].duration_s * 22050)), 22050, subtype="PCM_16")
    rows = [dataclasses.replace(fits[0], audio_path=str(silent)) if u is fits[0] else u for u in utterances]
    lines = []
    build_dataset(config, rows, training=True, echo=lines.append)
    kept = sum(len(b["mel_length"]) for b in build_dataset(config, rows, training=False).as_numpy_iterator())
    assert kept == kept_before - 1
    assert len(lines) == 1 and "1 silent (loudest sample below -60 dBFS)" in lines[0], lines


def _cache_prefix(config, rows, folder):
    """The file prefix `plan_cache` gives these training rows under `folder` (the name does not
    depend on the folder: learnt from a plan in another one)."""
    import dataclasses

    from myxtts.data.pipeline import Epochs

    probe = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=str(folder) + "_probe"))
    return str(folder / os.path.basename(Epochs(probe, rows, training=True).cache.path))


def test_a_cache_file_another_live_run_is_filling_is_refused_and_its_lock_kept(utterances, tmp_path):
    """The run folder's cache lock was removed unconditionally: two live runs lost tf.data's guard
    against filling one cache file."""
    import subprocess
    import sys

    rows = utterances[:8]
    shared = _config("data.bucketing=false", f"data.cache_dir={tmp_path / 'shared'}")
    prefix = _cache_prefix(shared, rows, tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    # A live training filling the shared file: it holds the claim and tf.data's lock.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"owner = open({prefix + '.owner'!r}, 'a+')\n"
        "fcntl.flock(owner, fcntl.LOCK_EX)\n"
        "owner.write(f'pid {os.getpid()} on testhost'); owner.flush()\n"
        f"open({prefix + '_0.lockfile'!r}, 'w').write('Created at: 0')\n"
        "print('holding', flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(ValueError, match=rf"{prefix}.*pid {holder.pid} on testhost.*data\.cache_dir"):
            build_dataset(shared, rows, training=True)
        assert os.path.exists(prefix + "_0.lockfile")  # the live run keeps its guard
    finally:
        holder.kill()
        holder.wait()
    # Its holder died mid-fill: now the lock is a dead run's, removed, and the cache fills.
    assert len(list(build_dataset(shared, rows, training=True).as_numpy_iterator())) == 2
    assert os.path.exists(prefix + ".index") and not os.path.exists(prefix + "_0.lockfile")


def test_a_cache_lock_a_killed_run_left_in_data_cache_dir_does_not_block_the_next(utterances, tmp_path):
    """A data.cache_dir lock left by a killed run was never removed: every later run failed."""
    rows = utterances[:8]
    shared = _config("data.bucketing=false", f"data.cache_dir={tmp_path / 'shared'}")
    prefix = _cache_prefix(shared, rows, tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    for leftover in ("_0.lockfile", "_0.data-00000-of-00001.tempstate123", ".owner"):  # as kill -9 leaves them
        with open(prefix + leftover, "w") as handle:
            handle.write("Created at: 0")
    assert len(list(build_dataset(shared, rows, training=True).as_numpy_iterator())) == 2
    assert os.path.exists(prefix + ".index") and not os.path.exists(prefix + "_0.lockfile")
    assert len(list(build_dataset(shared, rows, training=True).as_numpy_iterator())) == 2  # read back, complete


def test_a_cache_folder_that_cannot_be_written_is_one_line_naming_it(utterances, tmp_path):
    """`data.cache_dir` under a file (or on a read-only disk) was an OSError traceback from mkdir."""
    from myxtts.data.pipeline import Epochs

    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    folder = tmp_path / "notes.txt" / "cache"
    config = _config("data.bucketing=false", f"data.cache_dir={folder}")
    with pytest.raises(ValueError, match=r"cannot write the feature cache in .*notes\.txt/cache .*data\.cache_dir"):
        Epochs(config, utterances[:8], training=True)


@pytest.mark.parametrize("cache", [False, True])
def test_the_one_pass_over_a_large_corpus_counts_its_clips(demo_corpus, utterances, cache, tmp_path, monkeypatch, capsys):
    """The pass that fills the feature cache before the first step (~10 ms a clip on 2 cores) was one line and
    then minutes of silence for a corpus of tens of thousands of clips; it now counts them."""
    from conftest import tiny_config

    from myxtts.data import pipeline
    from myxtts.data.pipeline import build_vocabulary

    monkeypatch.setattr(pipeline, "LONG_LENGTH_PASS", len(utterances))  # the demo corpus as a large one
    config = tiny_config(demo_corpus, f"data.cache_features={str(cache).lower()}", f"data.cache_dir={tmp_path}")
    lines = []
    Epochs(config, utterances, training=True, vocabulary=build_vocabulary(utterances, config.data),
           echo=lines.append).clip_lengths()
    announced = "computing the features of 24 clips once" if cache else "reading the lengths of 24 clips once"
    assert any(line.startswith(announced) for line in lines), lines
    assert f"the clips' {'features' if cache else 'lengths'}: 24/24 clips" in capsys.readouterr().err
