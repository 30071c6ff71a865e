#!/usr/bin/env python3
"""Export a trained run for serving: a SavedModel, and with --tflite a TFLite model.

    python utilities/export_model.py --run runs/demo --out exported/demo [--checkpoint best_mel] [--tflite]

The SavedModel needs only TensorFlow to load (`tf.saved_model.load`, TF Serving): endpoints
reference_mel(wav_bytes), tokenize(phonemes) and synthesize(tokens, reference_mel, reference_length,
max_frames) -> audio, mel; the vocabulary and audio settings are in its assets/ folder. The TFLite
model (<out>/model.tflite) takes tokens and reference mels and returns mel and audio, built-in ops
only. Both speak through the run's neural vocoder when it has one (RUN/vocoder), else Griffin-Lim;
--vocoder FOLDER or --vocoder griffin-lim picks. See myxtts/export.py, and the README's "Serve it".
"""

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="training run folder (with config.yaml, vocab.txt, checkpoints/)")
    p.add_argument("--out", required=True, help="folder to write the SavedModel to: a new or empty folder, or an earlier export, which is "
                        "replaced; any other folder (the run, a corpus, ...) is refused and left untouched")
    p.add_argument("--checkpoint", default=None,
                   help="best_wer | best_mel | latest, or a checkpoint prefix (default: best_wer, else best_mel, else latest)")
    p.add_argument("--tflite", action="store_true", help="also write <out>/model.tflite")
    p.add_argument("--vocoder", default=None, metavar="FOLDER",
                   help="a vocoder folder (train_vocoder.py --output-dir) or griffin-lim (default: the run's own, else Griffin-Lim)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    from myxtts.export import export_run
    from myxtts.training.checkpoints import CheckpointError, error_line, find_checkpoint, is_disk_full

    run = Path(args.run)
    try:
        checkpoint = None
        if args.checkpoint in ("best_wer", "best_mel", "latest"):
            find_checkpoint(run / "checkpoints" / args.checkpoint)  # none there: said now
            # the folder, not the prefix found: a training running in the run replaces its checkpoints
            checkpoint = str(run / "checkpoints" / args.checkpoint)
        elif args.checkpoint:
            checkpoint = args.checkpoint
        export_run(run, args.out, checkpoint, tflite=args.tflite, vocoder=args.vocoder)
    except (FileNotFoundError, ValueError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # TensorFlow says RESOURCE_EXHAUSTED for a full disk: it read as out of memory
        if not is_disk_full(error):
            raise
        print(f"error: the disk is full: writing the export to {args.out} failed ({error_line(error)}). What it had "
              f"written is removed and an earlier export there is kept; free space and re-run", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
