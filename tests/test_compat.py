"""myxtts/compat.py: the one home of private Keras/TensorFlow hooks, and its version checks.

These tests run every hook on the installed Keras and TensorFlow, so a new minor that renames one
fails here, by name, before it fails inside a training step.
"""

import ast
import importlib
import re
import warnings
from pathlib import Path

import keras
import pytest
import tensorflow as tf

from myxtts import compat
from myxtts.diagnostics.graph_scan import find_python_ops

ROOT = Path(__file__).resolve().parents[1]


def test_installed_versions_are_the_tested_ones_and_the_pin_admits_only_those():
    assert compat.version_problems(keras.__version__, tf.__version__) == []
    pins = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if re.match(r"keras\b", line.strip())]
    assert pins == [f"keras=={compat.TESTED_KERAS[-1]}.*"] and len(compat.TESTED_KERAS) == 1, pins
    assert [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.startswith("tensorflow==")] == [f"tensorflow=={compat.TESTED_TENSORFLOW[-1]}.*"]


def test_an_untested_keras_minor_warns_with_what_to_install(monkeypatch):
    problems = compat.version_problems("3.16.0", tf.__version__)
    assert len(problems) == 1 and "Keras 3.16.0" in problems[0] and "keras==3.15.*" in problems[0]
    assert compat.version_problems("3.15.9", "2.22.0")[0].startswith("TensorFlow 2.22.0")
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    with pytest.warns(RuntimeWarning, match=r"Keras 3\.16\.0 is installed.*install keras==3\.15\.\*"):
        compat.check_versions(force=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.check_versions() == []  # once per process


def test_a_vanished_overridden_method_stops_with_what_to_install(monkeypatch):
    monkeypatch.setattr(compat, "OVERRIDDEN", compat.OVERRIDDEN + (("keras", "Model", "_gone_in_keras_4", "a test"),))
    with pytest.raises(compat.CompatibilityError, match=r"keras\.Model\._gone_in_keras_4 \(overridden in a test\).*keras==3\.15"):
        compat.check_versions(force=True)


def test_a_vanished_private_attribute_names_itself_and_the_fix():
    with pytest.raises(compat.CompatibilityError, match=r"object\._iterations is missing .*Install keras==3\.15\.\*"):
        compat.micro_batches_done(object())


def test_every_hook_works_on_the_installed_versions():
    dataset = tf.data.Dataset.range(4).map(lambda x: tf.numpy_function(lambda v: v, [x], tf.int64))
    assert [op.op for op in find_python_ops(dataset)] == ["PyFunc"]  # via serialized_dataset_graph

    variable = keras.Variable(tf.ones([2]))
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    optimizer.build([variable])
    optimizer.apply([tf.ones([2])], [variable])  # accumulated, not applied
    assert compat.micro_batches_done(optimizer) == 1 and int(optimizer.iterations) == 0
    assert compat.variable_index(optimizer, variable) == 0
    decayed = keras.optimizers.AdamW(weight_decay=0.1)
    decayed.exclude_from_weight_decay(var_names=["bias"])
    bias, kernel = keras.Variable(tf.ones([2]), name="bias"), keras.Variable(tf.ones([2]), name="kernel")
    assert not compat.uses_weight_decay(decayed, bias) and compat.uses_weight_decay(decayed, kernel)
    decayed.build([bias, kernel])
    moments = compat.adam_moments(decayed, kernel)
    assert [m.shape for m in moments] == [(2,), (2,)] and moments[0] is not compat.adam_moments(decayed, bias)[0]
    assert compat.optimizer_strategy(optimizer) is tf.distribute.get_strategy()
    pairs = [(tf.ones([2]), variable)]
    assert len(compat.all_reduce_sum_gradients(optimizer, pairs)) == 1
    compat.skip_gradient_sum(optimizer)
    assert compat.all_reduce_sum_gradients(optimizer, pairs) == pairs

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert strategy.extended._use_merge_call() is True  # noqa: SLF001 - what the hook switches off
    compat.replica_local_updates(strategy)
    assert strategy.extended._use_merge_call() is False  # noqa: SLF001
    assert compat.maybe_merge_call(lambda strategy, x: x + 1, tf.distribute.get_strategy(), 1) == 2


def _keras_subclasses(module) -> set[str]:
    names = set()
    for name, value in vars(module).items():
        if isinstance(value, type) and value.__module__ == module.__name__ and any(
                base.__module__.split(".")[0] in ("keras", "tensorflow") for base in value.__mro__[1:]):
            names.add(name)
    return names


def _private_uses(path: Path) -> list[str]:
    """`x._name` on objects that are not our own: other objects' private attributes, super()'s, and
    self's where `self` is a Keras/TensorFlow subclass and our code never defines `_name` itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    foreign_classes = _keras_subclasses(module)
    overridden = {method for _, _, method, _ in compat.OVERRIDDEN}
    found = []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            own = {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            own |= {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                    for t in ast.walk(n) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "self" and t.ctx.__class__ is ast.Store}
            if node.name in foreign_classes:
                for n in ast.walk(node):
                    if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                            and private(n.attr) and n.attr not in own):
                        found.append(f"{path.name}:{n.lineno} self.{n.attr} (a private attribute of {node.name}'s base)")
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and getattr(base.func, "id", None) == "super" and node.attr in overridden:
                continue  # an override calling the method it overrides (checked by check_versions)
            if node.attr in ("_replace", "_asdict", "_fields", "_exit"):  # namedtuple API, os._exit
                continue
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr == "__internal__":
            found.append(f"{path.name}:{node.lineno} .__internal__")
    return found


def test_no_private_keras_or_tensorflow_attribute_is_touched_outside_compat():
    files = [p for p in sorted((ROOT / "myxtts").rglob("*.py")) if p.name != "compat.py" ]
    found = [use for path in files for use in _private_uses(path)]
    assert found == [], "move these into myxtts/compat.py:\n" + "\n".join(found)
