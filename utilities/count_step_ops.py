#!/usr/bin/env python3
"""Count the TensorFlow ops one graph-mode train step runs on the host, by op type.

    python utilities/count_step_ops.py --config configs/demo.yaml --train-data demo_corpus --set training.precision=fp32
    python utilities/count_step_ops.py --config configs/demo.yaml --train-data demo_corpus --top 30 --time-steps 25

In graph mode TensorFlow's executor dispatches every op of the step from the host, one by one (on a
GPU, each kernel's launch too); on an H200 the demo's step spent 50 of its 73 ms there, not in
kernels (BENCHMARKS.md). The step is built as the diagnosis builds it (the model, optimizer and
first batch of the config's corpus) and traced for the dataset's element spec (unknown lengths), as
training traces it; it runs three times unprofiled, then three times under TensorFlow's profiler.
The ops are the host's events named `scope:Type`, the input pipeline's threads left out, a function
call and the ops inside it each counted (`step_profile.host_op_types`; the diagnosis prints the same
total as `host_ops` of its profile). `--time-steps N` then times N steps alone (after the six above)
and prints their median. To count a checkout from before this script, run 677734f's copy of it there
(`git show 677734f:utilities/count_step_ops.py`), which carries its own count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPOSITORY_ROOT))

from myxtts.diagnostics.arguments import add_run_arguments, run_overrides  # noqa: E402 - after the path

STEPS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--top", type=int, default=15, help="op types to list (default: %(default)s)")
    parser.add_argument("--time-steps", type=int, default=0, metavar="N",
                        help="also time N steps alone on the batch and print their median (default: none)")
    parser.add_argument("--update-compiled", action="store_true",
                        help="compile the optimizer's update alone, as a GPU does for a graph-mode step")
    arguments = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.diagnostics.step_profile import host_op_types, read_trace
    from myxtts.diagnostics.timing import run_once
    from myxtts.diagnostics.training_setup import build_training_setup, prepare_run

    from myxtts.config import ConfigError
    from myxtts.data.audio import DataProblem, named_data_problems
    from myxtts.data.manifest import ManifestError
    from myxtts.data.pipeline import NoFullBatch

    try:
        with named_data_problems():  # a clip the pipeline refuses: one line naming it (DataProblem)
            config = load_config(arguments.config, overrides=run_overrides(arguments))
            prepared = prepare_run(config, echo=lambda message: None)
            batch = next(iter(prepared.dataset.take(1)))
    except (ConfigError, ManifestError, FileNotFoundError, NoFullBatch, DataProblem) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Traced for the dataset's element spec, as training traces the step: unknown lengths.
    setup = build_training_setup(prepared.config, len(prepared.vocabulary), prepared.policy, batch,
                                 silent_token=prepared.vocabulary.word_boundary_id,
                                 batch_spec=prepared.dataset.element_spec)
    if arguments.update_compiled:
        setup.model.update_compiled = tf.function(setup.model._update, jit_compile=True)
    for _ in range(STEPS):
        run_once(setup.step, batch)  # traced and compiled outside the profile
    with tempfile.TemporaryDirectory(prefix="myxtts-ops-") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(STEPS):
                run_once(setup.step, batch)
        finally:
            tf.profiler.experimental.stop()
        space = read_trace(logdir)
    by_type = host_op_types(space)
    total = sum(by_type.values()) / STEPS
    print(f"{config.model.size} model, {prepared.policy}, mel {list(batch['mel'].shape)}, "
          f"XLA {'on' if prepared.config.training.enable_xla_compilation else 'off'}"
          f"{', update compiled alone' if arguments.update_compiled else ''}: "
          f"{total:,.0f} TensorFlow ops run by the host per step (counted over {STEPS} steps)")
    for op_type, count in by_type.most_common(arguments.top):
        print(f"  {count / STEPS:8,.0f}  {op_type}")
    if arguments.time_steps:
        seconds = []
        for _ in range(arguments.time_steps):
            started = time.perf_counter()
            run_once(setup.step, batch)
            seconds.append(time.perf_counter() - started)
        print(f"step alone: median {statistics.median(seconds) * 1000:.1f} ms of {arguments.time_steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
