"""The measuring side of the batch-size probe: real train steps at one batch size, in a child process.

    python -m myxtts.training.batch_probe --config run.yaml --batch-size N [--precision P]
        [--accumulation A] [--vocab-size V] [--xla] [--device GPU:0]
    -> one JSON line {"batch_size", "oom": false, "peak_bytes", "samples_per_s", "first_step_s"}
       or {"batch_size", "oom": true, "error"}

`myxtts.hardware.probe_runner` starts one such process per batch size (the trainer names this module
to it) and fits and chooses from the lines. The child builds the real network and optimizer at the
longest bucket (the batch shape that needs the most memory) and runs full train steps, optimizer
update included, through `Model.fit` as training does: the first step compiles, the peak (TensorFlow's
allocator peak on the device) covers every step, the throughput only the steps after the first.

`MYXTTS_PROBE_FAKE` (JSON: intercept_bytes, bytes_per_sample, oom_above, step_overhead_s,
seconds_per_sample) makes the child report a synthetic machine without importing TensorFlow, so the
whole path (process, JSON, fit, choice, cache) is tested on machines without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Mapping, Sequence

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.hardware.probe import ProbeOutOfMemory, is_out_of_memory

FAKE_ENV = "MYXTTS_PROBE_FAKE"
DEFAULT_VOCAB_SIZE = 256  # the parent passes its own (probe_runner.PROBE_VOCAB_SIZE)
MEASURED_STEPS = 3  # after one compiling step; enough for a stable mean, short enough to probe 6 sizes


def synthetic_batch(config: Config, batch_size: int, vocab_size: int = DEFAULT_VOCAB_SIZE, bucket: int = -1) -> dict:
    """A batch of one bucket (the longest by default), every clip at full length, shaped as the
    pipeline's batches."""
    import tensorflow as tf

    d = config.data
    frames, tokens = d.bucket_mel_lengths[bucket], d.bucket_text_lengths[bucket]
    generator = tf.random.Generator.from_seed(config.seed)
    batch = {
        "mel_length": tf.fill([batch_size], frames),
        "tokens": generator.uniform([batch_size, tokens], 4, vocab_size, dtype=tf.int32),  # past the special ids
        "text_length": tf.fill([batch_size], tokens),
        "reference_mel": generator.normal([batch_size, d.reference_frames, d.n_mels], mean=-5.0),
        "reference_length": tf.fill([batch_size], d.reference_frames),
    }
    if d.mel_on_device:
        # Waveforms padded to (frames - 1) * hop samples, as the pipeline pads a bucket (see mel_from_audio).
        batch["audio"] = 0.1 * generator.normal([batch_size, (frames - 1) * d.hop_length])
    else:
        batch["mel"] = generator.normal([batch_size, frames, d.n_mels], mean=-5.0)  # [batch, frames, n_mels]
    return batch


def measure(config: Config, batch_size: int, *, precision: str = "float32", xla: bool = False,
            accumulation: int = 1, vocab_size: int = DEFAULT_VOCAB_SIZE, device: str = "GPU:0",
            steps: int = MEASURED_STEPS) -> tuple[int, float, float]:
    """(peak bytes on `device`, samples/s, seconds of the first step) of full train steps at
    `batch_size` and the longest bucket. The first step includes tracing and, with `xla`, compiling.

    Raises TensorFlow's ResourceExhaustedError (or whatever TensorFlow raises) when it does not fit;
    the CLI below turns an out-of-memory into {"oom": true}.
    """
    import keras
    import tensorflow as tf

    from myxtts.models.xtts import network_for
    from myxtts.training.optimizers import build_optimizer
    from myxtts.training.step import TrainingModel

    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(config.seed)
    batch = synthetic_batch(config, batch_size, vocab_size)
    model = TrainingModel(network_for(config, vocab_size), data_config=config.data)
    optimizer = build_optimizer(config.training, accumulation)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, jit_compile=xla)
    # Variables first, as the trainer does: the step applies gradients under tf.cond, where none can be made.
    model(batch, training=False)
    optimizer.build(model.network.trainable_variables)
    data = tf.data.Dataset.from_tensors(batch).repeat()

    tf.config.experimental.reset_memory_stats(device)
    started = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # builds, traces and compiles
    first_step_s = time.perf_counter() - started
    started = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    elapsed = time.perf_counter() - started
    peak = int(tf.config.experimental.get_memory_info(device)["peak"])
    return peak, steps * batch_size / elapsed, first_step_s


def fake_measure(spec: Mapping[str, float], batch_size: int) -> tuple[int, float, float]:
    """A synthetic machine: peak = intercept + per-sample bytes x batch, OOM above `oom_above`, and a
    step time of overhead + per-sample time x batch (so throughput saturates, as on a GPU)."""
    if batch_size > spec["oom_above"]:
        raise ProbeOutOfMemory(f"fake: batch {batch_size} > {spec['oom_above']}")
    peak = int(spec["intercept_bytes"] + spec["bytes_per_sample"] * batch_size)
    step_s = spec["step_overhead_s"] + spec["seconds_per_sample"] * batch_size
    return peak, batch_size / step_s, step_s


def run_one(args: argparse.Namespace) -> dict:
    """The child's whole job; OOM is an answer, any other error is not (it propagates)."""
    fake = os.environ.get(FAKE_ENV)
    try:
        if fake:
            peak, throughput, first_step_s = fake_measure(json.loads(fake), args.batch_size)
        else:
            config = config_lib.load_config(args.config, overrides=args.set)
            peak, throughput, first_step_s = measure(config, args.batch_size, precision=args.precision, xla=args.xla,
                                       accumulation=args.accumulation, vocab_size=args.vocab_size, device=args.device)
    except Exception as error:  # noqa: BLE001 - only out-of-memory becomes a result; the rest re-raises
        if not is_out_of_memory(error):
            raise
        return {"batch_size": args.batch_size, "oom": True, "error": str(error).splitlines()[0][:300]}
    return {"batch_size": args.batch_size, "oom": False, "peak_bytes": peak, "samples_per_s": throughput,
            "first_step_s": round(first_step_s, 3)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure peak memory and samples/s of train steps at one batch size "
                                                 "(run by probe_batch_size; prints one JSON line).")
    parser.add_argument("--config", help="resolved run config (YAML)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--precision", default="float32", help="Keras dtype policy, e.g. mixed_bfloat16")
    parser.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps (adds accumulators)")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="text vocabulary of the probed network")
    parser.add_argument("--xla", action="store_true", help="compile the step with XLA, as training will")
    parser.add_argument("--device", default="GPU:0", help="device whose memory is measured")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.batch_size < 1:
        print(f"error: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        return 2
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # the parent shows stderr only when the child fails
    if args.device.upper().startswith("CPU"):
        # TensorFlow's plain CPU allocator keeps no statistics ("Cannot reset memory stats for device
        # 'CPU:0'"); its BFC allocator does. Where oneDNN is on (CPUs with AVX-512) its allocator kept
        # them anyway, which hid this until a CPU without AVX-512 ran the probe. Read at TensorFlow's start.
        os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    print(json.dumps(run_one(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
