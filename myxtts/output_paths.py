"""Whether a tool can write where it was told to, checked before its work rather than after.

A report file that turns out to be a folder, or an output folder under a file, used to end minutes of
measuring or training in a traceback, with the results lost. The tools call these on their output
arguments first, and so do the functions that make an output folder (`train`, the export's target
check, the corpus makers); the message stops the run in one line, exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path


def _under_a_file(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` when it is a file (no folder can be made under it)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def file_problem(path: str | os.PathLike, flag: str, example: str = "report.json") -> str | None:
    """What stops writing the file `path` (given by the option `flag`; `example`: a name to suggest), or None."""
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path} is a folder; give the file to write, e.g. {path / example}"
    blocker = _under_a_file(path)
    if blocker is not None:
        return f"{flag} {path}: {blocker} is a file, so no folder can hold it; give another path"
    return None


def folder_problem(path: str | os.PathLike, flag: str) -> str | None:
    """What stops writing into the folder `path` (given by the option `flag`, made if missing), or None."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{flag} {path} is a file, not a folder; give a folder (it is made if missing)"
    blocker = _under_a_file(path)
    if blocker is not None:
        return f"{flag} {path}: {blocker} is a file, so the folder cannot be made; give another path"
    return None


def write_failure(error: OSError, path: str | os.PathLike, what: str) -> str:
    """One line for an OSError met while writing `what` to `path` (a folder it may not write to, a full
    disk): the system's reason and the file it names."""
    return f"cannot write {what} to {path}: {error.strerror or error} ({error.filename or path})"
