"""Every private Keras / TensorFlow hook MyXTTS relies on, in one place, checked against the versions
it was verified on.

Keras and TensorFlow rename or drop private attributes between minor releases without notice, and
a missing one would surface as an `AttributeError` deep inside a training step, or worse, as a hook
that silently stops being called. So the code elsewhere never touches them: it calls the functions
below, each of which says what it relies on. `check_versions()` warns once when the installed Keras
or TensorFlow is outside the minors listed here; each hook raises `CompatibilityError`, naming the
attribute and what to install, when the attribute is gone.

Hooks used through this module:

    serialized_dataset_graph      Dataset._as_serialized_graph        diagnostics/graph_scan.py
    micro_batches_done            Optimizer._iterations                training/callbacks.py
    set_micro_batches_done        Optimizer._iterations                training/checkpoints.py
    replica_local_updates         MirroredExtended._use_merge_call     training/distribute.py
    skip_gradient_sum             Optimizer._all_reduce_sum_gradients  training/distribute.py
    all_reduce_sum_gradients      Optimizer._all_reduce_sum_gradients  training/prodigy.py
    optimizer_strategy            Optimizer._distribution_strategy     training/prodigy.py
    variable_index                Optimizer._get_variable_index        training/prodigy.py
    uses_weight_decay             Optimizer._use_weight_decay          training/prodigy.py, optimizers.py
    adam_moments                  Adam._momentums, Adam._velocities    training/optimizers.py
    maybe_merge_call              tf.__internal__...maybe_merge_call   training/prodigy.py
    time_batch_fetches            how Keras' TF trainer steps an iterator (see its docstring)
    keras_step_function           the closure of Keras' TF trainer's train function
    frozen_function               convert_to_constants.convert_variables_to_constants_v2  export_tflite.py

Methods our subclasses override (checked by `check_versions`, listed in `OVERRIDDEN`):
`keras.Model._maybe_symbolic_build` (training/step.py) and `Optimizer._backend_update_step`,
`Optimizer._apply_weight_decay` (training/prodigy.py, and training/optimizers.py's FusedAdamW, which
also overrides `_backend_update_step` and `_clip_gradients`).

To support a new Keras minor: install it, run `pytest tests/test_compat.py tests/test_prodigy.py
tests/test_distribute.py tests/test_input_wait.py tests/test_interrupts.py`, and when they pass add
the minor to `TESTED_KERAS` and to the pin in requirements.txt.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

TESTED_KERAS = ("3.15",)
TESTED_TENSORFLOW = ("2.21",)

# (where the base class lives, its name, the method overridden, who overrides it)
OVERRIDDEN = (
    ("keras", "Model", "_maybe_symbolic_build", "myxtts/training/step.py TrainingModel"),
    ("keras.optimizers", "Optimizer", "_backend_update_step", "myxtts/training/prodigy.py Prodigy"),
    ("keras.optimizers", "Optimizer", "_apply_weight_decay", "myxtts/training/prodigy.py Prodigy"),
    ("keras.optimizers", "AdamW", "_apply_weight_decay", "myxtts/training/optimizers.py FusedAdamW"),
    ("keras.optimizers", "AdamW", "_backend_update_step", "myxtts/training/optimizers.py FusedAdamW"),
    ("keras.optimizers", "AdamW", "_clip_gradients", "myxtts/training/optimizers.py FusedAdamW"),
)

_checked = False


class CompatibilityError(RuntimeError):
    """A private Keras/TensorFlow attribute this project relies on is missing from the installed version."""


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_problems(keras_version: str, tensorflow_version: str) -> list[str]:
    """One line per library outside the minors the hooks were verified on (empty when all are)."""
    problems = []
    for name, version, tested, pin in (("Keras", keras_version, TESTED_KERAS, "keras"),
                                       ("TensorFlow", tensorflow_version, TESTED_TENSORFLOW, "tensorflow")):
        if _minor(version) not in tested:
            problems.append(
                f"{name} {version} is installed, but MyXTTS's private {name} hooks (myxtts/compat.py) were verified "
                f"on {name} {', '.join(tested)} only: install {pin}=={tested[-1]}.* (pip install -r requirements.txt), "
                f"or run the tests named in myxtts/compat.py on {version} and add {_minor(version)} to its list")
    return problems


def missing_overrides() -> list[str]:
    """The overridden base-class methods (OVERRIDDEN) that the installed Keras no longer has."""
    import importlib

    missing = []
    for module_name, class_name, method, user in OVERRIDDEN:
        owner = getattr(importlib.import_module(module_name), class_name)
        if not callable(getattr(owner, method, None)):
            missing.append(f"{module_name}.{class_name}.{method} (overridden in {user})")
    return missing


def check_versions(*, force: bool = False) -> list[str]:
    """Warns (once per process) when Keras or TensorFlow is outside the tested minors; raises
    `CompatibilityError` when a method our subclasses override is gone. Returns the warnings.

    Called by the hooks below and by the classes that override Keras methods, so every path that
    depends on a private hook checks first; nothing runs at import.
    """
    global _checked
    if _checked and not force:
        return []
    import keras
    import tensorflow as tf

    missing = missing_overrides()
    if missing:
        raise CompatibilityError(
            f"Keras {keras.__version__} no longer has {'; '.join(missing)}, which MyXTTS overrides: "
            f"install keras=={TESTED_KERAS[-1]}.* (pip install -r requirements.txt)")
    problems = version_problems(keras.__version__, tf.__version__)
    for problem in problems:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    _checked = True
    return problems


def _private(owner: Any, name: str, purpose: str) -> Any:
    check_versions()
    try:
        return getattr(owner, name)
    except AttributeError:
        import keras
        import tensorflow as tf

        raise CompatibilityError(
            f"{type(owner).__name__}.{name} is missing in Keras {keras.__version__} / TensorFlow {tf.__version__}; "
            f"MyXTTS reads it {purpose}. Install keras=={TESTED_KERAS[-1]}.* and tensorflow=={TESTED_TENSORFLOW[-1]}.* "
            "(pip install -r requirements.txt)") from None


# --------------------------------------------------------------------------------------------------
# The runtime


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime has made its devices, which is when it reads TF_XLA_FLAGS
    (measured: a flag set after any device listing or op is ignored). No public API says so."""
    from tensorflow.python.eager import context

    return _private(context.context(), "_initialized", "to know whether TF_XLA_FLAGS can still take effect")


# --------------------------------------------------------------------------------------------------
# tf.data


def serialized_dataset_graph(dataset) -> bytes:
    """The dataset's GraphDef, serialized: the only way to see which ops its functions hold
    (`tf.data` has no public graph accessor)."""
    return _private(dataset, "_as_serialized_graph", "to scan the input pipeline for Python ops")().numpy()


# --------------------------------------------------------------------------------------------------
# Optimizers


def micro_batches_done(optimizer) -> int:
    """Micro-batches the optimizer has seen, accumulated or applied. Keras counts them in the private
    `_iterations`; the public `iterations` counts updates only."""
    import keras

    counter = _private(optimizer, "_iterations", "to save checkpoints only between whole updates")
    return int(keras.ops.convert_to_numpy(counter))


def set_micro_batches_done(optimizer, count: int) -> None:
    """Sets the private micro-batch counter (`_iterations`), from which Keras derives both the public
    update count and the learning-rate schedule's position: a checkpoint written with another
    gradient accumulation stores a count in its micro-batches, which the new one would divide wrongly."""
    _private(optimizer, "_iterations", "to resume at the same update under another gradient accumulation").assign(count)


def skip_gradient_sum(optimizer) -> None:
    """Makes `optimizer.apply` take gradients as they come instead of summing them across replicas
    (Keras' TensorFlow optimizers do it in `_all_reduce_sum_gradients`)."""
    _private(optimizer, "_all_reduce_sum_gradients", "to replace it with a pass-through")
    optimizer._all_reduce_sum_gradients = _already_reduced  # noqa: SLF001 - this module's purpose


def _already_reduced(grads_and_vars):
    return list(grads_and_vars)


def all_reduce_sum_gradients(optimizer, grads_and_vars):
    """Keras' own cross-replica sum of (gradient, variable) pairs, as its optimizers call it."""
    return _private(optimizer, "_all_reduce_sum_gradients", "to sum gradients across replicas")(grads_and_vars)


def optimizer_strategy(optimizer):
    """The distribution strategy the optimizer was created under."""
    return _private(optimizer, "_distribution_strategy", "to run its updates in the strategy's merge call")


def variable_index(optimizer, variable) -> int:
    """Position of `variable` in the optimizer's slot lists."""
    return _private(optimizer, "_get_variable_index", "to find a variable's optimizer slots")(variable)


def adam_moments(optimizer, variable) -> tuple:
    """(first moment, second moment) slot variables Keras' Adam keeps for `variable`."""
    index = variable_index(optimizer, variable)
    purpose = "to update Adam's moments with one fused op"
    return _private(optimizer, "_momentums", purpose)[index], _private(optimizer, "_velocities", purpose)[index]


def uses_weight_decay(optimizer, variable) -> bool:
    """Whether `variable` takes weight decay, after the optimizer's `exclude_from_weight_decay`."""
    return bool(_private(optimizer, "_use_weight_decay", "to honour exclude_from_weight_decay")(variable))


def maybe_merge_call(function: Callable, strategy, *args):
    """TensorFlow's merge call as Keras' optimizers use it (replica context -> cross-replica)."""
    import tensorflow as tf

    check_versions()
    try:
        merge = tf.__internal__.distribute.interim.maybe_merge_call
    except AttributeError:
        raise CompatibilityError(
            f"tf.__internal__.distribute.interim.maybe_merge_call is missing in TensorFlow {tf.__version__}; "
            f"install tensorflow=={TESTED_TENSORFLOW[-1]}.*") from None
    return merge(function, strategy, *args)


# --------------------------------------------------------------------------------------------------
# Distribution


def replica_local_updates(strategy) -> None:
    """Switches a MirroredStrategy to replica-local variable updates, the mode TensorFlow itself
    selects for XLA-compiled replica functions on GPUs (`extended._use_merge_call` -> False)."""
    _private(strategy.extended, "_use_merge_call", "to turn merge calls off")
    strategy.extended._use_merge_call = lambda: False  # noqa: SLF001 - this module's purpose


# --------------------------------------------------------------------------------------------------
# Timing the fetch of each training batch


class BatchFetchClock:
    """Seconds `model.fit` spent waiting in `next()` for its training batches, since the last read."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def read_and_reset(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class _TimedIterator:
    """A Python iterator over a tf.data iterator that adds the time each `next()` blocks to a clock."""

    def __init__(self, inner, clock: BatchFetchClock):
        self.inner, self.clock = inner, clock

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        batch = next(self.inner)
        self.clock.seconds += time.perf_counter() - started
        return batch


def time_batch_fetches(model) -> BatchFetchClock:
    """Makes `model.fit` fetch each training batch in Python and time the fetch; returns the clock.

    Keras' TensorFlow trainer (keras/src/backend/tensorflow/trainer.py, `_make_function`) pulls a
    batch from a `tf.data.Iterator` inside its compiled function, where no clock can see the wait.
    Given any other iterator it runs `for _, batch in zip(range(steps_per_execution), iterator):
    one_step_on_data(batch)` in Python, with the same compiled (XLA) step. So the train function is
    wrapped to hand Keras a Python iterator around the real one: each `next()` then measures exactly
    how long the step waited for its batch, wherever the batch comes from, a GPU prefetch buffer
    included (`prefetch_to_device`, where a clock inside the pipeline would time the copy thread,
    not the step). The price: with `steps_per_execution` > 1 the steps of one call are dispatched
    from Python one by one rather than from one compiled loop (callbacks still run once per call).
    A distributed iterator (several replicas) is passed through untimed.

    Keras then calls its step with eager batches of concrete shapes, and `reduce_retracing` traced
    the step twice: once for the first batch's shape, once more, with unknown lengths, for the
    second bucket's (15 s on an H200's host, BENCHMARKS.md). So on its first call the step is traced
    once for the pipeline's own element spec, whose lengths are unknown: every bucket uses that trace
    (`traced_for_spec`). XLA still compiles one program per shape.
    """
    import tensorflow as tf

    check_versions()
    clock = BatchFetchClock()
    make_keras_function = model.make_train_function
    timed: dict[int, _TimedIterator] = {}  # one wrapper per Keras iterator (Keras keeps one across epochs)

    def make_train_function(force: bool = False):
        make_keras_function(force=force)  # sets model.train_function (Keras 3.15 returns None the first time)
        keras_function = model.train_function
        if getattr(keras_function, "_myxtts_timed", False):
            return keras_function

        step = keras_step_function(keras_function)

        def train_function(iterator):
            if isinstance(iterator, tf.data.Iterator):
                if step is not None:
                    traced_for_spec(step, iterator.element_spec)
                wrapper = timed.get(id(iterator))
                if wrapper is None or wrapper.inner is not iterator:
                    timed.clear()
                    wrapper = timed[id(iterator)] = _TimedIterator(iterator, clock)
                iterator = wrapper
            return keras_function(iterator)

        train_function._myxtts_timed = True
        model.train_function = train_function
        return train_function

    model.make_train_function = make_train_function
    model.train_function = None  # built again, wrapped, by the next fit
    return clock


def keras_step_function(train_function):
    """The `tf.function` that runs one step inside the train function Keras' TF trainer made
    (`_make_function`: its `one_step_on_data`, wrapped by `_autoconvert_optionals`), or None where
    this Keras builds it otherwise or runs eagerly (tests/test_input_wait.py holds it to one trace)."""
    code, closure = getattr(train_function, "__code__", None), getattr(train_function, "__closure__", None)
    if code is None or closure is None or "one_step_on_data" not in code.co_freevars:
        return None
    step = closure[code.co_freevars.index("one_step_on_data")].cell_contents
    step = getattr(step, "__wrapped__", step)
    return step if hasattr(step, "get_concrete_function") else None


def traced_for_spec(function, spec) -> None:
    """Traces the `tf.function` `function` once for `spec` (a nest of `tf.TensorSpec`, e.g. a
    dataset's `element_spec`), unless it has been traced already. A call with concrete shapes that
    fit the spec then runs that trace instead of tracing its own (`reduce_retracing` would trace the
    first shape exactly, and relax only at the second)."""
    if function.experimental_get_tracing_count() == 0:
        function.get_concrete_function(spec)


def frozen_function(concrete_function):
    """`concrete_function` with its variables folded in as constants.

    The TFLite converter of TensorFlow 2.21 keeps Keras 3 variables as resource variables that its
    interpreter never initializes: a converted Conv1D read garbage (measured). A frozen function has
    none. TensorFlow exposes the freezing only under tensorflow.python.
    """
    try:
        from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    except ImportError as error:  # pragma: no cover - depends on the installed TensorFlow
        raise CompatibilityError(f"convert_variables_to_constants_v2 is gone from this TensorFlow ({error}); "
                                 f"TFLite export was verified on TensorFlow {', '.join(TESTED_TENSORFLOW)}") from None
    return convert_variables_to_constants_v2(concrete_function)
