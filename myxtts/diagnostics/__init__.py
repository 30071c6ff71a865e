"""Why is training slow: graph scans, input/compute timing, GPU sampling and verdicts.

    graph_scan.py        Python-calling ops in a tf.data graph
    static_checks.py     what can be seen before running: Python ops and where they sit, settings, cores, disk
    training_setup.py    the run, model, optimizer and compiled step of a config, built as train() builds them
    timing.py            input pipeline alone, step alone, and training split into input wait / step / host
    gpu_sampler.py       NVML utilization sampling thread; mean, percentiles, oscillation score
    verdict.py           input-, host-overhead-, memory- or compute-bound, and ranked config changes
    bottleneck.py        `diagnose(dataset, step, ...)`: all of the above into one report
    report_schema.py     the JSON report's schema, every field documented
    report.py            the report as a table
    config_patch.py      --apply: a patched copy of the YAML config
    timeline_plot.py     --plot: GPU utilization and per-step input wait over time
    profile_trace.py     a TensorBoard profiler trace of N steps
    calibration.py       the host's input rate per route (on the fly, cached, mel_on_device), per core, cached
    capacity.py          the capacity plan of a config on its corpus, for one or more GPUs
    simulated_gpu.py     --simulate-gpu: a consumer that sleeps each batch's predicted step time
"""
