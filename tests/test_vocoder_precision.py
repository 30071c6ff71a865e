"""The vocoder's update in mixed precision and with gradient accumulation (issue 27: the same step
machinery as the acoustic model's), the precision train_vocoder.py picks per device, and a backup
made with other settings refused before it is loaded."""

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_config
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.plan import vocoder_precision
from myxtts.models.vocoder import Vocoder, load_vocoder, save_vocoder
from myxtts.training.step import host_placed
from myxtts.training.vocoder_step import VocoderTrainer

PROFILES = Path(__file__).parent / "data" / "device_profiles"


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


def trainer_for(c, policy: str, accumulation: int | None = None, adversarial: float = 0.1, jit_compile=False):
    """A tiny vocoder and discriminator as train_vocoder.py builds them under `policy`."""
    keras.config.set_dtype_policy(policy)
    optimizers = [keras.optimizers.Adam(3e-3, gradient_accumulation_steps=accumulation),
                  keras.optimizers.Adam(1e-3, gradient_accumulation_steps=accumulation)]
    if policy == "mixed_float16":
        optimizers = [keras.optimizers.LossScaleOptimizer(o) for o in optimizers]
    trainer = VocoderTrainer(Vocoder(c, size="tiny"), segment_frames=32, adversarial_weight=adversarial,
                             discriminator_optimizer=optimizers[1])
    trainer.compile(optimizer=optimizers[0], jit_compile=jit_compile)
    trainer.build_for_training()
    return trainer


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_tiny_vocoder_and_its_discriminator_train_in_mixed_precision(waveform_batch, policy):
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = trainer_for(c, policy)
    half = policy.removeprefix("mixed_")
    assert trainer.vocoder.embed.compute_dtype == half and trainer.discriminator.stacks[0][0][0].compute_dtype == half
    before = [w.numpy().copy() for w in trainer.vocoder.trainable_variables]
    history = trainer.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=6, epochs=1, verbose=0).history
    assert all(np.isfinite(history[name][-1]) for name in ("loss", "mel_loss", "discriminator_loss")), history
    assert history["nonfinite_in_a_row"][-1] == 0
    # The weights stay float32 (the saved vocoder is), and they moved: the loss scale did not swallow the update.
    assert {w.dtype for w in trainer.vocoder.trainable_variables} == {"float32"}
    moved = [not np.array_equal(a, w.numpy()) for a, w in zip(before, trainer.vocoder.trainable_variables)]
    assert sum(moved) > len(moved) // 2, f"{sum(moved)} of {len(moved)} variables changed"
    assert int(trainer.optimizer.iterations) >= 5 and int(trainer.discriminator_optimizer.iterations) >= 5


def test_accumulated_gradients_update_both_networks_every_nth_batch(waveform_batch):
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = trainer_for(c, "float32", accumulation=3)
    networks = (trainer.vocoder, trainer.discriminator)
    weights = lambda: [[w.numpy().copy() for w in n.trainable_variables] for n in networks]  # noqa: E731
    start = weights()
    for _ in range(2):
        trainer.train_step(batch)
    assert all(np.array_equal(a, b) for old, new in zip(start, weights()) for a, b in zip(old, new)), \
        "two of three accumulated batches changed the weights"
    trainer.train_step(batch)
    after = weights()
    for name, old, new in zip(("vocoder", "discriminator"), start, after):
        assert any(not np.array_equal(a, b) for a, b in zip(old, new)), f"the {name} did not update at the third batch"
    assert int(trainer.optimizer.iterations) == 1 and int(trainer.discriminator_optimizer.iterations) == 1


def test_every_variable_of_the_vocoders_compiled_update_stays_on_the_gpu(waveform_batch):
    # As tests/test_step_variables.py for the acoustic model: loss scaling, accumulation and the
    # discriminator add variables of their own, and an XLA program on a GPU cannot read host ones.
    c, batch = waveform_batch
    trainer = trainer_for(c, "mixed_float16", accumulation=2, jit_compile=True)
    captured = tf.function(trainer.train_step, jit_compile=True).get_concrete_function(batch).variables
    assert len(captured) > 20, f"the trace captured only {len(captured)} variables: it is not the update"
    assert host_placed(captured) == []


def test_a_vocoder_trained_in_bf16_is_saved_and_loaded_as_float32(waveform_batch, tmp_path):
    c, batch = waveform_batch
    trainer = trainer_for(c, "mixed_bfloat16", adversarial=0.0)
    trainer.train_step(batch)
    save_vocoder(trainer.vocoder, tmp_path)
    keras.config.set_dtype_policy("mixed_bfloat16")  # as a training run leaves it
    loaded = load_vocoder(tmp_path, c)
    assert loaded.embed.compute_dtype == "float32" and keras.config.dtype_policy().name == "mixed_bfloat16"
    for mine, theirs in zip(trainer.vocoder.weights, loaded.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert load_vocoder(tmp_path, c, policy="mixed_bfloat16").embed.compute_dtype == "bfloat16"


def profile(name: str) -> MachineFacts:
    return MachineFacts.from_json_file(PROFILES / f"{name}.json")


def test_the_vocoders_precision_follows_the_gpu_and_stays_float32_on_a_cpu():
    assert vocoder_precision(profile("h100_80gb"))[0] == "mixed_bfloat16"
    assert vocoder_precision(profile("v100_16gb"))[0] == "mixed_float16"
    cpu = profile("cpu_only")
    with_bf16 = MachineFacts(**{**vars(cpu), "cpu_bf16_flags": ("avx512_bf16",)})
    # The acoustic model's prior on such a CPU is bf16; the vocoder's update measured no faster in it.
    policy, reason, _ = vocoder_precision(with_bf16)
    assert policy == "float32" and "CPU" in reason
    assert vocoder_precision(with_bf16, "bf16")[:2] == ("mixed_bfloat16", "config")
    policy, _, notes = vocoder_precision(cpu, "fp16")
    assert policy == "mixed_float16" and any("emulated" in note for note in notes)


def test_a_backup_made_with_other_settings_is_refused_and_kept(tmp_path):
    from utilities.train_vocoder import check_backup

    backup = tmp_path / "backup"
    settings = {"size": "tiny", "discriminator": False, "loss_scaling": False, "accumulation": 1}
    check_backup(backup, settings)  # a new run: records its settings
    assert json.loads((backup / "settings.json").read_text()) == settings
    (backup / "latest.weights.h5").write_bytes(b"an interrupted run's weights")
    check_backup(backup, settings)  # the same settings resume
    with pytest.raises(ValueError, match=r"accumulation: backup 1, now 2.*remove .*backup to start over"):
        check_backup(backup, {**settings, "accumulation": 2})
    assert (backup / "latest.weights.h5").read_bytes() == b"an interrupted run's weights"
    assert json.loads((backup / "settings.json").read_text()) == settings


def test_train_vocoder_trains_with_accumulation_in_bf16_and_saves_float32(demo_corpus, tmp_path, capsys):
    from utilities import train_vocoder

    out = tmp_path / "vocoder"
    assert train_vocoder.main(["--train-data", str(demo_corpus), "--output-dir", str(out), "--size", "tiny",
                               "--steps", "2", "--batch-size", "4", "--accumulation", "2", "--precision", "bf16",
                               "--quality-clips", "0"]) == 0
    printed = capsys.readouterr().out
    assert "batch 4 x 2 accumulated" in printed and "mixed_bfloat16 (config)" in printed, printed
    assert "step 2/2" in printed, printed
    assert "turning Griffin-Lim's phase" in printed, printed  # the default prior
    assert re.search(r"Griffin-Lim's phase of \d+ training clips: \d+ s \(\d+ MB held\)", printed), printed
    assert not (out / "backup").exists()  # a finished run's backup is gone, settings with it
    loaded = load_vocoder(out, tiny_config(demo_corpus).data)
    assert loaded.embed.compute_dtype == "float32" and loaded.phase_prior == "griffin-lim"
