"""Several replicas train exactly like one device: MirroredStrategy on two logical CPUs, and two workers.

Logical devices and TF_CONFIG must be set before TensorFlow starts, so every multi-device run happens
in a child process started from this file (`python tests/test_distribute.py <mode> ...`, see the
bottom); the child prints one JSON line and the test compares numbers in the parent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from myxtts.hardware.detect import GpuFacts, MachineFacts
from myxtts.hardware.plan import RequestedSettings, plan_for_machine
from myxtts.training import distribute

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 240

# Adam's first update is about +-lr per weight whatever the gradient's size, so weights are compared
# to 1% of the learning rate, and the moments (linear and quadratic in the gradient, so they do see a
# wrong scale or a wrong clip) to a relative 1e-4: both far above float32 summation-order noise
# (measured: 3.4e-6 and ~1e-6) and far below any real mistake.
LEARNING_RATE = 1e-3
WEIGHT_ATOL = 0.01 * LEARNING_RATE


def _child(name: str, args: list[str], tmp_path: Path, env_extra: dict | None = None) -> subprocess.Popen:
    """Starts `python tests/test_distribute.py *args`; its stderr goes to `<tmp_path>/<name>.log`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env.update(env_extra or {})
    with open(tmp_path / f"{name}.log", "w") as log:
        process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                                   stdout=subprocess.PIPE, stderr=log, text=True, cwd=tmp_path)
    process.log_path = tmp_path / f"{name}.log"
    return process


def _results(processes: list[subprocess.Popen]) -> list[dict]:
    """Each child's JSON line. The first child to fail (or the deadline) ends all of them, so a worker
    waiting for a dead peer cannot hold the test until the timeout; only these children are killed."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            failed = [p for p in processes if p.returncode not in (None, 0)]
            if failed:
                pytest.fail(f"child {failed[0].args[2:]} exited with {failed[0].returncode}:\n"
                            f"{failed[0].log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        late = [p for p in processes if p.poll() is None]
        if late:
            pytest.fail(f"child {late[0].args[2:]} did not finish in {CHILD_TIMEOUT_S} s:\n"
                        f"{late[0].log_path.read_text()[-2000:]}")
        for p in processes:
            if p.returncode != 0:
                pytest.fail(f"child {p.args[2:]} exited with {p.returncode}:\n{p.log_path.read_text()[-4000:]}")
        return [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()


# --------------------------------------------------------------------------------------------------
# Pure decisions, in this process


def test_tf_config_is_checked_with_messages_that_say_what_to_fix():
    role = distribute.parse_tf_config(json.dumps(
        {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 1}}))
    assert (role.task_type, role.task_id, role.num_workers, role.is_chief) == ("worker", 1, 2, False)
    chief = distribute.parse_tf_config(json.dumps(
        {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}))
    assert chief.is_chief and chief.num_workers == 2
    bad = {
        "not json": "not valid JSON",
        json.dumps({"task": {"type": "worker", "index": 0}}): '"cluster" mapping',
        json.dumps({"cluster": {"worker": ["a:1"]}}): '"task"',
        json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}): "not in the cluster",
        json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}): "list of",
        json.dumps({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "ps", "index": 0}}): '"chief"',
    }
    for text, message in bad.items():
        with pytest.raises(distribute.DistributionError, match=message):
            distribute.parse_tf_config(text)


def _gpu(index: int) -> GpuFacts:
    return GpuFacts(index=index, name="NVIDIA A100-SXM4-40GB", total_memory_bytes=40 << 30,
                    free_memory_bytes=39 << 30, compute_capability=(8, 0))


def test_trimmed_validation_batches_keep_what_fills_a_multiple_of_the_replicas():
    # Batches of 4 per length bucket, each cut to a multiple of the replicas.
    assert distribute.clips_in_even_batches([9, 3, 1], batch_size=4, count=2) == 8 + 0 + 2 + 0
    assert distribute.clips_in_even_batches([9, 3, 1], batch_size=4, count=1) == 13
    assert distribute.clips_in_even_batches([1, 1, 1], batch_size=4, count=2) == 0
    assert distribute.clips_in_even_batches([6], batch_size=3, count=2) == 4  # 2 of each batch of 3


def test_validation_that_no_replica_batch_holds_is_said_and_left_out(demo_corpus):
    """Every validation clip alone in its length bucket with 2 GPUs: every batch was trimmed to nothing,
    so the run never validated, kept no best_mel, and printed an empty "validation at step 0:" line."""
    from myxtts.config import load_config
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import Epochs, build_vocabulary
    from myxtts.training.trainer import _validates_any

    config = load_config(overrides=["model.size=tiny", "data.batch_size=4", "data.max_duration_s=6.0",
                                    "data.bucket_boundaries_s=[2.0, 3.0, 4.0, 6.0]"])
    rows = read_manifest(demo_corpus)
    by_length = sorted(rows, key=lambda u: _seconds(u.audio_path))
    one_per_bucket = [next(u for u in by_length if low < _seconds(u.audio_path) <= high)
                      for low, high in ((0, 1.8), (2.2, 2.8), (3.3, 3.8), (4.5, 5.8))]  # clear of the boundaries
    vocabulary = build_vocabulary(rows, config.data)

    def said(val_rows, replicas):
        lines = []
        epochs = Epochs(config, val_rows, training=False, vocabulary=vocabulary)
        return _validates_any(epochs, replicas, lines.append), epochs.group_sizes(), lines

    validates, sizes, lines = said(one_per_bucket, replicas=2)
    assert sizes == [1, 1, 1, 1] and not validates
    assert len(lines) == 1 and "no validation clip is left" in lines[0] and "data.val_fraction" in lines[0]
    assert said(one_per_bucket, replicas=1) == (True, [1, 1, 1, 1], [])
    more = one_per_bucket + [u for u in by_length if 2.2 < _seconds(u.audio_path) <= 2.95 and u not in one_per_bucket][:2]
    validates, sizes, lines = said(more, replicas=2)
    assert validates and sizes == [1, 3, 1, 1]
    assert lines == ["data: 4 of the 6 validation clips are left out of every validation: each validation batch "
                     "is cut to a multiple of the 2 replicas (a clip more would leave one of them an empty batch)"]


def test_one_device_gets_the_default_strategy_and_keeps_xla():
    import tensorflow as tf

    cpu_plan = plan_for_machine(MachineFacts(usable_cpu_cores=2), "tiny")
    for choice in (cpu_plan, 1):
        strategy = distribute.strategy_for(choice, environ={})
        assert strategy is tf.distribute.get_strategy()
        assert distribute.xla_allowed(strategy) and distribute.is_chief(strategy)
        assert distribute.global_batch_size(6, strategy) == 6
    two_gpus = plan_for_machine(MachineFacts(gpus=(_gpu(0), _gpu(1)), usable_cpu_cores=8), "base")
    with pytest.raises(distribute.DistributionError, match="CUDA_VISIBLE_DEVICES"):
        distribute.strategy_for(two_gpus, environ={})  # this machine has no GPU for it


def test_a_cluster_plan_recomputes_accumulation_for_all_replicas():
    facts = MachineFacts(gpus=(_gpu(0), _gpu(1)), usable_cpu_cores=8)
    plan = plan_for_machine(facts, "base", RequestedSettings(batch_size=4))
    assert (plan.num_replicas, plan.gradient_accumulation_steps) == (2, 4)  # 4 x 4 x 2 = 32
    four_hosts = distribute.with_replicas(plan, 8)  # 4 hosts x 2 GPUs
    assert (four_hosts.batch_size, four_hosts.gradient_accumulation_steps,
            four_hosts.effective_batch_size) == (4, 1, 32)
    assert "8 replica" in four_hosts.sources["effective_batch_size"]
    fixed = plan_for_machine(facts, "base", RequestedSettings(batch_size=4, gradient_accumulation_steps=3))
    assert distribute.with_replicas(fixed, 8).gradient_accumulation_steps == 3  # configured values win
    cluster = json.dumps({"cluster": {"worker": [f"h{i}:1" for i in range(4)]}, "task": {"type": "worker", "index": 2}})
    assert distribute.planned_replicas(plan, environ={"TF_CONFIG": cluster}) == 8
    assert distribute.planned_replicas(plan, environ={}) == 2
    cpu_plan = plan_for_machine(MachineFacts(usable_cpu_cores=2), "tiny")
    assert distribute.planned_replicas(cpu_plan, environ={"TF_CONFIG": cluster}) == 4  # one CPU replica per host


# --------------------------------------------------------------------------------------------------
# Two logical CPU devices against one device


@pytest.fixture(scope="module")
def short_clips(demo_corpus, tmp_path_factory):
    """The demo corpus's 4 clips of at most 3 s as one batch (one bucket shape: one traced program),
    computed once here and handed to the children as an .npz with the vocabulary size."""
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import build_dataset, build_vocabulary

    config = _config()
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    short = [u for u in rows if _seconds(u.audio_path) <= 3.0]  # decode only what the batch uses
    batch = next(iter(build_dataset(config, short, training=False, vocabulary=vocabulary)))
    assert batch["mel"].shape[0] == 4, "the demo corpus should have 4 clips of at most 3 s"
    path = tmp_path_factory.mktemp("clips") / "clips.npz"
    np.savez(path, vocab_size=len(vocabulary), **{k: v.numpy() for k, v in batch.items()})
    return str(path)


@pytest.mark.slow
def test_two_replicas_match_one_device_on_the_same_global_batch(short_clips, tmp_path):
    [result] = _results([_child("mirrored", ["mirrored", short_clips], tmp_path)])
    one, two = result["one"], result["two"]
    assert two["replicas"] == 2 and two["xla_allowed"] is False
    assert one["iterations"] == two["iterations"] == 1  # two micro-batches, one accumulated update
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(two["grad_norm"], one["grad_norm"], rtol=1e-5)
    assert one["grad_norm"] > 1.0  # global_clipnorm=1 was active: clipping saw the global gradient
    assert two["replica_copies_differ_by"] == 0.0  # every replica applied the identical update
    assert one["moved"] > 0.5 * LEARNING_RATE  # the update happened
    assert result["weights_differ_by"] <= WEIGHT_ATOL, result["weights_differ_by"]
    assert result["moments_relative_difference"] <= 1e-4, result["moments_relative_difference"]
    # Evaluation under the strategy: batches of 4, 3 and 1 clips are trimmed to 4 and 2 (a batch of 1
    # would leave a replica nothing); Keras combines the replicas' metric states into the mean over
    # the 6 clips. The dataset's length is unknown, as the pipeline's is (that once counted a batch
    # too many, see step.py's test_step).
    assert two["validation_batches"] == [4, 2]
    np.testing.assert_allclose(two["val_loss"], one["val_loss"], rtol=1e-5)


def _mirrored_child(clips: str) -> dict:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from myxtts.training.optimizers import build_optimizer

    config, vocab_size, examples = _load_clips(clips)
    # Two micro-batches of the same 4 clips in different groupings, so each replica's half differs.
    order = [0, 1, 2, 3, 1, 3, 0, 2]
    micro_batches = [{k: tf.gather(v, order[i:i + 4]) for k, v in examples.items()} for i in (0, 4)]

    def build(strategy, initial_weights=None):
        with distribute.training_scope(strategy):
            model = _model(config, vocab_size)
            optimizer = distribute.prepare_optimizer(build_optimizer(config.training, 2), strategy)
            model.compile(optimizer=optimizer, jit_compile=False)
            model(micro_batches[0])
            optimizer.build(model.network.trainable_variables)
        if initial_weights is not None:
            model.network.set_weights(initial_weights)
        return model

    one = build(tf.distribute.get_strategy())
    initial = one.network.get_weights()
    for batch in micro_batches:  # the reference: one device, eagerly
        logs = one.train_step(batch)
    one_logs = {k: float(v) for k, v in logs.items()}

    strategy = distribute.strategy_for(2, device_type="CPU", environ={})
    two = build(strategy, initial)
    # Global batches; Keras splits each into consecutive halves, one per replica.
    global_batches = tf.data.Dataset.from_tensor_slices({k: tf.stack([b[k] for b in micro_batches]) for k in examples})
    history = two.fit(global_batches, epochs=1, verbose=0).history

    one_moments, two_moments = (
        [v.numpy() for v in m.optimizer.variables if "momentum" in v.path or "velocity" in v.path] for m in (one, two))
    relative = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30)) for a, b in zip(one_moments, two_moments))
    copies = max(float(tf.reduce_max(tf.abs(v.value.values[0] - v.value.values[1])))
                 for v in two.network.trainable_variables)

    batches = [examples, {k: v[:3] for k, v in examples.items()}, {k: v[:1] for k, v in examples.items()}]
    validation = distribute.evenly_split(_dataset_of(batches), strategy)
    sizes = [int(b["mel"].shape[0]) for b in validation]
    for tracker in one.metrics:
        tracker.reset_state()
    one_val = [float(one.test_step({k: v[:size] for k, v in examples.items()})["loss"]) for size in sizes][-1]
    two_val = two.evaluate(validation, verbose=0, return_dict=True)["loss"]
    return {
        "one": {**one_logs, "iterations": int(one.optimizer.iterations.numpy()), "val_loss": one_val,
                "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(initial, one.network.get_weights()))},
        "two": {"loss": history["loss"][-1], "grad_norm": history["grad_norm"][-1], "val_loss": float(two_val),
                "validation_batches": sizes,
                "iterations": int(two.optimizer.iterations.numpy()), "replicas": distribute.replicas(strategy),
                "xla_allowed": distribute.xla_allowed(strategy), "replica_copies_differ_by": copies},
        "weights_differ_by": max(float(np.max(np.abs(a - b))) for a, b in zip(one.network.get_weights(),
                                                                               two.network.get_weights())),
        "moments_relative_difference": relative,
    }


def test_several_replicas_train_one_step_per_call(short_clips, tmp_path):
    """training.steps_per_execution 4 (the experimental level) with several GPUs stopped every run at its
    first step: Keras' multi-step loop fails on a distributed iterator ("You must feed a value for
    placeholder tensor 'while/body/.../while/cond/Placeholder_1'", measured on two logical CPUs)."""
    [result] = _results([_child("per_call", ["per_call", short_clips], tmp_path)])
    assert result == {"replicas": 2, "steps_per_execution": 1}


def _per_call_child(clips: str) -> dict:
    import dataclasses

    import tensorflow as tf

    from myxtts.training.trainer import build_training_model

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    config, vocab_size, examples = _load_clips(clips)
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, steps_per_execution=4))
    strategy = distribute.strategy_for(2, device_type="CPU", environ={})
    model = build_training_model(config, vocab_size, "float32", examples, strategy)  # as the trainer compiles it
    return {"replicas": distribute.replicas(strategy), "steps_per_execution": model.steps_per_execution}


# --------------------------------------------------------------------------------------------------
# Two worker processes on this host


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_train_in_step_and_end_with_the_same_weights(short_clips, tmp_path):
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        weights = str(tmp_path / f"weights-{index}.npz")
        processes.append(_child(f"worker-{index}", ["worker", short_clips, weights], tmp_path, {"TF_CONFIG": tf_config}))
    results = _results(processes)
    assert [r["replicas"] for r in results] == [2, 2] and [r["chief"] for r in results] == [True, False]
    assert [r["iterations"] for r in results] == [2, 2]  # 4 micro-batches, accumulation 2
    assert all(np.isfinite(r["loss"]) for r in results)
    first, second = (np.load(tmp_path / f"weights-{i}.npz") for i in range(2))
    assert first.files == second.files and len(first.files) > 20
    initial = np.load(tmp_path / "weights-0.npz.initial.npz")
    assert any(not np.array_equal(first[k], initial[k]) for k in first.files)  # it trained
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def _worker_child(clips: str, weights_path: str) -> dict:
    import tensorflow as tf

    from myxtts.training.optimizers import build_optimizer

    strategy = distribute.strategy_for(1, device_type="CPU")  # TF_CONFIG decides: two workers
    config, vocab_size, examples = _load_clips(clips)
    with distribute.training_scope(strategy):
        model = _model(config, vocab_size)
        optimizer = distribute.prepare_optimizer(build_optimizer(config.training, 2), strategy)
        model.compile(optimizer=optimizer, jit_compile=distribute.xla_allowed(strategy))
        model(examples)
        optimizer.build(model.network.trainable_variables)
    # Same seed on both workers, so both start from the same weights, as in a real run.
    np.savez(weights_path + ".initial.npz", **{str(i): w for i, w in enumerate(model.network.get_weights())})

    def make_dataset(batch, shard, shards):
        clips = tf.data.Dataset.from_tensor_slices(examples).shard(shards, shard)  # this worker's clips only
        return clips.batch(batch, drop_remainder=True).repeat()

    data = distribute.distribute_dataset(strategy, 2, make_dataset)
    history = model.fit(data, epochs=1, steps_per_epoch=4, verbose=0).history
    np.savez(weights_path, **{str(i): w for i, w in enumerate(model.network.get_weights())})
    return {"replicas": distribute.replicas(strategy), "chief": distribute.is_chief(strategy),
            "iterations": int(model.optimizer.iterations.numpy()), "loss": history["loss"][-1]}


# --------------------------------------------------------------------------------------------------
# Shared by the children


def _config():
    from myxtts.config import load_config

    return load_config(overrides=[
        "model.size=tiny", "data.batch_size=4", "data.deterministic=true", "data.max_duration_s=3.0",
        "data.bucket_boundaries_s=[3.0]", "training.precision=fp32", "training.enable_xla_compilation=false",
        "training.warmup_steps=0", f"training.learning_rate={LEARNING_RATE}", "training.clip_norm=1.0",
        "training.gradient_accumulation_steps=2"])


def _load_clips(path: str):
    import tensorflow as tf

    with np.load(path) as saved:
        vocab_size = int(saved["vocab_size"])
        examples = {k: tf.constant(saved[k]) for k in saved.files if k != "vocab_size"}
    return _config(), vocab_size, examples


def _dataset_of(batches: list[dict]):
    """Batches of different sizes as one dataset of unknown length (the batch dimension unknown too).

    Built from TensorFlow ops on purpose: under MirroredStrategy, `from_generator` handed TensorFlow
    the yielded tensors' buffers, and evaluation overwrote them in place (measured: `reference_mel`
    of the source batch changed by up to 11.5 after a few `evaluate` calls), which made the
    two-replica validation loss differ from one device's in about 2 runs of 5.
    """
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return dataset.filter(lambda batch: True)  # a filter makes the length unknown, as the pipeline's is


def _seconds(path: str) -> float:
    with wave.open(path) as audio:
        return audio.getnframes() / audio.getframerate()


def _model(config, vocab_size):
    import keras

    from myxtts.models.xtts import network_for
    from myxtts.training.step import TrainingModel

    keras.utils.set_random_seed(config.seed)
    return TrainingModel(network_for(config, vocab_size), data_config=config.data)


def _fast_graphs() -> None:
    """Skips Grappler's graph rewriting in the children: on a tiny model it costs more than it saves
    (most of a short run's time), and both sides of every comparison run the same kernels."""
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


if __name__ == "__main__":
    mode, *arguments = sys.argv[1:]
    _fast_graphs()
    started = __import__("time").perf_counter()
    outcome = {"mirrored": _mirrored_child, "per_call": _per_call_child, "worker": _worker_child}[mode](*arguments)
    print(f"{mode} child: {__import__('time').perf_counter() - started:.1f} s", file=sys.stderr)
    print(json.dumps(outcome))
