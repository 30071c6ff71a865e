"""The conditioning encoder: a reference clip's log-mel -> a fixed number of voice latents.

    reference_mel [B, R, n_mels], reference_length [B]
      -> two masked 1-D convs (local spectral shape) + sinusoidal positions
      -> `num_layers` bidirectional transformer blocks over the valid frames
      -> perceiver: K learned queries cross-attend to those frames -> [B, K, d]

A fixed K, whatever the reference length, is what lets the decoder prepend the voice as a prefix
of constant size (one compiled shape) and lets several clips of a voice be averaged into one.
Padded reference frames are zeroed before and after every conv and masked as attention keys, so
the latents depend only on the first `reference_length` frames.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from myxtts.models.layers import TransformerBlock, normalize_mel, sinusoidal_positions


class ConditioningEncoder(keras.layers.Layer):
    def __init__(self, d_model: int, num_heads: int, num_latents: int, num_layers: int, ff_multiplier: int = 4,
                 dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_latents = num_latents
        self.num_layers = num_layers
        self.ff_multiplier = ff_multiplier
        self.dropout = dropout
        self.conv_in = keras.layers.Conv1D(d_model, 3, padding="same", activation="gelu", name="conv_in")
        self.conv_out = keras.layers.Conv1D(d_model, 3, padding="same", activation="gelu", name="conv_out")
        self.blocks = [
            TransformerBlock(d_model, num_heads, ff_multiplier, dropout, name=f"block_{i}") for i in range(num_layers)
        ]
        self.perceiver = TransformerBlock(
            d_model, num_heads, ff_multiplier, dropout, cross_attention=True, name="perceiver"
        )
        self.output_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="output_norm")

    def build(self, reference_shape):
        n_mels = reference_shape[-1]
        self.conv_in.build([None, None, n_mels])
        self.conv_out.build([None, None, self.d_model])
        for block in [*self.blocks, self.perceiver]:
            block.build([None, None, self.d_model])
        self.output_norm.build([None, None, self.d_model])
        self.latent_queries = self.add_weight(
            shape=[self.num_latents, self.d_model],
            initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="latent_queries",
        )
        self.built = True

    def call(self, reference_mel, reference_length, training=False):
        frames = tf.shape(reference_mel)[1]
        valid = tf.sequence_mask(reference_length, frames)  # [B, R]
        keep = tf.expand_dims(tf.cast(valid, self.compute_dtype), 2)  # [B, R, 1]
        x = normalize_mel(reference_mel) * keep
        x = self.conv_in(x) * keep  # conv_out must not read conv_in's response to the padding
        # conv_out's own output past the length is left as is: those frames are masked as keys below.
        x = self.conv_out(x)  # [B, R, d]
        x = x + tf.expand_dims(sinusoidal_positions(frames, self.d_model, x.dtype), 0)
        key_mask = tf.expand_dims(valid, 1)  # [B, 1, R]: any query may read every valid frame
        for block in self.blocks:
            x = block(x, attention_mask=key_mask, training=training)
        queries = tf.expand_dims(tf.cast(self.latent_queries, x.dtype), 0)  # [1, K, d]
        queries = tf.tile(queries, [tf.shape(x)[0], 1, 1])  # [B, K, d]
        latents = self.perceiver(queries, context=x, attention_mask=key_mask, training=training)
        return self.output_norm(latents)  # [B, K, d]

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, num_latents=self.num_latents,
                      num_layers=self.num_layers, ff_multiplier=self.ff_multiplier, dropout=self.dropout)
        return config
