"""Resuming from the newest checkpoint that loads, when the newest one is damaged.

A crash or a full disk can leave a checkpoint half written: a truncated or empty `.data` file, a
missing `.index`, an empty `.meta.json`, an empty `checkpoint` state file. Stopping there (with a
traceback, or a line naming no file) leaves `--reset-training` as the only way out, which deletes
the intact older `latest` and `best_*` checkpoints too. Instead:

    candidates(root)   every checkpoint of the run's checkpoints/, newest first (the most updates,
                       counting those before an optimizer switch): each kind's state file's list,
                       or the ckpt-N files found where the state file is unreadable
    damage(path)       why a checkpoint cannot be read (its meta file, its index, every tensor of its
                       data read back, checksums included), or None
    restore_newest     restores the newest intact one; the damaged newer ones are then moved to
                       checkpoints/damaged/ (kept for a post-mortem, out of the way of new saves)
                       and the state files rewritten without them

A damaged checkpoint is not one that does not *fit*: another model size or vocabulary, or a missing
meta file, still stops the run with nothing written (`Checkpoints.restore`, trainer.WAYS_OUT).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from myxtts.training.checkpoints import (KINDS, CheckpointError, Checkpoints, Restored, earlier_updates, error_line,
                                         read_meta)

STATE_FILE = "checkpoint"  # TensorFlow's name for the file listing a folder's checkpoints
DAMAGED = "damaged"


class CheckpointsDamaged(CheckpointError):
    """Every checkpoint of the run is damaged: there is nothing to fall back to."""


class CheckpointRefused(CheckpointError):
    """A checkpoint that reads but does not fit this run (`path` names it)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Candidate:
    kind: str  # latest, best_mel, best_wer
    folder: Path
    step: int

    @property
    def path(self) -> str:
        return str(self.folder / f"ckpt-{self.step}")

    @property
    def updates(self) -> int:
        """All the updates behind it: its step, and those before an optimizer switch restarted the step
        at 0 (from its meta file; 0 where that cannot be read, which `damage` reports)."""
        try:
            meta = read_meta(self.path)
        except (CheckpointError, OSError, ValueError):  # ValueError: not JSON, or not UTF-8
            return self.step
        return self.step + (earlier_updates(meta) if isinstance(meta, dict) else 0)


@dataclass
class Resume:
    restored: Restored | None  # None: the run has no checkpoint
    messages: list[str] = field(default_factory=list)  # what was skipped, moved or rewritten, and why


def candidates(root: str | os.PathLike) -> list[Candidate]:
    """The checkpoints under `root` (a run's checkpoints/), newest first (the most updates); at one
    count, `latest` first."""
    found = []
    for kind in KINDS:
        folder = Path(root) / kind
        steps = _listed_steps(folder)
        found += [Candidate(kind, folder, step) for step in (steps if steps is not None else _steps_on_disk(folder))]
    return sorted(found, key=lambda c: (-c.updates, KINDS.index(c.kind)))


def state_problem(folder: Path) -> str | None:
    """Why `folder`'s state file cannot be read, or None (also when there is none)."""
    path = folder / STATE_FILE
    if not path.exists():
        return None
    if path.stat().st_size == 0:
        return f"{path} is empty"
    try:
        state = tf.train.get_checkpoint_state(str(folder))
    except ValueError as error:
        return f"{path} cannot be read ({error})"
    return None if state is not None else f"{path} cannot be read (not a checkpoint state)"


def damage(path: str) -> str | None:
    """Why checkpoint `path` cannot be restored, or None when every file of it reads back whole.

    Reads every tensor (TensorFlow checks each against its checksum), so it costs one extra read
    of the checkpoint. A missing meta file is not damage: the save writes it first, so it is a
    checkpoint MyXTTS did not write, which `Checkpoints.restore` refuses."""
    name = Path(path).name
    meta = Path(f"{path}.meta.json")
    if meta.exists():
        try:
            text = meta.read_text(encoding="utf-8")
            if not text.strip():
                return f"{meta.name} is empty"
            if not isinstance(json.loads(text).get("step"), int):
                return f"{meta.name} holds no step"
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
            return f"{meta.name} is not a MyXTTS meta file ({error})"
    if not Path(f"{path}.index").exists():
        return f"{name}.index is missing"
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as error:
        return f"{name}.index cannot be read ({error_line(error)})"
    try:
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
    except (tf.errors.OpError, IndexError, ValueError) as error:
        sizes = ", ".join(f"{p.name} {p.stat().st_size} bytes" for p in sorted(Path(path).parent.glob(f"{name}.data-*")))
        return f"its data cannot be read back ({sizes or 'no data file'}): {error_line(error)}"
    return None


def restore_newest(checkpoints: Checkpoints) -> Resume:
    """Restores the newest checkpoint under `checkpoints.root` that is intact (see `damage`).

    Raises `CheckpointRefused` for one that reads but does not fit, and `CheckpointsDamaged` when
    none is intact; both before anything is moved or written. Once one is restored, the damaged
    newer ones are moved aside and the state files they were listed in rewritten."""
    found, skipped = candidates(checkpoints.root), []
    restored = None
    for candidate in found:
        reason = damage(candidate.path)
        if reason is not None:
            skipped.append((candidate, reason))
            continue
        try:
            restored = checkpoints.restore(candidate.path)
        except CheckpointError as error:
            raise CheckpointRefused(f"{error}{_skipped_note(skipped)}", candidate.path) from None
        break
    if skipped and restored is None:
        listed = "; ".join(f"{c.path}: {reason}" for c, reason in skipped)
        raise CheckpointsDamaged(f"no checkpoint of this run can be read, all {len(skipped)} are damaged: {listed}")
    messages = []
    for candidate, reason in skipped:
        destination = set_aside(checkpoints.root, candidate)
        messages.append(f"skipped {candidate.path} (step {candidate.step}), which is damaged: {reason}; "
                        f"moved to {destination}")
    for kind in KINDS:
        folder = Path(checkpoints.root) / kind
        moved = {c.step for c, _ in skipped if c.kind == kind}
        problem = state_problem(folder)
        if moved or problem:
            messages.append(rewrite_state(checkpoints.root, folder, problem, moved))
    checkpoints.reload()
    if restored is not None and skipped:
        restored = Restored(restored.path, restored.step, restored.optimizer_restored,
                            f"{restored.message}, the newest checkpoint that loads")
    return Resume(restored, messages)


def set_aside(root: str | os.PathLike, candidate: Candidate) -> Path:
    """Moves every file of `candidate` into checkpoints/damaged/<kind>-ckpt-<step>[-n]/; that folder."""
    destination = _unused(Path(root) / DAMAGED / f"{candidate.kind}-ckpt-{candidate.step}")
    destination.mkdir(parents=True)
    for path in sorted(candidate.folder.glob(f"ckpt-{candidate.step}[._]*")):
        shutil.move(str(path), str(destination / path.name))
    return destination


def rewrite_state(root: str | os.PathLike, folder: Path, problem: str | None, removed: set[int]) -> str:
    """Rewrites `folder`'s state file without the checkpoints of steps `removed`; an unreadable one
    (`problem`) is moved to checkpoints/damaged/ and replaced by a list of the complete checkpoints
    found there. What was done, in a sentence."""
    state_path = folder / STATE_FILE
    if problem:
        kept_aside = _unused(Path(root) / DAMAGED / f"{folder.name}-{STATE_FILE}")
        kept_aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(state_path), str(kept_aside))
        steps = _steps_on_disk(folder, complete_only=True)
    else:
        steps = _listed_steps(folder) or []
    steps = sorted(set(steps) - removed)
    if not steps:
        state_path.unlink(missing_ok=True)
        return f"{folder} holds no checkpoint now" + (f" ({problem}; moved to {kept_aside})" if problem else "")
    stamps = [(folder / f"ckpt-{step}.index").stat().st_mtime for step in steps]
    lines = [f'model_checkpoint_path: "ckpt-{steps[-1]}"']
    lines += [f'all_model_checkpoint_paths: "ckpt-{step}"' for step in steps]
    lines += [f"all_model_checkpoint_timestamps: {stamp}" for stamp in stamps]
    lines.append(f"last_preserved_timestamp: {min(stamps)}")
    temporary = state_path.with_name(f"{STATE_FILE}.tmp")
    temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(temporary, state_path)
    listed = ", ".join(f"ckpt-{step}" for step in steps)
    return (f"rewrote {state_path} to list {listed}"
            + (f" ({problem}; moved to {kept_aside})" if problem else ""))


def _listed_steps(folder: Path) -> list[int] | None:
    """The steps `folder`'s state file lists; None when it has none or cannot be read."""
    if state_problem(folder) is not None or not (folder / STATE_FILE).exists():
        return None
    state = tf.train.get_checkpoint_state(str(folder))
    return [int(m[1]) for p in state.all_model_checkpoint_paths if (m := re.fullmatch(r"ckpt-(\d+)", Path(p).name))]


def _steps_on_disk(folder: Path, complete_only: bool = False) -> list[int]:
    """The steps of the ckpt-N files in `folder` (any of index, data, meta; all of index and data)."""
    steps = {}
    for path in folder.glob("ckpt-*") if folder.is_dir() else ():
        match = re.fullmatch(r"ckpt-(\d+)\.(index|data-.*|meta\.json)", path.name)
        if match:
            steps.setdefault(int(match[1]), set()).add(match[2].split("-")[0])
    return sorted(step for step, parts in steps.items() if not complete_only or {"index", "data"} <= parts)


def _unused(path: Path) -> Path:
    """`path`, or `path`-2, -3... whichever does not exist yet."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _skipped_note(skipped) -> str:
    return "".join(f" (Newer, damaged and skipped: {c.path}: {reason}.)" for c, reason in skipped)

