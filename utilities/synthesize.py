#!/usr/bin/env python3
"""Speak text in the voice of a reference clip with a trained MyXTTS run.

    python utilities/synthesize.py --checkpoint runs/demo --text "Hello there." --reference voice.wav --out out.wav

--checkpoint takes a run folder (uses best_wer, else best_mel, else latest), one of its checkpoint
folders (runs/demo/checkpoints/latest) or a checkpoint prefix. The text is
phonemized as in training, with the run's data.text_frontend and data.language. Several
--reference clips of one voice are averaged into one voice. --benchmark prints the real-time factor.
The audio comes from the run's neural vocoder when it has one (RUN/vocoder, written by
utilities/train_vocoder.py --run RUN; else the config's training.vocoder), else from Griffin-Lim;
--vocoder FOLDER or --vocoder griffin-lim picks.
A phoneme the run never trained on is an error naming it (the model would read it as <unk>);
--drop-unknown leaves such phonemes out instead, and says which.
"""

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run folder (with config.yaml and vocab.txt) or checkpoint prefix")
    p.add_argument("--text", required=True, help="what to say, in the run's data.language")
    p.add_argument("--reference", required=True, action="append", help="16-bit WAV of the target voice (repeatable)")
    p.add_argument("--out", default="out.wav", help="output WAV path (default out.wav)")
    p.add_argument("--drop-unknown", action="store_true",
                   help="leave out phonemes (characters) the run never trained on, and say which, instead of stopping")
    p.add_argument("--vocoder", default=None, metavar="FOLDER",
                   help="a vocoder folder (train_vocoder.py --output-dir) or griffin-lim (default: the run's own, else Griffin-Lim)")
    p.add_argument("--benchmark", action="store_true", help="synthesize twice (the first call compiles) and print the real-time factor")
    args = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    from myxtts.synthesis import Synthesizer
    from myxtts.training.checkpoints import CheckpointError

    run = Path(args.checkpoint)
    run_dir = next((p for p in (run, *run.parents) if (p / "config.yaml").exists()), run)
    try:  # below the run folder: one of its checkpoint folders, or a prefix
        synthesizer = Synthesizer.from_run(run_dir, None if run == run_dir else str(run), vocoder=args.vocoder)
        result = synthesizer.synthesize_to_file(args.text, args.reference, args.out, drop_unknown=args.drop_unknown)
        if args.benchmark:  # the first call traced the synthesis graph; time a warm one
            result = synthesizer.synthesize_to_file(args.text, args.reference, args.out, drop_unknown=args.drop_unknown)
    except (FileNotFoundError, ValueError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result["dropped"]:
        print(f"warning: left out {len(result['dropped'])} symbols the run never trained on: "
              f"{' '.join(sorted(set(result['dropped'])))}", file=sys.stderr)
    print(json.dumps(result) if args.benchmark else f"wrote {result['out']} ({result['audio_seconds']:.2f} s of audio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
