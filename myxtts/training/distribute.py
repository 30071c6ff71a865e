"""Several GPUs or several hosts: which strategy, how big the batches are, and why an update stays exact.

    one device            -> the default strategy (what a plain script gets)
    several chosen GPUs   -> tf.distribute.MirroredStrategy over them
    TF_CONFIG is set      -> tf.distribute.MultiWorkerMirroredStrategy (each host runs the same command)

`data.batch_size` is per replica; a step consumes `global_batch_size` = per replica x replicas.

Exactness. With several replicas an optimizer update must equal the single-device update for the same
global batch. Keras 3 (3.15, TensorFlow backend) does not give that by itself for this project's step:

1. Its optimizers clip (`global_clipnorm`) each replica's *local* gradient and all-reduce (sum) only
   afterwards, so clipping sees the wrong norm; and the replicas each decide "finite?" on their own
   gradients, so one could skip a step another applies.
2. Under tf.distribute's default "merge call" mode nothing that synchronises replicas (the optimizer's
   update, its gradient accumulation) may sit inside a `tf.cond` in the step. Keras' own
   `gradient_accumulation_steps` is such a cond, and so is the step's non-finite skip: both raise
   "`merge_call` called while defining a new graph" under MirroredStrategy (measured, 2 logical CPUs).

So, with several replicas:
- `all_reduce_mean` averages the gradients and losses inside the step, once, before clipping, the
  finite check and the grad-norm metric: every replica then holds the same global mean gradient and
  takes the same decisions, exactly as one device would on the whole batch.
- `prepare_optimizer` turns the optimizer's own all-reduce into a pass-through (the gradients already
  are the global mean; summing them again would multiply them by the replica count).
- The strategy runs in replica-local update mode (`_replica_local_updates`): every replica applies
  that identical update to its own copy of each variable, with no merge call, so conds around updates
  are allowed. TensorFlow itself uses this mode for XLA-compiled replica functions on GPUs.
- `training_scope` creates variables so that Keras' step counter (aggregation ONLY_FIRST_REPLICA,
  which would need a merge call to broadcast) is updated replica-locally too: every replica counts the
  same steps anyway.
The cost: with gradient accumulation, gradients are all-reduced every micro-batch instead of once per
update (accumulating locally first would put clipping back before the all-reduce).

Keras glue, each measured to fail without it: `reducible_logs` (Keras averages logs across workers
along axis 0, which scalars do not have), `evenly_split` (a replica handed an empty validation batch
fails), `distribute_dataset` (one input pipeline per host, batches per replica).

XLA: `Model.fit(jit_compile=True)` compiles the whole replicated step as one program, which cannot
reach variables on several devices (FACTS.md). `xla_allowed` is False with several replicas, and the
trainer compiles with `jit_compile=False` there; likewise with one step per call (`steps_per_execution`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Iterator, Mapping

import tensorflow as tf

from myxtts import compat
from myxtts.hardware.batch_plan import BatchPlan
from myxtts.hardware.plan import Plan


class DistributionError(ValueError):
    """A multi-device or multi-host setup that cannot work, phrased as what to change."""


# --------------------------------------------------------------------------------------------------
# Choosing the strategy


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    """This process's place in a TF_CONFIG cluster."""

    task_type: str
    task_id: int
    cluster: Mapping[str, list[str]]

    @property
    def num_workers(self) -> int:
        # "chief" plus "worker" tasks: every one of them trains.
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

    @property
    def is_chief(self) -> bool:
        # Without a "chief" task, worker 0 plays its part (TensorFlow's convention).
        return self.task_type == "chief" or (self.task_type == "worker" and self.task_id == 0)


def parse_tf_config(text: str) -> ClusterRole:
    """Checks a TF_CONFIG value and says where this process sits; errors name what to fix."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise DistributionError(f"TF_CONFIG is not valid JSON ({error}); see README 'Several hosts'") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise DistributionError('TF_CONFIG needs a "cluster" mapping, e.g. {"cluster": {"worker": '
                                '["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}')
    cluster, task = config["cluster"], config.get("task")
    for name, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and ":" in a for a in addresses):
            raise DistributionError(f'TF_CONFIG cluster "{name}" must be a list of "host:port" strings, '
                                f"got {addresses!r}")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise DistributionError('TF_CONFIG needs "task": {"type": "worker", "index": N} naming this process')
    task_type, task_id = str(task["type"]), task["index"]
    if task_type not in cluster or not isinstance(task_id, int) or not 0 <= task_id < len(cluster[task_type]):
        raise DistributionError(f"TF_CONFIG task {task_type}:{task_id} is not in the cluster "
                                f"{ {k: len(v) for k, v in cluster.items()} }")
    if task_type not in ("chief", "worker"):
        raise DistributionError(f'TF_CONFIG task type "{task_type}": MultiWorkerMirroredStrategy trains on "chief" '
                                'and "worker" tasks only')
    return ClusterRole(task_type, task_id, {name: list(addresses) for name, addresses in cluster.items()})


def strategy_for(plan_or_device_count: Plan | int, *, device_type: str = "GPU",
                 environ: Mapping[str, str] | None = None) -> tf.distribute.Strategy:
    """The strategy for a plan (its `num_replicas` GPUs) or for a number of devices of `device_type`.

    TF_CONFIG in `environ` (default: the process environment) means several hosts: every host runs
    the same command with its own TF_CONFIG, and the strategy uses all GPUs this host exposes (choose
    them with --gpu / CUDA_VISIBLE_DEVICES). Create the strategy before any other TensorFlow work:
    MultiWorkerMirroredStrategy configures the runtime's collective ops, which only works at start-up.
    """
    environ = os.environ if environ is None else environ
    if environ.get("TF_CONFIG"):
        role = parse_tf_config(environ["TF_CONFIG"])
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(dict(role.cluster)), task_type=role.task_type, task_id=role.task_id, rpc_layer="grpc")
        return _replica_local_updates(tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver))
    if isinstance(plan_or_device_count, Plan):
        plan = plan_or_device_count
        if plan.device != "gpu":
            return tf.distribute.get_strategy()
        count, device_type = plan.num_replicas, "GPU"
    else:
        count = int(plan_or_device_count)
    if count < 1:
        raise DistributionError(f"need at least one device, got {count}")
    if count == 1:
        return tf.distribute.get_strategy()
    visible = tf.config.list_logical_devices(device_type)
    if len(visible) < count:
        raise DistributionError(
            f"the plan trains on {count} {device_type}s but TensorFlow sees {len(visible)}; set CUDA_VISIBLE_DEVICES "
            "to the chosen GPUs before TensorFlow starts (train_main.py does this for --gpu)")
    # After CUDA_VISIBLE_DEVICES the chosen GPUs are TensorFlow's first `count` devices.
    return _replica_local_updates(tf.distribute.MirroredStrategy([d.name for d in visible[:count]]))


def _replica_local_updates(strategy: tf.distribute.Strategy) -> tf.distribute.Strategy:
    # The private `_use_merge_call` is the switch TensorFlow flips itself for XLA-compiled replica functions on
    # GPUs: updates of mirrored variables then run on each replica's own copy and all-reduces become
    # collective ops, instead of synchronising replicas through merge calls that no `tf.cond` may
    # contain. It is sound here because `all_reduce_mean` hands every replica the same gradients.
    compat.replica_local_updates(strategy)
    return strategy


def replicas(strategy: tf.distribute.Strategy) -> int:
    return int(strategy.num_replicas_in_sync)


def xla_allowed(strategy: tf.distribute.Strategy) -> bool:
    """Whether `Model.compile(jit_compile=True)` can run under `strategy`: only with one replica.

    XLA compiles `fit`'s step including `strategy.run` into one program, and one XLA program cannot
    read variables placed on several devices ("Trying to access resource ... located in device CPU:1
    from device CPU:0", measured). Several replicas therefore train with `jit_compile=False`.
    """
    return replicas(strategy) == 1


def steps_per_execution(requested: int, strategy: tf.distribute.Strategy) -> int:
    """`training.steps_per_execution` as `Model.fit` can run it under `strategy`: 1 with several replicas.

    Keras 3.15's multi-step loop takes each next batch inside a `tf.cond` in a `tf.while_loop`, which
    fails on a distributed iterator ("You must feed a value for placeholder tensor
    'while/body/.../while/cond/Placeholder_1'", measured on 2 logical CPUs, a one-layer model too;
    keras-team/keras#19246 looks the same).
    """
    return requested if replicas(strategy) == 1 else 1


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the one process that writes checkpoints, logs and exports (always true on one host)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)


def worker_directory(workdir: str | os.PathLike[str], strategy: tf.distribute.Strategy) -> Path:
    """Where this process writes: `workdir` on the chief, a private subfolder on other workers.

    Every worker must take part in saving a checkpoint under MultiWorkerMirroredStrategy, but only the
    chief's copy is kept; writing the others into the same files would corrupt them.
    """
    workdir = Path(workdir)
    if is_chief(strategy):
        return workdir
    resolver = strategy.cluster_resolver
    return workdir / ".workers" / f"{resolver.task_type}-{resolver.task_id}"


# --------------------------------------------------------------------------------------------------
# Building the model and optimizer


@contextlib.contextmanager
def training_scope(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """`strategy.scope()` for creating the network, the optimizer and the step's variables.

    With several replicas it also creates ONLY_FIRST_REPLICA variables (Keras' optimizer step counter)
    as replica-local ones: broadcasting replica 0's counter needs a merge call, which replica-local
    update mode does not allow inside the step's conds, and every replica counts the same steps.
    """
    with strategy.scope():
        if replicas(strategy) == 1:
            yield
            return
        with tf.variable_creator_scope(_local_counters):
            yield


def _local_counters(next_creator, **kwargs):
    if kwargs.get("aggregation") == tf.VariableAggregation.ONLY_FIRST_REPLICA:
        kwargs["aggregation"] = tf.VariableAggregation.NONE
    return next_creator(**kwargs)


def prepare_optimizer(optimizer, strategy: tf.distribute.Strategy):
    """Makes `optimizer` take the step's already averaged gradients as they are (several replicas).

    Keras' TensorFlow optimizers sum gradients across replicas inside `apply`, after clipping. The step
    averages them itself before clipping (`all_reduce_mean`), so here that sum becomes a pass-through.
    A LossScaleOptimizer delegates the update to its inner optimizer, which is the one changed.
    """
    if replicas(strategy) == 1:
        return optimizer
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if each is not None:
            compat.skip_gradient_sum(each)
    return optimizer


def all_reduce_mean(values):
    """The mean of `values` (any nest of float tensors) over all replicas; unchanged with one replica.

    Call it in the train step right after the gradients are computed, on (gradients, losses), before
    anything reads them. Each replica's loss is the mean over its own examples and every replica gets
    the same number of examples, so the mean over replicas is the mean over the global batch, and the
    mean of the gradients is the gradient of that loss: one device's numbers for the global batch.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return values
    return context.all_reduce(tf.distribute.ReduceOp.MEAN, values)


def reducible_logs(logs: dict) -> dict:
    """The step's logs in a form Keras can combine across workers: return `reducible_logs(logs)`.

    Keras 3.15 combines replica outputs under MultiWorkerMirroredStrategy with
    `strategy.reduce("MEAN", value, axis=0)`, which fails on scalars ("Invalid reduction dimension 0
    for input with 0 dimensions", tensorflow#72388). Shape [1] reduces to the scalar mean over all
    replicas. One host, any number of GPUs, keeps scalars (Keras averages those itself).
    """
    if not _across_workers(tf.distribute.get_strategy()):
        return logs
    return {name: tf.reshape(value, [1]) for name, value in logs.items()}


def _across_workers(strategy: tf.distribute.Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return False
    return sum(len(tasks) for tasks in resolver.cluster_spec().as_dict().values()) > 1


# --------------------------------------------------------------------------------------------------
# Batches


def global_batch_size(per_replica_batch: int, strategy: tf.distribute.Strategy) -> int:
    return BatchPlan(per_replica_batch, replicas=replicas(strategy)).global_batch_size


def planned_replicas(plan: Plan, environ: Mapping[str, str] | None = None) -> int:
    """Replicas in all, known before any strategy exists: this host's devices times TF_CONFIG's hosts.

    Every host is assumed to train on as many GPUs as this one (the strategy checks it once made).
    """
    environ = os.environ if environ is None else environ
    local = max(plan.num_replicas, 1)
    if environ.get("TF_CONFIG"):
        return local * parse_tf_config(environ["TF_CONFIG"]).num_workers
    return local


def with_replicas(plan: Plan, num_replicas: int) -> Plan:
    """The plan for `num_replicas` replicas in all (several hosts: the strategy's count, not this host's).

    The per-replica batch stays; accumulation is recomputed to reach the target effective batch unless
    it was configured.
    """
    if num_replicas < 1:
        raise DistributionError(f"num_replicas must be >= 1, got {num_replicas}")
    if num_replicas == plan.num_replicas:
        return plan
    return plan.with_batch_plan(plan.batch_plan.with_replicas(num_replicas),
                                sources={"num_replicas": f"auto: {num_replicas} replica(s) in the cluster"})


def distribute_dataset(strategy: tf.distribute.Strategy, per_replica_batch: int,
                       make_dataset: Callable[[int, int, int], tf.data.Dataset]):
    """The training input for `strategy`: `make_dataset(batch_size, shard_index, num_shards)`.

    One replica: `make_dataset(per_replica_batch, 0, 1)`, a plain dataset. Several: one input pipeline
    per host, each built for its own shard of the utterances (pass `rows[shard_index::num_shards]`)
    and batched per replica, so no host decodes audio another host trains on, and every replica gets
    exactly `per_replica_batch` examples (`all_reduce_mean` relies on equal replica batches). Keras'
    `fit` takes the result as it is. The dataset must not prefetch to a GPU itself: the distributed
    iterator copies each replica's batch to its device.
    """
    if replicas(strategy) == 1:
        return make_dataset(per_replica_batch, 0, 1)
    global_batch = global_batch_size(per_replica_batch, strategy)

    def for_this_host(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        return make_dataset(batch, context.input_pipeline_id, context.num_input_pipelines)

    return strategy.distribute_datasets_from_function(for_this_host)


def evenly_split(dataset: tf.data.Dataset, strategy: tf.distribute.Strategy) -> tf.data.Dataset:
    """Validation batches trimmed to a multiple of the replica count (unchanged with one replica).

    Keras splits every batch across the replicas. A last batch with fewer clips than replicas leaves a
    replica an empty batch, which the network rejects (its convolutions fail on zero clips, measured
    on CPU), and uneven shares would weight clips unequally in the averaged losses. Trimming drops at
    most replicas - 1 clips per batch: with bucketing, a few clips per validation pass.
    """
    count = replicas(strategy)
    if count == 1:
        return dataset

    def trim(batch):
        size = tf.shape(next(iter(batch.values())))[0] // count * count
        return {name: value[:size] for name, value in batch.items()}

    trimmed = dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return trimmed.filter(lambda batch: tf.shape(next(iter(batch.values())))[0] > 0)


def clips_in_even_batches(group_sizes: list[int], batch_size: int, count: int) -> int:
    """How many clips one validation pass keeps once `evenly_split` trims its batches for `count`
    replicas: each group's (length bucket's) batches of `batch_size`, its last partial one included."""
    kept_of_full = batch_size // count * count
    return sum(size // batch_size * kept_of_full + size % batch_size // count * count for size in group_sizes)


def describe(strategy: tf.distribute.Strategy) -> str:
    """One line for the training log."""
    count = replicas(strategy)
    if count == 1:
        return "distribution: one device"
    devices = ", ".join(strategy.extended.worker_devices)
    return (f"distribution: {type(strategy).__name__}, {count} replicas in all (this process: {devices}); "
            "fit without XLA (one XLA program cannot span devices), one step per call (training.steps_per_execution: "
            "Keras' multi-step loop fails under several replicas)")
