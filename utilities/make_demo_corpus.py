"""Builds the embedded demo corpus: multi-speaker English speech synthesized with espeak-ng.

    python utilities/make_demo_corpus.py --out demo_corpus

Needs no network: espeak-ng and its voice data come with the `espeakng-loader` package.
Rerunning with the same arguments returns at once; see myxtts/data/demo_corpus.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Synthesize the demo corpus (LJSpeech layout: wavs/<id>.wav at 22,050 Hz and "
            "metadata.csv with id|text|normalized_text|speaker) with espeak-ng. "
            "The same arguments always give byte-identical files; an existing corpus built "
            "with the same arguments is kept as it is."
        )
    )
    parser.add_argument("--out", type=Path, default=Path("demo_corpus"),
                        help="directory to write the corpus into (default: %(default)s)")
    parser.add_argument("--num-utterances", type=int, default=400,
                        help="number of utterances, spread evenly over five voices (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the sentence generator; another seed gives other sentences (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="do not print the progress line")
    arguments = parser.parse_args(argv)
    if arguments.num_utterances < 1:
        parser.error(f"--num-utterances must be at least 1, got {arguments.num_utterances}")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    # Lets `python utilities/make_demo_corpus.py` import the package from a checkout
    # without installing it.
    repository_root = str(Path(__file__).resolve().parent.parent)
    if repository_root not in sys.path:
        sys.path.insert(0, repository_root)
    from myxtts.data.demo_corpus import make_demo_corpus, total_audio_seconds

    start = time.monotonic()
    corpus_dir = make_demo_corpus(
        arguments.out, num_utterances=arguments.num_utterances, seed=arguments.seed, progress=not arguments.quiet
    )
    elapsed = time.monotonic() - start
    total_seconds = total_audio_seconds(corpus_dir)
    print(
        f"Demo corpus: {corpus_dir.resolve()} ({arguments.num_utterances} utterances, "
        f"{total_seconds / 60:.1f} min of audio, ready in {elapsed:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
