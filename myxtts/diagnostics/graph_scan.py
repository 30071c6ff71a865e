"""Find ops in a `tf.data` graph that call back into Python.

`tf.numpy_function` / `tf.py_function` / `Dataset.from_generator` run Python under the GIL for every
element, which caps an input pipeline at roughly one core however many are free. They show up in
the serialized dataset graph as PyFunc, EagerPyFunc or generator ops, either as nodes of the main
graph or inside the library functions that `map`, `filter` and friends are compiled into.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from myxtts import compat

PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset"})


@dataclass(frozen=True)
class PythonOp:
    op: str  # e.g. "PyFunc"
    node: str  # the node's name inside its function, which carries the user's op name
    function: str  # the library function holding it ("" for the main graph), e.g. a map's function

    def describe(self) -> str:
        where = f"in function {self.function}" if self.function else "in the dataset graph"
        return f"{self.op} node '{self.node}' {where}"


def dataset_graph(dataset: tf.data.Dataset) -> graph_pb2.GraphDef:
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(compat.serialized_dataset_graph(dataset))
    return graph


def find_python_ops(dataset: tf.data.Dataset) -> list[PythonOp]:
    """Every node in the dataset's graph (and its functions) whose op runs Python code."""
    graph = dataset_graph(dataset)
    found = [PythonOp(node.op, node.name, "") for node in graph.node if node.op in PYTHON_OPS]
    for function in graph.library.function:
        found += [
            PythonOp(node.op, node.name, function.signature.name)
            for node in function.node_def
            if node.op in PYTHON_OPS
        ]
    return found


def dataset_ops(dataset: tf.data.Dataset) -> set[str]:
    """All op types used by the dataset graph and its functions."""
    graph = dataset_graph(dataset)
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops
