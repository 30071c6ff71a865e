"""The tools' arguments and inputs: a value that cannot be used is one line naming it, exit 2, before
any work. Each case here ended in a traceback (or hung, or measured something else without a word)."""

import importlib
import json
import shutil

import pytest


def _run(tool, argv, capsys):
    module = importlib.import_module(tool if tool.startswith("myxtts") else f"utilities.{tool}")
    try:
        code = module.main(argv)
    except SystemExit as exited:  # argparse's error
        code = exited.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("tool, argv, message", [
    # --sentences -1 measured one row fewer without a word; -5 was "no held-out sentences" as a traceback.
    ("free_running_check", ["--run", "run", "--sentences", "-1"], "--sentences must be >= 0, got -1"),
    ("free_running_check", ["--run", "run", "--reference-clips", "0"], "--reference-clips must be at least 1, got 0"),
    # --steps 0: ZeroDivisionError after the start-up, its folder left behind; --batch-size 0 never ended.
    ("train_vocoder", ["--train-data", "c", "--output-dir", "v", "--steps", "0"], "--steps must be at least 1, got 0"),
    ("train_vocoder", ["--train-data", "c", "--output-dir", "v", "--batch-size", "0"], "--batch-size must be at least 1"),
    ("train_vocoder", ["--train-data", "c", "--output-dir", "v", "--segment-frames", "0"], "--segment-frames must be"),
    # 8 frames trained nothing (every update non-finite: the loss's 2048-sample STFT had no frame) and saved
    # the random vocoder, exit 0.
    ("train_vocoder", ["--train-data", "{tmp}/no_corpus", "--output-dir", "{tmp}/v", "--segment-frames", "8"],
     "--segment-frames 8: segments of 1792 samples are shorter than the loss's longest STFT window (2048); give at least 9"),
    ("train_vocoder", ["--train-data", "c", "--output-dir", "v", "--learning-rate", "0"], "--learning-rate and"),
    ("train_vocoder", ["--train-data", "c", "--output-dir", "v", "--quality-clips", "-1"], "--quality-clips must be >= 0"),
    ("measure_long_text", ["--run", "run", "--sentences", "0"], "--paragraphs and --sentences must be at least 1"),
    ("myxtts.hardware.__main__", ["--batch-size", "abc"], "argument --batch-size: must be a whole number >= 0"),
    ("myxtts.hardware.__main__", ["--effective-batch-size", "-8"], "argument --effective-batch-size: must be a whole"),
    ("measure_recordings_wer", ["--corpus", "{tmp}/no_corpus"], "does not exist"),
    ("count_step_ops", ["--train-data", "{tmp}/no_corpus"], "does not exist"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_value_a_tool_cannot_use_is_one_line_and_exit_2(tool, argv, message, tmp_path, capsys):
    code, error = _run(tool, [a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and message in error and "Traceback" not in error, error


def test_the_profiler_names_a_corpus_too_small_for_a_batch(demo_corpus, tmp_path, capsys):
    # It ended in NoFullBatch's traceback (a damaged clip: InvalidArgumentError's).
    rows = (demo_corpus / "manifest.jsonl").read_text().splitlines()[:2]
    small = tmp_path / "small"
    small.mkdir()
    (small / "manifest.jsonl").write_text(
        "".join(json.dumps({**json.loads(row), "audio_path": str(demo_corpus / json.loads(row)["audio_path"])}) + "\n"
                for row in rows))
    code, error = _run("gpu_profiler", ["--train-data", str(small), "--batch-size", "16", "--set", "model.size=tiny",
                                        "--steps", "1", "--logdir", str(tmp_path / "trace")], capsys)
    assert code == 2 and error.strip().splitlines()[-1].startswith("error: the 1 training clips do not fill one batch of 16")


def test_the_free_running_check_names_a_corpus_that_changed_since_training(trained_run, tmp_path, capsys):
    # A row added to the run's corpus since it trained, which does not parse: a ManifestError traceback.
    import yaml

    corpus = tmp_path / "corpus"
    shutil.copytree(yaml.safe_load((trained_run / "config.yaml").read_text())["data"]["train_data"], corpus)
    with open(corpus / "manifest.jsonl", "a", encoding="utf-8") as manifest:
        manifest.write('{"audio_path": "wavs/new.wav", "text": \n')
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["train_data"] = str(corpus)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, error = _run("free_running_check", ["--run", str(run), "--vocoder", "griffin-lim"], capsys)
    assert code == 2 and "Traceback" not in error, error
    assert error.strip().splitlines()[-1].startswith(f"error: {corpus / 'manifest.jsonl'}, line "), error


@pytest.mark.parametrize("tool, argv", [
    ("free_running_check", ["--run", "run", "--quality"]),
    ("measure_quality", ["--corpus", "corpus"]),
])
def test_the_quality_measures_name_their_missing_packages_before_any_work(tool, argv, monkeypatch, capsys):
    # They measured everything else first, then stopped on ModuleNotFoundError (the report unwritten).
    from myxtts.evaluation import quality

    monkeypatch.setattr(quality, "missing_packages", lambda: ["pystoi", "speechmos"])
    code, error = _run(tool, argv, capsys)
    assert code == 2 and "needs pystoi, speechmos, not installed here: pip install -r requirements-quality.txt" in error


def test_a_damaged_vocoder_is_named_with_what_to_do(demo_corpus, tmp_path):
    # Export ended in h5py's "Unable to synchronously open file (truncated file ...)", naming no file.
    from conftest import make_vocoder_folder, tiny_config
    from myxtts.models.vocoder import WEIGHTS_FILE, VocoderMismatch, load_vocoder, vocoder_settings

    data = tiny_config(demo_corpus).data
    folder = tmp_path / "vocoder"
    make_vocoder_folder(data, folder)
    weights = folder / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(VocoderMismatch, match=f"{weights} cannot be read as this vocoder's weights .*--vocoder griffin-lim"):
        load_vocoder(folder, data)
    (folder / "vocoder.json").write_text("{ not json")
    with pytest.raises(VocoderMismatch, match="vocoder.json is not a vocoder's settings"):
        vocoder_settings(folder)


def test_a_vocoder_backup_of_other_features_is_not_continued(tmp_path):
    # It resumed 300 updates trained on fmin 0 and saved the vocoder as one of fmin 50.
    from utilities.train_vocoder import check_backup

    backup = tmp_path / "backup"
    settings = {"size": "tiny", "features": {"fmin": 0.0, "n_mels": 80}}
    check_backup(backup, settings)  # recorded beside the backup to come
    (backup / "latest.weights.h5").write_bytes(b"interrupted")
    check_backup(backup, settings)  # the same: continued
    with pytest.raises(ValueError, match=r"other settings \(features: backup .*'fmin': 0.0.*now .*'fmin': 50.0"):
        check_backup(backup, {**settings, "features": {"fmin": 50.0, "n_mels": 80}})
    (backup / "settings.json").write_text('{"size": "tiny"}')  # a backup of an older release: no features recorded
    check_backup(backup, {**settings, "features": {"fmin": 50.0, "n_mels": 80}})


def test_a_vocoder_corpus_too_small_for_a_batch_is_said_to_be(demo_corpus, tmp_path, capsys):
    # With --phase-prior none the stream of empty epochs never yielded: it hung with nothing said.
    small = tmp_path / "small"
    small.mkdir()
    rows = (demo_corpus / "manifest.jsonl").read_text().splitlines()[:6]
    (small / "manifest.jsonl").write_text(
        "".join(json.dumps({**json.loads(row), "audio_path": str(demo_corpus / json.loads(row)["audio_path"])}) + "\n"
                for row in rows))
    code, error = _run("train_vocoder", ["--train-data", str(small), "--output-dir", str(tmp_path / "v"), "--size", "tiny",
                                         "--steps", "2", "--quality-clips", "0", "--phase-prior", "none"], capsys)
    assert code == 2 and "do not fill one batch of 16" in error, error


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "{tmp}/no_corpus"], "does not exist"),  # a traceback, after the service had started
    (["--corpus", "c", "--workers", "0"], "--workers must be at least 1, got 0"),  # waited forever
    (["--corpus", "c", "--epochs", "0"], "--epochs must be at least 1, got 0"),  # "no median for empty data"
])
def test_the_data_service_benchmark_checks_its_corpus_and_counts_first(argv, message, tmp_path, capsys):
    code, error = _run("benchmark_data_service", [a.format(tmp=tmp_path) for a in argv], capsys)
    assert code == 2 and message in error and "Traceback" not in error, error


def test_vocoder_training_on_a_run_s_own_mels_needs_its_checkpoint(trained_run, tmp_path, capsys):
    # --aligned-mels on a run with no checkpoint yet: CheckpointError's traceback after a note saying it would train.
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trained_run / "config.yaml", run / "config.yaml")
    code, error = _run("train_vocoder", ["--run", str(run), "--aligned-mels", "--size", "tiny", "--steps", "2",
                                         "--quality-clips", "0"], capsys)
    assert code == 2 and "Traceback" not in error and error.strip().splitlines()[-1].startswith("error: "), error
