"""No variable that the compiled steps read or write lives in host memory on a GPU.

TensorFlow keeps int32 variables on the host even when the step runs on a GPU, and an XLA program
compiled for the GPU cannot read them: the first XLA step on an H100 crashed on an int32 counter
(`nonfinite_in_a_row`). A CPU reads host variables either way, so training here cannot show it;
what can be checked here is the class: every variable captured by the traced steps, under the
settings that add variables of their own (Prodigy's step counters, fp16 loss scaling, gradient
accumulation, the decoder window's seed generator, dropout seeds), has a dtype TensorFlow keeps on
the GPU.
"""

import keras
import pytest
import tensorflow as tf

from myxtts.data.manifest import read_manifest
from myxtts.data.pipeline import build_dataset, build_vocabulary
from myxtts.training import step as step_lib
from myxtts.training.trainer import build_training_model

from conftest import tiny_config

POLICIES = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("optimizer,precision,xla", [("prodigy", "fp16", True), ("adamw", "bf16", True),
                                                     ("adamw", "fp16", False)])
def test_every_variable_of_the_compiled_steps_stays_on_the_gpu(demo_corpus, optimizer, precision, xla):
    # Without XLA for the step, a GPU compiles the optimizer's update alone (its variables are captured
    # by the step too, through the call); set here as TrainingModel.compile sets it on a GPU.
    config = tiny_config(demo_corpus, f"training.optimizer={optimizer}", f"training.precision={precision}",
                         f"training.learning_rate={1.0 if optimizer == 'prodigy' else 1e-3}",
                         "training.gradient_accumulation_steps=2", "training.decoder_window=32",
                         f"training.enable_xla_compilation={str(xla).lower()}")
    rows = read_manifest(demo_corpus)
    vocabulary = build_vocabulary(rows, config.data)
    batch = next(iter(build_dataset(config, rows, training=False, vocabulary=vocabulary)))
    policy = POLICIES[precision]
    keras.config.set_dtype_policy(policy)
    model = build_training_model(config, len(vocabulary), policy, batch)
    assert model.update_compiled is None  # on a CPU: in the step's graph
    if not xla:
        model.update_compiled = tf.function(model._update, jit_compile=True)

    for name, step in (("train_step", model.train_step), ("test_step", model.test_step)):
        # What Keras compiles for `fit` and `evaluate`: the step function itself, under jit_compile.
        captured = tf.function(step, jit_compile=xla).get_concrete_function(batch).variables
        assert len(captured) > 10, f"{name} captured only {len(captured)} variables: the trace is not the step"
        assert step_lib.host_placed(captured) == [], f"{name} reads variables a GPU's XLA program cannot"


def test_the_check_names_an_int32_variable():
    variables = [tf.Variable(0, dtype=tf.int32, name="counter"), tf.Variable(0, dtype=tf.int64, name="steps"),
                 tf.Variable(1.0, name="weight")]
    assert step_lib.host_placed(variables) == ["counter:0 (int32)"]
