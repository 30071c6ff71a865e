"""One-time dataset preparation: check every row once, convert what TensorFlow cannot decode.

The training input pipeline decodes audio with `tf.audio.decode_wav`, which reads only plain
16-bit PCM WAV and does no resampling (see `wav_header.py` for the exact contract).
`prepare_dataset` makes a corpus fit that contract once, ahead of training, instead of failing
or stalling mid-epoch:

* every row of the source manifest is checked once; bad rows and bad files are listed in
  `rejected.tsv` with their line number and a reason code instead of stopping the run;
* a clip whose loudest sample is below -60 dBFS (digital silence, hiss) is rejected as `silent`:
  with its transcript it would teach the model to say those words with silence;
* files that already fit (16-bit PCM mono WAV at the target rate) are referenced in place,
  everything else (FLAC, OGG, MP3, 24-bit or float WAV, stereo, other rates) is converted
  with soundfile + soxr into `out_dir/audio/`, and the originals are never touched; beside each
  conversion `<name>.wav.source` names its source (real path, size, mtime), and a rerun reuses a
  conversion only for that source as it is;
* with `phoneme_language`, every kept row's text is phonemized once (`phonemes.py`, the model's
  text front end), so the manifest carries `phonemes` next to `text` and training does not
  phonemize; a text that gives no phonemes is rejected as `no_phonemes`;
* the result is `out_dir/manifest.jsonl`, with measured durations, readable by
  `myxtts.data.manifest.read_manifest`;
* `out_dir` must be a folder of its own (`check_output_folder`): the input's folder is refused, and
  so is one whose `manifest.jsonl` or `rejected.tsv` an earlier preparation did not write, because
  writing there would replace the user's own manifest (and the transcripts of the rows it rejects).

Headers, and a few blocks of samples for the silence check, are read in the calling process (well
under a millisecond per file); only the files that need decoding and resampling go to worker
processes, in chunks, so a rerun with nothing left to convert takes about 0.15 s per thousand
files (1,029 clips of 1-12 s, 6.1 s on average, on a busy 2-core host: 0.147 s, 0.113 s without the
silence check).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import soundfile
import soxr

from myxtts.data.manifest import MANIFEST_JSONL, Utterance, iter_manifest_rows, locate_manifest, write_jsonl
from myxtts.data.phonemes import check_language, needs_phonemes, phonemize
from myxtts.data.wav_header import (
    CORRUPT,
    MISSING_FILE,
    NOT_AUDIO,
    SILENT,
    SILENT_PEAK,
    TOO_LONG,
    TOO_SHORT,
    TRUNCATED,
    UNREADABLE_FILE,
    ZERO_LENGTH,
    BadAudioFile,
    WavHeader,
    read_wav_header,
    silent_pcm16_peak,
)
from myxtts.hardware.host import usable_cores
from myxtts.output_paths import folder_problem
from myxtts.progress import ProgressLine

# Reason code for a row whose text gives no phonemes in the chosen language.
NO_PHONEMES = "no_phonemes"
REJECTED_TSV = "rejected.tsv"
# The first line of every rejected.tsv this module writes: what marks a folder as an earlier output.
REJECTED_HEADER = "line\taudio_path\treason\tdetail"
# Lossy formats (MP3 without a Xing/LAME header) only estimate their frame count, so a small
# shortfall after decoding is not truncation; a real cut-off loses far more than this.
_FRAME_COUNT_TOLERANCE = 0.01


class _FileJob(NamedTuple):
    """One file to check, small so that shipping it to a worker process is cheap."""

    index: int
    source_path: str
    converted_path: str
    sample_rate: int
    min_duration_s: float
    max_duration_s: float
    source_is_wav: bool = False  # set by the quick check, so the converter knows which errors mean what


class _FileOutcome(NamedTuple):
    index: int
    action: str  # "in_place", "converted", "skipped" (conversion already done) or "rejected"
    audio_path: str
    duration_s: float
    reason: str = ""
    detail: str = ""


def _quick_check(job: _FileJob) -> _FileOutcome | _FileJob:
    """Settle a file without decoding it, or return the job (marked WAV or not) to be converted.

    Stat, header and "already converted?" checks take a small fraction of a millisecond per
    file, far less than starting worker processes, so they run in the calling process and
    only real conversions go to workers. Never raises for a bad file.
    """
    try:
        try:
            source_stat = os.stat(job.source_path)
        except FileNotFoundError:
            raise BadAudioFile(MISSING_FILE, "audio file not found; fix the path in the manifest or restore the file")
        if not os.path.isfile(job.source_path):
            raise BadAudioFile(NOT_AUDIO, "path is not a regular file; point the row at an audio file")
        if source_stat.st_size == 0:
            raise BadAudioFile(ZERO_LENGTH, "file is empty (0 bytes); re-export or remove it")
        header = read_wav_header(job.source_path)
        if header is not None and header.decodable_by_tf(job.sample_rate):
            _check_frames(header.frames)
            duration_s = header.frames / header.sample_rate
            _check_duration(duration_s, job)
            _check_sound(silent_pcm16_peak(job.source_path, header))
            return _FileOutcome(job.index, "in_place", job.source_path, duration_s)
        done = _finished_conversion(job, source_stat)
        if done is not None:
            done_s = done.frames / done.sample_rate
            _check_duration(done_s, job)  # the limits may have changed; its sound was checked when converted
            return _FileOutcome(job.index, "skipped", job.converted_path, done_s)
        return job._replace(source_is_wav=header is not None)
    except OSError as error:
        return _rejected(job, BadAudioFile(UNREADABLE_FILE, f"cannot read the file ({error}); check its permissions"))
    except BadAudioFile as rejected:
        return _rejected(job, rejected)


def _convert_file(job: _FileJob) -> _FileOutcome:
    """Worker-process entry point: convert one file; never raises for a bad file."""
    try:
        return _FileOutcome(job.index, "converted", job.converted_path, _convert(job))
    except BadAudioFile as rejected:
        return _rejected(job, rejected)


def _rejected(job: _FileJob, rejected: BadAudioFile) -> _FileOutcome:
    return _FileOutcome(job.index, "rejected", job.source_path, 0.0, rejected.reason, rejected.detail)


def _check_frames(frames: int) -> None:
    if frames == 0:
        raise BadAudioFile(ZERO_LENGTH, "file holds no audio frames; re-export or remove it")


def _check_duration(duration_s: float, job: _FileJob) -> None:
    if duration_s < job.min_duration_s:
        raise BadAudioFile(
            TOO_SHORT, f"{duration_s:.2f} s is shorter than min_duration_s={job.min_duration_s} s"
        )
    if duration_s > job.max_duration_s:
        raise BadAudioFile(
            TOO_LONG, f"{duration_s:.2f} s is longer than max_duration_s={job.max_duration_s} s; split it or raise the limit"
        )


def _check_sound(silent_peak: float | None) -> None:
    """Reject a clip whose loudest sample (`silent_peak`, None when it has sound) is below SILENT_PEAK:
    trained on with its transcript, it teaches the model to say those words with silence."""
    if silent_peak is None:
        return
    level = f"its loudest sample is at {20 * np.log10(silent_peak):.0f} dBFS" if silent_peak > 0 else "every sample is zero"
    raise BadAudioFile(SILENT, f"silent ({level}, below {20 * np.log10(SILENT_PEAK):.0f} dBFS): no voice to learn "
                               "from; re-export it or remove the row")


def _source_stamp(source_path: str, source_stat: os.stat_result) -> str:
    """Which file a conversion was made from, as it was then: its real path, size and mtime."""
    return f"{os.path.realpath(source_path)}\t{source_stat.st_size}\t{source_stat.st_mtime_ns}\n"


def _stamp_path(converted_path: str) -> str:
    return converted_path + ".source"  # beside the conversion: <name>.wav.source


def _finished_conversion(job: _FileJob, source_stat: os.stat_result) -> WavHeader | None:
    """Header of an earlier run's conversion if it is still valid, else None.

    Valid means made from this very source as it is now (its stamp, written once the conversion was
    in place, matches: a conversion newer than its source was reused before, so a second corpus
    prepared into the same --output, or a source restored with an older mtime, trained on the other
    file's audio) and already in the target format: a run with another sample rate must not reuse it.
    Outputs are written under a temporary name and renamed, so an existing file is never a
    half-written one.
    """
    try:
        with open(_stamp_path(job.converted_path), encoding="utf-8") as stamp:
            if stamp.read() != _source_stamp(job.source_path, source_stat):
                return None
        header = read_wav_header(job.converted_path)
    except (OSError, UnicodeDecodeError, BadAudioFile):
        return None
    if header is None or not header.decodable_by_tf(job.sample_rate) or header.frames == 0:
        return None
    return header


def _convert(job: _FileJob) -> float:
    """Decode, mix to mono, resample and write 16-bit PCM WAV; return the output's duration."""
    is_wav = job.source_is_wav
    source_stat = os.stat(job.source_path)  # the source as it is read: its stamp, once converted
    try:
        audio_file = soundfile.SoundFile(job.source_path)
    except (soundfile.LibsndfileError, RuntimeError) as error:
        if is_wav:
            raise BadAudioFile(CORRUPT, f"WAV header is unreadable ({error}); re-export the file")
        raise BadAudioFile(NOT_AUDIO, f"not a readable audio file ({error}); check what the file really is")
    with audio_file:
        declared_frames, source_rate = audio_file.frames, audio_file.samplerate
        # Reject on the declared length first: decoding an hour-long file only to drop it is waste.
        _check_frames(declared_frames)
        _check_duration(declared_frames / source_rate, job)
        try:
            samples = audio_file.read(dtype="float32", always_2d=True)  # [frames, channels]
        except (soundfile.LibsndfileError, RuntimeError) as error:
            raise BadAudioFile(CORRUPT, f"decoding failed partway ({error}); the file is damaged, re-export it")
    if not np.isfinite(samples).all():  # float samples only; quantized below, NaN became 0 and infinity full scale
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        raise BadAudioFile(CORRUPT, f"{bad} samples are not numbers (NaN or infinite); the file is damaged, re-export it")
    decoded_frames = samples.shape[0]
    if not is_wav and decoded_frames < declared_frames * (1.0 - _FRAME_COUNT_TOLERANCE):
        raise BadAudioFile(
            TRUNCATED,
            f"header says {declared_frames} frames but only {decoded_frames} decode; the file was cut off, re-export it",
        )
    _check_frames(decoded_frames)
    _check_duration(decoded_frames / source_rate, job)

    # Average the channels column by column: samples.mean(axis=1) reduces along the short,
    # strided axis and was the slowest step of a stereo conversion (1.7 ms per 2 s clip).
    mono = samples[:, 0].copy()  # [frames]
    for channel in range(1, samples.shape[1]):
        mono += samples[:, channel]
    if samples.shape[1] > 1:
        mono *= 1.0 / samples.shape[1]
    if source_rate != job.sample_rate:
        mono = soxr.resample(mono, source_rate, job.sample_rate, quality="HQ")
    # Quantize here rather than in libsndfile, which halves the cost of writing. Resampling
    # overshoots near full scale and float WAVs may exceed 1.0, and astype(int16) would wrap
    # such samples to the other sign, so clip first. 32767 is libsndfile's own scale.
    pcm = np.rint(np.clip(mono, -1.0, 1.0) * 32767.0).astype(np.int16)
    peak = float(np.max(np.abs(pcm))) / 32768
    _check_sound(peak if peak < SILENT_PEAK else None)

    os.makedirs(os.path.dirname(job.converted_path), exist_ok=True)
    # The old stamp goes first and the new one comes last: a conversion cut short anywhere between
    # is converted again, never taken for this source's.
    stamp = _stamp_path(job.converted_path)
    if os.path.lexists(stamp):
        os.remove(stamp)
    temporary = job.converted_path + ".partial"
    soundfile.write(temporary, pcm, job.sample_rate, subtype="PCM_16", format="WAV")
    os.replace(temporary, job.converted_path)
    with open(stamp + ".partial", "w", encoding="utf-8") as handle:
        handle.write(_source_stamp(job.source_path, source_stat))
    os.replace(stamp + ".partial", stamp)
    return pcm.shape[0] / job.sample_rate


@dataclass(frozen=True)
class Rejection:
    line: int  # 1-based line of the source manifest
    audio_path: str
    reason: str
    detail: str


@dataclass
class PrepareReport:
    """What `prepare_dataset` did; `summary()` is the text printed at the end."""

    manifest_path: str
    rejected_path: str
    rows: int
    kept: int
    in_place: int
    converted: int
    skipped_conversions: int
    kept_duration_s: float
    elapsed_s: float
    workers: int  # processes that converted audio
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        return dict(collections.Counter(rejection.reason for rejection in self.rejections).most_common())

    def summary(self) -> str:
        lines = [
            f"prepared {self.rows} rows in {self.elapsed_s:.1f} s: "
            f"kept {self.kept} ({self.kept_duration_s / 3600:.2f} h), rejected {len(self.rejections)}",
            f"  audio: {self.in_place} used in place, {self.converted} converted"
            + (f" by {self.workers} processes" if self.converted and self.workers > 1 else "")
            + f", {self.skipped_conversions} skipped as already converted",
        ]
        for reason, count in self.rejected_by_reason.items():
            lines.append(f"  rejected {reason}: {count}")
        lines.append(f"  manifest: {self.manifest_path}")
        if self.rejections:
            lines.append(f"  rejections listed in: {self.rejected_path}")
        return "\n".join(lines)


def prepare_dataset(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    sample_rate: int = 22050,
    min_duration_s: float = 0.5,
    max_duration_s: float = 12.0,
    workers: int = 0,
    progress: bool = True,
    phoneme_language: str | None = None,
) -> PrepareReport:
    """Check every row of `source` once and write `out_dir/manifest.jsonl` and `rejected.tsv`.

    `workers=0` uses every usable core. With `progress`, a progress line goes to stderr and
    the summary to stdout. `phoneme_language` (an espeak-ng code, `data.language`) adds each
    row's phonemes, unless it already has phonemes of that language or of none named; None
    keeps rows as they are. Raises FileNotFoundError / ManifestError only for whole-input
    problems, UnknownLanguage for a language espeak-ng does not know; bad rows and files
    become rejections.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if not 0 <= min_duration_s < max_duration_s:
        raise ValueError(
            f"need 0 <= min_duration_s < max_duration_s, got {min_duration_s} and {max_duration_s}"
        )
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0 = all usable cores), got {workers}")
    if phoneme_language is not None:
        check_language(phoneme_language)  # before minutes of audio checks
    check_output_folder(source, out_dir)
    started = time.monotonic()
    out_dir = os.path.abspath(os.fspath(out_dir))
    rows = list(iter_manifest_rows(source))
    source_root = os.path.dirname(rows[0].manifest_path) if rows else ""

    rejections: list[Rejection] = []
    utterances: list[Utterance] = []
    lines: list[int] = []
    for row in rows:
        if row.problem is not None:
            rejections.append(Rejection(row.line, row.problem.audio_path, row.problem.reason, row.problem.detail))
        else:
            utterances.append(row.utterance)
            lines.append(row.line)

    converted_paths = _plan_converted_paths([u.audio_path for u in utterances], source_root, out_dir)
    jobs = [
        _FileJob(i, u.audio_path, converted_paths[i], sample_rate, min_duration_s, max_duration_s)
        for i, u in enumerate(utterances)
    ]
    worker_count = workers or usable_cores()
    outcomes, worker_count = _run_jobs(jobs, worker_count, progress)

    kept: list[Utterance] = []
    kept_lines: list[int] = []
    actions = collections.Counter()
    for outcome in sorted(outcomes, key=lambda o: o.index):
        utterance = utterances[outcome.index]
        actions[outcome.action] += 1
        if outcome.action == "rejected":
            rejections.append(Rejection(lines[outcome.index], outcome.audio_path, outcome.reason, outcome.detail))
        else:
            kept.append(dataclasses.replace(utterance, audio_path=outcome.audio_path, duration_s=outcome.duration_s))
            kept_lines.append(lines[outcome.index])
    if phoneme_language is not None:
        kept = _add_phonemes(kept, kept_lines, phoneme_language, rejections, progress)
    rejections.sort(key=lambda r: r.line)

    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(out_dir, MANIFEST_JSONL)
    rejected_path = os.path.join(out_dir, REJECTED_TSV)
    # rejected.tsv first: it marks the folder as this module's output (`check_output_folder`), so a
    # manifest.jsonl written here never stands without it.
    _write_rejections(rejections, rejected_path)
    write_jsonl(kept, manifest_path)
    report = PrepareReport(
        manifest_path=manifest_path,
        rejected_path=rejected_path,
        rows=len(rows),
        kept=len(kept),
        in_place=actions["in_place"],
        converted=actions["converted"],
        skipped_conversions=actions["skipped"],
        kept_duration_s=sum(u.duration_s for u in kept),
        elapsed_s=time.monotonic() - started,
        workers=worker_count,
        rejections=rejections,
    )
    if progress:
        print(report.summary(), flush=True)
    return report


class OutputFolderError(ValueError):
    """The output folder would overwrite the input or files this module did not write; nothing was written."""


def check_output_folder(source: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Raise `OutputFolderError` unless writing `out_dir/manifest.jsonl`, `rejected.tsv` and `audio/`
    leaves the input and every file of the user's as they were.

    Refused: the folder of the input's manifest (its `manifest.jsonl` would be replaced by the kept
    rows, losing the rejected rows' transcripts; an LJSpeech folder would fill with outputs), and a
    folder holding a `manifest.jsonl`, `rejected.tsv` or `audio/` that an earlier preparation did not
    write (its rejected.tsv starts with `REJECTED_HEADER`). An earlier preparation's folder is fine: a rerun
    replaces its own outputs and skips the conversions already done.
    """
    manifest_path, _ = locate_manifest(source)
    out = os.path.realpath(os.fspath(out_dir))
    input_folder = os.path.dirname(os.path.realpath(manifest_path))
    if out == input_folder:
        raise OutputFolderError(
            f"--output {out_dir} is the input's own folder (it holds {manifest_path}): preparing writes "
            f"{MANIFEST_JSONL}, {REJECTED_TSV} and audio/ there and would replace the input's files. Nothing "
            f"was written; choose a new folder, e.g. --output {out}_prepared")
    if problem := folder_problem(out_dir, "--output"):  # a file, or under one
        raise OutputFolderError(problem)
    if not os.path.isdir(out):
        return
    rejected = os.path.join(out, REJECTED_TSV)
    for name in (MANIFEST_JSONL, REJECTED_TSV, "audio"):
        path = os.path.join(out, name)
        if not os.path.lexists(path):
            continue
        if _same_file(path, manifest_path) or not _written_here(rejected):
            raise OutputFolderError(
                f"--output {out_dir} holds {path}, which no earlier preparation wrote (one leaves a {REJECTED_TSV} "
                f"whose first line is {REJECTED_HEADER!r}): preparing writes {MANIFEST_JSONL}, {REJECTED_TSV} and "
                "audio/ there and would replace it or mix with it. Nothing was written; choose a new folder, or "
                "move it out")


def _same_file(path: str, other: str) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:  # a dangling link
        return False


def _written_here(rejected_path: str) -> bool:
    """True when `rejected_path` is a rejected.tsv this module wrote."""
    try:
        with open(rejected_path, encoding="utf-8", newline="") as handle:
            return handle.readline().rstrip("\n") == REJECTED_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def _add_phonemes(kept: list[Utterance], lines: list[int], language: str, rejections: list[Rejection],
                  show_progress: bool) -> list[Utterance]:
    """`kept` with phonemes in `language`; rows whose text gives none move to `rejections`."""
    to_do = [u for u in kept if needs_phonemes(u, language)]
    texts = sorted({u.text for u in to_do})
    line = ProgressLine(f"phonemizing ({language})", len(texts), "texts", enabled=show_progress)
    phonemes = {}
    for done, text in enumerate(texts, start=1):
        phonemes[text] = phonemize(text, language)
        line.update(done)
    line.close()
    result = []
    for utterance, line_number in zip(kept, lines):
        if needs_phonemes(utterance, language):
            if not phonemes[utterance.text]:
                rejections.append(Rejection(line_number, utterance.audio_path, NO_PHONEMES,
                                            f"espeak-ng ({language}) makes no phonemes of the text; check --language "
                                            "(data.language) or write the text in words"))
                continue
            utterance = dataclasses.replace(utterance, phonemes=phonemes[utterance.text], language=language)
        result.append(utterance)
    return result


def _plan_converted_paths(audio_paths: list[str], source_root: str, out_dir: str) -> list[str]:
    """Where each file goes if it needs converting: `out_dir/audio/<path relative to the manifest>.wav`.

    Files outside the manifest's folder go under `audio/external/<hash of their folder>/`.
    Two sources that would land on one name (`a.flac` and `a.ogg`) keep their extension
    (`a.flac.wav`), so neither overwrites the other.
    """
    audio_dir = os.path.join(out_dir, "audio")
    relative_names = []
    for audio_path in audio_paths:
        relative = os.path.relpath(audio_path, source_root) if source_root else audio_path
        if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
            folder_hash = hashlib.blake2b(os.path.dirname(audio_path).encode(), digest_size=4).hexdigest()
            relative = os.path.join("external", folder_hash, os.path.basename(audio_path))
        relative_names.append(relative)
    stems = [os.path.splitext(relative)[0] for relative in relative_names]
    sources_per_stem = collections.Counter(stems)
    planned = []
    for audio_path, relative, stem in zip(audio_paths, relative_names, stems):
        name = relative if sources_per_stem[stem] > 1 else stem
        target = os.path.join(audio_dir, name + ".wav")
        if os.path.abspath(target) == os.path.abspath(audio_path):
            # Re-preparing a prepared folder at a new rate must not overwrite its inputs.
            target = os.path.join(audio_dir, name + ".resampled.wav")
        planned.append(target)
    return planned


def _run_jobs(jobs: list[_FileJob], workers: int, show_progress: bool) -> tuple[list[_FileOutcome], int]:
    """Check every job in this process, then convert the files that need it in worker processes.

    Returns the outcomes (in no particular order) and the number of processes that converted.
    """
    outcomes = []
    to_convert = []
    checking = ProgressLine("checking audio", len(jobs), "files", enabled=show_progress)
    for done, job in enumerate(jobs, start=1):
        result = _quick_check(job)
        (to_convert if isinstance(result, _FileJob) else outcomes).append(result)
        checking.update(done)
    checking.close()

    converting = ProgressLine("converting audio", len(to_convert), "files", enabled=show_progress)
    # Chunks amortize the inter-process round trip; enough of them per worker keeps the
    # load balanced when file lengths differ and the progress line moving.
    chunk_size = max(1, min(16, len(to_convert) // max(1, workers * 8)))
    workers = max(1, min(workers, -(-len(to_convert) // chunk_size)))
    if workers == 1:
        for done, job in enumerate(to_convert, start=1):
            outcomes.append(_convert_file(job))
            converting.update(done)
    else:
        # Not "fork": the caller may have TensorFlow's threads running, and forking a
        # multithreaded process can deadlock the child. A fork server is a fresh
        # single-threaded process that imports this module once and forks the workers from
        # itself, which starts them much faster than "spawn" (each spawned worker would
        # import numpy, soundfile and soxr again).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context)
        try:
            for done, outcome in enumerate(pool.map(_convert_file, to_convert, chunksize=chunk_size), start=1):
                outcomes.append(outcome)
                converting.update(done)
        finally:
            # On an error or Ctrl-C, drop the chunks not yet started instead of converting them.
            pool.shutdown(wait=True, cancel_futures=True)
    converting.close()
    return outcomes, workers


def _write_rejections(rejections: list[Rejection], path: str) -> None:
    def clean(value: str) -> str:
        # Keep one rejection per line whatever a path or message contains.
        return value.replace("\t", " ").replace("\n", " ").replace("\r", " ")

    temporary = path + ".partial"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(REJECTED_HEADER + "\n")
        for rejection in rejections:
            handle.write(
                f"{rejection.line}\t{clean(rejection.audio_path)}\t{rejection.reason}\t{clean(rejection.detail)}\n"
            )
    os.replace(temporary, path)
