"""Measures the native input pipeline against the usual librosa-in-`tf.numpy_function` one, side by side.

    python utilities/benchmark_pipeline.py --corpus /tmp/demo400
    python utilities/benchmark_pipeline.py --corpus /tmp/demo400 --json --limit 100 --epochs 1
    python utilities/benchmark_pipeline.py --corpus /tmp/demo400 --json-file result.json   # table and file

Three measurements on the same corpus, batch size and config:

* native, on the fly: `myxtts.data.pipeline.build_dataset` with `data.cache_features: false`;
* baseline, on the fly: the same rows, order, length filter, references, bucketing and padding, but the
  features come from `tf.numpy_function` calls into librosa (`librosa.load` + `melspectrogram`
  with the same STFT/mel settings and log floor, for the clip and for its 3 s reference clip) and
  the text is tokenised in Python with the same vocabulary, i.e. the same batches computed the
  usual way;
* native, cached: `data.cache_features: true` in memory; the epoch that fills the cache is not
  timed, the epochs that read it are.

Each measurement runs at one core and at every usable core, each in a fresh copy of this script
(`--worker`) that pins itself to those cores before TensorFlow starts and sizes TensorFlow's
thread pools to match (and `data.num_workers` to two calls in flight per core, as the hardware plan
does), so "1 core" really is one core. Every worker reads one endless stream (`Epochs.stream`), as
training does, counts an epoch's full batches once (untimed; it fills the cache), warms up on the
first epochs (librosa's numba compilation, the page cache, graph tracing), then times `--epochs`
epochs of the same stream; rates are the median over those epochs. Other work on the machine slows every column
alike, so the ratios between columns of one run are the numbers to compare, not the absolute ones;
next to each rate the report gives the cores the run actually kept busy and the utterances per CPU
second, which show how much of a low number was the machine being shared.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPOSITORY_ROOT / "configs" / "config.yaml"
MEASUREMENTS = ("native", "baseline", "cached")
# Marks the worker's stderr lines meant for the user, as opposed to TensorFlow's log lines.
PROGRESS_PREFIX = "progress: "
LABELS = {
    "native": "native, on the fly",
    "baseline": "baseline (librosa), on the fly",
    "cached": "native, cached",
}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Time the native tf.data pipeline (on the fly and cached) against the same batches built "
            "with librosa inside tf.numpy_function, at one core and at all usable cores."
        )
    )
    parser.add_argument("--corpus", type=Path, help="LJSpeech folder, metadata.csv or JSONL manifest")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--json-file", type=Path, default=None,
                        help="also write the JSON object to this file (the table still goes to stdout)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per measurement (default: %(default)s)")
    parser.add_argument("--warmup-epochs", type=int, default=1,
                        help="untimed epochs before timing; for the cached run this is the epoch that "
                             "fills the cache (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="clips per batch (default: %(default)s)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="feature and bucketing settings (default: configs/config.yaml)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N utterances (quick runs)")
    parser.add_argument("--cores", choices=("both", "all", "1"), default="both",
                        help="core counts to measure: 1 and all usable cores, or only one of them "
                             "(default: %(default)s)")
    parser.add_argument("--calls-per-core", type=int, default=2,
                        help="parallel calls in flight per core (data.num_workers = this x cores) for both on-the-fly "
                             "columns; the hardware plan uses 2 (default: %(default)s)")
    parser.add_argument("--baseline-skips-dropped", action="store_true",
                        help="give the baseline the native pipeline's skip of the clips each bucket drops at the "
                             "end of an epoch, which are then never read (by default the baseline is the usual "
                             "pipeline, which decodes them and computes their features)")
    # The parent re-invokes this script with a JSON job description; not for people.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker is None and arguments.corpus is None:
        parser.error("--corpus is required")
    for name in ("epochs", "batch_size"):
        if getattr(arguments, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(arguments, name)}")
    if arguments.warmup_epochs < 1:
        parser.error("--warmup-epochs must be at least 1: the first epoch pays for compilation and cold files")
    if arguments.limit is not None and arguments.limit < 1:
        parser.error(f"--limit must be at least 1, got {arguments.limit}")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    if arguments.worker is not None:
        return run_worker(json.loads(arguments.worker))
    # Lets `python utilities/benchmark_pipeline.py` import the package from a checkout without installing it.
    if str(REPOSITORY_ROOT) not in sys.path:
        sys.path.insert(0, str(REPOSITORY_ROOT))
    from myxtts.data.manifest import ManifestError, read_manifest
    from myxtts.output_paths import file_problem

    if arguments.json_file is not None and (problem := file_problem(arguments.json_file, "--json-file")):
        print(f"error: {problem}", file=sys.stderr)  # now, not after the measurements
        return 2

    corpus = arguments.corpus
    if not corpus.exists():
        print(
            f"error: --corpus {corpus} does not exist. Build the demo corpus (400 utterances, about a "
            f"minute) with:\n    python utilities/make_demo_corpus.py --out {corpus}",
            file=sys.stderr,
        )
        return 2
    if not arguments.config.is_file():
        print(f"error: --config {arguments.config} does not exist", file=sys.stderr)
        return 2
    try:
        utterances = read_manifest(corpus)[: arguments.limit]
    except (ManifestError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if len(utterances) < arguments.batch_size:
        print(f"error: {len(utterances)} utterances cannot fill one batch of {arguments.batch_size}; "
              "lower --batch-size or raise --limit", file=sys.stderr)
        return 2

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    core_counts = {"both": sorted({1, len(cpus)}), "all": [len(cpus)], "1": [1]}[arguments.cores]
    jobs = [
        {
            "measurement": measurement,
            "cpus": cpus[:cores],
            "corpus": str(corpus.resolve()),
            "config": str(arguments.config.resolve()),
            "limit": len(utterances),
            "batch_size": arguments.batch_size,
            "epochs": arguments.epochs,
            "warmup_epochs": arguments.warmup_epochs,
            "calls_per_core": arguments.calls_per_core,
            "baseline_skips_dropped": arguments.baseline_skips_dropped,
        }
        for cores in core_counts
        for measurement in MEASUREMENTS
    ]

    load_before = os.getloadavg()
    started = time.monotonic()
    results = []
    for number, job in enumerate(jobs, 1):
        elapsed = time.monotonic() - started
        # A rough ETA: the jobs so far, averaged; baseline jobs are slower than native ones, so it wobbles.
        eta = f", about {_minutes(elapsed / (number - 1) * (len(jobs) - number + 1))} left" if number > 1 else ""
        print(f"[{number}/{len(jobs)}] {LABELS[job['measurement']]} on {_cores(len(job['cpus']))}"
              f" ({_minutes(elapsed)} elapsed{eta})", file=sys.stderr, flush=True)
        try:
            results.append(_run_job(job))
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1

    report = build_report(results, arguments, utterances, load_before, time.monotonic() - started)
    print(json.dumps(report, indent=2) if arguments.json else format_table(report))
    if arguments.json_file is not None:
        arguments.json_file.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def _run_job(job: dict) -> dict:
    """Run one measurement in a fresh interpreter; its last stdout line is the result as JSON."""
    env = dict(os.environ)
    # The parallelism is tf.data's (`num_parallel_calls` = cores). A BLAS pool of its own in each
    # librosa call (its mel matmul) would oversubscribe the cores: at 2 cores that made the baseline
    # 2.5x slower, which would flatter the native side. One BLAS thread per call is the baseline's
    # best setting; TensorFlow's own ops do not use these libraries.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
    # The worker's own progress lines are passed on as they come; TensorFlow's start-up chatter is
    # held back and shown only if the worker fails, where it may explain why.
    other_lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=REPOSITORY_ROOT) as worker:
        for line in worker.stderr:
            if line.startswith(PROGRESS_PREFIX):
                print(line[len(PROGRESS_PREFIX):], end="", file=sys.stderr, flush=True)
            else:
                other_lines.append(line)
        stdout = worker.stdout.read()
    results = [line for line in stdout.splitlines() if line.startswith("{")]
    if worker.returncode != 0 or not results:
        sys.stderr.writelines(other_lines[-40:])
        raise RuntimeError(f"the {LABELS[job['measurement']]} run on {_cores(len(job['cpus']))} failed "
                           f"(exit code {worker.returncode}); its last messages are above")
    return json.loads(results[-1])


# --------------------------------------------------------------------------------------------------
# Worker: one measurement on a fixed set of cores.


def run_worker(job: dict) -> int:
    # Pinning must come before TensorFlow (and numpy) start their thread pools, which size
    # themselves from the cores visible at that moment.
    if hasattr(os, "sched_setaffinity"):  # Linux; elsewhere the core counts are nominal
        os.sched_setaffinity(0, job["cpus"])
    cores = len(job["cpus"])
    if str(REPOSITORY_ROOT) not in sys.path:
        sys.path.insert(0, str(REPOSITORY_ROOT))
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)

    from myxtts.config import load_config
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import Epochs, build_vocabulary

    measurement = job["measurement"]
    config = load_config(job["config"], overrides=[
        f"data.cache_features={'true' if measurement == 'cached' else 'false'}",
        "data.cache_dir=",  # in memory: the cached number should not depend on a disk
        f"data.num_workers={job['calls_per_core'] * cores}",  # 2 per core by default, as the hardware plan sets it
        f"data.batch_size={job['batch_size']}",
    ])
    utterances = read_manifest(job["corpus"])[: job["limit"]]
    vocabulary = build_vocabulary(utterances, config.data)
    if measurement == "baseline":
        epochs = baseline_epochs(config, utterances, vocabulary, skips_dropped=job["baseline_skips_dropped"])
    else:
        epochs = Epochs(config, utterances, training=True, vocabulary=vocabulary)
    # One iterator over the endless stream, as training reads it (Keras keeps one iterator when
    # steps_per_epoch is set). A new iterator per epoch would add, every epoch, the instantiation of
    # the pipeline's functions (about 0.9 s of CPU for the native one, its resampling branches
    # included), a cost training pays once per run.
    per_epoch = epochs.batches_per_epoch()  # untimed; with a cache, this pass fills it
    stream = iter(epochs.stream())

    label = f"{PROGRESS_PREFIX}  {LABELS[measurement]}, {_cores(cores)}:"
    warmup = [time_epoch(stream, per_epoch, config.data) for _ in range(job["warmup_epochs"])]
    warmup_times = ", ".join(f"{epoch['seconds']:.1f} s" for epoch in warmup)
    print(f"{label} warm-up {warmup_times}", file=sys.stderr, flush=True)
    timed = []
    for index in range(job["epochs"]):
        timed.append(time_epoch(stream, per_epoch, config.data))
        print(f"{label} epoch {index + 1}/{job['epochs']} {timed[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    if timed[0]["utterances"] == 0:
        print(f"{PROGRESS_PREFIX}error: no full batch of {job['batch_size']} in any length bucket; "
              "lower --batch-size or raise --limit", file=sys.stderr)
        return 1

    print(json.dumps({"measurement": measurement, "cores": cores, "cpus": job["cpus"],
                      "warmup_seconds": [e["seconds"] for e in warmup], **summarize(timed)}))
    return 0


def time_epoch(stream, batches_per_epoch: int, data_config) -> dict:
    """The next epoch of the stream (every epoch yields the same number of full batches): wall and
    CPU time, and what came out of it."""
    wall, cpu = time.perf_counter(), time.process_time()
    utterances = frames = batches = 0
    for _ in range(batches_per_epoch):
        lengths = next(stream)["mel_length"].numpy()
        utterances += lengths.size
        frames += int(lengths.sum())
        batches += 1
    # A clip of n samples has 1 + n // hop frames, so n lies in [(frames - 1) * hop, frames * hop):
    # take the middle of that interval for each clip.
    audio_seconds = (frames - utterances / 2) * data_config.hop_length / data_config.sample_rate
    return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
            "utterances": utterances, "audio_seconds": audio_seconds, "batches": batches}


def summarize(epochs: list[dict]) -> dict:
    """Median rates over the timed epochs, plus every raw number they came from."""
    return {
        "utt_per_s": statistics.median(e["utterances"] / e["seconds"] for e in epochs),
        "audio_s_per_s": statistics.median(e["audio_seconds"] / e["seconds"] for e in epochs),
        "median_epoch_seconds": statistics.median(e["seconds"] for e in epochs),
        # CPU seconds per wall second: how many cores the measurement actually kept busy. On a
        # shared machine the wall-clock rates sink when others take the cores; the work per CPU
        # second below sinks much less, so it is the steadier number for comparing the two sides.
        "cores_busy": statistics.median(e["cpu_seconds"] / e["seconds"] for e in epochs),
        "utt_per_cpu_s": statistics.median(e["utterances"] / e["cpu_seconds"] for e in epochs),
        # Fixed for a corpus and batch size: each bucket drops the same number of clips per epoch.
        "utterances_per_epoch": epochs[0]["utterances"],
        "batches_per_epoch": epochs[0]["batches"],
        # Varies a little: which clips fill a bucket's dropped remainder depends on the shuffle.
        "epoch_audio_seconds": [e["audio_seconds"] for e in epochs],
        "epoch_seconds": [e["seconds"] for e in epochs],
        "epoch_cpu_seconds": [e["cpu_seconds"] for e in epochs],
    }


# --------------------------------------------------------------------------------------------------
# The baseline: the same batches, with features computed by librosa through tf.numpy_function.


def baseline_epochs(config, utterances, vocabulary, skips_dropped: bool = False):
    """The usual way: Python (librosa) per clip inside `tf.numpy_function`, TensorFlow around it.

    Everything that is not feature computation (row order, shuffling, the length filter, the
    reference draw, bucketing, padding, threading options, prefetch) is the native pipeline's own
    code (`pipeline.Epochs`), so the two sides differ only in how a clip becomes features and tokens.
    Meant for `data.cache_features: false`, the on-the-fly measurement.

    The one exception, unless `skips_dropped`: the native pipeline works out from the epoch's order
    and every clip's lengths which clips its full batches will hold, and reads only those
    (`Epochs._in_full_batches`), while the usual pipeline decodes every clip, computes its features
    and lets the batching drop each bucket's remainder. `skips_dropped` gives the baseline that stage
    too, to show what the stage alone is worth.
    """
    try:
        import librosa
    except ImportError:
        raise ImportError("the baseline needs librosa: pip install -r requirements-dev.txt") from None
    import numpy as np
    import tensorflow as tf

    from myxtts.data import clip_features, pipeline
    from myxtts.data.phonemes import phonemize_utterances
    from myxtts.data.text import TEXT_REPLACEMENTS

    c = config.data
    if c.text_frontend == "phonemes":  # in Python before the graph, as the native pipeline does
        utterances = phonemize_utterances(utterances, c.language)
    parallel_calls = c.num_workers or tf.data.AUTOTUNE
    replacements = [(re.compile(pattern), replacement) for pattern, replacement in TEXT_REPLACEMENTS]
    mel_options = dict(
        sr=c.sample_rate, n_fft=c.n_fft, hop_length=c.hop_length, win_length=c.win_length, window="hann",
        center=True, pad_mode="constant", power=c.power, n_mels=c.n_mels, fmin=c.fmin, fmax=c.mel_fmax,
        htk=c.mel_scale == "htk", norm="slaney",
    )

    def load(path: bytes) -> np.ndarray:
        samples, _ = librosa.load(path.decode("utf-8"), sr=c.sample_rate)  # resamples only if the rate differs
        if c.trim_silence_db > 0:
            samples, _ = librosa.effects.trim(samples, top_db=c.trim_silence_db)
        return normalize(samples)

    def normalize(samples: np.ndarray) -> np.ndarray:
        if c.peak_normalize > 0:
            samples = samples * np.float32(c.peak_normalize / max(float(np.abs(samples).max(initial=0.0)), 1e-6))
        return samples.astype(np.float32)

    def log_mel(samples: np.ndarray) -> np.ndarray:
        mel = librosa.feature.melspectrogram(y=samples, **mel_options)  # [n_mels, frames]
        return np.log(np.maximum(mel, c.log_floor)).T.astype(np.float32)  # [frames, n_mels]

    def decode(path: bytes, text: bytes):
        model_text = text.decode("utf-8")
        if c.text_frontend == "characters":
            # Same normalisation as myxtts.data.text.normalize_text, in Python.
            model_text = model_text.lower()
            for pattern, replacement in replacements:
                model_text = pattern.sub(replacement, model_text)
            model_text = model_text.strip()
        return load(path), np.asarray(vocabulary.encode(model_text, c.text_frontend), np.int32)

    def reference_features(reference_path: bytes):
        # As a librosa user would: load the whole file, keep the middle, normalise that (the
        # pipeline normalises the reference crop itself too, and decodes only those bytes).
        reference, _ = librosa.load(reference_path.decode("utf-8"), sr=c.sample_rate)
        length = min(len(reference), c.reference_samples)
        start = (len(reference) - length) // 2  # the middle, away from leading and trailing silence
        reference_mel = log_mel(normalize(reference[start : start + length]))
        frames = reference_mel.shape[0]
        padded = np.full((c.reference_frames, c.n_mels), math.log(c.log_floor), np.float32)
        padded[:frames] = reference_mel
        return padded, np.int32(frames)

    def decode_row(row):
        samples, tokens = tf.numpy_function(decode, [row["audio_path"], row["text"]], [tf.float32, tf.int32])
        return {"samples": tf.ensure_shape(samples, [None]), "tokens": tf.ensure_shape(tokens, [None]), "clip": row["clip"]}

    def feature_row(example):
        mel = tf.ensure_shape(tf.numpy_function(log_mel, [example["samples"]], tf.float32), [None, c.n_mels])
        return {"mel": mel, "mel_length": tf.shape(mel)[0], "tokens": example["tokens"],
                "text_length": tf.shape(example["tokens"])[0], "clip": example["clip"]}

    class LibrosaEpochs(pipeline.Epochs):
        """The native pipeline's order, length filter, reference draw, bucketing, padding, options
        and prefetch, around librosa features."""

        def _decoded(self, rows):
            ds = rows.map(decode_row, num_parallel_calls=parallel_calls, deterministic=self.ordered)
            return ds.filter(lambda example: clip_features.within_limits(example, c))

        def _clip_features(self, example):
            return feature_row(example)

        if not skips_dropped:
            def _in_full_batches(self, order):
                return order  # the usual way: every clip decoded and featurised, those of the dropped remainders too

        def _with_reference(self, example, key):
            path = self.references.reference_path(example["clip"], key)
            reference_mel, reference_length = tf.numpy_function(reference_features, [path], [tf.float32, tf.int32])
            features = {k: v for k, v in example.items() if k != "clip"}
            return {**features, "reference_mel": tf.ensure_shape(reference_mel, [c.reference_frames, c.n_mels]),
                    "reference_length": tf.ensure_shape(reference_length, [])}

    return LibrosaEpochs(config, utterances, training=True, vocabulary=vocabulary)


# --------------------------------------------------------------------------------------------------
# Report


def build_report(results: list[dict], arguments, utterances, load_before, total_seconds: float) -> dict:
    by_cores: dict[str, dict] = {}
    for result in results:
        by_cores.setdefault(str(result["cores"]), {})[result["measurement"]] = result
    for column in by_cores.values():
        base = column["baseline"]
        column["speedup_vs_baseline"] = column["native"]["utt_per_s"] / base["utt_per_s"]
        column["cached_speedup_vs_baseline"] = column["cached"]["utt_per_s"] / base["utt_per_s"]
        # The same ratio per CPU second: what the work costs, whatever else ran on the machine.
        column["cpu_efficiency_vs_baseline"] = column["native"]["utt_per_cpu_s"] / base["utt_per_cpu_s"]
    widest = by_cores[str(max(int(k) for k in by_cores))]
    # Both sides must keep the same clips (same filter, same buckets, so the same number in full
    # batches): a difference means they did not do the same work, and the ratios would mislead.
    delivered = {r["utterances_per_epoch"] for r in results}
    report = {
        "native_utt_per_s": widest["native"]["utt_per_s"],
        "baseline_utt_per_s": widest["baseline"]["utt_per_s"],
        "cached_utt_per_s": widest["cached"]["utt_per_s"],
        "native_audio_s_per_s": widest["native"]["audio_s_per_s"],
        "baseline_audio_s_per_s": widest["baseline"]["audio_s_per_s"],
        "cached_audio_s_per_s": widest["cached"]["audio_s_per_s"],
        "speedup_vs_baseline": widest["speedup_vs_baseline"],
        "cached_speedup_vs_baseline": widest["cached_speedup_vs_baseline"],
        "cpu_efficiency_vs_baseline": widest["cpu_efficiency_vs_baseline"],
        "cores": max(int(k) for k in by_cores),
        "same_clips_on_every_side": len(delivered) == 1,
        "baseline_skips_dropped": arguments.baseline_skips_dropped,
        "statistic": f"median over {arguments.epochs} timed epochs after {arguments.warmup_epochs} warm-up epoch(s)",
        "by_cores": by_cores,
        "corpus": str(arguments.corpus.resolve()),
        "utterances": len(utterances),
        "batch_size": arguments.batch_size,
        "config": str(arguments.config.resolve()),
        "machine": describe_machine(load_before),
        "total_seconds": total_seconds,
    }
    if len(delivered) != 1:
        print(f"warning: the measurements delivered different numbers of clips per epoch ({sorted(delivered)}); "
              "the ratios compare unequal work", file=sys.stderr)
    return report


def describe_machine(load_before) -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass  # not Linux: platform's answer stands
    versions = {}
    for package in ("tensorflow", "keras", "librosa", "numpy", "numba"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu_model": model,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        # Other work on the machine during the run shows up here; it slows all columns alike.
        "load_average_1min_before": load_before[0],
        "load_average_1min_after": os.getloadavg()[0],
    }


def format_table(report: dict) -> str:
    machine, by_cores = report["machine"], report["by_cores"]
    columns = sorted(by_cores, key=int)
    first = by_cores[columns[0]]["native"]
    lines = [
        f"Input pipeline: {report['corpus']} ({report['utterances']} utterances; {first['utterances_per_epoch']} "
        f"clips, {statistics.mean(first['epoch_audio_seconds']):,.0f} s of audio in full batches of "
        f"{report['batch_size']} per epoch); {report['statistic']}",
        f"Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores; tensorflow "
        f"{machine['tensorflow']}, librosa {machine['librosa']}, numpy {machine['numpy']}; load average "
        f"{machine['load_average_1min_before']:.1f} before, {machine['load_average_1min_after']:.1f} after",
        "",
    ]
    name_width = max(len(label) for label in LABELS.values())
    cell = " | {:>7} {:>9} {:>7} {:>5} {:>9}"
    header = " " * name_width + "".join(f" | {_cores(int(k)):^41}" for k in columns)
    sub = " " * name_width + cell.format("utt/s", "audio-s/s", "vs base", "cores", "utt/cpu-s") * len(columns)
    lines += [header, sub, "-" * len(sub)]
    for measurement in MEASUREMENTS:
        row = f"{LABELS[measurement]:<{name_width}}"
        for k in columns:
            result, base = by_cores[k][measurement], by_cores[k]["baseline"]
            row += cell.format(f"{result['utt_per_s']:.1f}", f"{result['audio_s_per_s']:,.0f}",
                               f"{result['utt_per_s'] / base['utt_per_s']:.2f}x", f"{result['cores_busy']:.2f}",
                               f"{result['utt_per_cpu_s']:.1f}")
        lines.append(row)
    lines += [
        "",
        "vs base: utterances per second over the baseline's at the same core count. cores: CPU seconds per wall",
        "second, how many cores the run kept busy (below the core count when other work shared the machine).",
        "utt/cpu-s: utterances per CPU second, the cost of the work itself, steadier on a shared machine.",
    ]
    if len(columns) > 1:
        scaling = ", ".join(
            f"{LABELS[m]} {by_cores[columns[-1]][m]['utt_per_s'] / by_cores[columns[0]][m]['utt_per_s']:.2f}x"
            for m in MEASUREMENTS
        )
        lines.append(f"Scaling from {_cores(int(columns[0]))} to {_cores(int(columns[-1]))}: {scaling}")
    lines.append("Baseline: " + ("with the native pipeline's skipping of the clips each bucket drops (--baseline-skips-dropped)."
                                 if report["baseline_skips_dropped"] else
                                 "the usual pipeline, which computes the features of the clips each bucket drops too."))
    if not report["same_clips_on_every_side"]:
        lines.append("WARNING: the measurements delivered different clips; see the JSON output (--json).")
    lines.append(f"Total benchmark time {_minutes(report['total_seconds'])}.")
    return "\n".join(lines)


def _cores(count: int) -> str:
    return f"{count} core{'s' if count != 1 else ''}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


if __name__ == "__main__":
    sys.exit(main())
