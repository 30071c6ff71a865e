"""FusedAdamW against Keras' AdamW: the same updates, fewer ops."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.training.optimizers import FusedAdamW, WarmupHoldDecay, gradient_norm_known


def _trajectory(optimizer_class, accumulation, clipnorm, steps=6, compiled=True, norm_known=False):
    """The variables after each of `steps` applies of fixed pseudo-random gradients (`norm_known`:
    their global norm handed to the optimizer, as the train step does)."""
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 2, 3)]
    variables = [keras.Variable(rng.normal(size=s).astype(np.float32), name=f"v{i}") for i, s in enumerate(shapes)]
    gradients = [[tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes] for _ in range(steps)]
    optimizer = optimizer_class(WarmupHoldDecay(1e-2, warmup_steps=2, total_steps=steps, decay_steps=3),
                                beta_1=0.9, beta_2=0.98, epsilon=1e-8, weight_decay=0.05, global_clipnorm=clipnorm,
                                gradient_accumulation_steps=accumulation)
    optimizer.build(variables)

    def apply(grads):
        if norm_known:
            with gradient_norm_known(tf.linalg.global_norm(grads)):
                optimizer.apply(grads, variables)
        else:
            optimizer.apply(grads, variables)

    apply = tf.function(apply) if compiled else apply
    trajectory = []
    for grads in gradients:
        apply(grads)
        trajectory.append([v.numpy().copy() for v in variables])
    return trajectory, int(optimizer.iterations)


@pytest.mark.parametrize("accumulation,clipnorm,compiled,norm_known", [
    (None, None, True, False), (2, 0.5, True, False), (None, 0.5, False, False),
    (None, 0.5, True, True), (2, 0.5, True, True), (None, 0.5, False, True)])
def test_fused_adamw_follows_keras_adamw(accumulation, clipnorm, compiled, norm_known):
    ours, our_steps = _trajectory(FusedAdamW, accumulation, clipnorm, compiled=compiled, norm_known=norm_known)
    keras_, keras_steps = _trajectory(keras.optimizers.AdamW, accumulation, clipnorm, compiled=compiled)
    assert our_steps == keras_steps
    start = _trajectory(FusedAdamW, accumulation, clipnorm, steps=1)[0][0]
    moved = False
    for step, (a, b) in enumerate(zip(ours, keras_)):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=2e-6, atol=2e-7, err_msg=f"step {step}")
        moved = moved or any(not np.allclose(x, s) for x, s in zip(a, start))
    assert moved  # the learning rate is not zero throughout: the comparison saw real updates


def test_fused_adamw_writes_the_ops_it_says():
    variables = [keras.Variable(tf.ones([2, 2])) for _ in range(5)]
    ops_per_apply = {}
    for name, cls in (("fused", FusedAdamW), ("keras", keras.optimizers.AdamW)):
        optimizer = cls(WarmupHoldDecay(1e-3, 2, 10, 5), weight_decay=0.01)
        optimizer.build(variables)
        graph = tf.function(lambda: optimizer.apply([tf.ones([2, 2])] * 5, variables)).get_concrete_function().graph
        ops_per_apply[name] = len(graph.get_operations())
    # The fused form: one schedule and, per variable, its decay and one ResourceApplyAdam.
    assert ops_per_apply["fused"] * 2 < ops_per_apply["keras"], ops_per_apply


def test_fused_adamw_makes_what_the_variables_share_once_per_update():
    def ops(count, clip=None):
        variables = [keras.Variable(tf.ones([2, 2])) for _ in range(count)]
        optimizer = FusedAdamW(WarmupHoldDecay(1e-3, 2, 10, 5), weight_decay=0.01, global_clipnorm=clip)

        def apply():
            with gradient_norm_known(tf.constant(3.0)):
                optimizer.apply([tf.ones([2, 2])] * count, variables)

        optimizer.build(variables)
        return len(tf.function(apply).get_concrete_function().graph.get_operations())

    # Each further variable adds its own ops only: the handles of it and its two moments, a read, the
    # decay's Mul and AssignSub, ResourceApplyAdam and Keras' Identity (22 when each variable cast the
    # rates and raised the betas to the step itself; the graph-mode step runs every one of them).
    assert (ops(10) - ops(5)) / 5 <= 8
    # Clipping by the norm the step computed adds one Mul a variable, not the norm again (a Square and a Sum).
    assert (ops(10, clip=1.0) - ops(5, clip=1.0)) / 5 <= 9


def test_a_known_gradient_norm_clips_as_keras_does_even_when_it_is_not_finite():
    grads = [tf.constant([3.0, 4.0]), tf.constant([12.0])]
    for norm, expected in ((13.0, [[3 / 13, 4 / 13], [12 / 13]]), (0.5, [[3.0, 4.0], [12.0]])):
        optimizer = FusedAdamW(1e-3, global_clipnorm=1.0)
        with gradient_norm_known(tf.constant(norm)):
            clipped = optimizer._clip_gradients(grads)
        for got, want in zip(clipped, expected):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    with gradient_norm_known(tf.constant(float("nan"))):
        assert all(np.isnan(g.numpy()).all() for g in FusedAdamW(1e-3, global_clipnorm=1.0)._clip_gradients(grads))


def test_amsgrad_is_refused():
    with pytest.raises(ValueError, match="amsgrad"):
        FusedAdamW(amsgrad=True)


def test_a_keras_adamw_checkpoint_restores_into_fused_adamw(tmp_path):
    # Runs before FusedAdamW saved their optimizer as keras.optimizers.AdamW: same variables, same names.
    variable = keras.Variable(tf.ones([3]), name="w")
    saved = keras.optimizers.AdamW(1e-2, weight_decay=0.1)
    saved.build([variable])
    for _ in range(3):
        saved.apply([tf.constant([0.5, -1.0, 2.0])], [variable])
    path = tf.train.Checkpoint(optimizer=saved, variable=variable).save(str(tmp_path / "ckpt"))
    fresh = keras.Variable(tf.zeros([3]), name="w")
    restored = FusedAdamW(1e-2, weight_decay=0.1)
    restored.build([fresh])
    tf.train.Checkpoint(optimizer=restored, variable=fresh).restore(path).assert_consumed()
    assert int(restored.iterations) == 3
    for ours, theirs in zip(restored.variables, saved.variables):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert any(np.abs(np.asarray(v)).sum() > 0 for v in restored.variables[2:])  # the moments, not zeros
