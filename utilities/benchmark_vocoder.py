"""The vocoder's speed on this machine, each contender in turn in one process, medians of --repeats.

    python utilities/benchmark_vocoder.py --vocoder runs/demo/vocoder        # real-time factor vs Griffin-Lim
    python utilities/benchmark_vocoder.py --train                            # a train step: sizes x XLA
    python utilities/benchmark_vocoder.py --train --discriminator --sizes small   # without / with the discriminator
    python utilities/benchmark_vocoder.py --train --precisions float32,mixed_bfloat16   # in each dtype policy
    python utilities/benchmark_vocoder.py --train --phase-prior --sizes small   # without / with the Griffin-Lim phase prior

Real-time factor: a random log-mel of --frames frames through the vocoder folder's network and
through Griffin-Lim, each traced once and warmed up, then called in turn; seconds taken per second
of audio (below 1: faster than real time). --train: one optimizer update of `VocoderTrainer` on a
batch of random waveforms (--batch-size segments of --segment-frames frames), for each size with
and without XLA (`jit_compile`), each compiled and warmed up first, then timed in turn; with
--discriminator, for each size in graph mode without and with the spectrogram discriminator
(`adversarial_weight`, its own update included) instead; with --precisions, for each size in
graph mode (with --xla: XLA) under each Keras dtype policy (mixed_float16 with loss scaling) instead;
with --phase-prior, for each size in graph mode without and with the Griffin-Lim phase prior (its
phase read from the batch, as training reads it from the clips it found it for once) instead.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--vocoder", help="a vocoder folder (utilities/train_vocoder.py --output-dir)")
    parser.add_argument("--train", action="store_true", help="time train steps instead")
    parser.add_argument("--sizes", default="small,base", help="--train: sizes to time, comma-separated")
    parser.add_argument("--discriminator", action="store_true",
                        help="--train: time each size without and with the discriminator (graph mode) instead of x XLA")
    parser.add_argument("--precisions", default=None, metavar="POLICIES",
                        help="--train: time each size in graph mode under these Keras dtype policies instead of x XLA "
                             "(comma-separated: float32,mixed_bfloat16,mixed_float16)")
    parser.add_argument("--xla", action="store_true", help="--precisions: compile each with XLA instead of graph mode")
    parser.add_argument("--phase-prior", action="store_true",
                        help="--train: time each size in graph mode without and with the Griffin-Lim phase prior instead")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--segment-frames", type=int, default=32)
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if bool(args.vocoder) == args.train:
        parser.error("give --vocoder FOLDER (real-time factor) or --train (train steps)")
    sys.path.insert(0, str(ROOT))

    from myxtts.config import load_config

    d = load_config(args.config).data
    try:
        contenders = train_steps(d, args) if args.train else real_time(d, args)
    except (FileNotFoundError, ValueError) as error:  # not a vocoder folder, or one that does not load: named
        print(f"error: {error}", file=sys.stderr)
        return 2
    times = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, function in contenders.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    print(f"median of {args.repeats} ({platform.processor() or platform.machine()})")
    seconds = (args.frames - 1) * d.hop_length / d.sample_rate
    for name, values in times.items():
        median = statistics.median(values)
        extra = f"real-time factor {median / seconds:.3f} ({seconds:.2f} s of audio)" if not args.train else "per update"
        print(f"  {name:<22} {median * 1000:8.1f} ms  {extra}")
    return 0


def real_time(d, args) -> dict:
    import numpy as np
    import tensorflow as tf

    from myxtts.models import griffin_lim
    from myxtts.models.vocoder import load_vocoder, waveform_maker

    mel = tf.constant(np.random.default_rng(0).normal(-4.0, 2.0, (args.frames, d.n_mels)).astype(np.float32))
    makers = {"vocoder": waveform_maker(d, load_vocoder(args.vocoder, d)),
              "griffin-lim": lambda m: griffin_lim.log_mel_to_audio(m, d)}
    for maker in makers.values():
        maker(mel)
    return {name: (lambda maker=maker: maker(mel).numpy()) for name, maker in makers.items()}


def train_steps(d, args) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from myxtts.models.vocoder import Vocoder
    from myxtts.training.vocoder_step import VocoderTrainer

    samples = args.segment_frames * d.hop_length * 2
    rng = np.random.default_rng(0)
    batch = {"audio": tf.constant(rng.normal(0, 0.1, (args.batch_size, samples)).astype(np.float32)),
             "mel_length": tf.fill([args.batch_size], samples // d.hop_length)}
    frames = samples // d.hop_length + 1
    with_prior = {**batch, "mel": tf.constant(rng.normal(-4.0, 2.0, (args.batch_size, frames, d.n_mels)).astype(np.float32)),
                  "phase": tf.constant(rng.uniform(-np.pi, np.pi, (args.batch_size, frames, d.n_fft // 2 + 1)), tf.float16)}
    contenders = {}
    if args.precisions:
        variants = [(args.xla, 0.0, policy, "none") for policy in args.precisions.split(",")]
    elif args.discriminator:
        variants = ((False, 0.0, "float32", "none"), (False, 0.02, "float32", "none"))
    elif args.phase_prior:
        variants = ((False, 0.0, "float32", "none"), (False, 0.0, "float32", "griffin-lim"))
    else:
        variants = ((False, 0.0, "float32", "none"), (True, 0.0, "float32", "none"))
    for size in args.sizes.split(","):
        for jit, adversarial, policy, prior in variants:
            keras.config.set_dtype_policy(policy)
            optimizers = [keras.optimizers.AdamW(1e-4), keras.optimizers.AdamW(2e-4)]
            if policy == "mixed_float16":
                optimizers = [keras.optimizers.LossScaleOptimizer(o) for o in optimizers]
            trainer = VocoderTrainer(Vocoder(d, size=size, phase_prior=prior), segment_frames=args.segment_frames,
                                     adversarial_weight=adversarial, discriminator_optimizer=optimizers[1])
            trainer.compile(optimizer=optimizers[0], jit_compile=jit)
            trainer.build_for_training()  # the step calls the vocoder's parts, not the vocoder: it is built here
            trainer.make_train_function()
            step = trainer.train_function
            iterator = iter(tf.data.Dataset.from_tensors(with_prior if prior != "none" else batch).repeat())
            step(iterator)  # compile
            name = (f"{size} ({trainer.vocoder.count_params() / 1e6:.1f} M), {'XLA' if jit else 'graph'}"
                    + (", discriminator" if adversarial else "") + (f", {policy}" if args.precisions else "")
                    + (f", phase prior {prior}" if args.phase_prior else ""))
            contenders[name] = lambda step=step, iterator=iterator: float(step(iterator)["loss"])
    keras.config.set_dtype_policy("float32")
    return contenders


if __name__ == "__main__":
    sys.exit(main())
