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
    assert any(f"{cost.seconds_per_frame * 1e6:.1f} us per loop frame" in line for line in lines)

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


def test_the_cost_is_per_frame_of_one_loop():
    # Twice the frames take about twice as long: the figure is per frame, whatever the length timed.
    one = AlignmentLoops(frames_per_iteration=1)
    short, _ = alignment_timing.time_loop_frames(one, jit_compile=False, shape=(4, 128, 20), repeats=5)
    long, _ = alignment_timing.time_loop_frames(one, jit_compile=False, shape=(4, 512, 20), repeats=5)
    assert long / short == pytest.approx(1.0, rel=0.6)
