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


def add_gpu_assumption_arguments(parser: argparse.ArgumentParser, applies_to: str = "",
                                 measured_default: bool = False) -> None:
    """--mfu and --loop-iteration-us: the two assumptions of a GPU's predicted step time
    (hardware/capacity.py), for the capacity plan and the simulated GPU alike. `applies_to` prefixes
    the help ("with --simulate-gpu: "). `measured_default`: --loop-iteration-us defaults to None, for
    the caller to look up a measured cost (the capacity plan, for a card this host has)."""
    from myxtts.hardware.capacity import DEFAULT_MFU, LOOP_ITERATION_S

    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help=f"{applies_to}model FLOPs utilization assumed (default: %(default)s)")
    parser.add_argument("--loop-iteration-us", type=float, default=None if measured_default else LOOP_ITERATION_S * 1e6,
                        help=f"{applies_to}GPU time per frame of each of the alignment's loops, in microseconds "
                             + ("(default: what a run on this host's card of that model measured at its start, "
                                f"else {LOOP_ITERATION_S * 1e6}, measured on an H100 at 16 frames per loop iteration)"
                                if measured_default else
                                "(default: %(default)s, measured on an H100 at 16 frames per loop iteration)"))


def run_overrides(arguments: argparse.Namespace) -> list[str]:
    """The config overrides the options above ask for, `--set` last (so it wins)."""
    overrides = [f"data.train_data={arguments.train_data}"] if arguments.train_data else []
    if arguments.batch_size:
        overrides.append(f"data.batch_size={arguments.batch_size}")
    return overrides + list(arguments.set)
