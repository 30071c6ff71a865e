"""The vocoder on several GPUs (train_vocoder.py's MirroredStrategy) updates exactly as one device does:
checked on two logical CPUs, in a child process (logical devices exist only if set before TensorFlow
starts; `python tests/test_vocoder_distribute.py` is that child, see the bottom).

What "exactly" means here: two replicas each take half of a global batch and average their gradients
(`all_reduce_mean`), which is the mean of the two halves' gradients. The vocoder's STFT loss is a
ratio over the whole batch (spectral convergence), so that is not the gradient of the global batch's
loss; it is what one device computes when it accumulates the two halves into one update, which is the
reference here. The discriminator is on, so both networks and both optimizers are compared; the
vocoder turns a Griffin-Lim phase prior, read from the batch as training reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
LEARNING_RATE = 1e-3
# As tests/test_distribute.py: Adam's first update is about +-lr per weight, so weights are compared
# to 1% of it, and Adam's moments (which see a wrong scale or sum) to a relative 1e-4.
WEIGHT_ATOL = 0.01 * LEARNING_RATE


@pytest.mark.slow
def test_two_replicas_update_the_vocoder_and_its_discriminator_as_one_device_accumulating_their_halves(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(Path(__file__).resolve())], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2 and result["xla"] is False
    assert result["iterations"] == {"one": [1, 1], "two": [1, 1]}  # one update of each network
    assert result["moved"] > 0.5 * LEARNING_RATE  # the update happened
    assert result["replica_copies_differ_by"] == 0.0  # each replica applied the identical update
    for network in ("vocoder", "discriminator"):
        assert result["weights_differ_by"][network] <= WEIGHT_ATOL, result
    assert result["moments_relative_difference"] <= 1e-4, result
    np.testing.assert_allclose(result["loss"]["two"], result["loss"]["one"], rtol=1e-5)


def _child() -> dict:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})  # tiny graphs: faster
    import keras

    from myxtts.config import load_config
    from myxtts.training import distribute
    from utilities.train_vocoder import build_trainer

    data = load_config(ROOT / "configs" / "demo.yaml").data
    frames = 32
    # Clips exactly one segment long: every segment starts at frame 0, on one device or two.
    rng = np.random.default_rng(0)
    # With the Griffin-Lim phase prior (train_vocoder.py's default), each clip's mel and phase come with it.
    halves = [{"audio": tf.constant(rng.normal(0, 0.1, (2, (frames - 1) * data.hop_length)).astype(np.float32)),
               "mel_length": tf.fill([2], frames),
               "mel": tf.constant(rng.normal(-4.0, 2.0, (2, frames, data.n_mels)).astype(np.float32)),
               "phase": tf.constant(rng.uniform(-np.pi, np.pi, (2, frames, data.n_fft // 2 + 1)), tf.float16)}
              for _ in range(2)]
    # Under 10 steps the schedule holds its peak from the first update (no warmup): both runs update at
    # the same learning rate although one counts two micro-steps.
    args = Namespace(init_from=None, size="tiny", steps=8, learning_rate=LEARNING_RATE, segment_frames=frames,
                     phase_weight=0.0, phase_angle_weight=0.0, phase_prior="griffin-lim", adversarial_weight=0.1,
                     discriminator_learning_rate=LEARNING_RATE, xla="auto")

    def build(strategy, accumulation, initial=None):
        keras.utils.set_random_seed(0)
        with distribute.training_scope(strategy):
            trainer, jit = build_trainer(Namespace(**vars(args), accumulation=accumulation), Namespace(data=data),
                                         "float32", strategy)
        if initial is not None:
            for network, weights in zip((trainer.vocoder, trainer.discriminator), initial):
                network.set_weights(weights)
        return trainer, jit

    def weights(trainer):
        return [trainer.vocoder.get_weights(), trainer.discriminator.get_weights()]

    def moments(trainer):
        return [v.numpy() for o in (trainer.optimizer, trainer.discriminator_optimizer) for v in o.variables
                if "momentum" in v.path or "velocity" in v.path]

    one, _ = build(tf.distribute.get_strategy(), accumulation=2)
    initial = weights(one)
    one_history = one.fit(tf.data.Dataset.from_tensor_slices(
        {k: tf.stack([h[k] for h in halves]) for k in halves[0]}), epochs=1, verbose=0).history

    strategy = distribute.strategy_for(2, device_type="CPU", environ={})
    two, jit = build(strategy, accumulation=1, initial=initial)
    whole = tf.data.Dataset.from_tensors({k: tf.concat([h[k] for h in halves], 0) for k in halves[0]})
    two_history = two.fit(whole, epochs=1, verbose=0).history

    differ = {name: max(float(np.max(np.abs(a - b))) for a, b in zip(x, y))
              for name, x, y in zip(("vocoder", "discriminator"), weights(one), weights(two))}
    relative = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30)) for a, b in zip(moments(one), moments(two)))
    copies = max(float(tf.reduce_max(tf.abs(v.value.values[0] - v.value.values[1])))
                 for v in two.vocoder.trainable_variables + two.discriminator.trainable_variables)
    return {
        "replicas": distribute.replicas(strategy), "xla": jit,
        "iterations": {name: [int(keras.ops.convert_to_numpy(o.iterations))
                              for o in (t.optimizer, t.discriminator_optimizer)]
                       for name, t in (("one", one), ("two", two))},
        "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(initial[0], one.vocoder.get_weights())),
        "weights_differ_by": differ, "moments_relative_difference": relative, "replica_copies_differ_by": copies,
        # One device's running mean over its two halves; the replicas' mean of theirs.
        "loss": {"one": one_history["loss"][-1], "two": two_history["loss"][-1]},
    }


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_child()))
