"""How good does it sound? Offline quality measures of speech, beside the words (WER) and the voice.

    copy = copy_synthesis(path, data_config)          # the clip as training sees it, and its log-mel vocoded
    stoi(copy.recording, copy.vocoded, rate)           # intelligibility of the vocoded clip against the clip, 0-1
    pesq_wb(copy.recording, copy.vocoded, rate)        # perceived quality against the clip, 1-4.6 (None without `pesq`)
    dnsmos(copy.vocoded, rate)                         # predicted listener scores, no reference needed, 1-5

Copy-synthesis isolates the vocoder: recording -> the model's own log-mel features -> vocoder ->
waveform, compared with the recording. Griffin-Lim is the floor every neural vocoder must clear
(issue 27: PESQ +1.0, DNSMOS overall +0.3). All three run offline, their weights inside their
wheels: STOI (`pystoi`, Taal et al. 2011: short-time correlation of one-third-octave envelopes),
PESQ wide band (`pesq`, ITU-T P.862.2; a C extension built from source, so optional here),
DNSMOS P.835 and P.808 (`speechmos`: Microsoft's ONNX models, run by `onnxruntime`; it reads 16 kHz,
and features through librosa). None of them downloads anything.
"""

from __future__ import annotations

import dataclasses

import numpy as np

MEASURE_RATE = 16000  # PESQ wide band and DNSMOS read 16 kHz


@dataclasses.dataclass
class CopySynthesis:
    recording: np.ndarray  # float32 [n]: the clip as the feature pipeline sees it (resampled, trimmed, normalised)
    vocoded: np.ndarray  # float32 [n]: its log-mel through the vocoder, cut to the same length
    sample_rate: int


def copy_synthesis(path: str, data_config, vocoder=None) -> CopySynthesis:
    """The clip at `path` and its log-mel through `vocoder` (log-mel [frames, n_mels] -> samples;
    Griffin-Lim by default), both as float32 at data.sample_rate, the same length."""
    import tensorflow as tf

    from myxtts.data import audio
    from myxtts.evaluation.speech import trimmed_clip
    from myxtts.models.vocoder import waveform_maker

    recording, _ = trimmed_clip(path, data_config)
    log_mel = audio.log_mel(recording, data_config)
    vocoded = (vocoder or waveform_maker(data_config))(log_mel)
    recording, vocoded = np.asarray(recording, np.float32), np.asarray(tf.convert_to_tensor(vocoded), np.float32)
    n = min(len(recording), len(vocoded))
    return CopySynthesis(recording[:n], vocoded[:n], data_config.sample_rate)


def spectrum_mixes(recording, data_config, vocoder=None, iterations: int = 32) -> dict:
    """Where copy-synthesis loses quality, the magnitude or the phase: `recording` [n] (as `copy_synthesis`
    makes it) rebuilt from mixes of a magnitude (the log-mel's pseudo-inverse "prior", the recording's
    own "true", the `Vocoder`'s) and a phase (Griffin-Lim's from random, `iterations` of them; the
    recording's own; the vocoder's), by the exact inverse STFT. {name: samples float32 [n']}, n' <= n.

    The true phase on the prior magnitude is the most any phase can do for the mel's own magnitude; the
    true magnitude with Griffin-Lim's phase the most any magnitude can do without a better phase."""
    import tensorflow as tf

    from myxtts.data import audio
    from myxtts.models.griffin_lim import griffin_lim, istft, mel_to_magnitude, stft
    from myxtts.models.griffin_lim import unit_phase as unit

    recording = tf.convert_to_tensor(recording, tf.float32)
    log_mel = audio.log_mel(recording, data_config)
    true = stft(recording, data_config)[: tf.shape(log_mel)[0]]

    def rebuilt(magnitude, phase):
        return istft(tf.cast(magnitude, tf.complex64) * phase, data_config)

    magnitudes = {"prior": mel_to_magnitude(log_mel, data_config), "true": tf.abs(true)}
    phases = {"true": unit(true)}
    if vocoder is not None:
        real, imaginary = vocoder.spectrum(log_mel[None])
        spectrum = tf.complex(real[0], imaginary[0])
        magnitudes["vocoder"], phases["vocoder"] = tf.abs(spectrum), unit(spectrum)
    mixes = {}
    for magnitude_name, magnitude in magnitudes.items():
        mixes[f"{magnitude_name} magnitude, Griffin-Lim phase"] = griffin_lim(magnitude, data_config, iterations)
        for phase_name, phase in phases.items():
            mixes[f"{magnitude_name} magnitude, {phase_name} phase"] = rebuilt(magnitude, phase)
    return {name: np.asarray(samples, np.float32) for name, samples in mixes.items()}


def spread_clips(rows, count: int) -> list[str]:
    """The audio paths of `count` manifest rows spread evenly over `rows`: the clips every quality
    measure of a corpus takes (`measure_quality.py`, `magnitude_or_phase.py`), the same each time."""
    step = max(len(rows) // count, 1)
    return [u.audio_path for u in rows[::step][:count]]


def to_measure_rate(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    import soxr

    samples = np.asarray(samples, np.float32)
    return samples if sample_rate == MEASURE_RATE else soxr.resample(samples, sample_rate, MEASURE_RATE).astype(np.float32)


def stoi(reference: np.ndarray, degraded: np.ndarray, sample_rate: int) -> float:
    """Short-time objective intelligibility of `degraded` against `reference` (same length), ~0-1."""
    from pystoi import stoi as pystoi_stoi

    return float(pystoi_stoi(np.asarray(reference, np.float64), np.asarray(degraded, np.float64), sample_rate, extended=False))


# What STOI and DNSMOS import (requirements-quality.txt); PESQ's `pesq` is optional on its own.
QUALITY_PACKAGES = ("pystoi", "speechmos", "onnxruntime", "librosa")


def missing_packages() -> list[str]:
    """The packages of QUALITY_PACKAGES this environment lacks."""
    import importlib.util

    return [name for name in QUALITY_PACKAGES if importlib.util.find_spec(name) is None]


def pesq_available() -> bool:
    try:
        import pesq  # noqa: F401
    except ImportError:
        return False
    return True


def pesq_wb(reference: np.ndarray, degraded: np.ndarray, sample_rate: int) -> float | None:
    """Wide-band PESQ (MOS-LQO, 1.0-4.64) of `degraded` against `reference`; None without the `pesq`
    package (`pip install pesq`: it compiles C sources, so it is not a requirement)."""
    if not pesq_available():
        return None
    from pesq import pesq

    return float(pesq(MEASURE_RATE, to_measure_rate(reference, sample_rate), to_measure_rate(degraded, sample_rate), "wb"))


def dnsmos(samples: np.ndarray, sample_rate: int) -> dict[str, float]:
    """DNSMOS of one clip: `ovrl`, `sig`, `bak` (P.835) and `p808`, each ~1-5, no reference needed."""
    from speechmos import dnsmos as dnsmos_model

    audio = np.clip(to_measure_rate(samples, sample_rate), -1.0, 1.0)
    scores = dnsmos_model.run(audio, MEASURE_RATE)
    return {"ovrl": float(scores["ovrl_mos"]), "sig": float(scores["sig_mos"]), "bak": float(scores["bak_mos"]),
            "p808": float(scores["p808_mos"])}


@dataclasses.dataclass
class QualityReport:
    """Means over clips; `pesq` None when the package is missing."""
    clips: int
    stoi: float
    pesq: float | None
    dnsmos_vocoded: dict
    dnsmos_recordings: dict
    wer: float | None = None  # the copies' word error rate, when a recognizer was given
    wer_recordings: float | None = None

    def line(self, name: str = "Griffin-Lim") -> str:
        pesq_text = f"PESQ-WB {self.pesq:.2f}" if self.pesq is not None else "PESQ-WB not measured (pip install pesq)"
        words = f"; WER {self.wer:.3f} (the recordings {self.wer_recordings:.3f})" if self.wer is not None else ""
        return (f"{name} copy-synthesis of {self.clips} clips: STOI {self.stoi:.3f}, {pesq_text}, DNSMOS overall "
                f"{self.dnsmos_vocoded['ovrl']:.2f} (signal {self.dnsmos_vocoded['sig']:.2f}, background "
                f"{self.dnsmos_vocoded['bak']:.2f}, P.808 {self.dnsmos_vocoded['p808']:.2f}); the recordings' DNSMOS overall "
                f"{self.dnsmos_recordings['ovrl']:.2f} (P.808 {self.dnsmos_recordings['p808']:.2f}){words}")


@dataclasses.dataclass
class RecordingScores:
    """The recordings' own scores, kept across `measure_copy_synthesis` calls over the same clips, so that
    measuring several vocoders scores the recordings once (DNSMOS ~0.2 s a clip, the recognizer more)."""
    dnsmos: dict = dataclasses.field(default_factory=dict)  # audio path -> dnsmos()
    wer: float | None = None


def measure_copy_synthesis(paths, data_config, vocoder=None, label: str | None = None, scorer=None, texts=None,
                           recordings: RecordingScores | None = None) -> QualityReport:
    """STOI, PESQ and DNSMOS of `paths`' copy-synthesis through `vocoder` (Griffin-Lim by default); with a
    `scorer` (`intelligibility.IntelligibilityScorer`) also the word error rate of the copies and of the
    recordings against `texts` (one per path): issue 27 asks that a vocoder lose no words. Pass the same
    `recordings` to every call over these `paths` to score the recordings only once. With `label` (the
    vocoder's name), a progress line on stderr: a clip takes seconds on a CPU, a validation split minutes."""
    from myxtts.progress import ProgressLine

    recordings = RecordingScores() if recordings is None else recordings
    progress = ProgressLine(f"{label} copy-synthesis", len(paths), "clips", enabled=label is not None)
    stois, pesqs, vocoded_scores, recorded_scores, copies, originals = [], [], [], [], [], []
    for number, path in enumerate(paths, 1):
        copy = copy_synthesis(path, data_config, vocoder)
        stois.append(stoi(copy.recording, copy.vocoded, copy.sample_rate))
        pesqs.append(pesq_wb(copy.recording, copy.vocoded, copy.sample_rate))
        vocoded_scores.append(dnsmos(copy.vocoded, copy.sample_rate))
        if path not in recordings.dnsmos:
            recordings.dnsmos[path] = dnsmos(copy.recording, copy.sample_rate)
        recorded_scores.append(recordings.dnsmos[path])
        if scorer is not None:
            copies.append((copy.vocoded, copy.sample_rate, texts[number - 1]))
            if recordings.wer is None:  # held for the recognizer only until they are scored
                originals.append((copy.recording, copy.sample_rate, texts[number - 1]))
        progress.update(number)
    progress.close()

    def mean(scores):
        return {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}

    words = (None, None)
    if scorer is not None:
        copies_wer = scorer.score(copies).wer
        if recordings.wer is None:
            recordings.wer = scorer.score(originals).wer
        words = (copies_wer, recordings.wer)
    return QualityReport(len(stois), float(np.mean(stois)), None if None in pesqs else float(np.mean(pesqs)),
                         mean(vocoded_scores), mean(recorded_scores), *words)
