"""The start every user of a run shares, so that none of them sees the data differently.

    resolve_plan(config)          GPU memory growth, then the hardware plan's automatic values
                                  (batch, accumulation, input workers, precision), the input route
                                  (hardware.input_route; on a GPU, the capacity plan's, from a
                                  calibration of this host, cached), then the GPU batch and the
                                  CPU precision measured in child processes (cached)
    prepare_run(config, workdir)  language checked -> rows split -> rows phonemized once ->
                                  the vocabulary (the run's own when it resumes, the init_from
                                  source's tokens first when it fine-tunes) -> Run

`train()` resolves the plan, makes its distribution strategy from it, then prepares the run and
fits. The diagnosis (diagnostics/training_setup.py) does the same without a run folder and times
the step instead of fitting. The held-out evaluations of a trained run (synthesis.validation_sample,
utilities/free_running_check.py) prepare it from its own folder, which it must have checkpoints in.

Nothing here writes to the run folder: `Run.text.save` does, once the trainer knows the folder's
checkpoint (if any) fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from myxtts.config import Config, ConfigError
from myxtts.data.audio import data_problem
from myxtts.data.manifest import ManifestError, locate_manifest
from myxtts.data.pipeline import NoFullBatch
from myxtts.data.splits import load_splits
from myxtts.data.phonemes import check_language
from myxtts.diagnostics import alignment_timing, capacity
from myxtts.data.text import Vocabulary
from myxtts.hardware.batch_plan import BatchPlan
from myxtts.hardware.cpu_precision import probe_cpu_precision
from myxtts.hardware.detect import MachineFacts, detect_machine
from myxtts.hardware.devices import device_for_gpu_name
from myxtts.hardware.loop_cost import FALLBACK as FALLBACK_LOOP_COST
from myxtts.hardware.plan import Plan, RequestedSettings, plan_for_machine
from myxtts.hardware.probe_runner import probe_batch_size
from myxtts.hardware.report import short_summary
from myxtts.models.alignment import AlignmentLoops
from myxtts.models.vocoder import check_features, vocoder_settings
from myxtts.hardware.probe import default_cache_dir
from myxtts.startup_noise import start_tensorflow
from myxtts.training import batch_probe, distribute, precision_probe, xla_cache
from myxtts.training.callbacks import console_echo
from myxtts.training.checkpoints import CheckpointError
from myxtts.training.init_from import InitSource, check_same_inputs, load_source
from myxtts.training.run_folder import RunText, check_resumed_inputs, has_checkpoint, prepare_text


def compiled_step_shapes(config: Config) -> int:
    """How many step programs XLA would compile: a train step per bucket when batches are padded to
    buckets (validation runs in graph mode, `TrainingModel.make_test_function`); without bucketing
    every batch length is its own shape (taken as 50)."""
    return len(config.data.bucket_boundaries_s) if config.data.bucketing else 50


def resolve_plan(config: Config, echo=console_echo) -> tuple[Config, str, Plan]:
    """The config with every automatic value filled from the hardware plan, the Keras dtype policy
    name, and the plan (the distribution strategy is made from it).

    The persistent XLA cache is set first, while TensorFlow's runtime has not started (it reads the
    flag then), and GPU memory growth next: the plan's batch probe is the first GPU work, and without
    growth TensorFlow reserves the whole card at its first tensor (other processes, and NVML's view
    of the run, would see it full).
    """
    t, d = config.training, config.data
    facts = detect_machine()  # NVML and /proc: TensorFlow's runtime has not started yet
    _persistent_xla_cache(config, facts, echo)  # before it starts: it reads TF_XLA_FLAGS then
    start_tensorflow(gpu_expected=bool(facts.gpus), echo=echo)  # and the notice a TensorBoard audio would print mid-run
    plan = plan_for_machine(
        facts,
        model_size=config.model.size,
        requested=RequestedSettings(
            batch_size=d.batch_size,
            gradient_accumulation_steps=t.gradient_accumulation_steps,
            num_workers=d.num_workers,
            precision=t.precision,
            effective_batch_size=t.effective_batch_size,
            xla=None if t.enable_xla_compilation == "auto" else t.enable_xla_compilation,
            planned_updates=t.max_steps,
            compiled_shapes=compiled_step_shapes(config),
        ),
    )
    # The probes below can take minutes on their first run: a mistyped data path or a bad row (an empty
    # transcript, say) fails before them. Reading the rows opens no audio: it takes moments.
    train_rows, _ = load_splits(config)
    if d.batch_size > len(train_rows):  # a batch size set larger than the training split: no batch to probe
        raise NoFullBatch(len(train_rows), d)
    # The input route before the batch probe: with mel_on_device a step holds waveforms and the STFT.
    config = apply_input_route(config, facts, echo, graph_mode=not plan.xla)
    d = config.data
    # The replicas of every host share the effective batch; then measure the batch on this GPU model
    # (cached, and before this process claims GPU memory).
    plan = distribute.with_replicas(plan, distribute.planned_replicas(plan))
    plan = probe_batch_size(config, plan, facts, child_module=batch_probe.__name__, echo=echo)
    # On a CPU with precision: auto, float32 against bf16 at that batch (cached per CPU and model).
    plan = probe_cpu_precision(config, plan, facts, child_module=precision_probe.__name__, echo=echo)
    echo(short_summary(plan, facts))
    resolved = dataclasses.replace(
        config,
        data=dataclasses.replace(d, batch_size=plan.batch_size, num_workers=plan.num_parallel_calls),
        training=dataclasses.replace(t, gradient_accumulation_steps=plan.gradient_accumulation_steps,
                                     enable_xla_compilation=plan.xla),
    )
    if plan.tf32:
        tf.config.experimental.enable_tensor_float_32_execution(True)
    return resolved, plan.precision, plan  # a Keras policy name; an explicit training.precision is honoured by the plan


def _persistent_xla_cache(config: Config, facts: MachineFacts, echo) -> None:
    """TensorFlow's persistent XLA cache (hardware.persistent_xla_cache; auto = on GPUs), set before
    this process or a probe's child compiles anything (xla_cache.py)."""
    wanted = config.hardware.persistent_xla_cache
    if not (bool(facts.gpus) if wanted == "auto" else wanted):
        return
    device = facts.gpus[0].name if facts.gpus else f"cpu {facts.cpu_model}"
    echo(xla_cache.enable(xla_cache.cache_directory(default_cache_dir(), device, tf.__version__)))


# The capacity plan prices an XLA step; the demo's graph-mode step on an H200 ate 3.7x less than it
# said (BENCHMARKS.md, "On an H200"), on an H100 about 2.5x less than the XLA step measured.
GRAPH_MODE_NOTE = ("the appetite of an XLA step: this run steps in graph mode, which ate 2.5-3.7x less on an H100 "
                   "and an H200 for the demo's small model")

# What each route sets: (data.cache_features, data.mel_on_device).
ROUTE_KEYS = {"on_the_fly": (False, False), "cached_features": (True, False), "mel_on_device": (False, True)}


def apply_input_route(config: Config, facts: MachineFacts, echo=console_echo, calibrate=None,
                      loop_cost=None, graph_mode: bool = False) -> Config:
    """The config with data.cache_features / data.mel_on_device set by `hardware.input_route`.

    A named route sets them. `auto`, on a GPU the spec-sheet table knows, takes the capacity plan's
    route for it: the host is calibrated on the training corpus (`calibrate(config, progress)`, by
    default `diagnostics.capacity.host_calibration`, timed once per corpus, settings and CPU, then
    read from its cache) and the simplest route whose supply meets the GPU's demand wins. The demand's
    alignment loops cost what they measure on this GPU (`loop_cost(config, progress)`, by default
    `diagnostics.alignment_timing.startup_loop_cost`: timed once per GPU model, then cached), or the
    H100's figure where that timing fails. Anywhere
    else (a CPU, an unknown card, input from a tf.data service) and with `keys`, the two keys stand.
    The demand is an XLA step's, the most a host must feed; with `graph_mode` (the plan's step is not
    XLA-compiled) the log says the run will eat less.
    """
    route = config.hardware.input_route
    if route == "keys" or (route == "auto" and config.data.service_address):
        return config
    if route == "auto":
        device = device_for_gpu_name(facts.gpus[0].name) if facts.gpus else None
        if device is None:
            return config
        if calibrate is None:
            def calibrate(config, progress):
                return capacity.host_calibration(config, progress=progress)
        gpus = len(facts.gpus)  # one input pipeline feeds every replica on this host
        try:
            record = calibrate(config, echo)
        except (ValueError, tf.errors.OpError) as error:  # e.g. a sample that fills no batch: training says more
            problem = data_problem(error) if isinstance(error, tf.errors.OpError) else None
            echo(f"input route: the host calibration failed ({problem or (str(error).splitlines() or [''])[0][:200]}); "
                 "data.cache_features and data.mel_on_device stay as set")
            return config
        if loop_cost is None:
            def loop_cost(config, progress):
                loops = AlignmentLoops.for_device(on_gpu=True, step_compiled=True,
                                                  frames_per_iteration=config.training.alignment_frames_per_iteration)
                return alignment_timing.startup_loop_cost(facts.gpus[0].name, loops, progress=progress)
        try:
            cost = loop_cost(config, echo)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:  # the plan still has a figure to go on
            echo(f"alignment loops: timing them failed ({(str(error).splitlines() or [''])[0][:200]}); "
                 f"the capacity plan takes {FALLBACK_LOOP_COST.seconds_per_frame * 1e6:.1f} us per loop frame")
            cost = FALLBACK_LOOP_COST
        plan = capacity.capacity_plans(config, record, [device], facts, loop_iteration_s=cost.seconds_per_frame,
                                       loop_source=cost.source, gpus=gpus)[0]
        route = plan.choice.route
        echo(f"input route{f' for {gpus} GPUs' if gpus > 1 else ''}: {plan.summary()}"
             + (f" ({GRAPH_MODE_NOTE})" if graph_mode else ""))
    cache_features, mel_on_device = ROUTE_KEYS[route]
    if (config.data.cache_features, config.data.mel_on_device) != (cache_features, mel_on_device):
        echo(f"input route {route} (hardware.input_route: {config.hardware.input_route}): "
             f"data.cache_features={str(cache_features).lower()}, data.mel_on_device={str(mel_on_device).lower()}")
    return dataclasses.replace(config, data=dataclasses.replace(
        config.data, cache_features=cache_features, mel_on_device=mel_on_device))


def batch_plan_of(config: Config, replicas: int) -> BatchPlan:
    """The resolved config's batch x accumulation x `replicas` (the strategy's count)."""
    return BatchPlan(config.data.batch_size, max(config.training.gradient_accumulation_steps, 1), replicas)


@dataclass
class Run:
    """A run ready for its model to be built: the rows as the model reads them, and their vocabulary."""

    config: Config
    workdir: Path | None  # None: a run without a folder (the diagnosis)
    text: RunText  # training and validation rows with their model texts, and the vocabulary
    resuming: bool  # the folder holds a checkpoint of its own, which the vocabulary follows
    source: InitSource | None  # training.init_from's checkpoint, when this run starts from it

    @property
    def vocabulary(self) -> Vocabulary:
        return self.text.vocabulary


def starting_point(config: Config, workdir: Path | None, resume: str = "auto") -> tuple[bool, InitSource | None]:
    """Whether the run in `workdir` resumes a checkpoint of its own, and `training.init_from`'s
    checkpoint when the run starts from it instead. Raises CheckpointError for `resume="require"`
    without a checkpoint and for an init_from that names none, ValueError for a resumed run or an
    init_from source of another text front end or log-mel settings; reads no weights, so training
    asks it before the hardware probes (a minute on a first run) as well as in `prepare_run`."""
    resuming = workdir is not None and has_checkpoint(workdir)
    if resume == "require" and not resuming:
        where = workdir / "checkpoints" / "latest" if workdir is not None else "(no run folder)"
        raise CheckpointError(f"--resume: no checkpoint to resume in {where}")
    if resuming:
        check_resumed_inputs(workdir, config.data)  # another front end or log-mel: said before the probes too
    source = None
    if config.training.init_from and not resuming:
        source = load_source(config.training.init_from)
        check_same_inputs(source, config)
    return resuming, source


def check_validation_inputs(config: Config) -> None:
    """Raises, naming the key, when `training.vocoder` is no vocoder folder for this run's features or
    `data.unseen_voices_data` no dataset: validation loads them only after the hardware probes
    (minutes on a first run)."""
    t, d = config.training, config.data
    if t.vocoder:
        try:
            settings = vocoder_settings(t.vocoder, griffin_lim='"" for Griffin-Lim')
        except FileNotFoundError as error:
            raise ConfigError(f"training.vocoder: {error}") from None
        check_features(t.vocoder, settings, d)
    if d.unseen_voices_data and t.voice_sentences:
        try:
            locate_manifest(d.unseen_voices_data)
        except (FileNotFoundError, ManifestError) as error:
            raise ConfigError(f"data.unseen_voices_data: {error}") from None


def prepare_run(config: Config, workdir: str | Path | None = None, *, resume: str = "auto",
                echo=console_echo) -> Run:
    """The rows and vocabulary of the run in `workdir` (or of a run without a folder, for `None`).

    `resume`: "auto" continues the folder's checkpoint if it has one; "require" makes a missing one
    an error (--resume, and the evaluations of a trained run). A run resuming its checkpoint keeps
    its vocab.txt (its token rows follow it); otherwise the vocabulary is built from the training
    rows, after the tokens of `training.init_from`'s run when fine-tuning.
    """
    if config.data.text_frontend == "phonemes":
        check_language(config.data.language)  # a typo fails here, with nothing done yet
    workdir = Path(workdir) if workdir is not None else None
    resuming, source = starting_point(config, workdir, resume)
    train_rows, val_rows = load_splits(config)
    if config.training.init_from and resuming:
        echo(f"training.init_from ({config.training.init_from}) only starts a run: {workdir} resumes its own checkpoint")
    text = prepare_text(config, workdir, train_rows, val_rows, keep_vocabulary=resuming,
                        base_vocabulary=source.vocabulary if source else None)
    echo(f"data: {len(text.train_rows)} training and {len(text.val_rows)} validation clips, "
         f"vocabulary of {len(text.vocabulary)} tokens")
    training_files = {u.audio_path for u in train_rows}
    if shared := sum(u.audio_path in training_files for u in val_rows):
        # data.val_data naming training clips: its loss and WER say how well the model learnt them, not
        # how it speaks what it never heard, and picking checkpoints by them picks the most memorised.
        echo(f"data: {shared} of the {len(val_rows)} validation clips are training clips too (the same audio "
             f"files in data.train_data and data.val_data): their loss and WER are not held out; remove them from one")
    return Run(config=config, workdir=workdir, text=text, resuming=resuming, source=source)
