"""Optimizers and learning-rate schedules, built from `training.*` keys.

AdamW uses Keras' own warmup + cosine decay schedule. Prodigy estimates its own step size, so it
gets the same shape of schedule scaled to `learning_rate` (1.0 is the intended value). Keras
evaluates schedules on micro-steps when accumulating gradients, so the schedule is stretched by the
accumulation factor to stay in optimizer updates.
"""

from __future__ import annotations

import keras

from myxtts.config import TrainingConfig
from myxtts.training.prodigy import Prodigy


def learning_rate_schedule(t: TrainingConfig, accumulation: int) -> keras.optimizers.schedules.LearningRateSchedule:
    warmup = min(t.warmup_steps, t.max_steps - 1) * accumulation
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else t.learning_rate,
        warmup_target=t.learning_rate if warmup else None,
        warmup_steps=warmup,
        decay_steps=max(t.max_steps * accumulation - warmup, 1),
        alpha=0.1,  # end at a tenth of the peak rather than zero: fine-tuning runs are often extended
    )


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
    return keras.optimizers.AdamW(beta_1=0.9, beta_2=0.98, epsilon=1e-8, **common)


def current_learning_rate(optimizer) -> float:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return float(keras.ops.convert_to_numpy(inner.learning_rate))
