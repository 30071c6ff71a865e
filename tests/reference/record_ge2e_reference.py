"""Record the resemblyzer embeddings that `tests/test_speaker_encoder.py` checks `myxtts.evaluation.speaker` against.

The reference is resemblyzer 0.1.4 itself (its `preprocess_wav` and `VoiceEncoder`, run by torch).
Torch must never become a dependency of MyXTTS, so this runs in two steps in two environments,
and the only product is the committed `tests/reference/ge2e_reference.npz`:

    # 1. render the clips with the project's espeak-ng (project venv)
    .venv/bin/python tests/reference/record_ge2e_reference.py render --out tests/reference/ge2e_reference.npz
    # 2. embed them with resemblyzer (a throwaway venv; torch 2.13.0's CPU wheel is on this machine kind)
    python3 -m venv /tmp/rzvenv
    /tmp/rzvenv/bin/pip install torch==2.13.0 Resemblyzer==0.1.4 "setuptools<81"
    /tmp/rzvenv/bin/python tests/reference/record_ge2e_reference.py record --out tests/reference/ge2e_reference.npz

(`setuptools<81`: webrtcvad 2.0.10 imports `pkg_resources`, which newer setuptools no longer has.)
Recorded with torch 2.13.0+cpu, resemblyzer 0.1.4, librosa 0.11.0, webrtcvad 2.0.10, scipy 1.17.1,
numpy 2.4.6, Python 3.11.

The file holds, per clip (`voices`, `texts`, `lengths`; `audio` is the clips' int16 samples at
22,050 Hz laid end to end):
    resemblyzer_full      [clips, 256]  embed_utterance(preprocess_wav(wav, 22050)): resample,
                                        volume, webrtcvad silence trimming
    resemblyzer_untrimmed [clips, 256]  the same without the trimming (librosa.resample and
                                        normalize_volume only): compares the numerics alone
    vad_flags_{i}         [windows]     webrtcvad's per-30 ms decision on clip i (after resampling
                                        and volume), for checking the energy-based stand-in
    trimmed_lengths       [clips]       samples left after resemblyzer's trimming
"""

import argparse
import platform
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE_RATE = 22_050
# (voice, text): every voice of DEMO_VOICES and OTHER_VOICES once; lengths from ~1 s (one
# zero-padded partial) to ~9 s (a dozen partials), some with pauses for the silence trimming.
CLIPS = (
    ("en-us", "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."),
    ("en-us+f2", "Hello."),
    ("en-us+f3", "Please call Stella. Ask her to bring these things with her from the store."),
    ("en-us+m3", "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob."),
    ("en+m7", "We also need a small plastic snake and a big toy frog for the kids."),
    ("en-us+f1", "She can scoop these things into three red bags... and we will go meet her Wednesday at the train station."),
    ("en-us+f4", "Good morning, how are you today?"),
    ("en-us+m1", "Numbers like one, two, three; then silence; then four, five, six."),
    ("en-us+m2", "It was the best of times, it was the worst of times."),
    ("en-us+m5", "A speaker encoder maps any utterance to a point on a sphere."),
)


def render(out: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from myxtts.data.demo_corpus import SAMPLE_RATE, EspeakEngine

    assert SAMPLE_RATE == SOURCE_RATE
    engine = EspeakEngine()
    clips = [np.frombuffer(engine.render_isolated(voice, text).pcm, "<i2") for voice, text in CLIPS]
    np.savez_compressed(
        out,
        voices=np.array([voice for voice, _ in CLIPS]),
        texts=np.array([text for _, text in CLIPS]),
        lengths=np.array([len(clip) for clip in clips]),
        audio=np.concatenate(clips),
        sample_rate=SOURCE_RATE,
    )
    print(f"rendered {len(clips)} clips, {sum(map(len, clips)) / SOURCE_RATE:.1f} s, into {out}")


def record(out: Path) -> None:
    import importlib.metadata
    import struct

    import librosa
    import torch
    import webrtcvad
    from resemblyzer import VoiceEncoder, preprocess_wav
    from resemblyzer import audio as rz_audio
    from resemblyzer.hparams import audio_norm_target_dBFS, sampling_rate, vad_window_length

    with np.load(out) as archive:
        stored = dict(archive)
    bounds = np.cumsum(np.concatenate([[0], stored["lengths"]]))
    clips = [stored["audio"][start:stop].astype(np.float32) / 32768.0 for start, stop in zip(bounds, bounds[1:])]
    torch.set_num_threads(1)
    encoder = VoiceEncoder("cpu")
    full, untrimmed, trimmed_lengths, flags = [], [], [], {}
    window = vad_window_length * sampling_rate // 1000
    for index, clip in enumerate(clips):
        wav = preprocess_wav(clip, SOURCE_RATE)
        trimmed_lengths.append(len(wav))
        full.append(encoder.embed_utterance(wav))
        plain = librosa.resample(clip, orig_sr=SOURCE_RATE, target_sr=sampling_rate)
        plain = rz_audio.normalize_volume(plain, audio_norm_target_dBFS, increase_only=True)
        untrimmed.append(encoder.embed_utterance(plain))
        # the decisions trim_long_silences makes, window by window
        cut = plain[: len(plain) - len(plain) % window]
        pcm = struct.pack("%dh" % len(cut), *(np.round(cut * 32767)).astype(np.int16))
        vad = webrtcvad.Vad(mode=3)
        flags[f"vad_flags_{index}"] = np.array(
            [vad.is_speech(pcm[start * 2 : (start + window) * 2], sample_rate=sampling_rate) for start in range(0, len(cut), window)]
        )
    versions = {name: importlib.metadata.version(name) for name in ("torch", "resemblyzer", "librosa", "webrtcvad", "scipy", "numpy")}
    stored.update(
        resemblyzer_full=np.array(full, np.float32),
        resemblyzer_untrimmed=np.array(untrimmed, np.float32),
        trimmed_lengths=np.array(trimmed_lengths),
        recorded_with=np.array(f"{versions}, Python {platform.python_version()}"),
        **flags,
    )
    np.savez_compressed(out, **stored)
    print(f"recorded {len(clips)} embeddings with {versions} into {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("render", "record"))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "reference" / "ge2e_reference.npz")
    args = parser.parse_args()
    render(args.out) if args.step == "render" else record(args.out)


if __name__ == "__main__":
    main()
