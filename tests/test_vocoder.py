"""The neural vocoder (issue 27, started): shapes, its untrained output, and a few steps that learn."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.data.manifest import read_manifest
from myxtts.models import griffin_lim
from myxtts.models.vocoder import Vocoder
from myxtts.models.vocoder_losses import SpectrogramDiscriminator, adversarial_losses, multi_resolution_stft_loss
from myxtts.training.vocoder_clips import random_segments
from myxtts.training.vocoder_step import VocoderTrainer


def test_untrained_vocoder_speaks_the_prior_magnitude_at_phase_zero(waveform_batch):
    c, batch = waveform_batch
    segment = random_segments(batch["audio"], batch["mel_length"], 32, c.hop_length, seed=1)
    assert segment.shape == (batch["audio"].shape[0], 31 * c.hop_length)
    from myxtts.data import audio

    log_mel = audio.log_mel(segment, c)
    vocoder = Vocoder(c, size="tiny")
    out = vocoder(log_mel)
    assert out.shape == segment.shape
    prior = griffin_lim.mel_to_magnitude(log_mel, c)
    expected = griffin_lim.istft(tf.complex(tf.exp(tf.math.log(prior + 1e-5)), tf.zeros_like(prior)), c)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=1e-5)


def test_random_segments_lie_inside_each_clip(waveform_batch):
    c, batch = waveform_batch
    hop, frames = c.hop_length, 16
    segments = random_segments(batch["audio"], batch["mel_length"], frames, hop, seed=3).numpy()
    waveforms = batch["audio"].numpy()
    for row, segment in enumerate(segments):
        starts = [s for s in range(0, waveforms.shape[1] - len(segment) + 1, hop)
                  if np.array_equal(waveforms[row, s:s + len(segment)], segment)]
        assert starts and starts[0] // hop + frames <= int(batch["mel_length"][row]), row


def test_the_stft_loss_is_zero_for_the_target_and_grows_with_noise():
    rng = np.random.default_rng(0)
    target = tf.constant(rng.normal(0, 0.1, (2, 8192)).astype(np.float32))
    assert float(multi_resolution_stft_loss(target, target)) == pytest.approx(0.0, abs=1e-6)
    small = multi_resolution_stft_loss(target, target + 0.01 * tf.constant(rng.normal(size=(2, 8192)).astype(np.float32)))
    large = multi_resolution_stft_loss(target, target + 0.1 * tf.constant(rng.normal(size=(2, 8192)).astype(np.float32)))
    assert 0.0 < float(small) < float(large)


def test_a_tiny_vocoder_learns_in_a_few_steps(waveform_batch):
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = VocoderTrainer(Vocoder(c, size="tiny"), segment_frames=32)
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=False)
    fixed = random_segments(batch["audio"], batch["mel_length"], 32, c.hop_length, seed=5)
    before = {k: float(v) for k, v in trainer.segment_losses(fixed).items()}
    trainer.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=40, epochs=1, verbose=0)
    after = {k: float(v) for k, v in trainer.segment_losses(fixed).items()}
    assert after["loss"] < 0.85 * before["loss"], (before, after)
    assert after["mel_loss"] < before["mel_loss"] and after["stft_loss"] < before["stft_loss"], (before, after)


def test_a_non_finite_update_is_skipped_and_training_goes_on(waveform_batch):
    # One NaN applied would make every weight NaN for the rest of the run (seen at step ~1,550 of a
    # 10,800-update run): the step skips it, counts it, and the next finite batch trains.
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = VocoderTrainer(Vocoder(c, size="tiny"), segment_frames=32)
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=False)
    trainer.build_for_training()
    before = [w.numpy().copy() for w in trainer.vocoder.trainable_variables]
    broken = dict(batch, audio=batch["audio"] * float("nan"))
    logs = trainer.train_step(broken)
    assert int(logs["nonfinite_in_a_row"]) == 1
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, trainer.vocoder.trainable_variables))
    logs = trainer.train_step(batch)
    assert int(logs["nonfinite_in_a_row"]) == 0 and np.isfinite(float(logs["loss"]))
    after = [w.numpy() for w in trainer.vocoder.trainable_variables]
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_the_hinge_losses_and_feature_matching_of_a_spectrogram_discriminator():
    rng = np.random.default_rng(1)
    real = tf.constant(np.sin(np.arange(8192) * 0.05)[None].repeat(2, 0).astype(np.float32))
    noise = tf.constant(rng.normal(0, 0.3, (2, 8192)).astype(np.float32))
    critic = SpectrogramDiscriminator(channels=4)
    outputs = critic(real)
    assert [logits.shape[:2] for logits, _ in outputs] == [(2, 61), (2, 29), (2, 13)]  # frames at each FFT size
    assert all(len(features) == 5 for _, features in outputs)
    same = adversarial_losses(outputs, critic(real))
    assert float(same["feature"]) == pytest.approx(0.0, abs=1e-6)  # identical audio: nothing to match
    assert float(adversarial_losses(outputs, critic(noise))["feature"]) > 0.1
    # The hinge: a critic certain and right costs it nothing, and costs the vocoder 2 a resolution.
    right = [(tf.fill([1, 4], 2.0), []), (tf.fill([1, 4], 3.0), [])]
    wrong = [(tf.fill([1, 4], -2.0), []), (tf.fill([1, 4], -1.5), [])]
    certain = adversarial_losses(right, wrong)
    assert float(certain["discriminator"]) == 0.0 and float(certain["adversarial"]) == pytest.approx(2.75)
    fooled = adversarial_losses(right, right)
    assert float(fooled["adversarial"]) == 0.0 and float(fooled["discriminator"]) == pytest.approx(3.5)


def _adversarial_trainer(c, vocoder=None, jit_compile=False) -> VocoderTrainer:
    """A tiny vocoder and its discriminator, compiled, every variable built."""
    trainer = VocoderTrainer(vocoder or Vocoder(c, size="tiny"), segment_frames=32, adversarial_weight=0.1,
                             discriminator_optimizer=keras.optimizers.Adam(1e-3))
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=jit_compile)
    trainer.build_for_training()
    return trainer


def test_a_tiny_vocoder_trains_against_a_discriminator_and_its_backup_holds_both(waveform_batch, tmp_path):
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = _adversarial_trainer(c)
    critic_before = [w.numpy().copy() for w in trainer.discriminator.trainable_variables]
    fixed = random_segments(batch["audio"], batch["mel_length"], 32, c.hop_length, seed=5)
    before = {k: float(v) for k, v in trainer.segment_losses(fixed).items()}
    history = trainer.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=40, epochs=1, verbose=0)
    after = {k: float(v) for k, v in trainer.segment_losses(fixed).items()}
    assert {"adversarial_loss", "feature_loss", "discriminator_loss"} <= set(history.history)
    # The reconstruction still learns with the adversary beside it, and the adversary learns too.
    assert after["mel_loss"] < 0.85 * before["mel_loss"] and after["stft_loss"] < before["stft_loss"], (before, after)
    assert after["discriminator_loss"] < before["discriminator_loss"], (before, after)
    assert int(trainer.discriminator_optimizer.iterations) == 40
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(critic_before, trainer.discriminator.trainable_variables))
    # What BackupAndRestore writes (the trainer's weights) holds the discriminator and its optimizer.
    trainer.save_weights(tmp_path / "backup.weights.h5")
    built = Vocoder(c, size="tiny")
    built.build()  # as load_vocoder gives it (train_vocoder.py --init-from)
    copy = _adversarial_trainer(c, vocoder=built)
    copy.load_weights(tmp_path / "backup.weights.h5")
    for mine, theirs in ((trainer.discriminator.weights, copy.discriminator.weights),
                         (trainer.discriminator_optimizer.variables, copy.discriminator_optimizer.variables)):
        assert len(mine) == len(theirs) and all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(mine, theirs))


@pytest.mark.slow
def test_the_update_with_its_discriminator_compiles_with_xla(waveform_batch):
    # train_vocoder.py compiles it with XLA on a GPU: every op of the step (the STFTs, the inverse
    # STFT, the skip of a non-finite update, both optimizers, the Griffin-Lim phase prior's features and
    # turn: its default) must compile, which a CPU shows too.
    from myxtts.data.clip_features import mel_from_audio

    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = _adversarial_trainer(c, vocoder=Vocoder(c, size="tiny", phase_prior="griffin-lim"), jit_compile=True)
    mel = mel_from_audio(batch, c)["mel"]
    angles = np.random.default_rng(0).uniform(-np.pi, np.pi, (*mel.shape[:2], c.n_fft // 2 + 1))
    batch = {**batch, "mel": mel, "phase": tf.constant(angles, tf.float16)}  # as the held clips give them
    history = trainer.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=3, epochs=1, verbose=0)
    assert trainer.jit_compile and int(trainer.discriminator_optimizer.iterations) == 3
    assert np.isfinite(history.history["loss"][-1]) and history.history["nonfinite_in_a_row"][-1] == 0


def test_tensorboard_gets_a_clips_copy_through_the_vocoder_as_it_trains(waveform_batch, demo_corpus, tmp_path):
    from myxtts.training.callbacks import VocoderSamples

    c, batch = waveform_batch
    trainer = VocoderTrainer(Vocoder(c, size="tiny"), segment_frames=32)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    trainer.build_for_training()
    clip = read_manifest(demo_corpus)[0].audio_path
    samples = VocoderSamples(trainer.vocoder, clip, c, str(tmp_path / "samples"), interval=4)
    trainer.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=2, epochs=5, verbose=0, callbacks=[samples])
    logged = {}
    for events in (tmp_path / "samples").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                logged.setdefault(value.tag, []).append(event.step)
    # The clip and its Griffin-Lim copy once; the vocoder's copy at 4 and 8 updates, and at the end (10).
    assert logged == {"copy/recording": [0], "copy/griffin_lim": [0], "copy/vocoder": [4, 8, 10]}, logged


def test_the_compressed_spectrum_loss_sees_the_phase_the_magnitude_losses_miss():
    from myxtts.config import DataConfig
    from myxtts.models.vocoder_losses import compressed_spectrum_loss

    c = DataConfig()
    rng = np.random.default_rng(1)
    target = griffin_lim.stft(tf.constant(rng.normal(0, 0.1, (2, 31 * c.hop_length)).astype(np.float32)), c)
    real, imaginary = tf.math.real(target), tf.math.imag(target)
    assert float(compressed_spectrum_loss(target, real, imaginary)) == pytest.approx(0.0, abs=1e-6)
    # Every bin's phase turned by 90 degrees: the same magnitudes, so the magnitude losses see nothing.
    turned = compressed_spectrum_loss(target, -imaginary, real)
    halved = compressed_spectrum_loss(target, 0.5 * real, 0.5 * imaginary)
    assert float(turned) > 10 * float(halved) > 0.0


def test_the_phase_angle_losses_wrap_and_tell_a_constant_turn_from_a_scrambled_phase():
    from myxtts.config import DataConfig
    from myxtts.models.vocoder_losses import phase_angle_losses

    c = DataConfig()
    rng = np.random.default_rng(2)
    target = griffin_lim.stft(tf.constant(rng.normal(0, 0.1, (2, 31 * c.hop_length)).astype(np.float32)), c)
    angle = tf.math.angle(target)

    def losses(predicted):
        return {name: float(value) for name, value in phase_angle_losses(target, tf.cos(predicted), tf.sin(predicted)).items()}

    for name, value in losses(angle + 2.0 * np.pi).items():  # a whole turn more is the same phase
        assert value == pytest.approx(0.0, abs=1e-4), name
    # Every bin turned by 90 degrees: the angle is pi/2 off, its differences across bins and frames are not.
    turned = losses(angle + np.pi / 2)
    assert turned["instantaneous"] == pytest.approx(np.pi / 2, abs=1e-3)
    assert turned["group_delay"] == pytest.approx(0.0, abs=1e-3) and turned["frequency"] == pytest.approx(0.0, abs=1e-3)
    # A random phase: every term near the mean distance of two random angles, pi/2.
    scrambled = losses(tf.constant(rng.uniform(-np.pi, np.pi, angle.shape).astype(np.float32)))
    for name, value in scrambled.items():
        assert value == pytest.approx(np.pi / 2, abs=0.1), name


def test_a_tiny_vocoder_trained_with_the_phase_angle_losses_brings_them_down(waveform_batch):
    c, batch = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = VocoderTrainer(Vocoder(c, size="tiny"), segment_frames=16, phase_angle_weight=1.0)
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3))
    segment = random_segments(batch["audio"], batch["mel_length"], 16, c.hop_length, seed=4)
    before = float(trainer.segment_losses(segment)["phase_angle_loss"])
    for _ in range(30):
        with tf.GradientTape() as tape:
            loss = trainer.segment_losses(segment, training=True)["loss"]
        variables = trainer.vocoder.trainable_variables
        trainer.optimizer.apply(tape.gradient(loss, variables), variables)
    after = trainer.segment_losses(segment)
    assert np.isfinite(float(after["loss"]))
    assert float(after["phase_angle_loss"]) < 0.9 * before, (before, float(after["phase_angle_loss"]))


def test_a_segment_of_the_mel_is_the_mel_of_the_segment_of_the_waveform(waveform_batch):
    """Training on given mels (the acoustic model's own) pairs frames with samples: frame t of a clip
    must be frame t - start of the waveform segment from sample start * hop."""
    from myxtts.data import audio
    from myxtts.training.vocoder_clips import mel_segments, segment_starts, waveform_segments

    c, batch = waveform_batch
    frames = 24
    start = segment_starts(batch["mel_length"], frames, seed=4)
    assert int(tf.reduce_max(start)) > 0
    of_segment = audio.log_mel(waveform_segments(batch["audio"], start, frames, c.hop_length), c)
    of_clip = mel_segments(audio.log_mel(batch["audio"], c), start, frames)
    # Away from the segment's ends, where its own STFT sees zero padding instead of the clip.
    inner = slice(c.n_fft // c.hop_length, frames - c.n_fft // c.hop_length)
    np.testing.assert_allclose(of_segment[:, inner].numpy(), of_clip[:, inner].numpy(), atol=1e-3)


def test_a_vocoder_trains_on_the_runs_own_mels(trained_run, tmp_path, capsys, monkeypatch):
    from myxtts.evaluation import quality
    from utilities import train_vocoder

    # As after the README's first command, which installs no quality packages: the measure is skipped
    # with a note at the start, and the run ends well (it crashed after training, the sample unspoken).
    monkeypatch.setattr(quality, "missing_packages", lambda: ["pystoi", "speechmos"])
    out = tmp_path / "vocoder"
    assert train_vocoder.main(["--run", str(trained_run), "--aligned-mels", "--size", "tiny", "--steps", "3",
                               "--batch-size", "4", "--quality-clips", "2", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the run's own mels of " in printed and "teacher-forced" in printed, printed
    assert "needs pystoi, speechmos, not installed here: skipped" in printed and "PESQ" not in printed, printed
    assert not (out / "quality.json").exists()
    from myxtts.config import load_run_config
    from myxtts.models.vocoder import load_vocoder

    assert load_vocoder(out, load_run_config(trained_run / "config.yaml").data).size == "tiny"
    assert not (trained_run / "vocoder").exists()  # --output-dir elsewhere: the run is left as it was
