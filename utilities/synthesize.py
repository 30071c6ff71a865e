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

With --reference-text (the words of each --reference clip, in order) the voice is fitted rather than
read: the encoder's voice of the clips, then --fit-steps updates of that one vector until the model
speaks those very clips closest to how they were recorded, the model itself unchanged
(myxtts/models/voice_fit.py). On voices a model never heard it came closer to them than one pass of
the encoder (BENCHMARKS.md, "Voices the model never heard"). --fit-head also fits the model's last
layer to the clips, for this voice alone: closer still, at the cost of some words.
"""

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run folder (with config.yaml and vocab.txt) or checkpoint prefix")
    p.add_argument("--text", required=True, help="what to say, in the run's data.language; several sentences are spoken one by one, "
                   "0.3 s apart")
    p.add_argument("--reference", required=True, action="append", help="16-bit WAV of the target voice (repeatable)")
    p.add_argument("--reference-text", action="append", default=[], metavar="TEXT",
                   help="the words of a --reference clip (one per clip, in order): the voice is then fitted to the "
                        "clips, a few seconds a clip, instead of read from them in one pass (see below)")
    p.add_argument("--fit-steps", type=int, default=200, metavar="N",
                   help="updates of the voice when fitting it (default 200)")
    # const is voice_fit.DEFAULT_HEAD_RIDGE, written out: --help stays quick, without importing TensorFlow.
    p.add_argument("--fit-head", nargs="?", type=float, const=3.0, default=None, metavar="RIDGE",
                   help="with --reference-text, also fit the model's last layer (the mel head) to the clips, for "
                        "this voice alone: closer to the voice, a few more words wrong (RIDGE, default 3: larger "
                        "keeps the trained head closer)")
    p.add_argument("--out", default="out.wav", help="output WAV path (default out.wav)")
    p.add_argument("--drop-unknown", action="store_true",
                   help="leave out phonemes (characters) the run never trained on, and say which, instead of stopping")
    p.add_argument("--vocoder", default=None, metavar="FOLDER",
                   help="a vocoder folder (train_vocoder.py --output-dir) or griffin-lim (default: the run's own, else Griffin-Lim)")
    p.add_argument("--benchmark", action="store_true", help="synthesize twice (the first call compiles) and print the real-time factor")
    args = p.parse_args(argv)
    if args.fit_steps < 1:
        p.error(f"--fit-steps must be at least 1, got {args.fit_steps}")
    if args.fit_head is not None and (not args.reference_text or args.fit_head <= 0):
        p.error("--fit-head needs --reference-text (the words of each clip) and a RIDGE above 0")

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from myxtts.output_paths import file_problem

    if problem := file_problem(args.out, "--out", "out.wav"):
        p.error(problem)  # now, not after the model has spoken
    if any(Path(args.out).resolve() == Path(clip).resolve() for clip in args.reference):
        p.error(f"--out {args.out} is a --reference clip: the speech would be written over that recording; "
                "give another --out")
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    from myxtts.synthesis import Synthesizer
    from myxtts.training.checkpoints import CheckpointError

    run = Path(args.checkpoint)
    run_dir = next((p for p in (run, *run.parents) if (p / "config.yaml").exists()), run)
    try:  # below the run folder: one of its checkpoint folders, or a prefix
        synthesizer = Synthesizer.from_run(run_dir, None if run == run_dir else str(run), vocoder=args.vocoder)
        voice = None
        if args.reference_text:
            synthesizer.tokens(args.text, args.drop_unknown)  # a symbol the run never saw is named now, not after the fit
            voice = synthesizer.fitted_voice(args.reference, args.reference_text, steps=args.fit_steps,
                                             head_ridge=args.fit_head)
            what = "voice and mel head" if args.fit_head is not None else "voice"
            print(f"{what} fitted to {len(args.reference)} clip(s): their mel loss {voice.loss_before:.3f} -> "
                  f"{voice.loss_after:.3f}", file=sys.stderr)
        result = synthesizer.synthesize_to_file(args.text, args.reference, args.out, drop_unknown=args.drop_unknown,
                                                voice=voice)
        if args.benchmark:  # the first call traced the synthesis graph; time a warm one
            result = synthesizer.synthesize_to_file(args.text, args.reference, args.out, drop_unknown=args.drop_unknown,
                                                    voice=voice)
    except (OSError, ValueError, CheckpointError) as error:  # OSError: a missing file, or --out not written
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result["dropped"]:
        print(f"warning: left out {len(result['dropped'])} symbols the run never trained on: "
              f"{' '.join(sorted(set(result['dropped'])))}", file=sys.stderr)
    print(json.dumps(result) if args.benchmark else f"wrote {result['out']} ({result['audio_seconds']:.2f} s of audio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
