"""The command line: every flag reaches the config; bad input fails with a message, not a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

import train_main

ROOT = Path(__file__).resolve().parents[1]


def test_every_flag_sets_its_config_key():
    args = train_main.parse_args([
        "--train-data", "/d/train", "--val-data", "/d/val", "--batch-size", "8", "--grad-accum", "3",
        "--num-workers", "2", "--lr", "0.0005", "--model-size", "tiny", "--optimization-level", "basic",
        "--optimizer", "prodigy", "--precision", "bf16", "--max-steps", "77", "--set", "data.n_mels=64",
        "--init-from", "runs/base",
    ])
    config, _ = train_main.build_config(args)
    d, t = config.data, config.training
    assert (d.train_data, d.val_data, d.batch_size, d.num_workers, d.n_mels) == ("/d/train", "/d/val", 8, 2, 64)
    assert (t.gradient_accumulation_steps, t.learning_rate, t.optimizer, t.precision, t.max_steps) == (3, 0.0005, "prodigy", "bf16", 77)
    assert (config.model.size, t.optimization_level, t.enable_xla_compilation) == ("tiny", "basic", False)
    assert t.init_from == "runs/base"


def test_eager_debug_and_demo_flags():
    config, path = train_main.build_config(train_main.parse_args(["--enable-eager-debug", "--demo"]))
    assert config.training.enable_graph_mode is False and config.training.enable_xla_compilation is False
    assert Path(path).name == "demo.yaml" and config.data.train_data == str(train_main.DEMO_CORPUS)
    args = train_main.parse_args(["--checkpoint-dir", "/runs/x", "--epochs", "2.5", "--resume"])
    assert (args.output_dir, args.epochs, args.resume) == ("/runs/x", 2.5, True)
    with pytest.raises(SystemExit):
        train_main.parse_args(["--resume", "--reset-training"])  # contradictory


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "data.batch_sise=4"], "did you mean 'data.batch_size'"),
        (["--train-data", "/nonexistent/corpus", "--max-steps", "1"], "/nonexistent/corpus"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "train_main.py"), "--output-dir", str(tmp_path), *argv],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    # A mistyped path fails before the hardware plan's probes (the CPU precision probe takes a minute).
    assert "precision: timing" not in done.stdout + done.stderr
