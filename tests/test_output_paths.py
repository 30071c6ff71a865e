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


FOLDER_OR_UNDER_A_FILE = ("is a folder; give the file", "a_file is a file")


@pytest.mark.parametrize("tool, argv, expected", [
    ("measure_quality", ["--corpus", "corpus", "--json", "{folder}"], FOLDER_OR_UNDER_A_FILE),
    ("free_running_check", ["--run", "run", "--json", "{folder}"], FOLDER_OR_UNDER_A_FILE),
    ("train_vocoder", ["--train-data", "corpus", "--output-dir", "{file}"], FOLDER_OR_UNDER_A_FILE),
    ("export_model", ["--run", "run", "--out", "{file}/export"], FOLDER_OR_UNDER_A_FILE),
    # These four wrote their report only after the measuring (27-51 s of it, or minutes), then stopped
    # on IsADirectoryError, or on matplotlib's "Format 'txt' is not supported" before an --apply.
    ("magnitude_or_phase", ["--corpus", "corpus", "--json", "{folder}"], FOLDER_OR_UNDER_A_FILE),
    ("capacity_plan", ["--train-data", "corpus", "--gpu", "H100", "--json", "{folder}"], FOLDER_OR_UNDER_A_FILE),
    ("benchmark_pipeline", ["--corpus", "corpus", "--json-file", "{file}/report.json"], FOLDER_OR_UNDER_A_FILE),
    ("diagnose_gpu_bottleneck", ["--train-data", "corpus", "--json", "{folder}"], FOLDER_OR_UNDER_A_FILE),
    ("diagnose_gpu_bottleneck", ["--train-data", "corpus", "--plot", "{folder}/timeline.txt"], ("matplotlib writes",)),
], ids=lambda value: value if isinstance(value, str) else None)
def test_the_tools_refuse_a_bad_output_path_before_their_work(tool, argv, expected, tmp_path, capsys):
    import importlib

    (tmp_path / "a_file").write_text("x")
    argv = [a.format(folder=tmp_path, file=tmp_path / "a_file") for a in argv]
    try:
        code = importlib.import_module(f"utilities.{tool}").main(argv)
    except SystemExit as exited:  # argparse's error
        code = exited.code
    assert code == 2
    error = capsys.readouterr().err
    assert any(text in error for text in expected), error


def test_every_plot_format_the_diagnosis_accepts_is_one_matplotlib_writes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from utilities.diagnose_gpu_bottleneck import PLOT_FORMATS

    figure = plt.figure()
    try:
        assert {f".{ending}" for ending in figure.canvas.get_supported_filetypes()} >= PLOT_FORMATS
    finally:
        plt.close(figure)
