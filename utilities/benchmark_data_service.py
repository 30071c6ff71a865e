"""What the tf.data service costs: training batches from local workers vs from this host's own pipeline.

    python utilities/benchmark_data_service.py --corpus /tmp/other_corpus
    python utilities/benchmark_data_service.py --corpus demo_corpus --workers 2 --epochs 5

Starts a dispatcher and `--workers` workers on 127.0.0.1 (each a process of its own, through
`utilities/data_service.local_service`, as on other hosts), then reads the same number of batches, an epoch's
worth at a time, from the training stream computed here (`data.cache_features: false`), then from
the same stream served by the workers (`data.service_address`); a warm-up epoch first on each side. On one machine the two
share its cores, so this measures the service's own cost (serialising the features, gRPC, the
dispatcher), not what more hosts would add: that needs more machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time training batches from a local tf.data service against the "
                                                 "same pipeline run in this process.")
    parser.add_argument("--corpus", type=Path, required=True, help="corpus folder or manifest")
    parser.add_argument("--config", type=Path, default=REPOSITORY_ROOT / "configs" / "config.yaml",
                        help="feature and bucketing settings (default: configs/config.yaml)")
    parser.add_argument("--workers", type=int, default=1, help="service workers to start (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per side (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=16, help="clips per batch (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N clips")
    arguments = parser.parse_args(argv)
    for flag, value in (("--workers", arguments.workers), ("--epochs", arguments.epochs),
                        ("--batch-size", arguments.batch_size)):
        if value < 1:  # 0 workers waited forever; 0 epochs ended in statistics' "no median for empty data"
            parser.error(f"{flag} must be at least 1, got {value}")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    sys.path.insert(0, str(REPOSITORY_ROOT))
    from myxtts.config import load_config
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import Epochs, build_vocabulary
    from myxtts.config import ConfigError
    from myxtts.data.manifest import ManifestError
    from myxtts.data.pipeline import NoFullBatch
    from utilities.data_service import local_service

    settings = ["data.cache_features=false", f"data.batch_size={arguments.batch_size}"]
    try:  # the corpus and settings, before any service is started (a missing corpus was a traceback after it)
        rows = read_manifest(arguments.corpus)[: arguments.limit]
        local_config = load_config(arguments.config, overrides=settings)
        vocabulary = build_vocabulary(rows, local_config.data)
        local = Epochs(local_config, rows, training=True, vocabulary=vocabulary)
        per_epoch = local.batches_per_epoch()
    except (ConfigError, ManifestError, FileNotFoundError, NoFullBatch) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as logs, local_service(arguments.workers, Path(logs)) as address:
        served_config = load_config(arguments.config, overrides=[*settings, f"data.service_address={address}"])
        sides = {"this process": local,
                 f"service, {arguments.workers} worker(s)": Epochs(served_config, rows, training=True, vocabulary=vocabulary)}
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for name, epochs in sides.items():
            # One side after the other, each with its own iterator made here and dropped after: a
            # served stream left open keeps its workers filling buffers, which the next round would
            # drain and count as speed (measured: 3.6x "faster" than local on 48 clips, alternating).
            stream = iter(epochs.stream())
            for epoch in range(arguments.epochs + 1):  # the first epoch warms up (tracing, file cache, workers)
                started, clips = time.perf_counter(), 0
                for _ in range(per_epoch):
                    clips += int(next(stream)["mel_length"].shape[0])
                if epoch:
                    rates[name].append(clips / (time.perf_counter() - started))
                print(f"\r{name}: epoch {epoch + 1}/{arguments.epochs + 1}", end="", file=sys.stderr, flush=True)
            del stream
        print(file=sys.stderr)

    print(f"{arguments.corpus}: {len(rows)} clips, {per_epoch} batches of {arguments.batch_size} per epoch; "
          f"median over {arguments.epochs} epochs per side, one side after the other")
    base = statistics.median(rates["this process"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:>24}: {median:7.1f} clips/s  ({median / base:.2f}x)  epochs: "
              + ", ".join(f"{v:.0f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
