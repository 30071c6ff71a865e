"""The measuring side of "probe, don't guess": real train steps at a batch size, in a child process.

    probe_batch_size(config, plan, facts)            in the training process, before TensorFlow
      -> cache hit? use it                           (ProbeCache, keyed by GPU, model, precision, lengths)
      -> run_probe(measure, candidates, free memory)  myxtts.hardware.probe: fit, choose
           measure(batch) = python -m myxtts.hardware.probe_runner --config run.yaml --batch-size N
                            -> one JSON line {"batch_size", "peak_bytes", "samples_per_s"} or {"oom": true}
      -> with_measured_batch(plan, chosen)

Each try runs in its own process because an out-of-memory error can leave TensorFlow's GPU allocator
fragmented or the CUDA context unusable; a fresh process per batch size also measures each peak from
a clean allocator. The child builds the real network and optimizer at the longest bucket (the batch
shape that needs the most memory) and runs full train steps, optimizer update included, through
`Model.fit` as training does: the first step compiles, the peak covers every step, the throughput
only the steps after the first.

Nothing is probed on the CPU, for a batch fixed in the config, or on several hosts (TF_CONFIG), where
hosts measuring on their own could settle on different batches.

`MYXTTS_PROBE_FAKE` (JSON: intercept_bytes, bytes_per_sample, oom_above, step_overhead_s,
seconds_per_sample) makes the child report a synthetic machine without importing TensorFlow, so the
whole path (process, JSON, fit, choice, cache) is tested on machines without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import Plan, with_measured_batch
from myxtts.hardware.probe import (ProbeCache, ProbeKey, ProbeOutOfMemory, ProbeResult, candidate_batch_sizes,
                                   is_out_of_memory, run_probe)

FAKE_ENV = "MYXTTS_PROBE_FAKE"
# A generous character vocabulary: the text head's logits grow with it, so the measured peak is an
# upper bound for any real corpus (they have 40-100 symbols).
PROBE_VOCAB_SIZE = 256
MEASURED_STEPS = 3  # after one compiling step; enough for a stable mean, short enough to probe 6 sizes
CHILD_TIMEOUT_S = 900  # compiling the base model with XLA takes minutes on a slow host


# --------------------------------------------------------------------------------------------------
# The child: one batch size, real steps


def synthetic_batch(config: Config, batch_size: int, vocab_size: int = PROBE_VOCAB_SIZE) -> dict:
    """A batch of the longest bucket, every clip at full length, shaped as the pipeline's batches."""
    import tensorflow as tf

    d = config.data
    frames, tokens = d.bucket_mel_lengths[-1], d.bucket_text_lengths[-1]
    generator = tf.random.Generator.from_seed(config.seed)
    batch = {
        "mel_length": tf.fill([batch_size], frames),
        "tokens": generator.uniform([batch_size, tokens], 4, vocab_size, dtype=tf.int32),  # past the special ids
        "text_length": tf.fill([batch_size], tokens),
        "reference_mel": generator.normal([batch_size, d.reference_frames, d.n_mels], mean=-5.0),
        "reference_length": tf.fill([batch_size], d.reference_frames),
    }
    if d.mel_on_device:
        # Waveforms padded to (frames - 1) * hop samples, as the pipeline pads a bucket (see mel_from_audio).
        batch["audio"] = 0.1 * generator.normal([batch_size, (frames - 1) * d.hop_length])
    else:
        batch["mel"] = generator.normal([batch_size, frames, d.n_mels], mean=-5.0)  # [batch, frames, n_mels]
    return batch


def measure(config: Config, batch_size: int, *, precision: str = "float32", xla: bool = False,
            accumulation: int = 1, device: str = "GPU:0", steps: int = MEASURED_STEPS) -> tuple[int, float]:
    """(peak bytes on `device`, samples/s) of full train steps at `batch_size` and the longest bucket.

    Raises TensorFlow's ResourceExhaustedError (or whatever TensorFlow raises) when it does not fit;
    the CLI below turns an out-of-memory into {"oom": true}.
    """
    import keras
    import tensorflow as tf

    from myxtts.models.xtts import network_for
    from myxtts.training.optimizers import build_optimizer
    from myxtts.training.step import TrainingModel

    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(config.seed)
    batch = synthetic_batch(config, batch_size)
    model = TrainingModel(network_for(config, PROBE_VOCAB_SIZE), data_config=config.data)
    optimizer = build_optimizer(config.training, accumulation)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, jit_compile=xla)
    # Variables first, as the trainer does: the step applies gradients under tf.cond, where none can be made.
    model(batch, training=False)
    optimizer.build(model.network.trainable_variables)
    data = tf.data.Dataset.from_tensors(batch).repeat()

    tf.config.experimental.reset_memory_stats(device)
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # builds, traces and compiles
    started = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    elapsed = time.perf_counter() - started
    peak = int(tf.config.experimental.get_memory_info(device)["peak"])
    return peak, steps * batch_size / elapsed


def fake_measure(spec: Mapping[str, float], batch_size: int) -> tuple[int, float]:
    """A synthetic machine: peak = intercept + per-sample bytes x batch, OOM above `oom_above`, and a
    step time of overhead + per-sample time x batch (so throughput saturates, as on a GPU)."""
    if batch_size > spec["oom_above"]:
        raise ProbeOutOfMemory(f"fake: batch {batch_size} > {spec['oom_above']}")
    peak = int(spec["intercept_bytes"] + spec["bytes_per_sample"] * batch_size)
    step_s = spec["step_overhead_s"] + spec["seconds_per_sample"] * batch_size
    return peak, batch_size / step_s


def run_one(args: argparse.Namespace) -> dict:
    """The child's whole job; OOM is an answer, any other error is not (it propagates)."""
    fake = os.environ.get(FAKE_ENV)
    try:
        if fake:
            peak, throughput = fake_measure(json.loads(fake), args.batch_size)
        else:
            config = config_lib.load_config(args.config, overrides=args.set)
            peak, throughput = measure(config, args.batch_size, precision=args.precision, xla=args.xla,
                                       accumulation=args.accumulation, device=args.device)
    except Exception as error:  # noqa: BLE001 - only out-of-memory becomes a result; the rest re-raises
        if not is_out_of_memory(error):
            raise
        return {"batch_size": args.batch_size, "oom": True, "error": str(error).splitlines()[0][:300]}
    return {"batch_size": args.batch_size, "oom": False, "peak_bytes": peak, "samples_per_s": throughput}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure peak memory and samples/s of train steps at one batch size "
                                                 "(run by probe_batch_size; prints one JSON line).")
    parser.add_argument("--config", help="resolved run config (YAML)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--precision", default="float32", help="Keras dtype policy, e.g. mixed_bfloat16")
    parser.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps (adds accumulators)")
    parser.add_argument("--xla", action="store_true", help="compile the step with XLA, as training will")
    parser.add_argument("--device", default="GPU:0", help="device whose memory is measured")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.batch_size < 1:
        print(f"error: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        return 2
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # the parent shows stderr only when the child fails
    print(json.dumps(run_one(args)), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# The parent: cache, candidates, one child per try


def probe_key(config: Config, plan: Plan, facts: MachineFacts) -> ProbeKey:
    """What a measurement depends on: the GPU model and memory, the model and step settings, the lengths."""
    gpu = _smallest_gpu(plan, facts)
    d, t = config.data, config.training
    model = {
        **dataclasses.asdict(config.model),
        "n_mels": d.n_mels,
        "reference_frames": d.reference_frames,
        "mel_on_device": bool(d.mel_on_device),
        "optimizer": t.optimizer,
        "gradient_checkpointing": t.gradient_checkpointing,
        "xla": plan.xla,
        "vocab": PROBE_VOCAB_SIZE,
    }
    lengths = {"mel_frames": d.bucket_mel_lengths[-1], "text_tokens": d.bucket_text_lengths[-1]}
    return ProbeKey.create(gpu.name, gpu.total_memory_bytes, model, plan.precision, lengths)


def _smallest_gpu(plan: Plan, facts: MachineFacts):
    chosen = [g for g in facts.gpus if g.index in plan.gpu_indices] or list(facts.gpus)
    if not chosen:
        raise ValueError("probe_batch_size needs the plan's GPUs in the machine facts")
    return min(chosen, key=lambda g: g.free_memory_bytes or g.total_memory_bytes)


def subprocess_measure(config_path: Path, plan: Plan, facts: MachineFacts, *, accumulation_for: Callable[[int], int],
                       environ: Mapping[str, str] | None = None,
                       timeout_s: float = CHILD_TIMEOUT_S) -> Callable[[int], tuple[int, float]]:
    """`measure(batch)` for run_probe: one child process per call, on the GPU with the least free memory."""
    gpu = _smallest_gpu(plan, facts)
    env = dict(os.environ if environ is None else environ)
    if gpu.uuid or gpu.nvml_index is not None:
        # Only the measured card: the child's GPU:0 is the smallest of the chosen ones.
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid or str(gpu.nvml_index)
    env.pop("TF_CONFIG", None)  # a probe is one process, never part of a cluster
    # The child imports this package from wherever the parent found it, whatever the working directory.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)

    def measure_in_child(batch_size: int) -> tuple[int, float]:
        command = [sys.executable, "-m", "myxtts.hardware.probe_runner", "--config", str(config_path),
                   "--batch-size", str(batch_size), "--precision", plan.precision,
                   "--accumulation", str(accumulation_for(batch_size))] + (["--xla"] if plan.xla else [])
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"probe at batch {batch_size} took more than {timeout_s:.0f} s; set data.batch_size "
                               "to skip probing") from None
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            # A child killed by the driver (not a Python exception) says so in its last lines.
            if is_out_of_memory(RuntimeError("\n".join(done.stderr.strip().splitlines()[-5:]))):
                raise ProbeOutOfMemory(f"batch {batch_size}: the probe process died out of memory")
            raise RuntimeError(f"probe at batch {batch_size} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        result = json.loads(lines[-1])
        if result["oom"]:
            raise ProbeOutOfMemory(result.get("error", f"batch {batch_size} out of memory"))
        return int(result["peak_bytes"]), float(result["samples_per_s"])

    return measure_in_child


def probe_batch_size(config: Config, plan: Plan, facts: MachineFacts, *, cache: ProbeCache | None = None,
                     environ: Mapping[str, str] | None = None, echo: Callable[[str], None] = print) -> Plan:
    """The plan with a measured per-replica batch when `plan.probe_batch_size`, else `plan` unchanged.

    Call it before this process initializes TensorFlow on the GPU (the children need the memory).
    Results are cached, so only the first run on a setup pays for the measurements.
    """
    if not plan.probe_batch_size:
        return plan  # CPU, or a batch fixed in the config: nothing to measure
    if (os.environ if environ is None else environ).get("TF_CONFIG"):
        # Hosts probing on their own could settle on different batches (timing noise, other caches),
        # and replicas must all take the same batch. Keep the prior, and say how to do better.
        echo(f"probe: skipped on several hosts; keeping batch {plan.batch_size}. Measure once on one host with "
             "these GPUs (train there without TF_CONFIG) and set data.batch_size to its choice on every host")
        return plan
    cache = cache or ProbeCache()
    key = probe_key(config, plan, facts)
    cached = cache.load(key)
    if cached is not None:
        echo(f"probe: {cached.reason} (cached in {cache.path_for(key)})")
        return with_measured_batch(plan, cached.chosen_batch, cached.reason + ", cached")
    free = _smallest_gpu(plan, facts).free_memory_bytes or _smallest_gpu(plan, facts).total_memory_bytes
    per_replica_cap = max(plan.batch_size, math.ceil(plan.target_effective_batch_size / plan.num_replicas))
    candidates = candidate_batch_sizes(plan.batch_size, per_replica_cap)

    def accumulation_for(batch: int) -> int:
        if plan.sources.get("gradient_accumulation_steps") == "config":
            return plan.gradient_accumulation_steps
        return math.ceil(plan.target_effective_batch_size / (batch * plan.num_replicas))

    echo(f"probe: measuring batch sizes {candidates} on one GPU (once per setup)")
    with tempfile.TemporaryDirectory(prefix="myxtts-probe-") as folder:
        config_path = Path(folder) / "config.yaml"
        config_lib.save_config(config, config_path)
        measure = subprocess_measure(config_path, plan, facts, accumulation_for=accumulation_for, environ=environ)
        result: ProbeResult = run_probe(measure, candidates, free)
    path = cache.store(key, result)
    echo(f"probe: {result.reason}; saved to {path}")
    return with_measured_batch(plan, result.chosen_batch, result.reason)


if __name__ == "__main__":
    sys.exit(main())
