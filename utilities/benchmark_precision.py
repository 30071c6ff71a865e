"""float32 against mixed_bfloat16 train steps on real batches of every bucket, side by side.

    python utilities/benchmark_precision.py                          # the demo config, 60 batches
    python utilities/benchmark_precision.py --config my.yaml --batches 120

The CPU precision probe (`myxtts/training/precision_probe.py`) decides from synthetic batches of the
middle bucket. This checks that choice against what training runs: the config's own training
stream (its buckets in their real proportions), each batch stepped by a float32 model and then by a
mixed_bfloat16 one, in one process, so load from other processes slows both alike. The first steps
of each shape trace the step and are left out. Prints the median and mean step per precision and
the median per bucket.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("float32", "mixed_bfloat16")


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time float32 and bf16 train steps on the config's real batches.")
    parser.add_argument("--config", type=Path, default=REPOSITORY_ROOT / "configs" / "demo.yaml",
                        help="run config (default: configs/demo.yaml, on demo_corpus)")
    parser.add_argument("--batches", type=int, default=60, help="training batches, each stepped in both precisions "
                                                               "(default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    sys.path.insert(0, str(REPOSITORY_ROOT))
    import keras
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.data.pipeline import Epochs
    from myxtts.training.precision_probe import _StepTimer
    from myxtts.training.run_setup import prepare_run
    from myxtts.training.trainer import build_training_model

    config = load_config(arguments.config, overrides=["training.precision=fp32"])
    if not config.data.batch_size:
        print("error: set data.batch_size in the config (the hardware plan's automatic batch is not resolved here)",
              file=sys.stderr)
        return 2
    run = prepare_run(config, None)
    epochs = Epochs(config, run.text.train_rows, training=True, vocabulary=run.vocabulary)
    batches = list(epochs.stream().take(arguments.batches).as_numpy_iterator())
    keras.utils.set_random_seed(config.seed)
    models = {}
    for policy in POLICIES:
        keras.config.set_dtype_policy(policy)  # read when the layers are built
        models[policy] = build_training_model(config, len(run.vocabulary), policy, batches[0],
                                              silent_token=run.vocabulary.word_boundary_id)
    keras.config.set_dtype_policy("float32")

    steps = {policy: collections.defaultdict(list) for policy in POLICIES}
    for index, batch in enumerate(batches):
        frames = batch["mel"].shape[1] if "mel" in batch else batch["mel_length"].max()
        for policy, model in models.items():
            timer = _StepTimer()
            model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, steps_per_epoch=1, verbose=0,
                      callbacks=[timer.callback])
            if index >= 4 and frames in steps[policy]:  # not the warm-up, nor a shape's first (tracing) step
                steps[policy][frames].append(timer.seconds[-1])
            steps[policy].setdefault(frames, [])
        print(f"\rbatch {index + 1}/{len(batches)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    print(f"{config.model.size} model, batch {config.data.batch_size}, {len(batches)} batches of {arguments.config}")
    for policy in POLICIES:
        times = [t for per_shape in steps[policy].values() for t in per_shape]
        if not times:
            print("error: no timed step: raise --batches", file=sys.stderr)
            return 1
        buckets = "  ".join(f"{frames}: {statistics.median(t):.3f}" for frames, t in sorted(steps[policy].items()) if t)
        print(f"{policy:>15}: median {statistics.median(times):.3f} s, mean {statistics.mean(times):.3f} s over "
              f"{len(times)} steps; per bucket (frames: median s) {buckets}")
    means = {policy: statistics.mean(t for per in steps[policy].values() for t in per) for policy in POLICIES}
    print(f"bf16 is {1 - means['mixed_bfloat16'] / means['float32']:+.0%} faster than float32 on the mean step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
