"""The host side of detection: usable CPU cores, usable RAM and the platform (Linux, WSL2, Windows, macOS).

"Usable" means what this process may actually use: `os.cpu_count()` reports the machine's cores even
inside a container limited to two, which would size the input pipeline's thread pool eight times too
big. So the count is capped by the CPU affinity mask and by the cgroup CPU quota (v2 `cpu.max`, v1
`cpu.cfs_quota_us`), and RAM by the cgroup memory limit. All paths are parameters so tests can point
them at a fake tree under `tmp_path`.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

# cgroup v1 reports "no limit" as a page-rounded 2**63-1; anything this large is not a real limit.
_UNLIMITED_THRESHOLD = 2**60


@dataclass(frozen=True)
class HostPaths:
    """Where the kernel's views live; tests replace them with directories under tmp_path."""

    proc: Path = Path("/proc")
    cgroup: Path = Path("/sys/fs/cgroup")
    system: str = sys.platform
    use_affinity: bool = True  # tests turn it off so the real machine's mask does not leak in


def detect_platform(paths: HostPaths) -> str:
    """'linux', 'wsl2' (a Microsoft kernel), 'windows' or 'macos'."""
    if paths.system.startswith("win"):
        return "windows"
    if paths.system == "darwin":
        return "macos"
    try:
        version = (paths.proc / "version").read_text()
    except OSError:
        return "linux"
    # WSL kernels carry "microsoft" in their version string ("...-microsoft-standard-WSL2").
    return "wsl2" if "microsoft" in version.lower() else "linux"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_memberships(paths: HostPaths) -> dict[str, str]:
    """Maps each controller ('cpu', 'memory', and '' for cgroup v2) to this process's cgroup path."""
    text = _read(paths.proc / "self" / "cgroup") or ""
    memberships: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, cgroup_path = parts
        for controller in controllers.split(",") if controllers else [""]:
            memberships[controller] = cgroup_path
    return memberships


def _candidate_dirs(mount: Path, cgroup_path: str) -> list[Path]:
    """The process's own cgroup directory and its ancestors up to the mount point.

    A limit set on any ancestor applies too, and inside a container the host-side path is often
    absent, leaving only the mount root to read.
    """
    relative = Path(cgroup_path.lstrip("/")) if cgroup_path else Path()
    dirs = [mount / relative]
    dirs.extend(mount / parent for parent in relative.parents)
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def cgroup_cpu_limit(paths: HostPaths) -> float | None:
    """The CPU quota in cores (quota / period), the tightest along the hierarchy, or None if unlimited."""
    memberships = _cgroup_memberships(paths)
    limits: list[float] = []
    # cgroup v2: "max 100000" or "200000 100000" in cpu.max.
    for directory in _candidate_dirs(paths.cgroup, memberships.get("", "/")):
        text = _read(directory / "cpu.max")
        if text:
            quota, _, period = text.partition(" ")
            if quota != "max" and period:
                limits.append(int(quota) / int(period))
    # cgroup v1: cpu.cfs_quota_us (-1 = unlimited) over cpu.cfs_period_us.
    for mount_name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        mount = paths.cgroup / mount_name
        for directory in _candidate_dirs(mount, memberships.get("cpu", "/")):
            quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cgroup_memory_limit(paths: HostPaths) -> int | None:
    """The cgroup memory limit in bytes, the tightest along the hierarchy, or None if unlimited."""
    memberships = _cgroup_memberships(paths)
    limits: list[int] = []
    for directory in _candidate_dirs(paths.cgroup, memberships.get("", "/")):
        text = _read(directory / "memory.max")
        if text and text != "max":
            limits.append(int(text))
    for directory in _candidate_dirs(paths.cgroup / "memory", memberships.get("memory", "/")):
        text = _read(directory / "memory.limit_in_bytes")
        if text and int(text) < _UNLIMITED_THRESHOLD:
            limits.append(int(text))
    return min(limits) if limits else None


def usable_cpu_cores(paths: HostPaths) -> tuple[int, int, list[str]]:
    """(usable cores, logical cores of the machine, notes).

    A fractional quota is rounded down (at least 1): 2.5 cores of quota cannot keep three busy threads
    fed without throttling, so sizing pools for two is the safer side.
    """
    logical = os.cpu_count() or 1
    usable = logical
    notes = []
    if paths.use_affinity and hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_limit(paths) if paths.system.startswith("linux") else None
    if quota is not None and quota < usable:
        usable = max(1, math.floor(quota))
        notes.append(f"cgroup CPU quota {quota:g} cores: using {usable} of {logical} logical cores")
    return usable, logical, notes


# CPU features that run bfloat16 matrix products natively (oneDNN uses them for TensorFlow's
# matmuls and convolutions); without them bf16 is converted to float32 around every op.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags(paths: HostPaths) -> tuple[str, ...]:
    """Which of `BF16_CPU_FLAGS` the first processor of /proc/cpuinfo lists (() if unreadable)."""
    text = _read(paths.proc / "cpuinfo") or ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(flag for flag in BF16_CPU_FLAGS if flag in flags)


def cpu_model_name(paths: HostPaths | None = None) -> str:
    """The first processor's "model name" from /proc/cpuinfo ("AMD EPYC 7B13"), "" where there is none
    (macOS, Windows, and ARM kernels, which do not write that line): unknown, not guessed."""
    text = _read((paths or HostPaths()).proc / "cpuinfo") or ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")


def physical_ram_bytes(paths: HostPaths) -> int | None:
    """Total RAM of the machine (or of the WSL2 VM), None where it cannot be read."""
    meminfo = _read(paths.proc / "meminfo")
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    if paths.system.startswith("linux"):
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def usable_ram(paths: HostPaths) -> tuple[int | None, int | None, list[str]]:
    """(usable RAM, physical RAM, notes): physical RAM capped by the cgroup memory limit."""
    physical = physical_ram_bytes(paths)
    limit = cgroup_memory_limit(paths) if paths.system.startswith("linux") else None
    notes = []
    if physical is None:
        notes.append("could not read the amount of RAM; assuming a small budget for the input pipeline")
        return limit, None, notes
    if limit is not None and limit < physical:
        notes.append(f"cgroup memory limit {limit / 2**30:.1f} GiB of {physical / 2**30:.1f} GiB RAM")
        return limit, physical, notes
    return physical, physical, notes


def usable_cores() -> int:
    """Cores this process may keep busy: affinity mask and cgroup CPU quota (see usable_cpu_cores)."""
    return usable_cpu_cores(HostPaths())[0]


def usable_ram_bytes(default: int = 8 << 30) -> int:
    """RAM this process may use (cgroup limit included); `default` where it cannot be read."""
    usable, _, _ = usable_ram(HostPaths())
    return usable if usable is not None else default
