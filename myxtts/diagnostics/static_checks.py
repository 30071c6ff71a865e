"""What can be learnt before anything runs: the pipeline's graph, the settings, the cores, the disk.

* Python in the pipeline: `graph_scan.find_python_ops` finds PyFunc / EagerPyFunc / generator ops;
  here each is traced back to the transformation that holds it (`Dataset.map(slow_fn)` on node
  `ParallelMapDatasetV2/_5`), so the report can say which line of code to replace.
* Settings that decide speed: graph mode, XLA, precision, prefetch, caching, bucketing, batch,
  workers, plus which of them the dataset graph actually shows (a cache op, a prefetch to device).
* CPU cores the process may use against `data.num_workers`.
* Read throughput of the audio files: their bytes read once, for a few seconds at most.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterable

import tensorflow as tf

from myxtts.config import Config
from myxtts.diagnostics.graph_scan import dataset_graph, dataset_ops, find_python_ops

READ_BUDGET_S = 3.0
_READ_CHUNK = 1 << 20

# Dataset methods as they appear in the names TensorFlow gives their functions, longest first so
# "flat_map" is not read as "flat" + "map_...".
_TRANSFORMATIONS = ("from_generator", "group_by_window", "parallel_interleave", "interleave", "flat_map",
                    "padded_batch", "map", "filter", "scan", "reduce")
_FUNCTION_NAME = re.compile(r"^(?:__inference_)?Dataset_(?P<rest>.+?)(?:_\d+)?$")


def describe_function(function: str) -> str:
    """`__inference_Dataset_map_slow_fn_9` -> `Dataset.map(slow_fn)`; unknown names are returned as is."""
    match = _FUNCTION_NAME.match(function)
    if not match:
        return function
    rest = match.group("rest")
    for kind in _TRANSFORMATIONS:
        if rest == kind or rest.startswith(kind + "_"):
            user = rest[len(kind) + 1:]
            if kind == "from_generator":
                return "Dataset.from_generator"
            return f"Dataset.{kind}({'<lambda>' if user == 'lambda' else user})"
    return function


def _function_references(attr_values) -> list[str]:
    names = []
    for value in attr_values:
        if value.HasField("func"):
            names.append(value.func.name)
        if value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def python_op_origins(dataset: tf.data.Dataset) -> list[dict]:
    """Every Python-calling op of the dataset, with the transformation and dataset node holding it."""
    graph = dataset_graph(dataset)
    # function -> who references it: a main-graph node ("node", name, op) or another function.
    referenced_by: dict[str, tuple[str, str, str]] = {}
    for node in graph.node:
        for name in _function_references(node.attr.values()):
            referenced_by.setdefault(name, ("node", node.name, node.op))
    for function in graph.library.function:
        for node in function.node_def:
            for name in _function_references(node.attr.values()):
                referenced_by.setdefault(name, ("function", function.signature.name, ""))

    found = []
    for op in find_python_ops(dataset):
        dataset_node = ""
        if not op.function:
            dataset_node = f"{op.node} ({op.op})"
        else:
            holder, seen = referenced_by.get(op.function), {op.function}
            while holder is not None and holder[0] == "function" and holder[1] not in seen:
                seen.add(holder[1])
                holder = referenced_by.get(holder[1])
            if holder is not None and holder[0] == "node":
                dataset_node = f"{holder[1]} ({holder[2]})"
        if op.op == "GeneratorDataset":  # from_generator wraps it in a flat_map of its own
            stage = "Dataset.from_generator"
        else:
            stage = describe_function(op.function) if op.function else "the dataset graph"
        found.append({"op": op.op, "node": op.node, "function": op.function, "stage": stage,
                      "dataset_node": dataset_node})
    return found


def graph_features(dataset: tf.data.Dataset) -> dict:
    """Which speed features the dataset graph really contains, whatever the config says."""
    ops = dataset_ops(dataset)
    return {
        "cache": any(op.startswith("CacheDataset") for op in ops),
        "prefetch": "PrefetchDataset" in ops,
        "prefetch_to_device": any("Prefetch" in op and "Device" in op for op in ops) or "MultiDeviceIterator" in ops,
        "bucketing": any(op.startswith("GroupByWindowDataset") for op in ops),
        "parallel_map": any(op.startswith("ParallelMapDataset") for op in ops),
    }


def pipeline_settings(config: Config, policy: str, gpu_available: bool) -> dict:
    """The settings that decide speed, as the run resolved them."""
    d, t = config.data, config.training
    return {
        "graph_mode": bool(t.enable_graph_mode),
        "xla": bool(t.enable_xla_compilation),
        "precision": t.precision,
        "dtype_policy": policy,
        "batch_size": d.batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "steps_per_execution": t.steps_per_execution,
        "num_workers": d.num_workers,
        "prefetch_buffer_size": d.prefetch_buffer_size,
        "prefetch_to_gpu": bool(d.prefetch_to_gpu),
        # The pipeline falls back to a plain prefetch when TensorFlow sees no GPU.
        "prefetch_to_gpu_active": bool(d.prefetch_to_gpu) and gpu_available,
        "mel_on_device": bool(d.mel_on_device),
        "cache_features": bool(d.cache_features),
        "cache_dir": d.cache_dir,
        "bucketing": bool(d.bucketing),
        "bucket_count": len(d.bucket_boundaries_s) if d.bucketing else 0,
        "deterministic": d.deterministic,
        "model_size": config.model.size,
        "gpu_available": gpu_available,
    }


def cpu_check(num_workers: int, usable_cores: int, planned_workers: int | None = None) -> dict:
    """Usable cores against `data.num_workers` (0 = tf.data autotune, bounded by the cores).

    `planned_workers`: the hardware plan's count for this machine. It puts two calls in flight per
    input core on purpose (measured faster than one), so that count above the cores is no finding."""
    oversubscribed = num_workers > usable_cores and num_workers != planned_workers
    if num_workers == 0:
        note = f"data.num_workers: 0, tf.data autotunes the parallel calls within {usable_cores} usable cores"
    elif num_workers > usable_cores and not oversubscribed:
        note = (f"data.num_workers: {num_workers} for {usable_cores} usable cores, the hardware plan's two calls in "
                "flight per input core")
    elif num_workers > usable_cores:
        note = (f"data.num_workers: {num_workers} is more than the {usable_cores} usable cores: the threads "
                "take turns on the same cores")
    elif num_workers < usable_cores:
        note = f"data.num_workers: {num_workers}: {num_workers} of {usable_cores} usable cores prepare batches in parallel"
    else:
        note = f"data.num_workers: {num_workers} matches the {usable_cores} usable cores"
    return {"usable_cores": usable_cores, "num_workers": num_workers, "note": note, "oversubscribed": oversubscribed}


def read_throughput(paths: Iterable[str], budget_s: float = READ_BUDGET_S) -> dict | None:
    """Read the files' bytes once, in order, until `budget_s` has passed; MB/s over what was read.

    Files read recently come from the page cache, so this is an upper bound for a cold disk.
    """
    paths = list(dict.fromkeys(paths))
    if not paths:
        return None
    files = total = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(_READ_CHUNK):
                total += len(chunk)
        files += 1
        if time.perf_counter() - started >= budget_s:
            break
    seconds = time.perf_counter() - started
    return {
        "data_dir": os.path.commonpath([str(Path(p).parent) for p in paths]),
        "files": files,
        "files_total": len(paths),
        "bytes": total,
        "seconds": seconds,
        "mb_per_s": total / 1e6 / seconds if seconds > 0 else None,
        "mean_file_bytes": total / files if files else None,
    }


def static_checks(config: Config, dataset: tf.data.Dataset, *, policy: str, usable_cores: int,
                  gpu_available: bool, audio_paths: Iterable[str] = (), read_budget_s: float = READ_BUDGET_S,
                  planned_workers: int | None = None) -> dict:
    """All checks above, plus one-line findings for what looks wrong.

    Pass the dataset built with `data.prefetch_to_gpu: false`: TensorFlow cannot serialize a
    pipeline that ends in `prefetch_to_device`, and that last stage runs no Python anyway.
    """
    settings = pipeline_settings(config, policy, gpu_available)
    cpu = cpu_check(config.data.num_workers, usable_cores, planned_workers)
    throughput = read_throughput(audio_paths, read_budget_s)
    findings = []
    try:
        python_ops = python_op_origins(dataset)
        graph = graph_features(dataset)
    except tf.errors.FailedPreconditionError as error:
        # Some stages (a device prefetch, a generator) cannot be serialized; say so, scan nothing.
        python_ops, graph = [], None
        findings.append(f"the dataset graph could not be serialized for the scan: {error.message.strip()}")
    for op in python_ops:
        findings.append(f"{op['op']} '{op['node']}' in {op['stage']} (dataset node {op['dataset_node'] or '?'}) "
                        "runs Python under the GIL for every element")
    if not settings["graph_mode"]:
        findings.append("training.enable_graph_mode is false: every step runs eagerly, op by op")
    if settings["xla"] and not settings["bucketing"]:
        findings.append("XLA without bucketing: batches padded to their own longest clip give a new shape, "
                        "and a new compilation, for most batches")
    if graph is not None and settings["cache_features"] != graph["cache"]:
        findings.append(f"data.cache_features is {settings['cache_features']} but the dataset graph "
                        f"{'has' if graph['cache'] else 'has no'} cache op")
    if settings["prefetch_to_gpu"] and not settings["prefetch_to_gpu_active"]:
        findings.append("data.prefetch_to_gpu is true but TensorFlow sees no GPU: a plain prefetch is used")
    if cpu["oversubscribed"]:
        findings.append(cpu["note"])
    return {"python_ops": python_ops, "settings": settings, "graph": graph, "cpu": cpu,
            "read_throughput": throughput, "findings": findings}
