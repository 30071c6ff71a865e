#!/usr/bin/env python3
"""Is training input-bound or compute-bound, why, and which config key to change.

    python utilities/diagnose_gpu_bottleneck.py --config configs/config.yaml --batch-size 16 --num-batches 50
    python utilities/diagnose_gpu_bottleneck.py --config configs/demo.yaml --train-data /tmp/demo400 \\
        --set model.size=small --json report.json --plot timeline.png --apply
    python utilities/diagnose_gpu_bottleneck.py --config configs/demo.yaml --train-data /tmp/demo400 --simulate-gpu H100

1. Static checks, before anything runs: Python ops in the input pipeline's graph (and which
   transformation holds them), graph mode, XLA, precision, prefetch, caching, bucketing, CPU cores
   against data.num_workers, read throughput of the audio files.
2. Measurements, each on its own: (a) the input pipeline alone, (b) the train step alone on one
   batch, then the alignment's frame loops alone on that batch (their share of the step), (c) real
   training with every step split into input wait, compiled step and host work.
3. GPU utilization through NVML in a background thread during (c) (skipped, in one line, without a GPU),
   and TensorFlow's own memory peak over (c) (with memory growth on, as in training).
4. A verdict (input-bound, host-overhead-bound, loop-bound, memory-bound, compute-bound) and ranked
   config changes (never one that did not run here: XLA only after an XLA step ran; data.num_workers
   never below the capacity plan's own value); --apply writes them into <config>.diagnosed.yaml next to the config, never over it.

--simulate-gpu NAME replaces the model's step by a consumer that holds each batch for the step time
the capacity plan predicts on that GPU (myxtts/diagnostics/simulated_gpu.py): the real input
pipeline, timed and judged as in a real run, against a GPU this machine does not have.

The table goes to stdout, progress to stderr. The JSON layout is documented in
myxtts/diagnostics/report_schema.py. The model, optimizer and step are built as train_main.py
builds them, so the numbers are those of a real run of the same config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPOSITORY_ROOT))

from myxtts.diagnostics.arguments import (add_gpu_assumption_arguments, add_run_arguments, loop_cost,  # noqa: E402
                                          run_overrides)
from myxtts.hardware.devices import DEVICES, device_by_key  # noqa: E402


# What matplotlib's savefig writes, told by the name's ending (without importing matplotlib for --help).
PLOT_FORMATS = {".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp", ".gif"}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--num-batches", type=int, default=50,
                        help="batches for the pipeline measurement and training steps to split (default: %(default)s)")
    parser.add_argument("--step-repeats", type=int, default=None,
                        help="steps for the step-alone measurement (default: --num-batches, 5 to 20)")
    parser.add_argument("--json", type=Path, help="write the report as JSON to this file")
    parser.add_argument("--plot", type=Path, help="write a PNG timeline of GPU utilization and input wait")
    parser.add_argument("--apply", action="store_true",
                        help="write the recommended keys into <config>.diagnosed.yaml next to --config")
    parser.add_argument("--simulate-gpu", metavar="NAME",
                        help="time the real pipeline against a consumer that takes each batch for its predicted step "
                             f"time on this GPU ({', '.join(d.key for d in DEVICES)})")
    add_gpu_assumption_arguments(parser, applies_to="with --simulate-gpu: ")
    arguments = parser.parse_args(argv)
    if arguments.simulate_gpu is not None:
        try:
            device_by_key(arguments.simulate_gpu)
        except ValueError as error:
            parser.error(f"--simulate-gpu: {error}")
    if not 0 < arguments.mfu <= 1:
        parser.error(f"--mfu must be in (0, 1], got {arguments.mfu}")
    if arguments.num_batches < 2:
        parser.error(f"--num-batches must be at least 2, got {arguments.num_batches}")
    if arguments.batch_size is not None and arguments.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {arguments.batch_size}")
    if arguments.apply and arguments.config is None:
        parser.error("--apply needs --config: the patched copy is written next to that file")
    from myxtts.output_paths import file_problem

    for path, flag, example in ((arguments.json, "--json", "report.json"), (arguments.plot, "--plot", "timeline.png")):
        if path is not None and (problem := file_problem(path, flag, example)):
            parser.error(problem)  # now, not after minutes of measuring
    if arguments.plot is not None and arguments.plot.suffix.lower() not in PLOT_FORMATS:
        parser.error(f"--plot {arguments.plot}: matplotlib writes {', '.join(sorted(PLOT_FORMATS))} files; "
                     "give a name ending in one, e.g. timeline.png")
    return arguments


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _no_gpu_note(facts) -> str:
    nvml_notes = [note for note in facts.notes if "NVML" in note or "pynvml" in note]
    reason = nvml_notes[0].split("; planning for CPU")[0] if nvml_notes else "NVML reports no GPU"
    return f"no GPU to sample ({reason}); the measurements above ran on the CPU"


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    from myxtts.startup_noise import quiet_tensorflow

    facts = quiet_tensorflow()  # TensorFlow's C++ start-up lines, which read as errors on a CPU (startup_noise.py)
    from myxtts.config import ConfigError, load_config
    from myxtts.data.audio import DataProblem, named_data_problems
    from myxtts.data.manifest import ManifestError
    from myxtts.data.pipeline import NoFullBatch

    overrides = run_overrides(arguments)
    try:
        config = load_config(arguments.config, overrides=overrides)
        with named_data_problems():  # a clip the pipeline refuses: one line naming it
            report = run(config, arguments, overrides, facts)
    except (ConfigError, ManifestError, FileNotFoundError, NoFullBatch, DataProblem) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from myxtts.diagnostics.config_patch import patched_path, write_patched_config
    from myxtts.diagnostics.report import format_report

    print(format_report(report))
    for path in (arguments.json, arguments.plot):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        _progress(f"wrote {arguments.json}")
    if arguments.plot:
        from myxtts.diagnostics.timeline_plot import plot_timeline

        plot_timeline(report, arguments.plot)
        _progress(f"wrote {arguments.plot}")
    if arguments.apply:
        earlier = patched_path(arguments.config).exists()
        try:
            path, changes = write_patched_config(arguments.config, report["recommendations"])
        except ConfigError as error:
            kept = f"; the earlier {patched_path(arguments.config)} is as it was" if earlier else ""
            print(f"error: the patched config does not load, so it was not kept{kept}: {error}", file=sys.stderr)
            return 1
        if path is None:
            _progress("--apply: no recommendation names a config key; nothing written")
        else:
            _progress(f"--apply: wrote {path}{' over the earlier copy' if earlier else ''} ({'; '.join(changes)}); "
                      f"{arguments.config} is unchanged")
    return 0


def run(config, arguments: argparse.Namespace, overrides: list[str], facts) -> dict:
    """Build the real pipeline and step from the config, then diagnose them (`facts`: the machine's,
    `hardware.detect.detect_machine`)."""
    import tensorflow as tf

    from myxtts.data.pipeline import build_dataset
    from myxtts.diagnostics.bottleneck import diagnose
    from myxtts.diagnostics.gpu_sampler import UtilizationSampler
    from myxtts.diagnostics.static_checks import static_checks
    from myxtts.diagnostics.training_setup import build_training_setup, prepare_run, read_all_metrics
    from myxtts.hardware.gpu_memory import TensorFlowPeakMemory
    from myxtts.hardware.plan import plan_for_machine

    plan_facts = facts
    if arguments.simulate_gpu:
        # The pipeline gets the cores the plan would give it beside that GPU (all but one), not the
        # half a CPU-only plan leaves it while the model trains on the other half.
        from myxtts.hardware.capacity import gpu_facts_for

        plan_facts = dataclasses.replace(facts, gpus=(gpu_facts_for(device_by_key(arguments.simulate_gpu)),))
    # The capacity plan's own input parallelism for the machine (data.num_workers automatic): the
    # diagnosis recommends no data.num_workers below it.
    input_plan = plan_for_machine(plan_facts, config.model.size)
    if arguments.simulate_gpu and not config.data.num_workers:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                      num_workers=input_plan.num_parallel_calls))
    requested_precision = config.training.precision  # the simulated card's plan honours it
    if arguments.simulate_gpu and requested_precision == "auto":
        # No model runs on this host, so timing its CPU's precision (hardware/cpu_precision.py) would
        # cost a minute for nothing.
        config = dataclasses.replace(config, training=dataclasses.replace(config.training, precision="fp32"))
    _progress("preparing the run as train_main.py would (hardware plan, data, vocabulary)")
    prepared = prepare_run(config, echo=_progress)
    config = prepared.config
    gpu_available = bool(tf.config.list_physical_devices("GPU"))

    # TensorFlow cannot serialize a pipeline ending in prefetch_to_device, so the scan looks at the
    # same pipeline without that last stage (it runs no Python either way).
    scan_dataset = prepared.dataset
    if config.data.prefetch_to_gpu and gpu_available:
        scan_config = dataclasses.replace(config, data=dataclasses.replace(config.data, prefetch_to_gpu=False))
        scan_dataset = build_dataset(scan_config, prepared.rows, training=True, vocabulary=prepared.vocabulary)
    _progress("static checks: dataset graph, settings, cores, read throughput")
    static = static_checks(config, scan_dataset, policy=prepared.policy, usable_cores=facts.usable_cpu_cores,
                           gpu_available=gpu_available, audio_paths=[u.audio_path for u in prepared.rows],
                           planned_workers=input_plan.num_parallel_calls)

    machine = {
        "usable_cpu_cores": facts.usable_cpu_cores,
        "gpus": [{"name": g.name, "nvml_index": g.nvml_index, "compute_capability": list(g.compute_capability),
                  "total_memory_bytes": g.total_memory_bytes} for g in facts.gpus],
        "notes": list(facts.notes),
        "input_plan": {"num_workers": input_plan.num_parallel_calls,
                       "source": input_plan.sources["num_parallel_calls"]},
    }
    common = dict(num_batches=arguments.num_batches, static=static, machine=machine, step_repeats=arguments.step_repeats,
                  config_info={"path": str(arguments.config) if arguments.config else None, "overrides": overrides},
                  progress=_progress)
    if arguments.simulate_gpu:
        from myxtts.diagnostics.simulated_gpu import simulated_gpu

        card_config = dataclasses.replace(config, training=dataclasses.replace(config.training, precision=requested_precision))
        device = device_by_key(arguments.simulate_gpu)
        simulation = simulated_gpu(card_config, device, len(prepared.vocabulary), arguments.mfu,
                                   loop_cost(arguments, config, device, [gpu.name for gpu in facts.gpus]))
        _progress(f"simulating {simulation.device.name}: each batch is held for its predicted step time "
                  f"({simulation.precision}, {arguments.mfu:.0%} MFU); no model is built")
        return diagnose(prepared.dataset, simulation.compiled_step(), precompile=False,
                        no_sampler_note=f"simulated {simulation.device.key}: nothing to sample",
                        simulated=simulation.describe(), **common)

    _progress(f"building the {config.model.size} model and its train step "
              f"(XLA {'on' if config.training.enable_xla_compilation else 'off'}, policy {prepared.policy})")
    setup = build_training_setup(config, len(prepared.vocabulary), prepared.policy, prepared.sample,
                                 silent_token=prepared.vocabulary.word_boundary_id,
                                 batch_spec=prepared.dataset.element_spec)

    sampler = UtilizationSampler(nvml_index=facts.gpus[0].nvml_index or 0) if facts.gpus else None
    # The memory verdict rests on what TensorFlow's allocator held on the trained GPU (CUDA's first).
    device_memory = TensorFlowPeakMemory("GPU:0") if gpu_available else None
    return diagnose(
        prepared.dataset,
        setup.step,
        sampler=sampler,
        no_sampler_note=None if facts.gpus else _no_gpu_note(facts),
        device_memory=device_memory,
        host_work=read_all_metrics,
        alignment_loops=setup.alignment_loops,
        profile=True,
        larger_batch=True,
        compute_capability=facts.gpus[0].compute_capability if facts.gpus else None,
        **common,
    )


if __name__ == "__main__":
    sys.exit(main())
