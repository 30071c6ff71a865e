"""One clip in TensorFlow ops: its row decoded (WAV, resampled, silence trimmed, text tokenized),
checked against the length limits, and turned into the log-mel and tokens the model takes; a voice
reference clip's log-mel; and, with `data.mel_on_device`, a batch's log-mel computed in the step.
`pipeline.py` maps these over a corpus; synthesis, the export and the evaluations call them on one
clip, so every caller sees the features training saw."""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data import audio
from myxtts.data.text import tokenize
from myxtts.data.wav_header import SILENT_PEAK


def decode_row(row, c: DataConfig, table) -> dict:
    samples, rate = audio.load_wav(row["audio_path"])
    samples = audio.resample_to(samples, rate, c.sample_rate, source=row["audio_path"])
    if c.trim_silence_db > 0:
        samples = audio.trim_silence(samples, c.trim_silence_db)
    tokens = tokenize(row["text"], table, frontend=c.text_frontend)
    # Peak-normalised later, in `clip_features`: the length filter and the drop of the clips no full
    # batch will hold need only the length, so a dropped clip never pays for it.
    return {
        "samples": samples,
        "tokens": tokens,
        "clip": row["clip"],
    }


def within_limits(example, c: DataConfig) -> tf.Tensor:
    """Whether a decoded clip fits `data.min/max_duration_s` and the longest text bucket, has at
    least as many mel frames as tokens (the alignment gives every token a frame of its own), and
    is not silent."""
    return functools.reduce(tf.logical_and, [holds for _, holds in clip_limits(example, c)])


def clip_limits(example, c: DataConfig) -> list[tuple[str, tf.Tensor]]:
    """(what a clip outside it is, whether this clip is inside) for each limit `within_limits` applies.

    A silent clip (digital silence or hiss: `prepare_dataset.py` rejects it, but a corpus it never saw
    can hold one) would teach the model to say its transcript with silence; the silence trim keeps
    such a clip whole, its own loudest frame being its reference."""
    num_samples = tf.shape(example["samples"])[0]
    num_tokens = tf.shape(example["tokens"])[0]
    return [
        (f"shorter than data.min_duration_s ({c.min_duration_s} s{', silence trimmed' if c.trim_silence_db > 0 else ''})",
         num_samples >= int(c.min_duration_s * c.sample_rate)),
        (f"longer than data.max_duration_s ({c.max_duration_s} s)", num_samples <= int(c.max_duration_s * c.sample_rate)),
        (f"with more tokens than the longest text bucket ({c.bucket_text_lengths[-1]})",
         num_tokens <= c.bucket_text_lengths[-1]),
        ("with no tokens", num_tokens >= 1),
        ("with fewer mel frames than tokens (the alignment gives every token a frame)",
         mel_frames(example["samples"], c) >= num_tokens),
        # Last: an empty clip is too short, not silent (the reasons name the first limit a clip fails).
        (f"silent (loudest sample below {20 * math.log10(SILENT_PEAK):.0f} dBFS)",
         tf.reduce_max(tf.abs(example["samples"])) >= SILENT_PEAK),
    ]


def clip_features(example, c: DataConfig) -> dict:
    """A decoded clip's cached features (the reference is added after the cache, every epoch)."""
    samples = audio.peak_normalize(example["samples"], c.peak_normalize)
    if c.mel_on_device:
        # The waveform travels instead; the compiled step turns it into the same log-mel.
        signal = {"audio": samples, "mel_length": mel_frames(samples, c)}
    else:
        mel = audio.log_mel(samples, c)  # [frames, n_mels]
        signal = {"mel": mel, "mel_length": tf.shape(mel)[0]}
    return {
        **signal,
        "tokens": example["tokens"],
        "text_length": tf.shape(example["tokens"])[0],
        "clip": example["clip"],
    }


def reference_log_mel(path, c: DataConfig):
    """The middle `reference_duration_s` of a clip (away from leading and trailing silence), as a
    log-mel padded to a fixed number of frames: ([reference_frames, n_mels], true frames)."""
    return reference_log_mel_of_bytes(tf.io.read_file(path), c, source=path)


def reference_log_mel_of_bytes(contents, c: DataConfig, source: tf.Tensor | str = ""):
    """`reference_log_mel` of a WAV file's bytes; `source` names it in errors."""
    samples, rate = audio.decode_wav_bytes(contents, middle_seconds=c.reference_duration_s, source=source)
    samples = audio.resample_to(samples, rate, c.sample_rate, source=source)[: c.reference_samples]
    mel = audio.log_mel(audio.peak_normalize(samples, c.peak_normalize), c)  # [frames <= reference_frames, n_mels]
    frames = tf.shape(mel)[0]
    mel = tf.pad(mel, [[0, c.reference_frames - frames], [0, 0]], constant_values=math.log(c.log_floor))
    return tf.ensure_shape(mel, [c.reference_frames, c.n_mels]), frames


def mel_from_audio(batch: dict, c: DataConfig) -> dict:
    """With `data.mel_on_device`, replace the batch's padded waveforms by their log-mel (in the step).

    A bucket's waveforms are padded to (frames - 1) * hop samples, so the centred STFT gives exactly
    the bucket's frame count; frames inside each clip's `mel_length` equal the per-clip features.
    """
    if "audio" not in batch:
        return batch
    features = {k: v for k, v in batch.items() if k != "audio"}
    # Called as a Keras model under bf16 or fp16, the model gets its batch cast to that dtype, which
    # the STFT does not take (the train step's own batch stays float32, so the cast changes nothing there).
    features["mel"] = audio.log_mel(tf.cast(batch["audio"], tf.float32), c)  # [batch, frames, n_mels], float32
    return features


def mel_frames(samples, c: DataConfig) -> tf.Tensor:
    """The frames of a clip's log-mel: the STFT is centred, so 1 + samples // hop."""
    return 1 + tf.shape(samples)[0] // c.hop_length
