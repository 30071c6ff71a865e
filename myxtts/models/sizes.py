"""The named model sizes (`model.size` in the config): tiny for tests, small for a CPU demo, base for GPUs.

A size fixes the shape of the network; everything the data decides (vocabulary, mel bands) is
passed to `XTTS` separately, so one size serves any corpus. Parameter counts for 80 mel bands and
a 90-token vocabulary (English phonemes), from `parameter_count`:

    tiny    0.3M   a train step in a fraction of a second on a CPU; for tests only
    small   1.7M   sized to learn the demo corpus in about twelve minutes on two CPU cores
    base   25M     the GPU configuration (FastPitch, a model of this kind, has 45M)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    """One row of `MODEL_SIZES`. Derived values (head size) are computed, not stored."""

    d_model: int  # width of the text encoder, the decoder and the voice latents
    num_heads: int  # attention heads (d_model must be a multiple)
    ff_multiplier: int  # feed-forward hidden width = ff_multiplier * d_model in transformer blocks
    text_conv_blocks: int  # local context of each phoneme (kernel 5)
    text_attention_blocks: int  # sentence-wide context: intonation, a question's rise
    decoder_blocks: int  # conv blocks over mel frames, dilations 1, 2, 4, 1, 2, 4, ...
    decoder_kernel: int  # their kernel size
    conditioning_latents: int  # K: vectors summarising a voice (their mean conditions the model)
    conditioning_layers: int  # bidirectional blocks encoding the reference mel before the perceiver
    aligner_channels: int  # width of the frame classifier that learns the alignment
    aligner_layers: int  # its conv layers (kernel 5): context around each frame
    duration_channels: int  # width of the duration predictor (two conv layers, kernel 3)
    dropout: float  # residual dropout

    @property
    def head_size(self) -> int:
        return self.d_model // self.num_heads

    @property
    def decoder_dilations(self) -> tuple[int, ...]:
        return tuple((1, 2, 4)[i % 3] for i in range(self.decoder_blocks))


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(
        d_model=64, num_heads=2, ff_multiplier=2, text_conv_blocks=1, text_attention_blocks=1, decoder_blocks=2,
        decoder_kernel=5, conditioning_latents=4, conditioning_layers=1, aligner_channels=64, aligner_layers=2,
        duration_channels=64, dropout=0.0,
    ),
    "small": ModelSize(
        d_model=128, num_heads=2, ff_multiplier=2, text_conv_blocks=3, text_attention_blocks=2, decoder_blocks=4,
        decoder_kernel=5, conditioning_latents=8, conditioning_layers=1, aligner_channels=128, aligner_layers=3,
        duration_channels=128, dropout=0.1,
    ),
    "base": ModelSize(
        d_model=384, num_heads=6, ff_multiplier=4, text_conv_blocks=3, text_attention_blocks=4, decoder_blocks=9,
        decoder_kernel=5, conditioning_latents=32, conditioning_layers=2, aligner_channels=256, aligner_layers=3,
        duration_channels=256, dropout=0.1,
    ),
}


def get_size(name: str) -> ModelSize:
    """The `ModelSize` called `name`, or a `ValueError` listing the valid names."""
    try:
        size = MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; model.size must be one of {', '.join(MODEL_SIZES)}") from None
    if size.d_model % size.num_heads:
        raise ValueError(
            f"model size {name!r}: d_model ({size.d_model}) must be a multiple of num_heads ({size.num_heads})"
        )
    return size


def parameter_count(size: str, vocab_size: int, n_mels: int) -> int:
    """Trainable parameters of `XTTS(vocab_size, n_mels, size)`, counted on a built model.

    Building costs a second or so even for `base` and, unlike a formula, cannot drift from the
    model's code.
    """
    import math

    from myxtts.models.xtts import XTTS  # local: xtts imports this module, and TensorFlow

    model = XTTS(vocab_size, n_mels, size)
    model.build()
    return sum(math.prod(v.shape) for v in model.trainable_weights)
