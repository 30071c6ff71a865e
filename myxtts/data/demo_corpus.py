"""The embedded demo corpus: multi-speaker English speech synthesized locally with espeak-ng.

`make_demo_corpus` writes a corpus that needs no download:

    out_dir/wavs/demo_0001.wav          16-bit PCM mono WAV at 22,050 Hz
    out_dir/wavs/demo_0001.timing.json  when each phoneme starts, and its frames (`phoneme_timing.py`)
    out_dir/manifest.jsonl              one row per clip (`manifest.py`'s JSONL format):
        {"audio_path": "wavs/demo_0001.wav", "text": ..., "speaker": "spk_en-us_f2",
         "duration": 2.55, "phonemes": "həlˈoʊ, wˈɜːld!", "language": "en-us"}
    out_dir/.demo_corpus.json           stamp: what was built, written last

`data.train_data: demo_corpus` reads the folder through its manifest.jsonl like any prepared
dataset. Each speaker is one espeak voice variant (`spk_en-us_f2` for `en-us+f2`); the named voice sets
(`demo`, `other`, `many`, `heldout`) are in `demo_voices.py`. The text is
the sentence as spoken (`myxtts.data.sentences` already spells numbers out); `phonemes` is what
the model reads, made by the same front end as training and synthesis (`phonemes.phonemize`, in
the corpus's `language`), so the demo trains on phonemes without a preparation step.

Determinism takes two measures, both checked by the tests:
- espeak-ng keeps synthesis state (oscillator phase, flutter position) in static variables
  that survive between utterances and even `espeak_Terminate`, so the same text renders a
  few samples differently depending on what was spoken before. Each worker initializes
  espeak once and forks a child per utterance, so every rendering starts from the same
  freshly initialized state (and the child phonemizes the text too, after rendering, so that
  this leaves no state behind either).
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
import struct
import sys
import tempfile
import wave
from array import array
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from myxtts.data import espeak
from myxtts.data.demo_voices import (  # noqa: F401 (OTHER_VOICES: re-exported)
    DEMO_VOICES, OTHER_VOICES, check_voices, data_with_random_voices, random_index)
from myxtts.data.manifest import MANIFEST_JSONL, Utterance, read_manifest, write_jsonl
from myxtts.data.phoneme_timing import DEFAULT_HOP_LENGTH, TIMING_SUFFIX, PhonemeTiming, timing_path
from myxtts.data.phonemes import check_language, phonemize
from myxtts.data.sentences import SentenceGenerator
from myxtts.hardware.host import usable_cores
from myxtts.output_paths import folder_problem
from myxtts.progress import ProgressLine

SAMPLE_RATE = espeak.SAMPLE_RATE
# The front end's language for the manifest's phonemes (data.language's default).
DEMO_LANGUAGE = "en-us"
MIN_DURATION_S = 1.0
MAX_DURATION_S = 12.0
# Bump when anything that changes the bytes written changes (sentences, voices, layout),
# so existing corpora are rebuilt instead of being trusted by their stamp.
# 2: manifest.jsonl with phonemes instead of metadata.csv; per-clip phoneme timing files.
FORMAT_VERSION = 3
STAMP_FILENAME = ".demo_corpus.json"
MANIFEST_FILENAME = MANIFEST_JSONL
# Format 1 wrote an LJSpeech metadata.csv, which manifest readers would still prefer.
_FORMAT_1_METADATA = "metadata.csv"
# Sentences drawn per utterance before giving up; about one in seventy falls outside the
# duration window, so running out means something is wrong with the voice, not bad luck.
MAX_SENTENCE_ATTEMPTS = 40
# Any fixed value works; it only has to be the same for every rendering.
_NOISE_SEED = 1


def speaker_name(voice: str) -> str:
    """The manifest speaker for an espeak voice: 'en-us+f2' -> 'spk_en-us_f2'."""
    return "spk_" + voice.replace("+", "_")


def utterance_id(index: int) -> str:
    """The id of the zero-based `index`-th utterance: 0 -> 'demo_0001'."""
    return f"demo_{index + 1:04d}"


@dataclass(frozen=True)
class Rendering:
    """One sentence rendered by one voice: audio, where its phonemes start, and its phoneme string."""

    pcm: bytes  # little-endian int16 samples
    phoneme_names: tuple[str, ...]
    phoneme_starts: tuple[int, ...]  # samples from the start of the clip
    phonemes: str  # the front end's string for the text (phonemes.phonemize)

    @property
    def num_samples(self) -> int:
        return len(self.pcm) // 2


class EspeakEngine:
    """Renders text with this process's espeak-ng (`espeak.library()`), in synchronous mode.

    The synthesis callback appends int16 chunks and the phoneme events (IPA name, start sample)
    that come with them.
    """

    def __init__(self):
        self._espeak = espeak.library()
        self._chunks: list[bytes] = []
        self._events: list[tuple[str, int]] = []
        self._espeak.set_synth_callback(self._collect)
        # Loading the English dictionary once here means forked children inherit it instead
        # of each reading it from disk.
        self._select_voice(DEMO_VOICES[0])

    def _collect(self, samples, num_samples: int, events) -> int:
        index = 0
        while events[index].type != espeak.EVENT_LIST_TERMINATED:
            if events[index].type == espeak.EVENT_PHONEME:
                self._events.append((espeak.event_name(events[index]), events[index].sample))
            index += 1
        if num_samples > 0:
            self._chunks.append(ctypes.string_at(samples, num_samples * 2))
        return 0  # 0 = keep synthesizing

    def _select_voice(self, voice: str) -> None:
        status = self._espeak.select_voice(voice)
        if status != 0:
            raise RuntimeError(
                f"espeak-ng could not select voice {voice!r} (error code {status}); "
                f"voices known to work: {', '.join(DEMO_VOICES + OTHER_VOICES)}"
            )

    def render(self, voice: str, text: str) -> tuple[bytes, list[tuple[str, int]]]:
        """(PCM, phoneme events) of `text` rendered in this process; the samples still depend on
        earlier renderings (see `render_isolated`)."""
        with self._espeak.lock:  # voice, seed and synthesis as one step: espeak-ng's state is global
            self._select_voice(voice)
            self._espeak.set_random_seed(_NOISE_SEED)
            self._chunks, self._events = [], []
            status = self._espeak.synthesize(text)
        if status != 0:
            raise RuntimeError(f"espeak-ng failed (error code {status}) with voice {voice!r} on text {text!r}")
        samples = array("h", b"".join(self._chunks))
        if sys.byteorder == "big":
            samples.byteswap()  # WAV stores little-endian samples
        return samples.tobytes(), self._events

    def render_isolated(self, voice: str, text: str, language: str = DEMO_LANGUAGE) -> Rendering:
        """Renders `text` and phonemizes it in `language`, in a forked child, so the audio depends
        only on (voice, text) and this process's espeak state stays as it was."""
        read_fd, write_fd = os.pipe()
        child_pid = os.fork()
        if child_pid == 0:
            exit_code = 2
            try:
                os.close(read_fd)
                try:
                    pcm, events = self.render(voice, text)
                    header = json.dumps({"events": events, "phonemes": phonemize(text, language)}).encode()
                    payload, exit_code = b"\x00" + struct.pack("<I", len(header)) + header + pcm, 0
                except (RuntimeError, ValueError) as error:  # handed to the parent, which raises it
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
        (header_length,) = struct.unpack("<I", payload[1:5])
        header = json.loads(payload[5 : 5 + header_length])
        pcm = payload[5 + header_length :]
        names = tuple(name for name, _ in header["events"])
        starts = tuple(sample for _, sample in header["events"])
        if not names or any(later < earlier for earlier, later in zip(starts, starts[1:])) or starts[-1] > len(pcm) // 2:
            raise RuntimeError(
                f"espeak-ng reported phoneme events that do not fit the audio ({len(names)} events, starts "
                f"{starts[:3]}...{starts[-3:]}, {len(pcm) // 2} samples) with voice {voice!r} on text {text!r}"
            )
        return Rendering(pcm, names, starts, header["phonemes"])


@dataclass(frozen=True)
class _UtteranceJob:
    index: int
    voice: str
    seed: int
    language: str
    timing_hop_length: int
    wav_path: Path


# Set by the pool initializer, so each worker process loads and initializes espeak once.
_worker_engine: EspeakEngine | None = None


def _initialize_worker(data_path: str) -> None:
    global _worker_engine
    os.environ[espeak.DATA_PATH_VARIABLE] = data_path  # this worker's espeak-ng: the corpus's data folder
    _worker_engine = EspeakEngine()


def _write_wav(path: Path, pcm: bytes) -> None:
    partial_path = path.with_name(path.name + ".partial")
    with wave.open(str(partial_path), "wb") as wav_file:
        wav_file.setnchannels(1)
        wav_file.setsampwidth(2)
        wav_file.setframerate(SAMPLE_RATE)
        wav_file.writeframes(pcm)
    os.replace(partial_path, path)  # a reader never sees a half-written file


def _synthesize_utterance(job: _UtteranceJob) -> Utterance:
    # Each utterance has its own sentence stream, so its text does not depend on which
    # other utterances needed a second draw.
    sentences = SentenceGenerator(f"demo-corpus:{job.seed}:{job.index}")
    durations = []
    for _ in range(MAX_SENTENCE_ATTEMPTS):
        text = sentences.sentence()
        rendering = _worker_engine.render_isolated(job.voice, text, job.language)
        duration_s = rendering.num_samples / SAMPLE_RATE
        if MIN_DURATION_S <= duration_s <= MAX_DURATION_S:
            _write_wav(job.wav_path, rendering.pcm)
            timing = PhonemeTiming(job.voice, SAMPLE_RATE, rendering.num_samples, rendering.phoneme_names,
                                   rendering.phoneme_starts)
            _write_text_atomically(timing_path(job.wav_path), timing.to_json(job.timing_hop_length))
            return Utterance(f"wavs/{job.wav_path.name}", text, speaker_name(job.voice), duration_s,
                             rendering.phonemes, job.language)
        durations.append(round(duration_s, 2))
    raise RuntimeError(
        f"voice {job.voice!r} rendered none of {MAX_SENTENCE_ATTEMPTS} sentences for "
        f"{utterance_id(job.index)} within {MIN_DURATION_S}-{MAX_DURATION_S} s (durations: {durations})"
    )


def _synthesize_all(jobs: list[_UtteranceJob], num_workers: int, progress: bool, data_path: str) -> list[Utterance]:
    progress_line = ProgressLine("demo corpus", len(jobs), "utterances", enabled=progress)
    utterances: list[Utterance | None] = [None] * len(jobs)
    # spawn, not fork: the caller may be a multithreaded process (TensorFlow), and forking
    # one of those can deadlock. The workers are single-threaded, so their own per-utterance
    # forks are safe.
    pool = ProcessPoolExecutor(
        max_workers=num_workers, mp_context=multiprocessing.get_context("spawn"), initializer=_initialize_worker,
        initargs=(data_path,),
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
    return (out_dir / MANIFEST_FILENAME).is_file() and all(
        (wav_dir / f"{utterance_id(index)}{suffix}").is_file()
        for index in range(expected_stamp["num_utterances"])
        for suffix in (".wav", TIMING_SUFFIX)
    )


def _clip_id(file_name: str) -> str | None:
    """The utterance id of a file this module writes in wavs/ (a clip, its timing, either half
    written), None for any other name."""
    name = file_name.removesuffix(".partial")
    stem = name.removesuffix(".wav").removesuffix(TIMING_SUFFIX)
    return stem if name.startswith("demo_") and stem != name else None


def _remove_leftovers(out_dir: Path, kept_ids: set[str]) -> None:
    # Only files this module names (demo_* clips, timings and partial writes) are ours to
    # delete; a larger earlier build leaves ids the new manifest no longer lists.
    for path in (out_dir / "wavs").iterdir():
        if (clip := _clip_id(path.name)) is not None and clip not in kept_ids:
            path.unlink()
    # A format-1 build's metadata.csv would be read instead of the new manifest.jsonl.
    old_metadata = out_dir / _FORMAT_1_METADATA
    if old_metadata.is_file() and old_metadata.read_text(encoding="utf-8", errors="replace").startswith("demo_0001|"):
        old_metadata.unlink()


def _not_written_here(out_dir: Path) -> list[str]:
    """What in `out_dir` no demo corpus build wrote: a build there would overwrite the folder's
    manifest.jsonl, so a user's own corpus (or anything else) is refused, never rebuilt over."""
    if not out_dir.is_dir():
        return []
    foreign = []
    for path in sorted(out_dir.iterdir()):
        if path.name in (STAMP_FILENAME, MANIFEST_FILENAME + ".partial"):
            continue
        if path.name == "wavs" and path.is_dir():
            foreign += [f"wavs/{clip.name}" for clip in sorted(path.iterdir()) if _clip_id(clip.name) is None]
        elif path.name == MANIFEST_FILENAME and path.is_file():
            if not _lists_demo_clips_only(path):
                foreign.append(f"{MANIFEST_FILENAME} (rows of other clips)")
        elif not (path.name == _FORMAT_1_METADATA and path.is_file()
                  and path.read_text(encoding="utf-8", errors="replace").startswith("demo_0001|")):
            foreign.append(path.name)
    return foreign


def _lists_demo_clips_only(manifest: Path) -> bool:
    try:
        rows = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
        return all(_clip_id(Path(row["audio_path"]).name) is not None for row in rows)
    except (OSError, ValueError, TypeError, KeyError):
        return False


def make_demo_corpus(
    out_dir: str | os.PathLike,
    num_utterances: int = 400,
    seed: int = 0,
    progress: bool = True,
    *,
    voices: Sequence[str] = DEMO_VOICES,
    language: str = DEMO_LANGUAGE,
    timing_hop_length: int = DEFAULT_HOP_LENGTH,
    num_workers: int | None = None,
) -> Path:
    """Builds the demo corpus in `out_dir` (see the module docstring) and returns its path.

    Returns at once if `out_dir` already holds a complete corpus built with the same
    arguments. Utterance i is spoken by voices[i % len(voices)]; `seed` picks the sentences;
    `language` is the front end's language for the manifest's phonemes; `timing_hop_length` the
    hop the timing files count frames at. `num_workers` defaults to the cores this process may
    use; it changes speed, never the bytes written.
    """
    if num_utterances < 1:
        raise ValueError(f"num_utterances must be at least 1, got {num_utterances}")
    if not voices:
        raise ValueError("voices must name at least one espeak voice")
    if timing_hop_length <= 0:
        raise ValueError(f"timing_hop_length must be positive, got {timing_hop_length}")
    out_dir = Path(out_dir)
    if problem := folder_problem(out_dir, "the corpus folder"):
        raise ValueError(problem)
    expected_stamp = {
        "format_version": FORMAT_VERSION,
        "num_utterances": num_utterances,
        "seed": seed,
        "sample_rate": SAMPLE_RATE,
        "voices": list(voices),
        "language": language,
        "timing_hop_length": timing_hop_length,
    }
    if _corpus_is_complete(out_dir, expected_stamp):
        return out_dir
    if foreign := _not_written_here(out_dir):
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise ValueError(f"{out_dir} holds files no demo corpus build wrote ({shown}): building there would overwrite "
                         f"its {MANIFEST_FILENAME}. Nothing was changed; give a new or empty folder (--out), or an "
                         "earlier demo corpus")
    check_language(language, key="language")  # here, not once per worker
    with tempfile.TemporaryDirectory(prefix="myxtts-espeak-") as scratch:
        data_path = espeak.library().data_path
        if any(random_index(voice) is not None for voice in voices):
            data_path = data_with_random_voices(voices, data_path, scratch)
        check_voices(voices, data_path)
        _build(out_dir, num_utterances, seed, voices, language, timing_hop_length, num_workers, progress,
               expected_stamp, str(data_path))
    return out_dir


def _build(out_dir, num_utterances, seed, voices, language, timing_hop_length, num_workers, progress,
           expected_stamp, data_path: str) -> None:
    wav_dir = out_dir / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    # Drop the old stamp before touching any file: if this run is interrupted, no stamp
    # vouches for the mix of old and new files left behind.
    (out_dir / STAMP_FILENAME).unlink(missing_ok=True)

    jobs = [
        _UtteranceJob(index, voices[index % len(voices)], seed, language, timing_hop_length,
                      wav_dir / f"{utterance_id(index)}.wav")
        for index in range(num_utterances)
    ]
    workers = max(1, min(num_workers or usable_cores(), num_utterances))
    utterances = _synthesize_all(jobs, workers, progress, data_path)

    _remove_leftovers(out_dir, {utterance_id(index) for index in range(num_utterances)})
    write_jsonl(utterances, out_dir / MANIFEST_FILENAME)
    total_seconds = sum(utterance.duration_s for utterance in utterances)
    stamp = {**expected_stamp, "total_seconds": round(total_seconds, 3)}
    _write_text_atomically(out_dir / STAMP_FILENAME, json.dumps(stamp, indent=2, sort_keys=True) + "\n")


def total_audio_seconds(corpus_dir: str | os.PathLike) -> float:
    """Sums the durations of the WAV files listed in `corpus_dir`/manifest.jsonl."""
    total = 0.0
    for utterance in read_manifest(Path(corpus_dir) / MANIFEST_FILENAME):
        with wave.open(utterance.audio_path, "rb") as wav_file:
            total += wav_file.getnframes() / wav_file.getframerate()
    return total
