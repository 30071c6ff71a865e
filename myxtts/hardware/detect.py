"""What machine is this: GPUs through NVML, CPU/RAM/platform from the host, TensorFlow only on request.

The facts are plain dataclasses so that every decision made from them (`plan.py`, `select.py`) can be
tested with device profiles (from spec sheets, tests/data/device_profiles) instead of real hardware.
Detection never raises for a missing or broken NVIDIA stack, but it tells the two apart:

* no GPU: no `pynvml`, no NVIDIA driver (NVML's DriverNotLoaded), no NVML library (LibraryNotFound)
  or NVML counting zero devices. CPU facts with a one-line note: the CPU plan is right.
* NVML failing otherwise (a driver/library version mismatch after an update, "Unknown Error" in a
  container, a lost GPU): the machine may well have GPUs, so a CPU plan would be a silent wrong
  answer. Detection warns (RuntimeWarning, and a note) and falls back to the GPUs TensorFlow lists,
  with their memory unknown (0): the plan then wants `data.batch_size` set.

TensorFlow is imported only inside `query_tensorflow_devices`, which `detect_machine` calls only when
asked: `python -m myxtts.hardware` must run on machines that have NVML but no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from myxtts.hardware.host import (HostPaths, cpu_bf16_flags, cpu_model_name, detect_platform, usable_cpu_cores,
                                  usable_ram)


def architecture_for(compute_capability: tuple[int, int]) -> str:
    """Names the NVIDIA architecture of a CUDA compute capability (major, minor)."""
    major, minor = compute_capability
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada" if minor >= 9 else "Ampere"
    if major == 9:
        return "Hopper"
    # 10.x: B200/B300 data-centre parts, 11.0: Thor, 12.x: RTX 50xx / RTX PRO / DGX Spark.
    if major in (10, 11, 12):
        return "Blackwell"
    older = {6: "Pascal", 5: "Maxwell", 3: "Kepler"}
    if major in older:
        return older[major]
    if major > 12:
        return f"post-Blackwell (CC {major}.{minor})"
    return f"unknown (CC {major}.{minor})"


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as the training process will see it.

    `index` is the position among the devices CUDA will expose (after CUDA_VISIBLE_DEVICES), which is
    what TensorFlow calls `GPU:index`; `nvml_index` is NVML's own, machine-wide number.
    """

    index: int
    name: str
    total_memory_bytes: int
    free_memory_bytes: int
    compute_capability: tuple[int, int]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    mig_mode: bool | None = None
    other_processes_memory_bytes: int | None = None
    nvml_index: int | None = None
    uuid: str | None = None

    @property
    def architecture(self) -> str:
        return architecture_for(self.compute_capability)

    @property
    def cc_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        # Derived, written for readers of the JSON; ignored when loading.
        data["architecture"] = self.architecture
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GpuFacts":
        values = _checked_fields(cls, data, derived={"architecture"}, what="GPU facts")
        major, minor = values["compute_capability"]
        values["compute_capability"] = (int(major), int(minor))
        return cls(**values)


@dataclass(frozen=True)
class MachineFacts:
    """Everything the plan needs to know about the machine; `notes` say what could not be detected."""

    gpus: tuple[GpuFacts, ...] = ()
    usable_cpu_cores: int = 1
    logical_cpu_count: int = 1
    ram_bytes: int | None = None  # usable: physical RAM capped by a cgroup memory limit
    physical_ram_bytes: int | None = None
    platform: str = "linux"  # linux | wsl2 | windows | macos
    tensorflow_gpus: tuple[str, ...] | None = None  # None: TensorFlow not queried or not importable
    tensorflow_cuda_capabilities: tuple[str, ...] | None = None  # e.g. ("sm_80", "compute_90")
    cuda_visible_devices: str | None = None
    cpu_bf16_flags: tuple[str, ...] = ()  # e.g. ("avx512_bf16",): the CPU computes in bfloat16 natively
    cpu_model: str = ""  # /proc/cpuinfo's "model name"; "" where unknown
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Accept lists (as JSON gives them) but store tuples so the facts stay hashable and immutable.
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "cpu_bf16_flags", tuple(self.cpu_bf16_flags))
        for name in ("tensorflow_gpus", "tensorflow_cuda_capabilities"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def with_gpus(self, indices: list[int] | tuple[int, ...]) -> "MachineFacts":
        """The same machine restricted to the chosen GPUs (indices as in `GpuFacts.index`)."""
        by_index = {gpu.index: gpu for gpu in self.gpus}
        missing = [i for i in indices if i not in by_index]
        if missing:
            raise ValueError(f"GPU index {missing} not among the visible GPUs {sorted(by_index)}")
        return dataclasses.replace(self, gpus=tuple(by_index[i] for i in indices))

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["gpus"] = [gpu.to_dict() for gpu in self.gpus]
        for name in ("notes", "tensorflow_gpus", "tensorflow_cuda_capabilities"):
            if data[name] is not None:
                data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MachineFacts":
        values = _checked_fields(cls, data, derived={"description"}, what="machine facts")
        values["gpus"] = tuple(GpuFacts.from_dict(gpu) for gpu in values.get("gpus", ()))
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> "MachineFacts":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _checked_fields(cls: type, data: Mapping[str, Any], derived: set[str], what: str) -> dict[str, Any]:
    """Refuses unknown keys by name, so a typo in a device profile cannot silently become a default."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known - derived)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {what}; valid keys: {sorted(known)}")
    return {key: value for key, value in data.items() if key in known}


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def _optional(nvml: Any, call, *args):
    """Queries that consumer cards or containers legitimately refuse (MIG, process lists) become None."""
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def _other_processes_memory(nvml: Any, handle: Any) -> int | None:
    seen: dict[int, int] = {}
    known = False
    for call_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        call = getattr(nvml, call_name, None)
        processes = _optional(nvml, call, handle) if call else None
        if processes is None:
            continue
        known = True
        for process in processes:
            # A process using both compute and graphics is listed twice; usedGpuMemory is None where
            # the driver hides it (Windows WDDM, some containers).
            if process.pid != os.getpid() and process.usedGpuMemory is not None:
                seen[process.pid] = max(seen.get(process.pid, 0), int(process.usedGpuMemory))
    return sum(seen.values()) if known else None


def _cuda_version_text(version: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{version // 1000}.{(version % 1000) // 10}"


def query_nvml_gpus(nvml: Any) -> list[GpuFacts]:
    """All GPUs NVML sees, indexed by NVML. Raises whatever NVML raises; `detect_machine` reports it."""
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_raw = _optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        cuda = _cuda_version_text(cuda_raw) if cuda_raw else None
        gpus = []
        for nvml_index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            mig = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
            uuid = _optional(nvml, nvml.nvmlDeviceGetUUID, handle)
            gpus.append(
                GpuFacts(
                    index=nvml_index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    total_memory_bytes=int(memory.total),
                    free_memory_bytes=int(memory.free),
                    compute_capability=(int(major), int(minor)),
                    driver_version=driver,
                    cuda_driver_version=cuda,
                    mig_mode=None if mig is None else bool(mig[0]),
                    other_processes_memory_bytes=_other_processes_memory(nvml, handle),
                    nvml_index=nvml_index,
                    uuid=None if uuid is None else _text(uuid),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def apply_cuda_visible_devices(gpus: list[GpuFacts], value: str | None) -> tuple[list[GpuFacts], list[str]]:
    """Keeps the GPUs CUDA_VISIBLE_DEVICES exposes, in its order, renumbered 0..n-1 as CUDA will.

    Entries are NVML indices or (prefixes of) GPU UUIDs. Like CUDA, the list stops at the first entry
    that names no device. Integers are read in NVML's PCI bus order; CUDA's default order is
    "fastest first", which only agrees when CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are identical.
    """
    if value is None:
        return gpus, []
    notes = []
    chosen: list[GpuFacts] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            break
        if entry.startswith("MIG-"):
            notes.append(f"CUDA_VISIBLE_DEVICES names MIG device {entry}; MIG slices are not mapped, "
                         "memory shown is the whole card's")
            return gpus, notes
        match = None
        if entry.lstrip("-").isdigit():
            match = next((g for g in gpus if g.nvml_index == int(entry)), None)
        else:
            match = next((g for g in gpus if g.uuid and g.uuid.startswith(entry)), None)
        if match is None or match in chosen:
            if entry != "-1":
                notes.append(f"CUDA_VISIBLE_DEVICES entry {entry!r} names no GPU; CUDA ignores it and "
                             "every entry after it")
            break
        chosen.append(match)
    visible = [dataclasses.replace(g, index=i) for i, g in enumerate(chosen)]
    notes.append(f"CUDA_VISIBLE_DEVICES={value!r}: {len(visible)} of {len(gpus)} GPU(s) visible")
    return visible, notes


# NVML error codes (nvml.h) that mean "there is no NVIDIA GPU stack here", so a CPU plan is right.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12


def nvml_error_means_no_gpu(nvml: Any, error: BaseException) -> bool:
    """True for NVML's "driver not loaded" and "library not found"; False for every other failure."""
    codes = {getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED),
             getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND)}
    return isinstance(error, getattr(nvml, "NVMLError", ())) and getattr(error, "value", None) in codes


def tensorflow_gpu_list() -> list[tuple[str, tuple[int, int]]]:
    """(name, compute capability) of each GPU TensorFlow lists; [] without TensorFlow. Lists physical
    devices only, which does not start the runtime (memory growth can still be set afterwards)."""
    try:
        tf = importlib.import_module("tensorflow")
    except ImportError:
        return []
    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        major, minor = details.get("compute_capability", (0, 0))
        found.append((str(details.get("device_name", device.name)), (int(major), int(minor))))
    return found


def _after_nvml_failure(error: BaseException, list_gpus: Callable[[], list]) -> tuple[list[GpuFacts], str]:
    """GPUs from TensorFlow's list when NVML failed for a reason other than "no GPU", and the warning."""
    failure = f"NVML failed ({type(error).__name__}: {error})"
    listed = list_gpus()
    if not listed:
        return [], (f"{failure} and TensorFlow lists no GPU: planning for CPU. If this machine has an NVIDIA GPU, "
                    "`nvidia-smi` shows the same error: fix the driver (after a driver update, reboot or reload "
                    "the nvidia kernel module)")
    gpus = [GpuFacts(index=i, name=name, total_memory_bytes=0, free_memory_bytes=0, compute_capability=cc)
            for i, (name, cc) in enumerate(listed)]
    return gpus, (f"{failure}, but TensorFlow lists {len(gpus)} GPU(s) ({', '.join(n for n, _ in listed)}): "
                  "planning for them with their memory unknown, so set data.batch_size (the automatic batch "
                  "needs NVML's memory figures), and fix NVML (`nvidia-smi` shows the same error)")


def query_tensorflow_devices() -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, list[str]]:
    """GPU names TensorFlow lists and the CUDA architectures its build carries kernels for.

    Listing physical devices and reading device details does not initialize the GPU runtime, so memory
    growth can still be configured afterwards. Nothing here creates logical devices or tensors.
    """
    try:
        tf = importlib.import_module("tensorflow")
    except ImportError as exc:
        return None, None, [f"TensorFlow not importable ({exc}); TensorFlow checks skipped"]
    names = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        names.append(str(details.get("device_name", device.name)))
    build = dict(tf.sysconfig.get_build_info())
    capabilities = build.get("cuda_compute_capabilities")
    return tuple(names), (tuple(capabilities) if capabilities else None), []


def detect_machine(
    query_tensorflow: bool = False,
    *,
    nvml_module: Any | None = None,
    environ: Mapping[str, str] | None = None,
    host_paths: HostPaths | None = None,
    tensorflow_gpu_lister: Callable[[], list[tuple[str, tuple[int, int]]]] = tensorflow_gpu_list,
) -> MachineFacts:
    """Detects GPUs (NVML), usable CPU cores and RAM (affinity and cgroup limits) and the platform.

    Never raises for a missing driver, a missing `pynvml` or an NVML error. No GPU stack gives
    CPU-only facts with a note; any other NVML failure warns and falls back to `tensorflow_gpu_lister()`
    (see the module docstring). `nvml_module`, `environ`, `host_paths` and `tensorflow_gpu_lister` exist so
    tests can stand in for them.
    """
    environ = os.environ if environ is None else environ
    host_paths = host_paths or HostPaths()
    notes: list[str] = []

    gpus: list[GpuFacts] = []
    listed_by_tensorflow = False  # TensorFlow's list already honours CUDA_VISIBLE_DEVICES
    nvml = nvml_module
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            notes.append("nvidia-ml-py (pynvml) not installed: no GPU detection; planning for CPU")
    if nvml is not None:
        try:
            gpus = query_nvml_gpus(nvml)
        # No NVML failure stops the program (a report must still print); which failures mean "no GPU"
        # and which must not quietly become a CPU plan is decided here.
        except Exception as exc:  # noqa: BLE001
            if nvml_error_means_no_gpu(nvml, exc):
                notes.append(f"NVML unavailable ({type(exc).__name__}: {exc}); planning for CPU")
                gpus = []
            else:
                gpus, warning = _after_nvml_failure(exc, tensorflow_gpu_lister)
                listed_by_tensorflow = bool(gpus)
                warnings.warn(warning, RuntimeWarning, stacklevel=2)
                notes.append(warning)
        if not gpus and not notes:
            notes.append("NVML reports no GPU; planning for CPU")

    visible_value = environ.get("CUDA_VISIBLE_DEVICES")
    if gpus and not listed_by_tensorflow:
        gpus, visible_notes = apply_cuda_visible_devices(gpus, visible_value)
        notes.extend(visible_notes)
        names = {g.name for g in gpus}
        if len(names) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            notes.append("different GPU models present: set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers "
                         "them as NVML (and this report) do")

    cores, logical, core_notes = usable_cpu_cores(host_paths)
    ram, physical_ram, ram_notes = usable_ram(host_paths)
    notes.extend(core_notes + ram_notes)

    tf_gpus = tf_caps = None
    if query_tensorflow:
        tf_gpus, tf_caps, tf_notes = query_tensorflow_devices()
        notes.extend(tf_notes)

    return MachineFacts(
        gpus=tuple(gpus),
        usable_cpu_cores=cores,
        logical_cpu_count=logical,
        ram_bytes=ram,
        physical_ram_bytes=physical_ram,
        platform=detect_platform(host_paths),
        tensorflow_gpus=tf_gpus,
        tensorflow_cuda_capabilities=tf_caps,
        cuda_visible_devices=visible_value,
        cpu_bf16_flags=cpu_bf16_flags(host_paths),
        cpu_model=cpu_model_name(host_paths),
        notes=tuple(notes),
    )
