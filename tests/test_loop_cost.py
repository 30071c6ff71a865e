"""The alignment loops' cost per frame on a GPU model: timed at the start of its first run, then cached."""

import pytest

from myxtts.diagnostics import alignment_timing
from myxtts.diagnostics.alignment_timing import startup_loop_cost
from myxtts.hardware.loop_cost import loop_cost_cache
from myxtts.models.alignment import AlignmentLoops


def test_the_loops_are_timed_once_per_gpu_model_and_setting_then_read_from_the_cache(tmp_path, monkeypatch):
    cache = loop_cost_cache(tmp_path)
    one = AlignmentLoops(frames_per_iteration=1)
    lines = []
    cost = startup_loop_cost("Test GPU", one, jit_compile=False, cache=cache, progress=lines.append)
    # Graph-mode loops on a CPU: tens of microseconds a loop frame (BENCHMARKS.md); any CPU lies in 0.1 us - 10 ms.
    assert 1e-7 < cost.seconds_per_frame < 1e-2
    assert cost.source.startswith("measured on Test GPU") and "1 frames per iteration, graph" in cost.source
    assert any("timing them on Test GPU" in line for line in lines)
    assert any(f"{cost.seconds_per_frame * 1e6:.1f} us per loop frame on Test GPU (timed in " in line
               and line.endswith(" s, once per GPU model)") for line in lines), lines

    timed = []
    monkeypatch.setattr(alignment_timing, "time_loop_frames",
                        lambda loops, jit_compile: timed.append(loops.frames_per_iteration) or (2e-6, 0.5))
    # The next run on this GPU model reads the cache (a fresh cache object: another process).
    assert startup_loop_cost("Test GPU", one, jit_compile=False, cache=loop_cost_cache(tmp_path)) == cost
    assert timed == []
    # Another GPU model, block size or compilation is timed again.
    assert startup_loop_cost("Other GPU", one, jit_compile=False, cache=cache).seconds_per_frame == 2e-6
    assert startup_loop_cost("Test GPU", AlignmentLoops(frames_per_iteration=16), jit_compile=False,
                             cache=cache).source.count("16 frames per iteration") == 1
    assert startup_loop_cost("Test GPU", one, jit_compile=True, cache=cache).seconds_per_frame == 2e-6
    assert timed == [1, 16, 1]


def test_the_cost_is_per_frame_of_one_loop(monkeypatch):
    # The step runs four loops over its T frames (forward-sum, its gradient and Viterbi over T - 1,
    # the backtrack over T): loops that take 1 us a frame are timed at (4T - 3) us whatever T, and the
    # figure is 1 us. (The clock is faked: timing two real lengths against each other failed on a loaded
    # machine, 0.39 where 1 was expected.)
    calls = []

    def timed(loops, jit_compile, scores, mel_length, count, repeats):
        calls.append(tuple(scores.shape))
        return 0.5, [(4 * scores.shape[1] - 3) * 1e-6] * repeats

    monkeypatch.setattr(alignment_timing, "_time_loops", timed)
    one = AlignmentLoops(frames_per_iteration=1)
    for frames in (128, 512):
        seconds, first = alignment_timing.time_loop_frames(one, jit_compile=False, shape=(4, frames, 20), repeats=5)
        assert seconds == pytest.approx(1e-6) and first == 0.5
    assert calls == [(4, 128, 20), (4, 512, 20)]
