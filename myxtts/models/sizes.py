"""The named model sizes (`model.size` in the config): tiny for tests, small for a CPU demo, base for GPUs.

A size fixes the shape of the network; everything the data decides (vocabulary, mel bands, the
longest text and mel a bucket can hold) is passed to `XTTS` separately, so one size serves any
corpus. Parameter counts for 80 mel bands, a 40-token vocabulary and the default maximum lengths
(320 tokens, 1040 frames), from `parameter_count`:

    tiny    0.35M  a train step in a fraction of a second on a CPU; for tests only
    small   3.4M   sized to learn the demo corpus in about eight minutes on two CPU cores
    base   104.5M  the GPU configuration: 12 blocks of width 768, about GPT-2 small
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    """One row of `MODEL_SIZES`. Derived values (head size, mel positions) are computed by the model."""

    d_model: int  # width of every transformer in the model
    num_layers: int  # causal decoder blocks
    num_heads: int  # attention heads (d_model must be a multiple)
    ff_multiplier: int  # feed-forward hidden width = ff_multiplier * d_model
    conditioning_latents: int  # K: vectors summarising a voice, prepended to the decoder's sequence
    conditioning_layers: int  # bidirectional blocks encoding the reference mel before the perceiver
    # r: mel frames predicted per decoder position; must divide 8. A larger r makes copying the
    # previous group a worse guess, so the decoder leans on the text sooner: on the demo, r = 8
    # ended 24 of 24 validation sentences within 2x of their length after 300 updates, r = 4 only
    # 11 (BENCHMARKS.md), at a higher teacher-forced mel loss (2.11 against 1.60).
    reduction_factor: int
    postnet: bool  # a residual stack of 1-D convs refining the predicted mel
    dropout: float  # residual and feed-forward dropout
    # Dropout on the previous frames fed back into the decoder, during training only. Regression
    # with teacher forcing otherwise learns to copy the previous frame; hiding part of it forces
    # the decoder to rely on the text (Tacotron's prenet dropout, for the same reason).
    prenet_dropout: float

    @property
    def head_size(self) -> int:
        return self.d_model // self.num_heads

    @property
    def postnet_channels(self) -> int:
        # Half the model width: the postnet runs at the full frame rate, r times as many steps as
        # the decoder, so at full width its convolutions would cost as much as several blocks.
        return max(self.d_model // 2, 32)


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(
        d_model=64, num_layers=2, num_heads=2, ff_multiplier=4, conditioning_latents=4, conditioning_layers=1,
        reduction_factor=4, postnet=True, dropout=0.0, prenet_dropout=0.0,
    ),
    "small": ModelSize(
        d_model=192, num_layers=4, num_heads=3, ff_multiplier=4, conditioning_latents=16, conditioning_layers=1,
        reduction_factor=8, postnet=True, dropout=0.1, prenet_dropout=0.3,
    ),
    "base": ModelSize(
        d_model=768, num_layers=12, num_heads=12, ff_multiplier=4, conditioning_latents=32, conditioning_layers=1,
        reduction_factor=2, postnet=True, dropout=0.1, prenet_dropout=0.3,
    ),
}


def get_size(name: str) -> ModelSize:
    """The `ModelSize` called `name`, or a `ValueError` listing the valid names."""
    try:
        size = MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; model.size must be one of {', '.join(MODEL_SIZES)}") from None
    _check(name, size)
    return size


def _check(name: str, size: ModelSize) -> None:
    if size.d_model % size.num_heads:
        raise ValueError(
            f"model size {name!r}: d_model ({size.d_model}) must be a multiple of num_heads ({size.num_heads})"
        )
    # Buckets pad mel lengths to multiples of 8 (DataConfig.bucket_mel_lengths), so an r dividing 8
    # means a bucket's frames always fill whole decoder positions and no extra padding shape appears.
    if size.reduction_factor not in (1, 2, 4, 8):
        raise ValueError(
            f"model size {name!r}: reduction_factor must divide 8 (1, 2, 4 or 8), got {size.reduction_factor}"
        )


def parameter_count(
    size: str, vocab_size: int, n_mels: int, max_text_length: int = 320, max_mel_frames: int = 1040
) -> int:
    """Trainable parameters of `XTTS(vocab_size, n_mels, size, ...)`, counted on a built model.

    Building costs a second or so even for `base` and, unlike a formula, cannot drift from the
    model's code.
    """
    import math

    from myxtts.models.xtts import XTTS  # local: xtts imports this module, and TensorFlow

    model = XTTS(vocab_size, n_mels, size, max_text_length=max_text_length, max_mel_frames=max_mel_frames)
    model.build()
    return sum(math.prod(v.shape) for v in model.trainable_weights)
