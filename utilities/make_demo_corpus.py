"""Builds the embedded demo corpus: multi-speaker English speech synthesized with espeak-ng.

    python utilities/make_demo_corpus.py --out demo_corpus
    python utilities/make_demo_corpus.py --out other_corpus --voices other --seed 7 --num-utterances 100
    python utilities/make_demo_corpus.py --out many_corpus --voices many --num-utterances 900
    python utilities/make_demo_corpus.py --out heldout_corpus --voices heldout --seed 7 --num-utterances 160

Needs no network: espeak-ng and its voice data come with the `espeakng-loader` package.
Rerunning with the same arguments returns at once; see myxtts/data/demo_corpus.py.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

EPILOG = """\
voices (named sets, myxtts/data/demo_voices.py):
  demo:    the demo's five speakers:
{demo}
  other:   five American variants the demo never heard:
{other}
           for a corpus of other voices and sentences than the demo's (to see whether a model
           trained on the demo generalizes), with another --seed.
  many:    {num_many} voices, for training a model that must learn what a voice is (zero-shot
           cloning):
{many}
  heldout: {num_heldout} voices never in 'many' ('other' and four more), for evaluation only (cloning
           voices the model never heard, with another --seed):
{heldout}
  'many', 'heldout' and 'other' are American English (en-us plus an espeak-ng variant), whose spoken
  phonemes are the manifest's en-us phonemes one for one; each renders demo sentences within the
  1-12 s window. --num-utterances is spread over the voices in turn (900 over 'many' gives each
  voice about {per_voice}).
  A voice is an espeak-ng language code, optionally with a variant: LANG+VARIANT, the variant being
  a file of espeak-ng-data/voices/!v (names are case-sensitive; an unknown one is refused, since
  espeak-ng would silently speak the plain LANG voice). English bases include en-us, en (British),
  en-gb-x-rp, en-gb-scotland, en-029 and en-us-nyc; those other than en-us speak other phonemes
  than --language en-us's, so their timing files disagree with the manifest. "en-gb" is not a
  voice name (use en): en-gb+m3 fails.
"""


def _epilog(voice_sets: dict[str, tuple[str, ...]]) -> str:
    def listing(voices):
        return textwrap.fill(",".join(voices).replace(",", ", "), width=100, initial_indent=" " * 11,
                             subsequent_indent=" " * 11, break_long_words=False, break_on_hyphens=False)

    many, heldout = voice_sets["many"], voice_sets["heldout"]
    return EPILOG.format(
        demo=listing(voice_sets["demo"]), other=listing(voice_sets["other"]), many=listing(many),
        heldout=listing(heldout), num_many=len(many), num_heldout=len(heldout), per_voice=900 // len(many),
    )


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    from myxtts.data.demo_voices import VOICE_SETS, expand_voices

    parser = argparse.ArgumentParser(
        description=(
            "Synthesize the demo corpus with espeak-ng: wavs/<id>.wav at 22,050 Hz, a phoneme\n"
            "timing file beside each (wavs/<id>.timing.json) and manifest.jsonl (audio_path, text,\n"
            "speaker, duration, phonemes). The same arguments always give byte-identical files; an\n"
            "existing corpus built with the same arguments is kept as it is."
        ),
        epilog=_epilog(VOICE_SETS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("demo_corpus"),
                        help="directory to write the corpus into (default: %(default)s)")
    parser.add_argument("--num-utterances", type=int, default=400,
                        help="number of utterances, spread evenly over the voices (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the sentence generator; another seed gives other sentences (default: %(default)s)")
    parser.add_argument("--voices", default="demo",
                        help="comma-separated espeak-ng voices, one speaker each, names of the sets below ("
                             f"{', '.join(VOICE_SETS)}) and random:N, N voices with random pitch and formants "
                             "(en-us+rnd000...; e.g. many,random:150) (default: %(default)s)")
    parser.add_argument("--language", default="en-us",
                        help="espeak-ng language of the manifest's phonemes, the model's data.language (default: %(default)s)")
    parser.add_argument("--timing-hop", type=int, default=256,
                        help="hop length, in samples, the timing files count frames at (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=0,
                        help="worker processes; 0 uses every usable core (the bytes written do not depend on it; default: 0)")
    parser.add_argument("--quiet", action="store_true", help="do not print the progress line")
    arguments = parser.parse_args(argv)
    if arguments.num_utterances < 1:
        parser.error(f"--num-utterances must be at least 1, got {arguments.num_utterances}")
    if arguments.timing_hop < 1:
        parser.error(f"--timing-hop must be at least 1, got {arguments.timing_hop}")
    if arguments.workers < 0:
        parser.error(f"--workers must be >= 0, got {arguments.workers}")
    try:
        arguments.voices = expand_voices(arguments.voices)
    except ValueError as error:
        parser.error(str(error))
    if not arguments.voices:
        parser.error("--voices names no voice")
    return arguments


def main(argv: list[str] | None = None) -> int:
    # Lets `python utilities/make_demo_corpus.py` import the package from a checkout
    # without installing it.
    repository_root = str(Path(__file__).resolve().parent.parent)
    if repository_root not in sys.path:
        sys.path.insert(0, repository_root)
    arguments = parse_arguments(argv)
    from myxtts import output_paths
    from myxtts.data.demo_corpus import make_demo_corpus, total_audio_seconds

    start = time.monotonic()
    try:
        corpus_dir = make_demo_corpus(
            arguments.out, num_utterances=arguments.num_utterances, seed=arguments.seed,
            progress=not arguments.quiet, voices=arguments.voices, language=arguments.language,
            timing_hop_length=arguments.timing_hop, num_workers=arguments.workers or None,
        )
    except (RuntimeError, ValueError) as error:  # a voice espeak-ng cannot select, an unknown language, --out a file
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a folder it may not write to, a full disk
        print(f"error: {output_paths.write_failure(error, arguments.out, 'the corpus')}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - start
    total_seconds = total_audio_seconds(corpus_dir)
    print(
        f"Demo corpus: {corpus_dir.resolve()} ({arguments.num_utterances} utterances by "
        f"{len(arguments.voices)} voices, {total_seconds / 60:.1f} min of audio, ready in {elapsed:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
