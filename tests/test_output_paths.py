"""Output paths checked before the work (myxtts/output_paths.py): each of these was a traceback at
the end, after the measuring or training it was to save."""

import pytest

from myxtts.output_paths import file_problem, folder_problem


def test_a_file_to_write_may_be_new_or_old_but_not_a_folder_or_under_a_file(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    assert file_problem(tmp_path / "old.json", "--json") is None
    assert file_problem(tmp_path / "new" / "deeper" / "report.json", "--json") is None  # folders are made
    assert file_problem(tmp_path, "--json") == f"--json {tmp_path} is a folder; give the file to write, e.g. {tmp_path / 'report.json'}"
    assert file_problem(tmp_path / "old.json" / "r.json", "--json") == (
        f"--json {tmp_path / 'old.json' / 'r.json'}: {tmp_path / 'old.json'} is a file, so no folder can hold it; give another path")


def test_a_folder_to_write_into_may_be_new_or_old_but_not_a_file_or_under_one(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert folder_problem(tmp_path, "--out") is None
    assert folder_problem(tmp_path / "new" / "deeper", "--out") is None
    assert folder_problem(tmp_path / "a_file", "--out") == f"--out {tmp_path / 'a_file'} is a file, not a folder; give a folder (it is made if missing)"
    assert "a_file is a file, so the folder cannot be made" in folder_problem(tmp_path / "a_file" / "x" / "y", "--out")


@pytest.mark.parametrize("tool, argv", [
    ("measure_quality", ["--corpus", "corpus", "--json", "{folder}"]),
    ("free_running_check", ["--run", "run", "--json", "{folder}"]),
    ("train_vocoder", ["--train-data", "corpus", "--output-dir", "{file}"]),
    ("export_model", ["--run", "run", "--out", "{file}/export"]),
])
def test_the_tools_refuse_a_bad_output_path_before_their_work(tool, argv, tmp_path, capsys):
    import importlib

    (tmp_path / "a_file").write_text("x")
    argv = [a.format(folder=tmp_path, file=tmp_path / "a_file") for a in argv]
    try:
        code = importlib.import_module(f"utilities.{tool}").main(argv)
    except SystemExit as exited:  # argparse's error
        code = exited.code
    assert code == 2
    error = capsys.readouterr().err
    assert "is a folder; give the file" in error or "a_file is a file" in error, error
