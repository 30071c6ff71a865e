"""The step's time split by TensorFlow's profiler (diagnostics/step_profile.py): on real CPU traces of
a step made mostly of loops or mostly of a matrix product, and on a GPU-shaped trace built here."""

import pytest
import tensorflow as tf
from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from myxtts.diagnostics.step_profile import profile_step, split_trace
from myxtts.diagnostics.timing import CompiledStep
from myxtts.models import alignment


@pytest.mark.parametrize("xla", [False, True], ids=["loops compiled alone", "xla step"])
def test_a_traced_step_is_split_into_its_loops_and_its_matrix_products(xla):
    # The alignment's loops as a step runs them, beside one matrix product of either size.
    loops = alignment.AlignmentLoops(frames_per_iteration=1, compile=not xla)
    batch, frames, tokens = 4, 128, 20
    scores = tf.nn.log_softmax(tf.random.stateless_normal([batch, frames, tokens], seed=(1, 2)), axis=-1)
    mel_length, text_length = tf.fill([batch], frames), tf.fill([batch], tokens)

    @tf.function(jit_compile=xla)
    def step(scores, weights):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            loss = tf.reduce_sum(alignment.forward_sum_loss(scores, mel_length, text_length, loops))
        path = alignment.viterbi_alignment(scores, mel_length, text_length, loops)
        product = tf.matmul(weights, weights)
        return loss + tf.reduce_sum(tape.gradient(loss, scores)) + tf.cast(tf.reduce_sum(path), tf.float32) \
            + tf.reduce_sum(tf.nn.relu(product))

    compiled = CompiledStep(run=lambda inputs: step(*inputs), finish=float)
    splits = {}
    for size in (16, 1024):  # ~8 kFLOP against ~2 GFLOP; the loops ~1 ms either way
        weights = tf.random.stateless_normal([size, size], seed=(3, 4))
        float(step(scores, weights))  # trace and compile outside the profile
        splits[size] = profile_step(compiled, (scores, weights), repeats=2)
    small, large = splits[16], splits[1024]
    assert small["source"] == large["source"] == "cpu ops" and small["steps"] == 2
    assert small["shares"]["loops"] > 0.6, small
    assert large["shares"]["matmuls"] > 0.6, large
    # The loops are still found when the product dominates. (Their time is not compared between the two
    # profiles: on a shared 2-core machine one run measured them 3x apart.)
    assert large["loops_ms"] > 0, large
    for split in splits.values():
        assert split["busy_ms"] == pytest.approx(split["loops_ms"] + split["matmuls_ms"] + split["other_ms"])
        assert sum(split["shares"].values()) == pytest.approx(1.0)


def _hlo_module() -> hlo_pb2.HloProto:
    """An XLA step as the GPU runs it: a while loop (its body a fusion), a dot fusion, an add."""
    proto = hlo_pb2.HloProto()
    module = proto.hlo_module
    module.name = "a_inference_train_step_12__XlaMustCompile_true.7"

    def computation(cid, name, *instructions):
        c = module.computations.add(id=cid, name=name)
        for iid, (iname, opcode, called, target) in enumerate(instructions, start=cid * 100):
            c.instructions.add(id=iid, name=iname, opcode=opcode, called_computation_ids=called,
                               custom_call_target=target)

    computation(1, "body", ("loop_fusion.3", "fusion", [2], ""), ("tuple.1", "tuple", [], ""))
    computation(2, "fused_body", ("exponential.1", "exponential", [], ""), ("add.9", "add", [], ""))
    computation(3, "cond", ("compare.1", "compare", [], ""))
    computation(4, "fused_dot", ("dot.1", "dot", [], ""))
    computation(5, "entry", ("while.2", "while", [1, 3], ""), ("gemm_fusion.4", "fusion", [4], ""),
                ("cublas-gemm.5", "custom-call", [], "__cublas$gemm"), ("add_fusion.6", "add", [], ""))
    return proto


def test_a_gpu_trace_is_split_by_the_kernels_on_its_streams():
    space = xplane_pb2.XSpace()
    metadata = space.planes.add(id=1, name="/host:metadata")
    metadata.stat_metadata[1].name = "Hlo Proto"
    metadata.event_metadata[1].name = "a_inference_train_step_12__XlaMustCompile_true.7(1)"
    metadata.event_metadata[1].stats.add(metadata_id=1, bytes_value=_hlo_module().SerializeToString())

    gpu = space.planes.add(id=2, name="/device:GPU:0")
    for sid, name in enumerate(("hlo_module", "hlo_op", "tf_op"), start=1):
        gpu.stat_metadata[sid].name = name
    step_module = "a_inference_train_step_12__XlaMustCompile_true.7"
    # (kernel, stats, duration in us); per step: loops 3 + 1, matmuls 2 + 1.5 + 0.5, other 0.25 + 0.75
    kernels = [
        ("loop_fusion_3", {"hlo_module": step_module, "hlo_op": "loop_fusion.3"}, 3.0),
        ("forward_kernel", {"hlo_module": "a_inference__viterbi_88__.2", "hlo_op": "fusion.1"}, 1.0),
        ("gemm_fusion_4", {"hlo_module": step_module, "hlo_op": "gemm_fusion.4"}, 2.0),
        ("sm90_xmma_gemm_bf16", {"hlo_module": step_module, "hlo_op": "cublas-gemm.5"}, 1.5),
        ("ampere_sgemm_64x64", {"tf_op": "decoder/dense/MatMul:MatMul"}, 0.5),
        ("add_fusion_6", {"hlo_module": step_module, "hlo_op": "add_fusion.6"}, 0.25),
        ("EigenMetaKernel", {"tf_op": "adam/update/Mul:Mul"}, 0.75),
    ]
    stream = gpu.lines.add(id=1, name="Stream #7(Compute)")
    derived = gpu.lines.add(id=2, name="XLA Ops")  # the profiler's own regrouping: counted nowhere
    offset = 0
    for step in range(2):
        for mid, (kernel, stats, duration_us) in enumerate(kernels, start=1):
            gpu.event_metadata[mid].name = kernel
            event = stream.events.add(metadata_id=mid, offset_ps=offset, duration_ps=int(duration_us * 1e6))
            for name, value in stats.items():
                event.stats.add(metadata_id={"hlo_module": 1, "hlo_op": 2, "tf_op": 3}[name], str_value=value)
            derived.events.add(metadata_id=mid, offset_ps=offset, duration_ps=int(duration_us * 1e6))
            offset += int(duration_us * 1e6) + 1_000_000
    host = space.planes.add(id=3, name="/host:CPU")  # host ops are not the GPU's work
    host.event_metadata[1].name = "decoder/dense/MatMul:MatMul"
    host.lines.add(id=1, name="tf_Compute").events.add(metadata_id=1, offset_ps=0, duration_ps=10**9)

    split = split_trace(space, steps=2)
    assert split["source"] == "gpu kernels"
    assert (split["loops_ms"], split["matmuls_ms"], split["other_ms"]) == pytest.approx((4e-3, 4e-3, 1e-3))
    assert split["busy_ms"] == pytest.approx(9e-3)
    assert split["shares"]["loops"] == pytest.approx(4 / 9)


def test_the_ops_the_host_runs_per_step_are_counted():
    # A graph-mode step of many small ops is what a GPU's host dispatches one by one; the count is
    # per step, and grows with the ops of the step.
    def chain(length):
        @tf.function
        def step(x):
            for _ in range(length):
                x = tf.sin(x) + x  # two ops (Grappler fuses a chain of unary ops into one on a CPU)
            return tf.reduce_sum(x)
        return step

    counts = {}
    for length in (50, 150):
        step = chain(length)
        x = tf.random.stateless_normal([8], seed=(5, 6))
        float(step(x))  # traced outside the profile
        counts[length] = profile_step(CompiledStep(run=step, finish=float), x, repeats=3)["host_ops"]
    assert counts[150] - counts[50] == pytest.approx(200, abs=3), counts
    assert counts[50] >= 100, counts
