"""Keras' AdamW against FusedAdamW in the demo's train step: the first call (tracing) and the step.

    python utilities/benchmark_optimizer.py --corpus demo_corpus --repeats 9

One network (configs/demo.yaml's model, float32, graph mode, loops compiled alone as train() does on
a CPU), two TrainingModels around it, each with its optimizer and the demo's learning-rate schedule,
weight decay and clipping; a real batch of the corpus. Each step is traced twice, in turn with the
other, and the second trace is timed (the first of either also traces what they share); its op count
includes its branches and loops. Then the two steps, warmed up, are called in turn and the median of
--repeats calls is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--corpus", default=str(ROOT / "demo_corpus"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per step; the median is reported")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    import keras
    import tensorflow as tf

    from myxtts.config import load_config
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import build_dataset, build_vocabulary
    from myxtts.models.alignment import AlignmentLoops
    from myxtts.models.xtts import network_for
    from myxtts.training.optimizers import FusedAdamW, learning_rate_schedule
    from myxtts.training.step import TrainingModel

    keras.utils.set_random_seed(0)
    config = load_config(args.config, overrides=[f"data.train_data={args.corpus}", "data.deterministic=true"])
    t = config.training
    rows = read_manifest(args.corpus)
    vocabulary = build_vocabulary(rows, config.data)
    batch = next(iter(build_dataset(config, rows, training=True, vocabulary=vocabulary)))
    network = network_for(config, len(vocabulary), vocabulary.word_boundary_id)
    network(batch)
    network.alignment_loops = AlignmentLoops(1, compile=True)

    models = {}
    for name, cls in (("keras AdamW", keras.optimizers.AdamW), ("FusedAdamW", FusedAdamW)):
        optimizer = cls(learning_rate_schedule(t, 1), beta_1=0.9, beta_2=0.98, epsilon=1e-8,
                        weight_decay=t.weight_decay, global_clipnorm=t.clip_norm or None)
        models[name] = model = TrainingModel(network, data_config=config.data)
        model.compile(optimizer=optimizer, jit_compile=False)
        optimizer.build(network.trainable_variables)
    network.alignment_loops = AlignmentLoops(1, compile=True)  # as compile() chooses on a CPU

    # Tracing, twice each in turn: the first trace of either also traces what both share (the loops).
    traces, ops = {name: [] for name in models}, {}
    for _ in range(2):
        for name, model in models.items():
            start = time.perf_counter()
            graph = tf.function(model.train_step).get_concrete_function(batch).graph
            traces[name].append(time.perf_counter() - start)
            definition = graph.as_graph_def()  # the step's ops, those of its tf.cond branches and loops included
            ops[name] = len(definition.node) + sum(len(f.node_def) for f in definition.library.function)
    steps = {name: tf.function(model.train_step) for name, model in models.items()}
    for step in steps.values():
        float(step(batch)["loss"])  # trace, compile the loops, warm up
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            float(step(batch)["loss"])
            times[name].append(time.perf_counter() - start)
    print(f"train step of {config.model.size} ({len(network.trainable_variables)} variables), batch "
          f"{int(batch['mel'].shape[0])} x {int(batch['mel'].shape[1])} frames, graph mode, float32, alternating, "
          f"median of {args.repeats} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f})")
    base = statistics.median(times["keras AdamW"])
    for name in steps:
        median = statistics.median(times[name])
        print(f"  {name:<12} traced in {traces[name][-1]:4.1f} s ({ops[name]} ops)   {median * 1000:6.0f} ms/step  "
              f"{base / median:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
