"""Callbacks around `Model.fit`: progress with ETA, checkpoints, signals, and fault stops.

Keras' own TensorBoard callback writes the step's metrics; these add what Keras does not know
about: our checkpoint layout and meta files, a stop at `max_steps` counted in optimizer updates
(Keras counts micro-batches), SIGINT/SIGTERM handling, and stopping after a run of non-finite
losses.

Intervals (log, checkpoint, validation) fire when the optimizer step *crosses* a multiple of the
interval, not when it equals one: with `training.steps_per_execution` N, Keras calls the callbacks
once per N micro-batches, so the step jumps by up to N between calls (4, 8, 12 with N = 4) and a
`step % interval == 0` test would miss most intervals (a log interval of 3 would fire at 12 only).
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import sys
import time

import keras
import tensorflow as tf

from myxtts import compat
from myxtts.training.checkpoints import CheckpointError, read_meta


def optimizer_step(model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class ProgressLogger(keras.callbacks.Callback):
    """One line every `interval` updates: losses, rate, step time, samples/s and ETA to max_steps.

    Step time and samples/s count the time inside the steps alone (from Keras' batch-begin to its
    batch-end callbacks, the wait for input included): the wall time between two lines also held the
    validation, the speech check and the checkpoints of any interval ending there (a tiny run logged
    134 ms/step, then 14,518 after a validation and two saves). The ETA counts them: it is the wall
    time per update since the first line, so the time such work takes recurs in it. The first line
    leaves out the first call too (its step traces, and under XLA compiles, the step: 116 s on an H100
    where a step takes 60 ms, which made the first ETA hours), when other calls follow it in the line;
    `CompileTimer` says what the first step took.

    Also writes step time and samples/s to TensorBoard next to the step's own metrics, and the time
    the steps waited for input (`input_wait_ms`), timed by one of two clocks: `watch_input` (inside
    the pipeline, its last stage) or, when the last stage must be the copy to the GPU,
    `watch_fetches` (where Keras' loop fetches each batch).
    """

    def __init__(self, interval: int, max_steps: int, samples_per_update: int, log_dir: str, echo=print):
        super().__init__()
        self.interval, self.max_steps, self.samples_per_update = interval, max_steps, samples_per_update
        self.writer = tf.summary.create_file_writer(log_dir)
        self.echo = echo
        self._last = None  # (time, step) at the last line
        self._first_line = None  # (time, step) at the first line: the ETA's wall clock starts there
        self._in_steps = 0.0  # seconds inside steps since the last line
        self._step_began = None
        self._input_clock = None  # seconds waited since the last line: read_and_reset(); set by watch_*
        self.history: list[dict] = []
        self.validation_history: list[dict] = []

    def watch_input(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` with the time each fetch of a batch blocks added up, for `input_wait_ms`.

        Keras fetches the batch inside the compiled train function, where no callback sees it, so
        the clock lives in the pipeline: `zip` asks its inputs for their elements in order, on the
        caller's thread, so a timestamp taken by a stage zipped in front of `dataset` and one taken
        right after it bracket exactly the `get_next` on `dataset` (the wait for input; zero when
        prefetching keeps up). Step dispatch, tracing and compute stay outside the bracket. Must be
        the last stage: a prefetch after it would move the fetching to a background thread, which is
        also why tf.data's own injection of a final prefetch is turned off (the pipeline's prefetch
        stays; only cheap pass-through stages such as `repeat` and `skip` now run on the caller's
        thread). Measured: a 100 ms fetch reads as ~100 ms, a ready batch as ~0.1 ms.
        With steps_per_execution > 1 the later fetches of a call happen inside the compiled loop and
        may overlap the previous step's compute; they are counted all the same.
        """
        with tf.device("/cpu:0"):  # tf.data functions run on the host
            asked_at = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            waited = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._input_clock = _VariableClock(waited)

        def ask(_):
            return asked_at.assign(tf.timestamp())

        def delivered(_, batch):
            waited.assign_add(tf.timestamp() - asked_at)
            return batch

        asks = tf.data.Dataset.from_tensors(0).repeat().map(ask)
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.zip(asks, dataset).map(delivered).with_options(options)

    def watch_fetches(self, model: keras.Model) -> None:
        """`input_wait_ms` from the time `model.fit` blocks fetching each batch from its iterator.

        For a training dataset whose last stage is the copy to the GPU (`prefetch_to_device`, which
        nothing may follow): a clock inside the pipeline would then time the copy's background
        thread waiting for the host pipeline, up to the whole step when the host is a little slow,
        not the step waiting for its batch. `compat.time_batch_fetches` times the step's own fetch
        from the GPU buffer instead, at the cost described there.
        """
        self._input_clock = compat.time_batch_fetches(model)

    def on_train_begin(self, logs=None):
        self._last = (time.perf_counter(), optimizer_step(self.model))
        self._first_line, self._in_steps = None, 0.0
        self._first_call = None  # (seconds, updates) of fit's first call: left out of the first line's rates
        if self._input_clock is not None:
            self._input_clock.read_and_reset()

    def on_train_batch_begin(self, batch, logs=None):
        self._step_began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)  # first: reading the step waits for it to finish on a GPU
        now = time.perf_counter()
        took = now - self._step_began if self._step_began is not None else 0.0
        self._in_steps += took
        if self._first_call is None:  # its input wait (the pipeline starting) kept apart with it
            waited = self._input_clock.read_and_reset() if self._input_clock is not None else 0.0
            self._first_call = (took, step - self._last[1], waited)
        if not crossed(self._last[1], step, self.interval):
            return
        steps, in_steps, first_wait = step - self._last[1], self._in_steps, 0.0
        if self._first_line is None:
            wall = now - self._last[0]
            first_seconds, first_updates, first_wait = self._first_call
            if steps > first_updates > 0:
                in_steps, wall, steps, first_wait = in_steps - first_seconds, wall - first_seconds, steps - first_updates, 0.0
            wall_per_step, self._first_line = wall / steps, (now, step)
        else:
            wall_per_step = (now - self._first_line[0]) / (step - self._first_line[1])
        seconds_per_step = in_steps / steps
        self._last, self._in_steps = (now, step), 0.0
        logs = {k: float(v) for k, v in (logs or {}).items()}
        eta = wall_per_step * max(self.max_steps - step, 0)
        record = dict(step=step, step_time_s=seconds_per_step, samples_per_s=self.samples_per_update / seconds_per_step, **logs)
        input_wait = ""
        if self._input_clock is not None:
            record["input_wait_ms"] = (self._input_clock.read_and_reset() + first_wait) * 1000 / steps
            input_wait = f" (input wait {record['input_wait_ms']:.0f})"
        self.history.append(record)
        with self.writer.as_default(step=step):
            tf.summary.scalar("step_time_s", seconds_per_step)
            tf.summary.scalar("samples_per_s", record["samples_per_s"])
            if "input_wait_ms" in record:
                tf.summary.scalar("input_wait_ms", record["input_wait_ms"])
        self.echo(
            f"step {step}/{self.max_steps}  loss {logs.get('loss', math.nan):.4f} (mel {logs.get('mel_loss', math.nan):.4f}"
            f" align {logs.get('align_loss', math.nan):.3f} duration {logs.get('duration_loss', math.nan):.3f})"
            f"  lr {logs.get('learning_rate', math.nan):.2e}  |g| {logs.get('grad_norm', math.nan):.2f}"
            f"  {seconds_per_step * 1000:.0f} ms/step{input_wait}  {record['samples_per_s']:.1f} samples/s  ETA {_duration(eta)}"
        )

    def record_validation(self, step: int, logs: dict) -> None:
        values = {(k if k.startswith("val_") else f"val_{k}"): float(v) for k, v in logs.items()}
        self.validation_history.append({"step": step, **values})
        with self.writer.as_default(step=step):
            for key, value in values.items():
                tf.summary.scalar(key, value)
        self.echo(f"validation at step {step}: " + "  ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in sorted(values.items())))

    def on_epoch_end(self, epoch, logs=None):
        validation = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if validation:
            self.record_validation(optimizer_step(self.model), validation)


# Validation value -> the checkpoint kept at its lowest. val_wer exists when intelligibility is measured.
BEST_BY = {"val_mel_loss": "best_mel", "val_wer": "best_wer"}


def validation_key(val_rows, wer_sentences: int, vocoder: str) -> str:
    """What a best_* value was measured on (the validation clips and texts, how many sentences are
    spoken, the vocoder speaking them), stored beside it: a value is compared only with values of
    the same key. The batch size is left out: the out-of-memory back-off halves it and resumes."""
    measured = json.dumps([sorted((u.audio_path, u.text) for u in val_rows), wer_sentences, vocoder])
    return hashlib.sha256(measured.encode()).hexdigest()[:16]


class _VariableClock:
    """The seconds `watch_input`'s pipeline stage adds up in a variable."""

    def __init__(self, waited: tf.Variable):
        self.waited = waited

    def read_and_reset(self) -> float:
        seconds = float(self.waited.numpy())
        self.waited.assign(0.0)
        return seconds


class CheckpointSaver(keras.callbacks.Callback):
    """`latest` every `interval` updates, at the end, and on SIGINT/SIGTERM (then stops the run);
    `best_mel` / `best_wer` whenever validation mel loss / word error rate improves on the best so
    far, the run's own best_* checkpoint's when it resumes (measured with the same `validation`
    key). A run the `guard` (NonFiniteGuard) stopped for divergence ends without saving: `latest`
    keeps the last state saved before it."""

    def __init__(self, checkpoints, interval: int, echo=print, guard=None, validation: str = ""):
        super().__init__()
        self.checkpoints, self.interval, self.echo, self.guard = checkpoints, interval, echo, guard
        self.validation = validation
        self.best = {key: math.inf for key in BEST_BY}
        self.interrupted_by = None
        self._previous_handlers = {}
        self._last_saved = None

    def on_train_begin(self, logs=None):
        self._last_saved = optimizer_step(self.model)
        # Starting from infinity, a resumed run's first validation replaced its best checkpoint (one
        # is kept) with whatever it measured, a worse one included.
        for key, kind in BEST_BY.items():
            self.best[key] = self._saved_best(key, kind)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (e.g. some test runners): no signal handling
                pass

    def _on_signal(self, signum, frame):
        # Only set a flag: the save and the stop happen between steps, never in the middle of one.
        self.interrupted_by = signal.Signals(signum).name

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if self.interrupted_by and _between_updates(self.model.optimizer):
            self.model.stop_training = True
            self._save_latest(step, f"{self.interrupted_by} received")
        elif crossed(self._last_saved, step, self.interval) and _between_updates(self.model.optimizer):
            # With several micro-batches per call a call can end inside an accumulated update; the
            # save then waits for the first call that ends on an update boundary.
            self._save_latest(step)

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        for key, kind in BEST_BY.items():
            value = (logs or {}).get(key)
            if value is not None and math.isfinite(value) and value < self.best[key]:
                self.best[key] = float(value)
                self.checkpoints.save(kind, step, **{key: float(value), "validation": self.validation})

    def on_train_end(self, logs=None):
        step = optimizer_step(self.model)
        if self.guard is not None and self.guard.tripped:
            # The updates just before a run of non-finite losses are what led to it: not saved.
            kept = f"stays at step {self._last_saved}" if self.checkpoints.latest_path() else "was never saved"
            self.echo(f"not saving step {step}, which diverged: the latest checkpoint {kept}")
        elif step != self._last_saved:  # a signal during the last validation still gets its message
            self._save_latest(step, f"{self.interrupted_by} received" if self.interrupted_by else "")
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)

    def _saved_best(self, key: str, kind: str) -> float:
        """The value the run's `kind` checkpoint was kept for, inf when there is none to beat."""
        path = self.checkpoints.latest_path(kind)
        try:
            meta = read_meta(path) if path else {}
        except (CheckpointError, ValueError):  # no or an unreadable meta file: nothing to compare with
            return math.inf
        value = meta.get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return math.inf
        if meta.get("validation", self.validation) != self.validation:  # older checkpoints have no key: the same run
            self.echo(f"{kind}: {path} was kept for {key} {value:.4f} on other validation sentences or another "
                      f"vocoder; the next validation replaces it")
            return math.inf
        return float(value)

    def keep_progress(self, reason: str) -> None:
        """Saves `latest` at the last whole update when `fit` stops on an error (Keras then calls no
        `on_train_end`): up to `interval` updates were lost to an out-of-memory step, which leaves
        the variables as the last update left them. Nothing is saved inside an accumulated update
        or after divergence; a save that fails too is said and the error goes on."""
        step = optimizer_step(self.model)
        if step == self._last_saved or (self.guard is not None and self.guard.tripped):
            return
        if not _between_updates(self.model.optimizer):
            self.echo(f"{reason} inside an accumulated update: the latest checkpoint stays at step {self._last_saved}")
            return
        try:
            path = self.checkpoints.save("latest", step)
            self._last_saved = step
            self.echo(f"{reason} after step {step}: saved {path}, where a run of this folder goes on from")
        except Exception as error:  # noqa: BLE001 - the first error is the one to report
            self.echo(f"{reason}: saving step {step} failed too ({type(error).__name__}); "
                      f"the latest checkpoint stays at step {self._last_saved}")

    def _save_latest(self, step: int, reason: str = "") -> None:
        path = self.checkpoints.save("latest", step)
        self._last_saved = step
        if reason:
            self.echo(f"{reason}: saved {path}; re-run the same command to resume")


def crossed(previous_step: int, step: int, interval: int) -> bool:
    """Whether going from `previous_step` to `step` passed (or reached) a multiple of `interval`."""
    return step // interval > previous_step // interval


class ValidationSchedule(list):
    """`validation_freq` for `fit`: which epoch ends validate.

    `fit` takes a list of epochs and asks `epoch in validation_freq`, which this answers:

    * never once SIGINT/SIGTERM arrived. Keras would still run the epoch's validation (and the sample
      synthesis after it) before returning: minutes on a large validation set, longer than a
      scheduler's grace period before SIGKILL, with Ctrl-C doing nothing meanwhile;
    * with one micro-batch per call (`every_epoch`), at every epoch end: the trainer's epochs are
      then exactly `eval_interval` updates long;
    * with several per call, where the trainer's epoch is one call, at the first epoch end that
      crossed a multiple of `eval_interval` updates on an update boundary.
    """

    def __init__(self, saver: "CheckpointSaver", eval_interval: int, start_step: int, every_epoch: bool):
        super().__init__()
        self.saver, self.interval, self.every_epoch = saver, eval_interval, every_epoch
        self._last = start_step  # the step of the last validation (or of the start)

    def __contains__(self, epoch) -> bool:
        if self.saver.interrupted_by is not None:
            return False
        if self.every_epoch:
            return True
        model = self.saver.model
        step = optimizer_step(model)
        if crossed(self._last, step, self.interval) and _between_updates(model.optimizer):
            self._last = step
            return True
        return False


def _between_updates(optimizer) -> bool:
    """False while micro-batch gradients of an unfinished update are accumulated.

    A checkpoint taken then would hold them, and the resumed run, which restarts the data at the
    update boundary, would add those micro-batches a second time. Keras counts micro-batches in a
    private counter (`compat.micro_batches_done`; the public `iterations` is updates); skipped
    non-finite steps count in neither, and accumulate nothing.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    accumulation = inner.gradient_accumulation_steps
    return not accumulation or compat.micro_batches_done(inner) % accumulation == 0


class StopAtStep(keras.callbacks.Callback):
    def __init__(self, max_steps: int):
        super().__init__()
        self.max_steps = max_steps

    def on_train_batch_end(self, batch, logs=None):
        if optimizer_step(self.model) >= self.max_steps:
            self.model.stop_training = True


class NonFiniteGuard(keras.callbacks.Callback):
    """Skipped steps are normal now and then (fp16 loss scaling); a long run of them is divergence."""

    def __init__(self, max_in_a_row: int, echo=print):
        super().__init__()
        self.max_in_a_row, self.echo = max_in_a_row, echo
        self.tripped = False

    def on_train_batch_end(self, batch, logs=None):
        if logs and int(logs.get("nonfinite_in_a_row", 0)) >= self.max_in_a_row:
            self.tripped = True
            self.model.stop_training = True
            self.echo(
                f"stopping: {self.max_in_a_row} non-finite losses in a row. "
                "Lower training.learning_rate, keep training.clip_norm on, or try training.precision: fp32."
            )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def console_echo(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class SpeechCheck(keras.callbacks.Callback):
    """At each validation: speak the held-out sentences from their text alone and measure them.

    With `voices` (data.unseen_voices_data), also speaks sentences in voices training never heard and
    adds `val_speaker_similarity` and `val_speaker_identified` (a fraction; evaluation/voices.py).
    Adds `val_wer` (word error rate of the recognizer on them, `myxtts.evaluation`) to the epoch's
    logs, so it is printed, written to TensorBoard and keeps the `best_wer` checkpoint like the
    losses do; it must therefore come before those callbacks. With `samples_dir`, the first
    sentence's mel image and audio (through the sentences' vocoder: `training.vocoder`, else
    Griffin-Lim) go to TensorBoard too (the recording once, for comparison). `scorer` None: samples only (a language the recognizer does not hear).
    """

    def __init__(self, network, sentences, scorer, samples_dir: str | None, echo=print, voices=None):
        super().__init__()
        self.network, self.sentences, self.scorer, self.echo = network, sentences, scorer, echo
        self.voices = voices  # evaluation/voices.py's UnseenVoices, or None
        self.writer = tf.summary.create_file_writer(samples_dir) if samples_dir else None
        self._logged_recording = False

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not any(key.startswith("val_") for key in logs):
            return  # no validation this time (the run was interrupted): nothing to pair the sample with
        if self.scorer is not None:
            from myxtts.evaluation.speech import cap_note

            # Speaking and decoding the sentences is the long part of a validation (~50 s for the demo's
            # 24 on 2 cores): counted on stderr, so a run at "ETA 0:00:00" is not silent that long.
            report = self.sentences.measure(self.network, self.scorer, show_progress=True)
            if report.wer is not None:
                logs["val_wer"] = report.wer
            logs["val_length_ratio"] = report.length_ratio
            self.echo(f"held-out sentences spoken from text: {report.summary}, length x{report.length_ratio:.2f} "
                      f"of the recordings{cap_note(report.length_ratio)} ({report.seconds:.0f} s)")
            first = report.mels[0]
        else:
            first = self.sentences.synthesize(self.network, only=[0])[0]
        if self.voices is not None:
            voices = self.voices.measure(self.network)
            logs["val_speaker_similarity"] = voices.similarity
            logs["val_speaker_identified"] = voices.identified / voices.total
            self.echo(f"{voices.summary()} ({voices.seconds:.0f} s)")
        if self.writer is not None:
            self._log_sample(optimizer_step(self.model), first)

    def on_train_end(self, logs=None):
        if self.scorer is not None:
            self.scorer.close()  # its decoding processes; a later validation would start them again

    def _log_sample(self, step: int, mel) -> None:
        c, to_audio = self.sentences.data_config, self.sentences.to_audio
        mel = tf.constant(mel)
        with self.writer.as_default(step=step):
            if not self._logged_recording:
                recording = tf.constant(self.sentences.recording_mel(0))
                tf.summary.image("sample/recording_mel", _mel_image(recording, c), step=0)
                tf.summary.audio("sample/recording_vocoded", _audio(to_audio(recording)), c.sample_rate, step=0)
                self._logged_recording = True
            tf.summary.image("sample/generated_mel", _mel_image(mel, c))
            tf.summary.audio("sample/generated", _audio(to_audio(mel)), c.sample_rate)
            tf.summary.scalar("sample/generated_seconds", int(mel.shape[0]) / c.frames_per_second)


def _mel_image(mel, c) -> tf.Tensor:
    """[frames, n_mels] log-mel -> [1, n_mels, frames, 1] in [0, 1], low frequencies at the bottom."""
    floor = tf.math.log(c.log_floor)
    scaled = (mel - floor) / tf.maximum(tf.reduce_max(mel) - floor, 1e-6)
    return tf.transpose(scaled)[::-1][None, :, :, None]


def _audio(samples) -> tf.Tensor:
    return tf.clip_by_value(samples, -1.0, 1.0)[None, :, None]  # [1, samples, channels]


class VocoderSamples(keras.callbacks.Callback):
    """TensorBoard audio of a vocoder in training (utilities/train_vocoder.py): one clip's copy-synthesis
    (the clip -> its log-mel -> the vocoder) every `interval` updates and at the end, under `log_dir`;
    the clip itself and its Griffin-Lim copy once, at step 0, to listen against. Keras' TensorBoard
    callback knows nothing of audio, and the acoustic model's `SpeechCheck` speaks sentences from
    text, which a vocoder does not."""

    def __init__(self, vocoder, clip_path: str, data_config, log_dir: str, interval: int):
        super().__init__()
        from myxtts.data import audio
        from myxtts.evaluation.speech import trimmed_clip

        self.vocoder, self.data_config, self.interval = vocoder, data_config, interval
        self.recording, _ = trimmed_clip(clip_path, data_config)
        self.log_mel = audio.log_mel(self.recording, data_config)
        self.writer = tf.summary.create_file_writer(log_dir)
        self._logged_recording, self._last = False, -1

    def _log(self, step: int) -> None:
        from myxtts.models.vocoder import waveform_maker

        rate = self.data_config.sample_rate
        with self.writer.as_default(step=step):
            if not self._logged_recording:
                tf.summary.audio("copy/recording", _audio(self.recording), rate, step=0)
                tf.summary.audio("copy/griffin_lim", _audio(waveform_maker(self.data_config)(self.log_mel)), rate, step=0)
                self._logged_recording = True
            tf.summary.audio("copy/vocoder", _audio(self.vocoder(self.log_mel[None])[0]), rate)
        self.writer.flush()
        self._last = step

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        if step // self.interval > max(self._last, 0) // self.interval:
            self._log(step)

    def on_train_end(self, logs=None):
        step = optimizer_step(self.model)
        if step != self._last:
            self._log(step)
