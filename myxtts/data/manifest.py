"""Dataset manifests: read LJSpeech folders and JSONL manifests, split them, write clean ones.

Two source formats are understood:

* **LJSpeech** (`metadata.csv` next to a `wavs/` folder): one row per line,
  `id|text|normalized_text`, plus an optional fourth field `speaker` (our extension for
  multi-speaker corpora; without it the speaker is the name of the folder holding
  `metadata.csv`). The audio is `<that folder>/wavs/<id>.wav`.
* **JSONL**: one JSON object per line with `audio_path` (relative paths are relative to the
  manifest's folder), `text`, and optionally `speaker`, `duration` (seconds), `phonemes` (the
  IPA string the model reads, see `phonemes.py`) and `language` (the espeak-ng code the phonemes
  were made with; phonemes without it are used as given, whatever `data.language` says).

Parsing lives in one place, `iter_manifest_rows`, which never raises for a bad row: it yields
each row with either an `Utterance` or a `RowProblem`. `read_manifest` is the strict reader on
top of it (the first problem raises `ManifestError`), and dataset preparation uses the lenient
form to collect every bad row with its line number in one pass.

This module is pure Python on purpose: it is imported by the preparation tool's worker
processes and by tests that should not pay for importing TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

METADATA_CSV = "metadata.csv"
MANIFEST_JSONL = "manifest.jsonl"

# Reason codes a row can be rejected with before any audio is looked at.
MALFORMED_ROW = "malformed_row"
EMPTY_TEXT = "empty_text"
UNDECODABLE_TEXT = "undecodable_text"
DUPLICATE_ROW = "duplicate_row"

_UTF8_BOM = b"\xef\xbb\xbf"
_LJSPEECH_LAYOUT = "id|text|normalized_text or id|text|normalized_text|speaker"


@dataclass(frozen=True)
class Utterance:
    """One training example: an audio file, its transcript and who speaks it."""

    audio_path: str  # absolute
    text: str
    speaker: str
    duration_s: float | None = None
    phonemes: str | None = None  # what the model reads with data.text_frontend: phonemes
    language: str | None = None  # the espeak-ng code `phonemes` were made with


class ManifestError(ValueError):
    """A manifest that cannot be used as written; the message says where and what to fix."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str):
        self.path = os.fspath(path)
        self.line = line
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class RowProblem:
    """Why one manifest row cannot be used.

    `audio_path` is the audio the row refers to when it can still be worked out (so a
    rejection report can name it), else "".
    """

    reason: str
    detail: str
    audio_path: str = ""


@dataclass(frozen=True)
class ManifestRow:
    """One non-blank line of a manifest: exactly one of `utterance` and `problem` is set."""

    manifest_path: str
    line: int  # 1-based, counting blank lines too, as an editor shows it
    utterance: Utterance | None = None
    problem: RowProblem | None = None


def locate_manifest(path: str | os.PathLike) -> tuple[str, str]:
    """Resolve a user-supplied dataset path to `(manifest_file, kind)`, kind "ljspeech" or "jsonl".

    Accepts an LJSpeech folder, a folder holding a prepared `manifest.jsonl`, a
    `metadata.csv`-style file (any `.csv` name) or a `.jsonl` file.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset path {path} does not exist (no such file or folder)")
    if os.path.isdir(path):
        metadata = os.path.join(path, METADATA_CSV)
        if os.path.isfile(metadata):
            return metadata, "ljspeech"
        manifest = os.path.join(path, MANIFEST_JSONL)
        if os.path.isfile(manifest):
            return manifest, "jsonl"
        raise ManifestError(
            path,
            None,
            f"folder has neither {METADATA_CSV} (LJSpeech layout) nor {MANIFEST_JSONL}; "
            "point at the folder that holds one of them, or at the manifest file itself",
        )
    lowered = path.lower()
    if lowered.endswith(".jsonl"):
        return path, "jsonl"
    if lowered.endswith(".csv"):
        return path, "ljspeech"
    raise ManifestError(
        path,
        None,
        "unknown manifest type; use an LJSpeech folder, a metadata.csv file or a .jsonl manifest",
    )


def iter_manifest_rows(path: str | os.PathLike) -> Iterator[ManifestRow]:
    """Yield every non-blank row of a manifest, good or bad, without raising for bad rows.

    Whole-file problems (path missing, unknown type, unreadable file) still raise, since
    there are no rows to report them against. Rows repeating an earlier row's audio file are
    reported as `duplicate_row` problems: training on one file twice silently oversamples it.
    """
    manifest_path, kind = locate_manifest(path)
    base_dir = os.path.dirname(manifest_path)
    default_speaker = os.path.basename(base_dir)
    parse = _parse_ljspeech_line if kind == "ljspeech" else _parse_jsonl_line

    with open(manifest_path, "rb") as handle:
        raw = handle.read()
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM):]

    first_line_of: dict[str, int] = {}
    # Split bytes on "\n" only, then decode each line on its own, so one bad byte is
    # reported on its own line instead of failing the whole file, and so that characters
    # str.splitlines() would treat as breaks (U+2028, \x1c, ...) stay inside the text.
    for line_number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        line_bytes = line_bytes.removesuffix(b"\r")
        if not line_bytes.strip():
            continue
        result = parse(line_bytes, base_dir, default_speaker)
        if isinstance(result, Utterance):
            earlier = first_line_of.setdefault(result.audio_path, line_number)
            if earlier != line_number:
                result = RowProblem(
                    DUPLICATE_ROW,
                    f"same audio file as line {earlier} ({result.audio_path}); remove one of the rows",
                    result.audio_path,
                )
        if isinstance(result, Utterance):
            yield ManifestRow(manifest_path, line_number, utterance=result)
        else:
            yield ManifestRow(manifest_path, line_number, problem=result)


def read_manifest(path: str | os.PathLike) -> list[Utterance]:
    """Read a manifest strictly: the first bad row raises `ManifestError` naming file and line.

    Audio files are not opened here (that is slow and is done once by dataset preparation).
    """
    utterances = []
    manifest_path = None
    for row in iter_manifest_rows(path):
        manifest_path = row.manifest_path
        if row.problem is not None:
            raise ManifestError(row.manifest_path, row.line, row.problem.detail)
        utterances.append(row.utterance)
    if not utterances:
        raise ManifestError(
            manifest_path or locate_manifest(path)[0], None, "manifest has no rows; add at least one utterance"
        )
    return utterances


def _decode_line(line_bytes: bytes) -> tuple[str | None, str]:
    """Decode one line as UTF-8; on failure return (None, a message locating the bad byte)."""
    try:
        return line_bytes.decode("utf-8"), ""
    except UnicodeDecodeError as error:
        bad = line_bytes[error.start:error.start + 1].hex()
        return None, (
            f"not valid UTF-8 (byte 0x{bad} at byte {error.start + 1} of the line); "
            "re-save the manifest as UTF-8"
        )


def _parse_ljspeech_line(line_bytes: bytes, base_dir: str, default_speaker: str) -> Utterance | RowProblem:
    """Parse `id|text|normalized_text[|speaker]`, splitting on "|" only.

    No CSV quoting rules apply: LJSpeech transcripts contain bare double quotes, commas and
    apostrophes, and the csv module would eat or re-join them.
    """
    text, decode_problem = _decode_line(line_bytes)
    if text is None:
        # The id is usually still readable, which lets the rejection report name the file.
        utterance_id = line_bytes.split(b"|", 1)[0].decode("utf-8", errors="replace").strip()
        audio_path = _ljspeech_audio_path(base_dir, utterance_id) if utterance_id else ""
        return RowProblem(UNDECODABLE_TEXT, decode_problem, audio_path)

    fields = text.split("|")
    if len(fields) not in (3, 4):
        return RowProblem(
            MALFORMED_ROW,
            f"expected 3 or 4 '|'-separated fields ({_LJSPEECH_LAYOUT}), found {len(fields)}; "
            "fix the row (a '|' inside a transcript is not allowed)",
        )
    utterance_id = fields[0].strip()
    if not utterance_id:
        return RowProblem(MALFORMED_ROW, "field 1 (id) is empty; write the wav file's name without .wav")
    audio_path = _ljspeech_audio_path(base_dir, utterance_id)

    speaker = default_speaker
    if len(fields) == 4:
        speaker = fields[3].strip()
        if not speaker:
            return RowProblem(
                MALFORMED_ROW, "field 4 (speaker) is empty; name the speaker or drop the 4th field", audio_path
            )

    raw_text, normalized_text = fields[1], fields[2]
    transcript = normalized_text if normalized_text.strip() else raw_text
    if not transcript.strip():
        return RowProblem(
            EMPTY_TEXT,
            "fields 2 (text) and 3 (normalized_text) are both empty; write the transcript or remove the row",
            audio_path,
        )
    return Utterance(audio_path=audio_path, text=transcript, speaker=speaker)


def _ljspeech_audio_path(base_dir: str, utterance_id: str) -> str:
    return os.path.abspath(os.path.join(base_dir, "wavs", utterance_id + ".wav"))


def _parse_jsonl_line(line_bytes: bytes, base_dir: str, default_speaker: str) -> Utterance | RowProblem:
    """Parse one JSON object with `audio_path`, `text`, optional `speaker` and `duration`."""
    text, decode_problem = _decode_line(line_bytes)
    if text is None:
        audio_path = ""
        # Best effort to name the audio in the report: the bad byte is usually in the text.
        try:
            salvaged = json.loads(line_bytes.decode("utf-8", errors="replace"))
            if isinstance(salvaged, dict) and isinstance(salvaged.get("audio_path"), str):
                audio_path = _resolve_audio_path(base_dir, salvaged["audio_path"])
        except ValueError:
            pass  # the line is broken anyway; the report simply has no audio path for it
        return RowProblem(UNDECODABLE_TEXT, decode_problem, audio_path)

    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return RowProblem(MALFORMED_ROW, f"invalid JSON ({error.msg} at column {error.colno}); fix the line")
    if not isinstance(record, dict):
        return RowProblem(
            MALFORMED_ROW,
            f'expected a JSON object like {{"audio_path": ..., "text": ...}}, got {type(record).__name__}',
        )

    audio_value = record.get("audio_path")
    if not isinstance(audio_value, str) or not audio_value.strip():
        what = "missing" if "audio_path" not in record else "not a non-empty string"
        return RowProblem(MALFORMED_ROW, f"key 'audio_path' is {what}; give the audio file's path")
    audio_path = _resolve_audio_path(base_dir, audio_value)

    transcript = record.get("text")
    if "text" not in record:
        return RowProblem(MALFORMED_ROW, "key 'text' is missing; add the transcript", audio_path)
    if transcript is None:  # "text": null
        return RowProblem(EMPTY_TEXT, "key 'text' is null; write the transcript or remove the row", audio_path)
    if not isinstance(transcript, str):
        return RowProblem(MALFORMED_ROW, f"key 'text' must be a string, got {type(transcript).__name__}", audio_path)
    if not transcript.strip():
        return RowProblem(EMPTY_TEXT, "key 'text' is empty; write the transcript or remove the row", audio_path)

    speaker = record.get("speaker")
    if speaker is None:
        speaker = default_speaker
    elif not isinstance(speaker, str) or not speaker.strip():
        return RowProblem(
            MALFORMED_ROW, "key 'speaker' must be a non-empty string; fix it or leave the key out", audio_path
        )

    duration = record.get("duration")
    if duration is not None:
        # bool is an int subclass; `true` as a duration is a mistake, not one second.
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (
            math.isfinite(duration) and duration > 0
        ):
            return RowProblem(
                MALFORMED_ROW,
                f"key 'duration' must be a positive number of seconds, got {duration!r}; fix it or leave it out",
                audio_path,
            )
        duration = float(duration)

    optional = {}
    for key, what in (("phonemes", "the IPA string; leave the key out to have the text phonemized"),
                      ("language", "the espeak-ng code the phonemes were made with, e.g. en-us")):
        value = record.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            return RowProblem(MALFORMED_ROW, f"key '{key}' must be a non-empty string ({what}), got {value!r}", audio_path)
        optional[key] = value
    if optional["language"] is not None and optional["phonemes"] is None:
        return RowProblem(MALFORMED_ROW, "key 'language' without 'phonemes': it says which language the phonemes are in; "
                          "add the phonemes or drop the key", audio_path)
    return Utterance(audio_path=audio_path, text=transcript, speaker=speaker.strip(), duration_s=duration, **optional)


def _resolve_audio_path(base_dir: str, audio_value: str) -> str:
    return os.path.abspath(os.path.join(base_dir, os.path.expanduser(audio_value)))


def split_train_val(
    utterances: Sequence[Utterance], val_fraction: float, seed: int
) -> tuple[list[Utterance], list[Utterance]]:
    """Split into (train, val), deciding each utterance on its own from a hash.

    The hash covers (seed, speaker, file name without extension), nothing machine-specific,
    so the split is the same on every machine, survives the dataset moving folders or being
    converted from FLAC to WAV, and adding rows never moves existing ones between sets.
    Both sets keep the input order. Train is never left empty (the highest-hash utterance
    moves back), and with at least two utterances and `val_fraction > 0` neither is val (the
    lowest-hash utterance moves there). Only on such tiny corpora can a new row
    change where an old one lands.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}; 0.02 to 0.05 is typical")
    scores = [_split_score(utterance, seed) for utterance in utterances]
    in_val = [score < val_fraction for score in scores]
    if val_fraction > 0 and len(utterances) >= 2 and not any(in_val):
        in_val[min(range(len(scores)), key=scores.__getitem__)] = True
    if utterances and all(in_val):
        in_val[max(range(len(scores)), key=scores.__getitem__)] = False
    train = [u for u, is_val in zip(utterances, in_val) if not is_val]
    val = [u for u, is_val in zip(utterances, in_val) if is_val]
    return train, val


def _split_score(utterance: Utterance, seed: int) -> float:
    """Map an utterance to a uniform number in [0, 1) that depends only on seed, speaker and stem."""
    stem = os.path.splitext(os.path.basename(utterance.audio_path))[0]
    key = f"{seed}\x00{utterance.speaker}\x00{stem}".encode("utf-8")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def write_jsonl(utterances: Sequence[Utterance], path: str | os.PathLike) -> None:
    """Write the clean manifest format: one object per line with audio_path, text, speaker, duration,
    and phonemes and language for rows that have them.

    Written to a temporary name and renamed, so an interrupted run never leaves a half
    manifest that a later training run would read as complete.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = path + ".partial"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        for utterance in utterances:
            record = {
                "audio_path": utterance.audio_path,
                "text": utterance.text,
                "speaker": utterance.speaker,
                "duration": utterance.duration_s,
            }
            if utterance.phonemes is not None:
                record.update(phonemes=utterance.phonemes, language=utterance.language)
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(temporary, path)
