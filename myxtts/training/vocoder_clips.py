"""What the neural vocoder trains on: every clip of a corpus held in memory with its log-mel (the
recording's, `recorded_mels`, or the acoustic model's, `teacher_forced_mels`) and optionally its
Griffin-Lim phase, cut into fixed-length random segments (`clip_stream`), and the same segment cut
from a batch inside the step (`segment_starts`, `waveform_segments`, `mel_segments`)."""

from __future__ import annotations

import random

import tensorflow as tf

from myxtts.models.griffin_lim import griffin_lim_phase, mel_to_magnitude


def random_segments(waveforms, mel_length, segment_frames: int, hop_length: int, seed=None) -> tf.Tensor:
    """[B, (segment_frames - 1) * hop] samples: a random stretch of each clip inside its `mel_length`
    frames (from the start, zero-padded, for a clip shorter than the segment)."""
    start = segment_starts(mel_length, segment_frames, seed)
    return waveform_segments(waveforms, start, segment_frames, hop_length)


def segment_starts(mel_length, segment_frames: int, seed=None) -> tf.Tensor:
    """[B] int32: a random first frame per clip, with `segment_frames` frames inside its `mel_length`."""
    return first_frames(tf.random.uniform(tf.shape(mel_length), 0.0, 1.0, seed=seed), mel_length, segment_frames)


def first_frames(draw, mel_length, segment_frames: int) -> tf.Tensor:
    """int32 first frames for uniform `draw`s in [0, 1), shaped like `mel_length`: every start that
    leaves `segment_frames` frames inside the clip equally likely (0 for a shorter clip)."""
    last_start = tf.maximum(mel_length - segment_frames, 0)
    return tf.cast(tf.floor(draw * tf.cast(last_start + 1, tf.float32)), tf.int32)


def waveform_segments(waveforms, start, segment_frames: int, hop_length: int) -> tf.Tensor:
    """The samples of frames start .. start + segment_frames - 1 (frame t is centred on sample t * hop)."""
    length = (segment_frames - 1) * hop_length
    padded = tf.pad(waveforms, [[0, 0], [0, length]])
    index = (start * hop_length)[:, None] + tf.range(length)[None]
    return tf.gather(padded, index, batch_dims=1)


def mel_segments(mel, start, segment_frames: int) -> tf.Tensor:
    """Frames start .. start + segment_frames - 1 of each clip's mel [B, T, n_mels] (past T: the last frame)."""
    index = tf.minimum(start[:, None] + tf.range(segment_frames)[None], tf.shape(mel)[1] - 1)
    return tf.gather(mel, index, batch_dims=1)


def teacher_forced_mels(network, batches, data_config) -> dict:
    """The acoustic `network`'s own mels of every clip of `batches` (waveform batches, `data.mel_on_device`),
    decoded on the recording's alignment so that frame t still belongs with the samples around t * hop:
    held in memory as `held_clips` holds them ("mel": the model's).

    A vocoder fine-tuned on these (`VocoderTrainer` takes the batch's "mel" as its input) learns the
    acoustic model's smoothed mels instead of meeting them for the first time at synthesis."""
    from myxtts.data.clip_features import mel_from_audio

    # Traced: called eagerly, the alignment's loops would dispatch every frame's ops from Python.
    decode = tf.function(lambda batch: network(mel_from_audio(batch, data_config), training=False)["mel"],
                         reduce_retracing=True)
    return held_clips([(batch["audio"], batch["mel_length"], decode(batch)) for batch in batches], data_config)


def recorded_mels(batches, data_config) -> dict:
    """Every clip of `batches` (waveform batches, `data.mel_on_device`) with its log-mel, as
    `teacher_forced_mels` gives the model's (`held_clips`)."""
    from myxtts.data.clip_features import mel_from_audio

    mels = tf.function(lambda batch: mel_from_audio(batch, data_config)["mel"], reduce_retracing=True)
    return held_clips([(batch["audio"], batch["mel_length"], mels(batch)) for batch in batches], data_config)


def held_clips(batches, data_config) -> dict:
    """[(audio [B, n], mel_length [B], mel [B, T, n_mels])] -> the clips held in memory, unpadded:
    {"audio" ragged [N, (samples)], "mel_length" [N], "mel" ragged [N, (frames), n_mels]}.
    `clip_stream` makes training batches of them. Ragged, not padded to the longest clip: padded, the
    demo corpus's 376 clips with their phase (`with_griffin_lim_phase`) held 869 MB."""
    audio, mel, lengths = [], [], []
    for audio_batch, frames_batch, mel_batch in batches:
        for i in range(int(tf.shape(frames_batch)[0])):
            frames = int(frames_batch[i])
            audio.append(audio_batch[i, : (frames - 1) * data_config.hop_length])
            mel.append(mel_batch[i, :frames])
            lengths.append(frames)
    lengths = tf.constant(lengths, tf.int32)
    return {"audio": tf.RaggedTensor.from_row_lengths(tf.concat(audio, 0), (lengths - 1) * data_config.hop_length),
            "mel_length": lengths,
            "mel": tf.RaggedTensor.from_row_lengths(tf.concat(mel, 0), lengths)}


def with_griffin_lim_phase(clips: dict, data_config, progress=None) -> dict:
    """`clips` (as `held_clips` makes them) and "phase": the angle (float16, ragged [N, (frames), bins])
    of Griffin-Lim's phase for each clip's prior magnitude, computed over the clip alone as synthesis
    computes it, once: 32 iterations for every segment of every epoch would make a training step ~1.5x
    as long."""
    find = tf.function(lambda mel: tf.math.angle(griffin_lim_phase(mel_to_magnitude(mel, data_config), data_config)),
                       reduce_retracing=True)
    angles, count = [], int(clips["mel_length"].shape[0])
    for i in range(count):
        angles.append(tf.cast(find(clips["mel"][i]), tf.float16))
        if progress is not None:
            progress(i + 1, count)
    return {**clips, "phase": tf.RaggedTensor.from_row_lengths(tf.concat(angles, 0), clips["mel_length"])}


def clip_stream(clips: dict, batch_size: int, data_config, segment_frames: int, seed=None, shard: int = 0,
                shards: int = 1):
    """Endless shuffled batches of held `clips`, one segment of `segment_frames` frames from each at a
    random first frame (as `segment_starts` draws it; a short clip's frames past its end are the log
    floor and silence), as `VocoderTrainer` takes them. Cut here, not in the step, so that every batch
    has one shape: padded to each batch's longest clip, an XLA-compiled step compiled again at every
    batch (on an H200 the first 50 updates had not finished 150 s in; BENCHMARKS.md)."""
    floor = float(tf.math.log(data_config.log_floor))
    hop = data_config.hop_length
    samples = (segment_frames - 1) * hop  # what `waveform_segments` cuts for these frames

    def cut(values, begin, size, padding):  # values[begin : begin + size], padded past the end to size
        piece = values[begin:begin + size]
        rank = len(values.shape)
        piece = tf.pad(piece, [[0, size - tf.shape(piece)[0]]] + [[0, 0]] * (rank - 1),
                       constant_values=tf.cast(padding, values.dtype))
        return tf.ensure_shape(piece, [size] + values.shape[1:].as_list())

    # Each element's first frame drawn from (seed, its index): the same batches for the same seed, however
    # many map calls run at once (a stateful random op in a parallel map draws in any order).
    base = random.randrange(2**31) if seed is None else int(seed)

    def segment(index, clip):  # a ragged clip sliced out of `clips` holds one uniform row: dense first
        clip = {key: value.to_tensor() if isinstance(value, tf.RaggedTensor) else value for key, value in clip.items()}
        draw = tf.random.stateless_uniform([], seed=tf.stack([tf.constant(base, tf.int64), index]))
        start = first_frames(draw, clip["mel_length"], segment_frames)
        cut_clip = {"audio": cut(clip["audio"], start * hop, samples, 0.0),
                    "mel_length": tf.minimum(clip["mel_length"], segment_frames)}  # the step's own draw is then 0
        for key, padding in (("mel", floor), ("phase", 0.0)):
            if key in clip:
                cut_clip[key] = cut(clip[key], start, segment_frames, padding)
        return cut_clip

    count = int(clips["mel_length"].shape[0])
    return (tf.data.Dataset.from_tensor_slices(clips).shard(shards, shard).shuffle(count, seed=seed).repeat().enumerate()
            .map(segment, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size, drop_remainder=True).prefetch(2))
