"""Where an export may be written, and how it replaces an earlier one without losing anything else.

`utilities/export_model.py --out DIR` once deleted DIR whatever it held: pointed at the run folder
it wiped the checkpoints, logs, config and vocabulary; pointed at a corpus folder it wiped the corpus.
Now DIR may only be

* a path that does not exist yet, or an empty folder;
* an earlier export: `saved_model.pb` with this package's `assets/settings.json`, and nothing beside
  the entries an export writes (`EXPORT_ENTRIES`); a file of the user's among them makes it not one.

Anything else raises `ExportFolderError`, naming what is in the way and what to do, before any work.
The new export is written to a sibling folder and only moved into place once complete (`staged`), so
a failure half-way (a full disk, a conversion error) leaves the earlier export as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

from myxtts.output_paths import folder_problem

# Every entry an export writes at the top of its folder (SavedModel files, assets/, the TFLite model).
EXPORT_ENTRIES = frozenset({"saved_model.pb", "fingerprint.pb", "variables", "assets", "model.tflite"})
# Keys of assets/settings.json that mark a folder as one of this package's exports.
_SETTINGS_MARKERS = ("sample_rate", "n_mels", "text_frontend")


class ExportFolderError(ValueError):
    """--out names a folder an export must not replace; nothing was written or deleted."""


def is_earlier_export(folder: Path) -> bool:
    """True when `folder` holds an export of this package and nothing else."""
    if not (folder / "saved_model.pb").is_file():
        return False
    try:
        settings = json.loads((folder / "assets" / "settings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(settings, dict) or not all(key in settings for key in _SETTINGS_MARKERS):
        return False
    return not _foreign_entries(folder)


def check_export_target(out: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Raise `ExportFolderError` unless `out` is new, empty or an earlier export (module docstring)."""
    out, run = Path(out), Path(run_dir)
    resolved_out, resolved_run = out.resolve(), run.resolve()
    if resolved_out == resolved_run or resolved_out in resolved_run.parents:
        raise ExportFolderError(f"--out {out} {'is' if resolved_out == resolved_run else 'holds'} the run folder "
                                f"{run}; an export replaces its --out folder, so it must be a folder of its own, "
                                f"e.g. --out exported/{resolved_run.name}")
    if problem := folder_problem(out, "--out"):  # a file, or under one
        raise ExportFolderError(problem)
    if not out.exists() and not out.is_symlink():
        return
    entries = sorted(entry.name for entry in out.iterdir())
    if not entries or is_earlier_export(out):
        return
    what = "a MyXTTS run folder" if (out / "config.yaml").exists() and (out / "checkpoints").exists() else "a folder"
    foreign = _foreign_entries(out) if (out / "saved_model.pb").is_file() else entries
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    raise ExportFolderError(f"--out {out} is {what} that is not an earlier export (it holds {shown}); an export "
                            "replaces its --out folder, so nothing was written or deleted: choose a new or empty "
                            "folder, or move those files out")


@contextlib.contextmanager
def staged(out: str | os.PathLike):
    """Yields a sibling folder to write the export in; on success it replaces `out`, on failure it goes.

    `check_export_target` must have passed: `out` is then new, empty, or an earlier export.
    """
    out = Path(out).resolve()  # a link is followed: the folder it names is replaced, the link stays
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.export-{os.getpid()}"
    if staging.exists():  # an earlier attempt of a process that had this id and was killed
        shutil.rmtree(staging)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = out.parent / f".{out.name}.replaced-{os.getpid()}"
    if out.exists():
        os.replace(out, previous)  # a rename: the earlier export stays whole until the new one is in place
    try:
        os.replace(staging, out)
    except OSError:
        if previous.exists():
            os.replace(previous, out)
        raise
    if previous.exists():
        shutil.rmtree(previous)


def _foreign_entries(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir() if entry.name not in EXPORT_ENTRIES)
