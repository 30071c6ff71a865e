"""Griffin-Lim as `log_mel_to_audio` runs it now (one traced function per setting) against the same
function called eagerly, as it ran before: seconds per clip, in turn in one process.

    python utilities/benchmark_griffin_lim.py --repeats 7

Random log-mels of the default config's shape, at a few lengths (frames); the traced version's
first call per new shape includes its tracing and is printed apart. Both must give the same samples.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--frames", default="250,300,410", help="clip lengths in mel frames")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    import numpy as np
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.models import griffin_lim

    d = load_config().data
    rng = np.random.default_rng(0)

    def eager(log_mel):  # the module's own ops, run one by one from Python (its behaviour before)
        return griffin_lim.griffin_lim(griffin_lim.mel_to_magnitude(log_mel, d), d)

    print(f"Griffin-Lim, 32 iterations, {d.n_mels} bands, median of {args.repeats} "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    for frames in (int(f) for f in args.frames.split(",")):
        log_mel = tf.constant(rng.normal(-4.0, 2.0, (frames, d.n_mels)).astype(np.float32))
        start = time.perf_counter()
        traced_samples = griffin_lim.log_mel_to_audio(log_mel, d).numpy()
        first = time.perf_counter() - start
        np.testing.assert_array_equal(traced_samples, eager(log_mel).numpy())
        times = {"eager": [], "traced": []}
        for _ in range(args.repeats):
            for name, function in (("eager", eager), ("traced", lambda x: griffin_lim.log_mel_to_audio(x, d))):
                start = time.perf_counter()
                function(log_mel).numpy()
                times[name].append(time.perf_counter() - start)
        e, t = statistics.median(times["eager"]), statistics.median(times["traced"])
        print(f"  {frames} frames: eager {e:.3f} s, traced {t:.3f} s ({e / t:.1f}x; its first call {first:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
