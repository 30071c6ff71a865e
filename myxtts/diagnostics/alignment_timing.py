"""The alignment's frame loops timed on their own, on the batch the step-alone measurement used.

On an H100 the train step was almost all the alignment's loops (the forward-sum loss and its
hand-written gradient, and Viterbi: each a sequential loop over mel frames, `models/alignment.py`),
and a diagnosis that saw only "the compiled step" and a GPU idling between tiny loop iterations
called it host-overhead-bound. This gives the loops' part of the step a number of its own.

How it is measured: timed separately, not read from a profiler trace. The network's alignment
scores for the batch ([B, T, L], `XTTS.align`) are computed once, outside the timing; then the loops
run as the step runs them (forward-sum loss with its gradient, and Viterbi, with the network's own
`alignment_loops`: frames per iteration, compiled alone or not) inside a `tf.function` with the
step's `jit_compile`, several times after an untimed first call (which traces and compiles); the
median is kept.

Why that is a fair split of the step: the loops read only the scores and are sequential, every
iteration waiting for the one before, so nothing else of the step runs inside them and they share
no work with the rest (the encoders, the decoder, the optimizer). The step's time is the loops'
plus the rest's. If the runtime overlaps an independent part of the step (say the text encoder)
with a loop, the loops' share of the step is an upper bound, and the rest costs at least the
step minus the loops.

The same loops on random scores of a fixed shape give the capacity plan its loop cost on a GPU
(`startup_loop_cost`: timed at the start of the first run on a GPU model, then cached,
`hardware/loop_cost.py`), in place of a figure measured on another card.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from myxtts.hardware.loop_cost import TIMING_SHAPE, LoopCost, key_for, loop_cost_cache
from myxtts.hardware.probe import ProbeCache
from myxtts.models import alignment
from myxtts.models.flops import alignment_loop_iterations


@dataclass
class AlignmentLoopsTimer:
    """Times the loops of `network` (an `XTTS`: `align`, `alignment_loops`) as its train step runs them.

    `jit_compile`: the step's (the loops are timed inside a function compiled the same way).
    `with_mel`: the batch with `mel` (`TrainingModel.with_mel`, for waveform batches).
    """

    network: Any
    jit_compile: bool = False
    with_mel: Callable[[dict], dict] = lambda batch: batch

    def measure(self, batch: dict, repeats: int, progress=lambda message: None) -> dict:
        """The loops `repeats` times on `batch` after one untimed call; see the module docstring."""
        batch = self.with_mel(batch)
        network, loops = self.network, self.network.alignment_loops

        # The scores once, outside the timing (a graph, so Viterbi inside `align` runs as a loop op,
        # not op by op). training=False: the scores' values do not change the loops' cost, and the
        # frame classifier's dropout would draw from the seed generator training goes on with.
        scores, count, _ = tf.function(network.align)(batch["mel"], batch["mel_length"], batch["tokens"],
                                                      batch["text_length"], training=False)
        mel_length = tf.convert_to_tensor(batch["mel_length"], tf.int32)
        warmup_s, durations = _time_loops(loops, self.jit_compile, scores, mel_length, count, repeats)
        frames = int(scores.shape[1])
        block = loops.frames_per_iteration
        median_ms = float(np.median(durations) * 1e3)
        progress(f"  alignment loops alone: median {median_ms:.1f} ms over {repeats} runs "
                 f"(first call {warmup_s:.2f} s), {frames} frames, {block} per iteration")
        return {
            "runs": repeats,
            "median_ms": median_ms,
            "warmup_ms": warmup_s * 1e3,
            "frames": frames,
            "tokens": int(scores.shape[2]),
            "frames_per_iteration": block,
            "iterations": alignment_loop_iterations(frames, block),
            "compiled": bool(loops.compile),
            "jit_compile": bool(self.jit_compile),
        }


def _time_loops(loops: alignment.AlignmentLoops, jit_compile: bool, scores, mel_length, count,
                repeats: int) -> tuple[float, list[float]]:
    """(the first call's seconds: trace and compile, then `repeats` calls' seconds) of the forward-sum
    loss with its gradient and Viterbi on `scores`, as a train step runs them."""

    @tf.function(jit_compile=jit_compile)
    def run_loops(scores, mel_length, count):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            loss = tf.reduce_sum(alignment.forward_sum_loss(scores, mel_length, count, loops))
        gradient = tape.gradient(loss, scores)  # the backward loop (`_occupancy`)
        path = alignment.viterbi_alignment(scores, mel_length, count, loops)
        # One scalar that needs all three; reading it waits for the device, as the step's read does.
        return loss + tf.reduce_sum(gradient) + tf.reduce_sum(path)

    def once() -> float:
        started = time.perf_counter()
        float(run_loops(scores, mel_length, count))
        return time.perf_counter() - started

    first_s = once()
    return first_s, [once() for _ in range(repeats)]


def time_loop_frames(loops: alignment.AlignmentLoops, *, jit_compile: bool, shape=TIMING_SHAPE,
                     repeats: int = 5) -> tuple[float, float]:
    """(median seconds per frame of one loop, seconds of the first call) of the loops on random scores
    of `shape` [batch, frames, tokens], every clip full length: the capacity plan's loop cost.

    A frame of one loop, because the plan counts the step's loops in frames (`alignment_loop_iterations`
    at one frame per iteration: forward-sum, its gradient, Viterbi and its backtrack); the random
    scores cost what a batch's do (the loops' work does not depend on the values).
    """
    batch, frames, tokens = shape
    scores = tf.nn.log_softmax(tf.random.stateless_normal(shape, seed=(0, 1)), axis=-1)
    mel_length = tf.fill([batch], frames)
    count = tf.fill([batch], tokens)
    first_s, durations = _time_loops(loops, jit_compile, scores, mel_length, count, repeats)
    return float(np.median(durations)) / alignment_loop_iterations(frames), first_s


def startup_loop_cost(device: str, loops: alignment.AlignmentLoops, *, jit_compile: bool = True,
                      cache: ProbeCache | None = None, progress=lambda message: None) -> LoopCost:
    """The loops' cost per frame on this process's device (named `device`): read from the cache, or
    timed now (`time_loop_frames`, seconds) and cached for every later run on this GPU model."""
    cache = cache or loop_cost_cache()
    key = key_for(device, loops.frames_per_iteration, jit_compile)
    cached = cache.load(key)
    if cached is not None:
        return cached
    batch, frames, tokens = TIMING_SHAPE
    progress(f"alignment loops: timing them on {device} (once per GPU model: "
             f"[{batch}, {frames}, {tokens}], {loops.frames_per_iteration} frames per iteration)")
    began = time.perf_counter()
    seconds, first_s = time_loop_frames(loops, jit_compile=jit_compile)
    cost = LoopCost(seconds, f"measured on {device} at the start of a run on {time.strftime('%Y-%m-%d')}: "
                             f"forward-sum + gradient and Viterbi on [{batch}, {frames}, {tokens}] scores, "
                             f"{loops.frames_per_iteration} frames per iteration, {'XLA' if jit_compile else 'graph'}, "
                             f"median of 5 (first call {first_s:.1f} s); cached in {cache.path_for(key)}")
    cache.store(key, cost)
    progress(f"alignment loops: {seconds * 1e6:.1f} us per loop frame on {device} (timed in "
             f"{time.perf_counter() - began:.0f} s, once per GPU model)")
    return cost
