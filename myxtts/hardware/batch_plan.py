"""How many clips make one optimizer update: per-replica batch x accumulation x replicas, in one place.

    clips per micro-step (global batch) = batch_size x replicas
    clips per update (effective batch)  = batch_size x accumulation x replicas
    accumulation (automatic)            = ceil(target / (batch_size x replicas))

The hardware plan, the batch probe, the distribution strategy and the trainer (steps from epochs,
samples/s, the out-of-memory back-off) all derive their numbers from a `BatchPlan`, so a change of
rule (rounding, the cap) happens here once. When the batch does not divide the target, automatic
accumulation rounds up: the effective batch comes out above the target, never below, because a
smaller effective batch than asked changes the optimization while a slightly larger one does not.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int  # clips per replica per micro-step
    accumulation: int = 1  # micro-steps per optimizer update
    replicas: int = 1  # devices in all, on every host
    target: int | None = None  # the effective batch aimed at (None: accumulation is all there is)
    fixed_accumulation: bool = True  # from the config; False: recomputed to reach `target`

    def __post_init__(self) -> None:
        for name in ("batch_size", "accumulation", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def reaching(cls, target: int, batch_size: int, replicas: int = 1, accumulation: int | None = None) -> "BatchPlan":
        """The plan for `target` clips per update; `accumulation` fixes it (the config's), None computes it."""
        if target < 1:
            raise ValueError(f"the effective batch must be positive, got {target}")
        if accumulation:
            return cls(batch_size, accumulation, replicas, target, fixed_accumulation=True)
        return cls(batch_size, math.ceil(target / (batch_size * replicas)), replicas, target, fixed_accumulation=False)

    @property
    def global_batch_size(self) -> int:
        """Clips in one micro-step, over all replicas."""
        return self.batch_size * self.replicas

    @property
    def samples_per_update(self) -> int:
        """Clips in one optimizer update: the effective batch."""
        return self.batch_size * self.accumulation * self.replicas

    @property
    def largest_useful_batch(self) -> int:
        """The per-replica batch whose one micro-step alone reaches the target (or the batch, without one)."""
        return math.ceil(self.target / self.replicas) if self.target else self.batch_size

    def with_batch(self, batch_size: int) -> "BatchPlan":
        """Another per-replica batch; automatic accumulation follows to keep reaching the target."""
        return self._recomputed(batch_size, self.replicas)

    def with_replicas(self, replicas: int) -> "BatchPlan":
        """Another replica count (several hosts); automatic accumulation follows."""
        return self._recomputed(self.batch_size, replicas)

    def halved(self) -> "BatchPlan":
        """Half the batch and twice the accumulation: the same effective batch (for an even batch) in
        half the activation memory. The accumulation is then fixed."""
        if self.batch_size < 2:
            raise ValueError("a batch of 1 cannot be halved")
        return dataclasses.replace(self, batch_size=self.batch_size // 2, accumulation=self.accumulation * 2,
                                   fixed_accumulation=True)

    def updates_for(self, clips: float) -> int:
        """Optimizer updates that use `clips` clips (at least one)."""
        return max(1, math.ceil(clips / self.samples_per_update))

    def accumulation_source(self) -> str:
        """Why the accumulation is what it is, for the plan's `sources`."""
        if self.fixed_accumulation:
            return "config"
        return f"auto: ceil({self.target} / ({self.batch_size} x {self.replicas} replica(s)))"

    def describe(self) -> str:
        return f"batch {self.batch_size} x accumulation {self.accumulation} x {self.replicas} replica(s)"

    def _recomputed(self, batch_size: int, replicas: int) -> "BatchPlan":
        if self.fixed_accumulation or not self.target:
            return dataclasses.replace(self, batch_size=batch_size, replicas=replicas)
        return BatchPlan.reaching(self.target, batch_size, replicas)
