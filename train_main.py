#!/usr/bin/env python3
"""Train MyXTTS: parse flags, build the config, call `train(config, workdir)`.

    python train_main.py --demo                                   # synthesize the demo corpus, train the small model
    python train_main.py --train-data DATA --val-data VAL --optimization-level enhanced

Precedence: configs/config.yaml defaults < --config FILE < flags and --set key=value < the level's
presets for keys left null. Run with --help for every flag.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEMO_CORPUS = ROOT / "demo_corpus"


def parse_args(argv=None) -> argparse.Namespace:
    from myxtts.config import Config, get_value

    defaults = Config()  # the one place defaults live; --help says them

    def key(name: str) -> str:
        value = get_value(defaults, name)
        return f"{name}, default {'from --optimization-level' if value is None else value}"

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (see configs/config.yaml for every key)")
    p.add_argument("--train-data", help="LJSpeech folder, metadata.csv or JSONL manifest (data.train_data)")
    p.add_argument("--val-data", help="validation set in the same formats (data.val_data); default: hold out data.val_fraction")
    p.add_argument("--output-dir", "--checkpoint-dir", dest="output_dir", help="run folder: checkpoints, logs, vocab.txt, config.yaml (default runs/<config name>)")
    p.add_argument("--batch-size", type=int, help=f"clips per batch per replica, 0 = automatic ({key('data.batch_size')})")
    p.add_argument("--grad-accumulation", "--grad-accum", dest="grad_accumulation", type=int, help=f"micro-batches per update, 0 = automatic ({key('training.gradient_accumulation_steps')})")
    p.add_argument("--num-workers", type=int, help=f"parallel input calls, 0 = automatic ({key('data.num_workers')})")
    p.add_argument("--lr", type=float, help=f"peak learning rate ({key('training.learning_rate')})")
    p.add_argument("--model-size", choices=["tiny", "small", "base"], help=f"the model's size ({key('model.size')})")
    p.add_argument("--optimization-level", choices=["basic", "enhanced", "experimental"], help=f"preset for keys left null (see README; {key('training.optimization_level')})")
    p.add_argument("--optimizer", choices=["adamw", "prodigy"], help=f"the optimizer ({key('training.optimizer')})")
    p.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], help=f"the compute precision; auto: from the GPU, timed on a CPU ({key('training.precision')})")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--max-steps", type=int, help=f"optimizer updates to train for ({key('training.max_steps')})")
    steps.add_argument("--epochs", type=positive_epochs, help="passes over the training set (> 0, fractions allowed), converted to training.max_steps")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="resume from the run folder's latest checkpoint; error if there is none (re-running without flags also resumes when one exists)")
    again.add_argument("--reset-training", action="store_true", help="start from scratch: the run folder's checkpoints, vocab.txt and phonemes cache are deleted once the new run starts (kept if it stops before)")
    p.add_argument("--init-from", metavar="RUN_OR_CHECKPOINT", help="fine-tune: start this run from another run's weights (a run folder or "
                   "checkpoint prefix) with a new optimizer at step 0; tokens new to its vocabulary are added (training.init_from)")
    p.add_argument("--enable-eager-debug", action="store_true", help="run the step eagerly, without tf.function or XLA (slow; for debugging)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key, e.g. --set data.cache_dir=/tmp/cache (repeatable)")
    p.add_argument("--gpu", help="GPU(s) to train on: 0, 0,1, all or cpu (default: the choice saved in ~/.myxtts/gpu_config.json, "
                   "a question on a terminal, else every GPU of the largest model); several GPUs train data-parallel")
    p.add_argument("--demo", action="store_true", help="build the demo corpus if absent and train the small model on it (configs/demo.yaml)")
    return p.parse_args(argv)


def positive_epochs(text: str) -> float:
    """--epochs as a number of passes: 0 trained one update, and nan or inf no sensible number."""
    try:
        epochs = float(text)
    except ValueError:
        epochs = math.nan
    if not (math.isfinite(epochs) and epochs > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of passes over the training set "
                                         f"(0.5 is half of one), got {text!r}")
    return epochs


def build_config(args: argparse.Namespace):
    from myxtts.config import load_config, override

    config_path = args.config or (ROOT / "configs" / "demo.yaml" if args.demo else None)
    flags = {
        "data.train_data": args.train_data,
        "data.val_data": args.val_data,
        "data.batch_size": args.batch_size,
        "data.num_workers": args.num_workers,
        "training.gradient_accumulation_steps": args.grad_accumulation,
        "training.learning_rate": args.lr,
        "model.size": args.model_size,
        "training.optimizer": args.optimizer,
        "training.precision": args.precision,
        "training.max_steps": args.max_steps,
        "training.init_from": args.init_from,
    }
    overrides = [override(key, value) for key, value in flags.items() if value is not None]
    if args.enable_eager_debug:
        overrides += ["training.enable_graph_mode=false", "training.enable_xla_compilation=false"]
    config = load_config(config_path, overrides=overrides + args.set, optimization_level=args.optimization_level)
    if args.demo and not args.train_data:
        config.data.train_data = str(DEMO_CORPUS)
    return config, config_path


def choose_gpus(flag: str | None) -> None:
    """Picks the GPUs (--gpu, a saved choice or a question) and exposes only them to CUDA.

    CUDA reads CUDA_VISIBLE_DEVICES once, when TensorFlow starts, so this runs before the trainer
    (and TensorFlow) is imported; the hardware plan then sees exactly the chosen GPUs.
    """
    from myxtts.hardware.detect import detect_machine
    from myxtts.hardware.select import cuda_visible_devices_value, select_gpus

    facts = detect_machine()
    selection = select_gpus(facts, flag)
    for message in selection.messages:
        print(message, file=sys.stderr)
    if facts.gpus or selection.source == "flag":
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices_value(facts, selection.indices)


def speak_demo_sample(workdir: Path, result) -> None:
    """The demo's closing sample, spoken from the run's checkpoint; after Ctrl-C or SIGTERM only how to
    speak it: speaking takes tens of seconds (about 45 s on 2 cores, most of it tracing), past a scheduler's
    grace period before SIGKILL, and the run has just been told to stop."""
    if result.interrupted_by:
        print(f"no demo sample after {result.interrupted_by}; to hear the checkpoint now: python utilities/synthesize.py "
              f"--checkpoint {workdir} --text \"Hello there.\" --reference any_clip.wav", file=sys.stderr)
        return
    from myxtts.synthesis import validation_sample

    print(f"speaking a held-out sentence into {workdir / 'demo_sample.wav'} (about 45 s on 2 CPU cores, most of it "
          "tracing the synthesis)", file=sys.stderr, flush=True)
    sample = validation_sample(workdir, workdir / "demo_sample.wav")
    print(
        f"listen: {sample['out']} ({sample['audio_seconds']:.2f} s; espeak said it in {sample['recording_seconds']:.2f} s)\n"
        f"  text: {sample['text']}\n  voice: {sample['speaker']} (reference {sample['reference']})\n"
        f"  try your own: python utilities/synthesize.py --checkpoint {workdir} --text \"Hello there.\" --reference {sample['reference']}",
        file=sys.stderr,
    )
    if sample["dropped"]:  # a held-out sentence may hold a phoneme the training rows lack
        print(f"  left out {len(sample['dropped'])} phonemes the training set never had: "
              f"{' '.join(sorted(set(sample['dropped'])))}", file=sys.stderr)


def main(argv=None) -> int:
    started = time.perf_counter()  # the run's closing "time:" line counts the corpus and TensorFlow's start too
    args = parse_args(argv)
    try:
        return _main(args, started)
    except KeyboardInterrupt:
        # Ctrl-C outside training itself (the corpus, the probes, tracing, the closing measures and
        # sample): inside it, the CheckpointSaver's handler saves and stops the run (exit 130 too).
        print(f"\ninterrupted: {kept_after_interrupt(args)}", file=sys.stderr)
        return 130


def run_folder(args, config_path) -> Path:
    """--output-dir, else runs/demo or runs/<the config's name>."""
    return Path(args.output_dir or ROOT / "runs" / ("demo" if args.demo else Path(config_path or "run").stem))


def kept_after_interrupt(args) -> str:
    """What a run interrupted outside its training loop keeps, in words."""
    from myxtts.config import ConfigError

    try:
        _, config_path = build_config(args)
    except ConfigError:  # interrupted before the config was read: nothing was written
        return "nothing was trained yet"
    workdir = run_folder(args, config_path)
    if any((workdir / "checkpoints").glob("*/*.index")):
        return f"the checkpoints in {workdir / 'checkpoints'} are kept: the same command continues from the latest"
    return "nothing was trained yet"


def _main(args, started: float) -> int:
    # TensorFlow's C++ start-up chatter (CUDA probing, oneDNN notes) buries our own lines; errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Keras warns that `shuffle` is ignored for datasets (ours shuffle themselves) and that the
    # validation set "ran out of data" (it is finite on purpose).
    warnings.filterwarnings("ignore", message=".*shuffle=True.*was passed.*")
    warnings.filterwarnings("ignore", message=".*input ran out of data.*")
    from myxtts.config import ConfigError

    from myxtts.training.hand_written_config import check_run_folder_config

    try:
        config, config_path = build_config(args)
        workdir = run_folder(args, config_path)
        check_run_folder_config(workdir)  # a config.yaml of the user's there would be replaced
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        choose_gpus(args.gpu)
    except ValueError as error:  # --gpu names a GPU that does not exist
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.demo and config.data.train_data == str(DEMO_CORPUS):
        from myxtts.data.demo_corpus import make_demo_corpus

        make_demo_corpus(DEMO_CORPUS)

    from myxtts.startup_noise import quiet_start

    with quiet_start(gpu_expected=True):  # TensorFlow's import-time lines about CUDA drivers (startup_noise.py)
        from myxtts.data.audio import named_data_problems
        from myxtts.training.checkpoints import CheckpointError
        from myxtts.training.run_lock import RunFolderBusy
        from myxtts.training.trainer import OutOfMemory, train

    resume = "require" if args.resume else "reset" if args.reset_training else "auto"
    try:
        with named_data_problems():  # a clip the pipeline's checks refuse: its one line (a ValueError)
            result = train(config, workdir, resume=resume, epochs=args.epochs, started=started)
    except (ConfigError, CheckpointError, OutOfMemory, RunFolderBusy, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stopped = f"stopped by {result.interrupted_by}" if result.interrupted_by else "finished"
    print(f"{stopped} at step {result.step}; run folder: {workdir}", file=sys.stderr)
    if args.demo and result.step > 0:
        speak_demo_sample(workdir, result)
    if result.stopped_for_nonfinite:
        return 3
    return 130 if result.interrupted_by else 0


if __name__ == "__main__":
    sys.exit(main())
