#!/usr/bin/env python3
"""Will this host feed a GPU? How many audio-seconds per second the GPU would train on, against what
this CPU's input pipeline delivers on each route (on the fly, cached features, mel_on_device).

    python utilities/capacity_plan.py --config configs/demo.yaml --train-data demo_corpus --gpu H100
    python utilities/capacity_plan.py --config configs/config.yaml --train-data /data/ljspeech --gpu all

The first run times the real pipeline on a sample of the corpus (about half a minute; cached under
~/.cache/myxtts/capacity per corpus, settings and CPU model, `--recalibrate` to time it again). The
GPU side is arithmetic: the model's FLOPs on the corpus's clips (myxtts/models/flops.py), the cards'
peaks from their spec sheets (myxtts/hardware/devices.py), an assumed MFU (--mfu) and an assumed
cost per iteration of the alignment's loops. Every number is printed with its source.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
if str(REPOSITORY_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPOSITORY_ROOT))

from myxtts.diagnostics.arguments import (add_gpu_assumption_arguments, add_run_arguments, loop_cost,  # noqa: E402
                                          run_overrides)
from myxtts.hardware.devices import DEVICES  # noqa: E402


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--gpu", action="append", default=[], metavar="NAME",
                        help=f"GPU to plan for, repeatable, or 'all' (default: this machine's, else H100); known: "
                             f"{', '.join(d.key for d in DEVICES)}")
    add_gpu_assumption_arguments(parser)
    parser.add_argument("--recalibrate", action="store_true", help="time the host again instead of using the cache")
    parser.add_argument("--json", type=Path, help="also write the plans and the calibration as JSON to this file")
    arguments = parser.parse_args(argv)
    from myxtts.output_paths import file_problem

    if arguments.json is not None and (problem := file_problem(arguments.json, "--json")):
        parser.error(problem)  # now, not after the calibration
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    from myxtts.startup_noise import quiet_tensorflow

    # TensorFlow started without its C++ start-up lines, which read as errors on a CPU (startup_noise.py).
    facts = quiet_tensorflow()
    from myxtts.config import ConfigError, load_config
    from myxtts.data.audio import named_data_problems
    from myxtts.data.manifest import ManifestError
    from myxtts.diagnostics.capacity import capacity_plans, capacity_table, host_calibration
    from myxtts.hardware.devices import device_by_key, device_for_gpu_name

    try:
        names = [key for name in arguments.gpu for key in ([d.key for d in DEVICES] if name == "all" else [name])]
        devices = [device_by_key(name) for name in names]
        if not devices:
            devices = [d for d in (device_for_gpu_name(g.name) for g in facts.gpus) if d] or [device_by_key("H100")]
        config = load_config(arguments.config, overrides=run_overrides(arguments))
        with named_data_problems():  # a clip the pipeline refuses: one line naming it (a ValueError)
            record = host_calibration(config, recalibrate=arguments.recalibrate,
                                      progress=lambda message: print(message, file=sys.stderr, flush=True))
        plans = [capacity_plans(config, record, [device], facts, arguments.mfu, cost.seconds_per_frame,
                                cost.source)[0]
                 for device in devices for cost in [loop_cost(arguments, config, device, [gpu.name for gpu in facts.gpus])]]
    except (ConfigError, ManifestError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n\n".join("\n".join(plan.lines()) for plan in plans))
    if len(plans) > 1:
        print("\n" + "\n".join(capacity_table(plans)))
    if arguments.json:
        arguments.json.write_text(json.dumps({"calibration": record.to_dict(),
                                              "plans": [plan.to_dict() for plan in plans]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
