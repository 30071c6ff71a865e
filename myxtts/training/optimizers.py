"""Optimizers and learning-rate schedules, built from `training.*` keys.

The rate warms up linearly, holds, then decays along a cosine to a tenth of its peak over the last
`training.lr_decay_fraction` of the run (1.0: decay from the end of warmup on, Keras' CosineDecay
with warmup; `WarmupHoldDecay` equals it there, tested). Holding the peak for most of a short run
and decaying at the end learned the demo faster than decaying all along (BENCHMARKS.md). Prodigy
estimates its own step size, so it gets the same shape scaled to `learning_rate` (1.0 is the
intended value). Keras evaluates schedules on micro-steps when accumulating gradients, so the
schedule is stretched by the accumulation factor to stay in optimizer updates.
"""

from __future__ import annotations

import contextlib
import math
import threading

import keras
import tensorflow as tf

from myxtts import compat
from myxtts.config import TrainingConfig
from myxtts.training.prodigy import Prodigy


def learning_rate_schedule(t: TrainingConfig, accumulation: int) -> keras.optimizers.schedules.LearningRateSchedule:
    warmup = min(t.warmup_steps, t.max_steps - 1) * accumulation
    total = max(t.max_steps * accumulation, 1)
    return WarmupHoldDecay(t.learning_rate, warmup, total, decay_steps=math.ceil((total - warmup) * t.lr_decay_fraction))


@keras.saving.register_keras_serializable(package="myxtts")
class WarmupHoldDecay(keras.optimizers.schedules.LearningRateSchedule):
    """0 -> `peak` linearly over `warmup_steps`, `peak` until `decay_steps` before `total_steps`, then
    a cosine down to `alpha * peak` at `total_steps` (and after). Written here because Keras'
    CosineDecay has no hold: it starts decaying right after the warmup."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, decay_steps: int, alpha: float = 0.1):
        self.peak, self.warmup_steps, self.total_steps = float(peak), int(warmup_steps), int(total_steps)
        self.decay_steps, self.alpha = max(int(decay_steps), 1), float(alpha)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = self.peak * step / max(self.warmup_steps, 1)
        progress = tf.clip_by_value((step - (self.total_steps - self.decay_steps)) / self.decay_steps, 0.0, 1.0)
        decayed = self.peak * (self.alpha + (1.0 - self.alpha) * 0.5 * (1.0 + tf.cos(math.pi * progress)))
        return tf.where(step < self.warmup_steps, warm, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay_steps": self.decay_steps, "alpha": self.alpha}


def build_optimizer(t: TrainingConfig, accumulation: int) -> keras.optimizers.Optimizer:
    """The optimizer for `training.optimizer`, with clipping and gradient accumulation."""
    common = {
        "learning_rate": learning_rate_schedule(t, accumulation),
        "weight_decay": t.weight_decay,
        "global_clipnorm": t.clip_norm or None,
        "gradient_accumulation_steps": accumulation if accumulation > 1 else None,
    }
    if t.optimizer == "prodigy":
        return Prodigy(**common)
    return FusedAdamW(beta_1=0.9, beta_2=0.98, epsilon=1e-8, **common)


@keras.saving.register_keras_serializable(package="myxtts")
class FusedAdamW(keras.optimizers.AdamW):
    """Keras' AdamW, each variable's update one fused TensorFlow op (`ResourceApplyAdam`).

    Same arithmetic, same variables (checkpoints load either way; tests/test_optimizers.py checks
    the trajectories agree). Written because Keras 3 spells Adam out as about ten small ops per
    variable and evaluates the learning-rate schedule once more per variable for the weight
    decay: for the ~100 variables of the tiny model that was half the time of tracing the train
    step (the weight decay's schedule alone about a second of each trace), and as many ops per
    step for a graph-mode executor to dispatch. Here the schedule is evaluated once per update
    and each variable costs two ops: its decay and the fused Adam update. What every variable's
    update shares (the step, the bias corrections, the rates in the variable's dtype) is computed
    once per update too (`_shared`): per variable they had cost ~5 more ops run (a read of
    `iterations`, two `Pow`s, casts), 705 of the 4,023 ops a graph-mode step of the small model ran,
    and a graph-mode step on a GPU waits on its ops' dispatch (BENCHMARKS.md, "The graph-mode step's
    host work").
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError("FusedAdamW has no amsgrad; use keras.optimizers.AdamW")

    def _backend_update_step(self, grads, trainable_variables, learning_rate):  # private Keras: compat.OVERRIDDEN
        # One update of every variable: their shared tensors are made once, for the first variable
        # of each dtype and device, and kept for this update only. Thread-local: the replicas of a
        # MirroredStrategy trace their updates in threads at once.
        outer = getattr(_UPDATE, "shared", None)
        _UPDATE.shared = {}
        try:
            super()._backend_update_step(grads, trainable_variables, learning_rate)
        finally:
            _UPDATE.shared = outer

    def _shared(self, learning_rate, variable) -> dict:
        """The tensors every variable's update shares, in `variable`'s dtype."""
        dtype = variable.dtype
        key = (id(self), dtype, variable.device)
        cache = getattr(_UPDATE, "shared", None)
        if cache is not None and key in cache:
            return cache[key]
        lr = tf.cast(learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        shared = {"lr": lr, "beta_1": beta_1, "beta_2": beta_2, "epsilon": tf.cast(self.epsilon, dtype),
                  "beta1_power": tf.pow(beta_1, step), "beta2_power": tf.pow(beta_2, step),
                  "decay": lr * tf.cast(self.weight_decay, dtype) if self.weight_decay is not None else None}
        if cache is not None:
            cache[key] = shared
        return shared

    def _clip_gradients(self, grads):  # private Keras: compat.OVERRIDDEN
        # Keras' clip_by_global_norm, by the norm the train step computed already (`gradient_norm_known`)
        # rather than a second time (a Square and a Sum per variable): not when accumulating, where
        # the averaged gradients of several micro-batches are clipped.
        norm = getattr(_UPDATE, "norm", None)
        if (norm is None or not self.global_clipnorm or self.clipnorm or self.clipvalue
                or self.gradient_accumulation_steps):
            return super()._clip_gradients(grads)
        norm = tf.cast(norm, tf.float32)
        # A NaN or infinite norm makes every gradient NaN, as Keras' does.
        scale = self.global_clipnorm * tf.minimum(1.0 / norm, 1.0 / self.global_clipnorm) + (norm - norm)
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]

    def _apply_weight_decay(self, variables):  # a private Keras method: compat.OVERRIDDEN
        # Applied with each variable's update instead (update_step), with the update's learning rate.
        pass

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        shared = self._shared(learning_rate, variable)
        if shared["decay"] is not None and compat.uses_weight_decay(self, variable):
            # Decoupled decay, as AdamW: from the variable before its Adam update.
            variable.assign_sub(variable * shared["decay"])
        m, v = compat.adam_moments(self, variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(m), v=_handle(v),
            beta1_power=shared["beta1_power"], beta2_power=shared["beta2_power"], lr=shared["lr"],
            beta1=shared["beta_1"], beta2=shared["beta_2"], epsilon=shared["epsilon"], grad=tf.cast(gradient, dtype))


# What the update being traced in this thread shares: `shared`, its tensors per dtype and device
# (FusedAdamW._backend_update_step); `norm`, its gradients' global norm (gradient_norm_known).
_UPDATE = threading.local()


@contextlib.contextmanager
def gradient_norm_known(norm):
    """Inside it, FusedAdamW clips the gradients it applies by `norm`, their global norm (unscaled,
    under loss scaling), which the caller computed already."""
    outer = getattr(_UPDATE, "norm", None)
    _UPDATE.norm = norm
    try:
        yield
    finally:
        _UPDATE.norm = outer


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (on this replica's device under a strategy)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def current_learning_rate(optimizer) -> float:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return float(keras.ops.convert_to_numpy(inner.learning_rate))
