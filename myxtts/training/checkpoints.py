"""Checkpoints: `latest` (periodic and on Ctrl-C/SIGTERM), `best_mel` and `best_wer` (by validation).

Every variable is stored under its own name: the network's by its Keras path without the model's
name ("block_0/attention/query/kernel"), the optimizer's likewise ("block_0_..._momentum"; an fp16
run's LossScaleOptimizer's own under "loss_scale/"). The
checkpoint is not the object graph Keras layers expose to `tf.train.Checkpoint`: on Keras 3.15 that
graph skips layers kept in lists (the transformer blocks) and saved 41 of the tiny model's 89
weights, measured, while restoring without complaint. Names also survive Keras renaming a second
model in one process ("xtts_1").

Written with `tf.train.CheckpointManager`, which writes the data files first and then atomically
replaces the small state file that points at them, so a kill -9 mid-save leaves the previous
checkpoint as the one that loads. Each checkpoint has a `ckpt-<step>.meta.json` beside it, written
*before* the checkpoint itself, holding the step (optimizer updates: the run's clock, which a resume
keeps whatever its gradient accumulation), the optimizer type and the full config, and
`earlier_updates`: the updates the folder's checkpoints made under another optimizer before this
one's step began at 0 (a checkpoint of another optimizer loads its weights only), so that the newest
checkpoint is the one with the most updates in all, not the highest step (`checkpoint_fallback`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from myxtts import compat

KINDS = ("latest", "best_mel", "best_wer")


class CheckpointError(RuntimeError):
    pass


class DiskFull(CheckpointError):
    """A checkpoint could not be written for lack of disk space (not memory: see `is_disk_full`)."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint whose network weights do not fit the network built now (another model size,
    vocabulary or architecture). `differences` lists them, one human-readable line each."""

    def __init__(self, message: str, differences: list[str]):
        super().__init__(message)
        self.differences = differences


@dataclass
class Restored:
    path: str
    step: int
    optimizer_restored: bool
    message: str


class Checkpoints:
    def __init__(self, directory: str | os.PathLike, network, optimizer, optimizer_type: str, config_yaml: str):
        self.root = Path(directory)
        self.network, self.optimizer = network, optimizer
        self.optimizer_type, self.config_yaml = optimizer_type, config_yaml
        if not optimizer.built:
            raise CheckpointError("build the optimizer before creating Checkpoints: its state would not be saved")
        self._full = tf.train.Checkpoint(network=network_variables(network),
                                         optimizer=tf.train.Checkpoint(**_optimizer_names(optimizer, network)))
        self._managers = {}  # made when first needed: a damaged state file must not stop the restore (checkpoint_fallback)
        self.earlier_updates = 0  # updates of the folder's checkpoints under another optimizer (see the docstring)

    def _manager(self, kind: str) -> tf.train.CheckpointManager:
        if kind not in self._managers:
            self._managers[kind] = tf.train.CheckpointManager(self._full, self.root / kind,
                                                              max_to_keep=2 if kind == "latest" else 1)
        return self._managers[kind]

    def reload(self) -> None:
        """Reads the state files again at the next save (after checkpoint_fallback moved files)."""
        self._managers.clear()

    def save(self, kind: str, step: int, **extra) -> str:
        manager = self._manager(kind)
        # The accumulation and the optimizer's micro-batch count are recorded for the reader; a
        # restore goes by `step`, the updates, whatever accumulation resumes it (see `restore`).
        meta = {"step": step, "optimizer": self.optimizer_type, "config": self.config_yaml,
                "gradient_accumulation_steps": accumulation_of(self.optimizer),
                "micro_batches": compat.micro_batches_done(_inner(self.optimizer)),
                "earlier_updates": self.earlier_updates, **extra}
        meta_path = Path(manager.directory) / f"ckpt-{step}.meta.json"
        try:
            meta_path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(meta_path, json.dumps(meta, indent=1))
            path = manager.save(checkpoint_number=step)
        except (OSError, tf.errors.ResourceExhaustedError) as error:
            if not is_disk_full(error):
                raise
            raise self._disk_full(kind, step, error) from None
        self._remove_orphan_metas(manager)
        return path

    def _disk_full(self, kind: str, step: int, error: Exception) -> "DiskFull":
        """Removes what the failed save of ckpt-`step` left and says so; TensorFlow's own report is
        RESOURCE_EXHAUSTED, which reads as out of memory (and once started the batch back-off)."""
        folder = Path(self._manager(kind).directory)
        self._managers.pop(kind)  # it may count the failed save as written
        removed = remove_unfinished_save(folder, step)
        kept = self._manager(kind).latest_checkpoint
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        left = f"; removed what it left: {', '.join(removed)}" if removed else ""
        return DiskFull(
            f"the disk is full: saving checkpoint {folder / f'ckpt-{step}'} failed ({error_line(error)}){left}. "
            + (f"The last good checkpoint, {kept}, is kept. " if kept else f"No {kind} checkpoint of this run was saved before. ")
            + f"Free space on the disk holding {folder} ({free / 2**20:.0f} MiB free now) and re-run the same command"
            + (" to resume from it" if kept else ""))

    def latest_path(self, kind: str = "latest") -> str | None:
        return self._manager(kind).latest_checkpoint

    def restore(self, path: str | None = None, strict: bool = True) -> Restored:
        """Restore `path` (default: the latest). Another optimizer's state is skipped, not loaded.

        The run continues at the checkpoint's update (`step`) whatever gradient accumulation it was
        written with: Keras stores its micro-batch count, from which it derives the update count
        and the learning-rate schedule's position by dividing by the accumulation *now*, so an
        out-of-memory back-off (accumulation doubled) or a changed --grad-accum would rewind both
        and overwrite newer checkpoints. The count is set to step x accumulation instead.
        Gradient accumulators the checkpoint lacks start at zero, which is what they hold at the
        update boundaries checkpoints are written at, and so does fp16's loss scale at its initial
        value (a run resumed in fp16 from fp32 or bf16; it was refused as "another model size").
        `strict=False` accepts any other missing object.
        """
        path = path or self.latest_path()
        if path is None:
            raise CheckpointError(f"no checkpoint in {self.root / 'latest'}")
        meta = read_meta(path)
        check_network_fits(self.network, path)
        if meta["optimizer"] == self.optimizer_type:
            target, absent_accumulators, absent_loss_scale = self._restore_target(path)
            _restore(target, path, strict, "does not match this run's network and optimizer (another model size, "
                     "or written by an older MyXTTS; --reset-training starts over)")
            for accumulator in absent_accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            accumulation = accumulation_of(self.optimizer)
            compat.set_micro_batches_done(_inner(self.optimizer), meta["step"] * accumulation)
            self.earlier_updates = earlier_updates(meta)
            message = f"resumed from {path} at step {meta['step']}"
            before = meta.get("gradient_accumulation_steps")
            if before is not None and before != accumulation:
                message += (f" (written with gradient accumulation {before}, continuing with {accumulation}: the step "
                            "and the learning-rate schedule go on from there)")
            if absent_loss_scale:
                message += " (written without fp16's loss scaling: its scale starts at its initial value)"
            return Restored(path, meta["step"], True, message)
        restore_network(self.network, path)
        # This run's steps count from 0 again: its checkpoints must still rank above the ones it
        # started from, or the next start took those back (and lost every update made since).
        self.earlier_updates = earlier_updates(meta) + meta["step"]
        return Restored(
            path,
            meta["step"],
            False,
            f"{path} was trained with {meta['optimizer']}, this run uses {self.optimizer_type}: "
            f"loaded the weights only; the optimizer starts fresh (step count and schedule restart at 0)",
        )

    def _restore_target(self, path: str) -> tuple[tf.train.Checkpoint, list, list]:
        """What to restore from `path`: every variable, less the gradient accumulators it does not
        hold (written without accumulation) and the loss scale's (written in fp32 or bf16, resumed in
        fp16: the scale starts as a new fp16 run's does, which the step's overflow check adjusts);
        and those accumulators and loss-scale variables."""
        reader = tf.train.load_checkpoint(path)
        prefix, suffix = "optimizer/", "/.ATTRIBUTES/VARIABLE_VALUE"
        stored = {_unescape(key[len(prefix) : -len(suffix)]) for key in reader.get_variable_to_shape_map()
                  if key.startswith(prefix) and key.endswith(suffix)}
        named = _optimizer_names(self.optimizer, self.network)
        accumulators = {name for name in named if name.endswith(ACCUMULATOR_SUFFIX) and name not in stored}
        loss_scale = {name for name in named if name.startswith(LOSS_SCALE_PREFIX) and name not in stored}
        absent = accumulators | loss_scale
        target = tf.train.Checkpoint(network=network_variables(self.network),
                                     optimizer=tf.train.Checkpoint(**{n: v for n, v in named.items() if n not in absent}))
        return target, [named[name] for name in sorted(accumulators)], [named[name] for name in sorted(loss_scale)]

    @staticmethod
    def _remove_orphan_metas(manager) -> None:
        kept = {Path(p).name for p in manager.checkpoints}
        for meta in Path(manager.directory).glob("ckpt-*.meta.json"):
            if meta.name.removesuffix(".meta.json") not in kept:
                meta.unlink(missing_ok=True)


# Keras names a variable's gradient accumulator "<its path with _ for />_gradient_accumulator".
ACCUMULATOR_SUFFIX = "_gradient_accumulator"
# Where a LossScaleOptimizer's own variables are stored (`_optimizer_names`).
LOSS_SCALE_PREFIX = "loss_scale/"


def _inner(optimizer):
    """The optimizer that counts and accumulates (the one inside a LossScaleOptimizer)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def accumulation_of(optimizer) -> int:
    """Micro-batches per update of `optimizer` (1 without gradient accumulation)."""
    return _inner(optimizer).gradient_accumulation_steps or 1


def network_variables(network) -> tf.train.Checkpoint:
    """The network's weights by name, as a trackable object to save or restore (see the docstring)."""
    return tf.train.Checkpoint(**named_weights(network))


def named_weights(network) -> dict:
    """{name a checkpoint stores it under: variable} for every weight of `network`."""
    if not network.built:
        raise CheckpointError("build the network before saving or restoring it")
    return _names(network.weights, _path_prefix(network))


def stored_weights(path: str) -> tuple[tf.train.CheckpointReader, dict[str, str]]:
    """The reader of checkpoint `path` and {weight name: its key in the reader} for its network weights."""
    reader = tf.train.load_checkpoint(path)
    prefix, suffix = "network/", "/.ATTRIBUTES/VARIABLE_VALUE"
    keys = {_unescape(key[len(prefix) : -len(suffix)]): key for key in reader.get_variable_to_shape_map()
            if key.startswith(prefix) and key.endswith(suffix)}
    return reader, keys


def weight_differences(network, path: str) -> list[str]:
    """How the network weights stored in `path` differ from `network`'s, one line each: a name only
    one side has, or a shape that differs. Empty when every weight fits."""
    reader, keys = stored_weights(path)
    shapes = reader.get_variable_to_shape_map()
    differences, weights = [], named_weights(network)
    for name, variable in weights.items():
        if name not in keys:
            differences.append(f"{name}: not in the checkpoint")
        elif list(shapes[keys[name]]) != list(variable.shape):
            differences.append(f"{name}: {list(shapes[keys[name]])} in the checkpoint, {list(variable.shape)} now")
    differences += [f"{name}: only in the checkpoint" for name in sorted(set(keys) - set(weights))]
    return differences


def check_network_fits(network, path: str) -> None:
    """Raises `CheckpointMismatch` naming the first differences when `path` does not fit `network`."""
    differences = weight_differences(network, path)
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise CheckpointMismatch(
            f"{path} does not hold this network's weights (another model size, vocabulary or architecture): "
            f"{len(differences)} of them differ: {shown}", differences)


def _path_prefix(network) -> str:
    """What every weight path of `network` starts with: "xtts/" alone, "training_model/xtts/" inside
    the trainer's model, "xtts_1/" for a second network in one process."""
    path, marker = network.weights[0].path, f"{network.name}/"
    return path[: path.index(marker) + len(marker)]


def restore_network(network, path: str) -> None:
    """Loads the weights of checkpoint `path` into `network`; every weight must be found there."""
    check_network_fits(network, path)
    _restore(tf.train.Checkpoint(network=network_variables(network)), path, True,
             "does not hold this network's weights (another model size or vocabulary, or written by an older MyXTTS)")


def _restore(checkpoint: tf.train.Checkpoint, path: str, strict: bool, mismatch: str) -> None:
    """Restores `path` into `checkpoint`; `strict`: every variable must be found. A missing name or a
    shape that differs is a CheckpointError saying `path` + `mismatch`."""
    try:
        status = checkpoint.restore(path).expect_partial()  # checkpoint values nobody asked for stay quiet
        if strict:
            status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as error:
        raise CheckpointError(f"{path} {mismatch}: {str(error).splitlines()[0][:300]}") from None


def _optimizer_names(optimizer, network) -> dict:
    """{name: variable} of the optimizer's variables (see `_names`). A LossScaleOptimizer's own (its
    scale and step counter, and an `iteration` and `learning_rate` of its own, whose names the inner
    optimizer's share) go under "loss_scale/"."""
    prefix = _path_prefix(network).replace("/", "_")
    inner = _inner(optimizer)
    named = _names(inner.variables, prefix, optimizer_variables=True)
    if inner is not optimizer:
        inner_ids = {id(v) for v in inner.variables}
        own = [v for v in optimizer.variables if id(v) not in inner_ids]
        named.update({f"{LOSS_SCALE_PREFIX}{name}": v for name, v in _names(own, prefix, optimizer_variables=True).items()})
    return named


def _names(variables, prefix: str, optimizer_variables: bool = False) -> dict:
    """{path without `prefix`: variable}. An optimizer's variables are named "<optimizer>/<weight
    path with _ for />_<slot>", so the optimizer's own name goes first."""
    named = {}
    for variable in variables:
        name = variable.path.split("/", 1)[-1] if optimizer_variables else variable.path
        name = name.removeprefix(prefix)
        if name in named:
            raise CheckpointError(f"two variables named {name!r}; checkpoints need unique names")
        named[name] = variable
    return named


def _unescape(local_name: str) -> str:
    """A weight name from its checkpoint key, where TensorFlow writes "/" as ".S" and "." as ".."."""
    name, i = [], 0
    while i < len(local_name):
        if local_name[i] == "." and i + 1 < len(local_name):
            name.append("/" if local_name[i + 1] == "S" else local_name[i + 1])
            i += 2
        else:
            name.append(local_name[i])
            i += 1
    return "".join(name)


def earlier_updates(meta: dict) -> int:
    """The updates made under other optimizers before the step count of `meta`'s checkpoint began."""
    value = meta.get("earlier_updates", 0)  # older checkpoints have no key: none
    return value if isinstance(value, int) else 0


def read_meta(checkpoint_path: str) -> dict:
    meta_path = Path(f"{checkpoint_path}.meta.json")
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{meta_path} is missing: {checkpoint_path} was not written by MyXTTS") from None


def find_checkpoint(path: str | os.PathLike) -> str:
    """A checkpoint prefix from a run folder (its best_wer, else best_mel, else latest), a checkpoint
    folder or a prefix; clear error otherwise. best_wer first: the lowest word error rate of the
    model's own synthesis is what a listener wants; the mel loss is measured on the recordings' timing."""
    path = Path(path)
    preference = ("best_wer", "best_mel", "latest")
    folders = [path / "checkpoints" / kind for kind in preference] + [path / kind for kind in preference] + [path]
    for folder in folders:
        if folder.is_dir():
            latest = tf.train.latest_checkpoint(str(folder))
            if latest:
                return latest
    if Path(f"{path}.index").exists():
        return str(path)
    newest = tf.train.latest_checkpoint(str(path.parent)) if re.fullmatch(r"ckpt-\d+", path.name) else None
    if newest:  # a prefix its training has deleted since (it keeps only the newest), copied from a report
        raise CheckpointError(f"checkpoint {path} is no longer there: the training of its run keeps only its newest "
                              f"checkpoints (now {Path(newest).name}); give its folder {path.parent} to read the newest")
    if (path / "config.yaml").is_file():  # a run folder whose training has not saved yet (or was reset)
        raise CheckpointError(f"no checkpoint in the run folder {path} yet: its training saves the first one after "
                              "training.checkpoint_interval updates (and at Ctrl-C); run this again then")
    raise CheckpointError(f"no checkpoint found at {path} (give a run folder, e.g. runs/demo, or a checkpoint prefix)")


def read_newest(where: str | os.PathLike, read, attempts: int = 5):
    """(path, `read(path)`) for the checkpoint `find_checkpoint(where)` names.

    A training still running in that run folder deletes a checkpoint as soon as it has saved newer
    ones (`latest` keeps two, best_mel and best_wer one each), so the one found can be gone when it
    is read: a synthesis, an export or a fine-tuning started on a run that is training stopped in
    TensorFlow's NotFoundError traceback. The newest one is looked up again instead; a checkpoint
    prefix given outright that is gone is a CheckpointError naming it and what to give."""
    for _ in range(attempts):
        path = find_checkpoint(where)
        try:
            return path, read(path)
        except tf.errors.NotFoundError:
            try:
                replaced = find_checkpoint(where) != path
            except CheckpointError:  # the prefix given is gone
                replaced = True
            if not replaced:
                raise  # a file of it missing for another reason: not a training's clean-up
            if path == str(Path(where)):
                raise CheckpointError(
                    f"checkpoint {path} was deleted while it was read: the training running in its folder keeps only "
                    f"its newest checkpoints; give its folder ({Path(path).parent}) or the run folder to read the "
                    "newest one") from None
    raise CheckpointError(f"{where}: its newest checkpoint was replaced {attempts} times while it was read (a training "
                          "saving there); run the command again")


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a full disk (or quota). TensorFlow reports ENOSPC as RESOURCE_EXHAUSTED,
    the status it also uses for out of memory, with the file and strerror in the message (measured:
    "<dir>/ckpt-2_temp/part-...tempstate...; No space left on device [Op:SaveV2]")."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, tf.errors.ResourceExhaustedError) and any(
        words in str(error) for words in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT)))


def remove_unfinished_save(folder: Path, step: int) -> list[str]:
    """Removes the files of a save of ckpt-`step` in `folder` that its state file does not list
    (TensorFlow's `ckpt-<step>_temp` folder, data and index files, the meta file and the temporary
    files of both state files); the names removed."""
    try:
        state = tf.train.get_checkpoint_state(str(folder))
    except ValueError:  # an unreadable state file lists nothing
        state = None
    if state is not None and any(Path(p).name == f"ckpt-{step}" for p in state.all_model_checkpoint_paths):
        return []  # the save got as far as listing it: it is complete
    removed = []
    patterns = (f"ckpt-{step}_temp", f"ckpt-{step}.index", f"ckpt-{step}.data-*", f"ckpt-{step}.meta.json*", "checkpoint.tmp*")
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            removed.append(path.name)
    return removed


def error_line(error: BaseException) -> str:
    """The error's first line without TensorFlow's op decorations ("{{function_node ...}}", "[Op:SaveV2]")."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]$", "", text)[:300]


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
