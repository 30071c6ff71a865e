"""What each stage of a clip's features costs on one core: where the input pipeline's CPU goes.

    python utilities/profile_features.py --corpus /tmp/other_corpus
    python utilities/profile_features.py --wav some.wav --repeats 500

Each stage of the native pipeline (`myxtts.data.audio`, `myxtts.data.pipeline`) runs alone inside a
`tf.function`, on one pinned core with one TensorFlow thread, `--repeats` times per round; the
report gives the median over `--rounds` rounds of the time per call, minus that of an empty
`tf.function` call (the cost of calling, not of the stage). Two ways of taking the STFT's magnitude
are timed side by side, which is why `audio.mel_spectrogram` does not call `tf.abs` on complex numbers.
Numbers are for comparing stages with each other on one machine; a shared machine moves them all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPOSITORY_ROOT / "configs" / "config.yaml"


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time each stage of one clip's features on one CPU core.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="a corpus folder or manifest: its first clip is profiled")
    source.add_argument("--wav", type=Path, help="the WAV file to profile")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="feature settings (default: configs/config.yaml)")
    parser.add_argument("--repeats", type=int, default=200, help="calls per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    if hasattr(os, "sched_setaffinity"):  # before TensorFlow sizes its thread pools
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sys.path.insert(0, str(REPOSITORY_ROOT))
    import numpy as np
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.data import audio, clip_features
    from myxtts.data.manifest import read_manifest

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    c = load_config(arguments.config).data
    wav = arguments.wav or Path(read_manifest(arguments.corpus)[0].audio_path)
    if not wav.is_file():
        print(f"error: no such file: {wav}", file=sys.stderr)
        return 2
    path = tf.constant(str(wav))
    samples, rate = audio.load_wav(path)
    samples = audio.resample_to(samples, rate, c.sample_rate)
    print(f"{wav}: {samples.shape[0] / c.sample_rate:.2f} s at {int(rate)} Hz; one core; "
          f"median of {arguments.rounds} rounds of {arguments.repeats} calls")

    def per_call_ms(function, *inputs) -> float:
        compiled = tf.function(function)
        compiled(*inputs)  # traces
        rounds = []
        for _ in range(arguments.rounds):
            start = time.perf_counter()
            for _ in range(arguments.repeats):
                compiled(*inputs)
            rounds.append((time.perf_counter() - start) / arguments.repeats * 1e3)
        return statistics.median(rounds)

    filters = audio.mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, float(c.fmin), float(c.mel_fmax), c.mel_scale == "htk")
    bins = int(np.max(np.nonzero(filters.any(axis=1)))) + 1
    half = c.n_fft // 2
    frames = tf.signal.frame(tf.pad(samples, [[half, half]]), c.n_fft, c.hop_length)
    spectrum = tf.signal.rfft(frames)[:, :bins]
    stages = [
        ("read the file", lambda p: tf.strings.length(tf.io.read_file(p)), path),
        ("read + decode (audio.load_wav)", lambda p: audio.load_wav(p)[0], path),
        ("trim silence", lambda x: audio.trim_silence(x, c.trim_silence_db or 60.0), samples),
        ("peak-normalise", lambda x: audio.peak_normalize(x, c.peak_normalize), samples),
        ("log-mel of the clip", lambda x: audio.log_mel(x, c), samples),
        ("  of which: frames x window", lambda x: frames * audio._centered_window(c.n_fft, c.win_length), samples),
        ("  of which: FFT", tf.signal.rfft, frames),
        ("  magnitude: tf.abs(complex)", tf.abs, spectrum),
        ("  magnitude: sqrt(re^2 + im^2)", lambda z: tf.sqrt(tf.square(tf.math.real(z)) + tf.square(tf.math.imag(z))), spectrum),
        ("  of which: mel filter matmul", lambda m: tf.matmul(m, filters[:bins]), tf.abs(spectrum)),
        ("reference (read, middle, log-mel)", lambda p: clip_features.reference_log_mel(p, c), path),
    ]
    overhead = per_call_ms(lambda x: x + 1.0, tf.constant(1.0))
    print(f"{'stage':40s} ms per clip")
    for name, function, value in stages:
        print(f"{name:40s} {max(per_call_ms(function, value) - overhead, 0.0):8.3f}")
    print(f"{'(calling an empty tf.function)':40s} {overhead:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
