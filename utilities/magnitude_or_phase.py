"""Where copy-synthesis loses quality: the magnitude or the phase (issue 27).

    python utilities/magnitude_or_phase.py --corpus demo_corpus --clips 10
    python utilities/magnitude_or_phase.py --corpus other_corpus --clips 20 --vocoder runs/demo/vocoder

Each clip (as `measure_quality.py` picks and prepares them) is rebuilt from every mix of a magnitude
-- the log-mel's pseudo-inverse ("prior", what Griffin-Lim and the vocoder start from), the clip's own
("true"), and the --vocoder's -- with a phase -- Griffin-Lim's from a random start, the clip's own, and
the vocoder's -- and compared with the clip (PESQ wide band when `pesq` is installed, STOI). "prior
magnitude, Griffin-Lim phase" is the Griffin-Lim floor; "prior magnitude, true phase" is the most a
perfect phase can do for the mel's own magnitude; "true magnitude, true phase" gives the clip back.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--corpus", required=True, help="a corpus folder or manifest (as --train-data)")
    parser.add_argument("--config", default=None, help="a config whose data.* settings make the log-mel (default: the defaults)")
    parser.add_argument("--clips", type=int, default=20, help="clips to measure, spread over the manifest (default 20)")
    parser.add_argument("--vocoder", default=None, metavar="FOLDER", help="a neural vocoder folder whose magnitude and phase to mix in")
    parser.add_argument("--iterations", type=int, default=32, help="Griffin-Lim iterations (default 32, as everywhere else)")
    parser.add_argument("--json", default=None, help="also write the means per mix here")
    args = parser.parse_args(argv)
    if args.clips < 1 or args.iterations < 1:
        parser.error("--clips and --iterations must be at least 1")
    sys.path.insert(0, str(ROOT))
    from myxtts.output_paths import file_problem

    if args.json and (problem := file_problem(args.json, "--json")):
        parser.error(problem)  # now, not after the clips are measured

    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    import numpy as np

    from myxtts.config import load_config
    from myxtts.data.audio import DataProblem, named_data_problems
    from myxtts.data.manifest import read_manifest
    from myxtts.evaluation import quality
    from myxtts.evaluation.speech import trimmed_clip
    from myxtts.models.vocoder import load_vocoder

    try:
        config = load_config(args.config)
        rows = read_manifest(args.corpus)
        vocoder = load_vocoder(args.vocoder, config.data) if args.vocoder else None
    except (FileNotFoundError, ValueError) as error:  # ConfigError and VocoderMismatch are ValueErrors
        print(f"error: {error}", file=sys.stderr)
        return 2
    paths = quality.spread_clips(rows, args.clips)
    rate = config.data.sample_rate
    scores, started = {}, time.monotonic()
    for number, path in enumerate(paths, 1):
        try:
            with named_data_problems():
                recording, _ = trimmed_clip(path, config.data)
                mixes = quality.spectrum_mixes(recording, config.data, vocoder, args.iterations)
        except DataProblem as error:
            print(f"\nerror: {error}", file=sys.stderr)
            return 2
        recording = np.asarray(recording, np.float32)
        for name, samples in mixes.items():
            n = min(len(recording), len(samples))
            scores.setdefault(name, []).append((quality.pesq_wb(recording[:n], samples[:n], rate),
                                                quality.stoi(recording[:n], samples[:n], rate)))
        elapsed = time.monotonic() - started
        print(f"\r{number}/{len(paths)} clips, ETA {elapsed / number * (len(paths) - number):.0f} s",
              end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    means = {}
    for name, pairs in scores.items():
        pesqs = [p for p, _ in pairs]
        means[name] = {"pesq": None if None in pesqs else float(np.mean(pesqs)), "stoi": float(np.mean([s for _, s in pairs]))}
        pesq_text = "not measured (pip install pesq)" if means[name]["pesq"] is None else f"{means[name]['pesq']:.2f}"
        print(f"{name:40s} PESQ-WB {pesq_text}  STOI {means[name]['stoi']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"corpus": str(args.corpus), "clips": paths, "vocoder": args.vocoder,
                                               "iterations": args.iterations, "mixes": means}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
