"""Every tool's --help: each flag explained with its default, and an example command to start from."""

import argparse
import importlib

import pytest

TOOLS = ["train_main", "utilities.prepare_dataset", "utilities.make_demo_corpus", "utilities.train_vocoder",
         "utilities.synthesize", "utilities.export_model", "utilities.free_running_check", "utilities.measure_quality",
         "utilities.measure_recordings_wer", "utilities.capacity_plan", "utilities.diagnose_gpu_bottleneck",
         "utilities.data_service", "utilities.make_kokoro_corpus"]


class _Parsed(Exception):
    pass


def parser_of(tool: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `tool` builds, caught as it starts parsing (so no tool does any work)."""
    built = []

    def catch(self, *args, **kwargs):
        built.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    module = importlib.import_module(tool)
    with pytest.raises(_Parsed):
        (module.parse_args if tool == "train_main" else module.main)([])
    return built[0]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_flag_says_what_it_does_and_its_default(tool, monkeypatch):
    parser = parser_of(tool, monkeypatch)
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for each in [parser, *(sub for action in subparsers for sub in action.choices.values())]:
        for action in each._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{tool}: {action.option_strings} has no help"
            unset = action.default is None or action.default is False or action.default == []
            assert unset or "default" in action.help, f"{tool}: {action.option_strings} does not say its default {action.default!r}"


@pytest.mark.parametrize("tool", ["utilities.prepare_dataset", "utilities.measure_recordings_wer"])
def test_the_help_shows_an_example_command(tool, capsys):
    module = importlib.import_module(tool)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert f"python utilities/{tool.split('.')[1]}.py --" in capsys.readouterr().out


def test_train_main_says_the_configs_default_for_each_flag_of_a_key(capsys):
    import train_main
    from myxtts.config import Config

    with pytest.raises(SystemExit):
        train_main.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps lines, also after a hyphen
    defaults = Config()
    assert f"(training.learning_rate, default {defaults.training.learning_rate})" in text
    assert f"(model.size, default {defaults.model.size})" in text
    assert f"(training.max_steps, default {defaults.training.max_steps})" in text
    assert "(training.precision, default from --optimization-level)" in text
