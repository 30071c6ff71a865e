"""Train the neural vocoder (myxtts/models/vocoder.py) on a corpus, then measure it against Griffin-Lim.

    python utilities/train_vocoder.py --run runs/demo                  # the run's own: runs/demo/vocoder
    python utilities/train_vocoder.py --train-data demo_corpus --output-dir runs/vocoder --size base --steps 6000

Waveform batches come from the project's own pipeline (`data.mel_on_device`: the clips decoded,
trimmed, normalised and bucketed natively, as training reads them); each step vocodes the log-mel of
a random segment of every clip and compares it with the segment. Keras' `BackupAndRestore` keeps an
interrupted run resumable: the same command continues from its last backup (every 50 steps; a run
removes its backup once the vocoder is saved, so a save that fails, on a full disk say, keeps the
trained weights for the same command to save; a backup made with another --size, --accumulation,
discriminator or fp16 is refused with what differs, and kept). A folder that already holds a trained
vocoder is not trained over: continue it with --init-from FOLDER (in place or into another
--output-dir), or train a new one elsewhere. One training at a time holds the folder (a second one
is refused, naming the first's pid). Updates are XLA-compiled on a GPU and run in its mixed precision
(--precision), optionally over several batches each (--accumulation); several GPUs of one host train
it together (tf.distribute.MirroredStrategy, --batch-size segments on each, gradients averaged before
clipping as train_main.py does, without XLA); the saved vocoder is float32 whatever it trained in.
The vocoder folder (OUTPUT/vocoder.weights.h5 and OUTPUT/vocoder.json, the features it was trained
for) is written at the end. Then copy-synthesis of the validation clips through the vocoder and through Griffin-Lim is
measured (STOI, PESQ-WB when `pesq` is installed, DNSMOS; see utilities/measure_quality.py) and
written to OUTPUT/quality.json. TensorBoard (OUTPUT/logs) has the losses, and under logs/samples a
validation clip, its Griffin-Lim copy and, ten times over the run, its copy through the vocoder.

With --run RUN, the vocoder is trained on the run's corpus with the run's features and written to
RUN/vocoder, which makes it the run's own: synthesize.py, export_model.py, free_running_check.py
and train_main.py's closing sample speak through it from then on (--vocoder griffin-lim there
still picks Griffin-Lim). RUN/demo_sample.wav is spoken again through it (the Griffin-Lim one is
kept as RUN/demo_sample_griffin_lim.wav). Elsewhere, a folder is used by naming it: --vocoder
FOLDER in those tools, or training.vocoder for a run's validation.

--aligned-mels (with --run) trains on the acoustic model's own mels instead of the recordings':
each training clip decoded by the run's model on the recording's alignment, so that its frames
still line up with the recording, computed once before training; the losses still compare with the
recording. With --init-from FOLDER (say RUN/vocoder) this fine-tunes a vocoder to the mels it will
be given at synthesis, which are smoother than a recording's.

--phase-prior griffin-lim starts the vocoder at Griffin-Lim's own audio and trains it to turn that
phase and correct that magnitude (`models/vocoder.py`); the phase of every training clip is found
once before training (32 iterations over the whole clip, as synthesis does) and held in memory with
the clips, so the updates read it instead of iterating.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKUP = "backup"  # OUTPUT/backup: Keras' BackupAndRestore folder
BACKUP_INTERVAL = 50  # updates per Keras epoch: the progress line and the backup come this often


def holds_backup(backup: Path) -> bool:
    """Whether `backup` holds an interrupted run (Keras writes its weights there as latest.weights.h5)."""
    return (backup / "latest.weights.h5").exists()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--run", default=None, help="an acoustic model's run folder: train on its corpus and features, "
                                                    "write RUN/vocoder (its own vocoder) and speak its demo sample again")
    parser.add_argument("--train-data", default=None, help="corpus folder or manifest (default with --run: the run's)")
    parser.add_argument("--output-dir", default=None, help="the vocoder folder to write (default with --run: RUN/vocoder)")
    parser.add_argument("--config", default=None,
                        help="data.* settings, the features (default: the run's config.yaml with --run, else configs/demo.yaml)")
    parser.add_argument("--size", default="small", choices=("tiny", "small", "base"),
                        help="small (default: 3.2 M parameters with the Griffin-Lim phase prior, 2.7 M without) trains about twice "
                             "as many updates as base (10.6 M, 9.5 M without) in the same time, and measured as good")
    parser.add_argument("--steps", type=int, default=2400,
                        help="optimizer updates in all (a resumed run trains up to it); the default, %(default)s, takes ~8 min "
                             "with the demo corpus on 2 cores of an AVX-512 EPYC, everything included")
    parser.add_argument("--batch-size", type=int, default=16, help="segments per update (per GPU with several; default: %(default)s)")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="GPUs to train on (default: every GPU TensorFlow sees); more than one: "
                             "tf.distribute.MirroredStrategy, --batch-size segments on each")
    parser.add_argument("--accumulation", type=int, default=1, metavar="N",
                        help="average the gradients of N batches into each update (Keras' gradient accumulation): "
                             "updates of N x batch segments where memory holds one batch (default: %(default)s)")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                        help="auto (the default): bf16 on GPUs from compute capability 8.0, fp16 with loss scaling on 7.x, float32 "
                             "on a CPU (bf16 there measured 19%% faster per update but a little worse after as many); "
                             "the saved vocoder is float32 either way")
    parser.add_argument("--segment-frames", type=int, default=32, help="mel frames per training segment (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=1e-3,
                        help="peak learning rate of the vocoder's optimizer (default: %(default)s)")
    parser.add_argument("--phase-weight", type=float, default=0.0,
                        help="weight of a loss on the compressed complex spectrum, which sees the phase (0: off; default: %(default)s)")
    parser.add_argument("--phase-prior", choices=("none", "griffin-lim"), default=None,
                        help="what the vocoder's phase turns: griffin-lim (default: the phase 32 iterations of "
                             "Griffin-Lim find, computed once per training clip and held in memory, ~0.7 GB an hour of "
                             "audio; measured PESQ +0.5-0.8 at equal updates) or none (phase zero, as Vocos); with "
                             "--init-from: that vocoder's")
    parser.add_argument("--phase-angle-weight", type=float, default=0.0,
                        help="weight of APNet's anti-wrapping losses on the phase angle and its differences across "
                             "bins and frames (0: off; default: %(default)s)")
    parser.add_argument("--adversarial-weight", type=float, default=0.0,
                        help="weight of a spectrogram discriminator's losses (0: none; about 0.02 is HiFi-GAN's ratio to "
                             "the mel loss; default: %(default)s); best from a trained vocoder (--init-from)")
    parser.add_argument("--discriminator-learning-rate", type=float, default=2e-4,
                        help="learning rate of the discriminator, with --adversarial-weight (default: %(default)s)")
    parser.add_argument("--xla", choices=("auto", "on", "off"), default="auto",
                        help="compile each update with XLA; auto (the default): on a GPU only (on 2 CPU cores it measured slower "
                             "for the small and base sizes: BENCHMARKS.md)")
    parser.add_argument("--aligned-mels", action="store_true",
                        help="with --run: train on the run's own teacher-forced mels (see below)")
    parser.add_argument("--init-from", default=None, metavar="FOLDER",
                        help="start from this vocoder folder's weights (its size) instead of from scratch")
    parser.add_argument("--quality-clips", type=int, default=10, help="validation clips to measure at the end (0: none; default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. --set data.fmax=8000 (repeatable)")
    args = parser.parse_args(argv)
    if args.run is None and (args.train_data is None or args.output_dir is None):
        parser.error("give --run RUN, or --train-data and --output-dir")
    if args.aligned_mels and args.run is None:
        parser.error("--aligned-mels needs --run RUN (the acoustic model whose mels to train on)")
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"--gpus must be at least 1, got {args.gpus}")
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size),
                        ("--segment-frames", args.segment_frames)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if not (args.learning_rate > 0 and args.discriminator_learning_rate > 0):
        parser.error(f"--learning-rate and --discriminator-learning-rate must be > 0, got {args.learning_rate} and "
                     f"{args.discriminator_learning_rate}")
    if args.quality_clips < 0:
        parser.error(f"--quality-clips must be >= 0 (0: none), got {args.quality_clips}")
    if args.accumulation < 1:
        parser.error(f"--accumulation must be at least 1, got {args.accumulation}")
    if args.run is not None and not (Path(args.run) / "config.yaml").is_file():
        parser.error(f"--run {args.run}: not a training run folder (no config.yaml); pass train_main.py's --output-dir")
    sys.path.insert(0, str(ROOT))
    from myxtts.output_paths import folder_problem

    if args.output_dir and (problem := folder_problem(args.output_dir, "--output-dir")):
        parser.error(problem)

    from myxtts.startup_noise import quiet_tensorflow

    # Keras warns that `shuffle` is ignored for datasets: the pipeline shuffles its own.
    warnings.filterwarnings("ignore", message=".*shuffle=True.*was passed.*")
    # TensorFlow's start-up lines that read as errors on a healthy machine (startup_noise.py), and the
    # DT_STRING notice the first TensorBoard audio sample would print mid-run; errors still show.
    machine = quiet_tensorflow()
    import keras

    from myxtts.config import ConfigError
    from myxtts.data.audio import named_data_problems
    from myxtts.models.vocoder import is_vocoder_folder
    from myxtts.synthesis import RUN_VOCODER
    from myxtts.training.run_lock import RunFolderBusy, run_folder_lock
    from myxtts.training.checkpoints import CheckpointError

    out = Path(args.output_dir or Path(args.run) / RUN_VOCODER)
    try:
        if problem := replaced_vocoder(out, args.init_from):
            raise ValueError(problem)
        out.mkdir(parents=True, exist_ok=True)
        # The pipeline's own checks name a corrupt or unreadable clip (a ValueError).
        with named_data_problems(), run_folder_lock(out, what="each other's backup and saved vocoder",
                                                    advice="train into another --output-dir"):
            return train(args, machine, out)
    except (ConfigError, FileNotFoundError, RunFolderBusy, ValueError, CheckpointError) as error:
        # a bad --set key, a missing folder, a backup; --aligned-mels of a run with no checkpoint yet
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what is kept, in a line (Keras' backup is written between updates)
        if holds_backup(out / BACKUP):
            kept = (f"{out / BACKUP} keeps the run up to its last backup (every {BACKUP_INTERVAL} updates): the same "
                    "command continues it")
        else:  # before the first backup, or after the vocoder was saved (measuring it, speaking the sample)
            kept = f"the vocoder saved in {out} is kept" if is_vocoder_folder(out) else "nothing was trained yet"
        print(f"\ninterrupted: {kept}", file=sys.stderr)
        return 130
    finally:
        keras.config.set_dtype_policy("float32")  # train() sets the run's: a caller in this process gets float32 back


def replaced_vocoder(out: Path, init_from: str | None) -> str | None:
    """Why training into `out` would replace a vocoder already trained there at its end, or None."""
    from myxtts.models.vocoder import is_vocoder_folder

    if not is_vocoder_folder(out) or holds_backup(out / BACKUP):
        return None  # nothing saved there yet, or an interrupted run to continue
    if init_from and Path(init_from).resolve() == out.resolve():
        return None  # continued in place: replaced by its own continuation, once that is saved
    return (f"{out} already holds a trained vocoder, which training again would replace. Continue it with "
            f"--init-from {out} (in place, or into another --output-dir), train a new one with --output-dir NEW, "
            f"or remove {out} to start over")


def train(args, machine, out: Path) -> int:
    """Train, save and measure the vocoder in `out` (the module's docstring); 0 when done."""
    import shutil

    import keras
    import tensorflow as tf

    from myxtts.config import load_config, override
    from myxtts.data.pipeline import Epochs, build_vocabulary
    from myxtts.data.splits import load_splits
    from myxtts.evaluation import quality
    from myxtts.hardware.plan import vocoder_precision
    from myxtts.models.vocoder import check_features, features_of, load_vocoder, save_vocoder, vocoder_settings
    from myxtts.models.vocoder_losses import STFT_RESOLUTIONS
    from myxtts.progress import ProgressLine
    from myxtts.training.vocoder_clips import clip_stream, recorded_mels, teacher_forced_mels, with_griffin_lim_phase
    from myxtts.synthesis import GRIFFIN_LIM, RUN_VOCODER, Synthesizer
    from myxtts.training import distribute
    from myxtts.training.callbacks import VocoderSamples, optimizer_step
    from myxtts.training.checkpoints import CheckpointError, find_checkpoint
    from myxtts.training.compile_log import CompileTimer

    # One host's GPUs (TF_CONFIG's several hosts are train_main.py's alone: here every process would write).
    strategy = distribute.strategy_for(args.gpus or max(len(tf.config.list_physical_devices("GPU")), 1), environ={})
    replicas = distribute.replicas(strategy)
    speak_sample = bool(args.run) and out.resolve() == (Path(args.run) / RUN_VOCODER).resolve()
    if speak_sample:
        try:
            find_checkpoint(args.run)
        except CheckpointError:  # said now: the sample comes after minutes of training
            speak_sample = False
            print(f"note: {args.run} has no checkpoint yet, so the vocoder trains on its corpus but speaks no "
                  f"demo_sample.wav; once the run has trained, speak with utilities/synthesize.py --checkpoint "
                  f"{args.run} --vocoder {out}")
    policy, policy_reason, notes = vocoder_precision(machine, args.precision)
    for note in notes:
        print(f"note: {note}")
    missing = quality.missing_packages() if args.quality_clips else []
    if missing:  # said now, not after minutes of training; the vocoder and its sample do not need them
        print(f"note: the quality measure at the end (--quality-clips) needs {', '.join(missing)}, not installed here: "
              "skipped (pip install -r requirements-quality.txt, then utilities/measure_quality.py measures it)")
        args.quality_clips = 0
    config_path = args.config or (Path(args.run) / "config.yaml" if args.run else ROOT / "configs" / "demo.yaml")
    train_data = [override("data.train_data", args.train_data)] if args.train_data else []
    config = load_config(config_path, overrides=[*train_data, "data.mel_on_device=true", f"data.batch_size={args.batch_size}",
                                                 *args.set])
    window = max(n_fft for n_fft, _ in STFT_RESOLUTIONS)
    if (args.segment_frames - 1) * config.data.hop_length < window:  # the loss's STFT would have no frame: NaN
        samples, least = (args.segment_frames - 1) * config.data.hop_length, -(-window // config.data.hop_length) + 1
        raise ValueError(f"--segment-frames {args.segment_frames}: segments of {samples} samples are shorter than the "
                         f"loss's longest STFT window ({window}); give at least {least}")
    train_rows, val_rows = load_splits(config)
    keras.utils.set_random_seed(config.seed)
    if args.init_from:  # checked before minutes of preparing clips: a missing folder, other features or prior
        settings = vocoder_settings(args.init_from)
        check_features(args.init_from, settings, config.data)
        started_from = settings["phase_prior"]
        if args.phase_prior not in (None, started_from):
            raise ValueError(f"--phase-prior {args.phase_prior}: --init-from {args.init_from} was trained with "
                             f"{started_from!r}; drop --phase-prior or start from scratch")
        args.phase_prior = started_from
    args.phase_prior = args.phase_prior or "griffin-lim"

    def counted(batches, rows: int, label: str):
        """`batches`, their clips counted on a progress line: one pass over a corpus is minutes (~35 ms a
        clip on 2 cores). When it ends all `rows` were read, though the length filter leaves some out."""
        progress = ProgressLine(label, rows, "clips", enabled=True)
        for batch in batches:
            yield batch
            progress.update(progress.done + int(batch["mel_length"].shape[0]))
        progress.update(rows)
        progress.close()

    clips = None
    if args.aligned_mels:
        from myxtts.training.run_setup import prepare_run

        started = time.monotonic()
        network = Synthesizer.from_run(args.run, vocoder=GRIFFIN_LIM).network
        text = prepare_run(config, args.run, resume="require", echo=lambda message: None).text  # rows as training read them
        batches = Epochs(config, text.train_rows, training=False, vocabulary=text.vocabulary).one_pass()
        clips = teacher_forced_mels(network, counted(batches, len(text.train_rows), "the run's own mels"), config.data)
        print(f"the run's own mels of {int(clips['mel_length'].shape[0])} training clips, teacher-forced on their recordings' alignment: "
              f"{time.monotonic() - started:.0f} s")

    elif args.phase_prior == "griffin-lim":  # the clips held in memory, each with its phase found once
        vocabulary = build_vocabulary(train_rows + val_rows, config.data)
        batches = Epochs(config, train_rows, training=False, vocabulary=vocabulary).one_pass()
        clips = recorded_mels(counted(batches, len(train_rows), "the training clips' log-mels"), config.data)
    if clips is not None:
        count = int(clips["mel_length"].shape[0])
        if args.phase_prior == "griffin-lim":
            started = time.monotonic()
            progress = ProgressLine("Griffin-Lim's phase of the training clips", count, "clips", enabled=True)
            clips = with_griffin_lim_phase(clips, config.data, lambda done, total: progress.update(done))
            progress.close()
            held = sum(int(tf.size(value.flat_values if isinstance(value, tf.RaggedTensor) else value)) * value.dtype.size
                       for value in clips.values()) / 2 ** 20
            print(f"Griffin-Lim's phase of {count} training clips: {time.monotonic() - started:.0f} s ({held:.0f} MB held)")

        def shard_stream(batch, shard, shards):
            return clip_stream(clips, batch, config.data, args.segment_frames, seed=config.seed, shard=shard, shards=shards)
    else:
        vocabulary = build_vocabulary(train_rows + val_rows, config.data)

        def shard_stream(batch, shard, shards):  # a replica's batches; with one replica, every clip
            local = dataclasses.replace(config, data=dataclasses.replace(config.data, batch_size=batch))
            epochs = Epochs(local, train_rows[shard::shards], training=True, vocabulary=vocabulary)
            epochs.batches_per_epoch()  # NoFullBatch (said, exit 2) where the buckets fill no batch: the stream would never yield
            return epochs.stream().map(lambda b: {"audio": b["audio"], "mel_length": b["mel_length"]})
    stream = distribute.distribute_dataset(strategy, args.batch_size, shard_stream)

    keras.config.set_dtype_policy(policy)  # before any layer is made: the layers compute in it
    with distribute.training_scope(strategy):  # every variable, mirrored on each GPU with several
        trainer, jit_compile = build_trainer(args, config, policy, strategy)
    vocoder = trainer.vocoder
    check_backup(out / BACKUP, {"size": vocoder.size, "phase_prior": vocoder.phase_prior, "discriminator": bool(args.adversarial_weight),
                                  "loss_scaling": policy == "mixed_float16", "accumulation": args.accumulation,
                                  "features": features_of(config.data)})
    critic = (f"; a spectrogram discriminator ({trainer.discriminator.count_params():,} parameters) at weight "
              f"{args.adversarial_weight}" if args.adversarial_weight else "")
    batch = (f"batch {args.batch_size}" + (f" x {replicas} GPUs" if replicas > 1 else "")
             + (f" x {args.accumulation} accumulated" if args.accumulation > 1 else ""))
    prior = ", turning Griffin-Lim's phase" if vocoder.phase_prior == "griffin-lim" else ""
    print(f"vocoder {vocoder.size}: {vocoder.count_params():,} parameters{prior}; "
          f"{len(train_rows)} training clips, segments of {args.segment_frames} frames, {batch}{critic}; "
          f"{'XLA' if jit_compile else 'graph mode'}; {policy} ({policy_reason})")

    interval = min(BACKUP_INTERVAL, args.steps)

    class Progress(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after BackupAndRestore (listed first) restored the run
            self.first, self.started = optimizer_step(self.model), time.monotonic()
            if self.first:
                print(f"resumed from {out / BACKUP} at update {self.first} of {args.steps}", flush=True)

        def on_epoch_end(self, epoch, logs=None):
            done = (epoch + 1) * interval
            rate = (time.monotonic() - self.started) / max(done - self.first, 1)
            phase = f" phase {logs['phase_loss']:.3f}" if "phase_loss" in logs else ""
            phase += f" angle {logs['phase_angle_loss']:.3f}" if "phase_angle_loss" in logs else ""
            if "adversarial_loss" in logs:
                phase += (f" adversarial {logs['adversarial_loss']:.3f} feature {logs['feature_loss']:.3f}"
                          f" discriminator {logs['discriminator_loss']:.3f}")
            skipped = int(logs.get("nonfinite_in_a_row", 0))
            print(f"step {done}/{args.steps}  loss {logs['loss']:.3f} (mel {logs['mel_loss']:.3f} stft {logs['stft_loss']:.3f}{phase})"
                  f"  {rate * 1000:.0f} ms/step  ETA {time.strftime('%H:%M:%S', time.gmtime(rate * (args.steps - done)))}"
                  + (f"  ({skipped} non-finite updates skipped in a row)" if skipped else ""), flush=True)
            if skipped >= interval:  # every update of this stretch was skipped: it will not recover
                print(f"stopping: the last {skipped} updates were all non-finite and skipped; the vocoder keeps the "
                      f"weights of the last finite one (try a lower --learning-rate)", flush=True)
                self.model.stop_training = True

    # The first update's time (tracing, under XLA compiling, the input starting): on an H200 the first
    # progress line of an XLA run had not come 150 s in, with nothing said meanwhile (BENCHMARKS.md).
    callbacks = [backup_callback(out / BACKUP), Progress(),
                 CompileTimer(echo=lambda line: print(line, flush=True), xla=jit_compile),
                 keras.callbacks.TensorBoard(str(out / "logs"))]
    if val_rows:  # one validation clip's copy-synthesis, to listen to in TensorBoard as it trains
        callbacks.append(VocoderSamples(vocoder, val_rows[0].audio_path, config.data, str(out / "logs" / "samples"),
                                        interval=max(interval, args.steps // 10)))
    started = time.monotonic()
    trainer.fit(stream, steps_per_epoch=interval * args.accumulation, epochs=math.ceil(args.steps / interval), verbose=0,
                callbacks=callbacks)
    keras.config.set_dtype_policy("float32")  # what follows (measures, the demo sample) runs as synthesis does
    try:
        save_vocoder(vocoder, out)
    except OSError as error:
        raise ValueError(f"could not save the vocoder in {out} ({error.strerror or error}); the trained weights are kept "
                         f"in {out / BACKUP}: the same command, run again once that is mended, saves them without "
                         "training again") from None
    shutil.rmtree(out / BACKUP, ignore_errors=True)  # saved: the backup has done its work
    print(f"vocoder: {out}; trained in {time.monotonic() - started:.0f} s")

    if args.quality_clips and val_rows:
        paths = [u.audio_path for u in val_rows[: args.quality_clips]]
        saved = load_vocoder(out, config.data)  # as synthesis will use it: float32, from the folder
        neural = tf.function(lambda mel: saved(mel[None])[0], reduce_retracing=True)
        recordings = quality.RecordingScores()  # scored once for both
        reports = {"griffin-lim": quality.measure_copy_synthesis(paths, config.data, label="griffin-lim", recordings=recordings),
                   "vocoder": quality.measure_copy_synthesis(paths, config.data, vocoder=neural, label="vocoder",
                                                             recordings=recordings)}
        for name, report in reports.items():
            print(report.line(name))
        (out / "quality.json").write_text(json.dumps({name: vars(r) for name, r in reports.items()}, indent=2), encoding="utf-8")
    if speak_sample:
        speak_demo_sample(Path(args.run))
    return 0


def build_trainer(args, config, policy: str, strategy):
    """(VocoderTrainer compiled with its optimizers and every variable built, XLA or not), inside
    `distribute.training_scope(strategy)` and under the dtype policy `policy`."""
    import keras
    import tensorflow as tf

    from myxtts.models.vocoder import Vocoder, load_vocoder
    from myxtts.training.vocoder_step import VocoderTrainer
    from myxtts.training import distribute
    from myxtts.training.optimizers import FusedAdamW, WarmupHoldDecay

    if args.init_from:
        vocoder = load_vocoder(args.init_from, config.data, policy=policy)
        print(f"starting from {args.init_from} ({vocoder.size})")
    else:
        vocoder = Vocoder(config.data, size=args.size, phase_prior=args.phase_prior)
    accumulate = args.accumulation if args.accumulation > 1 else None
    critic_optimizer = keras.optimizers.AdamW(args.discriminator_learning_rate, beta_1=0.8, beta_2=0.99, weight_decay=0.01,
                                              global_clipnorm=1.0, gradient_accumulation_steps=accumulate)
    # Keras evaluates a schedule on micro-steps when it accumulates: stretched to stay in updates.
    micro = args.accumulation
    schedule = WarmupHoldDecay(args.learning_rate, min(100, args.steps // 10) * micro, args.steps * micro,
                               decay_steps=args.steps // 2 * micro)
    optimizer = FusedAdamW(schedule, beta_1=0.8, beta_2=0.99, weight_decay=0.01, global_clipnorm=1.0,
                           gradient_accumulation_steps=accumulate)
    if policy == "mixed_float16":  # each optimizer scales its own loss (clipping sees unscaled gradients)
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        critic_optimizer = keras.optimizers.LossScaleOptimizer(critic_optimizer)
    trainer = VocoderTrainer(vocoder, segment_frames=args.segment_frames, phase_weight=args.phase_weight,
                             phase_angle_weight=args.phase_angle_weight, adversarial_weight=args.adversarial_weight,
                             discriminator_optimizer=distribute.prepare_optimizer(critic_optimizer, strategy))
    # XLA cannot compile a step whose variables live on several devices (training/distribute.py).
    jit_compile = distribute.xla_allowed(strategy) and (
        args.xla == "on" or (args.xla == "auto" and bool(tf.config.list_physical_devices("GPU"))))
    trainer.compile(optimizer=distribute.prepare_optimizer(optimizer, strategy), jit_compile=jit_compile)
    trainer.build_for_training()  # variables exist before a backup is restored
    return trainer, jit_compile


def backup_callback(backup: Path):
    """Keras' BackupAndRestore, kept after training (the vocoder is saved from it, then it is removed);
    double_checkpoint: a backup cut short (Ctrl-C or a kill while it writes, a full disk) leaves the
    one before it, which the restore falls back to."""
    import keras

    return keras.callbacks.BackupAndRestore(str(backup), double_checkpoint=True, delete_checkpoint=False)


def check_backup(backup: Path, settings: dict) -> None:
    """Refuse to resume a backup made with settings that change the variables it holds (the vocoder's
    size, a discriminator, loss scaling, gradient accumulation) or what they were trained on (the
    features): Keras would fail to load it, or load it wrongly, or the vocoder would be saved as one
    of features most of its updates never saw. Says which settings differ; the backup is left as it is. Records `settings` beside a
    backup to come (removed with it once the vocoder is saved)."""
    recorded = backup / "settings.json"
    if holds_backup(backup) and recorded.is_file():
        before = json.loads(recorded.read_text(encoding="utf-8"))
        differ = [f"{key}: backup {before.get(key)!r}, now {value!r}" for key, value in settings.items()
                  if before.get(key) != value and (key in before or key != "features")]  # older backups: no features
        if differ:
            raise ValueError(f"{backup} holds an interrupted run made with other settings ({'; '.join(differ)}). "
                             f"Run with that run's settings to continue it, or remove {backup} to start over.")
    backup.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(settings), encoding="utf-8")


def speak_demo_sample(run: Path) -> None:
    """RUN/demo_sample.wav through the run's vocoder, and the Griffin-Lim one beside it."""
    from myxtts.synthesis import GRIFFIN_LIM, validation_sample

    for name, vocoder in (("demo_sample_griffin_lim.wav", GRIFFIN_LIM), ("demo_sample.wav", None)):
        sample = validation_sample(run, run / name, vocoder=vocoder)
        print(f"{run / name}: {sample['text']!r} in {sample['speaker']}'s voice, {sample['audio_seconds']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
