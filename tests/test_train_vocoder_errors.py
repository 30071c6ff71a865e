"""utilities/train_vocoder.py on bad input: a clear error naming the key, folder or file, exit 2,
no traceback (as train_main.py)."""

import shutil

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
