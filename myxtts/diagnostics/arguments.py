"""The run-selecting options the diagnostic tools share with each other, and the config they give.

Both `utilities/diagnose_gpu_bottleneck.py` and `utilities/gpu_profiler.py` measure a training run
described the way `train_main.py` describes one: a config file, the training data, the batch size
and any `--set key=value`. Plain argparse, so the tools' `--help` works without TensorFlow.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config (default: configs/config.yaml's defaults)")
    parser.add_argument("--train-data", help="LJSpeech folder, metadata.csv or JSONL manifest (data.train_data)")
    parser.add_argument("--batch-size", type=int, help="clips per batch (data.batch_size); default: the config's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. --set model.size=small (repeatable)")


def add_gpu_assumption_arguments(parser: argparse.ArgumentParser, applies_to: str = "") -> None:
    """--mfu and --loop-iteration-us: the two assumptions of a GPU's predicted step time
    (hardware/capacity.py), for the capacity plan and the simulated GPU alike. `applies_to` prefixes
    the help ("with --simulate-gpu: "). --loop-iteration-us defaults to None: `loop_cost` looks up a
    measured cost."""
    from myxtts.hardware.capacity import DEFAULT_MFU, LOOP_ITERATION_S

    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help=f"{applies_to}model FLOPs utilization assumed (default: %(default)s)")
    parser.add_argument("--loop-iteration-us", type=float, default=None,
                        help=f"{applies_to}GPU time per frame of each of the alignment's loops, in microseconds "
                             "(default: what a run on this host's card of that model measured at its start, "
                             f"else {LOOP_ITERATION_S * 1e6}, measured on an H100 at 16 frames per loop iteration)")


def loop_cost(arguments: argparse.Namespace, config, device, gpu_names):
    """The alignment loops' cost per frame on `device` (a DeviceSpec), with its source: --loop-iteration-us,
    else what a run on this host's card of that model measured at its start (cached), else the H100's
    figure. `gpu_names`: the host's GPUs as NVML names them."""
    from myxtts.hardware.loop_cost import GPU_FRAMES_PER_ITERATION, LoopCost, cost_on_host

    if arguments.loop_iteration_us is not None:
        return LoopCost(arguments.loop_iteration_us * 1e-6, "set by --loop-iteration-us")
    frames = config.training.alignment_frames_per_iteration or GPU_FRAMES_PER_ITERATION
    return cost_on_host(device, gpu_names, frames)


def run_overrides(arguments: argparse.Namespace) -> list[str]:
    """The config overrides the options above ask for, `--set` last (so it wins)."""
    from myxtts.config import override

    overrides = [override("data.train_data", arguments.train_data)] if arguments.train_data else []
    if arguments.batch_size:
        overrides.append(f"data.batch_size={arguments.batch_size}")
    return overrides + list(arguments.set)
