"""Sound quality of a vocoder by copy-synthesis: STOI, PESQ (wide band) and DNSMOS, offline.

    python utilities/measure_quality.py --corpus demo_corpus --clips 20
    python utilities/measure_quality.py --corpus other_corpus --clips 20 --json quality.json
    python utilities/measure_quality.py --corpus other_corpus --vocoder runs/demo/vocoder   # against Griffin-Lim

Each clip, as the feature pipeline sees it (resampled, trimmed, peak-normalised), is turned into the
model's log-mel and back into audio by Griffin-Lim (32 iterations, the floor) and by each --vocoder
folder (utilities/train_vocoder.py), then compared with itself (STOI, PESQ) and scored alone (DNSMOS,
with the recordings' own score beside it). The clips are spread evenly over the manifest, the same
clips for every vocoder. Needs `pip install -r requirements-quality.txt`; PESQ also needs `pip install pesq`
(it compiles C sources) and is reported as not measured without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--corpus", required=True, help="a corpus folder or manifest (as --train-data)")
    parser.add_argument("--config", default=None, help="a config whose data.* settings make the log-mel (default: the defaults)")
    parser.add_argument("--clips", type=int, default=20, help="clips to measure, spread over the manifest (default 20)")
    parser.add_argument("--vocoder", action="append", default=[], metavar="FOLDER",
                        help="a neural vocoder folder to measure beside Griffin-Lim (repeatable); its features "
                             "must be --config's")
    parser.add_argument("--wer", action="store_true",
                        help="also the word error rate of the copies and of the recordings (pocketsphinx, a language "
                             "model of the corpus's sentences; English only)")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from myxtts.output_paths import file_problem

    if args.json and (problem := file_problem(args.json, "--json")):
        parser.error(problem)  # now, not after the clips are measured

    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    from myxtts.config import load_config
    from myxtts.data.audio import DataProblem, named_data_problems
    from myxtts.data.manifest import read_manifest
    from myxtts.evaluation import quality
    from myxtts.models.vocoder import VocoderMismatch, load_vocoder, waveform_maker

    if args.clips < 1:
        parser.error("--clips must be at least 1")
    if missing := quality.missing_packages():
        parser.error(f"needs {', '.join(missing)}, not installed here: pip install -r requirements-quality.txt")
    try:
        config = load_config(args.config)
        rows = read_manifest(args.corpus)
    except (FileNotFoundError, ValueError) as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    makers = {"Griffin-Lim": None}
    for folder in args.vocoder:  # every folder checked before minutes of measuring
        try:
            makers[folder] = waveform_maker(config.data, load_vocoder(folder, config.data))
        except (FileNotFoundError, VocoderMismatch) as error:
            print(f"error: --vocoder {folder}: {error}", file=sys.stderr)
            return 2
    paths = quality.spread_clips(rows, args.clips)
    words = {}
    if args.wer:
        from myxtts.evaluation.intelligibility import IntelligibilityScorer, default_workers

        text_of = {row.audio_path: row.text for row in rows}
        scorer = IntelligibilityScorer(text_of.values(), config.data.language, workers=default_workers(len(paths)))
        if scorer.skipped:
            print(f"error: --wer: {scorer.skipped}", file=sys.stderr)
            return 2
        words = {"scorer": scorer, "texts": [text_of[path] for path in paths]}
    reports, recordings = {}, quality.RecordingScores()  # the recordings scored once
    for name, maker in makers.items():
        try:
            with named_data_problems():
                reports[name] = quality.measure_copy_synthesis(paths, config.data, vocoder=maker, label=name,
                                                               recordings=recordings, **words)
        except DataProblem as error:
            print(f"\nerror: {error}", file=sys.stderr)  # the reports above stay printed
            return 2
        print(reports[name].line(name))
    if args.json:
        Path(args.json).write_text(json.dumps({"corpus": str(args.corpus), "clips": paths,
                                               "vocoders": {name: vars(r) for name, r in reports.items()}},
                                              indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
