"""`--plot`: a PNG timeline of GPU utilization (when sampled) above the per-step input wait.

All panels share the time axis (seconds from the first measured step), so a dip in utilization
lines up with the step that waited for its batch:

* GPU utilization (only when NVML sampled a GPU), with the 30% line;
* input wait as a share of each step, one bar per step as wide as the step, with the profiler's
  5% and 20% thresholds;
* each step's input wait and compiled-step time in ms (log scale); steps that compiled are marked.
"""

from __future__ import annotations

import os


def plot_timeline(report: dict, path: str | os.PathLike) -> None:
    # Imported here, with the file-only backend, so the package imports without matplotlib and no
    # display is ever needed.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = report["measurements"]["training"]["per_step"]
    gpu = report["gpu"]
    origin = steps[0]["start_s"] if steps else 0.0
    with_gpu = bool(gpu["available"] and gpu["series"])
    panels = 3 if with_gpu else 2
    figure, axes = pyplot.subplots(panels, 1, figsize=(11, 2.6 * panels + 0.6), sharex=True)
    if with_gpu:
        times, values = zip(*gpu["series"])
        axes[0].step(times, values, where="post", color="tab:green", linewidth=1)
        axes[0].axhline(30, color="grey", linestyle=":", linewidth=0.8)
        axes[0].set_ylim(0, 105)
        axes[0].set_ylabel("GPU utilization %")
        axes[0].set_title(f"{gpu['device']} ({gpu['source'].replace('_', ' ')})", fontsize="medium")

    starts = [s["start_s"] - origin for s in steps]
    totals = [s["input_wait_ms"] + s["compiled_ms"] + s["host_ms"] for s in steps]
    shares = [100 * s["input_wait_ms"] / total if total else 0.0 for s, total in zip(steps, totals)]
    share_axis = axes[-2]
    share_axis.bar(starts, shares, [max(t / 1e3, 1e-3) for t in totals], align="edge", color="tab:red",
                   edgecolor="white", linewidth=0.3)
    for threshold, label in ((5, "5% moderately"), (20, "20% highly input-bound")):
        share_axis.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
        share_axis.text(0, threshold, f" {label}", fontsize="x-small", va="bottom", color="grey")
    share_axis.set_ylim(0, 100)
    share_axis.set_ylabel("input wait\n% of step")

    ms_axis = axes[-1]
    ms_axis.plot(starts, [max(s["compiled_ms"], 1e-3) for s in steps], "o-", color="tab:blue", markersize=3,
                 linewidth=0.8, label="compiled step")
    ms_axis.plot(starts, [max(s["input_wait_ms"], 1e-3) for s in steps], "o-", color="tab:red", markersize=3,
                 linewidth=0.8, label="input wait")
    compiled = [(x, s["compiled_ms"]) for x, s in zip(starts, steps) if s["compile"]]
    if compiled:
        ms_axis.plot(*zip(*compiled), "x", color="black", markersize=8, label="step compiled (not counted)")
    ms_axis.set_yscale("log")
    ms_axis.set_ylabel("ms")
    ms_axis.set_xlabel("seconds since the first measured step")
    ms_axis.legend(loc="upper right", fontsize="small")

    verdict = report["verdict"]
    share = report["measurements"]["training"]["input_share"]
    figure.suptitle(f"{verdict['kind']}: input wait {share:.0%} of step time")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
