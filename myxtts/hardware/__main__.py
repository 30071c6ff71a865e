"""`python -m myxtts.hardware [--json] [--model-size base] [--capacity-gpu H100]`: what this machine is,
what plan fits it, and whether its CPU can feed the GPU.

Runs without TensorFlow (it is queried only with `--tensorflow`) and never prompts: with several GPUs
and no `--gpu`, it shows the plan for the saved or default choice. The capacity plan needs a host
calibration of this CPU model, which `utilities/capacity_plan.py` makes (and caches) on a corpus.
"""

from __future__ import annotations

import argparse
import json
import sys

from myxtts.hardware.capacity import DEFAULT_MFU, plan_capacity
from myxtts.hardware.loop_cost import cost_on_host
from myxtts.hardware.capacity_record import CapacityCache
from myxtts.hardware.cpu_precision import cached_timings
from myxtts.hardware.detect import MachineFacts, detect_machine
from myxtts.hardware.devices import DEVICES, device_by_key, device_for_gpu_name
from myxtts.hardware.host import cpu_model_name
from myxtts.hardware.plan import MODEL_SIZE_BATCH_MULTIPLIER, PRECISION_ALIASES, RequestedSettings, plan_for_machine
from myxtts.hardware.report import build_report, format_report
from myxtts.hardware.select import select_gpus

CALIBRATE_COMMAND = "python utilities/capacity_plan.py --config <your config> --train-data <your corpus>"


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0 (0 = automatic), got {text!r}")
    return value


def _batch_size(text: str) -> str | int:
    return text if text == "auto" else _count(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m myxtts.hardware", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--model-size", default="base", choices=sorted(MODEL_SIZE_BATCH_MULTIPLIER))
    parser.add_argument("--gpu", default=None, help="GPU index or list (0 / 0,1 / all / cpu)")
    parser.add_argument("--tensorflow", action="store_true",
                        help="also ask TensorFlow which GPUs it sees and which CUDA kernels it carries")
    parser.add_argument("--batch-size", default="auto", type=_batch_size, help="clips per batch, or auto (default)")
    parser.add_argument("--effective-batch-size", type=_count, default=0, help="0: the default 32")
    parser.add_argument("--precision", default="auto", choices=sorted(PRECISION_ALIASES))
    parser.add_argument("--capacity-gpu", default=None, metavar="NAME",
                        help=f"plan the capacity for this GPU instead of the one used ({', '.join(d.key for d in DEVICES)})")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help="model FLOPs utilization assumed for the GPU (default: %(default)s)")
    return parser.parse_args(argv)


def capacity_section(facts: MachineFacts, gpu_names: list[str], args: argparse.Namespace,
                     cache: CapacityCache | None = None) -> tuple[list[str], dict]:
    """(report lines, JSON object) of the capacity plan for the GPU used or `--capacity-gpu`."""
    if args.capacity_gpu:
        devices = [device_by_key(args.capacity_gpu)]
    else:
        devices = [device_for_gpu_name(name) for name in dict.fromkeys(gpu_names)]
        unknown = [name for name, device in zip(dict.fromkeys(gpu_names), devices) if device is None]
        if unknown:
            return ([f"Capacity: {', '.join(unknown)} is not in the spec-sheet table (myxtts/hardware/devices.py); "
                     "pass --capacity-gpu with a known card"], {"note": "GPU not in the spec-sheet table"})
    if not devices:
        return ([f"Capacity: no GPU to plan for; pass --capacity-gpu NAME to ask about one "
                 f"({', '.join(d.key for d in DEVICES)})"], {"note": "no GPU"})
    record = (cache or CapacityCache()).latest_for_cpu(cpu_model_name())
    if record is None:
        return ([f"Capacity: no host calibration for this CPU yet; measure it with: {CALIBRATE_COMMAND}"],
                {"note": "no host calibration"})
    batch = 0 if args.batch_size == "auto" else args.batch_size
    # The loops' cost a training run's start measured on this host's card of that model, else the H100's.
    costs = [cost_on_host(device, [gpu.name for gpu in facts.gpus]) for device in devices]
    plans = [plan_capacity(record, device, facts, args.model_size, batch_size=batch, precision=args.precision,
                           mfu=args.mfu, loop_iteration_s=cost.seconds_per_frame, loop_source=cost.source)
             for device, cost in zip(devices, costs)]
    lines = [line for plan in plans for line in plan.lines()]
    return lines, {"plans": [plan.to_dict() for plan in plans]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch = args.batch_size
    requested = RequestedSettings(batch_size=batch, effective_batch_size=args.effective_batch_size,
                                  precision=args.precision)
    facts = detect_machine(query_tensorflow=args.tensorflow)
    try:
        selection = select_gpus(facts, args.gpu, interactive=False)
        chosen = facts.with_gpus(selection.indices)
        capacity_lines, capacity = capacity_section(facts, [g.name for g in chosen.gpus], args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan = plan_for_machine(chosen, args.model_size, requested)
    # What training measured on this CPU before, if anything: the plan's precision is only the prior.
    timings = cached_timings(facts) if plan.probe_precision else []
    if args.json:
        print(json.dumps({**build_report(facts, plan, selection, timings), "capacity": capacity}, indent=2))
    else:
        print(format_report(facts, plan, selection, timings) + "\n\n" + "\n".join(capacity_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
