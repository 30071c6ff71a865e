"""XTTS: a decoder-only transformer that continues a voice prompt and a text with mel frames.

One causal transformer reads a single sequence

    [ K conditioning latents | L text tokens | P mel positions ]      P = ceil(T / r)

where the latents summarise a reference clip of the voice (`ConditioningEncoder`), and mel
position p holds the r frames of group p - 1 (a learned start vector at p = 0), so that its
output predicts group p: frames p*r .. p*r + r - 1. Heads on the final hidden states give

    text_logits  [B, L, V]        position t predicts token t + 1 (an auxiliary "text loss")
    mel_before   [B, T, n_mels]   the decoder's regression of the log-mel, r frames per position
    mel_after    [B, T, n_mels]   mel_before plus the postnet's residual (== mel_before without one)
    stop_logits  [B, T]           "this frame is the last one"

Masks: causal over the whole sequence, and padded text tokens are hidden as keys, so no real
position ever reads padding. Mel padding needs no key mask: it comes after every real mel
position, which causality already hides. Text and mel positions count from 0 within their own
segment, so the amount of text padding does not move the mel positions either.

Besides its learned position, each mel position gets a code of its progress through the text
(`layers.progress_code`: frames so far per text token). A speaker's sentences end near the same
value, so the decoder can tell it is near the end without first learning to align with the text.

The batch dict is the pipeline's (`myxtts.data.pipeline`); shapes are static per bucket, so an
XLA-compiled step sees one program per bucket. Outputs are float32 whatever the dtype policy.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from myxtts.models.conditioning_encoder import ConditioningEncoder
from myxtts.models.layers import (
    MEL_SCALE, PROGRESS_FEATURES, MelPrenet, Postnet, TransformerBlock, denormalize_mel, normalize_mel, progress_code,
    sinusoidal_code,
)
from myxtts.models.sizes import get_size

_STOP_PRIOR_LOGIT = -4.0


@keras.saving.register_keras_serializable(package="myxtts")
class XTTS(keras.Model):
    """The network. `size` names a row of `MODEL_SIZES`; `max_text_length` and `max_mel_frames`
    size the position tables and must cover the longest bucket (the trainer passes the last of
    `data.bucket_text_lengths` and `data.bucket_mel_lengths`)."""

    def __init__(self, vocab_size: int, n_mels: int, size: str = "small", max_text_length: int = 320,
                 max_mel_frames: int = 1040, gradient_checkpointing: bool = False, frames_per_token: float = 5.0,
                 **kwargs):
        super().__init__(**kwargs)
        spec = get_size(size)
        self.vocab_size = vocab_size
        self.n_mels = n_mels
        self.size = size
        self.max_text_length = max_text_length
        self.max_mel_frames = max_mel_frames
        # Recompute each transformer block's activations in the backward pass instead of keeping
        # them: about a block's forward pass more compute for much less activation memory. The
        # gradients are those of the plain pass, dropout included (tests/test_model.py).
        self.gradient_checkpointing = gradient_checkpointing
        # The slope of the alignment prior (`model.frames_per_token`): mel frames per text token
        # (characters and the BOS/EOS marks). The demo corpus has 4.6 (4.1-5.4 from the 5th to the
        # 95th percentile), read English 5-6. A corpus 20% off tilts the prior's diagonal, which
        # attention then corrects by content.
        self.frames_per_token = frames_per_token
        self.spec = spec
        self.reduction_factor = spec.reduction_factor
        self.max_mel_positions = math.ceil(max_mel_frames / spec.reduction_factor)
        d = spec.d_model

        self.conditioning_encoder = ConditioningEncoder(
            d, spec.num_heads, spec.conditioning_latents, spec.conditioning_layers, spec.ff_multiplier, spec.dropout,
            name="conditioning_encoder",
        )
        self.text_embedding = keras.layers.Embedding(vocab_size, d, name="text_embedding")
        self.text_positions = keras.layers.Embedding(max_text_length, d, name="text_positions")
        self.mel_prenet = MelPrenet(d, spec.reduction_factor * n_mels, spec.prenet_dropout, name="mel_prenet")
        self.mel_positions = keras.layers.Embedding(self.max_mel_positions, d, name="mel_positions")
        self.mel_progress = keras.layers.Dense(d, use_bias=False, name="mel_progress")
        self.blocks = [
            TransformerBlock(d, spec.num_heads, spec.ff_multiplier, spec.dropout, name=f"block_{i}")
            for i in range(spec.num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")
        # Heads in float32: logits and regressions feed the losses, and float16 logits lose the
        # small differences the softmax and sigmoid care about.
        self.text_head = keras.layers.Dense(vocab_size, dtype="float32", name="text_head")
        self.mel_head = keras.layers.Dense(spec.reduction_factor * n_mels, dtype="float32", name="mel_head")
        # Stop logits start at the prior of the (positive-weighted) target, about 5 stops in 300
        # frames, instead of p = 0.5 everywhere: the first steps then learn speech, not "don't stop".
        self.stop_head = keras.layers.Dense(
            spec.reduction_factor,
            dtype="float32",
            bias_initializer=keras.initializers.Constant(_STOP_PRIOR_LOGIT),
            name="stop_head",
        )
        self.postnet = (
            Postnet(n_mels, spec.postnet_channels, dropout=spec.dropout, name="postnet") if spec.postnet else None
        )

    def build(self, input_shape=None):
        d, r = self.spec.d_model, self.reduction_factor
        self.conditioning_encoder.build([None, None, self.n_mels])
        for layer in (self.text_embedding, self.text_positions, self.mel_positions):
            layer.build([None])
        self.mel_prenet.build([None, None, r * self.n_mels])
        self.mel_progress.build([None, None, PROGRESS_FEATURES])
        # Starts the alignment code at about the norm of an initial token embedding.
        self.alignment_scale = self.add_weight(
            shape=[], initializer=keras.initializers.Constant(0.05), name="alignment_scale"
        )
        for block in self.blocks:
            block.build([None, None, d])
        for layer in (self.final_norm, self.text_head, self.mel_head, self.stop_head):
            layer.build([None, None, d])
        if self.postnet is not None:
            self.postnet.build([None, None, self.n_mels])
        self.built = True

    # ----------------------------------------------------------------------------------------------

    def call(self, batch, training=False):
        latents = self.conditioning_latents(batch["reference_mel"], batch["reference_length"], training=training)
        outputs = self.decode(latents, batch["tokens"], batch["text_length"], batch["mel"], training=training)
        outputs["mel_after"] = self.refine(outputs["mel_before"], batch["mel_length"], training=training)
        return outputs

    def conditioning_latents(self, reference_mel, reference_length, training=False, average=False):
        """Voice latents [B, K, d] of reference clips [B, R, n_mels] (valid up to `reference_length`).

        `average=True` treats the B clips as one voice and returns the mean of their latents,
        [1, K, d]: several short clips of a speaker make a steadier voice than any one of them.
        """
        latents = self.conditioning_encoder(reference_mel, reference_length, training=training)
        if average:
            latents = tf.reduce_mean(latents, axis=0, keepdims=True)
        return latents

    def decode(self, latents, tokens, text_length, mel, training=False):
        """The causal pass: text logits, mel_before and stop logits, teacher-forced on `mel`.

        latents [B, K, d] (or [1, K, d], shared by the batch), tokens [B, L], text_length [B],
        mel [B, T, n_mels] float (only frames before each predicted group are read). Returns a
        dict without `mel_after` (see `refine`); `inference.generate` calls this once per step.
        """
        tokens = tf.convert_to_tensor(tokens)
        mel = tf.convert_to_tensor(mel)
        r, n_mels = self.reduction_factor, self.n_mels
        batch = tf.shape(tokens)[0]
        text_len, frames = _length(tokens, 1), _length(mel, 1)
        self._check_lengths(tokens.shape[1], mel.shape[1])
        positions = -(-frames // r)  # P = ceil(T / r); buckets make T a multiple of 8, so of r
        num_latents = latents.shape[1]
        dtype = self.compute_dtype

        latents = tf.cast(latents, dtype)
        latents = tf.broadcast_to(latents, tf.stack([batch, num_latents, tf.shape(latents)[2]]))
        # The alignment prior: token n and the mel position expected to speak it, at frame
        # n * frames_per_token, get the same sinusoidal code, so attention can find the
        # text being spoken by position before it has learned to by content.
        d = self.spec.d_model
        token_code = sinusoidal_code(tf.cast(tf.range(text_len), tf.float32), d)  # [L, d]
        spoken_token = tf.cast(tf.range(positions) * r, tf.float32) / self.frames_per_token
        mel_code = sinusoidal_code(spoken_token, d)  # [P, d]
        scale = tf.cast(self.alignment_scale, dtype)
        text = (self.text_embedding(tokens) + self.text_positions(tf.range(text_len))[None]
                + scale * tf.cast(token_code, dtype)[None])  # [B, L, d]
        padded_mel = tf.pad(normalize_mel(tf.cast(mel, dtype)), [[0, 0], [0, positions * r - frames], [0, 0]])
        groups = tf.reshape(padded_mel, tf.stack([batch, positions, r * n_mels]))  # [B, P, r * n_mels]
        mel_inputs = (
            self.mel_prenet(groups, training=training)
            + self.mel_positions(tf.range(positions))[None]
            + self.mel_progress(tf.cast(progress_code(positions, r, text_length), dtype))
            + scale * tf.cast(mel_code, dtype)[None]
        )
        x = tf.concat([latents, tf.cast(text, dtype), tf.cast(mel_inputs, dtype)], axis=1)  # [B, K + L + P, d]

        attention_mask = _attention_mask(num_latents, text_length, text_len, positions)
        for block in self.blocks:
            # The dropout seed is drawn here, outside the recomputed function: drawn inside it, the
            # recomputation would advance the generator and drop other units than the forward pass.
            seed = block.draw_dropout_seed() if training and self.spec.dropout > 0.0 else None
            if self.gradient_checkpointing and training:
                x = keras.remat(
                    lambda h, block=block, seed=seed: block(
                        h, attention_mask=attention_mask, training=training, dropout_seed=seed
                    )
                )(x)
            else:
                x = block(x, attention_mask=attention_mask, training=training, dropout_seed=seed)
        x = self.final_norm(x)

        text_hidden = x[:, num_latents : num_latents + text_len]  # [B, L, d]
        mel_hidden = x[:, num_latents + text_len :]  # [B, P, d]
        mel_before = tf.reshape(self.mel_head(mel_hidden), tf.stack([batch, positions * r, n_mels]))
        stop_logits = tf.reshape(self.stop_head(mel_hidden), tf.stack([batch, positions * r]))
        return {
            "text_logits": self.text_head(text_hidden),  # [B, L, V] float32
            "mel_before": denormalize_mel(mel_before[:, :frames]),  # [B, T, n_mels] float32
            "stop_logits": stop_logits[:, :frames],  # [B, T] float32
        }

    def refine(self, mel_before, mel_length, training=False):
        """mel_after: mel_before plus the postnet's correction, reading only frames < mel_length.

        The postnet's loss does not flow back into the decoder (stop_gradient): mel_before is what
        synthesis feeds back, so the decoder is trained on its own L1 alone rather than also
        towards whatever input suits the postnet. It also skips the convolutions' input gradient,
        about a quarter of a small model's CPU step at the longest bucket.
        """
        if self.postnet is None:
            return mel_before
        valid = tf.sequence_mask(mel_length, tf.shape(mel_before)[1])  # [B, T]
        postnet_input = tf.cast(normalize_mel(tf.stop_gradient(mel_before)), self.compute_dtype)
        correction = self.postnet(postnet_input, valid, training=training)
        # The correction is in normalised units [B, T, n_mels] float32; scale it back to log-mel.
        return mel_before + correction * MEL_SCALE

    def _check_lengths(self, text_len, frames):
        """Fail loudly instead of letting XLA clamp an out-of-range position embedding lookup."""
        if text_len is not None and text_len > self.max_text_length:
            raise ValueError(
                f"text of {text_len} tokens exceeds max_text_length={self.max_text_length}; build XTTS with a larger "
                "max_text_length (the trainer uses the last of data.bucket_text_lengths)"
            )
        if frames is not None and frames > self.max_mel_frames:
            raise ValueError(
                f"mel of {frames} frames exceeds max_mel_frames={self.max_mel_frames}; build XTTS with a larger "
                "max_mel_frames (the trainer uses the last of data.bucket_mel_lengths)"
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            n_mels=self.n_mels,
            size=self.size,
            max_text_length=self.max_text_length,
            max_mel_frames=self.max_mel_frames,
            gradient_checkpointing=self.gradient_checkpointing,
            frames_per_token=self.frames_per_token,
        )
        return config


def _length(x, axis: int):
    """A static length when known (XLA, bucketed batches), else the dynamic one."""
    static = x.shape[axis]
    return static if static is not None else tf.shape(x)[axis]


def _attention_mask(num_latents: int, text_length, text_len, positions) -> tf.Tensor:
    """[B, S, S] boolean: causal, minus padded text keys. Latents stay visible to every row, so no
    row is fully masked (a fully masked softmax would average over padding)."""
    batch = tf.shape(text_length)[0]
    total = num_latents + text_len + positions
    key_valid = tf.concat(
        [
            tf.ones(tf.stack([batch, num_latents]), tf.bool),
            tf.sequence_mask(text_length, text_len),
            tf.ones(tf.stack([batch, positions]), tf.bool),
        ],
        axis=1,
    )  # [B, S]
    causal = tf.cast(tf.linalg.band_part(tf.ones(tf.stack([total, total])), -1, 0), tf.bool)  # [S, S] lower triangle
    return tf.logical_and(causal[None], key_valid[:, None, :])


def network_for(config, vocab_size: int) -> XTTS:
    """The network a run's config describes: its size, its mel bands, and room for the largest
    bucket's text and mel lengths. Training, synthesis and the tools all build it through here."""
    d = config.data
    return XTTS(vocab_size=vocab_size, n_mels=d.n_mels, size=config.model.size,
                max_text_length=d.bucket_text_lengths[-1], max_mel_frames=d.bucket_mel_lengths[-1],
                gradient_checkpointing=config.training.gradient_checkpointing,
                frames_per_token=config.model.frames_per_token)
