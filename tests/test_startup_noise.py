"""TensorFlow's start-up noise is dropped, everything else written to stderr is kept (myxtts/startup_noise.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from myxtts.startup_noise import is_noise

ROOT = Path(__file__).resolve().parents[1]
CUINIT = ("E0000 00:00:1795525962.792271   31698 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          "Failed call to cuInit: UNKNOWN ERROR (303)")


def test_the_cuinit_failure_is_noise_only_where_no_gpu_was_found():
    assert is_noise("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True)
    assert is_noise("I0000 00:00:1.5   31698 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
                    "will not be used.", True)
    assert is_noise(CUINIT, gpu_expected=False) and not is_noise(CUINIT, gpu_expected=True)
    assert not is_noise("W0000 00:00:1.5  1 cache_dataset_ops.cc:912] The calling iterator did not fully read", False)


def test_a_start_keeps_other_lines_in_order_and_drops_the_noise(tmp_path):
    """In a child process, as the C++ runtime writes them: straight to file descriptor 2."""
    code = (
        "import os, sys\n"
        "from myxtts.startup_noise import quiet_start\n"
        "with quiet_start(gpu_expected=False):\n"
        f"    os.write(2, b'before\\n{CUINIT}\\n')\n"
        "    print('from python', file=sys.stderr)\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\nafter\\n')\n"
        "print('outside', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["before", "from python", "after", "outside"]


def test_a_cpu_training_start_prints_none_of_it(tmp_path):
    """The import and device start of TensorFlow, as train_main and resolve_plan do them, on this GPU-less machine."""
    code = (
        "import sys\n"
        "from myxtts.startup_noise import quiet_start, say_string_notice\n"
        "with quiet_start(gpu_expected=True):\n"
        "    import tensorflow as tf\n"
        "with quiet_start(gpu_expected=False):\n"
        "    tf.config.list_logical_devices()\n"
        "    say_string_notice()\n"
        "writer = tf.summary.create_file_writer(sys.argv[1])\n"
        "with writer.as_default(step=0):\n"  # what a validation sample writes mid-run
        "    tf.summary.audio('sample', tf.zeros([1, 100, 1]), 16000)\n"
        "print('ready')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "logs")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120,
                          env={**env, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr
    assert "cuInit" not in done.stderr and "cudart_stub" not in done.stderr and "absl::InitializeLog" not in done.stderr
    assert "DT_STRING" not in done.stderr and "oneDNN custom operations are on" not in done.stderr, done.stderr
    assert done.stdout.strip() == "ready"


@pytest.mark.parametrize("tool", [
    ["utilities/synthesize.py", "--checkpoint", "MISSING", "--text", "Hi.", "--reference", "x.wav"],
    ["utilities/export_model.py", "--run", "MISSING", "--out", "OUT"],
    ["utilities/free_running_check.py", "--run", "MISSING"],
    ["utilities/measure_quality.py", "--corpus", "MISSING"],
    ["utilities/measure_long_text.py", "--run", "MISSING"],
], ids=lambda tool: Path(tool[0]).stem)
def test_the_tools_name_a_missing_input_in_one_line_without_tensorflows_start_up_noise(tool, tmp_path):
    missing = tmp_path / "no_such_run"
    argv = [str(missing) if a == "MISSING" else str(tmp_path / "export") if a == "OUT" else a for a in tool]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**env, "PYTHONPATH": str(ROOT)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and str(missing) in lines[0], lines


def test_the_tools_set_gpu_memory_growth_before_the_runtime_starts(monkeypatch):
    """Growth can only be set before TensorFlow's runtime starts, which the first op does (the
    string notice); a tool beside a training run must not reserve the whole card."""
    from myxtts import startup_noise
    from myxtts.hardware import gpu_memory

    calls = []
    monkeypatch.setattr(gpu_memory, "allow_memory_growth", lambda *a, **k: calls.append("growth"))
    monkeypatch.setattr(startup_noise, "say_string_notice", lambda: calls.append("first op"))
    startup_noise.quiet_tensorflow()
    assert calls == ["growth", "first op"]



@pytest.mark.parametrize("tool", ["diagnose_gpu_bottleneck.py", "capacity_plan.py"])
def test_the_gpu_planning_tools_start_quietly_and_say_why_a_corpus_fills_no_batch(tool, demo_corpus, tmp_path):
    """The diagnosis and the capacity plan on a corpus too small for the batch: TensorFlow's start-up
    lines were printed first (its C++ logger ignores TF_CPP_MIN_LOG_LEVEL until it starts), and the
    diagnosis ended in a StopIteration traceback; now one line says what to change, as training does."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, f"utilities/{tool}", "--config", "configs/demo.yaml", "--train-data",
                           str(demo_corpus), "--batch-size", "64", "--set", "training.precision=fp32"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT), "MYXTTS_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    for noise in ("cuInit", "cudart_stub", "absl::InitializeLog", "oneDNN custom operations are on"):
        assert noise not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the ") and "do not fill one batch of 64" in last and "lower data.batch_size" in last, last


def test_a_data_service_server_starts_quietly():
    """A feature worker is often a machine without a GPU: its start printed TensorFlow's start-up lines,
    cuInit's failure among them. Here a dispatcher that cannot bind (TEST-NET-1 is no address of this
    machine) shows only gRPC's line and ours."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "utilities/data_service.py", "dispatcher", "--bind", "192.0.2.1", "--port", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    for noise in ("cuInit", "cudart_stub", "absl::InitializeLog", "oneDNN custom operations are on", "cpu_feature_guard"):
        assert noise not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: the dispatcher did not start on 192.0.2.1"), done.stderr
