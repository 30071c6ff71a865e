"""TensorFlow's start-up lines that read as errors on a healthy machine, kept out of the console.

On a machine without a GPU, importing TensorFlow and starting its runtime writes, straight to the
process's stderr and before TF_CPP_MIN_LOG_LEVEL is read (measured with TensorFlow 2.21):

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on. You may see slightly different numerical ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    E0000 ... cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: ... UNKNOWN ERROR (303)

A new user reads the last one as the run failing. So too, mid-run at the first audio summary for
TensorBoard, TensorFlow's oneDNN build says once per process, at ERROR level and on CPUs that have
AVX-512 as well, "oneDNN supports DT_STRING only on platforms with AVX-512" (a string transpose runs
on Eigen instead: nothing is wrong); `say_string_notice` says it early, inside the block below.

`quiet_start` captures what is written to the
stderr file descriptor while TensorFlow is imported or its devices are listed, and writes back
every line but these. The cuInit failure is dropped only when NVML found no GPU either: on a
machine that has one, it is the first sign of a broken driver and stays. Everything else,
TensorFlow's warnings included, is written back, in order, once the block ends (or fails).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

_ALWAYS = (
    re.compile(r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"),
    re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"),
    re.compile(r"oneDNN supports DT_STRING only on platforms with AVX-512"),
    # Twice at import on x86, before TF_CPP_MIN_LOG_LEVEL applies: a note that oneDNN's kernels may
    # round differently, nothing to act on.
    re.compile(r"port\.cc:\d+\] oneDNN custom operations are on"),
)
_WITHOUT_GPU = re.compile(r"cuda_platform\.cc:\d+\] failed call to cuInit")


def is_noise(line: str, gpu_expected: bool) -> bool:
    return any(p.search(line) for p in _ALWAYS) or (not gpu_expected and bool(_WITHOUT_GPU.search(line)))


def say_string_notice() -> None:
    """Run one string transpose, the op behind TensorFlow's once-per-process DT_STRING notice (above), so
    that a `quiet_start` block around this call drops the notice instead of a run printing it later."""
    import tensorflow as tf

    tf.transpose(tf.constant([["", ""]]))


@contextlib.contextmanager
def quiet_start(gpu_expected: bool):
    """Inside: TensorFlow's start-up noise is held back and dropped; other stderr lines come after."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not is_noise(line, gpu_expected)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def start_tensorflow(gpu_expected: bool, echo=print) -> None:
    """TensorFlow's runtime started quietly: GPU memory growth first (it can only be set before the
    start, and a run must not reserve the whole card; `hardware.gpu_memory`), then its first op,
    the string notice's (above), which starts it (and on a machine without a GPU, cuInit fails)."""
    from myxtts.hardware.gpu_memory import allow_memory_growth

    with quiet_start(gpu_expected):
        allow_memory_growth(echo)  # imports TensorFlow; listing devices does not start it
        say_string_notice()


def quiet_tensorflow():
    """For a command-line tool, before anything imports TensorFlow: `start_tensorflow`, with its C++
    info and warning lines off (TF_CPP_MIN_LOG_LEVEL 2, unless the user set it). Errors still show.
    Returns the machine's facts (`hardware.detect.detect_machine`), which it needed to know whether
    a GPU is expected."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from myxtts.hardware.detect import detect_machine  # NVML only: no TensorFlow

    machine = detect_machine()
    start_tensorflow(gpu_expected=bool(machine.gpus))
    return machine
