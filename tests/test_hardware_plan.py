"""Tests for myxtts.hardware.plan against device profiles (tests/data/device_profiles): names, memory and
compute capabilities from spec sheets and published nvidia-smi listings, not recorded on these cards."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from myxtts.hardware.detect import GpuFacts, MachineFacts
from myxtts.hardware.plan import (
    XLA_PAYBACK_STEPS_PER_SHAPE,
    RequestedSettings,
    base_batch_for_memory,
    kernel_support,
    plan_for_machine,
    with_measured_batch,
    with_precision,
)

PROFILES = Path(__file__).parent / "data" / "device_profiles"
GIB = 2**30
# What TensorFlow 2.21's wheel reports in tf.sysconfig.get_build_info() (checked on this machine).
TF_221_CAPABILITIES = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")

# profile -> (precision, tf32, batch, accumulation) for the base model.
EXPECTED_BASE = {
    "v100_16gb": ("mixed_float16", False, 6, 6),
    "t4": ("mixed_float16", False, 6, 6),
    "rtx_2080": ("mixed_float16", False, 2, 16),
    "rtx_3060": ("mixed_bfloat16", True, 4, 8),
    "rtx_3090": ("mixed_bfloat16", True, 8, 4),
    "a10": ("mixed_bfloat16", True, 8, 4),
    "a100_40gb": ("mixed_bfloat16", True, 12, 3),
    "a100_80gb": ("mixed_bfloat16", True, 16, 2),
    "l4": ("mixed_bfloat16", True, 8, 4),
    "rtx_4090": ("mixed_bfloat16", True, 8, 4),
    "h100_80gb": ("mixed_bfloat16", True, 16, 2),
    "rtx_pro_6000_blackwell": ("mixed_bfloat16", True, 16, 2),
    "b200": ("mixed_bfloat16", True, 32, 1),
    "cpu_only": ("float32", False, 1, 32),
}


def load(name: str) -> MachineFacts:
    return MachineFacts.from_json_file(PROFILES / f"{name}.json")


def gpu(name="Test GPU", total_gib=24.0, free_gib=None, cc=(8, 6), index=0, **extra) -> GpuFacts:
    free_gib = total_gib - 0.5 if free_gib is None else free_gib
    return GpuFacts(index=index, name=name, total_memory_bytes=int(total_gib * GIB),
                    free_memory_bytes=int(free_gib * GIB), compute_capability=cc, nvml_index=index, **extra)


def machine(*gpus: GpuFacts, cores=8, ram_gib=32.0, **extra) -> MachineFacts:
    return MachineFacts(gpus=gpus, usable_cpu_cores=cores, logical_cpu_count=cores,
                        ram_bytes=int(ram_gib * GIB), physical_ram_bytes=int(ram_gib * GIB), **extra)


def test_every_device_profile_has_an_expectation():
    assert {p.stem for p in PROFILES.glob("*.json")} == set(EXPECTED_BASE)


@pytest.mark.parametrize("name", sorted(EXPECTED_BASE))
def test_profile_plan_for_base(name):
    precision, tf32, batch, accumulation = EXPECTED_BASE[name]
    plan = plan_for_machine(load(name), "base")
    assert (plan.precision, plan.tf32, plan.batch_size, plan.gradient_accumulation_steps) == (
        precision, tf32, batch, accumulation)
    assert plan.loss_scaling == (precision == "mixed_float16")
    assert plan.xla == (name != "cpu_only")  # XLA pays on GPUs, not on a CPU
    assert plan.effective_batch_size == batch * accumulation >= 32
    # Overshoot is bounded: one fewer accumulation step would fall short of the target.
    assert batch * (accumulation - 1) < 32
    assert plan.device == ("cpu" if name == "cpu_only" else "gpu")
    assert plan.probe_batch_size == (name != "cpu_only")


@pytest.mark.parametrize("name", sorted(EXPECTED_BASE))
@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_effective_batch_reaches_target_for_every_size(name, size):
    plan = plan_for_machine(load(name), size)
    assert plan.effective_batch_size >= 32
    assert plan.gradient_accumulation_steps == math.ceil(32 / plan.batch_size)
    assert plan.batch_size <= 32


def test_smaller_models_scale_the_batch_and_cap_at_the_target():
    assert plan_for_machine(load("rtx_3060"), "small").batch_size == 8
    assert plan_for_machine(load("rtx_3060"), "tiny").batch_size == 16
    assert plan_for_machine(load("a100_80gb"), "small").batch_size == 32
    tiny_h100 = plan_for_machine(load("h100_80gb"), "tiny")
    assert (tiny_h100.batch_size, tiny_h100.gradient_accumulation_steps) == (32, 1)
    cpu_tiny = plan_for_machine(load("cpu_only"), "tiny")
    assert (cpu_tiny.batch_size, cpu_tiny.gradient_accumulation_steps) == (4, 8)


def test_memory_table_boundaries():
    assert base_batch_for_memory(int(22.5 * GIB)) == 8  # a "24 GB" A10/L4 as NVML reports it
    assert base_batch_for_memory(int(19.9 * GIB)) == 6
    assert base_batch_for_memory(int(4 * GIB)) == 1


def test_free_memory_not_total_sizes_the_batch():
    busy = gpu(total_gib=24, free_gib=13.5, other_processes_memory_bytes=10 * GIB)
    plan = plan_for_machine(machine(busy), "base")
    assert plan.batch_size == 6
    assert any("other processes hold 10.0 GiB" in r for r in plan.recommendations)


def test_explicit_batch_wins_and_accumulation_follows():
    plan = plan_for_machine(load("a100_80gb"), "base", RequestedSettings(batch_size=5))
    assert (plan.batch_size, plan.gradient_accumulation_steps, plan.effective_batch_size) == (5, 7, 35)
    assert plan.sources["batch_size"] == "config"
    assert plan.sources["gradient_accumulation_steps"].startswith("auto")
    assert plan.probe_batch_size is False


def test_explicit_batch_and_accumulation_both_win():
    requested = RequestedSettings(batch_size=4, gradient_accumulation_steps=2, effective_batch_size=32)
    plan = plan_for_machine(load("rtx_3090"), "base", requested)
    assert (plan.batch_size, plan.gradient_accumulation_steps, plan.effective_batch_size) == (4, 2, 8)
    assert any("differs from effective_batch_size 32" in r for r in plan.recommendations)


def test_explicit_accumulation_alone_keeps_memory_batch():
    plan = plan_for_machine(load("rtx_3090"), "base", RequestedSettings(gradient_accumulation_steps=2))
    assert (plan.batch_size, plan.gradient_accumulation_steps) == (8, 2)


def test_config_batch_above_memory_prior_is_flagged():
    plan = plan_for_machine(load("rtx_2080"), "base", RequestedSettings(batch_size=16))
    assert plan.batch_size == 16
    assert any("above the prior" in r for r in plan.recommendations)
    quiet = plan_for_machine(load("rtx_2080"), "base", RequestedSettings(batch_size=2))
    assert not any("above the prior" in r for r in quiet.recommendations)


def test_xla_on_a_gpu_only_when_the_run_pays_back_its_compiles():
    # Measured on an H100: ~130 s of compiling per shape against ~60 ms saved per step. The demo
    # (1,400 updates, 6 train buckets; validation is never XLA-compiled) ran in graph mode in 406 s;
    # with XLA it had done 2 steps after 428 s.
    from myxtts.config import load_config
    from myxtts.training.run_setup import compiled_step_shapes

    assert compiled_step_shapes(load_config(PROFILES.parents[2] / "configs" / "demo.yaml")) == 6
    demo = plan_for_machine(load("h100_80gb"), "small", RequestedSettings(
        batch_size=16, effective_batch_size=16, planned_updates=1400, compiled_shapes=6))
    assert demo.xla is False and "too few" in demo.sources["xla"] and "1,400 steps" in demo.sources["xla"]
    # Accumulation multiplies the steps: 8,000 updates x 4 micro-batches pay back 12 shapes.
    long = plan_for_machine(load("h100_80gb"), "base", RequestedSettings(
        batch_size=8, effective_batch_size=32, planned_updates=8000, compiled_shapes=12))
    assert long.gradient_accumulation_steps == 4 and long.xla is True and "pay back" in long.sources["xla"]
    # The threshold scales with the shapes: the same run without bucketing (50 shapes) stays in graph mode.
    unbucketed = plan_for_machine(load("h100_80gb"), "base", RequestedSettings(
        batch_size=8, effective_batch_size=32, planned_updates=8000, compiled_shapes=50))
    assert unbucketed.xla is False
    assert XLA_PAYBACK_STEPS_PER_SHAPE * 6 > 1400 * 1
    # A CPU never takes it, however long the run; an explicit value always wins.
    assert plan_for_machine(load("cpu_only"), "small", RequestedSettings(planned_updates=10**7)).xla is False
    forced = plan_for_machine(load("h100_80gb"), "small", RequestedSettings(xla=True, planned_updates=10))
    assert forced.xla is True and forced.sources["xla"] == "config"


def test_explicit_precision_tf32_xla_and_workers_win():
    requested = RequestedSettings(precision="fp32", tf32=False, xla=False, num_workers=3)
    plan = plan_for_machine(load("h100_80gb"), "base", requested)
    assert (plan.precision, plan.loss_scaling, plan.tf32, plan.xla, plan.num_parallel_calls) == (
        "float32", False, False, False, 3)
    for key in ("precision", "tf32", "xla", "num_parallel_calls"):
        assert plan.sources[key] == "config"
    fp16 = plan_for_machine(load("a100_80gb"), "base", RequestedSettings(precision="fp16"))
    assert (fp16.precision, fp16.loss_scaling) == ("mixed_float16", True)


def test_bf16_on_turing_is_kept_but_warned():
    plan = plan_for_machine(load("t4"), "base", RequestedSettings(precision="bf16"))
    assert plan.precision == "mixed_bfloat16"
    assert any("no tensor-core support" in r for r in plan.recommendations)


def test_pre_volta_gpu_uses_float32():
    plan = plan_for_machine(machine(gpu(name="Tesla P100-PCIE-16GB", total_gib=16, cc=(6, 0))), "base")
    assert (plan.precision, plan.tf32) == ("float32", False)


def test_effective_batch_target():
    assert plan_for_machine(load("t4")).sources["target_effective_batch_size"] == "auto: default 32"
    plan = plan_for_machine(load("a100_80gb"), "base", RequestedSettings(effective_batch_size=64))
    assert (plan.batch_size, plan.gradient_accumulation_steps, plan.effective_batch_size) == (16, 4, 64)
    assert plan.sources["target_effective_batch_size"] == "config"


def test_requested_settings_validation():
    assert RequestedSettings(batch_size="auto").batch_size == 0
    with pytest.raises(ValueError, match="batch_size"):
        RequestedSettings(batch_size=-1)
    with pytest.raises(ValueError, match="precision"):
        RequestedSettings(precision="fp8")
    with pytest.raises(ValueError, match="model size"):
        plan_for_machine(load("t4"), "huge")


def test_every_decision_has_a_source():
    for name in EXPECTED_BASE:
        plan = plan_for_machine(load(name), "base")
        for key in ("precision", "tf32", "xla", "batch_size", "gradient_accumulation_steps",
                    "num_parallel_calls", "private_threadpool_size", "autotune_cpu_budget",
                    "autotune_ram_budget_bytes"):
            assert plan.sources[key].startswith("auto: "), (name, key)
        assert len(plan.describe_lines()) == len(plan.sources)


def test_input_parallelism_from_cores_and_ram():
    on_gpu = plan_for_machine(machine(gpu(), cores=16, ram_gib=64), "base")
    # Two calls in flight on each of the 15 input cores, which are the thread pool and the budget.
    assert on_gpu.num_parallel_calls == 30 and on_gpu.private_threadpool_size == on_gpu.autotune_cpu_budget == 15
    assert on_gpu.autotune_ram_budget_bytes == 32 * GIB
    on_cpu = plan_for_machine(machine(cores=2, ram_gib=24), "base")
    assert on_cpu.num_parallel_calls == 2
    small_ram = plan_for_machine(machine(gpu(), cores=16, ram_gib=2), "base")
    assert small_ram.num_parallel_calls == 2  # 1 GiB budget / 512 MiB per worker
    unknown_ram = plan_for_machine(dataclasses.replace(machine(gpu(), cores=4), ram_bytes=None), "base")
    assert unknown_ram.autotune_ram_budget_bytes == 2 * GIB


def test_several_gpus_share_the_effective_batch():
    a100 = load("a100_80gb").gpus[0]
    facts = machine(a100, dataclasses.replace(a100, index=1, nvml_index=1))
    plan = plan_for_machine(facts, "base")
    assert (plan.num_replicas, plan.batch_size, plan.gradient_accumulation_steps, plan.effective_batch_size) == (
        2, 16, 1, 32)
    b200 = load("b200").gpus[0]
    pair = plan_for_machine(machine(b200, dataclasses.replace(b200, index=1, nvml_index=1)), "base")
    assert (pair.batch_size, pair.gradient_accumulation_steps, pair.effective_batch_size) == (16, 1, 32)
    mixed = machine(gpu("NVIDIA GeForce RTX 4090", 24, cc=(8, 9)),
                    gpu("NVIDIA GeForce GTX 1080", 8, cc=(6, 1), index=1))
    mixed_plan = plan_for_machine(mixed, "base")
    assert mixed_plan.precision == "float32"  # the weakest card decides
    assert mixed_plan.batch_size == 2
    assert any("chosen GPUs differ" in r for r in mixed_plan.recommendations)


def test_blackwell_profiles_name_the_missing_kernels():
    pro = plan_for_machine(load("rtx_pro_6000_blackwell"), "base")
    assert any("Blackwell" in r and "sm_120" in r for r in pro.recommendations)
    b200 = plan_for_machine(load("b200"), "base")
    assert any("sm_100" in r for r in b200.recommendations)
    assert not any("Blackwell" in r for r in plan_for_machine(load("h100_80gb")).recommendations)


def test_kernel_support_against_tensorflow_221_build():
    assert kernel_support((8, 0), TF_221_CAPABILITIES) == "native"
    assert kernel_support((8, 6), TF_221_CAPABILITIES) == "native"  # sm_80 cubins run on 8.6
    assert kernel_support((7, 5), TF_221_CAPABILITIES) == "native"
    assert kernel_support((9, 0), TF_221_CAPABILITIES) == "ptx-jit"
    assert kernel_support((12, 0), TF_221_CAPABILITIES) == "ptx-jit"
    assert kernel_support((5, 2), TF_221_CAPABILITIES) == "none"
    facts = dataclasses.replace(load("h100_80gb"), tensorflow_cuda_capabilities=TF_221_CAPABILITIES,
                                tensorflow_gpus=("NVIDIA H100 80GB HBM3",))
    assert any("only through PTX" in r for r in plan_for_machine(facts).recommendations)


def test_tensorflow_without_gpu_is_reported():
    facts = dataclasses.replace(load("rtx_4090"), tensorflow_gpus=())
    assert any("tensorflow[and-cuda]" in r for r in plan_for_machine(facts).recommendations)


def test_low_memory_suggests_gradient_checkpointing():
    plan = plan_for_machine(machine(gpu("NVIDIA GeForce GTX 1650", 4, cc=(7, 5))), "base")
    assert plan.batch_size == 1 and plan.gradient_accumulation_steps == 32
    assert any("training.gradient_checkpointing: true" in r for r in plan.recommendations)
    roomy = plan_for_machine(load("rtx_2080"), "base")
    assert not any("gradient_checkpointing" in r for r in roomy.recommendations)


def test_platform_and_mig_recommendations():
    wsl = plan_for_machine(dataclasses.replace(load("rtx_3060"), platform="wsl2"))
    assert any(r.startswith("WSL2") for r in wsl.recommendations)
    assert not any(r.startswith("WSL2") for r in plan_for_machine(load("rtx_3060")).recommendations)
    a100 = load("a100_80gb")
    mig = dataclasses.replace(a100, gpus=(dataclasses.replace(a100.gpus[0], mig_mode=True),))
    assert any("MIG is enabled" in r for r in plan_for_machine(mig).recommendations)


def test_measured_batch_replaces_prior():
    plan = plan_for_machine(load("rtx_3090"), "base")
    measured = with_measured_batch(plan, 10, "probe")
    assert (measured.batch_size, measured.gradient_accumulation_steps, measured.effective_batch_size) == (10, 4, 40)
    assert measured.sources["batch_size"].startswith("auto: measured")
    fixed = plan_for_machine(load("rtx_3090"), "base", RequestedSettings(gradient_accumulation_steps=2))
    assert with_measured_batch(fixed, 12, "probe").gradient_accumulation_steps == 2


def test_profiles_round_trip_through_json():
    for path in PROFILES.glob("*.json"):
        facts = MachineFacts.from_json_file(path)
        assert MachineFacts.from_dict(facts.to_dict()) == facts


def test_unknown_profile_key_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [], "usable_cpu_cores": 2, "ram_byte": 5}')
    with pytest.raises(ValueError, match="ram_byte"):
        MachineFacts.from_json_file(bad)


def test_cpu_precision_is_left_to_timing_with_the_flags_rule_as_its_prior():
    # Flags as /proc/cpuinfo lists them on an AMD EPYC with AVX512_BF16 (this project's CI machine)
    # and on an Intel Xeon without it, where bf16 ran 2.5x slower than float32. Training times both
    # (cpu_precision.py); the flags rule is what stands until then, or when timing cannot run.
    with_bf16 = plan_for_machine(dataclasses.replace(load("cpu_only"), cpu_bf16_flags=("avx512_bf16",)), "small")
    without = plan_for_machine(load("cpu_only"), "small")
    assert with_bf16.precision == "mixed_bfloat16" and "avx512_bf16" in with_bf16.sources["precision"]
    assert without.precision == "float32"
    for plan in (with_bf16, without):
        assert plan.probe_precision and plan.sources["precision"].startswith("auto: CPU flags rule, until timed")
    asked = plan_for_machine(dataclasses.replace(load("cpu_only"), cpu_bf16_flags=("amx_bf16",)), "small",
                             RequestedSettings(precision="fp32"))
    assert asked.precision == "float32" and asked.sources["precision"] == "config" and not asked.probe_precision
    # GPUs decide from their compute capability: nothing to time.
    assert not any(plan_for_machine(load(name), "small").probe_precision for name in EXPECTED_BASE if name != "cpu_only")

    measured = with_precision(with_bf16, "float32", "auto: measured on AMD EPYC: ...")
    assert (measured.precision, measured.loss_scaling, measured.probe_precision) == ("float32", False, False)
    assert measured.sources["loss_scaling"] == "auto: not needed by float32"
    with pytest.raises(ValueError, match="Keras policy"):
        with_precision(with_bf16, "bf16", "not a policy name")
