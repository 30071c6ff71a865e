"""The neural vocoder where audio is made (issue 27): its folder, the choice of vocoder for a run,
synthesis, validation and the free-running check. The export's round trip is in test_export.py."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import make_vocoder_folder
from myxtts.config import load_run_config
from myxtts.models import griffin_lim
from myxtts.models.vocoder import SETTINGS_FILE, WEIGHTS_FILE, VocoderMismatch, load_vocoder, waveform_maker
from myxtts.synthesis import GRIFFIN_LIM, RUN_VOCODER, Synthesizer, vocoder_folder

TEXT = "Hello there."


@pytest.fixture(scope="module")
def vocoder_dir(trained_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocoder") / "tiny"
    return folder, make_vocoder_folder(load_run_config(trained_run / "config.yaml").data, folder)


def test_a_saved_vocoder_loads_and_speaks_as_it_did(vocoder_dir, trained_run):
    folder, original = vocoder_dir
    d = load_run_config(trained_run / "config.yaml").data
    assert sorted(p.name for p in folder.iterdir()) == sorted([SETTINGS_FILE, WEIGHTS_FILE])
    mel = tf.random.stateless_normal([1, 40, d.n_mels], seed=[1, 2]) - 4.0
    loaded = load_vocoder(folder, d)
    np.testing.assert_allclose(loaded(mel).numpy(), original(mel).numpy(), atol=1e-6)
    speech = waveform_maker(d, loaded)(mel[0]).numpy()
    assert speech.shape == ((40 - 1) * d.hop_length,)
    assert not np.allclose(speech, griffin_lim.log_mel_to_audio(mel[0], d).numpy(), atol=1e-3)


def test_a_vocoder_of_other_features_or_no_vocoder_is_a_clear_error(vocoder_dir, trained_run, tmp_path):
    folder, _ = vocoder_dir
    d = load_run_config(trained_run / "config.yaml").data
    with pytest.raises(VocoderMismatch, match=r"data\.n_mels: vocoder 80, run 64.*data\.log_floor"):
        load_vocoder(folder, dataclasses.replace(d, n_mels=64, log_floor=1e-4))
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} is not a vocoder folder \(no {SETTINGS_FILE}\)"):
        load_vocoder(tmp_path, d)


def test_the_vocoder_of_a_run_is_the_one_named_then_its_own_then_its_config(vocoder_dir, trained_run, tmp_path):
    folder, _ = vocoder_dir
    config = load_run_config(trained_run / "config.yaml")
    run = tmp_path / "run"
    run.mkdir()
    assert vocoder_folder(run, config) is None  # Griffin-Lim
    configured = dataclasses.replace(config, training=dataclasses.replace(config.training, vocoder="/somewhere/voc"))
    assert vocoder_folder(run, configured) == "/somewhere/voc"
    shutil.copytree(folder, run / RUN_VOCODER)
    assert vocoder_folder(run, configured) == str(run / RUN_VOCODER)
    assert vocoder_folder(run, configured, "/named") == "/named"
    assert vocoder_folder(run, configured, GRIFFIN_LIM) is None


def test_synthesis_speaks_through_the_vocoder_it_is_given(vocoder_dir, trained_run, demo_corpus):
    folder, _ = vocoder_dir
    reference = [str(sorted((demo_corpus / "wavs").glob("*.wav"))[0])]
    neural = Synthesizer.from_run(trained_run, vocoder=str(folder))
    audio, mel = neural.synthesize(TEXT, reference)
    np.testing.assert_allclose(audio.numpy(), neural.vocoder(mel[None])[0].numpy(), atol=1e-5)
    plain = Synthesizer.from_run(trained_run)
    assert plain.vocoder is None
    gl_audio, gl_mel = plain.synthesize(TEXT, reference)
    np.testing.assert_allclose(gl_mel.numpy(), mel.numpy(), atol=1e-5)  # the same acoustic model
    np.testing.assert_allclose(gl_audio.numpy(), griffin_lim.log_mel_to_audio(gl_mel, plain.config.data).numpy(), atol=1e-5)
    assert not np.allclose(gl_audio.numpy(), audio.numpy(), atol=1e-3)


def test_validation_speaks_through_training_vocoder(vocoder_dir, trained_run, tmp_path):
    from myxtts.data.splits import load_splits
    from myxtts.training.trainer import _speech_check

    folder, _ = vocoder_dir
    synthesizer = Synthesizer.from_run(trained_run)
    config = synthesizer.config
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, vocoder=str(folder), wer_sentences=2))
    train_rows, val_rows = load_splits(config)
    said = []
    check = _speech_check(config, synthesizer.network, train_rows, val_rows, synthesizer.vocabulary, tmp_path, said.append)
    assert check.sentences.vocoder is not None and check.voices.sentences.vocoder is check.sentences.vocoder
    assert any(str(folder) in line and "training.vocoder" in line for line in said), said
    assert any("through the vocoder" in line for line in said), said
    mel = check.sentences.recording_mel(0)
    np.testing.assert_allclose(check.sentences.waveform(mel), check.sentences.vocoder(mel[None])[0].numpy(), atol=1e-5)

    missing = dataclasses.replace(config, training=dataclasses.replace(config.training, vocoder=str(tmp_path / "none")))
    with pytest.raises(FileNotFoundError, match="none is not a vocoder folder"):
        _speech_check(missing, synthesizer.network, train_rows, val_rows, synthesizer.vocabulary, tmp_path, said.append)


def test_the_free_running_check_measures_the_vocoder_it_is_given(vocoder_dir, trained_run, tmp_path, capsys):
    from utilities import free_running_check

    folder, _ = vocoder_dir
    report_path = tmp_path / "report.json"
    assert free_running_check.main(["--run", str(trained_run), "--vocoder", str(folder), "--sentences", "2", "--quality",
                                    "--unseen-voices", "", "--json", str(report_path)]) == 0  # voices: test_training
    report = json.loads(report_path.read_text())
    assert report["vocoder"] == str(folder)
    quality = report["quality"]
    assert quality["copy_synthesis_vocoder"]["clips"] == quality["copy_synthesis_griffin-lim"]["clips"] == 2
    assert 1.0 <= quality["dnsmos_syntheses"]["ovrl"] <= 5.0
    captured = capsys.readouterr()
    assert f"vocoder: {folder}" in captured.out
    # The two long loops say how far they are (a real validation split is hundreds of sentences).
    assert "speaking the sentences: 2/2 sentences" in captured.err and "done in" in captured.err, captured.err
    assert "the recordings through the vocoder: 2/2 clips" in captured.err, captured.err


def test_the_speech_measure_speaks_each_sentence_once_in_batches_heard_or_not(trained_run):
    # The measure now speaks a batch at a time as the recognizer takes its sentences (so that its
    # progress line moves); a scorer without a recognizer (a language it lacks) reads none of them,
    # and the length ratio still needs every mel.
    from myxtts.data.splits import load_splits
    from myxtts.evaluation.intelligibility import IntelligibilityScorer
    from myxtts.evaluation.speech import HeldOutSentences

    synthesizer = Synthesizer.from_run(trained_run)
    train_rows, _ = load_splits(synthesizer.config)
    rows = train_rows[:10]  # more than one batch of 8
    sentences = HeldOutSentences.from_rows(rows, train_rows, synthesizer.vocabulary, synthesizer.config)
    at_once = sentences.synthesize(synthesizer.network)
    for language, heard in (("en-us", True), ("fa", False)):
        report = sentences.measure(synthesizer.network, IntelligibilityScorer([u.text for u in rows], language, workers=1))
        assert (report.wer is not None) == heard and len(report.rows) == (10 if heard else 0)
        assert len(report.mels) == 10 and all(np.allclose(a, b, atol=1e-5) for a, b in zip(report.mels, at_once))
        ratios = [len(m) / n for m, n in zip(at_once, sentences.recorded_frames)]
        assert report.length_ratio == pytest.approx(float(np.median(ratios)))


def test_a_held_out_synthesis_is_cut_at_three_times_its_recordings_length(trained_run, monkeypatch):
    # A model after two updates (the default config) spoke its sentences ~20 times their recordings' length (its
    # duration predictor not trained yet), and the vocoder, recognizer and speaker encoder of that
    # validation worked through all of it (decoding 211 s of audio for 2 sentences). Here the shared
    # run's durations are stretched 30 times to the same effect.
    import functools
    import math

    from myxtts.data.splits import load_splits
    from myxtts.evaluation import speech

    synthesizer = Synthesizer.from_run(trained_run)
    train_rows, _ = load_splits(synthesizer.config)
    sentences = speech.HeldOutSentences.from_rows(train_rows[:10], train_rows, synthesizer.vocabulary, synthesizer.config)
    monkeypatch.setattr(speech, "generate", functools.partial(speech.generate, duration_scale=30.0))
    capped = [len(m) for m in sentences.synthesize(synthesizer.network)]
    with monkeypatch.context() as patch:
        patch.setattr(speech, "LENGTH_CAP", 1e6)
        uncapped = [len(m) for m in sentences.synthesize(synthesizer.network)]
    caps = [math.ceil(speech.LENGTH_CAP * n) for n in sentences.recorded_frames]
    assert min(n / r for n, r in zip(uncapped, sentences.recorded_frames)) > speech.LENGTH_CAP  # the cap binds
    assert capped == caps
    # ... and the log says so where it gives the ratio.
    ratio = float(np.median([n / r for n, r in zip(capped, sentences.recorded_frames)]))
    assert "the cap" in speech.cap_note(ratio) and speech.cap_note(1.0) == ""
