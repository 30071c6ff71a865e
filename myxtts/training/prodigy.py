"""Prodigy: Adam with a learning rate found by D-adaptation, as a Keras 3 optimizer.

Prodigy (Mishchenko & Defazio, 2023, arXiv:2306.06101) estimates `d`, the distance from the
initial weights to a solution, while it trains, and uses `d * learning_rate` as Adam's step size;
`learning_rate` stays at 1.0 (or a schedule's multiplier of it). Keras ships no Prodigy, and the
authors' `prodigyopt` is PyTorch-only, so this is our own implementation of the algorithm of
`prodigyopt` 1.1.2 (decoupled weight decay, no parameter slicing). `tests/test_prodigy.py` checks
it step by step against a trajectory recorded from `prodigyopt`.

One step, with `g` the gradient, `p` a weight, `p0` its value at the first step and `dlr = d * lr`
(times Adam's bias correction if enabled):

    numerator = beta_3 * numerator + (d / d0) * dlr * sum_over_all_weights(g . (p0 - p))
    s         = beta_3 * s + (d / d0) * dlr * g          (d instead of dlr with safeguard_warmup)
    m         = beta_1 * m + d * (1 - beta_1) * g
    v         = beta_2 * v + d^2 * (1 - beta_2) * g^2
    d_hat     = d_coef * numerator / sum_over_all_weights(|s|)
    d         = min(max(d_max, d_hat), d * growth_rate)  (d_max: largest d_hat so far, at least d0;
                                                          the first move away from d0 is unlimited)
    p         = p - weight_decay * dlr * p - dlr * m / (sqrt(v) + d_new * epsilon)

Why this is not a plain `update_step`: Keras calls `update_step` once per variable and each call
updates that variable at once, but `d` needs the sums over *all* variables of the step before any
variable moves. So this class overrides `_backend_update_step`, the hook that receives every
(already averaged, clipped) gradient of one optimizer step, and works in two phases:

1. a pure phase that reads the state and computes the global sums and the new `d` without
   assigning anything;
2. an assignment phase that updates every variable and its slots with those scalars.

Everything the base class does around that hook keeps working: gradient accumulation (the hook
runs inside its `cond`), `global_clipnorm`/`clipnorm`/`clipvalue`, EMA, loss scaling, learning
rate schedules, and `jit_compile=True` in `Model.fit`. On the TensorFlow backend the assignment
phase runs through the distribution strategy's merge call like Keras's own optimizers do, so the
gradients are summed across replicas first and every replica computes the same `d`.

`d` is a non-trainable optimizer variable (`optimizer.d`) so it can be logged and is checkpointed.
Memory: four slots per weight (m, v, s, p0), three with beta_1 = 0; Adam keeps two.
"""

import math

import keras
from keras import ops

from myxtts import compat


@keras.saving.register_keras_serializable(package="myxtts")
class Prodigy(keras.optimizers.Optimizer):
    """Prodigy optimizer (Adam with D-adaptation), matching `prodigyopt` 1.1.2.

    Args:
        learning_rate: Float or schedule multiplying Prodigy's own step size `d`. Leave at 1.0
            unless training is unstable; a schedule works as a warm-up/decay multiplier.
        beta_1: Decay of the first moment (0 disables momentum and its slot).
        beta_2: Decay of the second moment.
        beta_3: Decay of the `d` estimate's running sums; `None` means `sqrt(beta_2)`.
        epsilon: Added to `sqrt(v)`, scaled by `d` as in the reference.
        weight_decay: Decoupled (AdamW-style) weight decay, scaled by `d * learning_rate`.
            `exclude_from_weight_decay()` is honoured.
        use_bias_correction: Apply Adam's bias correction to the step size.
        safeguard_warmup: Leave `learning_rate` out of the `d` estimate's denominator, which
            keeps a warm-up schedule from inflating `d`.
        d0: Initial estimate of `d`.
        d_coef: Multiplier of the estimate; the preferred knob to tune (0.5 to 2 typical).
        growth_rate: Largest factor by which `d` may grow per step; `inf` for unlimited.
        **kwargs: The standard Keras optimizer arguments (`global_clipnorm`,
            `gradient_accumulation_steps`, `use_ema`, `name`, ...).
    """

    def __init__(
        self,
        learning_rate=1.0,
        beta_1=0.9,
        beta_2=0.999,
        beta_3=None,
        epsilon=1e-8,
        weight_decay=0.0,
        use_bias_correction=False,
        safeguard_warmup=False,
        d0=1e-6,
        d_coef=1.0,
        growth_rate=math.inf,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        loss_scale_factor=None,
        gradient_accumulation_steps=None,
        name=None,
        **kwargs,
    ):
        compat.check_versions()  # it overrides private Keras methods (`_backend_update_step`, ...)
        # The base class would apply `weight_decay` itself, scaled by the learning rate only;
        # Prodigy scales it by d * lr, so it is kept out of super() and applied in the step.
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=None,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps,
            name=name,
            **kwargs,
        )
        _check_range("learning_rate", learning_rate, low=0.0, low_open=True, skip_callable=True)
        _check_range("beta_1", beta_1, low=0.0, high=1.0)
        _check_range("beta_2", beta_2, low=0.0, high=1.0)
        if beta_3 is not None:
            _check_range("beta_3", beta_3, low=0.0, high=1.0)
        _check_range("epsilon", epsilon, low=0.0, low_open=True)
        _check_range("weight_decay", weight_decay, low=0.0)
        _check_range("d0", d0, low=0.0, low_open=True)
        _check_range("d_coef", d_coef, low=0.0, low_open=True)
        if not growth_rate >= 1.0:
            raise ValueError(
                f"Prodigy growth_rate must be >= 1 (math.inf for unlimited growth); got "
                f"{growth_rate!r}. Values like 1.02 act as a warm-up of d."
            )
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.beta_3 = beta_3
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.use_bias_correction = use_bias_correction
        self.safeguard_warmup = safeguard_warmup
        self.d0 = d0
        self.d_coef = d_coef
        self.growth_rate = growth_rate

    @property
    def d(self):
        """Prodigy's current distance estimate; `d * learning_rate` is the effective Adam step."""
        if not self.built:
            # AttributeError, so that `hasattr(optimizer, "d")` is simply False until then.
            raise AttributeError(
                "Prodigy.d exists once the optimizer is built: call optimizer.build(variables) "
                "or run a training step first."
            )
        return self._d

    def build(self, var_list):
        """Create the per-variable slots and the global scalars of the `d` estimate."""
        if self.built:
            return
        super().build(var_list)
        # The global scalars (d, its running sums, the per-step coefficients) are float64, as
        # in prodigyopt, which keeps them as Python floats: d_hat is a ratio of sums over every
        # weight of the model that partly cancel. A few float64 scalar ops cost nothing next to
        # the per-weight work (GPUs and XLA CPU support them; TPUs would not), and with them
        # our float32 run of the reference test's default setting tracks prodigyopt's to 1e-5
        # instead of 1e-2.
        self._scalar_dtype = "float64"
        if self.beta_1 > 0:
            self._exp_avgs = self.add_optimizer_variables(var_list, "exp_avg")
        else:
            # beta_1 == 0: the first moment would equal d * g exactly; save its memory.
            self._exp_avgs = [None] * len(var_list)
        self._exp_avg_sqs, self._s_sums, self._initial_values = self.add_optimizer_variables(
            var_list, ["exp_avg_sq", "s", "p0"]
        )
        dtype = self._scalar_dtype
        def d0_init(shape, dtype):
            # ops.full keeps d0 exact in float64; a Constant initializer would round it through
            # float32 and break the exact `d == d0` test of the reference.
            return ops.full(shape, self.d0, dtype=dtype)

        self._d = self.add_variable((), initializer=d0_init, dtype=dtype, name="d")
        self._d_max = self.add_variable((), initializer=d0_init, dtype=dtype, name="d_max")
        self._d_numerator = self.add_variable((), dtype=dtype, name="d_numerator")
        # Steps actually taken. It differs from `iterations` (skipped steps and accumulation
        # micro-steps do not count) and drives bias correction and the capture of p0.
        self._taken_steps = self.add_variable((), dtype="int", name="taken_steps")

    def _apply_weight_decay(self, variables):
        # Prodigy's decay is scaled by d * lr and applied inside the step (see __init__).
        return

    def update_step(self, gradient, variable, learning_rate):
        raise NotImplementedError(
            "Prodigy updates all variables together in _backend_update_step, because d depends "
            "on sums over every variable; update_step must not be called on its own."
        )

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() == "tensorflow":
            self._tf_update_step(grads, trainable_variables, learning_rate)
            return
        grads = [ops.convert_to_tensor(g) for g in grads]
        coefficients, new_scalars, new_s_sums = self._plan_step(
            grads, trainable_variables, learning_rate
        )
        for grad, variable, new_s in zip(grads, trainable_variables, new_s_sums):
            self._update_variable(variable, grad, new_s, coefficients)
        for name, variable in self._scalar_variables().items():
            self.assign(variable, new_scalars[name])

    def _tf_update_step(self, grads, trainable_variables, learning_rate):
        """TensorFlow path: sum gradients across replicas, then assign in the merge call.

        This mirrors `TFOptimizer._backend_update_step`. The sums of phase 1 run in replica
        context on the all-reduced gradients and mirrored weights, so every replica computes the
        same `d`; the assignments go through `extended.update`, which is how mirrored variables
        (and the slots colocated with them) may be written.
        """
        import tensorflow as tf  # the TF path only; keeps this module backend-neutral at import

        tf_variables = [
            v.value if isinstance(v, keras.Variable) else v for v in trainable_variables
        ]
        grads_and_vars = compat.all_reduce_sum_gradients(self, list(zip(grads, tf_variables)))
        # tf.convert_to_tensor densifies IndexedSlices (embedding gradients): Prodigy needs dot
        # products and |s| sums over whole tensors, so sparse updates would not save anything.
        grads = [tf.convert_to_tensor(g) for g, _ in grads_and_vars]
        coefficients, new_scalars, new_s_sums = self._plan_step(
            grads, trainable_variables, learning_rate
        )

        def assign_all(distribution, grads, new_s_sums, coefficients, new_scalars):
            for grad, variable, new_s in zip(grads, tf_variables, new_s_sums):
                distribution.extended.update(
                    variable, self._update_variable, args=(grad, new_s, coefficients), group=False
                )
            for name, variable in self._scalar_variables().items():
                distribution.extended.update(
                    variable.value,
                    lambda var, value: var.assign(value),
                    args=(new_scalars[name],),
                    group=False,
                )

        compat.maybe_merge_call(
            assign_all,
            compat.optimizer_strategy(self),
            grads,
            new_s_sums,
            coefficients,
            new_scalars,
        )

    def _scalar_variables(self):
        """The global state of the d estimate, keyed like `_plan_step`'s new values."""
        return {
            "d": self._d,
            "d_max": self._d_max,
            "d_numerator": self._d_numerator,
            "taken_steps": self._taken_steps,
        }

    def _plan_step(self, grads, variables, learning_rate):
        """Phase 1: compute the new `d` and the new `s` slots; assigns nothing.

        Returns `(coefficients, new_scalars, new_s_sums)`: the scalar coefficients phase 2 needs,
        the new values of the global scalars (keyed like `_scalar_variables`), and the new `s`
        slot values, which phase 1 needs for the |s| sum and phase 2 stores.
        """
        dtype = self._scalar_dtype

        def const(value):
            return ops.convert_to_tensor(value, dtype=dtype)

        beta_1, beta_2 = const(self.beta_1), const(self.beta_2)
        beta_3 = const(self.beta_3 if self.beta_3 is not None else math.sqrt(self.beta_2))
        d0 = const(self.d0)
        d = ops.convert_to_tensor(self._d, dtype=dtype)
        d_max = ops.convert_to_tensor(self._d_max, dtype=dtype)
        d_numerator = ops.convert_to_tensor(self._d_numerator, dtype=dtype)
        taken_steps = ops.convert_to_tensor(self._taken_steps)
        lr = ops.cast(learning_rate, dtype)

        if self.use_bias_correction:
            k_plus_1 = ops.cast(taken_steps + 1, dtype)
            bias_correction = ops.sqrt(1.0 - ops.power(beta_2, k_plus_1)) / (
                1.0 - ops.power(beta_1, k_plus_1)
            )
        else:
            bias_correction = const(1.0)
        dlr = d * lr * bias_correction
        # prodigyopt makes a step with lr == 0 (e.g. the end of a cosine schedule) a no-op:
        # the moments, s and d stay as they are.
        lr_positive = lr > 0.0
        s_coefficient = (d / d0) * (d if self.safeguard_warmup else dlr)
        s_decay = ops.where(lr_positive, beta_3, const(1.0))
        s_coefficient = ops.where(lr_positive, s_coefficient, const(0.0))
        # p0 is captured on the first step taken, where p0 - p is zero by definition; the slot
        # still holds zeros then, so that step's dot products are masked out below.
        first_step = ops.equal(taken_steps, 0)

        dot_sum = const(0.0)  # sum over all weights of g . (p0 - p)
        abs_s_sum = const(0.0)  # sum over all weights of |s_new|
        new_s_sums = []
        for grad, variable in zip(grads, variables):
            index = compat.variable_index(self, variable)
            var_dtype = variable.dtype
            grad = ops.cast(grad, var_dtype)
            weights = ops.convert_to_tensor(variable)
            p0 = ops.convert_to_tensor(self._initial_values[index])
            s = ops.convert_to_tensor(self._s_sums[index])
            dot_sum += ops.cast(ops.sum(grad * (p0 - weights)), dtype)
            new_s = s * ops.cast(s_decay, var_dtype) + grad * ops.cast(s_coefficient, var_dtype)
            abs_s_sum += ops.cast(ops.sum(ops.abs(new_s)), dtype)
            new_s_sums.append(new_s)

        dot_sum = ops.where(first_step, const(0.0), dot_sum)
        new_d_numerator = beta_3 * d_numerator + (d / d0) * dlr * dot_sum
        # With all-zero gradients (or lr == 0) there is nothing to estimate from: prodigyopt
        # returns before touching d or the weights, and so do we (`step_taken` false).
        step_taken = ops.logical_and(lr_positive, abs_s_sum > 0.0)
        safe_denominator = ops.where(step_taken, abs_s_sum, const(1.0))
        d_hat = const(self.d_coef) * new_d_numerator / safe_denominator
        # The reference lets d jump straight to d_hat the first time it leaves d0 (exact
        # comparison on purpose), and limits later growth to growth_rate per step.
        new_d = ops.where(ops.equal(d, d0), ops.maximum(d, d_hat), d)
        new_d_max = ops.maximum(d_max, d_hat)
        new_d = ops.minimum(new_d_max, new_d * const(self.growth_rate))

        # Per-step coefficients of phase 2, computed here once in the scalar dtype (the reference
        # computes them as Python floats). lr == 0 freezes the moments; a skipped step moves
        # no weight.
        one, zero = const(1.0), const(0.0)
        new_d = ops.where(step_taken, new_d, d)
        step_size = ops.where(step_taken, dlr, zero)
        coefficients = {
            # Moments use the d of the start of the step, as in the reference.
            "exp_avg_decay": ops.where(lr_positive, beta_1, one),
            "exp_avg_scale": ops.where(lr_positive, d * (1.0 - beta_1), zero),
            "exp_avg_sq_decay": ops.where(lr_positive, beta_2, one),
            "exp_avg_sq_scale": ops.where(lr_positive, d * d * (1.0 - beta_2), zero),
            # Without a first moment prodigyopt steps along d * g with the d of the *end* of
            # the step (unlike exp_avg, which holds the start-of-step d); we follow it.
            "grad_scale": new_d,
            "step_size": step_size,
            "decay_step": step_size * const(self.weight_decay),
            # The denominator uses the d of the *end* of the step.
            "epsilon": new_d * const(self.epsilon),
            "first_step": first_step,
        }
        new_scalars = {
            "d": new_d,
            "d_max": ops.where(step_taken, new_d_max, d_max),
            "d_numerator": ops.where(step_taken, new_d_numerator, d_numerator),
            "taken_steps": taken_steps + ops.cast(step_taken, taken_steps.dtype),
        }
        return coefficients, new_scalars, new_s_sums

    def _update_variable(self, variable, grad, new_s, coefficients):
        """Phase 2 for one weight: store its slots and move it, using phase 1's scalars."""
        index = compat.variable_index(self, variable)
        var_dtype = variable.dtype

        def coefficient(name):
            return ops.cast(coefficients[name], var_dtype)

        grad = ops.cast(grad, var_dtype)
        exp_avg_sq = self._exp_avg_sqs[index]
        new_exp_avg_sq = exp_avg_sq * coefficient("exp_avg_sq_decay") + ops.square(
            grad
        ) * coefficient("exp_avg_sq_scale")
        self.assign(exp_avg_sq, new_exp_avg_sq)
        if self.beta_1 > 0:
            exp_avg = self._exp_avgs[index]
            direction = exp_avg * coefficient("exp_avg_decay") + grad * coefficient(
                "exp_avg_scale"
            )
            self.assign(exp_avg, direction)
        else:
            direction = grad * coefficient("grad_scale")
        self.assign(self._s_sums[index], new_s)

        # The first step's weights are the p0 of the d estimate; capture them only then rather
        # than at build time, so weights loaded after the optimizer was built are the ones used.
        p0 = self._initial_values[index]
        ops.cond(coefficients["first_step"], lambda: self.assign(p0, variable), lambda: None)

        denominator = ops.sqrt(new_exp_avg_sq) + coefficient("epsilon")
        update = coefficient("step_size") * direction / denominator
        if self.weight_decay > 0 and compat.uses_weight_decay(self, variable):
            update = update + coefficient("decay_step") * ops.convert_to_tensor(variable)
        self.assign_sub(variable, update)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "beta_3": self.beta_3,
                "epsilon": self.epsilon,
                "use_bias_correction": self.use_bias_correction,
                "safeguard_warmup": self.safeguard_warmup,
                "d0": self.d0,
                "d_coef": self.d_coef,
                "growth_rate": self.growth_rate,
            }
        )
        return config


def _check_range(name, value, low, high=None, low_open=False, skip_callable=False):
    """Raise a ValueError naming the argument if `value` is outside [low, high)."""
    if skip_callable and not isinstance(value, (int, float)):
        return  # a learning-rate schedule or callable; its values are its owner's business
    too_low = value <= low if low_open else value < low
    too_high = high is not None and value >= high
    if too_low or too_high:
        opening = "(" if low_open else "["
        closing = f"{high})" if high is not None else "inf)"
        raise ValueError(f"Prodigy argument {name}={value!r} is outside {opening}{low}, {closing}.")
