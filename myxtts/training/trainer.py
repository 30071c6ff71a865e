"""`train(config, workdir)`: everything between a config and a trained, checkpointed model.

    hardware plan -> strategy, precision policy -> rows + vocabulary (run_setup.py) -> model + optimizer
      -> resume from the newest intact checkpoint (one that does not fit stops here) or start (from
         training.init_from's weights)
      -> only now write to the run folder -> datasets -> Model.fit(step-based "epochs" of
         `eval_interval` updates) -> checkpoints

Keras "epochs" here are validation intervals, not passes over the data: the training set repeats
forever and the run ends at `training.max_steps` optimizer updates, so resuming, accumulation and
data size never change what a step means. With `training.steps_per_execution` > 1 an epoch is one
call of that many micro-batches, and validation runs after the first call that crosses an interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf
import yaml

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.data.phonemes import check_language
from myxtts.data.pipeline import Epochs, copies_to_gpu, first_batch, to_device
from myxtts.models.xtts import network_for
from myxtts.output_paths import folder_problem
from myxtts.training.callbacks import (CheckpointSaver, NonFiniteGuard, ProgressLogger, SpeechCheck, StopAtStep,
                                       ValidationSchedule, console_echo, optimizer_step, validation_key)
from myxtts.training import distribute
from myxtts.training.compile_log import CompileTimer, RunClock
from myxtts.training.checkpoint_fallback import CheckpointRefused, CheckpointsDamaged, restore_newest
from myxtts.training.checkpoints import Checkpoints, CheckpointError, DiskFull, is_disk_full
from myxtts.training.init_from import InitSource, initialize_from
from myxtts.training.run_folder import (WAYS_OUT, RunText, check_reset_source, finish_reset, reset_run,
                                        settings_changed, undo_reset)
from myxtts.training.run_lock import LOCK_FILE, run_folder_lock
from myxtts.training.run_setup import (batch_plan_of, check_validation_inputs, prepare_run, resolve_plan,
                                       starting_point)
from myxtts.training.service_watchdog import watchdog_for
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


def train(config: Config, workdir: str | Path, *, resume: str = "auto", epochs: float | None = None, echo=console_echo,
          started: float | None = None) -> TrainResult:
    """Train (or resume) in `workdir`. `resume`: "auto" (if a checkpoint exists), "require", "reset".
    `started`: the `time.perf_counter()` the log's closing "time:" line counts from (default: now).

    `epochs`, when given, replaces training.max_steps by that many passes over the training set.
    Out of GPU memory with an automatic batch size, the micro-batch is halved and accumulation
    doubled (the same effective batch), and training continues from the last checkpoint.

    A run folder whose checkpoint does not fit this config (another model size or vocabulary, a
    missing meta file) stops the run before anything in the folder is written or deleted. With
    `training.init_from` and no checkpoint of its own, the run starts from another run's weights.
    A folder another training is using stops the run before anything is read or written
    (`run_lock.RunFolderBusy`, naming that training's pid).
    """
    started = time.perf_counter() if started is None else started
    workdir = Path(workdir)
    if problem := folder_problem(workdir, "the run folder (--output-dir)"):
        raise ValueError(problem)
    made = not workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return _locked(config, workdir, resume, epochs, echo, started)
    except BaseException:
        if made:
            _remove_if_unused(workdir)  # a run that stopped before writing (a missing corpus) leaves no folder
        raise
    finally:
        # The run sets its precision as Keras' global policy; what follows in this process (the demo's
        # closing sample, a caller's synthesis) computes in float32, as utilities/synthesize.py does.
        keras.config.set_dtype_policy("float32")


def _locked(config: Config, workdir: Path, resume: str, epochs: float | None, echo, started: float) -> TrainResult:
    with contextlib.ExitStack() as held:
        # The lock comes first: a second training in the folder stops before it writes, or with
        # --reset-training deletes, anything. Other workers of a cluster lock their own folder below.
        chief = _is_chief_by_environment()
        if chief:
            held.enter_context(run_folder_lock(workdir, echo))
            if resume == "reset":
                check_reset_source(config, workdir)
                reset_run(workdir, echo)
            else:
                undo_reset(workdir, echo)  # a reset whose run was killed before it wrote: the old run is back
        try:
            return _train(config, workdir, resume, epochs, echo, held, started)
        except BaseException:
            if chief:
                undo_reset(workdir, echo)  # nothing, once the new run has written (finish_reset)
            raise


def _remove_if_unused(workdir: Path) -> None:
    """Removes the folder `train()` made when it holds nothing but its lock file."""
    try:
        if {p.name for p in workdir.iterdir()} <= {LOCK_FILE}:
            (workdir / LOCK_FILE).unlink(missing_ok=True)
            workdir.rmdir()
    except OSError:  # another process wrote there meanwhile: it is theirs
        pass


def _train(config: Config, workdir: Path, resume: str, epochs: float | None, echo, held: contextlib.ExitStack,
           started: float) -> TrainResult:
    """`train` once the run folder is locked; `held` keeps the locks (a worker's own folder's too) to the end."""
    automatic_batch = config.data.batch_size == 0
    if config.data.text_frontend == "phonemes":
        check_language(config.data.language)  # a typo fails here, not after the hardware probe
    # So do --resume without a checkpoint and an --init-from naming none (prepare_run asks again; another
    # worker of a cluster keeps its checkpoints in a folder of its own, known only once the strategy is).
    if _is_chief_by_environment():
        starting_point(config, workdir, "require" if resume == "require" else "auto")
    check_validation_inputs(config)
    config, policy, plan = resolve_plan(config, echo)
    # Before any other TensorFlow work: MultiWorkerMirroredStrategy configures the runtime.
    strategy = distribute.strategy_for(plan)
    if distribute.replicas(strategy) != plan.num_replicas:
        raise ValueError(f"the plan expects {plan.num_replicas} replicas but the strategy has "
                         f"{distribute.replicas(strategy)}: give every host the same number of GPUs (--gpu)")
    echo(distribute.describe(strategy))
    if not distribute.is_chief(strategy):
        workdir = distribute.worker_directory(workdir, strategy)  # every worker saves; only the chief's copy counts
        workdir.mkdir(parents=True, exist_ok=True)
        held.enter_context(run_folder_lock(workdir, echo))
        if resume == "reset":
            reset_run(workdir, echo=lambda message: None)
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)

    run = prepare_run(config, workdir, resume="require" if resume == "require" else "auto", echo=echo)
    if epochs is not None:
        steps = batch_plan_of(config, distribute.replicas(strategy)).updates_for(epochs * len(run.text.train_rows))
        config = dataclasses.replace(config, training=dataclasses.replace(config.training, max_steps=steps))
    text, source = run.text, run.source

    while True:
        try:
            return _fit(config, policy, strategy, workdir, text, source, echo, started)
        except tf.errors.ResourceExhaustedError as error:
            if is_disk_full(error):  # TensorFlow's status for ENOSPC too (a cache or log file; checkpoints say it themselves)
                raise DiskFull(f"the disk is full, not the memory: {str(error).strip().splitlines()[0][:400]}. Free space "
                               f"on the disk holding that file and re-run the same command to resume from the last "
                               f"checkpoint in {workdir / 'checkpoints'}") from None
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
            )  # the restore continues at the checkpoint's update, whatever the accumulation (Checkpoints.restore)


UNTIL_STOPPED = 2**31 - 1  # Keras' epochs for a fit that a callback ends


class OutOfMemory(RuntimeError):
    pass


def _is_chief_by_environment() -> bool:
    """Whether this process writes the run folder itself (distribute.is_chief), told from TF_CONFIG:
    the lock is taken before the hardware plan, and the strategy can only be made after it."""
    if not os.environ.get("TF_CONFIG"):
        return True
    role = distribute.parse_tf_config(os.environ["TF_CONFIG"])
    return role.task_type == "chief" or (role.task_type == "worker" and role.task_id == 0)


def _fit(config: Config, policy: str, strategy, workdir: Path, text: RunText, source: InitSource | None,
         echo, started: float) -> TrainResult:
    """One attempt: build model and optimizer for the config's batch, restore (or initialize), and only
    then write to the run folder, build the datasets and fit."""
    t, d = config.training, config.data
    accumulation = max(t.gradient_accumulation_steps, 1)
    sample = first_batch(config, text.train_rows, text.vocabulary)  # NoFullBatch when the clips fill none
    model = build_training_model(config, len(text.vocabulary), policy, sample, strategy,
                                 silent_token=text.vocabulary.word_boundary_id)
    replicas = distribute.replicas(strategy)
    network, optimizer = model.network, model.optimizer

    checkpoints = Checkpoints(workdir / "checkpoints", network, optimizer, t.optimizer, yaml.safe_dump(config_lib.to_dict(config)))
    start_step = _restore_or_initialize(checkpoints, model, config, workdir, source, text, strategy, echo)
    # The folder is this run's: from here on it may be written.
    finish_reset(workdir, echo)
    text.save(workdir)
    config_lib.save_config(config, workdir / "config.yaml")
    if start_step >= t.max_steps:
        echo(f"already at step {start_step} >= training.max_steps ({t.max_steps}); raise --max-steps to train further")

    feature_cache = workdir / "feature_cache"  # used only when the features outgrow RAM (feature_cache.py)
    val_ds = None
    if text.val_rows:
        val_epochs = Epochs(config, text.val_rows, training=False, vocabulary=text.vocabulary,
                            fallback_cache_dir=feature_cache, echo=echo)
        val_ds = to_device(val_epochs.one_pass(), d)  # one_pass reports the clips the limits leave out
        if _validates_any(val_epochs, replicas, echo):
            val_ds = distribute.evenly_split(val_ds, strategy)
        else:
            val_ds = None
    samples_per_update = batch_plan_of(config, replicas).samples_per_update
    progress = ProgressLogger(t.log_interval, t.max_steps, samples_per_update, str(workdir / "logs" / "train"), echo)
    # Resume continues the data order: epoch e of the stream is a function of the seed, so the
    # stream starts at the resumed epoch and skips only the batches of it already trained on.
    micro_steps_done = start_step * accumulation
    _fit_calls_to_max_steps(model, t, micro_steps_done, accumulation, echo)
    if replicas == 1:
        epochs = Epochs(config, text.train_rows, training=True, vocabulary=text.vocabulary,
                        fallback_cache_dir=feature_cache, echo=echo)
        train_stream = epochs.stream(micro_steps_done)
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
            epochs = Epochs(local, text.train_rows[shard::shards], training=True, vocabulary=text.vocabulary,
                            fallback_cache_dir=feature_cache / f"shard-{shard}", echo=echo)
            return epochs.stream(micro_steps_done * replicas // shards)  # after the batches this host already served

        # A distributed dataset takes no further stages: no input_wait_ms with several replicas.
        train_stream = distribute.distribute_dataset(strategy, d.batch_size, host_stream)

    guard = NonFiniteGuard(t.max_nonfinite_steps, echo)
    saver = CheckpointSaver(checkpoints, t.checkpoint_interval, echo, guard,
                            validation=validation_key(text.val_rows, t.wer_sentences, t.vocoder))
    per_call = max(model.steps_per_execution, 1)  # 1 with several replicas (distribute.steps_per_execution)
    compile_timer = CompileTimer(echo, xla=bool(model.jit_compile))
    clock = RunClock(compile_timer, echo, started)
    callbacks = [
        StopAtStep(t.max_steps),
        compile_timer,
        guard,
        progress,
        saver,
        # Keras' TensorBoard counts calls (of steps_per_execution micro-batches each).
        keras.callbacks.TensorBoard(str(workdir / "logs"), update_freq=max(1, math.ceil(t.log_interval * accumulation / per_call))),
    ]
    watchdog = watchdog_for(config, checkpoints, echo)  # a tf.data service that stops serving ends the run
    if watchdog is not None:
        callbacks.append(watchdog)  # after the saver: the saver's on_train_end saves before the watchdog's raises
    speech_check = _speech_check(config, network, text.train_rows, text.val_rows, text.vocabulary, workdir, echo)
    if speech_check is not None:
        callbacks.insert(0, speech_check)  # val_wer must be in the logs before they are printed and saved
    callbacks.append(clock)  # last: its closing line counts the saver's final save
    # Keras counts micro-batches, and ends an epoch only after a whole call of steps_per_execution of
    # them (an epoch of 10 runs 12 at 4 per call). So an epoch is one validation interval with one
    # micro-batch per call, and one call otherwise, validating when a call crosses an interval.
    epoch_length = t.eval_interval * accumulation if per_call == 1 else per_call
    validation = {}
    if start_step == 0 and val_ds is not None:
        # The untrained model's validation losses: the baseline every later value is judged against.
        with clock.timed("at step 0"):
            initial = model.evaluate(val_ds, verbose=0, return_dict=True)
        progress.record_validation(0, initial)
    if start_step < t.max_steps:
        try:
            history = model.fit(
                train_stream,
                steps_per_epoch=epoch_length,
                # No last epoch: StopAtStep ends the run at max_steps updates however many micro-batches
                # that takes (a skipped non-finite step, fp16's overflow now and then, updates nothing).
                epochs=UNTIL_STOPPED,
                initial_epoch=micro_steps_done // epoch_length,
                validation_data=val_ds,
                validation_freq=ValidationSchedule(saver, t.eval_interval, start_step, every_epoch=per_call == 1),
                callbacks=callbacks,
                verbose=0,
            )
        except tf.errors.ResourceExhaustedError as error:
            if not is_disk_full(error):
                saver.keep_progress("out of memory")  # the back-off, or the user's next run, goes on from it
            raise
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


def _validates_any(val_epochs: Epochs, replicas: int, echo) -> bool:
    """Whether a validation pass keeps any clip once its batches are trimmed to a multiple of the
    replicas (`distribute.evenly_split`), saying how many it leaves out. Every clip alone in its length
    bucket with 2 GPUs left nothing: the run validated never, kept no best_mel, and said nothing of it."""
    if replicas == 1:
        return True
    sizes = val_epochs.group_sizes()
    clips, kept = sum(sizes), distribute.clips_in_even_batches(sizes, val_epochs.batch_size, replicas)
    if kept == clips:
        return True
    trimmed = (f"each validation batch is cut to a multiple of the {replicas} replicas (a clip more would leave "
               f"one of them an empty batch)")
    if kept:
        echo(f"data: {clips - kept} of the {clips} validation clips are left out of every validation: {trimmed}")
        return True
    echo(f"data: no validation clip is left to validate: {trimmed}, and the {clips} clips fill no such batch of "
         f"their length buckets. This run logs no val_ losses and keeps no best_mel checkpoint: give it more "
         f"validation clips (data.val_fraction or data.val_data)")
    return False


def steps_per_call(requested: int, micro_batches_left: int, checkpoint_micro_batches: int) -> int:
    """Micro-batches per compiled call: at most `requested`, at most one checkpoint interval, and a
    divisor of the micro-batches left to `training.max_steps`.

    Keras runs every call whole (4 per call from update 20 of 22 ended at 24, measured with Keras
    3.15), and callbacks, the only place a run can stop, log or save, run between calls: a call longer
    than a checkpoint interval would leave Ctrl-C and SIGTERM unanswered, and the console silent, for
    longer than the interval the user chose (steps_per_execution: 100000 went quiet for the whole run).
    """
    if micro_batches_left <= 0:
        return 1
    longest = max(1, min(requested, checkpoint_micro_batches, micro_batches_left))
    return next(n for n in range(longest, 0, -1) if micro_batches_left % n == 0)


def _fit_calls_to_max_steps(model, t, micro_steps_done: int, accumulation: int, echo) -> None:
    """Lower the model's steps per call where `steps_per_call` must, saying why. Before `fit` builds
    its train function, which reads the value when it is traced."""
    requested = max(model.steps_per_execution, 1)
    left = t.max_steps * accumulation - micro_steps_done
    per_call = steps_per_call(requested, left, t.checkpoint_interval * accumulation)
    if per_call == requested:
        return
    if requested > t.checkpoint_interval * accumulation:
        why = (f"a call runs whole before Ctrl-C, SIGTERM or a checkpoint is heard, so it is kept within "
               f"training.checkpoint_interval ({t.checkpoint_interval} updates)")
    else:
        def whole_calls(max_steps):  # a max_steps the requested calls end at exactly
            return max_steps * accumulation > micro_steps_done and (max_steps * accumulation - micro_steps_done) % requested == 0

        nearest = [next((m for m in steps if whole_calls(m)), None)
                   for steps in (range(t.max_steps - 1, 0, -1), range(t.max_steps + 1, t.max_steps + requested + 1))]
        nearest = [str(m) for m in nearest if m is not None]
        hint = f" (training.max_steps {' or '.join(nearest)} keeps {requested})" if nearest else ""
        why = (f"Keras runs every call whole, so calls of {requested} would train past training.max_steps "
               f"({t.max_steps}); {per_call} divides the {left} micro-batches left{hint}")
    echo(f"training.steps_per_execution {requested} -> {per_call}: {why}")
    model.steps_per_execution = per_call


def _restore_or_initialize(checkpoints: Checkpoints, model, config: Config, workdir: Path, source: InitSource | None,
                           text: RunText, strategy, echo) -> int:
    """The step to start at: the run's newest intact checkpoint restored (damaged newer ones are
    skipped and moved aside, checkpoint_fallback.py), else 0 (from `source`'s weights when
    fine-tuning). A checkpoint that does not fit, or none intact, stops the run, nothing written."""
    try:
        with strategy.scope():
            resume = restore_newest(checkpoints)
    except CheckpointsDamaged as error:
        raise CheckpointsDamaged(
            f"{workdir}: {error}. Nothing in it was written or deleted. Start over there with --reset-training "
            f"(deletes them), or train in a new folder (--output-dir NEW)") from None
    except CheckpointRefused as error:
        cause = str(error).rstrip(".")
        raise CheckpointError(f"{workdir} holds a checkpoint this run cannot continue from: {cause}."
                              f"{settings_changed(error.path, config)}\n{WAYS_OUT.format(run=workdir)}") from None
    for message in resume.messages:
        echo(message)
    if resume.restored is None:
        if source is not None:
            with strategy.scope():
                echo(initialize_from(model.network, source, text.vocabulary).message())
        return 0
    echo(resume.restored.message)
    return optimizer_step(model)


def _speech_check(config: Config, network, train_rows, val_rows, vocabulary, workdir: Path, echo):
    """The callback that speaks held-out sentences at each validation (None when there is nothing
    to do): `training.wer_sentences` of them measured by the recognizer, the first one logged to
    TensorBoard with `training.log_samples`."""
    t = config.training
    if not val_rows or not (t.wer_sentences or t.log_samples or (config.data.unseen_voices_data and t.voice_sentences)):
        return None
    from myxtts.evaluation.intelligibility import IntelligibilityScorer, default_workers, skip_reason
    from myxtts.evaluation.speech import HeldOutSentences
    from myxtts.evaluation.voices import unseen_voices_for

    scorer = None
    if t.wer_sentences:
        reason = skip_reason(config.data.language)
        if reason:
            echo(f"val_wer: {reason}")
        else:
            # The corpus's own sentences are the recognizer's language model (see intelligibility.py).
            scorer = IntelligibilityScorer([u.text for u in train_rows + val_rows], config.data.language,
                                           workers=default_workers(min(t.wer_sentences, len(val_rows))))
    vocoder = None
    if t.vocoder:
        from myxtts.models.vocoder import load_vocoder

        vocoder = load_vocoder(t.vocoder, config.data)
        echo(f"validation speaks through the neural vocoder in {t.vocoder} (training.vocoder)")
    sentences = HeldOutSentences.from_rows(val_rows, train_rows, vocabulary, config, limit=t.wer_sentences or 1,
                                           vocoder=vocoder)
    samples_dir = str(workdir / "logs" / "samples") if t.log_samples else None
    return SpeechCheck(network, sentences, scorer, samples_dir, echo,
                       voices=unseen_voices_for(config, train_rows, vocabulary, echo, vocoder=vocoder))


def build_training_model(config: Config, vocab_size: int, policy: str, sample_batch: dict,
                         strategy: tf.distribute.Strategy | None = None, silent_token: int = -1) -> TrainingModel:
    """Network, optimizer (accumulation; loss scaling under float16) and compile settings, with every
    variable created from one real batch. The caller has set the Keras dtype policy to `policy`.

    Variables must exist before a checkpoint is restored into them, and the step applies gradients
    under `tf.cond`, where variables cannot be created.
    """
    t = config.training
    strategy = strategy or tf.distribute.get_strategy()
    with distribute.training_scope(strategy):
        model = TrainingModel(network_for(config, vocab_size, silent_token), data_config=config.data)
        optimizer = build_optimizer(t, max(t.gradient_accumulation_steps, 1))
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=distribute.prepare_optimizer(optimizer, strategy),
            jit_compile=bool(t.enable_xla_compilation) and distribute.xla_allowed(strategy),
            run_eagerly=not t.enable_graph_mode,
            steps_per_execution=distribute.steps_per_execution(t.steps_per_execution, strategy),
        )
        model(sample_batch, training=False)
        model.optimizer.build(model.network.trainable_variables)
    return model
