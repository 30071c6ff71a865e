"""What the intelligibility measure says about speech we know is right, and about non-speech.

    python utilities/measure_recordings_wer.py --corpus /tmp/demo400 --make-demo

Word error rate (myxtts/evaluation/intelligibility.py) of, for the validation split the trainer
uses (data.val_fraction and seed of --config):
  recordings      the corpus's WAV files as they are
  Griffin-Lim     the training pipeline's log-mel of each recording (trim, peak-normalise, log-mel
                  with the --config data settings), turned back into audio with the project's
                  Griffin-Lim, as synthesis does: the best a model's log-mel can sound here
  white noise     Gaussian noise of each recording's length
  silence         zeros of each recording's length
with a language model of all the corpus's sentences, and of the training split's only (the
validation sentences unseen: how much of the score the language model alone gives); then
recordings and Griffin-Lim for every clip of the corpus. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="LJSpeech folder or JSONL manifest")
    parser.add_argument("--make-demo", action="store_true",
                        help="first build the 400-clip demo corpus (seed 0) in --corpus (returns at once if it is there)")
    parser.add_argument("--config", type=Path, default=None, help="config for the data settings and split (default: the defaults)")
    parser.add_argument("--griffin-lim-iterations", type=int, default=32, help="as synthesis uses (default: %(default)s)")
    parser.add_argument("--validation-only", action="store_true", help="skip the whole-corpus rows (the slow part)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    import numpy as np

    from myxtts.config import load_config
    from myxtts.data.manifest import read_manifest, split_train_val
    from myxtts.evaluation.intelligibility import Recognizer, read_pcm16, score_intelligibility
    from myxtts.progress import ProgressLine

    if arguments.make_demo:
        from myxtts.data.demo_corpus import make_demo_corpus

        make_demo_corpus(arguments.corpus, num_utterances=400, seed=0)
    try:
        config = load_config(arguments.config)
        utterances = read_manifest(arguments.corpus)
    except (FileNotFoundError, ValueError) as error:  # a config that does not load; no manifest there, or a bad row (named)
        print(f"error: {error}", file=sys.stderr)
        return 2
    train, val = split_train_val(utterances, config.data.val_fraction, config.seed)
    print(f"corpus {arguments.corpus}: {len(utterances)} clips; validation split {len(val)} "
          f"(val_fraction {config.data.val_fraction}, seed {config.seed})", file=sys.stderr)

    try:
        recordings = {u.audio_path: read_pcm16(u.audio_path) for u in utterances}
    except ValueError as error:  # names the file
        print(f"error: {error}", file=sys.stderr)
        return 2
    griffin_lim = _griffin_lim_of_recording(config.data, arguments.griffin_lim_iterations)
    rng = np.random.default_rng(0)

    def clips(rows, condition):
        for u in rows:
            samples, rate = recordings[u.audio_path]
            if condition == "recordings":
                yield samples, rate, u.text
            elif condition == "Griffin-Lim":
                yield griffin_lim(samples, rate), config.data.sample_rate, u.text
            elif condition == "white noise":
                yield 0.1 * rng.standard_normal(len(samples)).astype(np.float32), rate, u.text
            else:
                yield np.zeros_like(samples), rate, u.text

    start = time.perf_counter()
    recognizers = {"all sentences": Recognizer([u.text for u in utterances]),
                   "training split only": Recognizer([u.text for u in train])}
    print(f"built both recognizers in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    plan = [(f"validation ({len(val)})", val, condition, lm)
            for lm in recognizers for condition in ("recordings", "Griffin-Lim", "white noise", "silence")]
    if not arguments.validation_only:
        plan += [(f"all ({len(utterances)})", utterances, condition, "all sentences")
                 for condition in ("recordings", "Griffin-Lim")]

    print("| clips | audio | language model | WER | errors / words | decode s per audio s |")
    print("|---|---|---|---|---|---|")
    for clip_set, rows, condition, lm in plan:
        # A clip takes about a second to decode here: a whole corpus's row is minutes.
        progress = ProgressLine(f"{clip_set}, {condition}, {lm}", len(rows), "clips", enabled=True)
        result = score_intelligibility(progress.each(clips(rows, condition)), recognizers[lm])
        errors, words = sum(r.errors for r in result.rows), sum(r.words for r in result.rows)
        print(f"| {clip_set} | {condition} | {lm} | {result.wer:.3f} | {errors} / {words} | "
              f"{result.seconds_per_audio_second:.3f} |", flush=True)
    return 0


def _griffin_lim_of_recording(data_config, iterations):
    """samples, rate -> the training pipeline's log-mel of them, back to audio at data.sample_rate."""
    import tensorflow as tf

    from myxtts.data import audio
    from myxtts.models.griffin_lim import log_mel_to_audio

    c = data_config

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def through_log_mel(samples):
        if c.trim_silence_db > 0:
            samples = audio.trim_silence(samples, c.trim_silence_db)
        mel = audio.log_mel(audio.peak_normalize(samples, c.peak_normalize), c)  # [frames, n_mels]
        return log_mel_to_audio(mel, c, iterations)

    def run(samples, rate):
        samples = audio.resample_to(tf.constant(samples), rate, c.sample_rate)
        return through_log_mel(samples).numpy()

    return run


if __name__ == "__main__":
    sys.exit(main())
