"""One training per run folder: an OS lock on `<run>/train.lock` for as long as `train()` runs.

Two trainings in one folder would both run to the end, writing the same checkpoint names, one
config.yaml and interleaved TensorBoard logs, and the mix would later resume without complaint.
The second one must stop before it writes (or, with --reset-training, deletes) anything.

The lock is `fcntl.flock` on a file in the run folder. The kernel releases it when its holder
exits, however it exits (kill -9 included), so a lock left by a killed run never blocks the next
one: there is no pid to check for liveness and no age to guess. The file holds the holder's pid and
host, only to name them in the refusal. It is removed on release; a process that locked a file
another one unlinked meanwhile sees that its inode is no longer the path's and tries again, so
two processes can never both believe they hold it.

Standard library only: tests take the lock from a small child process without importing TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path
from typing import Callable, Iterator

LOCK_FILE = "train.lock"


class RunFolderBusy(RuntimeError):
    """Another process is training in this run folder."""


@contextlib.contextmanager
def run_folder_lock(workdir: str | os.PathLike, echo: Callable[[str], None] = print, what: str | None = None,
                    advice: str | None = None) -> Iterator[Path]:
    """Holds `<workdir>/train.lock` (the folder must exist) while the block runs; raises
    `RunFolderBusy`, naming the folder and the holder's pid and host, when another process holds it.
    `what` (what two trainings would overwrite) and `advice` (what to do instead) word the refusal;
    by default a run folder's.

    On a filesystem without locks (some network mounts answer ENOLCK), says so and goes on unlocked."""
    path = Path(workdir) / LOCK_FILE
    what = what or "each other's checkpoints, config.yaml and logs"
    advice = advice or f"train in another folder (--output-dir NEW; --init-from {path.parent} starts it from these weights)"
    descriptor = _acquire(path, echo, what, advice)
    try:
        yield path
    finally:
        if descriptor is not None:
            # Unlink before unlocking: a waiter that then locks the old inode sees it is gone (_acquire).
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            os.close(descriptor)


def holder_of(path: Path) -> str:
    """"pid N on host H" as the lock file says, or a plainer phrase when it holds nothing readable."""
    try:
        fields = dict(line.split("=", 1) for line in path.read_text(encoding="utf-8").splitlines() if "=" in line)
    except (OSError, UnicodeDecodeError):
        fields = {}
    if "pid" not in fields:
        return "another process (its pid is not written yet)"
    return f"pid {fields['pid']} on host {fields.get('host', '?')}"


def _acquire(path: Path, echo, what: str, advice: str) -> int | None:
    """The descriptor of the locked lock file, None when the filesystem cannot lock."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderBusy(
                    f"{path.parent} is in use by another training ({holder_of(path)}, lock file {path}): two "
                    f"trainings in one folder would overwrite {what}. Nothing in it was written. Wait for that "
                    f"one to end or stop it, or {advice}") from None
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                echo(f"warning: {path.parent} is on a filesystem without file locks ({error.strerror}): nothing "
                     "stops a second training from using the same run folder; make sure only one does")
                return None
            raise
        try:
            same_file = os.fstat(descriptor).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(descriptor)  # the holder unlinked it while we waited for the lock: take the new one
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid={os.getpid()}\nhost={socket.gethostname()}\n".encode())
    except OSError as error:  # a full disk: the lock holds all the same, only a refusal cannot name the pid
        echo(f"warning: could not write this process's pid into {path} ({error.strerror})")
    return descriptor
