"""Per-phoneme timing of a demo clip: the ground truth a learned alignment is measured against.

While the demo corpus is rendered, espeak-ng reports every phoneme it speaks with the sample it
starts at (`espeakEVENT_PHONEME`). `demo_corpus.py` writes them beside each clip:

    wavs/demo_0001.wav
    wavs/demo_0001.timing.json
        {"voice": "en-us+f2", "sample_rate": 22050, "num_samples": 56183,
         "hop_length": 256, "num_frames": 220,
         "phonemes":      ["h", "ə", "l", "ˈoʊ", "_", ...],   IPA as espeak-ng names them; "_" is a pause
         "start_samples": [264, 1384, 2472, 4840, 9692, ...],
         "frames":        [6, 4, 9, 19, 13, ...]}              one count per phoneme, summing to num_frames

Frames are those of a centred STFT of the whole clip as written (`1 + num_samples // hop_length`,
the pipeline's convention; frame t is centred on sample t * hop_length). A frame belongs to the
phoneme sounding at its centre, and the first phoneme also takes the frames before it starts, so
the counts always sum to the clip's frames. The pipeline trims leading and trailing silence
(`data.trim_silence_db`) before computing its features: shift by the trimmed frames to compare.

The phonemes are what the voice said, with its own accent: the clip's manifest `phonemes` (what
the model reads) come from the text front end in the corpus's language and may differ for a voice
of another accent (`en+m7` speaks British English), and they carry no pauses.

This is measurement data, never a training input. Pure Python.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

TIMING_SUFFIX = ".timing.json"
DEFAULT_HOP_LENGTH = 256


def timing_path(wav_path: str | os.PathLike) -> Path:
    """The timing file of a clip: wavs/demo_0001.wav -> wavs/demo_0001.timing.json."""
    wav_path = Path(wav_path)
    return wav_path.with_name(wav_path.stem + TIMING_SUFFIX)


def phoneme_frames(start_samples: list[int], num_samples: int, hop_length: int) -> list[int]:
    """Frames per phoneme for phonemes starting at `start_samples`, summing to 1 + num_samples // hop.

    Phoneme i owns the frames whose centre t * hop lies in [start_i, start_i+1), i.e. frames
    ceil(start_i / hop) up to ceil(start_i+1 / hop); the first phoneme's frames start at 0 and the
    last one's end at the clip's last frame. A phoneme of no duration gets 0 frames.
    """
    if hop_length <= 0:
        raise ValueError(f"hop_length must be positive, got {hop_length}")
    if not start_samples:
        raise ValueError("no phonemes to assign frames to")
    num_frames = 1 + num_samples // hop_length
    boundaries = [0]
    for start in start_samples[1:]:
        # -(-a // b) is ceil(a / b); max() keeps counts non-negative if events ever came out of order.
        boundaries.append(max(boundaries[-1], min(-(-start // hop_length), num_frames)))
    boundaries.append(num_frames)
    return [end - begin for begin, end in zip(boundaries, boundaries[1:])]


@dataclass(frozen=True)
class PhonemeTiming:
    voice: str
    sample_rate: int
    num_samples: int
    phonemes: tuple[str, ...]
    start_samples: tuple[int, ...]

    def frames(self, hop_length: int) -> list[int]:
        """Frames per phoneme at `hop_length` (any hop, not only the one the file was written with)."""
        return phoneme_frames(list(self.start_samples), self.num_samples, hop_length)

    def to_json(self, hop_length: int = DEFAULT_HOP_LENGTH) -> str:
        record = {
            "voice": self.voice,
            "sample_rate": self.sample_rate,
            "num_samples": self.num_samples,
            "hop_length": hop_length,
            "num_frames": 1 + self.num_samples // hop_length,
            "phonemes": list(self.phonemes),
            "start_samples": list(self.start_samples),
            "frames": self.frames(hop_length),
        }
        return json.dumps(record, ensure_ascii=False) + "\n"


def read_timing(path: str | os.PathLike) -> PhonemeTiming:
    """A timing file as written by the demo corpus (the frame counts are recomputed by `frames`)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        timing = PhonemeTiming(record["voice"], record["sample_rate"], record["num_samples"],
                               tuple(record["phonemes"]), tuple(record["start_samples"]))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: not a phoneme timing file ({error}); rebuild the demo corpus") from None
    if len(timing.phonemes) != len(timing.start_samples):
        raise ValueError(f"{path}: {len(timing.phonemes)} phonemes but {len(timing.start_samples)} start samples")
    return timing
