"""Peak arithmetic and memory bandwidth of the GPUs the plan knows, from the vendors' spec sheets.

The capacity plan turns these into "how many audio-seconds per second would this GPU train on" and
the simulated accelerator (`diagnose_gpu_bottleneck.py --simulate-gpu`) into a step time. Every
number is the dense rate (NVIDIA's data-centre sheets print tensor-core rates "with sparsity",
twice the dense rate; those are halved here) and carries the document it comes from. None of them
was measured here: this project has no GPU.

Which rate a run gets follows the plan's precision rule (`plan.py`): bf16 tensor cores from CC 8.0,
fp16 tensor cores on 7.x, TF32 for float32 from CC 8.0 (the plan turns TF32 on there), else plain
fp32. GeForce cards are listed at their "FP16/BF16 tensor with FP32 accumulate" rate, the one mixed
precision training uses (half their FP16-accumulate rate).

Nothing here imports TensorFlow, data or model code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_T = 1e12  # TFLOP/s
_GB = 1e9  # memory bandwidth is quoted in decimal GB/s


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model. FLOP/s are dense peaks; `None` where the card has no such path."""

    key: str  # what `--simulate-gpu` takes, e.g. "H100"
    name: str  # the name NVML reports for it
    compute_capability: tuple[int, int]
    memory_bytes: int
    bf16_flops: float | None  # bf16 tensor cores (None before Ampere: emulated, slower than fp16)
    fp16_flops: float | None  # fp16 tensor cores, FP32 accumulate
    tf32_flops: float | None  # float32 matmuls on tensor cores (None before Ampere)
    fp32_flops: float  # plain float32 (CUDA cores)
    memory_bandwidth: float  # bytes/s
    source: str  # the spec sheet the numbers come from
    name_pattern: str = ""  # regex over NVML names; default: the name itself

    def matches(self, gpu_name: str) -> bool:
        pattern = self.name_pattern or re.escape(self.name) + "$"
        return re.search(pattern, gpu_name.strip(), re.IGNORECASE) is not None

    def peak_flops(self, precision: str, tf32: bool = False) -> tuple[float, str]:
        """(FLOP/s, which path) for a Keras dtype policy name, as the plan's precision rule runs it."""
        if precision == "mixed_bfloat16" and self.bf16_flops:
            return self.bf16_flops, "bf16 tensor cores"
        if precision in ("mixed_bfloat16", "mixed_float16") and self.fp16_flops:
            return self.fp16_flops, "fp16 tensor cores"
        if tf32 and self.tf32_flops:
            return self.tf32_flops, "TF32 tensor cores"
        return self.fp32_flops, "fp32 (no tensor cores)"

    @property
    def ridge_flop_per_byte(self) -> float:
        """The roofline's ridge point at bf16/fp16 peak: below this arithmetic intensity a kernel is
        limited by memory bandwidth, not by arithmetic."""
        return (self.bf16_flops or self.fp16_flops or self.fp32_flops) / self.memory_bandwidth


_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet (sparsity rates halved)"
_A100_SHEET = "NVIDIA A100 Tensor Core GPU datasheet (sparsity rates halved)"

DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec("H100", "NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30, 989.4 * _T, 989.4 * _T, 494.7 * _T, 66.9 * _T,
               3350 * _GB, _H100_SHEET + ", H100 SXM", name_pattern=r"H100 (80GB HBM3|SXM)"),
    DeviceSpec("H100-PCIe", "NVIDIA H100 PCIe", (9, 0), 80 * 2**30, 756.5 * _T, 756.5 * _T, 378 * _T, 51 * _T,
               2000 * _GB, _H100_SHEET + ", H100 PCIe"),
    DeviceSpec("H200", "NVIDIA H200", (9, 0), 141 * 10**9, 989.4 * _T, 989.4 * _T, 494.7 * _T, 66.9 * _T,
               4800 * _GB, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (sparsity rates halved)",
               name_pattern=r"H200"),
    DeviceSpec("B200", "NVIDIA B200", (10, 0), 180 * 10**9, 2250 * _T, 2250 * _T, 1100 * _T, 75 * _T,
               8000 * _GB, "NVIDIA HGX B200 datasheet, per GPU (8-GPU totals / 8, sparsity rates halved)"),
    DeviceSpec("A100-80GB", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * 2**30, 312 * _T, 312 * _T, 156 * _T, 19.5 * _T,
               2039 * _GB, _A100_SHEET + ", A100 80GB SXM"),
    DeviceSpec("A100-40GB", "NVIDIA A100-SXM4-40GB", (8, 0), 40 * 2**30, 312 * _T, 312 * _T, 156 * _T, 19.5 * _T,
               1555 * _GB, _A100_SHEET + ", A100 40GB SXM"),
    DeviceSpec("A100-PCIe-80GB", "NVIDIA A100 80GB PCIe", (8, 0), 80 * 2**30, 312 * _T, 312 * _T, 156 * _T, 19.5 * _T,
               1935 * _GB, _A100_SHEET + ", A100 80GB PCIe"),
    DeviceSpec("A100-PCIe-40GB", "NVIDIA A100-PCIE-40GB", (8, 0), 40 * 2**30, 312 * _T, 312 * _T, 156 * _T, 19.5 * _T,
               1555 * _GB, _A100_SHEET + ", A100 40GB PCIe"),
    DeviceSpec("A10", "NVIDIA A10", (8, 6), 24 * 2**30, 125 * _T, 125 * _T, 62.5 * _T, 31.2 * _T,
               600 * _GB, "NVIDIA A10 Tensor Core GPU datasheet (sparsity rates halved)"),
    DeviceSpec("L4", "NVIDIA L4", (8, 9), 24 * 2**30, 121 * _T, 121 * _T, 60 * _T, 30.3 * _T,
               300 * _GB, "NVIDIA L4 Tensor Core GPU datasheet (sparsity rates halved)"),
    DeviceSpec("T4", "Tesla T4", (7, 5), 16 * 2**30, None, 65 * _T, None, 8.1 * _T,
               320 * _GB, "NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32 rate)",
               name_pattern=r"\bT4$"),
    DeviceSpec("V100", "Tesla V100-SXM2-16GB", (7, 0), 16 * 2**30, None, 125 * _T, None, 15.7 * _T,
               900 * _GB, "NVIDIA Tesla V100 datasheet, V100 SXM2 (deep-learning tensor rate)",
               name_pattern=r"V100-SXM2"),
    DeviceSpec("RTX4090", "NVIDIA GeForce RTX 4090", (8, 9), 24 * 2**30, 165.2 * _T, 165.2 * _T, 82.6 * _T,
               82.6 * _T, 1008 * _GB, "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 (FP32-accumulate rates)"),
    DeviceSpec("RTX3090", "NVIDIA GeForce RTX 3090", (8, 6), 24 * 2**30, 71 * _T, 71 * _T, 35.6 * _T, 35.6 * _T,
               936 * _GB, "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 (FP32-accumulate rates)"),
    DeviceSpec("RTX2080", "NVIDIA GeForce RTX 2080", (7, 5), 8 * 2**30, None, 40.3 * _T, None, 10.1 * _T,
               448 * _GB, "NVIDIA Turing GPU architecture whitepaper, RTX 2080 reference clocks "
               "(FP32-accumulate rate)"),
)


def device_by_key(key: str, devices: tuple[DeviceSpec, ...] = DEVICES) -> DeviceSpec:
    """The device whose `key` (case-insensitive) or NVML name is `key`; ValueError listing the keys."""
    wanted = key.strip().lower()
    for device in devices:
        if device.key.lower() == wanted or device.name.lower() == wanted:
            return device
    raise ValueError(f"unknown GPU {key!r}; known: {', '.join(d.key for d in devices)} "
                     "(numbers from spec sheets in myxtts/hardware/devices.py)")


def device_for_gpu_name(gpu_name: str, devices: tuple[DeviceSpec, ...] = DEVICES) -> DeviceSpec | None:
    """The spec-sheet entry for a GPU as NVML names it, or None for a card not in the table."""
    return next((device for device in devices if device.matches(gpu_name)), None)
