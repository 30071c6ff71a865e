"""Train the neural vocoder (myxtts/models/vocoder.py) on a corpus, then measure it against Griffin-Lim.

    python utilities/train_vocoder.py --train-data demo_corpus --output-dir runs/vocoder --steps 2000

Waveform batches come from the project's own pipeline (`data.mel_on_device`: the clips decoded,
trimmed, normalised and bucketed natively, as training reads them); each step vocodes the log-mel of
a random segment of every clip and compares it with the segment. Keras' `BackupAndRestore` keeps an
interrupted run resumable: the same command continues from its last backup (every 50 steps; a run
that finished removes its backup, and the same command then starts over). The weights are written to
OUTPUT/vocoder.weights.h5 at the end. Then copy-synthesis of the validation clips through the vocoder
and through Griffin-Lim is measured (STOI, PESQ-WB when `pesq` is installed, DNSMOS; see
utilities/measure_quality.py) and written to OUTPUT/quality.json.

Issue 27, started: the vocoder is not yet used by synthesis, validation, the demo or the export.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--train-data", required=True, help="corpus folder or manifest")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="data.* settings (the features)")
    parser.add_argument("--size", default="base", choices=("tiny", "base"))
    parser.add_argument("--steps", type=int, default=2000, help="optimizer updates in all (a resumed run trains up to it)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--segment-frames", type=int, default=32, help="mel frames per training segment")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--quality-clips", type=int, default=10, help="validation clips to measure at the end (0: none)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    import keras
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.data.pipeline import Epochs, build_vocabulary
    from myxtts.data.splits import load_splits
    from myxtts.evaluation import quality
    from myxtts.models.vocoder import Vocoder, VocoderTrainer
    from myxtts.training.optimizers import FusedAdamW, WarmupHoldDecay

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(args.config, overrides=[f"data.train_data={args.train_data}", "data.mel_on_device=true",
                                                 f"data.batch_size={args.batch_size}", *args.set])
    train_rows, val_rows = load_splits(config)
    vocabulary = build_vocabulary(train_rows + val_rows, config.data)
    stream = Epochs(config, train_rows, training=True, vocabulary=vocabulary).stream()
    stream = stream.map(lambda batch: {"audio": batch["audio"], "mel_length": batch["mel_length"]})

    keras.utils.set_random_seed(config.seed)
    vocoder = Vocoder(config.data, size=args.size)
    trainer = VocoderTrainer(vocoder, segment_frames=args.segment_frames)
    schedule = WarmupHoldDecay(args.learning_rate, min(100, args.steps // 10), args.steps, decay_steps=args.steps // 2)
    trainer.compile(optimizer=FusedAdamW(schedule, beta_1=0.8, beta_2=0.99, weight_decay=0.01, global_clipnorm=1.0),
                    jit_compile=False)
    trainer(tf.zeros([1, args.segment_frames, config.data.n_mels]))  # variables exist before a backup is restored
    trainer.optimizer.build(vocoder.trainable_variables)
    print(f"vocoder {args.size}: {vocoder.count_params():,} parameters; "
          f"{len(train_rows)} training clips, segments of {args.segment_frames} frames, batch {args.batch_size}")

    interval = 50  # updates per Keras epoch: the progress line and the backup come this often

    class Progress(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after BackupAndRestore (listed first) restored the run
            self.first, self.started = int(self.model.optimizer.iterations), time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            done = (epoch + 1) * interval
            rate = (time.monotonic() - self.started) / max(done - self.first, 1)
            print(f"step {done}/{args.steps}  loss {logs['loss']:.3f} (mel {logs['mel_loss']:.3f} stft {logs['stft_loss']:.3f})"
                  f"  {rate * 1000:.0f} ms/step  ETA {time.strftime('%H:%M:%S', time.gmtime(rate * (args.steps - done)))}",
                  flush=True)

    started = time.monotonic()
    trainer.fit(stream, steps_per_epoch=interval, epochs=math.ceil(args.steps / interval), verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(str(out / "backup")), Progress(),
                           keras.callbacks.TensorBoard(str(out / "logs"))])
    vocoder.save_weights(str(out / "vocoder.weights.h5"))
    print(f"weights: {out / 'vocoder.weights.h5'}; trained in {time.monotonic() - started:.0f} s")

    if args.quality_clips and val_rows:
        paths = [u.audio_path for u in val_rows[: args.quality_clips]]
        neural = tf.function(lambda mel: vocoder(mel[None])[0], reduce_retracing=True)
        reports = {"griffin-lim": quality.measure_copy_synthesis(paths, config.data),
                   "vocoder": quality.measure_copy_synthesis(paths, config.data, vocoder=neural)}
        for name, report in reports.items():
            print(report.line(name))
        (out / "quality.json").write_text(json.dumps({name: vars(r) for name, r in reports.items()}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
