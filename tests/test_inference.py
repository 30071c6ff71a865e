"""Synthesis: durations predicted, one parallel pass, and Griffin-Lim against the feature pipeline."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import DataConfig
from myxtts.data import audio
from myxtts.models import griffin_lim
from myxtts.models.inference import generate, predicted_durations
from myxtts.models.xtts import XTTS

VOCAB = 12
N_MELS = 20


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    model = XTTS(vocab_size=VOCAB, n_mels=N_MELS, size="tiny")
    model.build()
    # Durations of about 3 frames per token whatever the text: log(1 + 3) from the predictor's bias.
    model.duration_predictor.head.kernel.assign(tf.zeros_like(model.duration_predictor.head.kernel))
    model.duration_predictor.head.bias.assign([math.log(4.0)])
    return model


@pytest.fixture(scope="module")
def prompt():
    rng = np.random.default_rng(0)
    tokens = np.array([[2, 5, 6, 7, 8, 9, 3, 0], [2, 9, 8, 7, 3, 0, 0, 0]], np.int32)  # 7 and 5 tokens, PAD_ID 0
    reference = rng.normal(-4.0, 2.0, (3, 24, N_MELS)).astype(np.float32)
    return tf.constant(tokens), tf.constant(reference), tf.constant([24, 20, 17])


def test_predicted_durations_round_and_stop_at_the_text():
    log_durations = tf.math.log1p(tf.constant([[2.4, 2.6, 0.3, 5.0], [1.0, 0.0, 7.0, 7.0]]))
    assert predicted_durations(log_durations, tf.constant([4, 2])).numpy().tolist() == [[2, 3, 0, 5], [1, 0, 0, 0]]
    assert predicted_durations(log_durations, tf.constant([4, 2]), 2.0).numpy().tolist() == [[5, 5, 1, 10], [2, 0, 0, 0]]
    assert predicted_durations(tf.constant([[-3.0]]), tf.constant([1])).numpy().tolist() == [[0]]  # never negative


def test_lengths_are_the_predicted_durations_and_frames_past_them_are_zero(model, prompt):
    tokens, reference, reference_length = prompt
    mel, length = generate(model, tokens, reference[:2], reference_length[:2])
    assert length.numpy().tolist() == [7 * 3, 5 * 3]
    assert mel.shape == (2, 21, N_MELS) and mel.dtype == tf.float32
    assert np.all(mel[1, 15:].numpy() == 0.0) and np.abs(mel[1, :15]).min() > 0
    slower, slower_length = generate(model, tokens, reference[:2], reference_length[:2], duration_scale=2.0)
    assert slower_length.numpy().tolist() == [42, 30]
    _, capped = generate(model, tokens, reference[:2], reference_length[:2], max_frames=15)
    assert capped.numpy().tolist() == [15, 15]


def test_synthesis_is_the_decoder_on_the_predicted_durations(model, prompt):
    """generate = encode, predict durations, decode: the same functions training uses."""
    tokens, reference, reference_length = prompt
    mel, length = generate(model, tokens, reference[:2], reference_length[:2])
    text_length = tf.constant([7, 5])
    voice = model.voice(reference[:2], reference_length[:2])
    text = model.encode_text(tokens, text_length, voice)
    durations = tf.where(tf.sequence_mask(text_length, 8), 3, 0)
    expected = model.decode(text, durations, 21, length)
    np.testing.assert_allclose(mel.numpy(), expected.numpy(), atol=1e-5)


def test_averaged_references_make_one_voice_for_every_row(model, prompt):
    tokens, reference, reference_length = prompt
    same_text = tf.stack([tokens[0], tokens[0]])
    mel, _ = generate(model, same_text, reference, reference_length, average_references=True)
    np.testing.assert_allclose(mel[0], mel[1], atol=1e-5)
    voice = model.voice(reference, reference_length, average=True)
    from_voice, _ = generate(model, same_text, voice=voice)
    np.testing.assert_allclose(from_voice.numpy(), mel.numpy(), atol=1e-5)
    alone, _ = generate(model, same_text[:1], reference[:1], reference_length[:1])
    assert np.abs(alone[0] - mel[0]).max() > 1e-4  # one clip is another voice than three averaged


def _voiced_signal(c: DataConfig, seconds=1.0):
    """A speech-like test signal: a glottal-pulse-rich 120-180 Hz tone with a moving formant."""
    t = np.arange(int(seconds * c.sample_rate)) / c.sample_rate
    f0 = 150.0 + 30.0 * np.sin(2 * np.pi * 2.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / c.sample_rate
    formant = 700.0 + 500.0 * t / seconds
    harmonics = [np.sin(k * phase) * np.exp(-(((k * f0) - formant) / 400.0) ** 2) / k**0.5 for k in range(1, 40)]
    signal = np.sum(harmonics, axis=0)
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def test_stft_matches_the_pipeline_and_inverts_exactly():
    c = DataConfig()
    signal = tf.constant(_voiced_signal(c, 0.5))
    spectrum = griffin_lim.stft(signal, c)
    filters = audio.mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, c.fmin, c.mel_fmax)
    np.testing.assert_allclose(tf.matmul(tf.abs(spectrum), filters), audio.mel_spectrogram(signal, c), atol=1e-4)
    rebuilt = griffin_lim.istft(spectrum, c)
    assert rebuilt.shape[0] == (spectrum.shape[0] - 1) * c.hop_length
    np.testing.assert_allclose(rebuilt, signal[: rebuilt.shape[0]], atol=1e-5)


def test_griffin_lim_reproduces_the_log_mel(tmp_path):
    c = DataConfig()
    signal = _voiced_signal(c)
    log_mel = audio.log_mel(signal, c)
    waveform = griffin_lim.log_mel_to_audio(log_mel, c, iterations=32)
    assert waveform.shape == ((log_mel.shape[0] - 1) * c.hop_length,)
    rms = float(tf.sqrt(tf.reduce_mean(tf.square(waveform))))
    assert 0.5 < rms / np.sqrt(np.mean(signal**2)) < 1.5  # not silent, not blown up

    def error(samples):
        again = audio.log_mel(samples, c)[: log_mel.shape[0]]
        loud = log_mel > math.log(1e-2)  # bins with energy; the floor is all alike
        return float(tf.reduce_mean(tf.abs(again - log_mel)[loud]))

    random_phase = error(griffin_lim.log_mel_to_audio(log_mel, c, iterations=0))
    recovered = error(waveform)
    assert recovered < 0.35 and recovered < 0.5 * random_phase, (recovered, random_phase)

    path = tmp_path / "out" / "gl.wav"
    griffin_lim.write_wav(path, waveform, c.sample_rate)
    samples, rate = audio.load_wav(str(path))
    assert int(rate) == c.sample_rate
    np.testing.assert_allclose(samples, np.clip(waveform, -1, 1), atol=1.0 / 32767)


@pytest.fixture(scope="module")
def hello_synthesizer(tmp_path_factory):
    """A tiny untrained network whose run saw only "Hello" and "there": 'ð' and 'ˈɛɹ' are known, 'ɪ' is not."""
    import soundfile

    from myxtts.config import load_config
    from myxtts.data.phonemes import model_text
    from myxtts.data.text import Vocabulary
    from myxtts.models.xtts import network_for
    from myxtts.synthesis import Synthesizer

    config = load_config(overrides=["model.size=tiny"])
    texts = [model_text(text, "phonemes", "en-us") for text in ("Hello there.", "Hello.")]
    vocabulary = Vocabulary.from_texts(texts, frontend="phonemes")
    keras.utils.set_random_seed(0)
    network = network_for(config, len(vocabulary), vocabulary.word_boundary_id)
    network.build()
    network.duration_predictor.head.kernel.assign(tf.zeros_like(network.duration_predictor.head.kernel))
    network.duration_predictor.head.bias.assign([math.log(4.0)])  # 3 frames per token: something to hear
    folder = tmp_path_factory.mktemp("hello")
    soundfile.write(folder / "voice.wav", 0.3 * np.sin(np.arange(22050) * 0.05), 22050, subtype="PCM_16")
    return Synthesizer(network, config, vocabulary, run_dir=folder / "run"), folder / "voice.wav"


def test_phonemes_the_run_never_saw_are_named_not_read_as_unk(hello_synthesizer):
    """Synthesis turned unseen phonemes into <unk> silently, where training refuses them."""
    from myxtts.data.text import UNK_ID
    from myxtts.synthesis import UnknownSymbols

    synthesizer, _ = hello_synthesizer
    tokens, dropped = synthesizer.tokens("Hello there.")
    assert dropped == [] and UNK_ID not in tokens.numpy().tolist()
    with pytest.raises(UnknownSymbols) as raised:
        synthesizer.tokens("Hello, is it there?")  # h|ə|l|ˈoʊ|, ɪ|z ɪ|t ð|ˈɛɹ|?
    message = str(raised.value)
    assert "'ɪ' (in 'ɪ|z')" in message and "'t' (in 'ɪ|t')" in message and "'?' (in 'ð|ˈɛɹ|?')" in message
    assert f"{synthesizer.run_dir}/vocab.txt" in message and "--init-from" in message and "--drop-unknown" in message
    assert raised.value.symbols == [",", "ɪ", "z", "ɪ", "t", "?"]

    kept, dropped = synthesizer.tokens("Hello, is it there?", drop_unknown=True)
    assert dropped == [",", "ɪ", "z", "ɪ", "t", "?"]  # every one left out, repeats included
    vocabulary = synthesizer.vocabulary
    assert kept.numpy().tolist() == [i for i in vocabulary.encode("h|ə|l|ˈoʊ|, ɪ|z ɪ|t ð|ˈɛɹ|?", "phonemes")
                                     if i != UNK_ID]
    with pytest.raises(ValueError, match="nothing is left to say"):
        synthesizer.tokens("Is", drop_unknown=True)  # ɪ|z


def test_a_long_text_is_not_quoted_whole_in_its_error(hello_synthesizer):
    """A 5,000-character text with phonemes the run never saw was quoted whole: a 5,600-character error line."""
    from myxtts.synthesis import UnknownSymbols

    synthesizer, _ = hello_synthesizer
    text = ("Hello, is it there? " + "Hello there. " * 400)[:5000]
    with pytest.raises(UnknownSymbols) as raised:
        synthesizer.tokens(text)
    message = str(raised.value)
    assert "'ɪ' (in 'ɪ|z')" in message and "'Hello, is it there? Hello there." in message
    assert "(5,000 characters)" in message and len(message) < 1000  # the text alone was 5,000
    with pytest.raises(ValueError, match=r"makes no phonemes of '\?+'\.\.\. \(5,000 characters\); write") as raised:
        synthesizer.tokens("?" * 5000)
    assert len(str(raised.value)) < 200


def test_synthesize_cli_stops_on_unseen_phonemes_and_drop_unknown_leaves_them_out(hello_synthesizer, tmp_path,
                                                                                 monkeypatch, capsys):
    import soundfile

    from myxtts.synthesis import Synthesizer
    from utilities import synthesize

    synthesizer, voice = hello_synthesizer
    asked = []
    monkeypatch.setattr(Synthesizer, "from_run",
                        classmethod(lambda cls, run_dir, checkpoint=None, vocoder=None: asked.append(vocoder) or synthesizer))
    argv = ["--checkpoint", str(tmp_path), "--text", "Hello, is it there?", "--reference", str(voice), "--vocoder", "griffin-lim"]
    assert synthesize.main([*argv, "--out", str(tmp_path / "refused.wav")]) == 2
    assert "'ɪ' (in 'ɪ|z')" in capsys.readouterr().err and not (tmp_path / "refused.wav").exists()

    assert synthesize.main([*argv, "--out", str(tmp_path / "said.wav"), "--drop-unknown"]) == 0
    assert "left out 6 symbols the run never trained on: , ? t z ɪ" in capsys.readouterr().err
    assert soundfile.info(tmp_path / "said.wav").frames > 0
    assert asked == ["griffin-lim", "griffin-lim"]  # --vocoder reaches the synthesizer


def test_synthesize_cli_names_an_unseen_phoneme_before_fitting_the_voice(hello_synthesizer, tmp_path, monkeypatch, capsys):
    """With --reference-text the voice was fitted first (seconds a clip, 200 updates), and only then was
    the text found to hold a phoneme the run never saw."""
    from myxtts.synthesis import Synthesizer
    from utilities import synthesize

    synthesizer, voice = hello_synthesizer
    monkeypatch.setattr(Synthesizer, "from_run", classmethod(lambda cls, run_dir, checkpoint=None, vocoder=None: synthesizer))

    def fitted(*args, **kwargs):
        raise AssertionError("the voice was fitted before the text was checked")

    monkeypatch.setattr(Synthesizer, "fitted_voice", fitted)
    assert synthesize.main(["--checkpoint", str(tmp_path), "--text", "Hello, is it there?", "--reference", str(voice),
                            "--reference-text", "Hello there.", "--out", str(tmp_path / "refused.wav")]) == 2
    assert "'ɪ' (in 'ɪ|z')" in capsys.readouterr().err


def test_a_wav_that_cannot_be_written_leaves_the_file_that_was_there_and_says_why(hello_synthesizer, tmp_path,
                                                                                  monkeypatch, capsys):
    """`--out` was written in place: a full disk left a truncated WAV where the last one was, and a
    TensorFlow traceback after the synthesis (and the voice's fitting) had been done."""
    from myxtts.synthesis import Synthesizer
    from utilities import synthesize

    synthesizer, voice = hello_synthesizer
    monkeypatch.setattr(Synthesizer, "from_run", classmethod(lambda cls, run_dir, checkpoint=None, vocoder=None: synthesizer))
    out = tmp_path / "out.wav"
    argv = ["--checkpoint", str(tmp_path), "--text", "Hello there.", "--reference", str(voice), "--vocoder", "griffin-lim",
            "--out", str(out)]
    assert synthesize.main(argv) == 0
    before = out.read_bytes()
    write_file = tf.io.write_file

    def disk_full(filename, contents):  # half of it written, then the disk is full, as TensorFlow reports it
        write_file(filename, tf.strings.substr(contents, 0, tf.strings.length(contents) // 2))
        raise tf.errors.ResourceExhaustedError(None, None, f"{filename.numpy().decode()}; No space left on device")

    monkeypatch.setattr(tf.io, "write_file", lambda filename, contents: disk_full(tf.constant(filename), contents))
    assert synthesize.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: cannot write {out}: No space left on device"
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


def test_two_syntheses_to_one_out_at_once_each_write_a_whole_wav(tmp_path, monkeypatch):
    """Both wrote beside --out under one name: the second's write cut the first's file short and renamed
    it into place, and the first then said it could not write --out (No such file or directory)."""
    import subprocess
    import sys
    import wave
    from pathlib import Path

    from myxtts.models.griffin_lim import write_wav

    out, write_file, others = tmp_path / "out.wav", tf.io.write_file, []
    other = (f"import numpy as np; from myxtts.models.griffin_lim import write_wav; "
             f"write_wav({str(out)!r}, np.full(8000, 0.25, np.float32), 16000)")

    def another_synthesis_meanwhile(filename, contents):  # as ours is written, another process writes its own
        write_file(filename, contents)
        if not others:
            others.append(subprocess.run([sys.executable, "-c", other], capture_output=True, text=True,
                                         cwd=Path(__file__).resolve().parents[1]))

    monkeypatch.setattr(tf.io, "write_file", another_synthesis_meanwhile)
    write_wav(str(out), np.full(16000, 0.5, np.float32), 16000)
    assert others[0].returncode == 0, others[0].stderr
    with wave.open(str(out)) as wav:  # ours, renamed last, whole
        assert wav.getnframes() == 16000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


def test_synthesize_cli_refuses_an_out_that_is_a_folder_before_speaking(tmp_path, capsys):
    # It spoke, then stopped on TensorFlow's "Is a directory" traceback where the WAV was written.
    from utilities import synthesize

    with pytest.raises(SystemExit) as exited:
        synthesize.main(["--checkpoint", str(tmp_path / "no_run"), "--text", "Hello.", "--reference", "a.wav",
                         "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert f"--out {tmp_path} is a folder; give the file to write, e.g. {tmp_path / 'out.wav'}" in capsys.readouterr().err


def test_synthesize_cli_refuses_to_write_over_its_reference_clip(tmp_path, capsys):
    # `--reference voice.wav --out voice.wav` replaced the user's recording with the synthesis.
    from utilities import synthesize

    clip = tmp_path / "voice.wav"
    clip.write_bytes(b"RIFF the user's only recording of the voice")
    for out in (str(clip), str(tmp_path / "sub" / ".." / "voice.wav")):
        with pytest.raises(SystemExit) as exited:
            synthesize.main(["--checkpoint", str(tmp_path / "no_run"), "--text", "Hello.", "--reference", str(clip),
                             "--out", out])
        assert exited.value.code == 2
        assert f"--out {out} is a --reference clip" in capsys.readouterr().err
    assert clip.read_bytes() == b"RIFF the user's only recording of the voice"


def test_a_reference_that_is_a_folder_is_called_one(hello_synthesizer, tmp_path):
    synthesizer, _ = hello_synthesizer  # it was "reference audio not found" for a folder that is there
    with pytest.raises(FileNotFoundError, match=f"reference audio {tmp_path} is a folder: give one or more of its WAV"):
        synthesizer.reference([tmp_path])
    with pytest.raises(FileNotFoundError, match="reference audio not found"):
        synthesizer.reference([tmp_path / "missing.wav"])


def test_a_damaged_reference_clip_is_named_with_what_is_wrong_with_it(hello_synthesizer, tmp_path):
    """The message once ended in TensorFlow's "Graph execution error:" and left out the problem."""
    synthesizer, voice = hello_synthesizer
    damaged = tmp_path / "damaged.wav"
    damaged.write_bytes(voice.read_bytes()[:30])  # cut off inside the 'fmt ' chunk
    with pytest.raises(ValueError) as raised:
        synthesizer.reference([str(damaged)])
    message = str(raised.value)
    assert message.startswith("cannot use as a reference voice: damaged WAV") and str(damaged) in message, message
    assert "Graph execution error" not in message, message


def test_a_reference_in_another_format_is_refused_saying_what_a_reference_must_be(hello_synthesizer, tmp_path):
    """The advice was the corpus's: "convert the corpus once with utilities/prepare_dataset.py", which
    takes a manifest with a transcript per clip, not one clip of a voice."""
    import soundfile

    synthesizer, _ = hello_synthesizer
    speech = 0.3 * np.sin(np.arange(22050) * 0.05)
    soundfile.write(tmp_path / "studio.wav", speech, 22050, subtype="PCM_24")
    soundfile.write(tmp_path / "voice - take 1.flac", speech, 22050)
    soundfile.write(tmp_path / "high.wav", np.repeat(speech, 4), 96000, subtype="PCM_16")
    for name, what in (("studio.wav", "WAV of 24-bit integer samples (TensorFlow reads 16-bit integer PCM only): "),
                       ("voice - take 1.flac", "not a WAV file (no RIFF/WAVE header): "),
                       ("high.wav", "unsupported sample rate 96000 in ")):
        with pytest.raises(ValueError) as raised:
            synthesizer.reference([str(tmp_path / name)])
        assert str(raised.value) == (f"cannot use as a reference voice: {what}{tmp_path / name} - give a whole 16-bit "
                                     "PCM WAV of the voice (mono or stereo, 8 to 48 kHz)")


def test_a_reference_error_the_data_checks_do_not_know_says_what_a_reference_must_be(hello_synthesizer, tmp_path,
                                                                                      monkeypatch):
    """TensorFlow's own words, then the same advice: it sent a user to convert the one clip with
    prepare_dataset.py, which takes a manifest with a transcript per clip."""
    from myxtts import synthesis

    synthesizer, _ = hello_synthesizer
    import tensorflow as tf

    (tmp_path / "voice.wav").write_bytes(b"RIFF" + bytes(40))

    def decoder_error(path, config):  # an error none of the pipeline's checks names
        raise tf.errors.InvalidArgumentError(None, None, "Graph execution error:\n\nBad WAV: odd block alignment 0")

    monkeypatch.setattr(synthesis, "reference_log_mel", decoder_error)
    with pytest.raises(ValueError) as raised:
        synthesizer.reference([str(tmp_path / "voice.wav")])
    message = str(raised.value)
    assert message.startswith(f"cannot use as a reference voice: {tmp_path / 'voice.wav'} (Bad WAV: odd block alignment 0)")
    assert message.endswith(") - give a whole 16-bit PCM WAV of the voice (mono or stereo, 8 to 48 kHz)"), message
    assert "prepare_dataset" not in message


def test_a_silent_or_too_short_reference_clip_is_refused_naming_it(hello_synthesizer, tmp_path, monkeypatch, capsys):
    """Both used to speak without a word of warning, in whatever voice the encoder makes of silence or a click."""
    import soundfile

    from myxtts.synthesis import Synthesizer
    from utilities import synthesize

    synthesizer, voice = hello_synthesizer
    clips = {"silent": np.zeros(22050), "hiss": 5e-4 * np.sin(np.arange(22050) * 0.05),  # -66 dBFS
             "click": 0.3 * np.sin(np.arange(441) * 0.05)}  # 0.02 s
    for name, samples in clips.items():
        soundfile.write(tmp_path / f"{name}.wav", samples, 22050, subtype="PCM_16")
    silent = "is silent where its voice is read (at most its middle 3 s: "
    for name, expected in (("silent", silent + "every sample zero)"), ("hiss", silent + "its loudest sample at -66 dBFS)"),
                           ("click", "holds 0.02 s of audio; a voice needs at least 0.5 s")):
        with pytest.raises(ValueError) as raised:
            synthesizer.reference([str(voice), str(tmp_path / f"{name}.wav")])  # any one of several clips
        assert str(raised.value) == f"cannot use as a reference voice: {tmp_path / name}.wav {expected}" + (
            "; give a clip of the voice speaking" if "silent" in expected else " (3 s or more clones best)")
    mel, length = synthesizer.reference([str(voice)])  # a clip that speaks (a tone here) still lends its voice
    assert mel.shape[0] == 1 and int(length[0]) > 0
    quiet_middle = np.concatenate([0.3 * np.sin(np.arange(22050) * 0.05), np.zeros(5 * 22050), 0.3 * np.sin(np.arange(22050) * 0.05)])
    soundfile.write(tmp_path / "gap.wav", quiet_middle, 22050, subtype="PCM_16")  # speaks only outside the middle 3 s
    with pytest.raises(ValueError, match="gap.wav is silent where its voice is read"):
        synthesizer.reference([str(tmp_path / "gap.wav")])

    monkeypatch.setattr(Synthesizer, "from_run", classmethod(lambda cls, run_dir, checkpoint=None, vocoder=None: synthesizer))
    assert synthesize.main(["--checkpoint", str(tmp_path), "--text", "Hello.", "--reference", str(tmp_path / "silent.wav"),
                            "--out", str(tmp_path / "out.wav")]) == 2
    assert f"{tmp_path / 'silent.wav'} is silent" in capsys.readouterr().err and not (tmp_path / "out.wav").exists()


def test_a_fitted_voice_speaks_its_clips_closer_and_leaves_the_network_alone(model, prompt):
    from myxtts.models.voice_fit import fit_voice

    tokens, reference, reference_length = prompt
    mel = tf.constant(np.random.default_rng(1).normal(-4.0, 2.0, (2, 30, N_MELS)).astype(np.float32))
    weights = [w.numpy().copy() for w in model.weights]
    fitted = fit_voice(model, reference[:2], reference_length[:2], mel, tf.constant([30, 25]), tokens,
                       tf.constant([7, 5]), steps=30)
    voice, before, after = fitted.voice, fitted.loss_before, fitted.loss_after
    assert fitted.head is None
    assert voice.shape == (1, model.spec.d_model) and voice.dtype == tf.float32
    assert after < 0.95 * before, (before, after)
    start = model.voice(reference[:2], reference_length[:2], average=True)
    assert float(tf.reduce_max(tf.abs(voice - start))) > 0.1  # moved from the encoder's voice, where it began
    for weight, saved in zip(model.weights, weights):  # the network is the same network afterwards
        np.testing.assert_array_equal(weight.numpy(), saved, err_msg=weight.path)
    # The fitted voice is what synthesis takes.
    _, length = generate(model, tokens, voice=voice)
    assert length.numpy().tolist() == [21, 15]


def test_a_fitted_head_is_the_ridge_solution_and_is_worn_only_while_its_voice_speaks(model, prompt):
    from myxtts.models import alignment
    from myxtts.models.layers import normalize_mel
    from myxtts.models.voice_fit import fit_voice, speaking_as

    tokens, reference, reference_length = prompt
    mel = tf.constant(np.random.default_rng(1).normal(-4.0, 2.0, (2, 30, N_MELS)).astype(np.float32))
    mel_length, text_length = tf.constant([30, 25]), tf.constant([7, 5])
    trained = [w.copy() for w in model.mel_head.get_weights()]
    args = (model, reference[:2], reference_length[:2], mel, mel_length, tokens, text_length)
    alone, headed = fit_voice(*args, steps=5), fit_voice(*args, steps=5, head_ridge=0.01)
    np.testing.assert_array_equal(headed.voice.numpy(), alone.voice.numpy())  # the head comes after the voice
    assert headed.loss_after < 0.9 * alone.loss_after, (alone.loss_after, headed.loss_after)
    # The ridge solution, checked by another route: least squares on the stacked system
    # [X; sqrt(p) I] W = [Y; sqrt(p) W0], solved by SVD rather than the normal equations.
    index = alignment.frame_tokens(model.align(mel, mel_length, tokens, text_length)[2], 30)
    text = model.encode_text(tokens, text_length, tf.concat([headed.voice, headed.voice], 0))
    valid = tf.sequence_mask(mel_length, 30)
    x = tf.boolean_mask(model.decoder_features(text, index, mel_length)[0], valid).numpy().astype(np.float64)
    x = np.concatenate([x, np.ones((len(x), 1))], 1)
    y = normalize_mel(tf.boolean_mask(mel, valid)).numpy().astype(np.float64)
    w0 = np.concatenate([trained[0], trained[1][None]]).astype(np.float64)
    root = np.sqrt(0.01 * np.sum(x * x) / x.shape[1])
    expected = np.linalg.lstsq(np.concatenate([x, root * np.eye(x.shape[1])]),
                               np.concatenate([y, root * w0]), rcond=None)[0]
    np.testing.assert_allclose(headed.head[0], expected[:-1], atol=2e-4)
    np.testing.assert_allclose(headed.head[1], expected[-1], atol=2e-4)
    # A large ridge keeps the trained head.
    firm = fit_voice(*args, steps=5, head_ridge=1e6)
    np.testing.assert_allclose(firm.head[0], trained[0], atol=1e-4)
    # Worn while it speaks, the trained head back afterwards (also when speaking fails).
    with speaking_as(model, headed):
        np.testing.assert_array_equal(model.mel_head.get_weights()[0], headed.head[0])
        worn = generate(model, tokens, voice=headed.voice)[0]
    with pytest.raises(RuntimeError), speaking_as(model, headed):
        raise RuntimeError("synthesis failed")
    for weight, saved in zip(model.mel_head.get_weights(), trained):
        np.testing.assert_array_equal(weight, saved)
    plain = generate(model, tokens, voice=headed.voice)[0]
    assert not np.allclose(worn.numpy(), plain.numpy(), atol=1e-3)


def test_fitting_one_voice_after_another_gives_what_fitting_it_alone_gives(model, prompt):
    # The fitting steps are traced once per network and reused: each fit starts afresh (its own start,
    # Adam's moments and step count at zero), so nothing of the voice before leaks into the next.
    from myxtts.models import voice_fit

    tokens, reference, reference_length = prompt
    rng = np.random.default_rng(2)
    first, second = (tf.constant(rng.normal(-4.0, 2.0, (2, 30, N_MELS)).astype(np.float32)) for _ in range(2))
    lengths = (tf.constant([30, 25]), tokens, tf.constant([7, 5]))

    def fit(mel, clip):
        return voice_fit.fit_voice(model, reference[clip:clip + 1], reference_length[clip:clip + 1], mel,
                                   lengths[0], lengths[1], lengths[2], steps=20)

    fit(first, 0)
    after = fit(second, 2)  # the steps traced for the first voice (the same shapes), reused
    voice_fit._FITTERS.clear()
    alone = fit(second, 2)  # traced afresh
    assert after.loss_before == alone.loss_before
    np.testing.assert_array_equal(after.voice.numpy(), alone.voice.numpy())


@pytest.mark.parametrize("text, sentences", [
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("Dr. Smith met J. R. Tolkien. Then he left.", ["Dr. Smith met J. R. Tolkien.", "Then he left."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("It cost 3.50 dollars, e.g. this much. Yes", ["It cost 3.50 dollars, e.g. this much.", "Yes"]),
    ("Wait... What?\nA new line", ["Wait...", "What?", "A new line"]),
    ("Guten Tag. Ärger gibt es nicht.", ["Guten Tag.", "Ärger gibt es nicht."]),
    ("你好。我很好！", ["你好。", "我很好！"]),
    ("no sentence mark here ", ["no sentence mark here"]),
    ("  ", []),
])
def test_split_sentences(text, sentences):
    from myxtts.synthesis import split_sentences

    assert split_sentences(text) == sentences


def test_a_text_of_several_sentences_is_each_sentence_spoken_alone_with_a_pause_between(hello_synthesizer):
    # A paragraph spoken as one sequence lost its words as it grew (8 sentences: WER 0.15-0.35 against
    # 0-0.006 a sentence at a time, BENCHMARKS.md "Long text"): the model learned single sentences.
    from myxtts.synthesis import SENTENCE_PAUSE_S

    synthesizer, voice = hello_synthesizer
    c = synthesizer.config.data
    _, first = synthesizer.synthesize("Hello there.", [voice])
    _, second = synthesizer.synthesize("Hello.", [voice])
    samples, both = synthesizer.synthesize("Hello there. ... Hello.", [voice])  # the lone "..." says nothing
    pause = round(SENTENCE_PAUSE_S * c.frames_per_second)
    assert both.shape[0] == first.shape[0] + pause + second.shape[0]
    np.testing.assert_allclose(both[: first.shape[0]], first, atol=1e-5)  # spoken in one batch, as alone
    np.testing.assert_allclose(both[first.shape[0] + pause:], second, atol=1e-5)
    assert np.all(both[first.shape[0]: first.shape[0] + pause].numpy() == math.log(c.log_floor))
    assert samples.shape[0] == (both.shape[0] - 1) * c.hop_length  # one vocoder call over the whole
    _, capped = synthesizer.synthesize("Hello there. Hello.", [voice], max_seconds=0.1)
    assert capped.shape[0] == math.ceil(0.1 * c.frames_per_second)
