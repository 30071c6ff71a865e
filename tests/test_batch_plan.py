"""BatchPlan, the one owner of batch x accumulation x replicas, and the places that derive from it."""

import pytest

from myxtts.config import load_config
from myxtts.hardware.batch_plan import BatchPlan
from myxtts.hardware.detect import GpuFacts, MachineFacts
from myxtts.hardware.plan import RequestedSettings, plan_for_machine, with_measured_batch
from myxtts.training import distribute
from myxtts.training.trainer import batch_plan_of

GIB = 2**30


def test_accumulation_reaches_the_target_rounding_up():
    plan = BatchPlan.reaching(32, batch_size=6)
    assert (plan.accumulation, plan.samples_per_update, plan.global_batch_size) == (6, 36, 6)  # 36 >= 32
    assert BatchPlan.reaching(32, batch_size=8, replicas=2).accumulation == 2
    assert BatchPlan.reaching(32, batch_size=64).accumulation == 1  # a batch above the target: no accumulation
    assert BatchPlan.reaching(32, batch_size=8, accumulation=3).samples_per_update == 24  # configured: kept
    assert BatchPlan.reaching(32, batch_size=8, replicas=2).largest_useful_batch == 16


def test_derived_plans_keep_or_recompute_the_accumulation():
    automatic = BatchPlan.reaching(32, batch_size=8)
    assert automatic.with_batch(16).accumulation == 2 and automatic.with_replicas(4).accumulation == 1
    fixed = BatchPlan.reaching(32, batch_size=8, accumulation=3)
    assert fixed.with_batch(16).accumulation == 3 and fixed.with_replicas(4).samples_per_update == 96
    assert automatic.accumulation_source() == "auto: ceil(32 / (8 x 1 replica(s)))" and fixed.accumulation_source() == "config"
    halved = BatchPlan(8, 2, 2).halved()
    assert (halved.batch_size, halved.accumulation, halved.samples_per_update) == (4, 4, 32)
    with pytest.raises(ValueError, match="batch of 1"):
        BatchPlan(1).halved()
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        BatchPlan(0)
    assert BatchPlan(4, 2, 2).updates_for(33) == 3 and BatchPlan(4).updates_for(0) == 1


def _two_gpus():
    gpu = GpuFacts(index=0, name="NVIDIA L4", total_memory_bytes=23 * GIB, free_memory_bytes=22 * GIB,
                   compute_capability=(8, 9))
    return MachineFacts(gpus=(gpu, GpuFacts(**{**gpu.__dict__, "index": 1})), usable_cpu_cores=16, ram_bytes=64 * GIB)


def test_the_hardware_plan_probe_and_cluster_all_derive_from_the_batch_plan():
    plan = plan_for_machine(_two_gpus(), "base", RequestedSettings(effective_batch_size=40))
    assert plan.batch_plan == BatchPlan.reaching(40, plan.batch_size, 2)
    assert plan.effective_batch_size == plan.batch_plan.samples_per_update >= 40
    measured = with_measured_batch(plan, 6, "test")
    assert (measured.batch_size, measured.gradient_accumulation_steps) == (6, 4)  # ceil(40 / 12)
    assert measured.sources["effective_batch_size"] == "batch 6 x accumulation 4 x 2 replica(s)"
    cluster = distribute.with_replicas(measured, 8)
    assert (cluster.gradient_accumulation_steps, cluster.effective_batch_size) == (1, 48)
    assert cluster.batch_plan == BatchPlan.reaching(40, 6, 8)
    fixed = plan_for_machine(_two_gpus(), "base", RequestedSettings(gradient_accumulation_steps=3, effective_batch_size=40))
    assert distribute.with_replicas(fixed, 8).gradient_accumulation_steps == 3


def test_the_trainer_reads_the_resolved_config_as_a_batch_plan():
    config = load_config(overrides=["data.batch_size=4", "training.gradient_accumulation_steps=3"])
    assert batch_plan_of(config, replicas=2) == BatchPlan(4, 3, 2)
    assert batch_plan_of(config, replicas=2).updates_for(2.5 * 100) == 11  # 2.5 epochs of 100 clips, 24 per update


def test_no_other_module_multiplies_batch_accumulation_or_replicas():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def words(node):
        return {n.id.lower() for n in ast.walk(node) if isinstance(n, ast.Name)} | \
               {n.attr.lower() for n in ast.walk(node) if isinstance(n, ast.Attribute)}

    found = []
    for path in sorted((root / "myxtts").rglob("*.py")) + sorted((root / "utilities").glob("*.py")):
        if path.name == "batch_plan.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv)):
                names = words(node)
                if any("batch" in w for w in names) and any(k in w for w in names for k in ("accumulation", "replica")):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == [], "derive these from hardware.batch_plan.BatchPlan: " + ", ".join(found)
