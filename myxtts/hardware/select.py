"""Which GPUs to train on: `--gpu`, a remembered choice, or a question asked on a terminal.

Indices are those of the GPUs CUDA exposes (after CUDA_VISIBLE_DEVICES), i.e. `GpuFacts.index`.
Nothing here changes the environment: the caller turns the answer into CUDA_VISIBLE_DEVICES with
`cuda_visible_devices_value` before TensorFlow initializes. A question is only asked on an interactive
terminal; a batch job never hangs on a prompt.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TextIO

from myxtts.hardware.detect import GpuFacts, MachineFacts


def default_choice_path() -> Path:
    """Where an answer to the GPU question is remembered: `~/.myxtts/gpu_config.json`."""
    return Path.home() / ".myxtts" / "gpu_config.json"


ALL_GPUS = "all"


def parse_gpu_argument(text: str | None) -> list[int] | str | None:
    """`--gpu` text to indices: "1" -> [1], "0,1" -> [0, 1], "cpu" -> [], "all" -> ALL_GPUS,
    ""/"auto"/None -> None (decide: saved choice, question or default).

    Raises ValueError naming the flag for anything else.
    """
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    text = text.strip().lower()
    if text == ALL_GPUS:
        return ALL_GPUS
    if text in ("cpu", "none", "-1"):
        return []
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpu {text!r}: expected an index (0), a list (0,1), 'all' or 'cpu'") from None
    if not indices or any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"--gpu {text!r}: expected distinct non-negative indices such as 0 or 0,1")
    return indices


@dataclass(frozen=True)
class GpuSelection:
    indices: tuple[int, ...]
    source: str  # "flag", "saved", "prompt", "default", "only GPU" or "no GPU"
    messages: tuple[str, ...] = field(default_factory=tuple)


def default_gpus(gpus: Sequence[GpuFacts]) -> list[int]:
    """All GPUs of the same model as the one with the most memory.

    A mirrored step waits for the slowest replica, so mixing a small card into a big one's work only
    slows it down; identical cards all help.
    """
    if not gpus:
        return []
    best = max(gpus, key=lambda g: (g.total_memory_bytes, -g.index))
    return [g.index for g in gpus if g.name == best.name and g.total_memory_bytes == best.total_memory_bytes]


def gpu_table(gpus: Sequence[GpuFacts]) -> str:
    """A fixed-width table of the GPUs: index, name, architecture (CC), memory, free memory."""
    header = f"{'index':>5}  {'name':<40} {'architecture':<16} {'memory':>10} {'free':>10}"
    rows = [header]
    for g in gpus:
        arch = f"{g.architecture} {g.cc_text}"
        rows.append(f"{g.index:>5}  {g.name[:40]:<40} {arch:<16} {g.total_memory_bytes / 2**30:>6.1f} GiB"
                    f" {g.free_memory_bytes / 2**30:>6.1f} GiB")
    return "\n".join(rows)


def _load_saved(path: Path, gpus: Sequence[GpuFacts], messages: list[str]) -> list[int] | None:
    """The remembered choice if every GPU in it is still there under the same name, else None."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        entries = [(int(e["index"]), str(e["name"])) for e in saved["gpus"]]
    except (ValueError, KeyError, TypeError) as exc:
        messages.append(f"ignoring unreadable saved GPU choice {path} ({exc}); delete it to stop this message")
        return None
    present = {g.index: g.name for g in gpus}
    vanished = [f"{index} ({name})" for index, name in entries if present.get(index) != name]
    if vanished or not entries:
        messages.append(f"saved GPU choice in {path} names GPU(s) that no longer exist: {', '.join(vanished)}; "
                        "ignoring it")
        return None
    return [index for index, _ in entries]


def save_choice(path: Path, gpus: Sequence[GpuFacts], indices: Sequence[int]) -> None:
    by_index = {g.index: g for g in gpus}
    payload = {"gpus": [{"index": i, "name": by_index[i].name, "uuid": by_index[i].uuid} for i in indices]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))


def _ask(gpus: Sequence[GpuFacts], default: list[int], input_fn: Callable[[str], str], output: TextIO,
         messages: list[str]) -> list[int]:
    output.write("Several GPUs are available:\n" + gpu_table(gpus) + "\n")
    default_text = ",".join(map(str, default))
    valid = {g.index for g in gpus}
    for _ in range(3):
        try:
            answer = input_fn(f"GPU(s) to train on, e.g. 0 or 0,1 [Enter = {default_text}]: ")
        except EOFError:
            break
        if not answer.strip():
            return default
        try:
            chosen = parse_gpu_argument(answer)
        except ValueError as exc:
            output.write(f"{exc}\n")
            continue
        if chosen == ALL_GPUS:
            return [g.index for g in gpus]
        if chosen and set(chosen) <= valid:
            return chosen
        output.write(f"choose among {sorted(valid)}\n")
    messages.append(f"no valid answer; using GPU(s) {default_text}")
    return default


def select_gpus(facts: MachineFacts, requested: str | Sequence[int] | None = None, *,
                interactive: bool | None = None, choice_path: str | os.PathLike[str] | None = None,
                input_fn: Callable[[str], str] = input, output: TextIO | None = None) -> GpuSelection:
    """Decides the GPU indices to use.

    Order: an explicit `requested` (the `--gpu` text or a list) > a saved choice whose GPUs still exist >
    a question, only when `interactive` (default: stdin is a TTY) and there are several GPUs > all GPUs
    of the largest model (`default_gpus`). Only an answer to the question is saved.
    """
    gpus = facts.gpus
    messages: list[str] = []
    chosen = parse_gpu_argument(requested) if isinstance(requested, str) or requested is None \
        else list(requested)
    if chosen == ALL_GPUS:
        return GpuSelection(tuple(g.index for g in gpus), "flag")
    if chosen is not None:
        valid = {g.index for g in gpus}
        unknown = [i for i in chosen if i not in valid]
        if unknown:
            visible = f" (CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices!r})" if facts.cuda_visible_devices \
                is not None else ""
            raise ValueError(f"--gpu {','.join(map(str, chosen))}: GPU {unknown} does not exist; visible GPUs"
                             f"{visible}: {sorted(valid) or 'none'}")
        return GpuSelection(tuple(chosen), "flag")
    if not gpus:
        return GpuSelection((), "no GPU")
    if len(gpus) == 1:
        return GpuSelection((gpus[0].index,), "only GPU")
    path = Path(choice_path) if choice_path is not None else default_choice_path()
    saved = _load_saved(path, gpus, messages)
    if saved is not None:
        return GpuSelection(tuple(saved), "saved", (f"using the GPU choice saved in {path}",))
    default = default_gpus(gpus)
    if interactive is None:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        answer = _ask(gpus, default, input_fn, output or sys.stdout, messages)
        save_choice(path, gpus, answer)
        messages.append(f"remembered in {path}; pass --gpu to override or delete the file to be asked again")
        return GpuSelection(tuple(answer), "prompt", tuple(messages))
    messages.append(f"{len(gpus)} GPUs and no terminal to ask: using {default} (pass --gpu to choose)")
    return GpuSelection(tuple(default), "default", tuple(messages))


def cuda_visible_devices_value(facts: MachineFacts, indices: Sequence[int]) -> str:
    """The CUDA_VISIBLE_DEVICES value that exposes exactly `indices` (possibly empty: CPU only).

    UUIDs are used where known because they do not depend on CUDA's device ordering.
    """
    by_index = {g.index: g for g in facts.gpus}
    parts = []
    for i in indices:
        gpu = by_index[i]
        parts.append(gpu.uuid or str(gpu.nvml_index if gpu.nvml_index is not None else gpu.index))
    return ",".join(parts)
