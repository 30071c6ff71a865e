"""Record the prodigyopt trajectories that `tests/test_prodigy.py` checks our Keras Prodigy against.

The reference is the authors' PyTorch implementation, `prodigyopt` (Mishchenko & Defazio, 2023).
PyTorch must never become a dependency of MyXTTS, so this script runs in a separate virtualenv
and its only product is the small committed file `tests/reference/prodigy_trajectory.json`.

Recorded with torch 2.13.0+cpu, prodigyopt 1.1.2, numpy 2.4.6, Python 3.11. To regenerate
(from the repository root; the CPU wheel of torch 2.13.0 is on this machine kind, a plain
`torch` requirement would download several GB of CUDA packages):

    python3 -m venv /work/venv-ref
    /work/venv-ref/bin/pip install torch==2.13.0 prodigyopt==1.1.2 numpy
    /work/venv-ref/bin/python tests/reference/record_prodigy_reference.py \
        --out tests/reference/prodigy_trajectory.json

The problem: full-batch least squares through a one-hidden-layer tanh MLP,
`loss = mean((tanh(x @ w1 + b1) @ w2 + b2 - y) ** 2)`, with data and initial parameters drawn
by numpy from a fixed seed and stored in the file, so the Keras side needs no random generator
of its own. Four parameter tensors (two of them zero biases) make Prodigy's `d` a real sum over
several variables, which is the part a per-variable Keras `update_step` would get wrong.

Every setting is run in float64 (checks the algorithm to near machine precision) and float32
(what training uses). For each run the file holds, per step, the loss before the step and
Prodigy's `d` after it, plus the parameters every `snapshot_every` steps. Float32 runs also
carry `float32_sensitivity`: how far prodigyopt's own float32 trajectory moves when its initial
weights are nudged by one ulp, which the test uses to bound float32 deviations.
"""

import argparse
import importlib.metadata
import json
import math
import platform

import numpy as np
import torch
from prodigyopt import Prodigy

STEPS = 100
SNAPSHOT_EVERY = 10
SEED = 20230619  # arbitrary, fixed: the data must be identical on every regeneration
N_SAMPLES, N_INPUTS, N_HIDDEN = 32, 4, 8
PARAM_NAMES = ("w1", "b1", "w2", "b2")


def warmup_cosine_with_restart(steps):
    """Per-step learning-rate multipliers: linear warm-up, a cosine cycle, and a restarted one.

    Both cycles end at exactly 0 (steps 59 and 99), which exercises prodigyopt's "lr == 0 means
    no step at all" path; the zero in the middle matters, because only there does a wrongly
    taken step (a decayed d numerator, a counted step) change what follows. The table itself is
    stored in the file, so the Keras side replays it rather than re-deriving the formula.
    """
    warmup, restart = 10, 60

    def cosine(progress):
        return 0.0 if progress >= 1.0 else 0.5 * (1.0 + math.cos(math.pi * progress))

    rates = []
    for t in range(steps):
        if t < warmup:
            rates.append((t + 1) / warmup)
        elif t < restart:
            rates.append(cosine((t - warmup + 1) / (restart - warmup)))
        else:
            rates.append(cosine((t - restart) / (steps - 1 - restart)))
    return rates


# Three settings that between them touch every branch of prodigyopt's step: bias correction,
# safeguarded warm-up, decoupled weight decay, beta1 == 0 (no first moment), explicit beta3,
# a finite growth rate, d_coef, and a learning-rate schedule that reaches exactly zero twice.
SETTINGS = (
    {"name": "default", "prodigyopt_kwargs": {}, "learning_rates": None},
    {
        "name": "decay_bias_correction_safeguard",
        "prodigyopt_kwargs": {
            "weight_decay": 0.1,
            "use_bias_correction": True,
            "safeguard_warmup": True,
        },
        "learning_rates": None,
    },
    {
        "name": "schedule_growth_no_momentum",
        "prodigyopt_kwargs": {
            "betas": [0.0, 0.99],
            "beta3": 0.9,
            "eps": 1e-6,
            "d0": 1e-5,
            "d_coef": 0.5,
            "growth_rate": 1.1,
        },
        "learning_rates": warmup_cosine_with_restart(STEPS),
    },
)


def make_problem():
    """Fixed float64 data and initial parameters, as numpy arrays."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((N_SAMPLES, N_INPUTS))
    direction = rng.standard_normal((N_INPUTS, 1))
    y = np.sin(x @ direction) + 0.1 * rng.standard_normal((N_SAMPLES, 1))
    params = {
        # Glorot-like scale so tanh starts in its linear range, as a Keras Dense layer would.
        "w1": rng.standard_normal((N_INPUTS, N_HIDDEN)) / math.sqrt(N_INPUTS),
        "b1": np.zeros((N_HIDDEN,)),
        "w2": rng.standard_normal((N_HIDDEN, 1)) / math.sqrt(N_HIDDEN),
        "b2": np.zeros((1,)),
    }
    return x, y, params


def mlp_loss(x, y, params):
    hidden = torch.tanh(x @ params["w1"] + params["b1"])  # [samples, hidden]
    prediction = hidden @ params["w2"] + params["b2"]  # [samples, 1]
    return torch.mean((prediction - y) ** 2)


def optimize(setting, dtype, x_np, y_np, params_np):
    """Optimise the problem for STEPS steps; return per-step losses and d, and weight snapshots."""
    torch_dtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
    x = torch.tensor(x_np, dtype=torch_dtype)
    y = torch.tensor(y_np, dtype=torch_dtype)
    params = {
        name: torch.tensor(params_np[name], dtype=torch_dtype, requires_grad=True)
        for name in PARAM_NAMES
    }
    kwargs = dict(setting["prodigyopt_kwargs"])
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    optimizer = Prodigy([params[name] for name in PARAM_NAMES], **kwargs)
    rates = setting["learning_rates"]
    base_lr = optimizer.param_groups[0]["lr"]

    def snapshot():
        return {name: params[name].detach().numpy().copy() for name in PARAM_NAMES}

    losses, ds, snapshots = [], [], {"0": snapshot()}
    for step in range(STEPS):
        if rates is not None:
            optimizer.param_groups[0]["lr"] = base_lr * rates[step]
        optimizer.zero_grad()
        loss = mlp_loss(x, y, params)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        ds.append(optimizer.param_groups[0]["d"])
        if (step + 1) % SNAPSHOT_EVERY == 0:
            snapshots[str(step + 1)] = snapshot()
    return np.array(losses), np.array(ds), snapshots


def float32_sensitivity(setting, x, y, params, losses, ds, snapshots, seeds=4):
    """How far prodigyopt's own float32 trajectory moves when its start is rounded differently.

    Adam divides each gradient element by its own RMS, so on some stretches of a run a
    last-bit difference grows by orders of magnitude within a few steps. Any two correct float32
    implementations differ by such last bits, so the Keras test bounds its deviation by this
    spread: the largest deviation over `seeds` runs whose initial weights are each nudged by a
    random -1, 0 or +1 float32 ulp.
    """
    worst = {"loss_max_relative": 0.0, "d_max_relative": 0.0, "final_weights_max_absolute": 0.0}
    final = str(STEPS)
    for seed in range(1, seeds + 1):
        rng = np.random.default_rng(seed)
        nudged = {}
        for name, value in params.items():
            value32 = value.astype(np.float32)
            direction = rng.integers(-1, 2, size=value32.shape)
            towards = np.where(direction > 0, np.inf, -np.inf).astype(np.float32)
            nudged[name] = np.where(direction == 0, value32, np.nextafter(value32, towards))
        other_losses, other_ds, other_snapshots = optimize(setting, "float32", x, y, nudged)
        worst["loss_max_relative"] = max(
            worst["loss_max_relative"], float(np.max(np.abs(other_losses - losses) / losses))
        )
        worst["d_max_relative"] = max(
            worst["d_max_relative"], float(np.max(np.abs(other_ds - ds) / ds))
        )
        for name in PARAM_NAMES:
            worst["final_weights_max_absolute"] = max(
                worst["final_weights_max_absolute"],
                float(np.max(np.abs(other_snapshots[final][name] - snapshots[final][name]))),
            )
    worst["seeds"] = seeds
    return worst


def run(setting, dtype, x, y, params):
    """Record one setting in one dtype as a JSON-ready dict."""
    losses, ds, snapshots = optimize(setting, dtype, x, y, params)

    def to_list(value):
        # float32 values are written with 9 significant digits: enough to round-trip exactly.
        digits = 17 if dtype == "float64" else 9
        return [float(f"{v:.{digits}g}") for v in np.ravel(value)]

    record = {
        "name": setting["name"],
        "dtype": dtype,
        "prodigyopt_kwargs": setting["prodigyopt_kwargs"],
        "learning_rates": setting["learning_rates"],
        "loss": to_list(losses),
        "d": to_list(ds),
        "snapshots": {
            step: {name: to_list(weights[name]) for name in PARAM_NAMES}
            for step, weights in snapshots.items()
        },
    }
    if dtype == "float32":
        record["float32_sensitivity"] = float32_sensitivity(
            setting, x, y, params, losses, ds, snapshots
        )
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="path of the JSON file to write")
    args = parser.parse_args()

    # One thread: the float32 reductions then happen in one fixed order on every machine.
    torch.set_num_threads(1)
    x, y, params = make_problem()
    runs = [
        run(setting, dtype, x, y, params)
        for setting in SETTINGS
        for dtype in ("float64", "float32")
    ]
    record = {
        "description": "Prodigy trajectories from prodigyopt; see record_prodigy_reference.py",
        "command": "/work/venv-ref/bin/python tests/reference/record_prodigy_reference.py "
        "--out tests/reference/prodigy_trajectory.json",
        "versions": {
            "torch": torch.__version__,
            "prodigyopt": importlib.metadata.version("prodigyopt"),
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "steps": STEPS,
        "snapshot_every": SNAPSHOT_EVERY,
        "problem": {
            "loss": "mean((tanh(x @ w1 + b1) @ w2 + b2 - y) ** 2)",
            "x": x.tolist(),
            "y": y.tolist(),
            "initial_params": {name: params[name].tolist() for name in PARAM_NAMES},
        },
        "runs": runs,
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        # Compact: the file is regenerated as a whole, never edited, so size beats diffability.
        json.dump(record, handle, separators=(",", ":"))
        handle.write("\n")
    for r in runs:
        print(f"{r['name']:>34} {r['dtype']}: loss {r['loss'][0]:.4f} -> {r['loss'][-1]:.4f}, "
              f"d {r['d'][0]:.3g} -> {r['d'][-1]:.4g}  {r.get('float32_sensitivity', '')}")


if __name__ == "__main__":
    main()
