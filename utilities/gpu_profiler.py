#!/usr/bin/env python3
"""Capture a TensorBoard profiler trace of N training steps, for the profiler's input-pipeline analysis.

    python utilities/gpu_profiler.py --config configs/demo.yaml --train-data /tmp/demo400 --steps 20
    python utilities/gpu_profiler.py --config configs/config.yaml --steps 50 --logdir runs/config/logs

The model, optimizer, step and dataset are built as train_main.py builds them. The trace goes to
the run's log directory (default runs/<config name>/logs, where training writes its TensorBoard
logs), so the Profile tab sits next to the training curves. Batch shapes are compiled before the
trace starts. The command prints how to open the trace when it is done.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPOSITORY_ROOT))

from myxtts.diagnostics.arguments import add_run_arguments, run_overrides  # noqa: E402 - after the path


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="training steps to trace (default: %(default)s)")
    parser.add_argument("--logdir", type=Path,
                        help="TensorBoard log directory (default: runs/<config name>/logs, the run's own)")
    arguments = parser.parse_args(argv)
    if arguments.steps < 1:
        parser.error(f"--steps must be at least 1, got {arguments.steps}")
    return arguments


def default_logdir(config_path: Path | None) -> Path:
    """Where train_main.py puts a run's TensorBoard logs: runs/<config name>/logs."""
    name = config_path.stem if config_path else "run"
    return REPOSITORY_ROOT / "runs" / name / "logs"


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from myxtts.config import ConfigError, load_config
    from myxtts.data.audio import DataProblem, named_data_problems
    from myxtts.data.manifest import ManifestError
    from myxtts.data.pipeline import NoFullBatch

    logdir = arguments.logdir or default_logdir(arguments.config)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        with named_data_problems():  # a clip the pipeline refuses: one line naming it (DataProblem)
            config = load_config(arguments.config, overrides=run_overrides(arguments))
            from myxtts.diagnostics.profile_trace import capture_trace, how_to_open
            from myxtts.diagnostics.training_setup import build_training_setup, prepare_run

            prepared = prepare_run(config, echo=progress)
            sample = next(iter(prepared.dataset.take(1)))  # as train() builds its variables
            setup = build_training_setup(prepared.config, len(prepared.vocabulary), prepared.policy, sample,
                                         silent_token=prepared.vocabulary.word_boundary_id,
                                         batch_spec=prepared.dataset.element_spec)
            trace = capture_trace(prepared.dataset, setup.step, arguments.steps, logdir, progress=progress)
    except (ConfigError, ManifestError, FileNotFoundError, NoFullBatch, DataProblem) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote a profiler trace of {arguments.steps} steps to {trace}")
    print(how_to_open(logdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
