"""The embedded demo corpus: multi-speaker English speech synthesized locally with espeak-ng.

`make_demo_corpus` writes an LJSpeech-layout corpus that needs no download:

    out_dir/wavs/demo_0001.wav      16-bit PCM mono WAV at 22,050 Hz
    out_dir/metadata.csv            id|text|normalized_text|speaker   (no header row)
    out_dir/.demo_corpus.json       stamp: what was built, written last

The fourth metadata column is this project's extension of LJSpeech: it names the speaker,
one per espeak voice variant (`spk_en-us_f2` for `en-us+f2`). Text and normalized text are
the same sentence because `myxtts.data.sentences` already spells numbers out.

Determinism takes two measures, both checked by the tests:
- espeak-ng keeps synthesis state (oscillator phase, flutter position) in static variables
  that survive between utterances and even `espeak_Terminate`, so the same text renders a
  few samples differently depending on what was spoken before. Each worker initializes
  espeak once and forks a child per utterance, so every rendering starts from the same
  freshly initialized state.
- Breathy variants such as `+f2` mix in noise from espeak's own random generator, which
  is not part of that inherited state (two workers started at different times disagree),
  so it is reseeded before every rendering.
The audio then depends only on (voice, text), and the corpus is byte-identical whatever
the number of cores or the order in which the pool runs jobs.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import sys
import wave
from array import array
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from myxtts.data.sentences import SentenceGenerator
from myxtts.hardware.host import usable_cores
from myxtts.progress import ProgressLine

SAMPLE_RATE = 22_050
# espeak voice variants that synthesize with the bundled data; each becomes one speaker.
DEMO_VOICES = ("en-us", "en-us+f2", "en-us+f3", "en-us+m3", "en+m7")
MIN_DURATION_S = 1.0
MAX_DURATION_S = 12.0
# Bump when anything that changes the bytes written changes (sentences, voices, layout),
# so existing corpora are rebuilt instead of being trusted by their stamp.
FORMAT_VERSION = 1
STAMP_FILENAME = ".demo_corpus.json"
METADATA_FILENAME = "metadata.csv"
# Sentences drawn per utterance before giving up; about one in seventy falls outside the
# duration window, so running out means something is wrong with the voice, not bad luck.
MAX_SENTENCE_ATTEMPTS = 40

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_ENDPAUSE = 0x1000  # a short silence at the end, as after a spoken sentence
_POS_CHARACTER = 1
# Any fixed value works; it only has to be the same for every rendering.
_NOISE_SEED = 1
# int SynthCallback(short *wav, int numsamples, espeak_EVENT *events)
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def speaker_name(voice: str) -> str:
    """The metadata speaker for an espeak voice: 'en-us+f2' -> 'spk_en-us_f2'."""
    return "spk_" + voice.replace("+", "_")


def utterance_id(index: int) -> str:
    """The id of the zero-based `index`-th utterance: 0 -> 'demo_0001'."""
    return f"demo_{index + 1:04d}"


class EspeakEngine:
    """One initialized espeak-ng library in this process, in synchronous mode.

    Rendering appends int16 chunks from espeak's callback and returns them as
    little-endian PCM bytes.
    """

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as error:
            raise RuntimeError(
                "The demo corpus needs the espeak-ng library from the 'espeakng-loader' package: "
                "pip install espeakng-loader"
            ) from error
        library_path = espeakng_loader.get_library_path()
        data_path = espeakng_loader.get_data_path()
        self._library = ctypes.CDLL(library_path)
        self._library.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self._library.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self._library.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        if not hasattr(self._library, "espeak_ng_SetRandSeed"):
            raise RuntimeError(
                f"{library_path} lacks espeak_ng_SetRandSeed (espeakng-loader 0.2.4 ships espeak-ng "
                "1.52.0, which has it); without it the demo corpus is not reproducible. "
                "Upgrade espeakng-loader."
            )
        self._library.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        self._library.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        sample_rate = self._library.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), 0)
        if sample_rate != SAMPLE_RATE:
            raise RuntimeError(
                f"espeak-ng from {library_path} with data {data_path} initialized with result "
                f"{sample_rate}; expected its sample rate, {SAMPLE_RATE}. Reinstall espeakng-loader."
            )
        self._chunks: list[bytes] = []
        # Kept on self: ctypes frees the C trampoline when the Python object is collected,
        # and espeak would then call into freed memory.
        self._callback = _SYNTH_CALLBACK(self._collect_samples)
        self._library.espeak_SetSynthCallback(self._callback)
        # Loading the English dictionary once here means forked children inherit it instead
        # of each reading it from disk.
        self._select_voice(DEMO_VOICES[0])

    def _collect_samples(self, samples, num_samples: int, events) -> int:
        if num_samples > 0:
            self._chunks.append(ctypes.string_at(samples, num_samples * 2))
        return 0  # 0 = keep synthesizing

    def _select_voice(self, voice: str) -> None:
        status = self._library.espeak_SetVoiceByName(voice.encode())
        if status != 0:
            raise RuntimeError(
                f"espeak-ng could not select voice {voice!r} (error code {status}); "
                f"voices known to work: {', '.join(DEMO_VOICES)}"
            )

    def render(self, voice: str, text: str) -> bytes:
        """Synthesizes `text` in this process; the samples still depend on earlier renderings."""
        self._select_voice(voice)
        self._library.espeak_ng_SetRandSeed(_NOISE_SEED)
        self._chunks = []
        encoded = text.encode("utf-8")
        status = self._library.espeak_Synth(
            encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0,
            _ESPEAK_CHARS_UTF8 | _ESPEAK_ENDPAUSE, None, None,
        )
        if status != 0:
            raise RuntimeError(f"espeak-ng failed (error code {status}) with voice {voice!r} on text {text!r}")
        samples = array("h", b"".join(self._chunks))
        if sys.byteorder == "big":
            samples.byteswap()  # WAV stores little-endian samples
        return samples.tobytes()

    def render_isolated(self, voice: str, text: str) -> bytes:
        """Synthesizes `text` in a forked child, so the audio depends only on (voice, text)."""
        read_fd, write_fd = os.pipe()
        child_pid = os.fork()
        if child_pid == 0:
            exit_code = 2
            try:
                os.close(read_fd)
                try:
                    payload, exit_code = b"\x00" + self.render(voice, text), 0
                except RuntimeError as error:  # handed to the parent, which raises it
                    payload, exit_code = b"\x01" + str(error).encode(), 1
                with os.fdopen(write_fd, "wb") as pipe:
                    pipe.write(payload)
            finally:
                # _exit skips the parent's atexit handlers and buffered I/O, which belong to it.
                os._exit(exit_code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
        _, wait_status = os.waitpid(child_pid, 0)
        exit_code = os.waitstatus_to_exitcode(wait_status)
        if exit_code == 1 and payload[:1] == b"\x01":
            raise RuntimeError(payload[1:].decode())
        if exit_code != 0 or payload[:1] != b"\x00":
            raise RuntimeError(f"espeak-ng crashed (exit code {exit_code}) with voice {voice!r} on text {text!r}")
        return payload[1:]


@dataclass(frozen=True)
class _UtteranceJob:
    index: int
    voice: str
    seed: int
    wav_path: Path


@dataclass(frozen=True)
class _RenderedUtterance:
    """One written utterance, as listed in metadata.csv."""

    utterance_id: str
    text: str
    speaker: str
    num_samples: int


# Set by the pool initializer, so each worker process loads and initializes espeak once.
_worker_engine: EspeakEngine | None = None


def _initialize_worker() -> None:
    global _worker_engine
    _worker_engine = EspeakEngine()


def _write_wav(path: Path, pcm: bytes) -> None:
    partial_path = path.with_name(path.name + ".partial")
    with wave.open(str(partial_path), "wb") as wav_file:
        wav_file.setnchannels(1)
        wav_file.setsampwidth(2)
        wav_file.setframerate(SAMPLE_RATE)
        wav_file.writeframes(pcm)
    os.replace(partial_path, path)  # a reader never sees a half-written file


def _synthesize_utterance(job: _UtteranceJob) -> _RenderedUtterance:
    # Each utterance has its own sentence stream, so its text does not depend on which
    # other utterances needed a second draw.
    sentences = SentenceGenerator(f"demo-corpus:{job.seed}:{job.index}")
    durations = []
    for _ in range(MAX_SENTENCE_ATTEMPTS):
        text = sentences.sentence()
        pcm = _worker_engine.render_isolated(job.voice, text)
        num_samples = len(pcm) // 2
        if MIN_DURATION_S <= num_samples / SAMPLE_RATE <= MAX_DURATION_S:
            _write_wav(job.wav_path, pcm)
            return _RenderedUtterance(utterance_id(job.index), text, speaker_name(job.voice), num_samples)
        durations.append(round(num_samples / SAMPLE_RATE, 2))
    raise RuntimeError(
        f"voice {job.voice!r} rendered none of {MAX_SENTENCE_ATTEMPTS} sentences for "
        f"{utterance_id(job.index)} within {MIN_DURATION_S}-{MAX_DURATION_S} s (durations: {durations})"
    )


def _synthesize_all(jobs: list[_UtteranceJob], num_workers: int, progress: bool) -> list[_RenderedUtterance]:
    progress_line = ProgressLine("demo corpus", len(jobs), "utterances", enabled=progress)
    utterances: list[_RenderedUtterance | None] = [None] * len(jobs)
    # spawn, not fork: the caller may be a multithreaded process (TensorFlow), and forking
    # one of those can deadlock. The workers are single-threaded, so their own per-utterance
    # forks are safe.
    pool = ProcessPoolExecutor(
        max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"), initializer=_initialize_worker
    )
    try:
        futures = {pool.submit(_synthesize_utterance, job): job.index for job in jobs}
        for done, future in enumerate(as_completed(futures), start=1):
            utterances[futures[future]] = future.result()
            progress_line.update(done)
    finally:
        # On an error, drop the jobs not yet started instead of synthesizing the rest.
        pool.shutdown(wait=True, cancel_futures=True)
        progress_line.close()
    return utterances


def _write_text_atomically(path: Path, text: str) -> None:
    partial_path = path.with_name(path.name + ".partial")
    partial_path.write_text(text, encoding="utf-8")
    os.replace(partial_path, path)


def _corpus_is_complete(out_dir: Path, expected_stamp: dict) -> bool:
    stamp_path = out_dir / STAMP_FILENAME
    if not stamp_path.is_file():
        return False
    try:
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False  # unreadable stamp: rebuild rather than trust it
    if any(stamp.get(key) != value for key, value in expected_stamp.items()):
        return False
    # Cheap guard against a user deleting files after the stamp was written.
    wav_dir = out_dir / "wavs"
    return (out_dir / METADATA_FILENAME).is_file() and all(
        (wav_dir / f"{utterance_id(index)}.wav").is_file() for index in range(expected_stamp["num_utterances"])
    )


def _remove_leftovers(wav_dir: Path, kept_ids: set[str]) -> None:
    # Only files this module names (demo_*.wav and partial writes) are ours to delete; a
    # larger earlier build leaves ids the new metadata no longer lists.
    for path in wav_dir.iterdir():
        is_ours = path.name.startswith("demo_") and path.name.endswith((".wav", ".wav.partial"))
        if is_ours and path.name.removesuffix(".partial").removesuffix(".wav") not in kept_ids:
            path.unlink()


def make_demo_corpus(
    out_dir: str | os.PathLike,
    num_utterances: int = 400,
    seed: int = 0,
    progress: bool = True,
    *,
    voices: Sequence[str] = DEMO_VOICES,
    num_workers: int | None = None,
) -> Path:
    """Builds the demo corpus in `out_dir` (see the module docstring) and returns its path.

    Returns at once if `out_dir` already holds a complete corpus built with the same
    arguments. Utterance i is spoken by voices[i % len(voices)]. `num_workers` defaults to
    the cores this process may use; it changes speed, never the bytes written.
    """
    if num_utterances < 1:
        raise ValueError(f"num_utterances must be at least 1, got {num_utterances}")
    if not voices:
        raise ValueError("voices must name at least one espeak voice")
    out_dir = Path(out_dir)
    expected_stamp = {
        "format_version": FORMAT_VERSION,
        "num_utterances": num_utterances,
        "seed": seed,
        "sample_rate": SAMPLE_RATE,
        "voices": list(voices),
    }
    if _corpus_is_complete(out_dir, expected_stamp):
        return out_dir

    wav_dir = out_dir / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    # Drop the old stamp before touching any file: if this run is interrupted, no stamp
    # vouches for the mix of old and new files left behind.
    (out_dir / STAMP_FILENAME).unlink(missing_ok=True)

    jobs = [
        _UtteranceJob(index, voices[index % len(voices)], seed, wav_dir / f"{utterance_id(index)}.wav")
        for index in range(num_utterances)
    ]
    workers = max(1, min(num_workers or usable_cores(), num_utterances))
    utterances = _synthesize_all(jobs, workers, progress)

    _remove_leftovers(wav_dir, {utterance.utterance_id for utterance in utterances})
    metadata = "".join(
        f"{utterance.utterance_id}|{utterance.text}|{utterance.text}|{utterance.speaker}\n"
        for utterance in utterances
    )
    _write_text_atomically(out_dir / METADATA_FILENAME, metadata)
    total_seconds = sum(utterance.num_samples for utterance in utterances) / SAMPLE_RATE
    stamp = {**expected_stamp, "total_seconds": round(total_seconds, 3)}
    _write_text_atomically(out_dir / STAMP_FILENAME, json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return out_dir


def total_audio_seconds(corpus_dir: str | os.PathLike) -> float:
    """Sums the durations of the WAV files listed in `corpus_dir`/metadata.csv."""
    corpus_dir = Path(corpus_dir)
    total = 0.0
    for line in (corpus_dir / METADATA_FILENAME).read_text(encoding="utf-8").splitlines():
        with wave.open(str(corpus_dir / "wavs" / f"{line.split('|', 1)[0]}.wav"), "rb") as wav_file:
            total += wav_file.getnframes() / wav_file.getframerate()
    return total
