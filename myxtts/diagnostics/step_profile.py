"""The compiled step's time split by TensorFlow's profiler: the alignment's loops, matrix products, the rest.

    profile_step(step, batch, repeats)   a few steps traced (tf.profiler), the trace read back:
      -> the device's work: a GPU's kernels (its stream lines), else the ops on the host's threads
      -> each piece of work classified: loops | matmuls | other   (below)
      -> milliseconds of each per step, and their shares
      -> the TensorFlow ops the host ran per step (`host_ops`)

What counts as what:

  loops     the alignment's frame loops: XLA programs of their own (modules named after the loop
            functions of `models/alignment.py`), `while` loops inside an XLA-compiled step and
            everything they run (read from the step's HLO, which the trace carries), TensorFlow
            ops under a `while/` scope in graph mode. The train step has no other loop.
  matmuls   matrix products and convolutions: TensorFlow ops MatMul, BatchMatMul, Einsum, Conv*;
            XLA dots, convolutions, fusions around them and library calls (cuBLAS, cuDNN, oneDNN)
  other     everything else: elementwise ops, reductions, copies, the optimizer's update

Why beside `alignment_timing.py` (the loops timed alone): that gives the loops' time in the step's
own terms; this splits the rest too, from one trace of the step as it runs. On a GPU one stream's
kernels do not overlap, so `busy_ms` is the GPU's working time per step, and the step's time minus
it is the GPU idling (launches, waits on the host). On a CPU several threads run ops at once, so
the shares, not the sum, are what to read. Nested events (an XLA program's `while` and the
fusions inside it) are counted once, at the outermost.

`host_ops` is what a graph-mode step asks of the host: the executor dispatches every op, and on a
GPU each kernel's launch too. On an H200 the demo's graph-mode step took 73 ms for 23 ms of kernels
(BENCHMARKS.md): the rest is that dispatch, so fewer ops is a faster step there, whatever the FLOPs.
(Grappler's rewrites run first: a chain of unary ops on a CPU is one op.)

Checked on this CPU (graph mode with the loops compiled alone, and a whole-step XLA program); the
GPU path reads the kernels' `hlo_module` / `hlo_op` / `tf_op` stats as TensorFlow's profiler writes
them, tested on a recorded-shape trace but not yet run on a GPU.
"""

from __future__ import annotations

import collections
import glob
import re
import tempfile
from dataclasses import dataclass, field

from myxtts.diagnostics.timing import CompiledStep, run_once

# The functions `models/alignment.py` compiles alone (`_FORWARD_COMPILED`, ...): their XLA modules
# are named a_inference__<function>_<n>__.<m>.
LOOP_FUNCTIONS = ("forward_sum", "occupancy", "viterbi")
_LOOP_MODULE = re.compile(r"inference__(" + "|".join(LOOP_FUNCTIONS) + r")_\d")
_MATMUL_TF_OP = re.compile(r"(?i)matmul|einsum|conv[123]d|depthwiseconv")
_MATMUL_KERNEL = re.compile(r"(?i)gemm|cublas|cudnn|cutlass|matmul|onednn|mkl|convolution|^dot|wgmma|xmma")
_TF_OP_NAME = re.compile(r"^([^:\s]+):([A-Za-z_][A-Za-z0-9_]*)$")  # "scope/name:Type"
_CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall", "XlaLaunch", "_XlaRun", "_XlaCompile", "XlaLaunchV2"}
KINDS = ("loops", "matmuls", "other")


@dataclass
class _Module:
    """What the step's HLO says about one XLA module's instructions."""

    loops: set = field(default_factory=set)  # instructions that are, or run inside, a `while`
    matmuls: set = field(default_factory=set)  # dots, convolutions, fusions of them, library calls


def _modules(space) -> dict:
    """Module name -> _Module, from the HLO protos the trace's metadata plane carries."""
    from tensorflow.compiler.xla.service import hlo_pb2

    modules = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        for metadata in plane.event_metadata.values():
            for stat in metadata.stats:
                if not stat.bytes_value:
                    continue
                proto = hlo_pb2.HloProto()
                proto.ParseFromString(stat.bytes_value)
                modules[proto.hlo_module.name] = _classify_module(proto.hlo_module)
    return modules


def _classify_module(module) -> _Module:
    computations = {c.id: c for c in module.computations}

    def reachable(ids) -> set:
        seen, todo = set(), list(ids)
        while todo:
            cid = todo.pop()
            if cid in seen or cid not in computations:
                continue
            seen.add(cid)
            todo.extend(i for instruction in computations[cid].instructions for i in instruction.called_computation_ids)
        return seen

    def has_product(cid) -> bool:
        return any(i.opcode in ("dot", "convolution") or _MATMUL_KERNEL.search(i.custom_call_target or "")
                   for c in reachable([cid]) for i in computations[c].instructions)

    found = _Module()
    in_loop = set()
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode == "while":
                found.loops.add(instruction.name)
                in_loop |= reachable(instruction.called_computation_ids)
    for computation in module.computations:
        for instruction in computation.instructions:
            if computation.id in in_loop:
                found.loops.add(instruction.name)
            elif (instruction.opcode in ("dot", "convolution")
                  or (instruction.opcode == "custom-call" and _MATMUL_KERNEL.search(instruction.custom_call_target))
                  or (instruction.opcode == "fusion" and any(has_product(c) for c in instruction.called_computation_ids))):
                found.matmuls.add(instruction.name)
    return found


def classify(name: str, stats: dict, modules: dict) -> str | None:
    """The kind of one traced event (`stats`: its stats by name), or None for no device work."""
    module, hlo_op = stats.get("hlo_module"), stats.get("hlo_op")
    if module is not None or hlo_op is not None:
        if module and _LOOP_MODULE.search(module):
            return "loops"
        if hlo_op is None:
            return None  # a whole program's span: the ops inside it are counted
        known = modules.get(module)
        if known is not None:
            return "loops" if hlo_op in known.loops else "matmuls" if hlo_op in known.matmuls else "other"
        return "matmuls" if _MATMUL_KERNEL.search(f"{hlo_op or ''} {name}") else "other"
    tf_op = _TF_OP_NAME.match(stats.get("tf_op") or name)
    if tf_op is not None:
        scope, op_type = tf_op.groups()
        if op_type.startswith("__inference") or op_type in _CALL_OPS:
            return None  # a function call's span: the work inside it is counted
        if scope.startswith("while/") or "/while/" in scope or op_type in ("While", "StatelessWhile"):
            return "loops"
        return "matmuls" if _MATMUL_TF_OP.search(op_type) else "other"
    if "tf_op" in stats or stats.get("kernel_details") is not None:  # a GPU kernel of no known op
        return "matmuls" if _MATMUL_KERNEL.search(name) else "other"
    return None


def split_trace(space, steps: int) -> dict:
    """Milliseconds per step of each kind in a trace (`XSpace`) of `steps` steps."""
    modules = _modules(space)
    gpu_planes = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    device = "gpu kernels" if any(line.events for p in gpu_planes for line in p.lines) else "cpu ops"
    planes = gpu_planes if device == "gpu kernels" else [p for p in space.planes if p.name == "/host:CPU"]
    totals = dict.fromkeys(KINDS, 0.0)
    host_ops = sum(host_op_types(space).values())
    for plane in planes:
        names = {key: metadata.name for key, metadata in plane.stat_metadata.items()}
        for line in plane.lines:
            if device == "gpu kernels" and not line.name.startswith("Stream"):
                continue  # derived lines (XLA Ops, TensorFlow Ops, Steps) repeat the kernels
            if line.name.startswith("tf_data"):
                continue  # the input pipeline's threads: no step work
            outer_end = -1
            for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
                metadata = plane.event_metadata[event.metadata_id]
                if metadata.name.startswith("end: ") or event.offset_ps < outer_end:
                    continue  # XLA:CPU's end markers; events nested in one already counted
                stats = {}
                for stat in list(metadata.stats) + list(event.stats):
                    value = stat.str_value or (names.get(stat.ref_value) if stat.ref_value else None)
                    stats[names.get(stat.metadata_id, "")] = value if value is not None else stat.int64_value
                kind = classify(metadata.name, stats, modules)
                if kind is None:
                    continue
                totals[kind] += event.duration_ps / 1e9  # ms
                outer_end = event.offset_ps + event.duration_ps
    busy = sum(totals.values())
    return {
        "source": device,
        "steps": steps,
        "busy_ms": busy / steps,
        **{f"{kind}_ms": totals[kind] / steps for kind in KINDS},
        "shares": {kind: (totals[kind] / busy if busy else 0.0) for kind in KINDS},
        "host_ops": host_ops / steps,
    }


def host_op_types(space) -> collections.Counter:
    """TensorFlow ops the host ran, by op type (graph mode: each one dispatched by the executor, a GPU
    kernel's launch included; a function call and the ops inside it each count), input pipeline excluded."""
    types = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name.startswith("tf_data"):
                continue
            for event in line.events:
                op = _TF_OP_NAME.match(plane.event_metadata[event.metadata_id].name)
                if op is not None:
                    types[op.group(2)] += 1
    return types


def read_trace(logdir: str):
    """The XSpace the profiler wrote under `logdir` (the newest run's host)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))
    if not paths:
        raise RuntimeError(f"the profiler wrote no trace under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as handle:
        space.ParseFromString(handle.read())
    return space


def profile_step(step: CompiledStep, batch, repeats: int = 3, logdir: str | None = None) -> dict:
    """`repeats` steps on `batch` (compiled before: the caller's warm-up) traced and split by kind."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="myxtts-profile-") as scratch:
        target = logdir or scratch
        tf.profiler.experimental.start(target)
        try:
            for _ in range(repeats):
                run_once(step, batch)
        finally:
            tf.profiler.experimental.stop()
        return split_trace(read_trace(target), repeats)
