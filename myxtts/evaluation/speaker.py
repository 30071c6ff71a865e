"""Does it sound like that voice? A speaker encoder independent of the model being trained.

    encoder = SpeakerEncoder()
    voice = encoder.embed_speaker(reference_waveforms, sample_rate)     # [256], unit length
    cosine_similarity(encoder.embed(synthesized, sample_rate), voice)
    identify(encoder.embed(clip, sample_rate), {"alice": voice, ...})   # -> "alice"
    encoder.embed_many(clips, sample_rate)                              # [clips, 256], batched

What the numbers mean, measured on the ten espeak voices of the demo corpus (DEMO_VOICES +
OTHER_VOICES, which GE2E hears as fairly close: one synthesizer, varied pitch and formants):
two ~4.7 s utterances of one voice score 0.91 on average (lowest 0.85), of two voices 0.73
(highest 0.95, en-us against en-us+m1/m3 on the same words); an utterance's own voice's centroid
wins 59 of 60 times. Single sentences (~2.4 s) are noisier: 0.84 vs 0.67, 115 of 120.

The encoder is resemblyzer's GE2E d-vector model (resemblyzer 0.1.4, Apache-2.0: a 3-layer LSTM
40 -> 256 and a Linear 256 -> 256 + ReLU, trained with the GE2E loss of Wan et al. 2018), its
pipeline re-implemented here in numpy so that neither torch nor librosa is needed. The weights are `ge2e_weights.npz` beside this file, made by
`utilities/convert_ge2e_weights.py`. `tests/test_speaker_encoder.py` checks the embeddings
against ones recorded with resemblyzer itself (`tests/reference/record_ge2e_reference.py`).

The pipeline, as resemblyzer's `preprocess_wav` + `VoiceEncoder.embed_utterance`:
1. resample to 16 kHz with soxr's HQ quality (what `librosa.resample` does by default), the
   length fixed to ceil(n * 16000 / rate);
2. raise the volume to -30 dBFS RMS (never lowered);
3. shorten silences longer than ~0.2 s, in 30 ms windows. resemblyzer decides speech with
   webrtcvad (mode 3), which is not a dependency here; `voiced_windows` uses window energy
   instead: a window is speech if its RMS is within `VOICED_BELOW_LOUDEST_DB` of the loudest
   window's. The smoothing and dilation that follow are resemblyzer's;
4. power mel spectrogram, not log: 25 ms Hann window (n_fft 400), 10 ms hop, centred with zero
   padding (librosa >= 0.10), 40 Slaney mel bands up to 8 kHz;
5. windows of 160 frames (1.6 s) at 1.3 per second, the last kept if at least 75% covered
   (the audio is zero-padded for it); each window's embedding is the LSTM's last hidden state
   through Linear + ReLU, L2-normalised; the utterance's is their mean, L2-normalised again.

Agreement with resemblyzer itself (ten espeak clips, 0.8-6 s): cosine >= 0.9999999 without the
silence trimming, >= 0.992 with it (six of ten 1.000000; the energy rule agrees with webrtcvad on
92.5% of windows). Speed on one core: ~40 ms per 2.4 s clip through `embed_many`, ~90 ms through
`embed`. The LSTM's matmuls are small, so BLAS threads only get in each other's way: on two busy
cores `OPENBLAS_NUM_THREADS=1` (or threadpoolctl) made it ten times faster.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import soxr

WEIGHTS_PATH = Path(__file__).with_name("ge2e_weights.npz")
SAMPLE_RATE = 16_000
N_FFT = 400  # 25 ms
HOP_LENGTH = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIALS_PER_SECOND = 1.3
MIN_COVERAGE = 0.75
TARGET_DBFS = -30.0
INT16_MAX = 2**15 - 1
NUM_LAYERS = 3
HIDDEN_SIZE = 256
# Silence trimming (resemblyzer's hparams): 30 ms windows, an 8-window moving average, and voiced
# regions widened by 3 windows each side, so that pauses up to ~6 windows survive.
VAD_WINDOW = 30 * SAMPLE_RATE // 1000
VAD_MOVING_AVERAGE_WIDTH = 8
VAD_MAX_SILENCE_WINDOWS = 6
# A window counts as speech when its RMS is within this many dB of the loudest window's.
VOICED_BELOW_LOUDEST_DB = 45.0


def _as_float(waveform: np.ndarray) -> np.ndarray:
    waveform = np.asarray(waveform)
    if waveform.ndim != 1:
        raise ValueError(f"expected a mono waveform [samples], got shape {waveform.shape}")
    if np.issubdtype(waveform.dtype, np.integer):
        return waveform.astype(np.float32) / 32768.0  # int16 PCM, as librosa.load reads it
    return waveform.astype(np.float32)


def resample(waveform: np.ndarray, sample_rate: int) -> np.ndarray:
    """`waveform` at 16 kHz, as `librosa.resample(res_type="soxr_hq")`."""
    if sample_rate == SAMPLE_RATE:
        return waveform
    length = math.ceil(len(waveform) * SAMPLE_RATE / sample_rate)
    resampled = soxr.resample(waveform, sample_rate, SAMPLE_RATE, quality="HQ")
    fixed = np.zeros(length, np.float32)
    fixed[: min(length, len(resampled))] = resampled[:length]
    return fixed


def normalize_volume(waveform: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """`waveform` raised (never lowered) to an RMS of `target_dbfs`."""
    rms = np.sqrt(np.mean((waveform.astype(np.float64) * INT16_MAX) ** 2))
    if rms == 0.0:
        return waveform
    change_db = target_dbfs - 20.0 * np.log10(rms / INT16_MAX)
    return waveform if change_db < 0 else (waveform * 10 ** (change_db / 20)).astype(np.float32)


def voiced_windows(waveform: np.ndarray) -> np.ndarray:
    """[len // VAD_WINDOW] bool: which 30 ms windows hold speech (the stand-in for webrtcvad)."""
    windows = waveform[: len(waveform) - len(waveform) % VAD_WINDOW].reshape(-1, VAD_WINDOW)
    energy = np.mean(windows.astype(np.float64) ** 2, axis=1)
    if len(energy) == 0 or energy.max() == 0.0:
        return np.zeros(len(energy), bool)
    return energy > energy.max() * 10 ** (-VOICED_BELOW_LOUDEST_DB / 10)


def trim_long_silences(waveform: np.ndarray, voiced: np.ndarray) -> np.ndarray:
    """`waveform` cut to whole 30 ms windows, without silences longer than about 0.2 s.

    `voiced` flags each window; as resemblyzer, the flags are smoothed with a moving average,
    rounded, and each voiced window widens its region by `VAD_MAX_SILENCE_WINDOWS // 2` windows.
    """
    waveform = waveform[: len(voiced) * VAD_WINDOW]
    width = VAD_MOVING_AVERAGE_WIDTH
    padded = np.concatenate((np.zeros((width - 1) // 2), voiced.astype(float), np.zeros(width // 2)))
    sums = np.cumsum(padded)
    sums[width:] = sums[width:] - sums[:-width]
    smoothed = np.round(sums[width - 1 :] / width).astype(bool)
    reach = VAD_MAX_SILENCE_WINDOWS // 2
    # binary dilation by a (2 * reach + 1)-window structure: voiced if any window within reach is
    kept = np.convolve(smoothed.astype(np.int64), np.ones(2 * reach + 1, np.int64), mode="same") > 0
    return waveform[np.repeat(kept, VAD_WINDOW)]


def preprocess_wav(waveform: np.ndarray, sample_rate: int, trim_silence: bool = True) -> np.ndarray:
    """[samples at 16 kHz] float32, ready for `mel_frames`: resampled, louder, silences shortened."""
    wav = normalize_volume(resample(_as_float(waveform), sample_rate))
    return trim_long_silences(wav, voiced_windows(wav)) if trim_silence else wav


@functools.lru_cache(maxsize=1)
def _mel_basis() -> np.ndarray:
    """[N_FFT // 2 + 1, N_MELS]: librosa.filters.mel(sr=16000, n_fft=400, n_mels=40) transposed
    (Slaney's mel scale: linear below 1 kHz, logarithmic above; each band normalised to unit area)."""
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp

    def hz_to_mel(hz):
        return np.where(hz >= min_log_hz, min_log_mel + np.log(np.maximum(hz, 1e-10) / min_log_hz) / logstep, hz / f_sp)

    def mel_to_hz(mel):
        return np.where(mel >= min_log_mel, min_log_hz * np.exp(logstep * (mel - min_log_mel)), f_sp * mel)

    fft_hz = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    band_hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE / 2.0), N_MELS + 2))
    spacing = np.diff(band_hz)
    ramps = band_hz[:, None] - fft_hz[None, :]  # [N_MELS + 2, bins]
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (band_hz[2:] - band_hz[:-2]))[:, None]
    return weights.T.astype(np.float32)


def mel_frames(waveform: np.ndarray) -> np.ndarray:
    """[1 + len // HOP_LENGTH, N_MELS] float32 power mel spectrogram (not log) of 16 kHz audio."""
    padded = np.pad(waveform.astype(np.float32), N_FFT // 2)  # centred frames, zero padding
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH]  # [frames, N_FFT]
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # [frames, bins]
    return (power.astype(np.float32) @ _mel_basis()).astype(np.float32)


def partial_slices(num_samples: int, rate: float = PARTIALS_PER_SECOND, min_coverage: float = MIN_COVERAGE) -> list[slice]:
    """Frame ranges of the partial utterances (resemblyzer's `compute_partial_slices`; they may run
    past the audio, which is then zero-padded to `slices[-1].stop * HOP_LENGTH` samples)."""
    num_frames = int(np.ceil((num_samples + 1) / HOP_LENGTH))
    frame_step = int(np.round((SAMPLE_RATE / rate) / HOP_LENGTH))
    if not 0 < frame_step <= PARTIAL_FRAMES:
        raise ValueError(f"rate {rate} partials per second is outside (0.625, 100]")
    steps = max(1, num_frames - PARTIAL_FRAMES + frame_step + 1)
    slices = [slice(start, start + PARTIAL_FRAMES) for start in range(0, steps, frame_step)]
    last_start = slices[-1].start * HOP_LENGTH
    coverage = (num_samples - last_start) / (PARTIAL_FRAMES * HOP_LENGTH)
    if coverage < min_coverage and len(slices) > 1:
        slices = slices[:-1]
    return slices


@functools.lru_cache(maxsize=4)
def load_weights(path: Path = WEIGHTS_PATH) -> dict[str, np.ndarray]:
    """The encoder's arrays (layout: `utilities/convert_ge2e_weights.py`), read once per path."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} is missing: make it with `python utilities/convert_ge2e_weights.py --source <Resemblyzer-0.1.4 wheel>`")
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files if name != "source"}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic


def encode_partials(mels: np.ndarray, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """[partials, PARTIAL_FRAMES, N_MELS] mels -> [partials, 256] unit-length embeddings."""
    sequence = mels.astype(np.float32)
    batch = len(sequence)
    for layer in range(NUM_LAYERS):
        # the input half of every step's gates at once: [batch, frames, 4 * hidden], gates (i, f, g, o)
        inputs = sequence @ weights[f"lstm{layer}_w_ih"] + weights[f"lstm{layer}_bias"]
        w_hh = weights[f"lstm{layer}_w_hh"]
        hidden = np.zeros((batch, HIDDEN_SIZE), np.float32)
        cell = np.zeros((batch, HIDDEN_SIZE), np.float32)
        outputs = np.empty((batch, sequence.shape[1], HIDDEN_SIZE), np.float32)
        for frame in range(sequence.shape[1]):
            gates = inputs[:, frame] + hidden @ w_hh
            i, f, g, o = np.split(gates, 4, axis=1)
            cell = _sigmoid(f) * cell + _sigmoid(i) * np.tanh(g)
            hidden = _sigmoid(o) * np.tanh(cell)
            outputs[:, frame] = hidden
        sequence = outputs
    raw = np.maximum(hidden @ weights["linear_w"] + weights["linear_b"], 0.0)  # last layer's final state
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


def _unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float32)


class SpeakerEncoder:
    """GE2E d-vectors of waveforms; the weights are read on the first embedding, not on import."""

    def __init__(self, weights_path: str | Path = WEIGHTS_PATH, trim_silence: bool = True):
        self.weights_path = Path(weights_path)
        self.trim_silence = trim_silence

    def _partial_mels(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        """[partials, PARTIAL_FRAMES, N_MELS] of one utterance."""
        wav = preprocess_wav(waveform, sample_rate, self.trim_silence)
        if len(wav) == 0:
            raise ValueError(f"nothing left of a {len(waveform)}-sample waveform after preprocessing (silent?)")
        slices = partial_slices(len(wav))
        needed = slices[-1].stop * HOP_LENGTH
        if needed >= len(wav):
            wav = np.pad(wav, (0, needed - len(wav)))
        mel = mel_frames(wav)  # [frames, N_MELS]
        return np.stack([mel[s] for s in slices])

    def embed_many(self, waveforms: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """[utterances, 256] unit-length embeddings, one per waveform (mono float in [-1, 1], or
        int16 PCM). All the utterances' partials go through the LSTM as one batch: per clip this
        is several times faster than `embed` one by one."""
        if not len(waveforms):
            raise ValueError("no waveforms to embed")
        mels = [self._partial_mels(waveform, sample_rate) for waveform in waveforms]
        partials = encode_partials(np.concatenate(mels), load_weights(self.weights_path))
        bounds = np.cumsum([0] + [len(mel) for mel in mels])
        return np.stack([_unit(partials[start:stop].mean(axis=0)) for start, stop in zip(bounds, bounds[1:])])

    def embed(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        """[256] unit-length embedding of one utterance."""
        return self.embed_many([waveform], sample_rate)[0]

    def embed_speaker(self, waveforms: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """[256] unit-length mean of the utterances' embeddings: one voice from several clips."""
        return _unit(self.embed_many(waveforms, sample_rate).mean(axis=0))


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of the angle between two embeddings (1: same direction)."""
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def identify(embedding: np.ndarray, candidates: Mapping[str, np.ndarray]) -> str:
    """The name of the candidate embedding most similar to `embedding`."""
    if not candidates:
        raise ValueError("identify needs at least one candidate")
    return max(candidates, key=lambda name: cosine_similarity(embedding, candidates[name]))
