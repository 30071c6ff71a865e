"""Real-time factor of a trained vocoder against Griffin-Lim on this machine, in turn in one process.

    python utilities/benchmark_vocoder.py --weights runs/vocoder/vocoder.weights.h5 --size base

A random log-mel of --frames frames; each vocoder traced once and warmed up, then called in turn;
median of --repeats. The real-time factor is seconds taken per second of audio (below 1: faster).
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
    parser.add_argument("--weights", required=True, help="vocoder.weights.h5 of utilities/train_vocoder.py")
    parser.add_argument("--size", default="base", choices=("tiny", "base"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    import numpy as np
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.models import griffin_lim
    from myxtts.models.vocoder import Vocoder

    d = load_config(args.config).data
    vocoder = Vocoder(d, args.size)
    vocoder.build()
    vocoder.load_weights(args.weights)
    neural = tf.function(lambda mel: vocoder(mel[None])[0], reduce_retracing=True)
    vocoders = {"vocoder": neural, "griffin-lim": lambda mel: griffin_lim.log_mel_to_audio(mel, d)}
    mel = tf.constant(np.random.default_rng(0).normal(-4.0, 2.0, (args.frames, d.n_mels)).astype(np.float32))
    for function in vocoders.values():
        function(mel)
    times = {name: [] for name in vocoders}
    for _ in range(args.repeats):
        for name, function in vocoders.items():
            start = time.perf_counter()
            function(mel).numpy()
            times[name].append(time.perf_counter() - start)
    seconds = (args.frames - 1) * d.hop_length / d.sample_rate
    print(f"{seconds:.2f} s of audio, median of {args.repeats} ({platform.processor() or platform.machine()})")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<12} {median:.3f} s: real-time factor {median / seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
