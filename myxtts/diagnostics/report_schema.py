"""The JSON report of `utilities/diagnose_gpu_bottleneck.py --json`: its schema and every field.

`REPORT_SCHEMA` is a JSON Schema (draft 2020-12 keywords: type, properties, required,
additionalProperties, items, enum, minimum, maximum, minItems, maxItems); `validate_report` checks
a report against it without third-party packages. Times are seconds unless a name ends in `_ms`;
shares are fractions in [0, 1]; utilization is percent; `null` means "not measured".

Fields:

- `schema_version`: 8 for this layout (2: `gpu.tensorflow_peak_bytes` added; the memory verdict
  uses it instead of `gpu.memory_used_bytes`; 3: `gpu.simulated` added; 4: `measurements.alignment_loops`,
  `measurements.step_alone.xla`, `machine.input_plan` and the loop-bound verdict added; 5:
  `static.cpu.oversubscribed`, false for the hardware plan's own count; 6:
  `measurements.step_profile`; 7: `measurements.larger_batch`; 8: `measurements.step_profile.host_ops`);
  raised when a field changes meaning.
- `created_utc`: when the report was made, ISO 8601 in UTC.
- `config.path`: the YAML given with --config, or null. `config.overrides`: the `key=value`
  overrides applied on top (flags and --set), in order.
- `machine.usable_cpu_cores`: cores this process may use (affinity and cgroup quota).
  `machine.gpus[]`: GPUs NVML sees: `name`, `nvml_index`, `compute_capability` ([major, minor]),
  `total_memory_bytes`. `machine.notes`: what detection could not find out. `machine.input_plan`
  (optional): the capacity plan's own input parallelism for this machine (`hardware/plan.py`, with
  data.num_workers automatic): `num_workers` and its `source`; no recommendation goes below it.
- `static.python_ops[]`: ops of the input pipeline that call Python: `op` (PyFunc, EagerPyFunc,
  PyFuncStateless, GeneratorDataset), `node` (its name, which carries the name given to
  `tf.numpy_function`), `function` (the graph function holding it), `stage` (the transformation,
  e.g. `Dataset.map(slow_fn)`), `dataset_node` (the dataset op applying it, e.g.
  `ParallelMapDatasetV2/_5 (ParallelMapDatasetV2)`).
- `static.settings`: as resolved for the run: `graph_mode`, `xla`, `precision` (the config value),
  `dtype_policy` (the Keras policy used), `batch_size`, `gradient_accumulation_steps`,
  `steps_per_execution`, `num_workers`, `prefetch_buffer_size`, `prefetch_to_gpu`,
  `prefetch_to_gpu_active` (only with a GPU TensorFlow can see), `mel_on_device` (waveforms shipped,
  log-mel computed in the step), `cache_features`, `cache_dir`,
  `bucketing`, `bucket_count`, `deterministic`, `model_size`, `gpu_available` (TensorFlow sees a GPU).
- `static.graph`: what the dataset graph contains (null if it could not be serialized): `cache`,
  `prefetch`, `prefetch_to_device`, `bucketing` (a group-by-window op), `parallel_map`.
- `static.cpu`: `usable_cores`, `num_workers` and a `note` comparing them.
- `static.read_throughput` (null without audio files): `data_dir`, `files` read of `files_total`,
  `bytes`, `seconds`, `mb_per_s` (10^6 bytes per second), `mean_file_bytes`.
- `static.findings`: one line per problem seen before running anything.
- `measurements.input_pipeline`: the pipeline alone: `batches` timed, `batches_per_s`,
  `first_batch_ms` (start-up, untimed in the rest), `mean_ms`, `p50_ms`, `p95_ms` per batch.
- `measurements.precompile`: `shapes` compiled before timing (each batch shape (a) met) and the
  `seconds` that took.
- `measurements.step_alone`: the step on one in-memory batch: `steps`, `steps_per_s`, `warmup_ms`,
  `mean_ms`, `p50_ms`, `p95_ms`, `batch_shape` (each key's shape), `xla` (whether the step was
  XLA-compiled; null for a step that is no model's, e.g. a simulated GPU).
- `measurements.alignment_loops` (null when not measured, e.g. with --simulate-gpu): the
  alignment's frame loops (forward-sum loss with its gradient, and Viterbi) timed alone on the
  step-alone batch, as the step runs them (`diagnostics/alignment_timing.py`): `runs`, `median_ms`,
  `warmup_ms` (the first call: tracing and compiling), `share_of_step` (`median_ms` over the step
  alone's `p50_ms`), `frames` and `tokens` of the batch, `frames_per_iteration`, `iterations`
  (sequential loop iterations per step), `compiled` (each loop an XLA program of its own),
  `jit_compile` (timed inside an XLA-compiled function, as the step is).
- `measurements.step_profile` (null when not asked for, e.g. with --simulate-gpu): three steps
  alone traced by TensorFlow's profiler (`diagnostics/step_profile.py`): `source` ("gpu kernels",
  or "cpu ops" without a GPU), `steps`, `busy_ms` (device work per step), `loops_ms` (the
  alignment's loops), `matmuls_ms` (matrix products, convolutions), `other_ms`, and their `shares`
  of `busy_ms` (`shares.loops`, `shares.matmuls`, `shares.other`), `host_ops` (TensorFlow ops the host
  ran per step: in graph mode the executor dispatches each, a GPU kernel's launch included); only
  `note` when the profiler failed.
- `measurements.larger_batch` (null unless the verdict would advise a larger batch and the diagnosis
  timed it): (b) again on twice the batch (each clip twice, the same bucket shape): `batch` (clips),
  `p50_ms`, `warmup_ms` (its trace or compile), `samples_per_s_gain` (twice (b)'s `p50_ms` over this
  one's: above 1, the larger batch moves more clips a second); only `batch` and `note` when it could
  not be run (out of memory). `data.batch_size` is advised only at a gain of 1.1 or more.
- `measurements.training`: real training: `steps` run, `compile_steps` (traced or compiled, left
  out of the rest), `steady_steps`, `steps_per_s`, `step_ms` / `input_wait` / `compiled_step` /
  `host_other` (each with `total_s`, `mean_ms`, `p50_ms`, `p95_ms`; the last three with `share` of
  the step time), `input_share` (input wait / step time), `input_classification` (highly,
  moderately, not), `per_step[]` (`start_s` in epoch seconds, `input_wait_ms`, `compiled_ms`,
  `host_ms`, `compile`).
- `gpu.available`: whether a GPU was sampled; `gpu.note`: why not, or null. `gpu.source`:
  `driver_buffer` (nvmlDeviceGetSamples) or `polling` (nvmlDeviceGetUtilizationRates).
  `gpu.device`: its name. `gpu.samples`: utilization samples taken. `gpu.utilization`: `mean`,
  `p10`, `p90`, `below_30_share` (time-weighted). `gpu.oscillation`: `score` (0 steady or idle, near 1
  for a periodic swing of 10 points or more) and `period_s` (null unless the score is >= 0.3).
  `gpu.memory_used_bytes` (NVML's peak of used memory: what TensorFlow's allocator reserved, plus
  other processes), `gpu.memory_total_bytes`, `gpu.tensorflow_peak_bytes` (TensorFlow's allocator
  peak during (c), `get_memory_info`; what the steps held; null when not measured, e.g. without a
  GPU TensorFlow sees), `gpu.memory_controller_mean` (percent
  busy), `gpu.idle_reason_share` (share of reads with the "GPU idle" clock-event reason set),
  `gpu.errors` (failed NVML reads), `gpu.series` ([seconds from the first step, percent] pairs).
- `gpu.simulated` (null unless `--simulate-gpu`): the GPU the consumer stood for, each batch held for
  its predicted step time (`diagnostics/simulated_gpu.py`): `device` (its key, e.g. H100), `name`,
  `precision` (the Keras policy the plan picks for it), `peak_path` (which peak: bf16 tensor cores,
  ...), `peak_flops` (dense FLOP/s) and `memory_bandwidth` (bytes/s), both from `spec_source`; `mfu`
  (the assumed utilization) and `mfu_source`; `loop_iteration_s` (GPU time per iteration of the
  alignment's loops) and `loop_source`. Then `gpu.available` is false: nothing was sampled.
- `verdict.kind`: input-bound, host-overhead-bound, loop-bound, memory-bound or compute-bound;
  `verdict.input_classification`: as in `measurements.training`; `verdict.reasons`: why.
- `recommendations[]`: ranked changes: `rank` (1 first), `key` (the config key, or null for a
  code change), `value` (what to set it to, or null), `change` (the YAML line or the code change),
  `reason`.
"""

from __future__ import annotations

from typing import Any, Iterator

SCHEMA_VERSION = 8

_NUMBER = {"type": "number"}
_OPTIONAL_NUMBER = {"type": ["number", "null"]}
_SHARE = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}


def _object(properties: dict, nullable: bool = False, required: list | None = None) -> dict:
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def _list(items: dict) -> dict:
    return {"type": "array", "items": items}


_LATENCY = {"total_s": _NUMBER, "mean_ms": _OPTIONAL_NUMBER, "p50_ms": _OPTIONAL_NUMBER, "p95_ms": _OPTIONAL_NUMBER}

REPORT_SCHEMA: dict = _object({
    "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
    "created_utc": {"type": "string"},
    "config": _object({"path": {"type": ["string", "null"]}, "overrides": _list({"type": "string"})}),
    "machine": _object({
        "usable_cpu_cores": {"type": "integer", "minimum": 1},
        "gpus": _list(_object({
            "name": {"type": "string"},
            "nvml_index": {"type": ["integer", "null"]},
            "compute_capability": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            "total_memory_bytes": _COUNT,
        })),
        "notes": _list({"type": "string"}),
        "input_plan": _object({"num_workers": {"type": "integer", "minimum": 1}, "source": {"type": "string"}}),
    }, required=["usable_cpu_cores", "gpus", "notes"]),
    "static": _object({
        "python_ops": _list(_object({
            "op": {"type": "string"},
            "node": {"type": "string"},
            "function": {"type": "string"},
            "stage": {"type": "string"},
            "dataset_node": {"type": "string"},
        })),
        "settings": _object({
            "graph_mode": {"type": "boolean"},
            "xla": {"type": "boolean"},
            "precision": {"type": ["string", "null"]},
            "dtype_policy": {"type": "string"},
            "batch_size": _COUNT,
            "gradient_accumulation_steps": _COUNT,
            "steps_per_execution": _COUNT,
            "num_workers": _COUNT,
            "prefetch_buffer_size": _COUNT,
            "prefetch_to_gpu": {"type": "boolean"},
            "prefetch_to_gpu_active": {"type": "boolean"},
            "mel_on_device": {"type": "boolean"},
            "cache_features": {"type": "boolean"},
            "cache_dir": {"type": "string"},
            "bucketing": {"type": "boolean"},
            "bucket_count": _COUNT,
            "deterministic": {"type": "boolean"},
            "model_size": {"type": "string"},
            "gpu_available": {"type": "boolean"},
        }),
        "graph": _object({name: {"type": "boolean"} for name in
                          ("cache", "prefetch", "prefetch_to_device", "bucketing", "parallel_map")}, nullable=True),
        "cpu": _object({"usable_cores": {"type": "integer", "minimum": 1}, "num_workers": _COUNT,
                        "note": {"type": "string"}, "oversubscribed": {"type": "boolean"}}),
        "read_throughput": _object({
            "data_dir": {"type": "string"},
            "files": _COUNT,
            "files_total": _COUNT,
            "bytes": _COUNT,
            "seconds": _NUMBER,
            "mb_per_s": _OPTIONAL_NUMBER,
            "mean_file_bytes": _OPTIONAL_NUMBER,
        }, nullable=True),
        "findings": _list({"type": "string"}),
    }),
    "measurements": _object({
        "input_pipeline": _object({
            "batches": _COUNT, "batches_per_s": _OPTIONAL_NUMBER, "first_batch_ms": _NUMBER,
            "mean_ms": _OPTIONAL_NUMBER, "p50_ms": _OPTIONAL_NUMBER, "p95_ms": _OPTIONAL_NUMBER,
        }),
        "precompile": _object({"shapes": _COUNT, "seconds": _NUMBER}),
        "step_alone": _object({
            "steps": _COUNT, "steps_per_s": _OPTIONAL_NUMBER, "warmup_ms": _NUMBER,
            "mean_ms": _OPTIONAL_NUMBER, "p50_ms": _OPTIONAL_NUMBER, "p95_ms": _OPTIONAL_NUMBER,
            "batch_shape": {"type": "object", "additionalProperties": _list({"type": "integer"})},
            "xla": {"type": ["boolean", "null"]},
        }),
        "alignment_loops": _object({
            "runs": _COUNT, "median_ms": _NUMBER, "warmup_ms": _NUMBER,
            "share_of_step": {"type": ["number", "null"], "minimum": 0},
            "frames": _COUNT, "tokens": _COUNT, "frames_per_iteration": {"type": "integer", "minimum": 1},
            "iterations": _COUNT, "compiled": {"type": "boolean"}, "jit_compile": {"type": "boolean"},
        }, nullable=True),
        "step_profile": _object({
            "source": {"type": "string", "enum": ["gpu kernels", "cpu ops"]}, "steps": _COUNT,
            "busy_ms": _NUMBER, "loops_ms": _NUMBER, "matmuls_ms": _NUMBER, "other_ms": _NUMBER,
            "shares": _object({"loops": _SHARE, "matmuls": _SHARE, "other": _SHARE}),
            "host_ops": _NUMBER, "note": {"type": "string"},
        }, nullable=True, required=[]),
        "larger_batch": _object({
            "batch": _COUNT, "p50_ms": _NUMBER, "warmup_ms": _NUMBER, "samples_per_s_gain": {"type": ["number", "null"]},
            "note": {"type": "string"},
        }, nullable=True, required=["batch"]),
        "training": _object({
            "steps": _COUNT,
            "compile_steps": _COUNT,
            "steady_steps": _COUNT,
            "steps_per_s": _OPTIONAL_NUMBER,
            "step_ms": _object(_LATENCY),
            "input_wait": _object({**_LATENCY, "share": _SHARE}),
            "compiled_step": _object({**_LATENCY, "share": _SHARE}),
            "host_other": _object({**_LATENCY, "share": _SHARE}),
            "input_share": _SHARE,
            "input_classification": {"type": "string", "enum": ["highly", "moderately", "not"]},
            "per_step": _list(_object({
                "start_s": _NUMBER, "input_wait_ms": _NUMBER, "compiled_ms": _NUMBER, "host_ms": _NUMBER,
                "compile": {"type": "boolean"},
            })),
        }),
    }),
    "gpu": _object({
        "available": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "source": {"type": ["string", "null"], "enum": ["driver_buffer", "polling", None]},
        "device": {"type": ["string", "null"]},
        "samples": _COUNT,
        "utilization": _object({"mean": _NUMBER, "p10": _NUMBER, "p90": _NUMBER, "below_30_share": _SHARE},
                               nullable=True),
        "oscillation": _object({"score": _SHARE, "period_s": _OPTIONAL_NUMBER}, nullable=True),
        "memory_used_bytes": {"type": ["integer", "null"]},
        "memory_total_bytes": {"type": ["integer", "null"]},
        "tensorflow_peak_bytes": {"type": ["integer", "null"], "minimum": 0},
        "memory_controller_mean": _OPTIONAL_NUMBER,
        "idle_reason_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "errors": _COUNT,
        "series": _list({"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2}),
        "simulated": _object({
            "device": {"type": "string"}, "name": {"type": "string"}, "precision": {"type": "string"},
            "peak_path": {"type": "string"}, "peak_flops": _NUMBER, "memory_bandwidth": _NUMBER,
            "spec_source": {"type": "string"}, "mfu": _SHARE, "mfu_source": {"type": "string"},
            "loop_iteration_s": _NUMBER, "loop_source": {"type": "string"},
        }, nullable=True),
    }),
    "verdict": _object({
        "kind": {"type": "string", "enum": ["input-bound", "host-overhead-bound", "loop-bound", "memory-bound",
                                                   "compute-bound"]},
        "input_classification": {"type": "string", "enum": ["highly", "moderately", "not"]},
        "reasons": _list({"type": "string"}),
    }),
    "recommendations": _list(_object({
        "rank": {"type": "integer", "minimum": 1},
        "key": {"type": ["string", "null"]},
        "value": {"type": ["boolean", "integer", "number", "string", "null"]},
        "change": {"type": "string"},
        "reason": {"type": "string"},
    })),
})

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is_type(value: Any, name: str) -> bool:
    # bool is an int in Python but not a number in JSON.
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def schema_errors(value: Any, schema: dict = REPORT_SCHEMA, path: str = "$") -> list[str]:
    """Every place `value` breaks `schema`, as 'path: problem' lines (empty when it conforms)."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, name) for name in names):
            return [f"{path}: expected {' or '.join(names)}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}: missing '{name}'")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                errors.extend(schema_errors(item, properties[name], f"{path}.{name}"))
            elif extra is False:
                errors.append(f"{path}: unexpected field '{name}'")
            elif isinstance(extra, dict):
                errors.extend(schema_errors(item, extra, f"{path}.{name}"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "items" in schema:
            for index, item in enumerate(value):
                errors.extend(schema_errors(item, schema["items"], f"{path}[{index}]"))
    return errors


def validate_report(report: dict) -> None:
    """Raises ValueError listing every way `report` breaks the schema."""
    errors = schema_errors(report)
    if errors:
        raise ValueError("the report does not match REPORT_SCHEMA:\n  " + "\n  ".join(errors[:20]))


def field_names(schema: dict = REPORT_SCHEMA) -> Iterator[str]:
    """Every property name the schema defines, at any depth (the docstring must name each)."""
    for name, child in schema.get("properties", {}).items():
        yield name
        yield from field_names(child)
    if isinstance(schema.get("items"), dict):
        yield from field_names(schema["items"])
