"""What a WAV file's header declares, read without decoding, and the error for unusable audio.

`tf.audio.decode_wav` reads only 16-bit PCM WAV (format tag 1, a `fmt ` chunk of 16 or 18 bytes,
after only the chunks it skips, no odd-sized chunk before the data and every chunk after it whole,
because it ignores RIFF pad bytes) and fails mid-training on a file whose data chunk claims more
bytes than it holds. `read_wav_header` finds all of this from
the chunk headers alone, well under a millisecond per file, so `prepare.py` can decide once, ahead
of training, which files go to TensorFlow as they are and which must be converted.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

import numpy as np

# Reason codes for problems found in the audio itself (manifest-level codes live in manifest.py).
MISSING_FILE = "missing_file"
UNREADABLE_FILE = "unreadable_file"
NOT_AUDIO = "not_audio"
TRUNCATED = "truncated"
CORRUPT = "corrupt"
ZERO_LENGTH = "zero_length"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
SILENT = "silent"

# A clip whose loudest sample is below this (-60 dBFS) holds no voice: digital silence, or hiss far
# below any speech. `decode_wav`'s scale: a 16-bit sample over 32768.
SILENT_PEAK = 1e-3

_PCM_FORMAT_TAG = 1
# The chunks decode_wav skips before "fmt " (tensorflow/core/lib/wav/wav_io.cc); any other there, it refuses.
SKIPPED_BEFORE_FMT = (b"JUNK", b"bext", b"iXML", b"qlty", b"mext", b"levl", b"link", b"axml")
# The canonical layout's data offset (a 16-byte "fmt " chunk at 12, "data" at 36): the pipeline reads
# such files without decode_wav (`audio.decode_wav_bytes`), so what follows their data does not matter.
_CANONICAL_DATA_OFFSET = 44
# Chunks walked before giving up and leaving the file to decode_wav (real files have two to five);
# `audio.wav_refusal` walks as many.
MAX_CHUNKS = 64
# The data size a writer that cannot seek back to the header leaves there (ffmpeg writing to a pipe):
# the length is unknown, the samples run to the end of the file, and libsndfile reads them so.
_UNKNOWN_DATA_SIZE = 0xFFFFFFFF


class BadAudioFile(ValueError):
    """An audio file that cannot be trained on: `reason` is a code, `detail` says what to do."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class WavHeader:
    """What a RIFF/WAVE header declares, plus what the file really holds."""

    format_tag: int
    channels: int
    sample_rate: int
    bits_per_sample: int
    block_align: int
    fmt_chunk_size: int
    data_size: int
    data_offset: int  # where the samples start in the file
    layout_ok_for_tf: bool  # fmt before data and no odd-sized chunk before data

    @property
    def frames(self) -> int:
        return self.data_size // self.block_align

    def decodable_by_tf(self, sample_rate: int) -> bool:
        """True when `tf.audio.decode_wav` reads this file as mono at `sample_rate` unchanged."""
        return (
            self.layout_ok_for_tf
            and self.format_tag == _PCM_FORMAT_TAG
            and self.fmt_chunk_size in (16, 18)
            and self.bits_per_sample == 16
            and self.channels == 1
            and self.sample_rate == sample_rate
            and self.data_size % self.block_align == 0
        )


# Files named by a problem message before "and N more": enough to start fixing, short enough to read.
_NAMED_PROBLEMS = 5
# What to do about a corpus with such files (its rows were never checked).
_PREPARE = ("the corpus was not prepared: run utilities/prepare_dataset.py on it, which checks every file, converts "
            "what TensorFlow cannot read and writes a manifest of the usable ones, listing the rest")


def unusable_path(path: str) -> BadAudioFile | None:
    """Why `path` cannot be read as an audio file, from its directory entry alone; None when it can.

    Nothing is opened: opening a FIFO blocks until something writes to it, and TensorFlow's
    `read_file` of one waits for ever, without a word. A missing file ends in a traceback there.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return BadAudioFile(MISSING_FILE, "not found")
    except OSError as error:
        return BadAudioFile(UNREADABLE_FILE, f"cannot be looked up ({error.strerror})")
    if not stat.S_ISREG(info.st_mode):
        what = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode)
                else "a device or socket")
        return BadAudioFile(NOT_AUDIO, f"{what}, not a regular file")
    if info.st_size == 0:
        return BadAudioFile(ZERO_LENGTH, "empty (0 bytes)")
    if not os.access(path, os.R_OK):
        return BadAudioFile(UNREADABLE_FILE, "not readable (check its permissions)")
    return None


def check_audio_files(paths: list[str]) -> None:
    """Raise `BadAudioFile` (a ValueError) naming the files of `paths` that cannot be read at all.

    Run before training reads any of them (a stat each: 8 ms for a thousand files on a loaded 2-core host),
    so that a missing file, a folder or a FIFO stops the run at once, with its name, instead of a
    traceback or a silent hang minutes in. What the files hold is checked as they are decoded.
    """
    problems = [(path, problem) for path in paths if (problem := unusable_path(path)) is not None]
    if not problems:
        return
    named = "; ".join(f"{path}: {problem.detail}" for path, problem in problems[:_NAMED_PROBLEMS])
    more = f" and {len(problems) - _NAMED_PROBLEMS} more" if len(problems) > _NAMED_PROBLEMS else ""
    raise BadAudioFile(problems[0][1].reason,
                       f"{len(problems)} of {len(paths)} audio files cannot be read ({named}{more}) - {_PREPARE}")


def read_wav_header(path: str) -> WavHeader | None:
    """Parse a WAV header without reading the samples; None when the file is not RIFF/WAVE.

    Raises `BadAudioFile` when the header is broken, or when its data chunk claims more
    bytes than the file holds (unless it claims 0xFFFFFFFF, a length the writer did not know: then
    the data is what the file holds): libsndfile silently shortens such files, but
    `tf.audio.decode_wav` fails on them in the middle of training. A path that is not a regular
    file raises `BadAudioFile` before it is opened (a FIFO's open would wait for a writer).
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise BadAudioFile(NOT_AUDIO, "path is not a regular file; point the row at an audio file")
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        riff = handle.read(12)
        if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
            return None
        fmt_fields = None
        fmt_chunk_size = 0
        data_offset = data_size = None
        odd_chunk_before_data = False
        fmt_before_data = False
        unskipped_before_fmt = False
        while True:
            chunk_header = handle.read(8)
            if len(chunk_header) < 8:
                break
            chunk_id = chunk_header[:4]
            (chunk_size,) = struct.unpack("<I", chunk_header[4:])
            body_start = handle.tell()
            if chunk_id == b"fmt ":
                body = handle.read(16)
                if chunk_size < 16 or len(body) < 16:
                    raise BadAudioFile(CORRUPT, "WAV 'fmt ' chunk is shorter than 16 bytes; re-export the file")
                fmt_fields = struct.unpack("<HHIIHH", body)
                fmt_chunk_size = chunk_size
                if data_offset is not None:
                    break
            elif chunk_id == b"data":
                data_offset, data_size = body_start, chunk_size
                fmt_before_data = fmt_fields is not None
                if fmt_before_data:
                    break  # everything needed is known; chunks after the data do not matter
            elif data_offset is None and chunk_size % 2:
                odd_chunk_before_data = True
            if fmt_fields is None and chunk_id not in SKIPPED_BEFORE_FMT:
                unskipped_before_fmt = True
            handle.seek(body_start + chunk_size + (chunk_size & 1))
            if handle.tell() >= file_size:
                break
        tail_ok = True
        if fmt_before_data and data_offset != _CANONICAL_DATA_OFFSET and fmt_fields[4]:
            tail_ok = _tail_ok_for_tf(handle, file_size, data_offset + data_size // fmt_fields[4] * fmt_fields[4])

    if data_offset is None:
        raise BadAudioFile(CORRUPT, "WAV file has no 'data' chunk (damaged or cut off); re-export it")
    available = file_size - data_offset
    if fmt_fields is None:
        raise BadAudioFile(CORRUPT, "WAV file has no 'fmt ' chunk before its end; re-export it")
    format_tag, channels, sample_rate, _byte_rate, block_align, bits_per_sample = fmt_fields
    if channels == 0 or sample_rate == 0 or block_align == 0:
        raise BadAudioFile(
            CORRUPT, f"WAV header is invalid (channels={channels}, rate={sample_rate}, block_align={block_align})"
        )
    streamed = data_size == _UNKNOWN_DATA_SIZE
    if streamed:  # decode_wav refuses it: converted, to the samples the file holds
        data_size = available - available % block_align
    if data_size > available:
        claimed, held = data_size // block_align, available // block_align
        raise BadAudioFile(
            TRUNCATED,
            f"header says {claimed} frames ({claimed / sample_rate:.2f} s) but the file holds only {held} "
            f"({held / sample_rate:.2f} s); the file was cut off, re-export or remove it",
        )
    return WavHeader(
        format_tag=format_tag,
        channels=channels,
        sample_rate=sample_rate,
        bits_per_sample=bits_per_sample,
        block_align=block_align,
        fmt_chunk_size=fmt_chunk_size,
        data_size=data_size,
        data_offset=data_offset,
        layout_ok_for_tf=(fmt_before_data and not odd_chunk_before_data and not unskipped_before_fmt and tail_ok
                          and not streamed),
    )


def _tail_ok_for_tf(handle, file_size: int, offset: int) -> bool:
    """Whether decode_wav reads the chunks after the data (from `offset`, its end) as it walks them:
    no pad byte skipped, so each chunk header must be whole where it lands, and no second data chunk.
    A legal odd-sized chunk there (a LIST of tags) or a stray byte at the end fails it."""
    for _ in range(MAX_CHUNKS):
        if offset >= file_size:
            return True
        handle.seek(offset)
        chunk_header = handle.read(8)
        if len(chunk_header) < 8 or chunk_header[:4] == b"data":
            return False
        (chunk_size,) = struct.unpack("<I", chunk_header[4:])
        if chunk_size >= 2**31:
            return False
        offset += 8 + chunk_size
    return True


# Blocks read first when looking for sound in a 16-bit WAV: speech fills most of a clip, so one of
# these finds it without reading the rest (8 x 2 KB where a 5 s clip is 220 KB).
_SOUND_PROBES, _PROBE_FRAMES = 8, 1024


def silent_pcm16_peak(path: str, header: WavHeader) -> float | None:
    """The loudest sample (0-1) of a 16-bit PCM file `header` describes when it is below SILENT_PEAK;
    None when the file has sound. Reads a few blocks across the file first and the whole data only
    when those are all quiet, so a clip with sound costs well under a millisecond."""
    threshold = int(SILENT_PEAK * 32768)
    frames = header.frames
    with open(path, "rb") as handle:
        for probe in range(_SOUND_PROBES):
            start = (frames - _PROBE_FRAMES) * probe // max(_SOUND_PROBES - 1, 1) if frames > _PROBE_FRAMES else 0
            handle.seek(header.data_offset + start * header.block_align)
            block = np.frombuffer(handle.read(_PROBE_FRAMES * header.block_align), dtype="<i2")
            # int16 -32768 has no positive twin: compare both signs instead of taking abs.
            if block.size and (block.max() > threshold or block.min() < -threshold):
                return None
        handle.seek(header.data_offset)
        samples = np.frombuffer(handle.read(frames * header.block_align), dtype="<i2")
    peak = int(max(samples.max(initial=0), -int(samples.min(initial=0))))
    return None if peak > threshold else peak / 32768
