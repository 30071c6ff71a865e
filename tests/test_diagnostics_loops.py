"""The diagnosis names the alignment's frame loops: timed alone, a loop-bound verdict, and advice that
ran here (XLA only after an XLA step ran; data.num_workers never below the capacity plan's own).

On an H100 the step was almost all the loops, the GPU idled between their tiny iterations, and the
diagnosis called it host-overhead-bound and recommended XLA, which had crashed there."""

import time

import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import load_config
from myxtts.diagnostics import report_schema
from myxtts.diagnostics.alignment_timing import AlignmentLoopsTimer
from myxtts.diagnostics.bottleneck import diagnose
from myxtts.diagnostics.report import format_report
from myxtts.diagnostics.static_checks import static_checks
from myxtts.diagnostics.timing import CompiledStep
from myxtts.diagnostics.verdict import LOOP_BOUND_SHARE, TRY_XLA, decide, recommend
from myxtts.hardware.capacity import gpu_facts_for
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.devices import device_by_key
from myxtts.hardware.plan import plan_for_machine
from myxtts.models import alignment
from myxtts.models.alignment import AlignmentLoops
from myxtts.models.flops import alignment_loop_iterations
from myxtts.models.xtts import XTTS

XLA = "training.enable_xla_compilation"
FRAMES = "training.alignment_frames_per_iteration"


def _training(input_share=0.01, host_share=0.01):
    return {"input_share": input_share, "input_classification": "not", "host_other": {"share": host_share},
            "compiled_step": {"share": 1 - input_share - host_share}, "compile_steps": 0, "steps": 10}


def _gpu(mean=24.0):
    """A sampled 80 GiB H100 at `mean` percent, TensorFlow's peak at 30% of it (the issue's run: 24%)."""
    return {"available": True, "utilization": {"mean": mean, "p10": mean, "p90": mean, "below_30_share": 0.5},
            "oscillation": {"score": 0.0, "period_s": None}, "memory_used_bytes": 70 * 2**30,
            "memory_total_bytes": 80 * 2**30, "memory_controller_mean": 5.0, "tensorflow_peak_bytes": 24 * 2**30}


def _static(gpu=True, **settings):
    base = {"graph_mode": True, "xla": False, "precision": "bf16", "dtype_policy": "mixed_bfloat16", "batch_size": 16,
            "steps_per_execution": 4, "num_workers": 30, "prefetch_buffer_size": 0, "prefetch_to_gpu": gpu,
            "cache_features": True, "bucketing": True, "deterministic": False, "mel_on_device": False,
            "gpu_available": gpu}
    return {"settings": {**base, **settings}, "python_ops": [], "read_throughput": None,
            "cpu": {"usable_cores": 16, "note": "data.num_workers: 30 is more than the 16 usable cores"}}


def _loops(share, frames_per_iteration=1, frames=700):
    """The issue's H100 step: 16 clips of 700 frames, forward-sum + gradient and Viterbi in graph mode."""
    return {"runs": 5, "median_ms": 644.0 * share / 0.85, "warmup_ms": 900.0, "share_of_step": share,
            "frames": frames, "tokens": 100, "frames_per_iteration": frames_per_iteration,
            "iterations": alignment_loop_iterations(frames, frames_per_iteration), "compiled": False, "jit_compile": False}


def _alone(xla):
    return {"xla": xla, "steps_per_s": 1.6, "p50_ms": 644.0}


def _changes(verdict, static, loops=None, xla=False, gpu=None, **kwargs):
    measurements = {"training": _training(), "step_alone": _alone(xla), "alignment_loops": loops}
    return [r["change"] for r in recommend(verdict, static, measurements, gpu, (9, 0), **kwargs)]


# ------------------------------------------------------------------------------------------------
# The verdict rule, on measurement dicts


def test_a_step_that_is_mostly_loops_is_loop_bound_not_host_overhead_bound():
    loops = _loops(0.85)
    # Without the loops' measurement: the old diagnosis, which blamed launch overhead.
    assert decide(_training(), _gpu(), step_alone=_alone(False)).kind == "host-overhead-bound"
    verdict = decide(_training(), _gpu(), step_alone=_alone(False), alignment_loops=loops)
    assert verdict.kind == "loop-bound"
    reason = next(r for r in verdict.reasons if r.startswith("the alignment's frame loops"))
    for words in ("forward-sum", "Viterbi", "644.0 ms", "85% of the step alone", "700 frames at 1 per iteration",
                  f"{alignment_loop_iterations(700, 1)} sequential iterations"):
        assert words in reason
    # XLA did not run here: the reasons say how to try it, the recommendations do not name it.
    assert any(TRY_XLA in r for r in verdict.reasons) and "--set training.enable_xla_compilation=true" in TRY_XLA


def test_the_loop_bound_threshold_and_the_rules_before_it():
    below = decide(_training(), _gpu(), alignment_loops=_loops(LOOP_BOUND_SHARE - 0.01))
    assert below.kind == "host-overhead-bound"  # the low-utilization rule, once the loops are not the step
    assert any("39% of the step alone (loop-bound from 40%)" in r for r in below.reasons)
    assert decide(_training(), _gpu(), alignment_loops=_loops(LOOP_BOUND_SHARE)).kind == "loop-bound"
    # Before compute-bound too: a busy GPU, loops most of the step.
    assert decide(_training(), _gpu(90), alignment_loops=_loops(0.6)).kind == "loop-bound"
    assert decide(_training(), _gpu(90), alignment_loops=_loops(0.3)).kind == "compute-bound"
    # Input waits and host work come first: they are what the step waits for, whatever it is made of.
    assert decide(_training(input_share=0.3), _gpu(), alignment_loops=_loops(0.9)).kind == "input-bound"
    assert decide(_training(host_share=0.25), _gpu(), alignment_loops=_loops(0.9)).kind == "host-overhead-bound"
    # No GPU: still the loops, and the reasons say a GPU is the fix (no XLA to try on a CPU).
    cpu = decide(_training(), None, step_alone=_alone(False), alignment_loops=_loops(0.8))
    assert cpu.kind == "loop-bound" and "no GPU" in cpu.reasons[-1]
    assert not any(TRY_XLA in r for r in cpu.reasons)


def _profile(loops, matmuls):
    """`step_profile.profile_step`'s split of a traced step: shares of 10 ms of device time."""
    shares = {"loops": loops, "matmuls": matmuls, "other": 1 - loops - matmuls}
    return {"source": "gpu kernels", "steps": 3, "busy_ms": 10.0, "shares": shares,
            **{f"{kind}_ms": 10.0 * share for kind, share in shares.items()}}


def test_the_profilers_split_of_the_step_makes_it_loop_bound_too():
    # The loops timed alone were cheap (compiled on their own), but inside the step the trace finds
    # them most of the device's time: loop-bound, not launch overhead.
    verdict = decide(_training(), _gpu(), step_alone=_alone(True), alignment_loops=_loops(0.2),
                     step_profile=_profile(loops=0.7, matmuls=0.1))
    assert verdict.kind == "loop-bound"
    assert any("the alignment's loops took 70%, matrix products 10%" in r for r in verdict.reasons), verdict.reasons
    # Without a timing of the loops alone, the trace alone decides.
    assert decide(_training(), _gpu(90), step_profile=_profile(loops=0.5, matmuls=0.3)).kind == "loop-bound"
    # A trace that finds them small leaves the verdict to the other rules, and says so.
    below = decide(_training(), _gpu(90), alignment_loops=_loops(0.1), step_profile=_profile(loops=0.1, matmuls=0.8))
    assert below.kind == "compute-bound"
    assert any("loops took 10%" in r and "(loop-bound from 40%)" in r for r in below.reasons)
    # A profiler that failed (a note, no shares) changes nothing.
    assert decide(_training(), _gpu(), step_profile={"note": "the profiler failed"}).kind == "host-overhead-bound"


# ------------------------------------------------------------------------------------------------
# What a loop-bound verdict recommends, and XLA only where it ran


def test_loop_bound_recommends_blocks_of_frames_on_a_gpu_and_xla_only_after_it_ran():
    verdict = decide(_training(), _gpu(), step_alone=_alone(False), alignment_loops=_loops(0.85))
    assert _changes(verdict, _static(), _loops(0.85), gpu=_gpu()) == [f"{FRAMES}: 16"]
    # Already 16 frames per iteration: nothing to set (XLA did not run here).
    assert _changes(verdict, _static(), _loops(0.85, 16), gpu=_gpu()) == []
    # On a CPU one frame per iteration is right: nothing recommended.
    assert _changes(verdict, _static(gpu=False), _loops(0.85), gpu=None) == []
    # An XLA step ran here (the diagnosis run with --set training.enable_xla_compilation=true): now the
    # config file may get it. Without the override the run already had it: nothing to change.
    ran = _changes(verdict, _static(xla=True), _loops(0.85), xla=True, gpu=_gpu(), overridden={XLA})
    assert ran == [f"{FRAMES}: 16", f"{XLA}: true"]
    assert _changes(verdict, _static(xla=True), _loops(0.85), xla=True, gpu=_gpu()) == [f"{FRAMES}: 16"]


@pytest.mark.parametrize("gpu, expected_kind", [(_gpu(35), "host-overhead-bound"), (_gpu(90), "compute-bound"),
                                                ({**_gpu(90), "memory_controller_mean": 80.0}, "memory-bound")])
def test_xla_is_never_recommended_where_no_xla_step_ran(gpu, expected_kind):
    verdict = decide(_training(), gpu, step_alone=_alone(False))
    assert verdict.kind == expected_kind
    assert not any(change.startswith(XLA) for change in _changes(verdict, _static(), xla=False, gpu=gpu))
    assert TRY_XLA in verdict.reasons[-1]
    # The step was no model's (a simulated GPU, a fake): no XLA either, and no advice to try it.
    simulated = recommend(verdict, _static(), {"training": _training(), "step_alone": _alone(None)}, gpu, (9, 0))
    assert not any(r["key"] == XLA for r in simulated)
    assert not any(TRY_XLA in r for r in decide(_training(), gpu, step_alone=_alone(None)).reasons)
    # It ran here under XLA, set from the command line: the file gets it.
    assert f"{XLA}: true" in _changes(verdict, _static(xla=True), xla=True, gpu=gpu, overridden={XLA})


# ------------------------------------------------------------------------------------------------
# data.num_workers: the diagnosis never goes below the capacity plan's own count


def _machine(cores, ram_gib, gpu):
    return MachineFacts(gpus=(gpu_facts_for(device_by_key("H100")),) if gpu else (), usable_cpu_cores=cores,
                        logical_cpu_count=cores, ram_bytes=None if ram_gib is None else ram_gib * 2**30)


def test_recommended_workers_are_never_below_the_capacity_plans_own():
    checked = 0
    for cores in (1, 2, 3, 8, 16, 64):
        for ram_gib in (None, 3, 128):
            for gpu in (False, True):
                plan = plan_for_machine(_machine(cores, ram_gib, gpu), "small")
                planned = plan.num_parallel_calls
                input_plan = {"num_workers": planned, "source": plan.sources["num_parallel_calls"]}
                for workers in sorted({1, 2, cores - 1, cores, cores + 1, planned - 1, planned, planned + 1,
                                       2 * planned + 3} - {0, -1}):
                    static = _static(gpu=gpu, num_workers=workers, prefetch_to_gpu=True, deterministic=False)
                    static["cpu"] = {"usable_cores": cores, "note": f"data.num_workers: {workers}"}
                    recs = recommend(decide(_training(0.3), None), static, {"training": _training(0.3)}, None,
                                     input_plan=input_plan)
                    values = [r["value"] for r in recs if r["key"] == "data.num_workers"]
                    assert all(value >= planned for value in values), (cores, ram_gib, gpu, workers, planned, values)
                    if workers == planned:
                        assert values == []  # the plan's own count is left alone
                    checked += 1
    assert checked > 100
    # The machine: 16 cores beside an H100, the plan gives 30 (two calls in flight per input core).
    plan = plan_for_machine(_machine(16, 128, True), "small")
    assert plan.num_parallel_calls == 30
    recs = recommend(decide(_training(0.3), None), _static(num_workers=8), {"training": _training(0.3)}, None,
                     input_plan={"num_workers": 30, "source": plan.sources["num_parallel_calls"]})
    rec = next(r for r in recs if r["key"] == "data.num_workers")
    assert rec["value"] == 30 and "the capacity plan gives this machine 30" in rec["reason"]


# ------------------------------------------------------------------------------------------------
# The timing itself


N_MELS, VOCAB = 20, 12


def _tiny_batch(frames=40, tokens=8):
    rng = np.random.default_rng(0)
    return {"mel": tf.constant(rng.normal(-4.0, 2.0, (2, frames, N_MELS)).astype(np.float32)),
            "mel_length": tf.constant([frames, frames - 9], tf.int32),
            "tokens": tf.constant(rng.integers(2, VOCAB, (2, tokens)).astype(np.int32)),
            "text_length": tf.constant([tokens, tokens - 3], tf.int32)}


def test_the_loops_are_timed_as_the_network_runs_them(monkeypatch):
    network = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny")
    network.build()
    network.alignment_loops = AlignmentLoops(frames_per_iteration=4, compile=False)  # as TrainingModel.compile sets it
    seen = []
    real_viterbi = alignment.viterbi_alignment

    def slow_viterbi(log_probs, mel_length, text_length, loops):
        # 30 ms more per Viterbi, inside the timed function: the timing must see it. Stateless, so a
        # path nothing reads is pruned, as the real ops would be: the timing must use every result.
        seen.append(loops)
        path = real_viterbi(log_probs, mel_length, text_length, loops)
        return tf.numpy_function(lambda p: (time.sleep(0.03), p)[1], [path], tf.float32, stateful=False)

    batch = _tiny_batch()
    fast = AlignmentLoopsTimer(network).measure(batch, repeats=3)
    monkeypatch.setattr(alignment, "viterbi_alignment", slow_viterbi)
    slow = AlignmentLoopsTimer(network).measure(batch, repeats=3)
    assert slow["median_ms"] >= 30.0 and slow["median_ms"] > fast["median_ms"] > 0
    assert seen and all(loops is network.alignment_loops for loops in seen)
    assert (slow["frames"], slow["tokens"], slow["frames_per_iteration"], slow["compiled"], slow["jit_compile"]) == (
        40, 8, 4, False, False)
    assert slow["iterations"] == 3 * 10 + 10  # 39 frames in 10 blocks of 4, three times; the backtrack's 40 in 10


class LoopNetwork:
    """Stands for XTTS in a step made of loops: the batch's `mel` is its alignment scores [B, T, L]."""

    def __init__(self):
        self.alignment_loops = AlignmentLoops(frames_per_iteration=1, compile=False)

    def align(self, mel, mel_length, tokens, text_length, training=False):
        return mel, text_length, tf.zeros_like(tokens)


def test_diagnose_times_the_loops_alone_and_finds_a_step_of_small_iterations_loop_bound():
    frames, length = 300, 6
    rng = np.random.default_rng(1)
    scores = tf.nn.log_softmax(rng.normal(size=(2, frames, length)).astype(np.float32))
    batch = {"mel": scores, "mel_length": tf.constant([frames, frames - 40]), "tokens": tf.zeros([2, length], tf.int32),
             "text_length": tf.constant([length, length - 1])}
    network = LoopNetwork()

    @tf.function
    def step(batch):  # the loops, as the train step runs them, and a little other work
        with tf.GradientTape() as tape:
            tape.watch(batch["mel"])
            loss = tf.reduce_sum(alignment.forward_sum_loss(batch["mel"], batch["mel_length"], batch["text_length"],
                                                            network.alignment_loops))
        gradient = tape.gradient(loss, batch["mel"])
        path = alignment.viterbi_alignment(batch["mel"], batch["mel_length"], batch["text_length"],
                                           network.alignment_loops)
        other = tf.reduce_sum(tf.matmul(batch["mel"][0], batch["mel"][0], transpose_a=True))
        return {"loss": loss + tf.reduce_sum(gradient) + tf.reduce_sum(path) + other}

    dataset = tf.data.Dataset.from_tensors(batch)
    config = load_config(overrides=["training.enable_xla_compilation=false"])  # as the step: no XLA
    static = static_checks(config, dataset, policy="float32", usable_cores=2, gpu_available=False)
    report = diagnose(dataset, CompiledStep(step, lambda out: float(out["loss"]), xla=False),
                      num_batches=4, step_repeats=3, static=static,
                      machine={"usable_cpu_cores": 2, "gpus": [], "notes": []},
                      config_info={"path": None, "overrides": []}, alignment_loops=AlignmentLoopsTimer(network))
    loops = report["measurements"]["alignment_loops"]
    assert report_schema.schema_errors(report) == []
    assert (loops["frames"], loops["frames_per_iteration"], loops["runs"]) == (frames, 1, 3)
    assert loops["share_of_step"] == pytest.approx(loops["median_ms"] / report["measurements"]["step_alone"]["p50_ms"])
    # Loops and step are timed at different moments from 3 runs each: on a loaded 2-core machine the
    # ratio of two medians reached 1.69 although the loops are part of the step.
    assert 0.4 <= loops["share_of_step"] < 2.5
    assert report["verdict"]["kind"] == "loop-bound"
    assert report["measurements"]["step_alone"]["xla"] is False
    text = format_report(report)
    assert "its alignment loops alone" in text and "300 frames, 1 per iteration" in text
    assert report["recommendations"] == []  # on a CPU nothing moves the loops: a GPU is the fix
