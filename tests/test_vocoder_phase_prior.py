"""The vocoder's Griffin-Lim phase prior (`--phase-prior griffin-lim`): untrained it is Griffin-Lim,
what it reads of the phase, the phase computed once per clip, and training from it."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.data import audio
from myxtts.models import griffin_lim
from myxtts.models.vocoder import Vocoder, load_vocoder, phase_features, save_vocoder
from myxtts.training.vocoder_clips import clip_stream, recorded_mels, with_griffin_lim_phase
from myxtts.training.vocoder_step import VocoderTrainer


@pytest.fixture(scope="module")
def clips(waveform_batch):
    c, batch = waveform_batch
    return with_griffin_lim_phase(recorded_mels([batch], c), c)


def test_an_untrained_vocoder_with_the_prior_speaks_griffin_lims_audio(waveform_batch):
    c, batch = waveform_batch
    frames = int(batch["mel_length"][0])
    log_mel = audio.log_mel(batch["audio"][0, : (frames - 1) * c.hop_length], c)
    vocoder = Vocoder(c, size="tiny", phase_prior="griffin-lim")
    spoken = vocoder(log_mel[None])[0].numpy()
    expected = griffin_lim.log_mel_to_audio(log_mel, c).numpy()
    assert spoken.shape == expected.shape
    # The same 32 iterations from the same seed; only the prior's log/exp round trip (+1e-5) differs.
    np.testing.assert_allclose(spoken, expected, atol=2e-3 * np.abs(expected).max())


def test_the_phase_features_read_turns_not_the_angle_itself():
    from myxtts.config import DataConfig

    c = DataConfig()
    rng = np.random.default_rng(3)
    bins = c.n_fft // 2 + 1
    angles = rng.uniform(-np.pi, np.pi, (1, 12, bins)).astype(np.float32)
    loud = np.full(angles.shape, 100.0, np.float32)
    features = phase_features(np.cos(angles), np.sin(angles), loud, c).numpy()
    assert features.shape == (1, 12, 4 * bins)
    # Every bin turned by one angle: nothing a network can read changes.
    turned = angles + 1.234
    np.testing.assert_allclose(phase_features(np.cos(turned), np.sin(turned), loud, c).numpy(), features, atol=1e-5)
    # A silent bin's phase (Griffin-Lim's is chaotic there) is not read at all; a loud one's fully.
    quiet = loud.copy()
    quiet[..., 7] = 0.0
    read = phase_features(np.cos(angles), np.sin(angles), quiet, c).numpy()
    assert np.all(read[..., [7, bins + 7, 2 * bins + 7, 3 * bins + 7]] == 0.0)
    np.testing.assert_allclose(np.hypot(read[..., 8], read[..., bins + 8]), 1.0, atol=1e-4)
    # A steady sinusoid at a bin's centre frequency turns by exactly that frequency's step: (cos, sin) = (1, 0).
    k, bins = 40, c.n_fft // 2 + 1
    t = np.arange(12)[:, None]
    steady = (2 * np.pi * k * c.hop_length / c.n_fft * t + 0.3 + np.pi * (np.arange(bins) - k)[None]).astype(np.float32)
    over_time = phase_features(np.cos(steady)[None], np.sin(steady)[None], loud, c).numpy()[0]
    np.testing.assert_allclose(over_time[1:, k], 1.0, atol=1e-4)
    np.testing.assert_allclose(over_time[1:, bins + k], 0.0, atol=1e-4)
    np.testing.assert_allclose(over_time[:, 2 * bins + 1 :3 * bins], 1.0, atol=1e-4)  # a pi per bin: no group delay


def test_the_phase_is_found_once_per_clip_as_synthesis_finds_it_and_held_unpadded(waveform_batch, clips):
    c, batch = waveform_batch
    frames = clips["mel_length"].numpy()
    assert np.array_equal(frames, batch["mel_length"].numpy())
    assert clips["phase"].dtype == tf.float16 and np.array_equal(clips["phase"].row_lengths().numpy(), frames)
    assert np.array_equal(clips["audio"].row_lengths().numpy(), (frames - 1) * c.hop_length)
    row = int(np.argmin(frames))  # the shortest clip: padded, it would have held the longest one's frames
    np.testing.assert_array_equal(clips["audio"][row].numpy(), batch["audio"][row, : (frames[row] - 1) * c.hop_length].numpy())
    expected = tf.math.angle(griffin_lim.griffin_lim_phase(griffin_lim.mel_to_magnitude(clips["mel"][row], c), c))
    difference = np.angle(np.exp(1j * (clips["phase"][row].numpy().astype(np.float32) - expected.numpy())))
    assert clips["phase"][row].shape == (frames[row], c.n_fft // 2 + 1) and np.abs(difference).max() < 5e-3  # float16


def test_the_clip_stream_cuts_one_segment_per_clip_in_one_shape(waveform_batch, clips):
    c, _ = waveform_batch
    count, frames = int(clips["mel_length"].shape[0]), 32
    stream = clip_stream(clips, count, c, frames, seed=0)
    # One shape for every batch, so an XLA-compiled step compiles once. Padded to each batch's longest
    # clip, it compiled at every batch (the H200's train_vocoder.py run).
    assert all(spec.shape.is_fully_defined() for spec in stream.element_spec.values()), stream.element_spec
    streamed = next(iter(stream))  # every clip once, shuffled
    hop, bins = c.hop_length, c.n_fft // 2 + 1
    assert streamed["audio"].shape == (count, (frames - 1) * hop) and streamed["phase"].shape == (count, frames, bins)
    floor = np.full((frames, c.n_mels), np.log(c.log_floor), np.float32)
    found = set()
    for row in range(count):  # which clip, and which first frame: the same one in the audio, mel and phase
        matches = []
        for i in range(count):
            length = int(clips["mel_length"][i])
            mel = np.concatenate([clips["mel"][i].numpy(), floor])
            wave = np.pad(clips["audio"][i].numpy(), (0, frames * hop))
            phase = np.pad(clips["phase"][i].numpy(), ((0, frames), (0, 0)))
            matches += [(i, start) for start in range(max(length - frames, 0) + 1)
                        if np.array_equal(mel[start:start + frames], streamed["mel"][row].numpy())
                        and np.array_equal(wave[start * hop:(start + frames - 1) * hop], streamed["audio"][row].numpy())
                        and np.array_equal(phase[start:start + frames], streamed["phase"][row].numpy())]
        assert matches, f"row {row} is no segment of any clip"
        i = matches[0][0]
        found.add(i)
        assert int(streamed["mel_length"][row]) == min(int(clips["mel_length"][i]), frames)  # the step's own start: 0
    assert found == set(range(count))
    # The same seed, the same segments: their first frames are drawn per element, not in map order.
    again = next(iter(clip_stream(clips, count, c, frames, seed=0)))
    assert all(np.array_equal(again[key].numpy(), streamed[key].numpy()) for key in streamed)


def test_a_tiny_vocoder_with_the_prior_trains_from_the_clips_and_keeps_it_through_save_and_load(waveform_batch, clips,
                                                                                                 tmp_path):
    c, _ = waveform_batch
    keras.utils.set_random_seed(0)
    trainer = VocoderTrainer(Vocoder(c, size="tiny", phase_prior="griffin-lim"), segment_frames=32)
    trainer.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=False)
    trainer.build_for_training()
    fixed = next(iter(clip_stream(clips, 8, c, 32, seed=1)))
    tf.random.set_seed(5)
    before = float(trainer.losses_of(fixed)["loss"])
    trainer.fit(tf.data.Dataset.from_tensors(fixed).repeat(), steps_per_epoch=30, epochs=1, verbose=0)
    tf.random.set_seed(5)
    after = float(trainer.losses_of(fixed)["loss"])
    assert after < 0.9 * before, (before, after)
    save_vocoder(trainer.vocoder, tmp_path)
    assert json.loads((tmp_path / "vocoder.json").read_text())["phase_prior"] == "griffin-lim"
    loaded = load_vocoder(tmp_path, c)
    log_mel = clips["mel"][0][None]
    np.testing.assert_allclose(loaded(log_mel).numpy(), trainer.vocoder(log_mel).numpy(), atol=1e-5)


def test_a_phase_given_to_a_vocoder_without_the_prior_is_refused(waveform_batch, clips):
    c, _ = waveform_batch
    angle = tf.cast(clips["phase"][0], tf.float32)[None]
    phase = tf.cos(angle), tf.sin(angle)
    with pytest.raises(ValueError, match="without a phase prior"):
        Vocoder(c, size="tiny").polar(clips["mel"][0][None], phase=phase)
    with pytest.raises(ValueError, match="phase prior 'magic'"):
        Vocoder(c, size="tiny", phase_prior="magic")


def test_the_tflite_route_finds_the_prior_and_speaks_as_the_vocoder_does(waveform_batch, clips):
    """TFLite has no complex kernels: `export_tflite.neural_real` finds Griffin-Lim's phase and turns it
    in real arithmetic, with built-in ops only."""
    from myxtts.compat import frozen_function
    from myxtts.export_tflite import neural_real

    c, _ = waveform_batch
    keras.utils.set_random_seed(7)
    vocoder = Vocoder(c, size="tiny", phase_prior="griffin-lim")
    vocoder.build()
    rng = np.random.default_rng(7)
    for head, scale in ((vocoder.magnitude_head, 0.05), (vocoder.phase_head, 0.5)):  # not Griffin-Lim's own audio
        head.kernel.assign(rng.normal(0, scale, head.kernel.shape).astype(np.float32))
    log_mel = clips["mel"][0]
    expected = vocoder(log_mel[None])[0].numpy()
    assert _snr_db(expected, griffin_lim.log_mel_to_audio(log_mel, c).numpy()) < 20.0

    spoken = tf.function(lambda mel: neural_real(vocoder, mel, c), input_signature=[tf.TensorSpec([None, c.n_mels], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen_function(spoken.get_concrete_function())])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    lite = tf.lite.Interpreter(model_content=converter.convert())
    lite.resize_tensor_input(lite.get_input_details()[0]["index"], log_mel.shape)
    lite.allocate_tensors()
    lite.set_tensor(lite.get_input_details()[0]["index"], log_mel.numpy())
    lite.invoke()
    # 32 iterations in another order of floating-point operations, as Griffin-Lim's own export (60 dB there).
    assert _snr_db(lite.get_tensor(lite.get_output_details()[0]["index"]), expected) >= 50.0


def _snr_db(audio, reference) -> float:
    return float(10 * np.log10(np.sum(reference ** 2) / max(np.sum((audio - reference) ** 2), 1e-20)))
