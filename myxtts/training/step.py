"""The compiled train and evaluation steps, as a Keras model that `Model.fit` drives.

Keras already provides what the loop needs around the step (XLA via `jit_compile`,
`steps_per_execution`, callbacks, TensorBoard, distribution strategies), so only the step itself is
written here. It is one graph-safe function of a batch that returns a metrics dict:

    forward -> masked losses -> scaled loss (fp16) -> gradients -> finite? apply : skip

Clipping happens inside the optimizer (`global_clipnorm`), which `LossScaleOptimizer` calls only
after unscaling, so it always sees true gradients.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from myxtts import compat
from myxtts.data.clip_features import mel_from_audio
from myxtts.models.alignment import AlignmentLoops
from myxtts.models.losses import LOSS_NAMES, SPEAKER_LOSS, compute_losses
from myxtts.training.distribute import all_reduce_mean, reducible_logs
from myxtts.training.optimizers import gradient_norm_known


# The variable dtypes TensorFlow keeps in a GPU's memory. It places int32 variables (and the other
# integer types it has no GPU variable kernels for) on the host, and an XLA program compiled for the
# GPU cannot read a host variable: "Trying to access resource ... located in device CPU:0 from
# device GPU:0" (measured on an H100). A CPU reads host variables either way, so no run on a CPU
# shows it: tests/test_step_variables.py checks every variable the compiled steps touch instead.
GPU_RESIDENT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "complex64", "complex128", "bool", "int64"})


def host_placed(variables) -> list[str]:
    """'name (dtype)' of each variable an XLA step on a GPU could not read (see GPU_RESIDENT_DTYPES)."""
    return [f"{v.name} ({tf.as_dtype(v.dtype).name})" for v in variables
            if tf.as_dtype(v.dtype).name not in GPU_RESIDENT_DTYPES]


class TrainingModel(keras.Model):
    """Holds the network and defines the steps; checkpoints store `network` and the optimizer."""

    def __init__(self, network: keras.Model, data_config=None, **kwargs):
        compat.check_versions()  # it overrides a private Keras method (`_maybe_symbolic_build`)
        super().__init__(**kwargs)
        self.network = network
        self.speaker_weight = float(getattr(network, "speaker_loss_weight", 0.0))
        self.data_config = data_config  # needed only with data.mel_on_device (waveform batches)
        names = LOSS_NAMES + ((SPEAKER_LOSS,) if self.speaker_weight > 0 else ())
        self.loss_trackers = {name: keras.metrics.Mean(name=name) for name in names}
        # Steps whose loss or gradients were not finite, in a row (reset by a good step). int64, as
        # Keras' own counters: TensorFlow keeps int32 variables in host memory, and an XLA step on a
        # GPU cannot read them (it crashed on an H100: see GPU_RESIDENT_DTYPES).
        self.nonfinite_in_a_row = keras.Variable(0, dtype="int64", trainable=False, name="nonfinite_in_a_row")
        # Python code in a step runs only while tracing: this counts traces, not steps.
        self.train_step_traces = 0
        self.update_compiled = None

    def call(self, batch, training=False):
        return self.network(self.with_mel(batch), training=training)

    def with_mel(self, batch):
        """The batch with `mel` (computed from `audio` when data.mel_on_device ships waveforms)."""
        return mel_from_audio(batch, self.data_config) if "audio" in batch else batch

    @property
    def metrics(self):
        return list(self.loss_trackers.values())

    def train_step(self, batch):
        self.train_step_traces += 1
        batch = self.with_mel(batch)
        with tf.GradientTape() as tape:
            outputs = self.network(batch, training=True)
            losses = compute_losses(batch, outputs, loops=self.network.alignment_loops, speaker_weight=self.speaker_weight)
            scaled_loss = self.optimizer.scale_loss(losses["loss"])
        variables = self.network.trainable_variables
        # Embedding gradients arrive as IndexedSlices, which Keras' gradient accumulation sums
        # wrongly (measured: wrong updates with gradient_accumulation_steps=2). A phoneme
        # vocabulary is small, so dense gradients cost nothing worth keeping the sparse form for.
        gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in tape.gradient(scaled_loss, variables)]
        # Several replicas: from here on every replica holds the global batch's mean gradients and
        # losses, so clipping, the finite check and the logs are one device's (distribute.py).
        gradients, losses = all_reduce_mean((gradients, losses))
        grad_norm, finite, scale = (self.update_compiled or self._update)(gradients, losses["loss"])
        self.nonfinite_in_a_row.assign(tf.where(finite, tf.constant(0, tf.int64), self.nonfinite_in_a_row + 1))

        for name, tracker in self.loss_trackers.items():
            # A skipped step's NaN would poison the running mean the progress bar shows.
            tracker.update_state(tf.where(finite, losses[name], 0.0), sample_weight=tf.cast(finite, tf.float32))
        logs = {name: tracker.result() for name, tracker in self.loss_trackers.items()}
        logs.update(
            grad_norm=grad_norm,
            loss_scale=scale,
            nonfinite_in_a_row=self.nonfinite_in_a_row.value,
            learning_rate=self._learning_rate_or_d(),
        )
        # Tensors, not variables: run eagerly (--enable-eager-debug), Keras wraps the logs in a
        # tf.data Optional, which cannot hold a variable ("'NoneType' object has no attribute 'is_set'").
        return reducible_logs({name: tf.identity(value) for name, value in logs.items()})

    def _update(self, gradients, loss):
        """The optimizer's update with the step's gradients and loss; returns the gradients' unscaled
        global norm, whether the step was finite (a non-finite step is skipped: under loss scaling,
        by the optimizer) and the loss scale."""
        scale = loss_scale(self.optimizer)
        grad_norm = tf.linalg.global_norm(gradients) / scale  # [] the unscaled norm
        finite = tf.math.logical_and(tf.math.is_finite(loss), tf.math.is_finite(grad_norm))
        variables = self.network.trainable_variables
        with gradient_norm_known(grad_norm):  # FusedAdamW clips by it rather than computing it again
            if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
                # It skips non-finite steps itself and lowers the scale: that is normal in fp16.
                self.optimizer.apply(gradients, variables)
            else:
                tf.cond(finite, lambda: applied(gradients, variables, self.optimizer), lambda: tf.constant(False))
        return grad_norm, finite, scale

    def test_step(self, batch):
        batch = self.with_mel(batch)
        # The validation step is never XLA-compiled (make_test_function), so its loops are XLA
        # programs of their own, whatever the train step's are (run eagerly, they stay as written).
        loops = dataclasses.replace(self.network.alignment_loops, compile=not self.run_eagerly)
        # Per example: the means are over clips, and each tracker update depends on the batch. (With a
        # scalar, Keras' Mean counts +1 without reading the batch, so evaluate's final, exhausted
        # get_next still counted one batch more on datasets of unknown length: measured.)
        losses = compute_losses(batch, self.network(batch, training=False), per_example=True,
                                loops=loops, speaker_weight=self.speaker_weight)
        for name, tracker in self.loss_trackers.items():
            tracker.update_state(losses[name])
        return reducible_logs({name: tracker.result() for name, tracker in self.loss_trackers.items()})

    def make_test_function(self, force=False):
        """Keras' validation function, in graph mode even when the train step is XLA-compiled.

        Why: XLA compiles a program per batch shape (on an H100, 106-160 s each for the train step),
        and validation meets every bucket too, for a few batches per evaluation: compiling it would
        double the run's compile time to save milliseconds. In graph mode, with the alignment's
        loops compiled alone (`test_step`), each shape costs seconds. Keras reads `jit_compile` when
        it builds the function, so it is switched off for that moment only.
        """
        if self.test_function is not None and not force:
            return self.test_function
        jit_compile = self.jit_compile
        self.jit_compile = False
        try:
            return super().make_test_function(force)
        finally:
            self.jit_compile = jit_compile

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        # The alignment's loops suit the device and the compiled step: blocks of frames per loop
        # iteration on a GPU, and XLA programs of their own where XLA does not compile the step.
        on_gpu = bool(tf.config.list_logical_devices("GPU"))
        loops = AlignmentLoops.for_device(
            on_gpu=on_gpu,
            step_compiled=bool(self.jit_compile) and not self.run_eagerly,
            frames_per_iteration=self.network.alignment_frames_per_iteration)
        # Run eagerly (--enable-eager-debug), every op runs as written, the loops included.
        self.network.alignment_loops = dataclasses.replace(loops, compile=False) if self.run_eagerly else loops
        # On a GPU, where the loops are compiled alone, so is the optimizer's update with the norm and
        # the finite check (one replica: with several, Keras' update steps into a merge call across
        # them). In graph mode each variable's update is a few ops for the executor to dispatch one
        # by one, 886 of the 3,031 ops a step of the small model ran, and a graph-mode step on a GPU
        # waits on that dispatch (an H200: 73 ms a step for 23 ms of kernels, BENCHMARKS.md). XLA
        # compiles it once (its shapes are the variables'). Not on a CPU, where those ops run on the
        # same cores as XLA would: the small model's update alone took 11.6-15.7 ms compiled against
        # 10.0-13.8 ms in graph mode there.
        one_replica = self.distribute_strategy.num_replicas_in_sync == 1
        self.update_compiled = (tf.function(self._update, jit_compile=True)
                                if on_gpu and loops.compile and one_replica and not self.run_eagerly else None)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # The trainer creates every variable before fit (build_training_model). Keras' version would first
        # reduce a distributed batch across replicas as one structure, which fails for dict batches
        # under MultiWorkerMirroredStrategy; with everything built it has nothing left to do anyway.
        if self.built and self.optimizer is not None and self.optimizer.built:
            return
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _learning_rate_or_d(self):
        """The learning rate, or for Prodigy its adapted step size d times the learning rate."""
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        rate = tf.cast(inner.learning_rate, tf.float32)
        if hasattr(inner, "d"):
            rate = rate * tf.cast(inner.d, tf.float32)
        return rate


def applied(gradients, variables, optimizer) -> tf.Tensor:
    """`optimizer.apply`, as a `tf.cond` branch (it must return a tensor)."""
    optimizer.apply(gradients, variables)
    return tf.constant(True)


def loss_scale(optimizer) -> tf.Tensor:
    """[] float32: the factor `optimizer.scale_loss` multiplies by (1 unless a LossScaleOptimizer)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.cast(optimizer.dynamic_scale, tf.float32)
    return tf.constant(1.0)
