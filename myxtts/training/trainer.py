"""`train(config, workdir)`: everything between a resolved config and a trained, checkpointed model.

    hardware plan -> precision policy -> datasets + vocabulary -> model + optimizer
      -> resume? -> Model.fit(step-based "epochs" of `eval_interval` updates) -> checkpoints

Keras "epochs" here are validation intervals, not passes over the data: the training set repeats
forever and the run ends at `training.max_steps` optimizer updates, so resuming, accumulation and
data size never change what a step means. With `training.steps_per_execution` > 1 an epoch is one
call of that many micro-batches, and validation runs after the first call that crosses an interval.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf
import yaml

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.data.manifest import read_manifest, split_train_val
from myxtts.data.phonemes import check_language, model_texts, phonemize_utterances
from myxtts.data.pipeline import build_dataset, copies_to_gpu, to_device
from myxtts.data.text import Vocabulary
from myxtts.hardware.batch_plan import BatchPlan
from myxtts.hardware.detect import detect_machine
from myxtts.hardware.gpu_memory import allow_memory_growth
from myxtts.hardware.plan import Plan, RequestedSettings, plan_for_machine
from myxtts.hardware.probe_runner import probe_batch_size
from myxtts.hardware.report import short_summary
from myxtts.models.xtts import network_for
from myxtts.training.callbacks import (CheckpointSaver, NonFiniteGuard, ProgressLogger, SpeechCheck, StopAtStep,
                                       ValidationSchedule, console_echo, optimizer_step)
from myxtts.training import batch_probe, distribute
from myxtts.training.checkpoints import Checkpoints, CheckpointError
from myxtts.training.optimizers import build_optimizer
from myxtts.training.step import TrainingModel

@dataclass
class TrainResult:
    step: int
    history: list[dict]
    validation: dict
    validation_history: list[dict]  # {"step", "val_loss", "val_mel_loss", ...}, from step 0 on a fresh run
    stopped_for_nonfinite: bool
    interrupted_by: str | None
    workdir: Path
    train_function_traces: int
    batch_size: int
    gradient_accumulation_steps: int


def resolve_hardware(config: Config, echo=console_echo) -> tuple[Config, str]:
    """Fill every automatic value (batch, accumulation, workers, precision) from the hardware plan.

    Returns the resolved config and the Keras dtype policy name.
    """
    config, policy, _ = resolve_plan(config, echo)
    return config, policy


def resolve_plan(config: Config, echo=console_echo) -> tuple[Config, str, Plan]:
    """`resolve_hardware` plus the plan itself (the distribution strategy is made from it)."""
    t, d = config.training, config.data
    facts = detect_machine()
    plan = plan_for_machine(
        facts,
        model_size=config.model.size,
        requested=RequestedSettings(
            batch_size=d.batch_size,
            gradient_accumulation_steps=t.gradient_accumulation_steps,
            num_workers=d.num_workers,
            precision=t.precision,
            effective_batch_size=t.effective_batch_size,
            xla=t.enable_xla_compilation,
        ),
    )
    # The replicas of every host share the effective batch; then measure the batch on this GPU model
    # (cached, and before this process claims GPU memory).
    plan = distribute.with_replicas(plan, distribute.planned_replicas(plan))
    plan = probe_batch_size(config, plan, facts, child_module=batch_probe.__name__, echo=echo)
    echo(short_summary(plan, facts))
    resolved = dataclasses.replace(
        config,
        data=dataclasses.replace(d, batch_size=plan.batch_size, num_workers=plan.num_parallel_calls),
        training=dataclasses.replace(t, gradient_accumulation_steps=plan.gradient_accumulation_steps),
    )
    if plan.tf32:
        tf.config.experimental.enable_tensor_float_32_execution(True)
    return resolved, plan.precision, plan  # a Keras policy name; an explicit training.precision is honoured by the plan


def load_splits(config: Config):
    d = config.data
    if not d.train_data:
        raise config_lib.ConfigError("no training data: set data.train_data or pass --train-data (or use --demo)")
    train = read_manifest(d.train_data)
    if d.val_data:
        return train, read_manifest(d.val_data)
    return split_train_val(train, d.val_fraction, config.seed)


def train(config: Config, workdir: str | Path, *, resume: str = "auto", epochs: float | None = None, echo=console_echo) -> TrainResult:
    """Train (or resume) in `workdir`. `resume`: "auto" (if a checkpoint exists), "require", "reset".

    `epochs`, when given, replaces training.max_steps by that many passes over the training set.
    Out of GPU memory with an automatic batch size, the micro-batch is halved and accumulation
    doubled (the same effective batch), and training continues from the last checkpoint.
    """
    workdir = Path(workdir)
    if resume == "reset" and (workdir / "checkpoints").exists():
        shutil.rmtree(workdir / "checkpoints")
        echo(f"--reset-training: removed {workdir / 'checkpoints'}")
    workdir.mkdir(parents=True, exist_ok=True)

    if config.data.text_frontend == "phonemes":
        check_language(config.data.language)  # a typo fails here, not after the hardware probe
    allow_memory_growth(echo)  # before any GPU work (detection only lists devices)
    automatic_batch = config.data.batch_size == 0
    config, policy, plan = resolve_plan(config, echo)
    # Before any other TensorFlow work: MultiWorkerMirroredStrategy configures the runtime.
    strategy = distribute.strategy_for(plan)
    if distribute.replicas(strategy) != plan.num_replicas:
        raise ValueError(f"the plan expects {plan.num_replicas} replicas but the strategy has "
                         f"{distribute.replicas(strategy)}: give every host the same number of GPUs (--gpu)")
    echo(distribute.describe(strategy))
    if not distribute.is_chief(strategy):
        workdir = distribute.worker_directory(workdir, strategy)  # every worker saves; only the chief's copy counts
        if resume == "reset" and (workdir / "checkpoints").exists():
            shutil.rmtree(workdir / "checkpoints")
        workdir.mkdir(parents=True, exist_ok=True)
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)

    train_rows, val_rows = load_splits(config)
    if epochs is not None:
        steps = batch_plan_of(config, distribute.replicas(strategy)).updates_for(epochs * len(train_rows))
        config = dataclasses.replace(config, training=dataclasses.replace(config.training, max_steps=steps))
    train_rows, val_rows, vocabulary = prepare_text(config, workdir, train_rows, val_rows, rebuild_vocabulary=resume == "reset")
    echo(f"data: {len(train_rows)} training and {len(val_rows)} validation clips, vocabulary of {len(vocabulary)} tokens")

    strict_restore = True
    while True:
        config_lib.save_config(config, workdir / "config.yaml")
        try:
            return _fit(config, policy, strategy, workdir, train_rows, val_rows, vocabulary, resume, strict_restore, echo)
        except tf.errors.ResourceExhaustedError:
            d, t = config.data, config.training
            if not automatic_batch or d.batch_size == 1:
                raise OutOfMemory(
                    f"out of memory at data.batch_size {d.batch_size}: set data.batch_size lower (or 0 for automatic "
                    f"back-off) and raise training.gradient_accumulation_steps to keep the effective batch; "
                    f"training.precision: bf16 or fp16 also halves activation memory"
                ) from None
            current = batch_plan_of(config, distribute.replicas(strategy))
            smaller = current.halved()
            effective = ("same effective batch" if smaller.samples_per_update == current.samples_per_update else
                         f"effective batch {current.samples_per_update} -> {smaller.samples_per_update}")
            echo(f"out of memory at batch {d.batch_size}: continuing from the last checkpoint with batch "
                 f"{smaller.batch_size} x accumulation {smaller.accumulation} ({effective})")
            config = dataclasses.replace(
                config,
                data=dataclasses.replace(d, batch_size=smaller.batch_size),
                training=dataclasses.replace(t, gradient_accumulation_steps=smaller.accumulation),
            )
            resume = "auto"
            strict_restore = False  # the optimizer now has accumulators the checkpoint lacks


def batch_plan_of(config: Config, replicas: int) -> BatchPlan:
    """The resolved config's batch x accumulation x `replicas` (the strategy's count)."""
    return BatchPlan(config.data.batch_size, max(config.training.gradient_accumulation_steps, 1), replicas)


def prepare_text(config: Config, workdir: Path, train_rows, val_rows, *, rebuild_vocabulary: bool = False):
    """The rows with their model texts ready, and the run's vocabulary (workdir/vocab.txt).

    With `data.text_frontend: phonemes`, rows without phonemes (a raw LJSpeech folder) are phonemized
    here, once, before any graph is built, and cached in workdir/phonemes.json for a resumed run.
    The vocabulary of a run is fixed at its start, since a resumed run must tokenise the same way;
    `rebuild_vocabulary` (--reset-training) builds it again from the training rows.
    """
    d = config.data
    if d.text_frontend == "phonemes":
        rows = phonemize_utterances(train_rows + val_rows, d.language, cache_path=workdir / "phonemes.json", progress=True)
        train_rows, val_rows = rows[: len(train_rows)], rows[len(train_rows) :]
    vocab_path = workdir / "vocab.txt"
    if vocab_path.exists() and not rebuild_vocabulary:
        _check_same_text_frontend(workdir, d)
        vocabulary = Vocabulary.load(vocab_path)
    else:
        vocabulary = Vocabulary.from_texts(model_texts(train_rows, d.text_frontend), frontend=d.text_frontend)
    vocabulary.save(vocab_path)
    return train_rows, val_rows, vocabulary


def _check_same_text_frontend(workdir: Path, d) -> None:
    """A run's vocab.txt holds the tokens of the front end it started with; a resumed run that read
    text another way would look every token up wrong without any error."""
    saved_path = workdir / "config.yaml"
    if not saved_path.exists():
        return
    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8"))
    saved_data = saved.get("data") if isinstance(saved, dict) and isinstance(saved.get("data"), dict) else {}
    before = (config_lib.saved_text_frontend(saved), saved_data.get("language", d.language))
    now = (d.text_frontend, d.language)
    if before[0] != now[0] or (now[0] == "phonemes" and before[1] != now[1]):
        raise ValueError(
            f"{workdir} was started with data.text_frontend={before[0]}, data.language={before[1]} and its "
            f"vocab.txt holds those tokens; this run asks for {now[0]}, {now[1]}: pass --reset-training "
            "(starts over), another --output-dir, or the run's own settings"
        )


class OutOfMemory(RuntimeError):
    pass


def _fit(config: Config, policy: str, strategy, workdir: Path, train_rows, val_rows, vocabulary, resume: str,
         strict_restore: bool, echo) -> TrainResult:
    """One attempt: build model, optimizer and datasets for the config's batch, restore, fit."""
    t, d = config.training, config.data
    accumulation = max(t.gradient_accumulation_steps, 1)
    train_ds = build_dataset(config, train_rows, training=True, vocabulary=vocabulary, gpu_copy=False)
    val_ds = build_dataset(config, val_rows, training=False, vocabulary=vocabulary) if val_rows else None
    if val_ds is not None:
        val_ds = distribute.evenly_split(val_ds, strategy)
    first_batch = next(iter(train_ds.take(1)), None)
    if first_batch is None:
        raise ValueError(
            f"the {len(train_rows)} training clips do not fill one batch of {d.batch_size}: clips outside "
            f"data.min_duration_s / data.max_duration_s ({d.min_duration_s}-{d.max_duration_s} s) are dropped, and with "
            "data.bucketing each length bucket fills its own batches; lower data.batch_size (--batch-size) or add data")
    model = build_training_model(config, len(vocabulary), policy, first_batch, strategy)
    replicas = distribute.replicas(strategy)
    network, optimizer = model.network, model.optimizer

    checkpoints = Checkpoints(workdir / "checkpoints", network, optimizer, t.optimizer, yaml.safe_dump(config_lib.to_dict(config)))
    start_step = 0
    if resume != "reset":
        try:
            with strategy.scope():
                restored = checkpoints.restore(strict=strict_restore)
        except CheckpointError:
            if resume == "require":
                raise CheckpointError(f"--resume: no checkpoint to resume in {workdir / 'checkpoints' / 'latest'}") from None
        else:
            echo(restored.message)
            start_step = optimizer_step(model)
    if start_step >= t.max_steps:
        echo(f"already at step {start_step} >= training.max_steps ({t.max_steps}); raise --max-steps to train further")

    samples_per_update = batch_plan_of(config, replicas).samples_per_update
    progress = ProgressLogger(t.log_interval, t.max_steps, samples_per_update, str(workdir / "logs" / "train"), echo)
    # Resume also continues the data order: replay the seeded stream up to where it stopped
    # (cheap with data.cache_features; it recomputes the skipped batches' features without).
    micro_steps_done = start_step * accumulation
    if replicas == 1:
        train_stream = train_ds.repeat().skip(micro_steps_done)
        if copies_to_gpu(d):
            # The copy to the GPU must be the last stage, and a clock inside the pipeline would time
            # its background thread, not the step: time the step's fetch from the GPU buffer instead.
            train_stream = to_device(train_stream, d)
            progress.watch_fetches(model)
        else:
            train_stream = progress.watch_input(train_stream)
    else:
        def host_stream(batch_size, shard, shards):
            # This host's share of the clips, batched per replica; the distributed iterator moves
            # each batch to its device, so the pipeline itself must not prefetch to a GPU.
            local = dataclasses.replace(config, data=dataclasses.replace(d, batch_size=batch_size))
            stream = build_dataset(local, train_rows[shard::shards], training=True, vocabulary=vocabulary, gpu_copy=False)
            return stream.repeat().skip(micro_steps_done * replicas // shards)  # the batches this host already served

        # A distributed dataset takes no further stages: no input_wait_ms with several replicas.
        train_stream = distribute.distribute_dataset(strategy, d.batch_size, host_stream)

    guard = NonFiniteGuard(t.max_nonfinite_steps, echo)
    saver = CheckpointSaver(checkpoints, t.checkpoint_interval, echo, guard)
    per_call = max(t.steps_per_execution, 1)
    callbacks = [
        StopAtStep(t.max_steps),
        guard,
        progress,
        saver,
        # Keras' TensorBoard counts calls (of steps_per_execution micro-batches each).
        keras.callbacks.TensorBoard(str(workdir / "logs"), update_freq=max(1, math.ceil(t.log_interval * accumulation / per_call))),
    ]
    speech_check = _speech_check(config, network, train_rows, val_rows, vocabulary, workdir, echo)
    if speech_check is not None:
        callbacks.insert(0, speech_check)  # val_wer must be in the logs before they are printed and saved
    # Keras counts micro-batches, and ends an epoch only after a whole call of steps_per_execution of
    # them (an epoch of 10 runs 12 at 4 per call). So an epoch is one validation interval with one
    # micro-batch per call, and one call otherwise, validating when a call crosses an interval.
    epoch_length = t.eval_interval * accumulation if per_call == 1 else per_call
    validation = {}
    if start_step == 0 and val_ds is not None:
        # The untrained model's validation losses: the baseline every later value is judged against.
        initial = model.evaluate(val_ds, verbose=0, return_dict=True)
        progress.record_validation(0, initial)
    if start_step < t.max_steps:
        history = model.fit(
            train_stream,
            steps_per_epoch=epoch_length,
            epochs=math.ceil(t.max_steps * accumulation / epoch_length),
            initial_epoch=micro_steps_done // epoch_length,
            validation_data=val_ds,
            validation_freq=ValidationSchedule(saver, t.eval_interval, start_step, every_epoch=per_call == 1),
            callbacks=callbacks,
            verbose=0,
        )
        validation = {k: v[-1] for k, v in history.history.items() if k.startswith("val_")}
    return TrainResult(
        step=optimizer_step(model),
        history=progress.history,
        validation=validation,
        validation_history=progress.validation_history,
        stopped_for_nonfinite=guard.tripped,
        interrupted_by=saver.interrupted_by,
        workdir=workdir,
        train_function_traces=model.train_step_traces,
        batch_size=d.batch_size,
        gradient_accumulation_steps=accumulation,
    )


def _speech_check(config: Config, network, train_rows, val_rows, vocabulary, workdir: Path, echo):
    """The callback that speaks held-out sentences at each validation (None when there is nothing
    to do): `training.wer_sentences` of them measured by the recognizer, the first one logged to
    TensorBoard with `training.log_samples`."""
    t = config.training
    if not val_rows or not (t.wer_sentences or t.log_samples):
        return None
    from myxtts.evaluation.intelligibility import IntelligibilityScorer, skip_reason
    from myxtts.evaluation.speech import HeldOutSentences

    scorer = None
    if t.wer_sentences:
        reason = skip_reason(config.data.language)
        if reason:
            echo(f"val_wer: {reason}")
        else:
            # The corpus's own sentences are the recognizer's language model (see intelligibility.py).
            scorer = IntelligibilityScorer([u.text for u in train_rows + val_rows], config.data.language)
    sentences = HeldOutSentences.from_rows(val_rows, train_rows, vocabulary, config, limit=t.wer_sentences or 1)
    samples_dir = str(workdir / "logs" / "samples") if t.log_samples else None
    return SpeechCheck(network, sentences, scorer, samples_dir, echo)


def build_training_model(config: Config, vocab_size: int, policy: str, sample_batch: dict,
                         strategy: tf.distribute.Strategy | None = None) -> TrainingModel:
    """Network, optimizer (accumulation; loss scaling under float16) and compile settings, with every
    variable created from one real batch. The caller has set the Keras dtype policy to `policy`.

    Variables must exist before a checkpoint is restored into them, and the step applies gradients
    under `tf.cond`, where variables cannot be created.
    """
    t = config.training
    strategy = strategy or tf.distribute.get_strategy()
    with distribute.training_scope(strategy):
        model = TrainingModel(network_for(config, vocab_size), data_config=config.data)
        optimizer = build_optimizer(t, max(t.gradient_accumulation_steps, 1))
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=distribute.prepare_optimizer(optimizer, strategy),
            jit_compile=bool(t.enable_xla_compilation) and distribute.xla_allowed(strategy),
            run_eagerly=not t.enable_graph_mode,
            steps_per_execution=t.steps_per_execution,
        )
        model(sample_batch, training=False)
        model.optimizer.build(model.network.trainable_variables)
    return model
