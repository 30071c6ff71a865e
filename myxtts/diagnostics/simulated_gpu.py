"""A simulated accelerator: the real input pipeline against a consumer that holds each batch for the
step time the capacity plan predicts for that batch on a given GPU.

    step time = FLOPs of this batch's padded shapes (models/flops.py)
                / (spec-sheet peak x utilization)                 the MFU, capped by the roofline
              + alignment loop iterations x time per iteration    sequential, once per batch

The consumer sleeps for it (`time.sleep`, so it takes no CPU from the pipeline, as a GPU would
not), and the diagnosis times it exactly as it times a real step: input wait, "compiled" step, host.
So `diagnose_gpu_bottleneck.py --simulate-gpu H100` answers, on a machine without that GPU, whether
this host's pipeline would keep it fed, with the same accounting and verdict as a real run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from myxtts.config import Config
from myxtts.diagnostics.calibration import filterbank_bins
from myxtts.diagnostics.timing import CompiledStep
from myxtts.hardware.capacity import LOOP_SOURCE, MFU_SOURCE, STEP_OVERHEAD_S, gpu_facts_for, roofline_utilization
from myxtts.hardware.detect import MachineFacts
from myxtts.hardware.devices import DeviceSpec
from myxtts.hardware.loop_cost import FALLBACK, LoopCost
from myxtts.hardware.plan import RequestedSettings, plan_for_machine
from myxtts.models.flops import alignment_loop_iterations, clip_training_flops


@dataclass(frozen=True)
class SimulatedGpu:
    device: DeviceSpec
    precision: str  # the Keras policy the hardware plan picks for this card
    tf32: bool
    mfu: float
    loop_iteration_s: float
    config: Config  # model size, mel settings, decoder window, checkpointing
    vocab_size: int
    step_overhead_s: float = STEP_OVERHEAD_S  # the fixed cost per step (hardware/capacity.py)
    loop_source: str = LOOP_SOURCE  # where loop_iteration_s comes from

    def step_seconds(self, batch: dict) -> float:
        """The predicted time of one training step on this batch (its padded shapes)."""
        c, t = self.config.data, self.config.training
        clips, tokens = (int(d) for d in batch["tokens"].shape)
        reference = int(batch["reference_mel"].shape[1])
        if "audio" in batch:  # data.mel_on_device: waveforms padded to (frames - 1) * hop samples
            frames, stft = int(batch["audio"].shape[1]) // c.hop_length + 1, (c.n_fft, filterbank_bins(self.config))
        else:
            frames, stft = int(batch["mel"].shape[1]), None
        flops = clip_training_flops(self.config.model.size, frames=frames, tokens=tokens, reference_frames=reference,
                                    n_mels=c.n_mels, vocab_size=self.vocab_size, decoder_window=t.decoder_window,
                                    gradient_checkpointing=t.gradient_checkpointing, stft=stft).scaled(clips)
        peak, _ = self.device.peak_flops(self.precision, self.tf32)
        utilization, _ = roofline_utilization(self.device, peak, flops.intensity, self.precision, self.mfu)
        return (flops.total / (peak * utilization) + alignment_loop_iterations(frames) * self.loop_iteration_s
                + self.step_overhead_s)

    def compiled_step(self) -> CompiledStep:
        """The consumer the diagnosis times: it returns once the batch's predicted time has passed."""

        def run(batch):
            seconds = self.step_seconds(batch)
            time.sleep(seconds)
            return seconds

        return CompiledStep(run=run, finish=lambda seconds: seconds)

    def describe(self) -> dict:
        """The report's `gpu.simulated`: what the consumer stands for, every number with its source."""
        peak, path = self.device.peak_flops(self.precision, self.tf32)
        return {
            "device": self.device.key, "name": self.device.name, "precision": self.precision, "peak_path": path,
            "peak_flops": peak, "memory_bandwidth": self.device.memory_bandwidth,
            "spec_source": f"from spec sheets: {self.device.source}", "mfu": self.mfu, "mfu_source": MFU_SOURCE,
            "loop_iteration_s": self.loop_iteration_s, "loop_source": self.loop_source,
        }


def simulated_gpu(config: Config, device: DeviceSpec, vocab_size: int, mfu: float,
                  loop: LoopCost = FALLBACK) -> SimulatedGpu:
    """The simulated card at the precision the hardware plan picks for it (or `training.precision`),
    its alignment loops costing `loop` per frame."""
    plan = plan_for_machine(MachineFacts(gpus=(gpu_facts_for(device),)), config.model.size,
                            RequestedSettings(precision=config.training.precision or "auto"))
    return SimulatedGpu(device, plan.precision, plan.tf32, mfu, loop.seconds_per_frame, config, vocab_size,
                        loop_source=loop.source)
