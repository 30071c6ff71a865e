"""Tests for myxtts.hardware.select: --gpu parsing, the saved choice, the terminal question, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import io
import json
import sys

import pytest

from myxtts.hardware.detect import GpuFacts, MachineFacts, apply_cuda_visible_devices
from myxtts.hardware.select import (
    ALL_GPUS,
    cuda_visible_devices_value,
    default_choice_path,
    default_gpus,
    gpu_table,
    parse_gpu_argument,
    select_gpus,
)

GIB = 2**30


def gpus(*specs) -> tuple[GpuFacts, ...]:
    return tuple(GpuFacts(index=i, name=name, total_memory_bytes=gib * GIB, free_memory_bytes=(gib - 1) * GIB,
                          compute_capability=cc, nvml_index=i, uuid=f"GPU-{i}000-uuid")
                 for i, (name, gib, cc) in enumerate(specs))


A100 = ("NVIDIA A100-SXM4-80GB", 80, (8, 0))
RTX4090 = ("NVIDIA GeForce RTX 4090", 24, (8, 9))
GTX1080 = ("NVIDIA GeForce GTX 1080", 8, (6, 1))


def facts(*specs, visible=None) -> MachineFacts:
    return MachineFacts(gpus=gpus(*specs), cuda_visible_devices=visible)


def never_ask(prompt):
    raise AssertionError(f"prompted without a terminal: {prompt}")


def test_parse_gpu_argument():
    assert parse_gpu_argument("1") == [1]
    assert parse_gpu_argument(" 0,1 ") == [0, 1]
    assert parse_gpu_argument("cpu") == [] and parse_gpu_argument("-1") == []
    assert parse_gpu_argument("all") == ALL_GPUS
    assert parse_gpu_argument(None) is None and parse_gpu_argument("auto") is None
    for bad in ("x", "0,0", "1,-2", "0;1"):
        with pytest.raises(ValueError, match="--gpu"):
            parse_gpu_argument(bad)


def test_flag_wins_and_is_checked(tmp_path):
    machine = facts(A100, A100)
    assert select_gpus(machine, "1", choice_path=tmp_path / "c.json", input_fn=never_ask).indices == (1,)
    assert select_gpus(machine, "all", input_fn=never_ask).indices == (0, 1)
    assert select_gpus(machine, [0], input_fn=never_ask).source == "flag"
    with pytest.raises(ValueError, match=r"GPU \[2\] does not exist"):
        select_gpus(machine, "2")


def test_single_and_no_gpu_never_ask(tmp_path):
    assert select_gpus(facts(A100), interactive=True, input_fn=never_ask).indices == (0,)
    assert select_gpus(facts(), interactive=True, input_fn=never_ask).indices == ()


def test_no_terminal_means_no_prompt(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a TTY
    choice = tmp_path / "gpu_config.json"
    selection = select_gpus(facts(A100, A100), choice_path=choice, input_fn=never_ask)
    assert selection.indices == (0, 1) and selection.source == "default"
    assert "no terminal" in selection.messages[0]
    assert not choice.exists()


def test_terminal_prompt_shows_table_and_remembers(tmp_path, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    answers = iter(["7", "one", "1"])
    out = io.StringIO()
    choice = tmp_path / "home" / ".myxtts" / "gpu_config.json"
    selection = select_gpus(facts(A100, RTX4090), choice_path=choice, input_fn=lambda _: next(answers), output=out)
    assert selection.indices == (1,) and selection.source == "prompt"
    table = out.getvalue()
    assert "NVIDIA GeForce RTX 4090" in table and "Ada 8.9" in table and "80.0 GiB" in table
    assert json.loads(choice.read_text())["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"
    # The next run uses the remembered answer without asking.
    again = select_gpus(facts(A100, RTX4090), choice_path=choice, input_fn=never_ask)
    assert again.indices == (1,) and again.source == "saved"


def test_enter_takes_the_default(tmp_path):
    selection = select_gpus(facts(RTX4090, GTX1080), interactive=True, choice_path=tmp_path / "c.json",
                            input_fn=lambda _: "", output=io.StringIO())
    assert selection.indices == (0,)


def test_saved_choice_that_vanished_is_reported_and_ignored(tmp_path):
    choice = tmp_path / "gpu_config.json"
    choice.write_text(json.dumps({"gpus": [{"index": 3, "name": A100[0]}]}))
    selection = select_gpus(facts(A100, A100), interactive=False, choice_path=choice, input_fn=never_ask)
    assert selection.source == "default" and selection.indices == (0, 1)
    assert any("no longer exist" in m and "3 (NVIDIA A100-SXM4-80GB)" in m for m in selection.messages)
    # Same index, different card (e.g. another CUDA_VISIBLE_DEVICES): also stale.
    choice.write_text(json.dumps({"gpus": [{"index": 1, "name": "NVIDIA GeForce RTX 3090"}]}))
    assert select_gpus(facts(A100, A100), interactive=False, choice_path=choice).source == "default"
    choice.write_text("garbage")
    stale = select_gpus(facts(A100, A100), interactive=False, choice_path=choice)
    assert any("unreadable" in m for m in stale.messages)


def test_default_prefers_the_largest_identical_cards():
    assert default_gpus(gpus(GTX1080, RTX4090, RTX4090)) == [1, 2]
    assert default_gpus(gpus(A100, A100)) == [0, 1]
    assert default_gpus(()) == []


def test_cuda_visible_devices_indices_and_value():
    all_four = [GpuFacts(i, A100[0], 80 * GIB, 79 * GIB, (8, 0), nvml_index=i, uuid=f"GPU-{i}aaa") for i in range(4)]
    visible, _ = apply_cuda_visible_devices(all_four, "2,3")
    machine = MachineFacts(gpus=tuple(visible), cuda_visible_devices="2,3")
    # Indices refer to visible devices: 1 is physical GPU 3.
    selection = select_gpus(machine, "1", input_fn=never_ask)
    assert selection.indices == (1,)
    assert cuda_visible_devices_value(machine, selection.indices) == "GPU-3aaa"
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES='2,3'"):
        select_gpus(machine, "3")
    no_uuid = MachineFacts(gpus=(GpuFacts(0, "G", GIB, GIB, (8, 0), nvml_index=5),))
    assert cuda_visible_devices_value(no_uuid, [0]) == "5"
    assert cuda_visible_devices_value(machine, []) == ""


def test_default_choice_path_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_choice_path() == tmp_path / ".myxtts" / "gpu_config.json"


def test_table_lists_every_gpu():
    table = gpu_table(gpus(A100, GTX1080)).splitlines()
    assert len(table) == 3 and "Pascal 6.1" in table[2]
