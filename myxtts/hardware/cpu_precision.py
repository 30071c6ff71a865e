"""Precision on a CPU by measurement: time float32 and bf16 train steps once per setup, keep the faster.

    probe_cpu_precision(config, plan, facts, child_module=...)   in the training process, before its model
      -> plan.probe_precision? (a CPU and training.precision: auto)  else the plan unchanged
      -> several hosts (TF_CONFIG)? the plan's flags rule stands      (hosts must agree; none times alone)
      -> cache hit? use it          (PrecisionKey: CPU model, cores, model and step settings, batch, versions)
      -> python -m <child_module> --config run.yaml  -> one JSON line: step times per policy
      -> mixed_bfloat16 only if its median step is >= MIN_BF16_GAIN faster than float32's

Why measure: whether bf16 pays on a CPU depends on the CPU, and its flags do not say by how much. On
an AMD EPYC with AVX512_BF16 the `small` step was 1.2-1.4x faster in bf16; on an Intel Xeon without
it 2.5x slower (BENCHMARKS.md). Why a margin: bf16 keeps 8 bits of mantissa, so a run in it is
noisier and can diverge where float32 would not; a gain within the timing noise of a shared machine
is not worth that. The child (`myxtts.training.precision_probe`, named by the trainer: this package
imports nothing from training) runs in its own process so the training process's Keras policy and
TensorFlow state stay untouched.

When the child fails as a whole (a crash, a timeout, a killed process) nothing was learnt about
either policy: the plan's flags rule stands, with a warning, because it is the best guess without a
measurement and the value `python -m myxtts.hardware` shows. A failure of bf16 alone is an answer
(the child reports it): float32.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import Plan, with_precision
from myxtts.hardware.probe import ProbeCache, config_hash
from myxtts.hardware.probe_runner import child_environment

MIN_BF16_GAIN = 0.10  # bf16's median step must be at least 10% shorter than float32's
CHILD_TIMEOUT_S = 900  # two traces of the base model on a slow CPU take minutes
CACHE_FOLDER = "precision"


def cpu_label(facts: MachineFacts) -> str:
    """The CPU's model name, or what is known of it where /proc/cpuinfo has none (ARM, macOS)."""
    return facts.cpu_model or f"unknown {platform.machine() or 'CPU'} CPU"


def library_versions() -> str:
    """TensorFlow's and Keras's versions, read from the installed packages (no import of TensorFlow)."""
    found = []
    for names in (("tensorflow", "tensorflow-cpu", "tf-nightly"), ("keras",)):
        for name in names:
            try:
                found.append(f"{name} {metadata.version(name)}")
                break
            except metadata.PackageNotFoundError:
                continue
    return ", ".join(found) or "unknown"


@dataclass(frozen=True)
class PrecisionKey:
    """What a timing depends on; a change in any field means timing again."""

    cpu_model: str
    cpu_cores: int
    model_size: str  # readable; the hash below holds it too
    model_config_hash: str
    batch_size: int
    gradient_accumulation_steps: int
    xla: bool
    versions: str  # "tensorflow 2.21.0, keras 3.15.1"

    def digest(self) -> str:
        return config_hash(dataclasses.asdict(self))


def precision_key(config: Config, plan: Plan, facts: MachineFacts, versions: str | None = None) -> PrecisionKey:
    d, t = config.data, config.training
    model = {
        **dataclasses.asdict(config.model),
        "n_mels": d.n_mels,
        "reference_frames": d.reference_frames,
        "mel_on_device": bool(d.mel_on_device),
        "bucket_mel_lengths": list(d.bucket_mel_lengths),  # the child times a middle bucket
        "bucket_text_lengths": list(d.bucket_text_lengths),
        "optimizer": t.optimizer,
        "gradient_checkpointing": t.gradient_checkpointing,
        "decoder_window": t.decoder_window,
        "graph_mode": t.enable_graph_mode,
    }
    return PrecisionKey(cpu_label(facts), facts.usable_cpu_cores, config.model.size, config_hash(model),
                        plan.batch_size, plan.gradient_accumulation_steps, plan.xla,
                        versions if versions is not None else library_versions())


@dataclass(frozen=True)
class PrecisionTiming:
    """The child's step times per policy; `bfloat16_s` is empty where bf16 failed (`bfloat16_error`)."""

    float32_s: tuple[float, ...]
    bfloat16_s: tuple[float, ...]
    bfloat16_error: str = ""
    bucket_frames: int = 0
    probe_seconds: float = 0.0  # the child's whole wall time: import, two traces, the timed steps
    load_average: float | None = None  # the machine's 1-minute load just before timing; None where unknown

    @property
    def float32_median(self) -> float:
        return statistics.median(self.float32_s)

    @property
    def bfloat16_median(self) -> float | None:
        return statistics.median(self.bfloat16_s) if self.bfloat16_s else None

    def chosen(self, min_gain: float = MIN_BF16_GAIN) -> str:
        """mixed_bfloat16 if its median step is at least `min_gain` shorter than float32's, else float32."""
        bf16 = self.bfloat16_median
        # The 1e-9 keeps "exactly 10% faster" from failing on float rounding.
        faster = bf16 is not None and bf16 <= self.float32_median * (1 - min_gain) * (1 + 1e-9)
        return "mixed_bfloat16" if faster else "float32"

    def describe(self, min_gain: float = MIN_BF16_GAIN) -> str:
        """"bf16 0.93 s/step vs fp32 1.04 s/step (median of 5): bf16 is 11% faster (>= 10%)", or the like."""
        fp32 = self.float32_median
        if self.bfloat16_median is None:
            return f"fp32 {fp32:.2f} s/step (median of {len(self.float32_s)}); bf16 failed ({self.bfloat16_error}): float32"
        gain = 1 - self.bfloat16_median / fp32
        if self.chosen(min_gain) == "mixed_bfloat16":
            verdict = f"bf16 is {gain:.0%} faster (>= {min_gain:.0%})"
        elif gain > 0:
            verdict = f"bf16 is only {gain:.0%} faster (< {min_gain:.0%}): float32"
        else:
            verdict = f"bf16 is {-gain:.0%} slower: float32"
        return (f"bf16 {self.bfloat16_median:.2f} s/step vs fp32 {fp32:.2f} s/step "
                f"(median of {len(self.float32_s)}): {verdict}")

    def conditions(self, cores: int) -> str:
        """" (load 3.2 on 2 cores)": how busy the machine was, which is how far to trust the times."""
        return "" if self.load_average is None else f" (load {self.load_average:.1f} on {cores} cores)"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PrecisionTiming":
        timing = cls(float32_s=tuple(float(s) for s in data["float32_s"]),
                     bfloat16_s=tuple(float(s) for s in data["bfloat16_s"]),
                     bfloat16_error=str(data.get("bfloat16_error", "")),
                     bucket_frames=int(data.get("bucket_frames", 0)),
                     probe_seconds=float(data.get("probe_seconds", 0.0)),
                     load_average=None if data.get("load_average") is None else float(data["load_average"]))
        if not timing.float32_s or min(timing.float32_s + timing.bfloat16_s) <= 0:
            raise ValueError(f"step times must be positive, float32's at least one: {data}")
        if not timing.bfloat16_s and not timing.bfloat16_error:
            raise ValueError("no bf16 step times and no error saying why")
        return timing

    @classmethod
    def from_child(cls, line: Mapping[str, Any], probe_seconds: float,
                   load_average: float | None = None) -> "PrecisionTiming":
        """From the child's JSON line (see myxtts.training.precision_probe)."""
        seconds, errors = line["seconds"], line.get("errors", {})
        return cls.from_dict({"float32_s": seconds["float32"], "bfloat16_s": seconds.get("mixed_bfloat16", []),
                              "bfloat16_error": errors.get("mixed_bfloat16", ""),
                              "bucket_frames": line.get("bucket_frames", 0), "probe_seconds": probe_seconds,
                              "load_average": load_average})


class PrecisionProbeFailed(RuntimeError):
    """The child gave no usable answer: a crash, a timeout, an unreadable line."""


def precision_cache(directory: str | os.PathLike[str] | None = None) -> ProbeCache:
    """Timings as one JSON file per key under `<cache dir>/precision/` (or `directory`)."""
    return ProbeCache(directory, folder=CACHE_FOLDER, result_type=PrecisionTiming)


def time_in_child(config: Config, *, child_module: str, environ: Mapping[str, str] | None = None,
                  timeout_s: float = CHILD_TIMEOUT_S) -> PrecisionTiming:
    """One `python -m child_module --config <config>` and its answer; PrecisionProbeFailed otherwise."""
    with tempfile.TemporaryDirectory(prefix="myxtts-precision-") as folder:
        config_path = Path(folder) / "config.yaml"
        config_lib.save_config(config, config_path)
        command = [sys.executable, "-m", child_module, "--config", str(config_path)]
        # Other processes' load makes single steps up to 2x slower on a shared machine (BENCHMARKS.md):
        # it is kept with the result so that a choice made on a busy machine says so.
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        started = time.perf_counter()
        try:
            done = subprocess.run(command, env=child_environment(environ), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise PrecisionProbeFailed(f"no answer within {timeout_s:.0f} s") from None
        seconds = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise PrecisionProbeFailed(f"exit {done.returncode}: {last}")
    try:
        return PrecisionTiming.from_child(json.loads(lines[-1]), seconds, load)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise PrecisionProbeFailed(f"unreadable answer {lines[-1][:200]!r} ({error})") from None


def _flags_rule(plan: Plan, facts: MachineFacts, why_not_measured: str) -> Plan:
    flags = ", ".join(facts.cpu_bf16_flags)
    rule = f"bf16 natively ({flags})" if flags else "no native bf16 (no AVX512_BF16 or AMX flags)"
    return with_precision(plan, plan.precision, f"auto: not measured ({why_not_measured}); CPU flags rule: {rule}")


def probe_cpu_precision(config: Config, plan: Plan, facts: MachineFacts, *, child_module: str,
                        cache: ProbeCache | None = None, environ: Mapping[str, str] | None = None,
                        echo: Callable[[str], None] = print, timeout_s: float = CHILD_TIMEOUT_S) -> Plan:
    """The plan with a timed precision when `plan.probe_precision`, else `plan` unchanged.

    `config` is the run's; the child times its model at the plan's batch, accumulation and XLA
    setting. Results are cached, so only the first run of a setup pays (about a minute for `small`
    on two cores, BENCHMARKS.md).
    """
    if not plan.probe_precision:
        return plan  # a GPU, or a precision fixed in the config: nothing to time
    if (os.environ if environ is None else environ).get("TF_CONFIG"):
        echo("precision: not timed on several hosts (each could choose differently); set training.precision "
             "on every host to what one host measures alone")
        return _flags_rule(plan, facts, "several hosts")
    cache = cache or precision_cache()
    key = precision_key(config, plan, facts)
    path = cache.path_for(key)
    timing = cache.load(key)
    if timing is None:
        echo(f"precision: timing float32 and bf16 train steps of {config.model.size} at batch {plan.batch_size} "
             f"on {key.cpu_model} (once per CPU and model)")
        timed = dataclasses.replace(
            config, data=dataclasses.replace(config.data, batch_size=plan.batch_size),
            training=dataclasses.replace(config.training, gradient_accumulation_steps=plan.gradient_accumulation_steps,
                                         enable_xla_compilation=plan.xla))
        try:
            timing = time_in_child(timed, child_module=child_module, environ=environ, timeout_s=timeout_s)
        except PrecisionProbeFailed as error:
            message = f"the precision probe failed ({error}); keeping the CPU flags rule: {plan.precision}"
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            echo(f"precision: {message}")
            return _flags_rule(plan, facts, f"the probe failed: {error}")
        cache.store(key, timing)
        echo(f"precision: the probe took {timing.probe_seconds:.0f} s")
        if timing.load_average is not None and timing.load_average > key.cpu_cores / 2:
            echo(f"precision: other processes kept the CPU busy while timing{timing.conditions(key.cpu_cores)}, "
                 f"so the choice may be noise; delete {path} to time again on a quieter machine")
    source = (f"auto: measured on {key.cpu_model}{timing.conditions(key.cpu_cores)}: {timing.describe()} "
              f"(cached in {path})")
    echo(f"precision: {timing.chosen()}, {source.removeprefix('auto: ')}")
    return with_precision(plan, timing.chosen(), source)


def cached_timings(facts: MachineFacts, cache: ProbeCache | None = None) -> list[str]:
    """One line per timing cached for this CPU model, for the hardware report (which has no run config)."""
    cache = cache or precision_cache()
    lines = []
    for path in sorted(cache.directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            key, timing = data["key"], PrecisionTiming.from_dict(data["result"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged entry is measured again by the next run that needs it
        if key.get("cpu_model") == cpu_label(facts):
            lines.append(f"{key.get('model_size')} at batch {key.get('batch_size')}"
                         f"{timing.conditions(key.get('cpu_cores'))}: {timing.describe()} ({path})")
    return lines
