"""The commands the project tells people to run take the options they are given.

* `utilities/gpu_measure.sh` runs only on a lent GPU, for minutes that cannot be had again: an
  option renamed in a tool and not in the script would cost a GPU session its part.
* The README's commands are what a new user copies first.

Each command's options are checked here against the tool's own --help (which starts no TensorFlow),
its `--set` values against the config (`load_config` refuses an unknown key or a bad value), and the
configs it names must be the repository's.
"""

import re
import subprocess
import sys
from pathlib import Path

from myxtts.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GPU_SCRIPT = ROOT / "utilities" / "gpu_measure.sh"
README = ROOT / "README.md"
# `python3 utilities/x.py ...`, `.venv/bin/python train_main.py ...`, `python3 -m package.module ...`
# (held in a shell variable too: probe="python3 -m ...")
COMMAND = re.compile(r"python3? (-m [\w.]+|[\w/]+\.py)([^>|;&]*)")


def invocations(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(tool, its --options, its --set values) for each python command in shell `text`."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0]
        for tool, rest in COMMAND.findall(line):
            words = [w.strip("\"'[]") for w in rest.split()]
            options = [w.split("=", 1)[0] for w in words if w.startswith("--")]
            sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
            found.append((tool, options, sets))
    return found


def bash_blocks(markdown: str) -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", markdown, flags=re.S))


def test_the_parser_finds_what_a_line_asks():
    assert invocations('timeout 9 python3 utilities/a.py --x 1 --flag \\\n  --y=2 > "$out/f" 2>&1 # --not') == [
        ("utilities/a.py", ["--x", "--flag", "--y"], [])]
    assert invocations('probe="python3 -m m.n --batch-size 16 --xla"') == [("-m m.n", ["--batch-size", "--xla"], [])]
    assert invocations(".venv/bin/python t.py --set a.b=1 [--json r.json]   # a note") == [
        ("t.py", ["--set", "--json"], ["a.b=1"])]
    assert bash_blocks("x\n```bash\nrun 1\n```\ny\n```\nnot\n```\n") == "run 1\n"


def check_commands(found, text):
    for config in re.findall(r"--config (\S+)", text):  # the configs named are the repository's own
        assert (ROOT / config).is_file(), config
    helps = {}
    for tool in sorted({tool for tool, _, _ in found}):
        command = [sys.executable, *tool.split()] if tool.startswith("-m ") else [sys.executable, str(ROOT / tool)]
        done = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (tool, done.stderr[-2000:])
        helps[tool] = done.stdout
    for tool, options, sets in found:
        for option in options:
            assert re.search(rf"{re.escape(option)}(?![\w-])", helps[tool]), f"{tool} has no {option}"
        load_config(overrides=sets)  # raises on a key or value the config does not know


def test_every_command_of_the_gpu_script_takes_its_options():
    text = GPU_SCRIPT.read_text(encoding="utf-8")
    found = invocations(text)
    tools = {tool for tool, _, _ in found}
    assert {"train_main.py", "utilities/train_vocoder.py", "utilities/diagnose_gpu_bottleneck.py"} <= tools, tools
    check_commands(found, text)
    # The `demo` part adds its XLA setting through an array: those keys are config keys too.
    for value in re.findall(r"--set (training\.[a-z_]+=\w+)", text):
        load_config(overrides=[value])


def test_every_command_of_the_readme_takes_its_options():
    text = bash_blocks(README.read_text(encoding="utf-8"))
    found = invocations(text)
    tools = {tool for tool, _, _ in found}
    assert {"train_main.py", "utilities/synthesize.py", "utilities/export_model.py"} <= tools, tools
    check_commands(found, text)


def test_the_pause_synthesize_help_states_is_the_one_it_makes():
    # --help starts no TensorFlow, so it states the pause between sentences as a literal.
    from myxtts.synthesis import SENTENCE_PAUSE_S

    done = subprocess.run([sys.executable, str(ROOT / "utilities" / "synthesize.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    stated = re.search(r"([\d.]+) s\s+apart", done.stdout)
    assert stated and float(stated.group(1)) == SENTENCE_PAUSE_S, done.stdout
