"""XLA compiles the train step once per bucket shape, never per batch, and once per machine.

Trace counts (tests/test_training.py) do not show this: Keras traces its step with
`reduce_retracing`, so after two shapes one trace may take any shape, and XLA then compiles that
trace again for every new concrete shape it is called with. What XLA compiles is counted here
directly: with `XLA_FLAGS=--xla_dump_to=DIR` every compilation writes its HLO module to DIR. That
flag is read once per process, hence a training subprocess (about a minute on two cores, most of
it compiling the tiny model's step for each of the two buckets). A second run with the persistent
XLA cache (hardware.persistent_xla_cache) compiles nothing: every program comes from the cache.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from myxtts.config import load_config
from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8  # more than one pass over the 24-clip corpus in batches of 4: a bucket shape comes back
SETTINGS = [
    "model.size=tiny", "data.batch_size=4", "training.gradient_accumulation_steps=1", "training.precision=fp32",
    "training.enable_graph_mode=true", "training.enable_xla_compilation=true",
    "data.val_fraction=0",  # no validation: only the train step is compiled
    "data.max_duration_s=6.0", "data.bucket_boundaries_s=[3.0, 6.0]",
    f"training.max_steps={STEPS}", "training.checkpoint_interval=100000", "training.log_samples=false",
    "hardware.persistent_xla_cache=true",
]


def _train(corpus, run, dump, cache):
    """One training process; the names of the train-step programs XLA compiled in it."""
    command = [sys.executable, str(ROOT / "train_main.py"), "--train-data", str(corpus), "--output-dir", str(run)]
    for setting in SETTINGS:
        command += ["--set", setting]
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "TF_CPP_MIN_LOG_LEVEL": "2", "MYXTTS_CACHE_DIR": str(cache)}
    env.pop("TF_XLA_FLAGS", None)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"finished at step {STEPS};" in done.stderr + done.stdout
    assert f"XLA cache: {cache / 'xla'}" in done.stderr + done.stdout
    # One HLO module per compilation; Keras names the compiled train step `one_step_on_data`.
    return sorted(p.name for p in dump.glob("module_*one_step_on_data*.before_optimizations.txt"))


@pytest.mark.slow
def test_xla_compiles_the_train_step_once_per_bucket_shape_and_a_second_run_none(demo_corpus, tmp_path):
    cache = tmp_path / "cache"
    compiled = _train(demo_corpus, tmp_path / "run", tmp_path / "xla", cache)
    config = load_config(overrides=[f"data.train_data={demo_corpus}", *SETTINGS])
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    epoch = build_dataset(config, rows, training=True, vocabulary=vocabulary)  # as trained: no partial batches
    shapes = {tuple(b["mel"].shape) for b in epoch}
    assert len(shapes) == 2, shapes  # the corpus fills both buckets, so a per-batch compile would show
    assert len(compiled) == len(shapes), compiled

    # Another process, another run folder: the programs come from the persistent cache.
    assert list((cache / "xla").rglob("*.pb")), "nothing was written to the persistent XLA cache"
    assert _train(demo_corpus, tmp_path / "run2", tmp_path / "xla2", cache) == []
