"""The model, optimizer and compiled train step of a config, built the way `train()` builds them.

The diagnostics need the trainer's objects without `fit`, so that each step can be timed on its
own: the model and optimizer come from the trainer's own `build_training_model`, and the step is
compiled the way Keras' TensorFlow trainer does: `tf.function(train_step, jit_compile=...,
reduce_retracing=True)`. With it comes a timer of the step's alignment loops alone
(`alignment_timing.AlignmentLoopsTimer`: the network's own `alignment_loops`, the step's jit_compile).

`prepare_run` starts the run as `train()` does (training/run_setup.py: the hardware plan's
automatic values, the rows phonemized, the vocabulary), without a run folder, and builds the
training dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from myxtts.compat import traced_for_spec
from myxtts.config import Config
from myxtts.data.manifest import Utterance
from myxtts.data.pipeline import build_dataset, first_batch
from myxtts.data.text import Vocabulary
from myxtts.diagnostics.alignment_timing import AlignmentLoopsTimer
from myxtts.diagnostics.timing import CompiledStep
from myxtts.training import run_setup
from myxtts.training.step import TrainingModel
from myxtts.training.trainer import build_training_model


@dataclass
class PreparedRun:
    config: Config  # automatic values (batch, workers, accumulation) resolved by the hardware plan
    policy: str  # the Keras dtype policy training would use
    rows: list[Utterance]  # the training split
    vocabulary: Vocabulary
    dataset: tf.data.Dataset  # training batches, one pass (the callers repeat it)
    sample: dict  # a batch of the first clips, as train() builds its variables from (`first_batch`)


def prepare_run(config: Config, echo=print) -> PreparedRun:
    """Everything `train()` does before building the model, minus the run folder: the same plan,
    rows and vocabulary (a raw corpus is phonemized as training phonemizes it)."""
    config, policy, _ = run_setup.resolve_plan(config, echo)
    run = run_setup.prepare_run(config, None, echo=echo)
    rows, vocabulary = run.text.train_rows, run.vocabulary
    sample = first_batch(config, rows, vocabulary)  # NoFullBatch, as training says it, when there is nothing to time
    dataset = build_dataset(config, rows, training=True, vocabulary=vocabulary)
    return PreparedRun(config=config, policy=policy, rows=rows, vocabulary=vocabulary, dataset=dataset, sample=sample)


@dataclass
class TrainingSetup:
    model: TrainingModel
    optimizer: keras.optimizers.Optimizer
    step: CompiledStep
    alignment_loops: AlignmentLoopsTimer  # the step's alignment loops, to time alone


def build_training_setup(config: Config, vocab_size: int, policy: str, sample_batch: dict,
                         silent_token: int = -1, batch_spec=None) -> TrainingSetup:
    """Network, optimizer and compiled step for a config whose automatic values are resolved.

    Sets the global Keras dtype policy to `policy`, as training does; `sample_batch`, a batch of
    the training dataset, builds every variable (network and optimizer) before the step is compiled.
    `batch_spec` (the dataset's `element_spec`): the step is traced once for it, at its first call,
    as training traces it, rather than for the first batch's shape and again for the second's.
    """
    t = config.training
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)
    model = build_training_model(config, vocab_size, policy, sample_batch, silent_token=silent_token)
    optimizer = model.optimizer

    xla = bool(t.enable_graph_mode and t.enable_xla_compilation)
    if t.enable_graph_mode:
        function = tf.function(model.train_step, jit_compile=xla, reduce_retracing=True)

        def run(batch):
            if batch_spec is not None:
                traced_for_spec(function, batch_spec)
            return function(batch)
    else:
        run = model.train_step
    step = CompiledStep(run=run, finish=_read_scalar, traces=lambda: model.train_step_traces, xla=xla)
    # The loops as this step runs them: the network's alignment_loops (set by TrainingModel.compile) and its jit_compile.
    loops = AlignmentLoopsTimer(model.network, jit_compile=xla, with_mel=model.with_mel)
    return TrainingSetup(model=model, optimizer=optimizer, step=step, alignment_loops=loops)


def _read_scalar(logs: dict) -> float:
    # Reading a value the step returned waits for the step to finish on the device; this is the
    # same read the training callbacks make every step (NonFiniteGuard).
    return float(logs["nonfinite_in_a_row"])


def read_all_metrics(logs: dict) -> dict:
    """What the training loop's callbacks do with a step's outputs: every metric to a Python float."""
    return {name: float(value) for name, value in logs.items()}
