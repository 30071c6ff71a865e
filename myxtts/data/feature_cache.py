"""Where `data.cache_features` keeps the features: in RAM when they fit, else in a file.

A RAM cache that outgrows the machine does not fail cleanly: the host swaps or the kernel kills the
run in its first epoch. So the size is estimated before anything is decoded, from the manifest's
durations (or the WAV headers where a row has none):

    per clip  (1 + seconds * sample_rate // hop) frames x n_mels float32   (the log-mel;
              the waveform, seconds * sample_rate float32, with data.mel_on_device)
              + its tokens and lengths

plus, for every clip, its reference crop (reference_frames x n_mels float32), which the pipeline
keeps in RAM to draw each epoch's references from (`references.py`). Above `RAM_SHARE` of the RAM
this process may use (cgroup limits included), the features go to a file: under `data.cache_dir`
when set, else under the folder the caller offers (the trainer offers `<run>/feature_cache`); with
neither, the error says which key to set. Crops that do not fit either are read from their files
every epoch (slower, said on the console).

A cache file is filled by one process at a time. tf.data guards the filling with `<prefix>_0.lockfile`,
which holds only a creation time: a run killed mid-fill leaves it, and every later run then fails as
"a concurrent caching iterator". Removing it unconditionally, as this module once did, lost the guard
for two live runs sharing a `data.cache_dir`. So each process that may fill a cache file first takes
an flock on `<prefix>.owner` (`claim_cache_file`) and keeps it to its end; the kernel releases it when
the process dies, however it dies. Holding it proves any tf.data lock of that prefix is a dead run's
(removed then); finding it held means a live run is filling the file: `CacheBusy` names it. A
complete cache file is read without any lock, by any number of runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from myxtts.config import DataConfig
from myxtts.data.manifest import Utterance
from myxtts.data.wav_header import BadAudioFile, read_wav_header
from myxtts.hardware.host import usable_ram_bytes

# The share of usable RAM a RAM cache may fill: the rest is the model's host side, tf.data's
# prefetch buffers (autotuned within half of usable RAM) and the validation cache.
RAM_SHARE = 0.5
# Per cached clip: tensor headers and the tf.data element around them (an estimate, not measured).
_ELEMENT_OVERHEAD_BYTES = 512
# Bumped when what a cached element holds changes, so an old cache file is never read as a new one.
_LAYOUT_VERSION = 2
# DataConfig keys that do not change the cached features (a cache file is shared across them).
NOT_FEATURE_KEYS = frozenset({"batch_size", "num_workers", "prefetch_buffer_size", "prefetch_to_gpu", "cache_dir",
                              "bucketing", "shuffle_buffer_size", "deterministic", "train_data", "val_data",
                              "val_fraction", "reference_duration_s", "service_address", "service_timeout_s"})


# The open `<prefix>.owner` files whose flock this process holds, kept open to the process's end.
_CLAIMED: dict[str, object] = {}


class CacheBusy(ValueError):
    """Another live process is filling the cache file this run would fill."""


@dataclass(frozen=True)
class CachePlan:
    """`path` for `Dataset.cache`: "" = RAM, else a file prefix. `estimated_bytes` of the features;
    `crops_in_ram`: every clip's reference crop is kept in RAM too (`references.CropTable`)."""

    path: str
    estimated_bytes: int
    crops_in_ram: bool = True
    note: str = ""  # said once on the console when the plan is not the one the config asked for

    @property
    def in_ram(self) -> bool:
        return self.path == ""


def plan_cache(c: DataConfig, utterances: list[Utterance], texts: list[str], tokens: list[str], *, seed: int,
               training: bool, fallback_dir: str | Path | None = None) -> CachePlan:
    """Where to cache the features of these rows (see the module docstring)."""
    estimate = estimate_cache_bytes(c, utterances, texts)
    crops = crop_table_bytes(c, len(utterances))
    name = f"{'train' if training else 'eval'}-{_digest(c, utterances, texts, tokens, seed)}"
    budget = int(RAM_SHARE * usable_ram_bytes())
    if not c.cache_dir and estimate + crops <= budget:
        return CachePlan("", estimate)
    crops_in_ram = crops <= budget
    slower = "" if crops_in_ram else (f"the voice references of {len(utterances)} clips (about {_gb(crops)}) do not "
                                      f"fit in {RAM_SHARE:.0%} of the RAM this process may use ({_gb(budget)}) either: "
                                      "each epoch reads them from their files (slower)")
    if c.cache_dir:
        prefix = _file_prefix(Path(c.cache_dir), name, estimate, "data.cache_dir")
        claim_cache_file(prefix)
        return CachePlan(prefix, estimate, crops_in_ram, slower)
    what = (f"the features of {len(utterances)} clips (about {_gb(estimate)}, and {_gb(crops)} of voice references) "
            f"do not fit in {RAM_SHARE:.0%} of the RAM this process may use ({_gb(budget)})")
    if fallback_dir is None:
        raise ValueError(f"{what}: set data.cache_dir to a folder with that much free disk (the cache goes to a "
                         "file there), or data.cache_features: false (features computed every epoch)")
    folder = Path(fallback_dir)
    prefix = _file_prefix(folder, name, estimate, "data.cache_dir")
    claim_cache_file(prefix)
    note = f"{what}: caching the features on disk in {folder} (data.cache_dir picks the folder)"
    return CachePlan(prefix, estimate, crops_in_ram, f"{note}; {slower}" if slower else note)


def crop_table_bytes(c: DataConfig, clips: int) -> int:
    """Bytes of every clip's reference crop held in RAM (`references.CropTable`)."""
    return clips * (c.reference_frames * c.n_mels * 4 + 4)


def estimate_cache_bytes(c: DataConfig, utterances: list[Utterance], texts: list[str]) -> int:
    """Bytes the cached features of these rows take (clips outside the duration limits are dropped)."""
    total = 0
    for utterance, text in zip(utterances, texts):
        seconds = clip_seconds(utterance)
        if seconds is not None and not c.min_duration_s <= seconds <= c.max_duration_s:
            continue
        seconds = c.max_duration_s if seconds is None else seconds  # unreadable: assume the longest kept
        samples = int(seconds * c.sample_rate)
        signal = samples * 4 if c.mel_on_device else c.frames_for_samples(samples) * c.n_mels * 4
        total += signal + 4 * (len(text) + 2) + _ELEMENT_OVERHEAD_BYTES
    return total


def clip_seconds(utterance: Utterance) -> float | None:
    """The clip's duration: the manifest's, else its WAV header's; None when neither says."""
    if utterance.duration_s is not None:
        return utterance.duration_s
    try:
        header = read_wav_header(utterance.audio_path)
    except (OSError, BadAudioFile):
        return None
    return header.frames / header.sample_rate if header is not None else None


def _file_prefix(folder: Path, name: str, estimate: int, key: str) -> str:
    prefix = folder / name
    if Path(f"{prefix}.index").exists():  # complete: read only (a shared cache may be read-only)
        return str(prefix)
    try:  # not written yet: this process writes it (and its claim) here, and it needs the room
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        free = shutil.disk_usage(folder).free
    except OSError as error:
        raise ValueError(f"cannot write the feature cache in {folder} ({error.strerror or error}): point {key} "
                         "at a folder you can write, or set data.cache_features: false") from None
    if free < estimate:
        raise ValueError(f"the feature cache needs about {_gb(estimate)} but {folder} has {_gb(free)} free: "
                         f"point {key} at a larger disk, or set data.cache_features: false")
    return str(prefix)


def claim_cache_file(prefix: str) -> None:
    """Make this process the one that may fill the cache file `prefix` (module docstring).

    A complete file (its `.index` written) needs no claim. Otherwise the flock on `<prefix>.owner`
    is taken and kept, and what a dead filler left is removed; `CacheBusy` when a live process holds it.
    """
    if prefix not in _CLAIMED:
        if Path(f"{prefix}.index").exists():
            return
        owner = open(f"{prefix}.owner", "a+", encoding="utf-8")
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner.seek(0)
            holder = owner.read().strip() or "a process"
            owner.close()
            raise CacheBusy(f"the feature cache {prefix} is being written by another training that is still running "
                            f"({holder}): wait until its first epoch has ended (the finished cache is then shared), "
                            "or point data.cache_dir at another folder") from None
        owner.seek(0)
        owner.truncate()
        owner.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        owner.flush()
        _CLAIMED[prefix] = owner
    # The claim is this process's: a tf.data lock of this prefix is a dead process's, or an earlier
    # attempt's of this one (the batch back-off builds the datasets again).
    _remove_stale_lock(prefix)


def _remove_stale_lock(prefix: str) -> None:
    # tf.data writes `<prefix>_0.lockfile` and temporary data while it fills a cache file, and removes
    # them when the pass completes or its iterator is dropped; a kill -9 leaves them, and the next
    # run would then refuse the cache as "in use by a concurrent iterator". Called only by the
    # holder of the prefix's claim (`claim_cache_file`).
    folder, name = Path(prefix).parent, Path(prefix).name
    for leftover in list(folder.glob(f"{name}_*.lockfile")) + list(folder.glob(f"{name}_*.tempstate*")):
        leftover.unlink(missing_ok=True)


def _digest(c: DataConfig, utterances, texts, tokens, seed: int) -> str:
    """Names a cache file after everything that shapes its content and order (the rows' order is
    drawn from the seed), so changing the corpus or a feature setting never reads a stale cache."""
    feature_keys = {k: v for k, v in vars(c).items() if k not in NOT_FEATURE_KEYS}
    key = json.dumps([_LAYOUT_VERSION, seed, feature_keys, [(u.audio_path, text, u.speaker) for u, text in zip(utterances, texts)],
                      tokens])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _gb(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
