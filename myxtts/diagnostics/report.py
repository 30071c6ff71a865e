"""The diagnosis as a readable table: static checks, the three measurements, the GPU, verdict, fixes.

Reads only the report dict (`report_schema` documents it), so a saved `--json` report can be
printed again with `format_report(json.load(...))`.
"""

from __future__ import annotations

_GIB = 2**30


def _ms(value) -> str:
    return "-" if value is None else f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _rate(value, unit: str) -> str:
    return "-" if value is None else f"{value:,.2f} {unit}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _rows(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(label) for label, _ in rows)
    return [f"{indent}{label:<{width}}  {value}" for label, value in rows]


def _plan_note(machine: dict) -> str:
    plan = machine.get("input_plan")
    return f"; the capacity plan gives this machine {plan['num_workers']} ({plan['source']})" if plan else ""


def _static_lines(report: dict) -> list[str]:
    static, settings = report["static"], report["static"]["settings"]
    if static["python_ops"]:
        python = "; ".join(f"{op['op']} '{op['node']}' in {op['stage']} [{op['dataset_node']}]"
                           for op in static["python_ops"])
    elif static["graph"] is None:
        python = "not scanned (graph not serializable)"
    else:
        python = "none (no PyFunc, EagerPyFunc or generator ops)"
    prefetch = "autotune" if not settings["prefetch_buffer_size"] else f"{settings['prefetch_buffer_size']} batches"
    prefetch += f", to GPU {'on' if settings['prefetch_to_gpu_active'] else 'off'}"
    if settings["prefetch_to_gpu"] and not settings["prefetch_to_gpu_active"]:
        prefetch += " (configured, but no GPU)"
    cache = "off" if not settings["cache_features"] else (
        f"on, on disk in {settings['cache_dir']}" if settings["cache_dir"] else "on, in memory")
    throughput = static["read_throughput"]
    read = "no audio files" if throughput is None else (
        f"{throughput['mb_per_s']:,.0f} MB/s ({throughput['files']} of {throughput['files_total']} files, "
        f"{throughput['bytes'] / 1e6:,.1f} MB in {throughput['seconds']:.2f} s; page cache may flatter it)")
    rows = [
        ("Python in the input pipeline", python),
        ("graph mode / XLA", f"{_on(settings['graph_mode'])} / {_on(settings['xla'])}"),
        ("precision", f"{settings['precision']} -> Keras policy {settings['dtype_policy']}"),
        ("prefetch", prefetch),
        ("feature cache", cache),
        ("log-mel computed", "in the compiled step (data.mel_on_device)" if settings["mel_on_device"] else "in the input pipeline"),
        ("bucketing", f"on, {settings['bucket_count']} buckets" if settings["bucketing"] else "off (pad to each batch's longest)"),
        ("batch x accumulation, steps/call", f"{settings['batch_size']} x {settings['gradient_accumulation_steps']}, "
                                              f"{settings['steps_per_execution']}"),
        ("CPU cores vs data.num_workers", static["cpu"]["note"] + _plan_note(report["machine"])),
        ("read throughput", read),
    ]
    lines = ["Static checks"] + _rows(rows)
    lines += [f"  ! {finding}" for finding in static["findings"]]
    return lines


def _measurement_lines(report: dict) -> list[str]:
    m = report["measurements"]
    pipeline, alone, training, pre = m["input_pipeline"], m["step_alone"], m["training"], m["precompile"]
    signal = next((f"{key} {alone['batch_shape'][key]}" for key in ("mel", "audio") if key in alone["batch_shape"]), "")
    rows = [
        ("(a) input pipeline alone", f"{_rate(pipeline['batches_per_s'], 'batches/s')}   p50 {_ms(pipeline['p50_ms'])}"
                                     f"   p95 {_ms(pipeline['p95_ms'])}   (first batch, with start-up: {_ms(pipeline['first_batch_ms'])})"),
        ("(b) train step alone", f"{_rate(alone['steps_per_s'], 'steps/s')}   p50 {_ms(alone['p50_ms'])}"
                                 f"   p95 {_ms(alone['p95_ms'])}   ({alone['steps']} steps on one batch, {signal})"),
        ("(c) real training", f"{_rate(training['steps_per_s'], 'steps/s')}   over {training['steady_steps']} steps"
                              f" ({training['compile_steps']} compiling steps left out)"),
    ]
    loops = m.get("alignment_loops")
    if loops:
        how = ("in the XLA-compiled step" if loops["jit_compile"] else
               "each loop compiled alone" if loops["compiled"] else "graph mode")
        share = "-" if loops["share_of_step"] is None else f"{loops['share_of_step']:.0%}"
        rows.insert(2, ("    its alignment loops alone", f"{_ms(loops['median_ms'])} median of {loops['runs']}, {share} of "
                                                        f"the step alone ({loops['frames']} frames, "
                                                        f"{loops['frames_per_iteration']} per iteration, "
                                                        f"{loops['iterations']} iterations; {how})"))
    split = m.get("step_profile")
    if split:
        at = 3 if loops else 2
        if "note" in split:
            rows.insert(at, ("    its profile", split["note"]))
        else:
            shares = split["shares"]
            rows.insert(at, ("    its profile", f"{_ms(split['busy_ms'])} of {split['source']} per step: alignment loops "
                                              f"{shares['loops']:.0%}, matmuls {shares['matmuls']:.0%}, other "
                                              f"{shares['other']:.0%}; {split['host_ops']:,.0f} TensorFlow ops run by the "
                                              f"host  (TensorFlow profiler, {split['steps']} steps)"))
    larger = m.get("larger_batch")
    if larger:
        at = next(i for i, row in enumerate(rows) if row[0].startswith("(c)"))
        found = (larger["note"] if larger.get("samples_per_s_gain") is None else
                 f"p50 {_ms(larger['p50_ms'])}   {larger['samples_per_s_gain']:.2f}x the samples/s of (b)")
        rows.insert(at, (f"    twice the batch ({larger['batch']})", found))
    if pre["shapes"]:
        rows.insert(1, ("compiling before timing", f"{pre['shapes']} batch shape(s) met in (a), {pre['seconds']:.1f} s "
                                                   "(a training run pays this once per shape)"))
    lines = ["Measurements"] + _rows(rows)
    lines.append(f"      {'(c) per step':<24}{'mean':>10}{'p50':>10}{'p95':>10}{'share':>8}")
    for label, key in (("input wait (next batch)", "input_wait"), ("compiled step", "compiled_step"),
                       ("host, everything else", "host_other")):
        part = training[key]
        lines.append(f"      {label:<24}{_ms(part['mean_ms']):>10}{_ms(part['p50_ms']):>10}{_ms(part['p95_ms']):>10}"
                     f"{part['share']:>8.1%}")
    return lines


def _gpu_lines(report: dict) -> list[str]:
    gpu = report["gpu"]
    simulated = gpu.get("simulated")
    if simulated:
        return [f"GPU: simulated {simulated['name']} ({simulated['device']}): each batch held for its predicted step "
                "time, FLOPs of its padded shapes (models/flops.py) / (peak x MFU) + the alignment loops",
                f"  peak: {simulated['peak_path']} {simulated['peak_flops'] / 1e12:,.1f} TFLOP/s dense, "
                f"{simulated['memory_bandwidth'] / 1e9:,.0f} GB/s  [{simulated['spec_source']}]",
                f"  {simulated['mfu']:.0%} MFU  [{simulated['mfu_source']}]",
                f"  {simulated['loop_iteration_s'] * 1e6:.0f} us per alignment loop iteration  [{simulated['loop_source']}]"]
    if not gpu["available"]:
        return [f"GPU: {gpu['note'] or 'not sampled'}"]
    lines = [f"GPU: {gpu['device']}, {gpu['samples']} samples ({gpu['source'].replace('_', ' ')})"]
    utilization, oscillation = gpu["utilization"], gpu["oscillation"]
    if utilization:
        lines.append(f"  utilization mean {utilization['mean']:.0f}%  p10 {utilization['p10']:.0f}%  "
                     f"p90 {utilization['p90']:.0f}%  below 30% for {utilization['below_30_share']:.0%} of the time")
    if oscillation:
        period = f", period {oscillation['period_s']:.2f} s" if oscillation["period_s"] else ""
        lines.append(f"  oscillation score {oscillation['score']:.2f}{period} (0 steady or idle, near 1 a regular swing)")
    if gpu["memory_total_bytes"]:
        total = gpu["memory_total_bytes"] / _GIB
        peak = gpu.get("tensorflow_peak_bytes")
        held = "TensorFlow's peak not measured" if peak is None else f"TensorFlow's peak {peak / _GIB:.1f} of {total:.1f} GiB"
        reserved = "" if gpu["memory_used_bytes"] is None else \
            f" (NVML: {gpu['memory_used_bytes'] / _GIB:.1f} GiB in use, reserved by TensorFlow and other processes)"
        lines.append(f"  memory: {held}{reserved}; controller busy {gpu['memory_controller_mean'] or 0:.0f}%")
    if gpu["idle_reason_share"] is not None:
        lines.append(f"  'GPU idle' clock reason set in {gpu['idle_reason_share']:.0%} of reads")
    if gpu["note"]:
        lines.append(f"  ! {gpu['note']}")
    return lines


def format_report(report: dict) -> str:
    config = report["config"]
    source = config["path"] or "defaults"
    if config["overrides"]:
        source += " with " + ", ".join(config["overrides"])
    machine = report["machine"]
    gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
    lines = [f"Bottleneck diagnosis: {source}", f"Machine: {machine['usable_cpu_cores']} usable CPU cores; {gpus}", ""]
    lines += _static_lines(report) + [""] + _measurement_lines(report) + [""] + _gpu_lines(report) + [""]
    verdict = report["verdict"]
    lines.append(f"Verdict: {verdict['kind'].upper()}")
    lines += [f"  - {reason}" for reason in verdict["reasons"]]
    lines.append("")
    if report["recommendations"]:
        lines.append("Recommendations (most effective first; --apply writes the config keys into a copy)")
        for item in report["recommendations"]:
            lines.append(f"  {item['rank']}. {item['change']}")
            lines.append(f"     {item['reason']}")
    else:
        lines.append("Recommendations: none; no config key would move this bottleneck")
    return "\n".join(lines)
