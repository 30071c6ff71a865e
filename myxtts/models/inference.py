"""Synthesis: autoregressive mel generation from a text and a voice, compiled as one graph loop.

    reference clip(s) -> conditioning latents -> [latents | text] prompt
      -> tf.while_loop: one causal pass per step appends r frames -> stop head says "last frame"
         (or the frames have gone silent: `end_silence`)
      -> postnet over the finished mel -> (mel, length)

The whole loop is a single `tf.function` (optionally XLA-compiled): no Python runs per frame.
Each step recomputes the full causal pass over a fixed-size buffer of max_frames frames instead of
keeping a key/value cache. That costs O(steps x sequence) attention per utterance, but it reuses
`XTTS.decode` unchanged, keeps one static shape for XLA, and causality guarantees that the unfilled
tail of the buffer cannot influence the group being predicted. A KV cache is the optimisation to
add if synthesis speed matters.
"""

from __future__ import annotations

import math
import weakref

import tensorflow as tf

from myxtts.data.text import PAD_ID

# One compiled loop per model, reused across calls (tf.function then caches a trace per shape).
_LOOPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# How long generated frames must stay silent before the utterance counts as ended. Longer than
# any pause inside the demo corpus's sentences (at most 28 frames, 0.33 s, below the 60 dB
# trimming threshold; median 10), so a pause between clauses never ends an utterance.
END_SILENCE_SECONDS = 0.5


def end_silence(data_config) -> dict:
    """`generate`'s silence rule for a run's features: {"silence_frames", "silence_depth"}.

    Training clips are trimmed by `data.trim_silence_db` (librosa's rule: frames that far below
    the loudest are not speech), so the model never sees silence after speech and its stop head
    never learns to fire on it. When decoding has run past the text it often goes quiet instead of
    stopping; the same threshold then says the speech is over. The depth is the dB figure in
    log-mel units: a magnitude mel (`power` 1) moves ln(10) / 20 per dB, a power mel twice that.
    Off (0 frames) when clips are not trimmed: then the model has seen silence and learned to stop.
    """
    d = data_config
    if not d.trim_silence_db:
        return {"silence_frames": 0, "silence_depth": 0.0}
    return {
        "silence_frames": round(END_SILENCE_SECONDS * d.frames_per_second),
        "silence_depth": d.trim_silence_db * math.log(10.0) / (20.0 if d.power == 1.0 else 10.0),
    }


def generate(model, tokens, reference_mel, reference_length, max_frames: int, stop_threshold: float = 0.5, *,
             silence_frames: int = 0, silence_depth: float = 0.0, average_references: bool = False, latents=None,
             jit_compile: bool = False):
    """Synthesize log-mels: (mel [B, frames, n_mels] float32, length [B] int32).

    tokens: [L] or [B, L] int ids (BOS text EOS, padded with PAD_ID). reference_mel
    [B, R, n_mels] with reference_length [B]: one voice per text row, or with
    `average_references=True` any number of clips of one voice, averaged into one voice for every
    row. `latents` [1 or B, K, d] from `model.conditioning_latents` skips the reference encoding.
    Generation stops, per row, after the first frame whose stop probability exceeds
    `stop_threshold`, or at `max_frames`. With `silence_frames` > 0 it also stops once that many
    frames in a row have their loudest band `silence_depth` (log-mel units) below the loudest
    frame generated so far; the row then ends where that silence began (`end_silence` gives a
    run's values). `frames` is the longest row's length; cut each row to its own `length` (frames
    past it are whatever the model produced).
    """
    if not model.built:
        model.build()
    tokens = tf.convert_to_tensor(tokens, tf.int32)
    if tokens.shape.rank == 1:
        tokens = tokens[None]
    text_length = tf.reduce_sum(tf.cast(tokens != PAD_ID, tf.int32), axis=1)  # [B]
    if latents is None:
        reference_mel = tf.convert_to_tensor(reference_mel, tf.float32)
        reference_length = tf.convert_to_tensor(reference_length, tf.int32)
        latents = model.conditioning_latents(reference_mel, reference_length, average=average_references)
    # One voice for several rows is broadcast here, so the compiled loop sees one latents shape.
    latents = tf.broadcast_to(latents, tf.concat([tf.shape(tokens)[:1], tf.shape(latents)[1:]], axis=0))
    mel_before, length = autoregress(
        model, latents, tokens, text_length, max_frames, stop_threshold, silence_frames=silence_frames,
        silence_depth=silence_depth, jit_compile=jit_compile,
    )
    mel = model.refine(mel_before, length)
    return mel[:, : tf.reduce_max(length)], length


def autoregress(model, latents, tokens, text_length, max_frames: int, stop_threshold: float = 0.5, *,
                silence_frames: int = 0, silence_depth: float = 0.0, jit_compile: bool = False):
    """The decoding loop alone: (mel_before [B, max_frames, n_mels], length [B]), no postnet.

    Step i writes frames i*r .. i*r + r - 1 of the buffer from a causal pass over the buffer so
    far, exactly as teacher forcing would with the generated frames as targets.
    """
    key = bool(jit_compile)
    loops = _LOOPS.setdefault(model, {})
    if key not in loops:
        # Through a weak reference: a closure holding the model would keep its cache entry alive forever.
        model_ref = weakref.ref(model)
        loops[key] = tf.function(lambda *args: _decode_loop(model_ref(), *args), jit_compile=jit_compile)
    return loops[key](
        tf.convert_to_tensor(latents),
        tf.convert_to_tensor(tokens, tf.int32),
        tf.convert_to_tensor(text_length, tf.int32),
        tf.constant(stop_threshold, tf.float32),
        tf.constant(silence_depth, tf.float32),
        int(max_frames),
        int(silence_frames),
    )


def _decode_loop(model, latents, tokens, text_length, stop_threshold, silence_depth, max_frames: int,
                 silence_frames: int):
    r = model.reduction_factor
    steps = -(-max_frames // r)
    buffer_frames = steps * r
    batch = tf.shape(tokens)[0]
    group_of_frame = tf.range(buffer_frames) // r  # [F]: which step writes each frame
    never = tf.fill([batch], buffer_frames + 1)  # a length no rule produces: "not stopped by this rule"

    def keep_going(step, mel, length, done, peak, quiet):
        return tf.logical_and(step < steps, tf.logical_not(tf.reduce_all(done)))

    def one_step(step, mel, length, done, peak, quiet):
        outputs = model.decode(latents, tokens, text_length, mel, training=False)
        in_group = tf.equal(group_of_frame, step)  # [F]
        # Only the current group is new; earlier frames are reproduced identically by causality.
        mel = tf.where(in_group[None, :, None], outputs["mel_before"], mel)  # [B, F, n_mels]
        stopping = tf.logical_and(in_group[None, :], tf.sigmoid(outputs["stop_logits"]) > stop_threshold)  # [B, F]
        first_stop = tf.argmax(tf.cast(stopping, tf.int32), axis=1, output_type=tf.int32)  # [B], 0 if none
        ends = tf.where(tf.reduce_any(stopping, axis=1), first_stop + 1, never)
        if silence_frames:
            # Frame by frame through the new group (r is at most 8): the running peak, the length of
            # the quiet run, and where a run that has reached silence_frames began.
            group = tf.gather(outputs["mel_before"], step * r + tf.range(r), axis=1)  # [B, r, n_mels], static shape
            loudest = tf.reduce_max(group, axis=-1)  # [B, r]
            for j in range(r):
                peak = tf.maximum(peak, loudest[:, j])
                quiet = tf.where(loudest[:, j] < peak - silence_depth, quiet + 1, 0)
                silence_began = step * r + j - silence_frames + 1
                ends = tf.where(quiet >= silence_frames, tf.minimum(ends, silence_began), ends)
        newly_done = tf.logical_and(ends < never, tf.logical_not(done))
        length = tf.where(newly_done, ends, length)
        return step + 1, mel, length, tf.logical_or(done, newly_done), peak, quiet

    initial = (
        tf.constant(0),
        tf.zeros(tf.stack([batch, buffer_frames, model.n_mels]), tf.float32),
        tf.zeros([batch], tf.int32),
        tf.zeros([batch], tf.bool),
        tf.fill([batch], float("-inf")),
        tf.zeros([batch], tf.int32),
    )
    _, mel, length, done, _, _ = tf.while_loop(keep_going, one_step, initial)
    # Rows that never stopped run to max_frames; a stop in the last group past max_frames is cut too.
    length = tf.minimum(tf.where(done, length, max_frames), max_frames)
    return mel[:, :max_frames], length
