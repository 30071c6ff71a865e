"""utilities/train_vocoder.py on bad input: a clear error naming the key, folder or file, exit 2,
no traceback (as train_main.py)."""

import shutil

import pytest

from utilities import train_vocoder


def run(capsys, *argv) -> tuple[int, str]:
    code = train_vocoder.main([*argv, "--size", "tiny", "--steps", "2", "--batch-size", "4", "--quality-clips", "0"])
    return code, capsys.readouterr().err


def test_an_unknown_config_key_is_named(demo_corpus, tmp_path, capsys):
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "v"),
                    "--set", "data.sample_rte=16000")
    assert code == 2 and "data.sample_rte" in err and "Traceback" not in err, err


def test_a_missing_vocoder_to_start_from_is_named(demo_corpus, tmp_path, capsys):
    missing = tmp_path / "no_such_vocoder"
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "v"),
                    "--init-from", str(missing))
    assert code == 2 and f"{missing} is not a vocoder folder" in err, err


def test_a_corrupt_clip_is_named(demo_corpus, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    shutil.copytree(demo_corpus, corpus)
    for wav in (corpus / "wavs").glob("*.wav"):  # every clip: whichever the first batch reads
        wav.write_bytes(b"this is not audio " * 64)
    code, err = run(capsys, "--train-data", str(corpus), "--output-dir", str(tmp_path / "v"))
    assert code == 2 and "not a WAV file" in err and str(corpus / "wavs") in err, err


def test_a_phase_prior_other_than_the_vocoder_started_from_is_refused(demo_corpus, tmp_path, capsys):
    from conftest import make_vocoder_folder, tiny_config

    start = tmp_path / "start"
    make_vocoder_folder(tiny_config(demo_corpus).data, start)  # phase prior "none"
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "v"),
                    "--init-from", str(start), "--phase-prior", "griffin-lim")
    assert code == 2 and f"--init-from {start} was trained with 'none'" in err and "Traceback" not in err, err


def test_a_run_without_a_checkpoint_gets_its_vocoder_and_is_told_why_no_sample_is_spoken(trained_run, tmp_path, capsys):
    # It used to train the vocoder, then stop on a traceback where the run's demo sample is spoken.
    run_folder = tmp_path / "run"
    shutil.copytree(trained_run, run_folder, ignore=shutil.ignore_patterns("checkpoints", "demo_sample*.wav"))
    code = train_vocoder.main(["--run", str(run_folder), "--size", "tiny", "--steps", "2", "--batch-size", "4",
                               "--quality-clips", "0", "--phase-prior", "none"])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    assert f"{run_folder} has no checkpoint yet" in out and "synthesize.py --checkpoint" in out, out
    assert (run_folder / "vocoder" / "vocoder.json").is_file() and not list(run_folder.glob("demo_sample*.wav"))


def test_the_vocoder_benchmark_names_a_folder_that_holds_no_vocoder(tmp_path, capsys):
    # It ended in load_vocoder's FileNotFoundError traceback.
    from utilities import benchmark_vocoder

    assert benchmark_vocoder.main(["--vocoder", str(tmp_path), "--repeats", "1"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path} is not a vocoder folder (no vocoder.json); pass the "
                                               "--output-dir of utilities/train_vocoder.py, or griffin-lim")


def test_a_folder_holding_a_trained_vocoder_is_not_trained_over(demo_corpus, tmp_path, capsys):
    # The same command run twice (the README's second command, say) trained again from scratch and
    # replaced the finished vocoder at the end.
    from conftest import make_vocoder_folder, tiny_config

    out = tmp_path / "vocoder"
    make_vocoder_folder(tiny_config(demo_corpus).data, out)
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(out))
    assert code == 2 and f"{out} already holds a trained vocoder" in err and f"--init-from {out}" in err, err
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    # Continued in place, as the refusal says: replaced by its continuation once that is saved.
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(out), "--init-from", str(out))
    after = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    assert code == 0 and after.keys() == before.keys(), (err, after.keys())
    assert after["vocoder.json"] == before["vocoder.json"] and after["vocoder.weights.h5"] != before["vocoder.weights.h5"]


def test_a_second_training_in_the_vocoder_folder_is_refused(demo_corpus, tmp_path, capsys):
    import os

    from myxtts.training.run_lock import run_folder_lock

    out = tmp_path / "vocoder"
    out.mkdir()
    with run_folder_lock(out):  # as a training in another process holds it
        code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(out))
    assert code == 2 and f"{out} is in use by another training (pid {os.getpid()}" in err, err
    assert "train into another --output-dir" in err and sorted(p.name for p in out.iterdir()) == [], err


def test_a_save_that_fails_keeps_the_trained_weights_for_the_same_command_to_save(demo_corpus, tmp_path, capsys,
                                                                                   monkeypatch):
    # Keras' BackupAndRestore deleted the backup as training ended, before the vocoder was saved:
    # a full disk then lost the whole run.
    import errno

    from myxtts.models import vocoder as vocoder_module

    def full_disk(vocoder, folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "vocoder"
    command = ("--train-data", str(demo_corpus), "--output-dir", str(out), "--phase-prior", "none")
    with monkeypatch.context() as patch:
        patch.setattr(vocoder_module, "save_vocoder", full_disk)
        code, err = run(capsys, *command)
    assert code == 2 and f"could not save the vocoder in {out} (No space left on device)" in err, err
    assert f"kept in {out / 'backup'}" in err and (out / "backup" / "latest.weights.h5").is_file(), err
    code = train_vocoder.main([*command, "--size", "tiny", "--steps", "2", "--batch-size", "4", "--quality-clips", "0"])
    printed = capsys.readouterr().out
    assert code == 0 and f"resumed from {out / 'backup'} at update 2 of 2" in printed, printed
    assert (out / "vocoder.json").is_file() and not (out / "backup").exists()


def test_a_save_cut_short_leaves_the_vocoder_that_was_there(demo_corpus, tmp_path):
    from conftest import make_vocoder_folder, tiny_config

    from myxtts.models.vocoder import Vocoder, load_vocoder, save_vocoder

    data = tiny_config(demo_corpus).data
    out = tmp_path / "vocoder"
    make_vocoder_folder(data, out)
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    replacement = Vocoder(data, size="tiny")
    replacement.build()

    def cut_short(path, *args, **kwargs):
        with open(path, "wb") as half:
            half.write(b"\x89HDF\r\n")  # the start of a weights file, and then the disk is full
        raise OSError(28, "No space left on device")

    replacement.save_weights = cut_short
    with pytest.raises(OSError, match="No space left"):
        save_vocoder(replacement, out)
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # nothing left half-written beside it
    load_vocoder(out, data)


def test_ctrl_c_is_a_line_saying_what_is_kept_not_a_traceback(demo_corpus, tmp_path, capsys, monkeypatch):
    """Ctrl-C was KeyboardInterrupt's traceback, whether it came before the first backup or after it."""
    from myxtts.models import vocoder as vocoder_module
    from myxtts.training import vocoder_clips

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def run_interrupted(*argv):
        try:
            return run(capsys, *argv)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C ended train_vocoder.py in a traceback")

    out = tmp_path / "vocoder"
    command = ("--train-data", str(demo_corpus), "--output-dir", str(out))
    with monkeypatch.context() as patch:  # while the clips are prepared: nothing trained
        patch.setattr(vocoder_clips, "recorded_mels", interrupted)
        code, err = run_interrupted(*command)
    assert code == 130 and err.strip() == "interrupted: nothing was trained yet", err
    with monkeypatch.context() as patch:  # once trained, as the vocoder is saved: the backup has it
        patch.setattr(vocoder_module, "save_vocoder", interrupted)
        code, err = run_interrupted(*command, "--phase-prior", "none")
    assert code == 130 and err.strip() == (f"interrupted: {out / 'backup'} keeps the run up to its last backup (every "
                                           "50 updates): the same command continues it"), err
    assert train_vocoder.holds_backup(out / "backup")


def test_a_backup_cut_short_leaves_the_one_before_for_the_restore(tmp_path):
    """Keras' backup is written in place: Ctrl-C or a kill while it wrote left a file that no longer
    loads, and the run could not continue (an OSError as the same command started)."""
    import keras
    import numpy as np

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    x, y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")
    backup = tmp_path / "backup"
    first = model()
    first.fit(x, y, epochs=2, verbose=0, callbacks=[train_vocoder.backup_callback(backup)])
    weights = backup / "latest.weights.h5"
    weights.write_bytes(weights.read_bytes()[:100])  # the second backup, cut short
    second = model()
    epochs = []
    second.fit(x, y, epochs=3, verbose=0, callbacks=[train_vocoder.backup_callback(backup),
                                                     keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, l: epochs.append(e))])
    assert epochs == [1, 2]  # resumed after the first epoch: its backup was kept beside the second


def test_a_vocoder_to_start_from_of_other_features_is_refused_before_the_clips_are_prepared(demo_corpus, tmp_path,
                                                                                             capsys, monkeypatch):
    """It was refused only once every training clip's Griffin-Lim phase had been found (minutes)."""
    from conftest import tiny_config

    from myxtts.models import vocoder as vocoder_module
    from myxtts.training import vocoder_clips

    def prepared(*args, **kwargs):
        raise AssertionError("the clips were prepared before the vocoder to start from was checked")

    start = tmp_path / "start"
    vocoder = vocoder_module.Vocoder(tiny_config(demo_corpus).data, size="tiny", phase_prior="griffin-lim")
    vocoder.build()
    vocoder_module.save_vocoder(vocoder, start)
    monkeypatch.setattr(vocoder_clips, "recorded_mels", prepared)
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "v"),
                    "--init-from", str(start), "--set", "data.fmin=50")
    assert code == 2 and f"{start} was trained on other features" in err and "data.fmin: vocoder 0" in err, err


@pytest.mark.slow
def test_finding_the_griffin_lim_phase_counts_the_clips_in_lines_a_log_keeps(demo_corpus, tmp_path, capsys):
    """Minutes for a real corpus (0.2 s a clip on 2 cores): its progress was one line redrawn with \\r
    for every clip, which a log file holds as a single line of thousands of entries."""
    code, err = run(capsys, "--train-data", str(demo_corpus), "--output-dir", str(tmp_path / "v"))
    clips = int(err.split("Griffin-Lim's phase of the training clips: ")[-1].split("/")[0]) if code == 0 else 0
    assert code == 0 and clips > 0 and f"Griffin-Lim's phase of the training clips: {clips}/{clips} clips" in err, err
    assert "\r" not in err, err  # myxtts/progress.py redraws in place only on a terminal
    # The pass that holds every training clip and its log-mel before that (minutes for a real corpus).
    from myxtts.config import load_config
    from myxtts.data.splits import load_splits

    config = load_config(train_vocoder.ROOT / "configs" / "demo.yaml", overrides=[f"data.train_data={demo_corpus}"])
    rows = len(load_splits(config)[0])
    assert f"the training clips' log-mels: {rows}/{rows} clips" in err, err
