"""Export (myxtts/export.py, utilities/export_model.py): the SavedModel and the TFLite model of a
trained tiny run speak as utilities/synthesize.py does, loaded in a process that never imports myxtts."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from myxtts.data.phonemes import model_text
from myxtts.synthesis import Synthesizer
from utilities import export_model

TEXT = "Hello there."

# The client a user would write: TensorFlow only. It prints the modules it ended up importing.
CLIENT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    out, wav, phonemes, tflite = sys.argv[1:5]
    model = tf.saved_model.load(out)
    reference = model.reference_mel(tf.io.read_file(wav))
    tokens = model.tokenize(tf.constant(phonemes))["tokens"]
    spoken = model.synthesize(tokens=tokens, reference_mel=reference["mel"][None],
                              reference_length=reference["length"][None], max_frames=tf.constant(2000))
    result = {"tokens": tokens.numpy(), "saved_audio": spoken["audio"].numpy(), "saved_mel": spoken["mel"].numpy()}
    if tflite == "1":
        lite = tf.lite.Interpreter(model_path=out + "/model.tflite")
        inputs = {"tokens": tokens.numpy(), "reference_mel": reference["mel"].numpy()[None],
                  "reference_length": reference["length"].numpy()[None], "max_frames": np.array(2000, np.int32)}
        for detail in lite.get_input_details():
            lite.resize_tensor_input(detail["index"], inputs[detail["name"]].shape)
        lite.allocate_tensors()
        for detail in lite.get_input_details():
            lite.set_tensor(detail["index"], inputs[detail["name"]])
        lite.invoke()
        audio, mel = (lite.get_tensor(detail["index"]) for detail in lite.get_output_details())
        result.update(lite_audio=audio, lite_mel=mel)
    np.savez(out + "/client.npz", **result)
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "myxtts")))
""")


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    """The session's trained tiny run, exported with its TFLite model."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("export")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert export_model.main(["--run", str(trained_run), "--out", str(root / "exported"), "--tflite"]) == 0
    (root / "export.log").write_text(printed.getvalue(), encoding="utf-8")  # beside the export, not in it
    return trained_run, root / "exported"


def test_the_export_says_which_stage_it_is_in(exported):
    """Tracing, writing and converting took ~30 s for the base model on a CPU with nothing printed."""
    lines = (exported[1].parent / "export.log").read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["export 1/2: tracing the endpoints and writing the SavedModel", "export 2/2: converting to TFLite"]
    assert lines[2].startswith(f"wrote the SavedModel {exported[1]}") and lines[3].startswith("wrote "), lines


def test_the_exported_models_speak_as_synthesize_does_without_myxtts(exported, demo_corpus):
    run, out = exported
    reference = str(sorted((demo_corpus / "wavs").glob("*.wav"))[0])
    synthesizer = Synthesizer.from_run(run)
    d = synthesizer.config.data
    audio, mel = synthesizer.synthesize(TEXT, [reference])
    phonemes = model_text(TEXT, d.text_frontend, d.language)

    completed = subprocess.run([sys.executable, "-c", CLIENT, str(out), reference, phonemes, "1"],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == []  # the client never imported myxtts
    client = np.load(out / "client.npz")

    assert client["tokens"].tolist() == synthesizer.vocabulary.encode(phonemes, d.text_frontend)
    # The SavedModel runs the same operations as synthesize.py, in one optimized graph instead of
    # eagerly: equal up to float32 rounding, which Griffin-Lim's 32 iterations carry into the phase
    # (measured: mel within 1e-5, audio within 1.5e-4 per sample at peaks near 0.5). Stated tolerance:
    # the mels to 1e-4, the waveforms to 60 dB signal-to-difference.
    np.testing.assert_allclose(client["saved_mel"], mel.numpy(), atol=1e-4)
    assert client["saved_audio"].shape == audio.numpy().shape
    assert _snr_db(client["saved_audio"], audio.numpy()) >= 60.0
    # TFLite runs Griffin-Lim as DFT matrix products instead of FFTs (export_tflite.py): another
    # order of the same float32 sums, whose rounding 32 iterations carry into the phase. Stated
    # tolerance: the waveforms agree to 60 dB signal-to-difference (measured: 87.5 dB on this run),
    # the mels to 1e-4 (measured: 6e-6).
    np.testing.assert_allclose(client["lite_mel"], mel.numpy(), atol=1e-4)
    assert client["lite_audio"].shape == audio.numpy().shape
    assert _snr_db(client["lite_audio"], audio.numpy()) >= 60.0


def _snr_db(audio, reference) -> float:
    """Signal-to-difference ratio of `audio` against `reference`, in dB."""
    difference = np.sum((audio - reference) ** 2) / np.sum(reference ** 2)
    return float(10 * np.log10(1.0 / max(difference, 1e-30)))


def test_the_assets_hold_the_vocabulary_and_audio_settings(exported):
    run, out = exported
    assert (out / "assets" / "vocab.txt").read_text(encoding="utf-8") == (run / "vocab.txt").read_text(encoding="utf-8")
    settings = json.loads((out / "assets" / "settings.json").read_text())
    assert settings["sample_rate"] == 22050 and settings["n_mels"] == 80 and settings["text_frontend"] == "phonemes"


def test_the_saved_model_reads_a_reference_at_another_rate_as_the_pipeline_does(exported, demo_corpus, tmp_path):
    # A user's reference is rarely at the model's rate: the SavedModel resamples it in its own graph.
    import soundfile
    import soxr
    import tensorflow as tf

    from myxtts.data.clip_features import reference_log_mel

    run, out = exported
    d = Synthesizer.from_run(run).config.data
    samples, rate = soundfile.read(sorted((demo_corpus / "wavs").glob("*.wav"))[0], dtype="float32")
    path = tmp_path / "reference_16k.wav"
    soundfile.write(path, soxr.resample(samples, rate, 16000), 16000, subtype="PCM_16")
    reference = tf.saved_model.load(str(out)).reference_mel(tf.io.read_file(str(path)))
    mel, length = reference_log_mel(str(path), d)
    assert int(reference["length"]) == int(length) > 0
    np.testing.assert_allclose(reference["mel"].numpy(), mel.numpy(), atol=1e-4)


def test_export_of_a_folder_that_is_not_a_run_is_a_clear_error(tmp_path, capsys):
    assert export_model.main(["--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    assert "not a MyXTTS run folder" in capsys.readouterr().err


def _contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", ["run", "parent", "corpus", "export_with_notes", "file"])
def test_export_refuses_a_folder_that_is_not_an_earlier_export_and_leaves_it_as_it_was(trained_run, tmp_path, capsys,
                                                                                      target):
    """--out once deleted whatever it named (the run's checkpoints, a corpus) and exited 0."""
    run = tmp_path / "runs" / "demo"
    shutil.copytree(trained_run, run)
    corpus = tmp_path / "corpus"
    (corpus / "wavs").mkdir(parents=True)
    (corpus / "wavs" / "a.wav").write_bytes(b"RIFF")
    (corpus / "notes.txt").write_text("my notes")
    export_with_notes = tmp_path / "exported"
    (export_with_notes / "assets").mkdir(parents=True)
    (export_with_notes / "saved_model.pb").write_bytes(b"graph")
    (export_with_notes / "assets" / "settings.json").write_text(json.dumps({"sample_rate": 22050, "n_mels": 80,
                                                                            "text_frontend": "phonemes"}))
    (export_with_notes / "listening_notes.txt").write_text("sample 3 clicks")
    (tmp_path / "file").write_text("a file")
    out = {"run": run, "parent": tmp_path / "runs", "corpus": corpus, "export_with_notes": export_with_notes,
           "file": tmp_path / "file"}[target]
    before = _contents(tmp_path)

    assert export_model.main(["--run", str(run), "--out", str(out)]) == 2

    error = capsys.readouterr().err
    assert f"--out {out}" in error, error
    if target in ("run", "parent"):
        assert "run folder" in error
    if target in ("corpus", "export_with_notes"):
        assert ("notes.txt" if target == "corpus" else "listening_notes.txt") in error and "nothing was written" in error
    assert _contents(tmp_path) == before  # nothing deleted, nothing added
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "exported", "file", "runs"]  # no staging left


def test_an_earlier_export_is_recognized_and_replaced_only_when_the_new_one_is_complete(exported, tmp_path):
    from myxtts.export_folder import is_earlier_export, staged

    earlier = tmp_path / "earlier"
    shutil.copytree(exported[1], earlier)
    (earlier / "client.npz").unlink(missing_ok=True)  # the first test's client output, not an export's file
    assert is_earlier_export(earlier)  # the layout a real export writes
    before = _contents(earlier)

    with pytest.raises(OSError, match="disk full"):  # a failure half-way: the earlier export stays whole
        with staged(earlier) as folder:
            folder.mkdir()
            (folder / "saved_model.pb").write_bytes(b"half")
            raise OSError("disk full")
    assert _contents(earlier) == before and sorted(p.name for p in tmp_path.iterdir()) == ["earlier"]

    with staged(earlier) as folder:
        folder.mkdir()
        (folder / "saved_model.pb").write_bytes(b"new")
    assert _contents(earlier) == {"saved_model.pb": b"new"} and sorted(p.name for p in tmp_path.iterdir()) == ["earlier"]


def test_a_full_disk_is_said_to_be_one_and_the_earlier_export_stays(exported, tmp_path, monkeypatch, capsys):
    """TensorFlow reports a full disk as RESOURCE_EXHAUSTED, the status of out of memory: the export
    ended in that traceback."""
    import tensorflow as tf

    from myxtts import export
    from myxtts.export_folder import staged

    earlier = tmp_path / "earlier"
    shutil.copytree(exported[1], earlier)
    before = _contents(earlier)

    def export_run(run_dir, out_dir, checkpoint=None, tflite=False, vocoder=None):  # as SaveV2 fails half-way
        with staged(out_dir) as folder:
            folder.mkdir()
            (folder / "saved_model.pb").write_bytes(b"half")
            raise tf.errors.ResourceExhaustedError(None, None, f"{folder}/variables/variables_temp/part-00000-of-00001"
                                                   ".data-00000-of-00001.tempstate1; No space left on device")

    monkeypatch.setattr(export, "export_run", export_run)
    assert export_model.main(["--run", str(exported[0]), "--out", str(earlier)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: the disk is full: writing the export to {earlier} failed (") and "\n" not in error
    assert "No space left on device" in error and "an earlier export there is kept" in error
    assert _contents(earlier) == before and sorted(p.name for p in tmp_path.iterdir()) == ["earlier"]


def test_the_saved_model_checks_its_inputs_and_names_the_rule(exported):
    """Empty or out-of-range ids gave a bare GatherV2 error, and id -1 gave audio."""
    import tensorflow as tf

    from myxtts.export import MAX_TOKENS

    run, out = exported
    model = tf.saved_model.load(str(out))
    vocabulary_size = len((run / "vocab.txt").read_text(encoding="utf-8").split("\n")) - 1
    assert json.loads((out / "assets" / "settings.json").read_text())["max_tokens"] == MAX_TOKENS
    mel = tf.zeros([1, 40, 80])

    def speak(tokens, reference_mel=mel, reference_length=(40,), max_frames=200):
        return model.synthesize(tokens=tf.constant(tokens, tf.int32), reference_mel=reference_mel,
                                reference_length=tf.constant(reference_length, tf.int32),
                                max_frames=tf.constant(max_frames))

    assert speak([2, 3, 4])["mel"].shape[1] == 80  # a good sentence still speaks
    rule = f"tokens must be 1 to {MAX_TOKENS} ids from 2 to {vocabulary_size - 1}"
    for tokens, message in (([], "got none"), ([2, -1, 3], rule), ([2, vocabulary_size], rule),
                            ([2, 1, 3], "1 is <unk>"), ([2] * (MAX_TOKENS + 1), "split the text into sentences")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message) as raised:
            speak(tokens)
        assert "GatherV2" not in str(raised.value).splitlines()[0], tokens
    for kwargs, message in ((dict(reference_length=(40, 40)), "one length per reference_mel clip"),
                            (dict(reference_length=(41,)), "longer than the frames of reference_mel"),
                            (dict(reference_mel=tf.zeros([0, 40, 80]), reference_length=()), "holds no clip"),
                            (dict(max_frames=0), "max_frames must be at least 1")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            speak([2, 3], **kwargs)


@pytest.mark.slow
def test_the_exported_models_speak_through_the_neural_vocoder(trained_run, demo_corpus, tmp_path):
    """With a vocoder (issue 27), both exports speak through it; TFLite inverts its spectrum with DFT matrices."""
    from myxtts.config import load_run_config
    from conftest import make_vocoder_folder

    vocoder_folder = tmp_path / "vocoder"
    make_vocoder_folder(load_run_config(trained_run / "config.yaml").data, vocoder_folder)
    out = tmp_path / "exported"
    assert export_model.main(["--run", str(trained_run), "--out", str(out), "--tflite", "--vocoder", str(vocoder_folder)]) == 0
    assert json.loads((out / "assets" / "settings.json").read_text())["vocoder"] == "neural"

    reference = str(sorted((demo_corpus / "wavs").glob("*.wav"))[0])
    synthesizer = Synthesizer.from_run(trained_run, vocoder=str(vocoder_folder))
    d = synthesizer.config.data
    audio, mel = synthesizer.synthesize(TEXT, [reference])
    completed = subprocess.run([sys.executable, "-c", CLIENT, str(out), reference, model_text(TEXT, d.text_frontend, d.language),
                                "1"], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    client = np.load(out / "client.npz")
    np.testing.assert_allclose(client["saved_mel"], mel.numpy(), atol=1e-4)
    np.testing.assert_allclose(client["lite_mel"], mel.numpy(), atol=1e-4)
    # No iterations to carry rounding: the same network, one inverse STFT (an FFT here, DFT matrix
    # products in TFLite). Stated tolerance: 60 dB signal-to-difference for both.
    for key in ("saved_audio", "lite_audio"):
        assert client[key].shape == audio.numpy().shape, key
        assert _snr_db(client[key], audio.numpy()) >= 60.0, key
    assert _snr_db(client["lite_audio"], griffin_lim_audio(mel, d)) < 20.0  # not Griffin-Lim's


def griffin_lim_audio(mel, d):
    from myxtts.models.griffin_lim import log_mel_to_audio

    return log_mel_to_audio(mel, d).numpy()
