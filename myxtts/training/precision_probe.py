"""The measuring side of the CPU precision probe: train steps timed in float32 and in mixed_bfloat16.

    python -m myxtts.training.precision_probe --config run.yaml [--set KEY=VALUE] [--steps N]
    -> one JSON line {"steps", "bucket_frames", "tensorflow", "seconds": {"float32": [...],
                      "mixed_bfloat16": [...]}, "warm_up_seconds": {policy: s}, "errors": {policy: message}}

`myxtts.hardware.cpu_precision` starts it once per setup (the trainer names this module to it) and
decides from the medians. Both policies are timed in this one process, each on its own model built
the way training builds it (`trainer.build_training_model`, at the config's batch, accumulation and
XLA setting), with the batch shape of the middle bucket: a typical step, not the longest.

Why one process for both and not one each: the timed steps alternate (float32, bf16, float32, ...),
so a burst of load from another process on a shared machine slows both sides alike instead of
whichever policy happened to run during it; and TensorFlow is imported once, not twice. The Keras
policy is global, but a layer reads it only when it is built, so each model is built and its step
traced (the warm-up step, which also absorbs the first call's allocations) while its own policy is
set.

A failure in bf16 only (an op without a bfloat16 CPU kernel, say) is an answer: it goes into
"errors" and the parent keeps float32. A failure in float32 is not (training would fail too): the
process exits non-zero with the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

from myxtts import config as config_lib
from myxtts.config import Config

POLICIES = ("float32", "mixed_bfloat16")
DEFAULT_STEPS = 8  # timed steps per policy after the warm-up; the parent takes their median (a step of
# `small` at batch 16 is ~0.6-1 s here, against ~25 s of tracing per policy: more steps cost little, and on
# a shared machine medians of 5 disagreed from run to run: BENCHMARKS.md, "CPU precision probe")
VOCAB_SIZE = 256  # as the batch probe: a generous vocabulary, the text head is a small share of a step


class _StepTimer:
    """Wall time of each train step, from Keras' batch callbacks (so fit's own set-up is not counted).

    On the CPU a compiled step returns only when it has run, so begin-to-end is the step's time.
    """

    def __init__(self):
        import keras

        outer = self

        class Timer(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                outer.started = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                outer.seconds.append(time.perf_counter() - outer.started)

        self.callback = Timer()
        self.started = 0.0
        self.seconds: list[float] = []


def _middle_bucket_batch(config: Config) -> dict:
    """A synthetic batch shaped like the middle bucket's (see batch_probe.synthetic_batch)."""
    from myxtts.training.batch_probe import synthetic_batch

    middle = (len(config.data.bucket_mel_lengths) - 1) // 2
    return synthetic_batch(config, config.data.batch_size, VOCAB_SIZE, bucket=middle)


def time_policies(config: Config, steps: int = DEFAULT_STEPS) -> dict:
    """Seconds of each timed step per policy (alternating), and the policies that failed, with why."""
    import keras
    import tensorflow as tf

    from myxtts.training.trainer import build_training_model

    # Per-step timing needs one step per call; steps_per_execution changes nothing else of the step.
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, steps_per_execution=1))
    batch = _middle_bucket_batch(config)
    data = tf.data.Dataset.from_tensors(batch).repeat()
    # Seeded once: a new global seed after a step was traced makes tf.function trace it again (measured:
    # an 18 s "timed" step), and the two models need no identical weights to be timed.
    keras.utils.set_random_seed(config.seed)
    models, errors, warm_up = {}, {}, {}
    for policy in POLICIES:
        keras.config.set_dtype_policy(policy)
        started = time.perf_counter()
        try:
            model = build_training_model(config, VOCAB_SIZE, policy, batch)
            model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # traces (and compiles) the step
            warm_up[policy] = time.perf_counter() - started
        except Exception as error:  # noqa: BLE001 - only bf16 may fail as an answer; float32 re-raises
            if policy == "float32":
                raise
            first_line = (str(error).splitlines() or [""])[0][:300]
            errors[policy] = f"{type(error).__name__}: {first_line}"
            continue
        models[policy] = model
    keras.config.set_dtype_policy("float32")

    timers = {policy: _StepTimer() for policy in models}
    for _ in range(steps):
        for policy, model in models.items():
            model.fit(data, epochs=1, steps_per_epoch=1, verbose=0, callbacks=[timers[policy].callback])
    return {"seconds": {policy: timer.seconds for policy, timer in timers.items()}, "errors": errors,
            "warm_up_seconds": warm_up,
            "bucket_frames": int(batch["mel_length"][0]), "tensorflow": tf.__version__}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time train steps in float32 and mixed_bfloat16 on this CPU "
                                                 "(run by the CPU precision probe; prints one JSON line).")
    parser.add_argument("--config", help="resolved run config (YAML): its batch, accumulation and XLA are timed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="timed steps per policy after the warm-up")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps < 1:
        print(f"error: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # the parent shows stderr only when the child fails
    config = config_lib.load_config(args.config, overrides=args.set)
    result = time_policies(config, args.steps)
    print(json.dumps({"steps": args.steps, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
