"""The parent side of "probe, don't guess": one child process per batch size, the cache, the choice.

    probe_batch_size(config, plan, facts, child_module=...)  in the training process, before TensorFlow
      -> cache hit? use it                           (ProbeCache, keyed by GPU, model, precision, lengths)
      -> run_probe(measure, candidates, free memory)  myxtts.hardware.probe: fit, choose
           measure(batch) = python -m <child_module> --config run.yaml --batch-size N --vocab-size V ...
                            -> one JSON line {"batch_size", "peak_bytes", "samples_per_s"} or {"oom": true}
      -> with_measured_batch(plan, chosen)

Each try runs in its own process because an out-of-memory error can leave TensorFlow's GPU allocator
fragmented or the CUDA context unusable; a fresh process per batch size also measures each peak from
a clean allocator. The child, which builds the real network and runs its train steps, belongs to
training (`myxtts.training.batch_probe`): the trainer names it in `child_module`, so this module,
like all of `myxtts.hardware`, imports nothing from training or the models. The protocol between
them is the command line above and the one JSON line the child prints.

Nothing is probed on the CPU, for a batch fixed in the config, or on several hosts (TF_CONFIG), where
hosts measuring on their own could settle on different batches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import Plan, with_measured_batch
from myxtts.hardware.probe import (ProbeCache, ProbeKey, ProbeOutOfMemory, ProbeResult, candidate_batch_sizes,
                                   is_out_of_memory, run_probe)

# A generous character vocabulary: the text head's logits grow with it, so the measured peak is an
# upper bound for any real corpus (they have 40-100 symbols). Passed to the child as --vocab-size.
PROBE_VOCAB_SIZE = 256
CHILD_TIMEOUT_S = 900  # compiling the base model with XLA takes minutes on a slow host


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


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a probe's child process: `environ` (default os.environ) outside any cluster,
    with this package first on PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    env.pop("TF_CONFIG", None)  # a probe is one process, never part of a cluster
    # The child imports this package from wherever the parent found it, whatever the working directory.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def subprocess_measure(config_path: Path, plan: Plan, facts: MachineFacts, *, child_module: str,
                       accumulation_for: Callable[[int], int], environ: Mapping[str, str] | None = None,
                       timeout_s: float = CHILD_TIMEOUT_S) -> Callable[[int], tuple[int, float]]:
    """`measure(batch)` for run_probe: one `python -m child_module` per call, on the GPU with the least
    free memory."""
    gpu = _smallest_gpu(plan, facts)
    env = child_environment(environ)
    if gpu.uuid or gpu.nvml_index is not None:
        # Only the measured card: the child's GPU:0 is the smallest of the chosen ones.
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid or str(gpu.nvml_index)

    def measure_in_child(batch_size: int) -> tuple[int, float]:
        command = [sys.executable, "-m", child_module, "--config", str(config_path),
                   "--batch-size", str(batch_size), "--precision", plan.precision,
                   "--accumulation", str(accumulation_for(batch_size)), "--vocab-size", str(PROBE_VOCAB_SIZE)]
        command += ["--xla"] if plan.xla else []
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


def probe_batch_size(config: Config, plan: Plan, facts: MachineFacts, *, child_module: str,
                     cache: ProbeCache | None = None, environ: Mapping[str, str] | None = None,
                     echo: Callable[[str], None] = print) -> Plan:
    """The plan with a measured per-replica batch when `plan.probe_batch_size`, else `plan` unchanged.

    `child_module` is run as `python -m child_module` for each batch size (see the module docstring).

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
    batches = plan.batch_plan
    candidates = candidate_batch_sizes(plan.batch_size, max(plan.batch_size, batches.largest_useful_batch))

    def accumulation_for(batch: int) -> int:  # the child builds the optimizer's accumulators as training will
        return batches.with_batch(batch).accumulation

    echo(f"probe: measuring batch sizes {candidates} on one GPU (once per setup)")
    with tempfile.TemporaryDirectory(prefix="myxtts-probe-") as folder:
        config_path = Path(folder) / "config.yaml"
        config_lib.save_config(config, config_path)
        measure = subprocess_measure(config_path, plan, facts, child_module=child_module,
                                     accumulation_for=accumulation_for, environ=environ)
        result: ProbeResult = run_probe(measure, candidates, free)
    path = cache.store(key, result)
    echo(f"probe: {result.reason}; saved to {path}")
    return with_measured_batch(plan, result.chosen_batch, result.reason)
