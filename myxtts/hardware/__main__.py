"""`python -m myxtts.hardware [--json] [--model-size base]`: what this machine is and what plan fits it.

Runs without TensorFlow (it is queried only with `--tensorflow`) and never prompts: with several GPUs
and no `--gpu`, it shows the plan for the saved or default choice.
"""

from __future__ import annotations

import argparse
import json
import sys

from myxtts.hardware.cpu_precision import cached_timings
from myxtts.hardware.detect import detect_machine
from myxtts.hardware.plan import MODEL_SIZE_BATCH_MULTIPLIER, PRECISION_ALIASES, RequestedSettings, plan_for_machine
from myxtts.hardware.report import build_report, format_report
from myxtts.hardware.select import select_gpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m myxtts.hardware", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--model-size", default="base", choices=sorted(MODEL_SIZE_BATCH_MULTIPLIER))
    parser.add_argument("--gpu", default=None, help="GPU index or list (0 / 0,1 / all / cpu)")
    parser.add_argument("--tensorflow", action="store_true",
                        help="also ask TensorFlow which GPUs it sees and which CUDA kernels it carries")
    parser.add_argument("--batch-size", default="auto")
    parser.add_argument("--effective-batch-size", type=int, default=0, help="0: the default 32")
    parser.add_argument("--precision", default="auto", choices=sorted(PRECISION_ALIASES))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    requested = RequestedSettings(batch_size=batch, effective_batch_size=args.effective_batch_size,
                                  precision=args.precision)
    facts = detect_machine(query_tensorflow=args.tensorflow)
    try:
        selection = select_gpus(facts, args.gpu, interactive=False)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan = plan_for_machine(facts.with_gpus(selection.indices), args.model_size, requested)
    # What training measured on this CPU before, if anything: the plan's precision is only the prior.
    timings = cached_timings(facts) if plan.probe_precision else []
    if args.json:
        print(json.dumps(build_report(facts, plan, selection, timings), indent=2))
    else:
        print(format_report(facts, plan, selection, timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
