"""The command line: every flag reaches the config; bad input fails with a message, not a traceback."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import train_main

ROOT = Path(__file__).resolve().parents[1]


def test_every_flag_sets_its_config_key():
    args = train_main.parse_args([
        "--train-data", "/d/train", "--val-data", "/d/val", "--batch-size", "8", "--grad-accum", "3",
        "--num-workers", "2", "--lr", "0.5", "--model-size", "tiny", "--optimization-level", "basic",
        "--optimizer", "prodigy", "--precision", "bf16", "--max-steps", "77", "--set", "data.n_mels=64",
        "--init-from", "runs/base",
    ])
    config, _ = train_main.build_config(args)
    d, t = config.data, config.training
    assert (d.train_data, d.val_data, d.batch_size, d.num_workers, d.n_mels) == ("/d/train", "/d/val", 8, 2, 64)
    assert (t.gradient_accumulation_steps, t.learning_rate, t.optimizer, t.precision, t.max_steps) == (3, 0.5, "prodigy", "bf16", 77)
    assert (config.model.size, t.optimization_level, t.enable_xla_compilation) == ("tiny", "basic", False)
    assert t.init_from == "runs/base"


@pytest.mark.parametrize("path", ["my corpus #2", "2024", "on", "~", "@home/corpus", "[v2]/manifest.jsonl", "*x", "a: b",
                                  'say "hi"', "ünïcode/é"])
def test_a_path_flag_is_taken_as_the_path_it_names(path):
    """The path flags were read as YAML: `#2` was cut off as a comment, `2024` was a number ("--set:
    data.train_data must be a string", though no --set was given), `@`, `[v2]` and `*x` tracebacks."""
    args = train_main.parse_args(["--train-data", path, "--val-data", path, "--init-from", path])
    config, _ = train_main.build_config(args)
    assert (config.data.train_data, config.data.val_data, config.training.init_from) == (path, path, path)


def test_eager_debug_and_demo_flags():
    config, path = train_main.build_config(train_main.parse_args(["--enable-eager-debug", "--demo"]))
    assert config.training.enable_graph_mode is False and config.training.enable_xla_compilation is False
    assert Path(path).name == "demo.yaml" and config.data.train_data == str(train_main.DEMO_CORPUS)
    args = train_main.parse_args(["--checkpoint-dir", "/runs/x", "--epochs", "2.5", "--resume"])
    assert (args.output_dir, args.epochs, args.resume) == ("/runs/x", 2.5, True)
    with pytest.raises(SystemExit):
        train_main.parse_args(["--resume", "--reset-training"])  # contradictory


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "data.batch_sise=4"], "did you mean 'data.batch_size'"),
        (["--train-data", "/nonexistent/corpus", "--max-steps", "1"], "/nonexistent/corpus"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "train_main.py"), "--output-dir", str(tmp_path), *argv],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert tmp_path.is_dir()  # a folder that was there before stays
    # A mistyped path fails before the hardware plan's probes (the CPU precision probe takes a minute).
    assert "precision: timing" not in done.stdout + done.stderr


def test_a_bad_row_fails_before_the_probes(demo_corpus, tmp_path):
    # An empty transcript was reported only after the hardware plan's probes (minutes on a first run).
    rows = [json.loads(line) for line in (demo_corpus / "manifest.jsonl").read_text().splitlines()[:8]]
    for row in rows:
        row["audio_path"] = str(demo_corpus / row["audio_path"])
    rows[2]["text"] = ""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run([sys.executable, str(ROOT / "train_main.py"), "--train-data", str(corpus),
                           "--output-dir", str(tmp_path / "run"), "--max-steps", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "line 3: key 'text' is empty" in done.stderr and "Traceback" not in done.stderr
    assert "precision:" not in done.stdout + done.stderr  # the CPU precision probe never started, cached or not
    assert not (tmp_path / "run").exists()  # the folder the run made is not left behind, empty


def _binary_file(folder):
    path = folder / "model.ckpt"
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.mark.parametrize(
    "argv, message",
    [
        (lambda tmp: ["--config", str(tmp)], "is a folder, not a config file"),
        (lambda tmp: ["--config", str(_binary_file(tmp))], "is not a text file (not UTF-8), so not a config"),
        (lambda tmp: ["--set", "seed=-1"], "seed must be in 0..4294967295, got -1"),
        (lambda tmp: ["--set", f"seed={2**32}"], "seed must be in 0..4294967295"),
    ],
    ids=["folder_config", "binary_config", "negative_seed", "seed_too_large"],
)
def test_a_config_that_cannot_be_used_is_one_line_naming_it_and_leaves_no_run_folder(argv, message, demo_corpus,
                                                                                     tmp_path, capsys):
    """A folder or binary --config was a traceback; seed=-1 named no key and left a run folder behind."""
    run = tmp_path / "run"
    assert train_main.main([*argv(tmp_path), "--train-data", str(demo_corpus), "--output-dir", str(run),
                            "--model-size", "tiny", "--max-steps", "1"]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error, error
    assert not run.exists()


@pytest.mark.parametrize("epochs", ["0", "-1", "nan", "inf"])
def test_epochs_must_be_a_positive_number(epochs, capsys):
    """--epochs 0 trained one update."""
    with pytest.raises(SystemExit) as exited:
        train_main.parse_args(["--epochs", epochs])
    assert exited.value.code == 2
    assert "argument --epochs: must be a positive number of passes over the training set" in capsys.readouterr().err
    assert train_main.parse_args(["--epochs", "0.5"]).epochs == 0.5


def test_an_output_dir_that_is_a_file_is_named_and_left_alone(demo_corpus, tmp_path, capsys):
    # It was a FileExistsError traceback from mkdir.
    a_file = tmp_path / "run.txt"
    a_file.write_text("my notes")
    assert train_main.main(["--train-data", str(demo_corpus), "--output-dir", str(a_file), "--model-size", "tiny",
                            "--max-steps", "1", "--batch-size", "4", "--optimization-level", "basic"]) == 2
    error = capsys.readouterr().err
    assert f"the run folder (--output-dir) {a_file} is a file, not a folder" in error and "Traceback" not in error, error
    assert a_file.read_text() == "my notes"
    under = a_file / "run"  # its folder cannot be made: was a NotADirectoryError traceback
    assert train_main.main(["--train-data", str(demo_corpus), "--output-dir", str(under), "--max-steps", "1"]) == 2
    assert f"{a_file} is a file, so the folder cannot be made" in capsys.readouterr().err


def test_a_hand_written_config_in_the_output_dir_is_not_replaced(demo_corpus, tmp_path, capsys):
    """Training saves its resolved config as <run>/config.yaml; a file of the user's there was overwritten."""
    from myxtts.config import load_config, save_config
    from myxtts.training.hand_written_config import check_run_folder_config

    run = tmp_path / "run"
    run.mkdir()
    mine = "# my settings for the small corpus\nmodel:\n  size: tiny\ntraining:\n  max_steps: 1\n"
    (run / "config.yaml").write_text(mine)
    for extra in ([], ["--config", str(run / "config.yaml")]):
        # (Flags for one quick update: without the check, this trained and replaced the file.)
        assert train_main.main(["--train-data", str(demo_corpus), "--output-dir", str(run), "--model-size", "tiny",
                                "--max-steps", "1", "--batch-size", "4", "--optimization-level", "basic",
                                "--set", "training.eval_interval=1", *extra]) == 2
        error = capsys.readouterr().err
        assert f"{run / 'config.yaml'} was not written by a training run" in error and "--config" in error, error
        assert (run / "config.yaml").read_text() == mine and sorted(p.name for p in run.iterdir()) == ["config.yaml"]

    # What training saves is its own, with or without vocab.txt beside it (--reset-training removes that).
    save_config(load_config(overrides=["model.size=tiny"]), run / "config.yaml")
    check_run_folder_config(run)
    (run / "config.yaml").write_text(mine)
    (run / "vocab.txt").write_text("<pad>\n<unk>\na\n")
    check_run_folder_config(run)  # a run's folder: its config.yaml is the run's (edited or not)


def test_a_stopped_demo_says_how_to_hear_its_checkpoint_instead_of_speaking_the_sample(tmp_path, monkeypatch, capsys):
    """Speaking the sample after Ctrl-C or SIGTERM kept a stopped demo alive ~45 s on 2 cores (a
    scheduler's grace period is often 30 s); a finished one still speaks it."""
    from types import SimpleNamespace

    import myxtts.synthesis

    spoken = []

    def validation_sample(workdir, out):
        spoken.append(out)
        return {"out": out, "audio_seconds": 2.5, "recording_seconds": 2.9, "text": "Hi.", "speaker": "s",
                "reference": "r.wav", "dropped": []}

    monkeypatch.setattr(myxtts.synthesis, "validation_sample", validation_sample)
    train_main.speak_demo_sample(tmp_path, SimpleNamespace(interrupted_by="SIGTERM"))
    told = capsys.readouterr().err
    assert spoken == [] and "no demo sample after SIGTERM" in told and f"--checkpoint {tmp_path}" in told
    train_main.speak_demo_sample(tmp_path, SimpleNamespace(interrupted_by=None))
    assert spoken == [tmp_path / "demo_sample.wav"] and "listen: " in capsys.readouterr().err


def test_a_finished_demo_says_it_is_speaking_its_sample_before_the_silent_seconds(tmp_path, monkeypatch, capsys):
    """After "finished at step N" the sample took ~45 s on 2 cores with nothing said."""
    from types import SimpleNamespace

    import myxtts.synthesis

    def validation_sample(workdir, out):
        print("(speaking)", file=sys.stderr)
        return {"out": out, "audio_seconds": 2.5, "recording_seconds": 2.9, "text": "Hi.", "speaker": "s",
                "reference": "r.wav", "dropped": []}

    monkeypatch.setattr(myxtts.synthesis, "validation_sample", validation_sample)
    train_main.speak_demo_sample(tmp_path, SimpleNamespace(interrupted_by=None))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"speaking a held-out sentence into {tmp_path / 'demo_sample.wav'}") and lines[1] == "(speaking)"


def test_a_clip_that_is_not_a_wav_is_named_in_one_line(demo_corpus, tmp_path, capsys):
    # The pipeline's own check names the file; train_main prints that line alone, exit 2.
    corpus = tmp_path / "corpus"
    shutil.copytree(demo_corpus, corpus)
    for wav in (corpus / "wavs").glob("*.wav"):  # every clip: whichever the first batch reads
        wav.write_text("a text file, not audio")
    assert train_main.main(["--train-data", str(corpus), "--output-dir", str(tmp_path / "run"), "--model-size", "tiny",
                            "--max-steps", "1", "--batch-size", "4", "--optimization-level", "basic"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: not a WAV file (no RIFF/WAVE header): {corpus / 'wavs'}") and \
        last.endswith("- check or convert the corpus with utilities/prepare_dataset.py"), last


@pytest.mark.parametrize("argv, message", [
    (["--resume"], "--resume: no checkpoint to resume in"),
    (["--init-from", "/nonexistent/run"], "training.init_from (--init-from): no checkpoint found at /nonexistent/run"),
    (["--set", "training.vocoder=/nonexistent/vocoder"], "training.vocoder: /nonexistent/vocoder is not a vocoder folder "
     "(no vocoder.json); pass the --output-dir of utilities/train_vocoder.py, or \"\" for Griffin-Lim"),
    (["--set", "data.unseen_voices_data=/nonexistent/voices"],
     "data.unseen_voices_data: dataset path /nonexistent/voices does not exist"),
], ids=["resume", "init_from", "vocoder", "unseen_voices"])
def test_a_checkpoint_vocoder_or_corpus_that_is_not_there_is_named_before_the_probes(argv, message, demo_corpus,
                                                                                     tmp_path, capsys):
    # Each was named only after the hardware plan's probes (the CPU precision probe: up to a minute); a
    # missing training.vocoder or data.unseen_voices_data also left the run folder with config.yaml, logs
    # and vocab.txt behind, and the latter's error named no key.
    assert train_main.main(["--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
                            *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err.strip().splitlines()[-1], captured.err
    assert "precision:" not in captured.out + captured.err  # the probe never started, cached or not
    assert not (tmp_path / "run").exists()


def test_a_batch_size_above_the_training_clips_is_named_before_the_probes(demo_corpus, tmp_path, capsys):
    # 22 training clips and --batch-size 32: said only after the CPU precision probe had timed batches of 32.
    assert train_main.main(["--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
                            "--model-size", "tiny", "--batch-size", "32"]) == 2
    captured = capsys.readouterr()
    assert "error: the 22 training clips do not fill one batch of 32" in captured.err.strip().splitlines()[-1], captured.err
    assert "precision:" not in captured.out + captured.err  # the probe never started, cached or not
    assert not (tmp_path / "run").exists()


def test_ctrl_c_outside_the_training_loop_is_a_line_saying_what_is_kept(demo_corpus, tmp_path, monkeypatch, capsys):
    """Ctrl-C while the corpus was read, the hardware probed or the step traced (and after training,
    while it measured and spoke the sample) was KeyboardInterrupt's traceback."""
    import myxtts.training.trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(myxtts.training.trainer, "train", interrupted)
    run = tmp_path / "run"
    argv = ["--train-data", str(demo_corpus), "--output-dir", str(run)]
    try:
        code = train_main.main(argv)
        assert code == 130 and capsys.readouterr().err.strip() == "interrupted: nothing was trained yet"
        (run / "checkpoints" / "latest").mkdir(parents=True)
        (run / "checkpoints" / "latest" / "ckpt-40.index").write_bytes(b"")
        code = train_main.main(argv)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended train_main.py in a traceback")
    assert code == 130 and capsys.readouterr().err.strip() == (
        f"interrupted: the checkpoints in {run / 'checkpoints'} are kept: the same command continues from the latest")
