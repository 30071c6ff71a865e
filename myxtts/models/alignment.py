"""Learning which text token each mel frame speaks, from the audio alone, while the model trains.

No external aligner and no durations in the data: a small acoustic network (`FrameClassifier` in
`layers.py`) gives every mel frame a distribution over the vocabulary, and the sentence's own
token sequence constrains it. The pieces here are the arithmetic of that, in TensorFlow ops:

    frame log-probs [B, T, V] --gather the sentence's tokens--> [B, T, L]  (+ beta-binomial prior)
      -> forward_sum_loss: -log of the summed probability of every monotonic path (train the classifier)
      -> viterbi_alignment: the single best monotonic path, each token >= 1 frame (durations)

The forward-sum objective is the one of Badlani et al. 2021 ("One TTS Alignment to Rule Them
All"): the likelihood of the text given the audio, summed over all monotonic alignments, with a
beta-binomial prior that favours the diagonal while nothing has been learned yet. Normalising each
frame over the whole vocabulary (a phoneme classifier), rather than over the sentence's positions
as their attention does, was measured to matter here: with the softmax over positions, tokens that
carry no sound of their own (stress marks, word spaces) became catch-alls that absorbed whole
words, and 1,300 CPU updates left the demo unintelligible (WER 0.91); with the classifier the same
budget gave 0.56 (BENCHMARKS.md, "Choosing the alignment objective").

Every function takes true lengths and is exact for padded batches: padded frames and tokens
neither contribute nor receive gradient.

The recursions are sequential over frames, and a loop iteration has a fixed cost on every device:
on an H100, 16.5 us per iteration under XLA and 100+ us in graph mode, far more than the [B, L]
arithmetic of one frame. So `scan` steps through a block of frames per iteration (`AlignmentLoops`:
16 on a GPU; measured on an H100, forward-sum + gradient 20.3 us a frame against 50.0 at one, Viterbi
13.0 against 50.7, and 22.1 / 14.8 with the loops compiled alone, against 644 / 874 for the former
graph-mode `tf.scan`), with a trip count XLA can see, and outside an XLA-compiled step the
loops can be compiled alone (`compile=True`), the hand-written gradient staying outside the compiled
functions. A block that suits the GPU does not suit XLA on a CPU (measured there: 16 frames per
iteration compiled for 94 s and ran 10x slower), so the setting is chosen per device
(`for_device`). Every setting computes the same numbers (tests/test_alignment.py).
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from myxtts.hardware.loop_cost import GPU_FRAMES_PER_ITERATION

# Log-probability standing for "impossible": finite, so that 0 * it stays 0 in gradients, and
# far enough below any real path score (T frames x at most ~30 nats) never to be chosen.
IMPOSSIBLE = -1e9


@dataclasses.dataclass(frozen=True)
class AlignmentLoops:
    """How the frame loops run; the results are the same either way.

    frames_per_iteration: frames each loop iteration steps through (its body repeated that often).
    compile: run each loop as its own XLA-compiled function (for steps XLA does not compile whole).
    """

    frames_per_iteration: int = 1
    compile: bool = False

    def __post_init__(self):
        if self.frames_per_iteration < 1:
            raise ValueError(f"frames_per_iteration must be >= 1, got {self.frames_per_iteration}")

    @classmethod
    def for_device(cls, on_gpu: bool, step_compiled: bool, frames_per_iteration: int = 0) -> "AlignmentLoops":
        """The loops for a train step on a GPU or a CPU, compiled whole by XLA or not.

        frames_per_iteration 0 = automatic: 16 on a GPU (2.4-3.9x cheaper a frame than one under XLA
        on an H100), 1 on a CPU. A step that XLA does not compile compiles its loops alone: on the
        H100 that made them 29x (forward-sum + gradient) and 59x (Viterbi) faster than graph-mode
        loops, and on this project's CPU 6-12x (BENCHMARKS.md, "The alignment's loops").
        """
        if not frames_per_iteration:
            frames_per_iteration = GPU_FRAMES_PER_ITERATION if on_gpu else 1
        return cls(frames_per_iteration, compile=not step_compiled)


DEFAULT_LOOPS = AlignmentLoops()


def scan(step, elems, initializer, frames_per_iteration: int = 1):
    """`tf.scan(step, elems, initializer)`: every accumulator, stacked on a new axis 0.

    Each `tf.while_loop` iteration applies `step` to `frames_per_iteration` consecutive elements
    (the body written out that many times), over a frame axis padded to a whole number of blocks;
    the padded elements' results are dropped. With a static frame count the trip count is a
    constant XLA can see. Inputs and outputs go through TensorArrays one frame at a time, as in
    `tf.scan`, so one frame per iteration costs what `tf.scan` does.
    """
    block = frames_per_iteration
    flat = [tf.convert_to_tensor(e) for e in tf.nest.flatten(elems)]
    frames = flat[0].shape[0]
    if frames is None:
        frames = tf.shape(flat[0])[0]
        iterations = (frames + block - 1) // block
    else:
        iterations = math.ceil(frames / block)
    padded = iterations * block
    inputs = [tf.TensorArray(e.dtype, size=padded, element_shape=e.shape[1:]).unstack(
        tf.pad(e, [[0, padded - frames]] + [[0, 0]] * (e.shape.rank - 1))) for e in flat]
    carry_flat = [tf.convert_to_tensor(c) for c in tf.nest.flatten(initializer)]
    outputs = [tf.TensorArray(c.dtype, size=padded, element_shape=c.shape) for c in carry_flat]

    def body(i, carry_flat, outputs):
        carry = tf.nest.pack_sequence_as(initializer, carry_flat)
        for k in range(block):
            frame = i * block + k
            carry = step(carry, tf.nest.pack_sequence_as(elems, [x.read(frame) for x in inputs]))
            outputs = [out.write(frame, value) for out, value in zip(outputs, tf.nest.flatten(carry))]
        return i + 1, tf.nest.flatten(carry), outputs

    _, _, outputs = tf.while_loop(lambda i, *_: i < iterations, body, (tf.constant(0), carry_flat, outputs),
                                  maximum_iterations=iterations)
    results = [tf.ensure_shape(out.stack()[:frames], tf.TensorShape([flat[0].shape[0]]).concatenate(c.shape))
               for out, c in zip(outputs, carry_flat)]
    return tf.nest.pack_sequence_as(initializer, results)


def beta_binomial_log_prior(frames: int | tf.Tensor, tokens: int | tf.Tensor, mel_length, text_length,
                            scaling: float = 1.0) -> tf.Tensor:
    """log P(token j | frame t) [B, frames, tokens] of the beta-binomial prior, float32.

    For a clip of M frames and N tokens, frame t's prior over positions j = 0..N-1 is
    BetaBinomial(N - 1, a = scaling * (t + 1), b = scaling * (M - t)): its mean moves along the
    diagonal, and a larger `scaling` narrows it. Rows and columns past the true lengths are 0.
    """
    t = tf.cast(tf.range(frames), tf.float32)[None, :, None]  # [1, T, 1]
    j = tf.cast(tf.range(tokens), tf.float32)[None, None, :]  # [1, 1, L]
    n = tf.maximum(tf.cast(text_length, tf.float32) - 1.0, 0.0)[:, None, None]  # [B, 1, 1]
    m = tf.cast(mel_length, tf.float32)[:, None, None]
    a = scaling * (t + 1.0)
    b = scaling * tf.maximum(m - t, 1.0)  # >= 1 also on padded frames, where the value is discarded
    k = tf.minimum(j, n)
    lgamma = tf.math.lgamma

    def log_beta(x, y):
        return lgamma(x) + lgamma(y) - lgamma(x + y)

    log_pmf = (lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0)
               + log_beta(k + a, n - k + b) - log_beta(a, b))
    valid = _valid(frames, tokens, mel_length, text_length)
    return tf.where(valid, log_pmf, 0.0)


def token_log_probs(frame_log_probs, tokens, mel_length, text_length, prior_scaling: float = 1.0) -> tf.Tensor:
    """[B, T, L]: log P(frame t says token j of its sentence) plus the log prior, IMPOSSIBLE outside.

    frame_log_probs [B, T, V] (log-softmax over the vocabulary), tokens [B, L] int.
    """
    frames, length = tf.shape(frame_log_probs)[1], tf.shape(tokens)[1]
    per_token = tf.gather(frame_log_probs, tokens, axis=2, batch_dims=1)  # [B, T, L]
    scores = tf.cast(per_token, tf.float32) + beta_binomial_log_prior(
        frames, length, mel_length, text_length, prior_scaling)
    return tf.where(_valid(frames, length, mel_length, text_length), scores, IMPOSSIBLE)


def forward_sum_loss(log_probs, mel_length, text_length, loops: AlignmentLoops = DEFAULT_LOOPS) -> tf.Tensor:
    """[B]: -log sum over monotonic alignments of prod_t p(t, path(t)), divided by the frame count.

    A path starts at token 0 on frame 0, ends at token N-1 on frame M-1 and at each frame either
    stays on its token or moves to the next one, so every token gets at least one frame (a clip
    needs at least as many frames as tokens; the pipeline drops others). The gradient is the
    posterior occupancy of (t, j) from the forward-backward recursion, written out rather than
    left to autodiff through the forward loop: that is one more loop instead of a stack of
    [B, L] intermediates per frame, and it is what makes the loss cheap enough to run every step.
    """
    mel_length = tf.convert_to_tensor(mel_length, tf.int32)
    text_length = tf.convert_to_tensor(text_length, tf.int32)
    block = loops.frames_per_iteration
    forward = _FORWARD_COMPILED if loops.compile else _forward_sum
    backward = _OCCUPANCY_COMPILED if loops.compile else _occupancy

    @tf.custom_gradient
    def loss(log_probs):
        # stop_gradient: the gradient is the one below; a tape must not also differentiate the
        # compiled forward loop (run eagerly, it would ask XLA for the loop's TensorLists: refused).
        alphas, log_total = forward(tf.stop_gradient(log_probs), mel_length, text_length, block)
        frames = tf.cast(mel_length, tf.float32)

        def gradient(upstream):
            occupancy = backward(log_probs, alphas, log_total, mel_length, text_length, block)  # [B, T, L]
            return occupancy * (-upstream / frames)[:, None, None]

        return -log_total / frames, gradient

    return loss(tf.cast(log_probs, tf.float32))


def _forward_sum(log_probs, mel_length, text_length, block):
    """(alphas [T, B, L]: log-sum of the paths ending at (t, j); log_total [B]: of the whole paths)."""
    batch, length = tf.shape(log_probs)[0], tf.shape(log_probs)[2]
    by_frame = tf.transpose(log_probs, [1, 0, 2])  # [T, B, L]
    first = _first_frame(by_frame[0], batch, length)

    def forward(alpha, frame):  # alpha [B, L]: log-sum of paths ending at (t - 1, j)
        return _log_add(alpha, _shift_right(alpha)) + frame

    alphas = tf.concat([first[None], scan(forward, by_frame[1:], first, block)], axis=0)  # [T, B, L]
    end = tf.stack([mel_length - 1, tf.range(batch), text_length - 1], axis=1)
    return alphas, tf.gather_nd(alphas, end)


def _occupancy(log_probs, alphas, log_total, mel_length, text_length, block):
    """[B, T, L]: the posterior probability that frame t is on token j (0 past mel_length)."""
    length = tf.shape(log_probs)[2]
    by_frame = tf.transpose(log_probs, [1, 0, 2])  # [T, B, L]
    last = tf.where(tf.equal(tf.range(length)[None], (text_length - 1)[:, None]), 0.0, IMPOSSIBLE)  # [B, L]

    def backward(beta, inputs):  # beta [B, L]: log-sum of path continuations from (t + 1, j)
        t, next_frame = inputs
        continued = beta + next_frame
        beta_t = _log_add(continued, _shift_left(continued))
        return tf.where((t >= mel_length - 1)[:, None], last, beta_t)  # not yet inside this clip

    steps = tf.range(tf.shape(by_frame)[0] - 2, -1, -1)
    betas = scan(backward, (steps, by_frame[1:][::-1]), last, block)  # frames T-2 .. 0
    betas = tf.concat([betas[::-1], last[None]], axis=0)  # [T, B, L]
    occupancy = tf.exp(alphas + betas - log_total[None, :, None])  # [T, B, L], rows sum to 1
    inside = tf.transpose(tf.sequence_mask(mel_length, tf.shape(by_frame)[0]))[:, :, None]
    return tf.transpose(tf.where(inside, occupancy, 0.0), [1, 0, 2])


def viterbi_alignment(log_probs, mel_length, text_length, loops: AlignmentLoops = DEFAULT_LOOPS) -> tf.Tensor:
    """[B, T, L] float32 0/1: the best monotonic path (monotonic alignment search), no gradient.

    Each valid frame is on exactly one token, tokens are visited in order, each for at least one
    frame; rows past mel_length are all 0.
    """
    log_probs = tf.stop_gradient(tf.cast(log_probs, tf.float32))
    mel_length = tf.convert_to_tensor(mel_length, tf.int32)
    text_length = tf.convert_to_tensor(text_length, tf.int32)
    viterbi = _VITERBI_COMPILED if loops.compile else _viterbi
    return viterbi(log_probs, mel_length, text_length, loops.frames_per_iteration)


def _viterbi(log_probs, mel_length, text_length, block):
    batch, frames, length = tf.shape(log_probs)[0], tf.shape(log_probs)[1], tf.shape(log_probs)[2]
    by_frame = tf.transpose(log_probs, [1, 0, 2])  # [T, B, L]
    first = _first_frame(by_frame[0], batch, length)

    def forward(best, frame):  # best [B, L]: score of the best path ending at (t - 1, j)
        return tf.maximum(best, _shift_right(best)) + frame

    best = tf.concat([first[None], scan(forward, by_frame[1:], first, block)], axis=0)  # [T, B, L]
    previous = tf.concat([tf.fill([1, batch, length], IMPOSSIBLE), best[:-1]], axis=0)  # best at t - 1

    def backtrack(carry, inputs):  # carry[0] [B]: the path's token at frame t + 1
        token, (t, before) = carry[0], inputs
        inside = t <= mel_length - 1
        on_path = tf.one_hot(token, length) * tf.cast(inside, tf.float32)[:, None]  # [B, L]
        stay = tf.gather(before, token, batch_dims=1)
        advance = tf.gather(before, tf.maximum(token - 1, 0), batch_dims=1)
        # Step back a token when coming from it scores higher, or when staying would leave too few
        # frames for the tokens before (token == t: one frame each from here on down).
        step_back = inside & (token > 0) & ((token == t) | (advance > stay))
        return tf.where(step_back, token - 1, token), tf.ensure_shape(on_path, before.shape)

    steps = tf.range(frames - 1, -1, -1)
    _, path = scan(backtrack, (steps, previous[::-1]), (text_length - 1, tf.zeros_like(first)), block)
    return tf.transpose(path[::-1], [1, 0, 2])


# The loops as their own XLA programs (AlignmentLoops.compile), made once: a tf.function keeps one
# compiled program per input shape and block size.
_FORWARD_COMPILED = tf.function(_forward_sum, jit_compile=True)
_OCCUPANCY_COMPILED = tf.function(_occupancy, jit_compile=True)
_VITERBI_COMPILED = tf.function(_viterbi, jit_compile=True)


def durations_of(path) -> tf.Tensor:
    """Frames per token [B, L] int32 of a 0/1 path [B, T, L]."""
    return tf.cast(tf.round(tf.reduce_sum(path, axis=1)), tf.int32)


def frame_tokens(durations, frames) -> tf.Tensor:
    """[B, frames] int32: which token each frame belongs to, for durations [B, L] (the length
    regulator's index). Frames past the durations' total point past the last token (= L), so a
    gather with them must be masked or clamped."""
    ends = tf.cumsum(tf.cast(durations, tf.int32), axis=1)  # [B, L]
    # The number of tokens that ended at or before each frame. (`tf.searchsorted` gives the same in
    # fewer operations, but has no TFLite kernel: this keeps an exported model to built-in ops.)
    ended = tf.reshape(tf.range(frames), [1, -1, 1]) >= tf.expand_dims(ends, 1)  # [B, frames, L]
    return tf.reduce_sum(tf.cast(ended, tf.int32), axis=2)


def _valid(frames, tokens, mel_length, text_length):
    return tf.logical_and(tf.sequence_mask(mel_length, frames)[:, :, None],
                          tf.sequence_mask(text_length, tokens)[:, None, :])


def _first_frame(frame, batch, length):
    """Paths start on token 0: [B, L] with frame 0's score at j = 0 and IMPOSSIBLE elsewhere."""
    return tf.concat([frame[:, :1], tf.fill(tf.stack([batch, length - 1]), IMPOSSIBLE)], axis=1)


def _shift_right(x):
    """x[:, j - 1] at j (IMPOSSIBLE at j = 0): the score of arriving from the previous token."""
    return tf.concat([tf.fill(tf.stack([tf.shape(x)[0], 1]), IMPOSSIBLE), x[:, :-1]], axis=1)


def _shift_left(x):
    return tf.concat([x[:, 1:], tf.fill(tf.stack([tf.shape(x)[0], 1]), IMPOSSIBLE)], axis=1)


def _log_add(a, b):
    """log(exp(a) + exp(b)) elementwise, stable for IMPOSSIBLE entries."""
    high = tf.maximum(a, b)
    return high + tf.math.log1p(tf.exp(-tf.abs(a - b)))
