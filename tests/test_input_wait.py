"""`input_wait_ms`: how long training steps wait for their batch, as ProgressLogger writes it to TensorBoard.

The step and the pipeline here only sleep, so the true times are known: a fetch that takes
INPUT_S, a step that computes for COMPUTE_S. (tests/test_training.py checks that a real run logs it.)
"""

import time

import keras
import numpy as np
import tensorflow as tf

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


def _train_and_read_scalars(batches: tf.data.Dataset, log_dir) -> dict[str, list[float]]:
    progress = ProgressLogger(interval=1, max_steps=STEPS, samples_per_update=1, log_dir=str(log_dir), echo=lambda line: None)
    model = SleepingStep()
    model.compile(optimizer=keras.optimizers.SGD())
    model.fit(progress.watch_input(batches), steps_per_epoch=STEPS, epochs=1, callbacks=[progress], verbose=0)
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
