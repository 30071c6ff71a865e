"""Why is training slow: graph scans, input/compute timing, GPU sampling and verdicts."""
