"""The suite's own ordering (tests/conftest.py): the tests marked slow are collected first."""

from types import SimpleNamespace

from conftest import pytest_collection_modifyitems


def _item(name, slow):
    return SimpleNamespace(name=name, get_closest_marker=lambda marker: "mark" if slow and marker == "slow" else None)


def test_the_slow_tests_come_first_and_each_group_keeps_its_order():
    items = [_item("a", False), _item("b", True), _item("c", False), _item("d", True), _item("e", False)]
    pytest_collection_modifyitems(None, items)
    assert [item.name for item in items] == ["b", "d", "a", "c", "e"]
