"""Tests for myxtts.hardware.detect and host: a fake NVML, fake /proc and cgroup trees, no real GPU."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from myxtts.hardware.detect import (
    GpuFacts,
    MachineFacts,
    apply_cuda_visible_devices,
    architecture_for,
    detect_machine,
    nvml_error_means_no_gpu,
)
from myxtts.hardware.plan import plan_for_machine
from myxtts.hardware.host import (
    HostPaths,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    detect_platform,
    usable_cpu_cores,
    usable_ram,
)

GIB = 2**30
MIB = 2**20


class FakeNvml:
    """Just the pynvml calls detection makes, over a list of device dicts; `fail` names a call to break
    and `error_code` the NVML error it raises (999 Unknown Error by default; 9 driver not loaded,
    12 library not found, 18 driver/library version mismatch), carried in `.value` as pynvml does."""

    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12

    class NVMLError(Exception):
        def __init__(self, message, value=999):
            super().__init__(message)
            self.value = value

    def __init__(self, devices, fail=None, error_code=999):
        self.devices = devices
        self.fail = fail
        self.error_code = error_code
        self.shutdown_calls = 0

    def _check(self, call):
        if self.fail == call:
            raise self.NVMLError(f"{call} failed: Unknown Error", self.error_code)

    def nvmlInit(self):
        self._check("init")

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"  # older bindings return bytes

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        self._check("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check("memory")
        return SimpleNamespace(total=handle["total"], free=handle["free"], used=handle["total"] - handle["free"])

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle["cc"]

    def nvmlDeviceGetMigMode(self, handle):
        if "mig" not in handle:
            raise self.NVMLError("Not Supported")  # what GeForce cards answer
        return [handle["mig"], handle["mig"]]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in handle.get("procs", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        if handle.get("graphics_denied"):
            raise self.NVMLError("No Permission")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in handle.get("graphics", [])]


def device(i, name="NVIDIA A100-SXM4-80GB", total_mib=81920, free_mib=81000, cc=(8, 0), **extra):
    return {"name": name, "total": total_mib * MIB, "free": free_mib * MIB, "cc": cc,
            "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", **extra}


def host(tmp_path, cgroup_lines="0::/\n", meminfo_kb=16 * 1024 * 1024, version="Linux version 6.8.0-generic"):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_lines)
    (proc / "meminfo").write_text(f"MemTotal:       {meminfo_kb} kB\nMemFree:  1000 kB\n")
    (proc / "version").write_text(version)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    return HostPaths(proc=proc, cgroup=cgroup, system="linux", use_affinity=False)


def test_architecture_names():
    expected = {(7, 0): "Volta", (7, 2): "Volta", (7, 5): "Turing", (8, 0): "Ampere", (8, 6): "Ampere",
                (8, 7): "Ampere", (8, 9): "Ada", (9, 0): "Hopper", (10, 0): "Blackwell", (12, 0): "Blackwell",
                (6, 1): "Pascal"}
    for cc, name in expected.items():
        assert architecture_for(cc) == name, cc
    assert "unknown" in architecture_for((2, 0))


def test_nvml_gpus_become_facts(tmp_path):
    nvml = FakeNvml([device(0, mig=0, procs=[(4242, 2 * GIB), (os.getpid(), 5 * GIB)], graphics=[(4242, GIB)]),
                     device(1, name="NVIDIA GeForce RTX 4090", total_mib=24564, free_mib=23000, cc=(8, 9))])
    facts = detect_machine(nvml_module=nvml, environ={}, host_paths=host(tmp_path))
    assert [g.name for g in facts.gpus] == ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"]
    a100, rtx = facts.gpus
    assert (a100.index, a100.nvml_index, a100.compute_capability, a100.architecture) == (0, 0, (8, 0), "Ampere")
    assert a100.total_memory_bytes == 81920 * MIB and a100.free_memory_bytes == 81000 * MIB
    assert (a100.driver_version, a100.cuda_driver_version, a100.mig_mode) == ("550.54.15", "12.4", False)
    # Our own process is not "other"; a pid in both lists counts once, at its larger figure.
    assert a100.other_processes_memory_bytes == 2 * GIB
    assert rtx.mig_mode is None  # "Not Supported" is not an error
    assert nvml.shutdown_calls == 1
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in facts.notes)  # two different models


@pytest.mark.parametrize("code", [9, 12])  # driver not loaded, NVML library not found
def test_no_nvidia_driver_gives_cpu_facts_and_a_note(tmp_path, code):
    facts = detect_machine(nvml_module=FakeNvml([device(0)], fail="init", error_code=code), environ={},
                           host_paths=host(tmp_path),
                           tensorflow_gpu_lister=lambda: pytest.fail("no driver: TensorFlow is not asked"))
    assert facts.gpus == ()
    assert len([n for n in facts.notes if "NVML unavailable" in n and "planning for CPU" in n]) == 1


A100_FROM_TENSORFLOW = [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0))]


@pytest.mark.parametrize("fail,code", [("init", 999), ("init", 18), ("count", 999), ("memory", 999)])
def test_other_nvml_errors_warn_and_plan_for_the_gpus_tensorflow_lists(tmp_path, fail, code):
    # "Unknown Error" or a driver/library version mismatch on a GPU machine: not "no GPU".
    nvml = FakeNvml([device(0), device(1)], fail=fail, error_code=code)
    with pytest.warns(RuntimeWarning, match=r"NVML failed .*TensorFlow lists 2 GPU\(s\).*set data\.batch_size"):
        facts = detect_machine(nvml_module=nvml, environ={"CUDA_VISIBLE_DEVICES": "0,1"}, host_paths=host(tmp_path),
                               tensorflow_gpu_lister=lambda: A100_FROM_TENSORFLOW)
    assert [(g.index, g.name, g.compute_capability, g.total_memory_bytes) for g in facts.gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", (8, 0), 0), (1, "NVIDIA A100-SXM4-80GB", (8, 0), 0)]
    assert any("Unknown Error" in n and "fix NVML" in n for n in facts.notes)
    plan = plan_for_machine(facts, "base")
    assert plan.device == "gpu" and plan.num_replicas == 2 and plan.precision == "mixed_bfloat16"
    assert plan.batch_size == 1 and not plan.probe_batch_size  # memory unknown: smallest prior, nothing to probe against
    assert "set data.batch_size" in plan.sources["batch_size"]
    assert any("GPU memory unknown" in n for n in plan.recommendations)


def test_other_nvml_errors_without_a_tensorflow_gpu_warn_and_plan_for_cpu(tmp_path):
    with pytest.warns(RuntimeWarning, match="TensorFlow lists no GPU: planning for CPU.*nvidia-smi"):
        facts = detect_machine(nvml_module=FakeNvml([device(0)], fail="init"), environ={}, host_paths=host(tmp_path),
                               tensorflow_gpu_lister=lambda: [])
    assert facts.gpus == () and "Unknown Error" in facts.notes[0]


def test_fake_pynvml_module_through_import(monkeypatch, tmp_path):
    fake = FakeNvml([device(0)], fail="init", error_code=9)
    module = types.ModuleType("pynvml")
    for name in dir(fake):
        if name.startswith(("nvml", "NVML")):
            setattr(module, name, getattr(fake, name))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    facts = detect_machine(environ={}, host_paths=host(tmp_path))
    assert facts.gpus == () and "NVML unavailable" in facts.notes[0]


def test_real_pynvml_errors_are_classified():
    pynvml = pytest.importorskip("pynvml")
    assert nvml_error_means_no_gpu(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert nvml_error_means_no_gpu(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert not nvml_error_means_no_gpu(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    assert not nvml_error_means_no_gpu(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    assert not nvml_error_means_no_gpu(pynvml, OSError("libnvidia-ml.so: undefined symbol"))


def test_missing_pynvml_gives_cpu_facts(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    facts = detect_machine(environ={}, host_paths=host(tmp_path))
    assert facts.gpus == ()
    assert facts.notes[0].startswith("nvidia-ml-py (pynvml) not installed")


def test_this_machine_without_nvml_library_does_not_crash():
    facts = detect_machine()
    assert facts.usable_cpu_cores >= 1
    if not facts.gpus:  # the development machine: NVML's library is absent
        assert any("planning for CPU" in n for n in facts.notes)


def test_no_gpu_reported_by_nvml(tmp_path):
    facts = detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=host(tmp_path))
    assert facts.gpus == () and facts.notes[0] == "NVML reports no GPU; planning for CPU"


def test_cuda_visible_devices_filters_and_renumbers(tmp_path):
    nvml = FakeNvml([device(i) for i in range(4)])
    facts = detect_machine(nvml_module=nvml, environ={"CUDA_VISIBLE_DEVICES": "3,1"}, host_paths=host(tmp_path))
    assert [(g.index, g.nvml_index) for g in facts.gpus] == [(0, 3), (1, 1)]
    assert facts.cuda_visible_devices == "3,1"
    hidden = detect_machine(nvml_module=nvml, environ={"CUDA_VISIBLE_DEVICES": ""}, host_paths=host(tmp_path / "b"))
    assert hidden.gpus == ()


def test_cuda_visible_devices_uuid_and_invalid_entries():
    gpus = [GpuFacts(i, "G", GIB, GIB, (8, 0), nvml_index=i, uuid=f"GPU-{i}abc") for i in range(3)]
    visible, _ = apply_cuda_visible_devices(gpus, "GPU-2a,0")
    assert [g.nvml_index for g in visible] == [2, 0]
    # Like CUDA, everything after an entry that names no device is dropped.
    visible, notes = apply_cuda_visible_devices(gpus, "1,7,2")
    assert [g.nvml_index for g in visible] == [1]
    assert any("'7' names no GPU" in n for n in notes)


def test_cgroup_v2_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    paths = host(tmp_path, cgroup_lines="0::/user.slice/job\n")
    job = paths.cgroup / "user.slice" / "job"
    job.mkdir(parents=True)
    (job / "cpu.max").write_text("250000 100000\n")
    (job / "memory.max").write_text("max\n")
    (paths.cgroup / "user.slice" / "memory.max").write_text(f"{4 * GIB}\n")  # an ancestor's limit applies
    assert cgroup_cpu_limit(paths) == 2.5
    cores, logical, notes = usable_cpu_cores(paths)
    assert (cores, logical) == (2, 16)  # 2.5 cores of quota round down
    assert "cgroup CPU quota 2.5" in notes[0]
    ram, physical, ram_notes = usable_ram(paths)
    assert (ram, physical) == (4 * GIB, 16 * GIB)
    assert "cgroup memory limit 4.0 GiB" in ram_notes[0]


def test_cgroup_v1_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    paths = host(tmp_path, cgroup_lines="4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    cpu_dir = paths.cgroup / "cpu,cpuacct" / "docker" / "abc"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu_dir / "cpu.cfs_period_us").write_text("100000\n")
    memory_root = paths.cgroup / "memory"
    (memory_root / "docker" / "abc").mkdir(parents=True)
    (memory_root / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"
    (memory_root / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    assert usable_cpu_cores(paths)[0] == 3
    assert cgroup_memory_limit(paths) == 2 * GIB


def test_unlimited_cgroups(tmp_path):
    paths = host(tmp_path)
    (paths.cgroup / "cpu.max").write_text("max 100000\n")
    (paths.cgroup / "memory.max").write_text("max\n")
    cpu_v1 = paths.cgroup / "cpu"
    cpu_v1.mkdir()
    (cpu_v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (cpu_v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(paths) is None and cgroup_memory_limit(paths) is None
    assert usable_ram(paths)[:2] == (16 * GIB, 16 * GIB)


def test_platforms(tmp_path):
    wsl = host(tmp_path / "w", version="Linux version 5.15.153.1-microsoft-standard-WSL2 (root@...)")
    assert detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=wsl).platform == "wsl2"
    assert detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=host(tmp_path / "l")).platform == "linux"
    assert detect_platform(HostPaths(proc=tmp_path / "none", system="win32")) == "windows"
    assert detect_platform(HostPaths(proc=tmp_path / "none", system="darwin")) == "macos"


def test_tensorflow_not_queried_unless_asked(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    facts = detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=host(tmp_path))
    assert facts.tensorflow_gpus is None
    assert not any("TensorFlow" in n for n in facts.notes)
    asked = detect_machine(query_tensorflow=True, nvml_module=FakeNvml([]), environ={}, host_paths=host(tmp_path / "b"))
    assert asked.tensorflow_gpus is None
    assert any("TensorFlow not importable" in n for n in asked.notes)


def test_tensorflow_query_only_lists_devices(monkeypatch, tmp_path):
    # A stand-in exposing only the calls allowed before the runtime starts: anything that would create
    # logical devices or tensors is absent and would raise AttributeError.
    physical = SimpleNamespace(name="/physical_device:GPU:0", device_type="GPU")
    fake_tf = SimpleNamespace(
        config=SimpleNamespace(
            list_physical_devices=lambda kind: [physical] if kind == "GPU" else [],
            experimental=SimpleNamespace(get_device_details=lambda d: {"device_name": "NVIDIA A100-SXM4-80GB",
                                                                       "compute_capability": (8, 0)}),
        ),
        sysconfig=SimpleNamespace(get_build_info=lambda: {"cuda_compute_capabilities": ["sm_80", "compute_90"]}),
    )
    monkeypatch.setitem(sys.modules, "tensorflow", fake_tf)
    facts = detect_machine(query_tensorflow=True, nvml_module=FakeNvml([device(0)]), environ={},
                           host_paths=host(tmp_path))
    assert facts.tensorflow_gpus == ("NVIDIA A100-SXM4-80GB",)
    assert facts.tensorflow_cuda_capabilities == ("sm_80", "compute_90")


def test_detected_facts_round_trip_through_json(tmp_path):
    facts = detect_machine(nvml_module=FakeNvml([device(0, mig=1)]), environ={"CUDA_VISIBLE_DEVICES": "0"},
                           host_paths=host(tmp_path))
    path = tmp_path / "facts.json"
    path.write_text(facts.to_json())
    assert MachineFacts.from_json_file(path) == facts
    assert facts.gpus[0].mig_mode is True


def test_cpu_bf16_flags_and_model_are_read_from_cpuinfo(tmp_path):
    paths = host(tmp_path)
    (paths.proc / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD EPYC 9B14\n"
                                       "flags\t\t: fpu sse avx512f avx512_bf16 avx512_vnni\n\n"
                                       "processor\t: 1\nmodel name\t: AMD EPYC 9B14\n"
                                       "flags\t\t: fpu sse avx512f avx512_bf16 avx512_vnni\n")
    facts = detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=paths)
    assert (facts.cpu_bf16_flags, facts.cpu_model) == (("avx512_bf16",), "AMD EPYC 9B14")
    (paths.proc / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")  # as ARM: no model name
    facts = detect_machine(nvml_module=FakeNvml([]), environ={}, host_paths=paths)
    assert (facts.cpu_bf16_flags, facts.cpu_model) == ((), "")
