"""`input_wait_ms`: how long training steps wait for their batch, as ProgressLogger writes it to TensorBoard.

The step and the pipeline here only sleep, so the true times are known: a fetch that takes
INPUT_S, a step that computes for COMPUTE_S. (tests/test_training.py checks that a real run logs it.)

Two clocks: `watch_input`, a stage at the end of the pipeline, and `watch_fetches`, for a pipeline
whose last stage is the copy to the GPU. On a CPU the copy is `prefetch_to_device("/cpu:0")`: the
same transformation with the same background thread, so the second clock is tested with it in place.
"""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.compat import traced_for_spec
from myxtts.training.callbacks import ProgressLogger

INPUT_S = 0.1
COMPUTE_S = 0.05
STEPS = 4


class SleepingStep(keras.Model):
    """A train step that computes on its batch for COMPUTE_S and counts the update, with no model to
    trace. (Reading the batch matters: in a graph, work that does not need it runs during the fetch.)"""

    def train_step(self, batch):
        slept = tf.numpy_function(lambda x: np.float32(time.sleep(COMPUTE_S) or x.sum()), [batch["x"]], tf.float32)
        with tf.control_dependencies([slept]):
            self.optimizer.iterations.assign_add(1)
        return {"loss": slept}


def _slow_fetch(batch):
    # Synchronous on the consumer's side (nothing prefetches after it): every fetch takes INPUT_S.
    x = tf.numpy_function(lambda x: (time.sleep(INPUT_S), x)[1], [batch["x"]], tf.float32)
    return {"x": x}


def _train_and_read_scalars(batches: tf.data.Dataset, log_dir, copy_to_device: bool = False,
                            steps_per_execution: int = 1, steps: int = STEPS) -> dict[str, list[float]]:
    progress = ProgressLogger(interval=1, max_steps=steps, samples_per_update=1, log_dir=str(log_dir), echo=lambda line: None)
    model = SleepingStep()
    model.compile(optimizer=keras.optimizers.SGD(), steps_per_execution=steps_per_execution)
    if copy_to_device:
        # As the trainer does with data.prefetch_to_gpu: the copy is the last stage, the clock is in the loop.
        batches = batches.prefetch(2).apply(tf.data.experimental.prefetch_to_device("/cpu:0"))
        progress.watch_fetches(model)
    else:
        batches = progress.watch_input(batches)
    model.fit(batches, steps_per_epoch=steps, epochs=1, callbacks=[progress], verbose=0)
    progress.writer.flush()
    scalars = {}
    for events in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return scalars


def test_input_wait_is_logged_and_counts_the_fetch_but_not_the_step(tmp_path):
    ready = tf.data.Dataset.from_tensors({"x": tf.zeros([2])}).repeat()
    fast = _train_and_read_scalars(ready, tmp_path / "fast")
    slow = _train_and_read_scalars(ready.map(_slow_fetch), tmp_path / "slow")
    assert len(fast["input_wait_ms"]) == len(slow["input_wait_ms"]) == len(slow["step_time_s"]) == STEPS
    # A ready batch costs next to nothing; a slow one is waited for, at least its fetch time.
    assert max(fast["input_wait_ms"]) < INPUT_S * 1000 / 4, fast["input_wait_ms"]
    assert min(slow["input_wait_ms"]) >= INPUT_S * 1000, slow["input_wait_ms"]
    # The wait is part of the step time and never includes the step's own compute.
    for wait_ms, step_s in zip(slow["input_wait_ms"], slow["step_time_s"]):
        assert wait_ms + COMPUTE_S * 1000 <= step_s * 1000 + 1, (wait_ms, step_s)


def test_input_wait_with_the_copy_to_the_device_as_the_last_stage(tmp_path):
    ready = tf.data.Dataset.from_tensors({"x": tf.zeros([2])}).repeat()
    fast = _train_and_read_scalars(ready, tmp_path / "fast", copy_to_device=True)
    slow = _train_and_read_scalars(ready.map(_slow_fetch), tmp_path / "slow", copy_to_device=True, steps=2 * STEPS)
    assert len(fast["input_wait_ms"]) == STEPS and len(slow["input_wait_ms"]) == 2 * STEPS
    # The first fetch also starts the copy's thread (39 ms once on the loaded 2-core machine): the
    # steps after it find their batch ready.
    assert max(fast["input_wait_ms"][1:]) < INPUT_S * 1000 / 4, fast["input_wait_ms"]
    # The copy's thread fetches the next batch while the step computes, so once the batches it got
    # ahead by during the first (tracing) step are used up, a step waits INPUT_S - COMPUTE_S (50 ms),
    # not the fetch's 100 ms that a clock on the pipeline side would count for the copy thread.
    steady = sorted(slow["input_wait_ms"][STEPS:])
    median = (steady[len(steady) // 2 - 1] + steady[len(steady) // 2]) / 2
    expected_ms = (INPUT_S - COMPUTE_S) * 1000
    assert 0.6 * expected_ms <= median <= 0.85 * INPUT_S * 1000, slow["input_wait_ms"]
    for wait_ms, step_s in zip(slow["input_wait_ms"], slow["step_time_s"]):
        assert wait_ms + COMPUTE_S * 1000 <= step_s * 1000 + 1, (wait_ms, step_s)


def test_input_wait_with_the_copy_and_several_steps_per_call(tmp_path):
    slow = _train_and_read_scalars(tf.data.Dataset.from_tensors({"x": tf.zeros([2])}).repeat().map(_slow_fetch),
                                   tmp_path / "slow", copy_to_device=True, steps_per_execution=2)
    # One line per call of two steps, each the mean wait of its steps.
    assert len(slow["input_wait_ms"]) == STEPS // 2
    assert slow["input_wait_ms"][-1] >= 0.5 * (INPUT_S - COMPUTE_S) * 1000, slow["input_wait_ms"]


@pytest.mark.slow
def test_a_training_run_that_copies_batches_to_the_gpu_still_logs_input_wait(demo_corpus, tmp_path, monkeypatch):
    from myxtts.config import load_config
    from myxtts.training import trainer

    copied = []

    def to_device(dataset, data_config):  # the trainer's copy stage, on the CPU
        copied.append(data_config.prefetch_to_gpu)
        return dataset.apply(tf.data.experimental.prefetch_to_device("/cpu:0"))

    monkeypatch.setattr(trainer, "copies_to_gpu", lambda data_config: True)  # as if TensorFlow saw a GPU
    monkeypatch.setattr(trainer, "to_device", to_device)
    config = load_config(overrides=[
        f"data.train_data={demo_corpus}", "model.size=tiny", "data.batch_size=4", "data.max_duration_s=6.0",
        "data.bucket_boundaries_s=[6.0]", "data.prefetch_to_gpu=true", "training.gradient_accumulation_steps=1",
        "training.precision=fp32", "training.enable_xla_compilation=false", "training.max_steps=3",
        "training.log_interval=1", "training.eval_interval=100", "training.log_samples=false",
        "training.wer_sentences=0"])
    try:
        result = trainer.train(config, tmp_path / "run")
    finally:
        keras.config.set_dtype_policy("float32")
    assert copied == [True, True] and result.step == 3  # the validation batches', then the training stream's
    assert [r["step"] for r in result.history] == [1, 2, 3]
    assert all(0 <= r["input_wait_ms"] <= 1000 * r["step_time_s"] for r in result.history), result.history


class TracedShapes(keras.Model):
    """A train step that records the batch shape of every trace of it."""

    def __init__(self):
        super().__init__()
        self.traced = []

    def train_step(self, batch):
        self.traced.append(tuple(batch["x"].shape))
        self.optimizer.iterations.assign_add(1)
        return {"loss": tf.reduce_sum(batch["x"])}


def test_timed_fetches_trace_the_step_once_for_every_bucket(tmp_path):
    # Batches of two lengths, as two buckets give. Keras steps a timed fetch's eager batches one by one;
    # with `reduce_retracing` that traced the first length exactly and again for the second (15 s on
    # an H200's host for the demo's model): the pipeline's element spec, whose length is unknown, is
    # traced instead, once.
    batches = tf.data.Dataset.range(8).map(lambda i: {"x": tf.zeros(tf.stack([2, 3 + i % 2 * 2]))})
    assert batches.element_spec["x"].shape.as_list() == [2, None]
    batches = batches.repeat().prefetch(2).apply(tf.data.experimental.prefetch_to_device("/cpu:0"))
    progress = ProgressLogger(interval=1, max_steps=6, samples_per_update=1, log_dir=str(tmp_path), echo=lambda line: None)
    model = TracedShapes()
    model.compile(optimizer=keras.optimizers.SGD())
    progress.watch_fetches(model)
    model.fit(batches, steps_per_epoch=6, epochs=1, callbacks=[progress], verbose=0)
    assert model.traced == [(2, None)]
    assert int(model.optimizer.iterations) == 6


def test_traced_for_spec_serves_every_shape_that_fits_from_one_trace():
    traced = []
    function = tf.function(lambda x: traced.append(tuple(x.shape)) or tf.reduce_sum(x), reduce_retracing=True)
    traced_for_spec(function, tf.TensorSpec([2, None], tf.float32))
    traced_for_spec(function, tf.TensorSpec([2, 7], tf.float32))  # traced already: nothing more
    for length in (3, 5, 9):
        assert float(function(tf.ones([2, length]))) == 2 * length
    assert traced == [(2, None)]
