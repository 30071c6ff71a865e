"""TensorFlow and GPU memory: take it as needed, and measure what was really used.

By default TensorFlow reserves nearly all of a GPU's memory when its runtime starts, so NVML then
reports the card as full whatever the model needs. Two consequences this module exists for:

* `allow_memory_growth` makes TensorFlow allocate as the run needs. Training and the diagnosis
  both call it before any GPU work (it must precede the runtime's start), so other processes (the
  batch probe, a second run, the desktop) keep their memory.
* `TensorFlowPeakMemory` reads TensorFlow's own allocator peak (`get_memory_info(device)["peak"]`,
  reset with `reset_memory_stats`): the bytes the steps really held at most, unlike NVML's used
  memory, which counts what the allocator reserved (with growth off, the whole card).

TensorFlow is imported inside the functions: `python -m myxtts.hardware` runs without it.
"""

from __future__ import annotations

from typing import Any, Callable


def _tf_config(config: Any | None) -> Any:
    if config is not None:
        return config
    import tensorflow as tf

    return tf.config


def allow_memory_growth(echo: Callable[[str], None] = print, *, tf_config: Any | None = None) -> int:
    """Turns memory growth on for every GPU TensorFlow lists; returns how many it was set for.

    Listing devices does not start the runtime, so this must come before anything that does (a
    tensor, a model, a dataset iterated on a GPU). A runtime already started in this process (a
    second `train()`) keeps its setting, which is reported through `echo`. `tf_config` stands in
    for `tf.config` in tests.
    """
    config = _tf_config(tf_config)
    changed = 0
    for gpu in config.list_physical_devices("GPU"):
        try:
            config.experimental.set_memory_growth(gpu, True)
            changed += 1
        except RuntimeError as error:  # the runtime already started in this process
            echo(f"note: GPU memory growth not changed for {gpu.name}: {error}")
    return changed


class TensorFlowPeakMemory:
    """TensorFlow's allocator peak on one device, between `reset()` and `peak_bytes()`.

    `device` is TensorFlow's name, e.g. "GPU:0" (the first GPU CUDA exposes). `tf_config` stands in
    for `tf.config` in tests.
    """

    def __init__(self, device: str = "GPU:0", *, tf_config: Any | None = None):
        self.device = device
        self._config = tf_config

    def reset(self) -> None:
        _tf_config(self._config).experimental.reset_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(_tf_config(self._config).experimental.get_memory_info(self.device)["peak"])
