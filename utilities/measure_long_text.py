"""A paragraph spoken whole against spoken a sentence at a time: words heard in each.

    python utilities/measure_long_text.py --run runs/voices --paragraphs 3 --sentences 8

Joins the run's first validation sentences into paragraphs of --sentences each and speaks every
paragraph in the voice of its first sentence's recording twice: as one sequence of tokens (what
synthesis did before it split text into sentences) and through `Synthesizer.synthesize`, which
speaks each sentence alone and joins them with a pause. Both go through the run's vocoder and the
same recognizer (a language model of the paragraphs' sentences); prints each paragraph's length,
time and WER.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a training run folder (its --output-dir)")
    parser.add_argument("--paragraphs", type=int, default=3, help="paragraphs to speak (default %(default)s)")
    parser.add_argument("--sentences", type=int, default=8, help="validation sentences a paragraph (default %(default)s)")
    args = parser.parse_args(argv)
    if args.paragraphs < 1 or args.sentences < 1:
        parser.error(f"--paragraphs and --sentences must be at least 1, got {args.paragraphs} and {args.sentences}")
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    from myxtts.data.splits import load_splits
    from myxtts.evaluation.intelligibility import Recognizer, word_error_rate
    from myxtts.models.inference import generate
    from myxtts.synthesis import Synthesizer

    try:
        synthesizer = Synthesizer.from_run(args.run)
        _, val_rows = load_splits(synthesizer.config)  # the run's corpus, where its config says it is
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = val_rows[: args.paragraphs * args.sentences]
    if len(rows) < args.paragraphs * args.sentences:
        print(f"error: the run's validation split has {len(val_rows)} sentences, fewer than "
              f"{args.paragraphs} x {args.sentences}", file=sys.stderr)
        return 2
    recognizer = Recognizer([u.text for u in rows])
    rate = synthesizer.config.data.sample_rate

    def whole(text, reference):  # the text as one sequence of tokens
        tokens, _ = synthesizer.tokens(text)
        mel, length = generate(synthesizer.network, tokens, *synthesizer.reference([reference]))
        return synthesizer.to_audio(mel[0, : int(length[0])]).numpy()

    def by_sentence(text, reference):
        return synthesizer.synthesize(text, [reference])[0].numpy()

    print("| paragraph | spoken | audio s | synthesis s | WER |")
    print("|---|---|---|---|---|")
    for number in range(args.paragraphs):
        group = rows[number * args.sentences:(number + 1) * args.sentences]
        text = " ".join(u.text for u in group)
        for name, speak in (("whole", whole), ("a sentence at a time", by_sentence)):
            speak(text, group[0].audio_path)  # traced for these shapes first: the second call is timed
            start = time.perf_counter()
            audio = speak(text, group[0].audio_path)
            took = time.perf_counter() - start
            heard = recognizer.transcribe(audio, rate)
            print(f"| {number + 1} ({len(text.split())} words) | {name} | {len(audio) / rate:.1f} | {took:.1f} | "
                  f"{word_error_rate([text], [heard]):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
