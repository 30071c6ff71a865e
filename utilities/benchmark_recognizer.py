"""The recognizer's decoding time for one validation: in this process against worker processes.

    python utilities/benchmark_recognizer.py --train-data demo_corpus                 # 24 clips, 1 vs the default
    python utilities/benchmark_recognizer.py --train-data demo_corpus --workers 1,2,4 --repeats 5

Each contender scores the same recordings (the corpus's first --clips) with a scorer built afresh, so
a pool's start is counted, taking turns within each repeat; prints the median wall time and the WER,
which must not depend on the workers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from myxtts.data.manifest import read_manifest
    from myxtts.evaluation.intelligibility import IntelligibilityScorer, default_workers, read_pcm16

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--train-data", required=True, help="corpus folder or manifest (16-bit WAV clips)")
    parser.add_argument("--clips", type=int, default=24, help="clips to decode (the demo validates 24)")
    parser.add_argument("--workers", default=None, help=f"comma-separated counts (default: 1,{default_workers()})")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    counts = [int(n) for n in (args.workers or f"1,{default_workers()}").split(",")]
    rows = read_manifest(args.train_data)
    clips = [(*read_pcm16(u.audio_path), u.text) for u in rows[: args.clips]]
    seconds = sum(len(a) / rate for a, rate, _ in clips)
    times, wers = {n: [] for n in counts}, {n: set() for n in counts}
    for _ in range(args.repeats):
        for n in counts:
            scorer = IntelligibilityScorer([u.text for u in rows], workers=n)
            start = time.perf_counter()
            result = scorer.score(iter(clips))
            times[n].append(time.perf_counter() - start)
            scorer.close()
            wers[n].add(round(result.wer, 6))
    print(f"{len(clips)} clips, {seconds:.1f} s of audio, median of {args.repeats} (a pool's start included)")
    for n in counts:
        print(f"  {n} worker{'s' if n > 1 else ' '}  {statistics.median(times[n]):6.1f} s  "
              f"{statistics.median(times[counts[0]]) / statistics.median(times[n]):.2f}x  "
              f"WER {', '.join(f'{w:.3f}' for w in sorted(wers[n]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
