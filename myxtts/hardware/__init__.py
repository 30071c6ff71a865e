"""What machine is this, and what plan fits it.

- `detect`: GPU facts through NVML, CPU/RAM/platform (`host`), TensorFlow's view only on request.
- `plan`: a pure function from facts, model size and user settings to precision, batch, accumulation
  and input parallelism, each value with its source.
- `batch_plan`: batch x accumulation x replicas, the one place that arithmetic lives.
- `probe`: measured batch sizes -> memory fit -> chosen batch, with a JSON cache; `probe_runner`
  runs one child process per batch size (the child itself is `myxtts.training.batch_probe`).
- `cpu_precision`: on a CPU, float32 against bf16 train steps timed in one child process
  (`myxtts.training.precision_probe`), cached per CPU model and setup; bf16 only if >= 10% faster.
- `gpu_memory`: TensorFlow's memory growth and its own allocator peak.
- `select`: which GPUs to use (`--gpu`, a saved choice, or a question on a terminal).
- `report`: the readable and JSON reports behind `python -m myxtts.hardware`.
- `devices`: the GPUs' dense peaks and memory bandwidth, from the vendors' spec sheets.
- `capacity`: will this host feed the GPU: the GPU's demand in audio-seconds per second against the
  host's measured rate per input route; `capacity_record` stores a host calibration (made by
  `myxtts.diagnostics.calibration`) as plain numbers, in a JSON cache.

Nothing in this package imports TensorFlow at module level, nor anything from data, models or
training (tests/test_imports.py).
"""

from myxtts.hardware.detect import GpuFacts, MachineFacts, architecture_for, detect_machine
from myxtts.hardware.plan import Plan, RequestedSettings, plan_for_machine, with_measured_batch
from myxtts.hardware.report import format_report, short_summary
from myxtts.hardware.select import GpuSelection, cuda_visible_devices_value, select_gpus

__all__ = [
    "GpuFacts",
    "GpuSelection",
    "MachineFacts",
    "Plan",
    "RequestedSettings",
    "architecture_for",
    "cuda_visible_devices_value",
    "detect_machine",
    "format_report",
    "plan_for_machine",
    "select_gpus",
    "short_summary",
    "with_measured_batch",
]
