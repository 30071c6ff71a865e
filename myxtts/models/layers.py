"""The pieces the model is built from: attention, a pre-norm transformer block, a masked conv block.

All layers compute in the layer's dtype policy (bfloat16 or float16 under mixed precision) except
the attention softmax, which runs in float32: its large negative mask values and the exponentials
overflow float16. Masks are boolean, `True` where attention is allowed.

Log-mel features are standardised on the way in and out of the network with fixed constants
(`normalize_mel`), so activations start near unit scale without a statistics pass over the corpus.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

# Log-mel values run from log(data.log_floor) = -11.5 in silence to about +2 in loud speech; this
# centre and spread map that range to roughly [-2, 2]. Constants, not learned: the mel head then
# starts out predicting the middle of the range, and the input scale cannot drift during training.
MEL_CENTER = -5.0
MEL_SCALE = 3.0

# Added to masked-out attention scores in float32: exp() of it underflows to exactly 0, so a
# masked key contributes nothing (the padding-invariance tests rely on that exactness).
_MASKED_SCORE = -1e9


def normalize_mel(log_mel):
    return (log_mel - MEL_CENTER) / MEL_SCALE


def denormalize_mel(normalized):
    return normalized * MEL_SCALE + MEL_CENTER


def sinusoidal_positions(length, depth: int, dtype) -> tf.Tensor:
    """The transformer's fixed sine/cosine position code: [length, depth] in `dtype`."""
    return tf.cast(sinusoidal_code(tf.cast(tf.range(length), tf.float32), depth), dtype)


def sinusoidal_code(positions, depth: int) -> tf.Tensor:
    """The sine/cosine code of float `positions` [...]: [..., depth] float32. Fractional positions
    are allowed; codes of nearby positions have large dot products, distant ones small."""
    rates = tf.exp(-math.log(10000.0) * tf.range(0, depth, 2, dtype=tf.float32) / depth)  # [depth / 2]
    angles = tf.expand_dims(positions, -1) * rates
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)[..., :depth]


class Attention(keras.layers.Layer):
    """Multi-head scaled dot-product attention of `query` [B, Q, d] over `context` [B, C, d].

    `context=None` is self-attention. `attention_mask` is boolean [B or 1, Q, C], True
    where allowed; every query row must allow at least one key (the model keeps the conditioning latents visible).
    There is no dropout on the attention weights: [B, heads, Q, C] is the largest tensor in the
    model, and the blocks' residual dropout regularises enough at these sizes.
    """

    def __init__(self, d_model: int, num_heads: int, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_size = d_model // num_heads
        self.query_projection = keras.layers.Dense(d_model, name="query")
        # Keys and values in one matmul: fewer, larger kernels are faster on every backend.
        self.key_value_projection = keras.layers.Dense(2 * d_model, name="key_value")
        self.output_projection = keras.layers.Dense(d_model, name="output")

    def build(self, query_shape):
        shape = [None, None, self.d_model]
        self.query_projection.build(shape)
        self.key_value_projection.build(shape)
        self.output_projection.build(shape)
        self.built = True

    def _split_heads(self, x):
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        x = tf.reshape(x, [batch, length, self.num_heads, self.head_size])
        return tf.transpose(x, [0, 2, 1, 3])  # [B, heads, length, head_size]

    def call(self, query, context=None, attention_mask=None):
        context = query if context is None else context
        # Scale the queries, not the scores: [B, heads, Q, head_size] is smaller than [B, heads, Q, C].
        q = self._split_heads(self.query_projection(query) * (self.head_size**-0.5))
        keys, values = tf.split(self.key_value_projection(context), 2, axis=-1)
        k, v = self._split_heads(keys), self._split_heads(values)
        scores = tf.einsum("bhqd,bhkd->bhqk", q, k)  # [B, heads, Q, C]
        scores = tf.cast(scores, tf.float32)
        if attention_mask is not None:
            # An additive bias rather than tf.where: one broadcast add over [B, heads, Q, C] whose
            # gradient is the identity, where a select would cost another pass backwards.
            bias = tf.expand_dims(tf.where(attention_mask, 0.0, _MASKED_SCORE), 1)  # [B or 1, 1, Q, C]
            scores = scores + bias
        weights = tf.cast(tf.nn.softmax(scores, axis=-1), self.compute_dtype)
        heads = tf.einsum("bhqk,bhkd->bhqd", weights, v)  # [B, heads, Q, head_size]
        batch, length = tf.shape(query)[0], tf.shape(query)[1]
        merged = tf.reshape(tf.transpose(heads, [0, 2, 1, 3]), [batch, length, self.d_model])
        return self.output_projection(merged)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads)
        return config


class ResidualBlock(keras.layers.Layer):
    """The dropout both block kinds share: one Dropout layer whose seed can be drawn outside a
    recomputed (gradient-checkpointed) call and passed back in, so the recomputation drops the
    same units as the forward pass."""

    def __init__(self, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.residual_dropout = keras.layers.Dropout(dropout)

    def draw_dropout_seed(self):
        """A fresh [2] seed from the block's Dropout layer's generator (seeded, like any Keras
        dropout, by `keras.utils.set_random_seed`)."""
        return self.residual_dropout.seed_generator.next()

    def apply_dropout(self, x, training, seed, index: int):
        if seed is None:
            return self.residual_dropout(x, training=training)
        if not training or self.dropout == 0.0:
            return x
        seed = tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), index)  # one mask per use
        return tf.nn.experimental.stateless_dropout(x, rate=self.dropout, seed=seed)


class TransformerBlock(ResidualBlock):
    """Pre-norm block: x + Attention(LN(x)), then x + FeedForward(LN(x)).

    Pre-norm keeps gradients well scaled at init without a learning-rate warm-up tuned per depth.
    With `cross_attention=True` the attention reads `context` instead of `x` (the perceiver step).
    """

    def __init__(self, d_model: int, num_heads: int, ff_multiplier: int = 4, dropout: float = 0.0,
                 cross_attention: bool = False, **kwargs):
        super().__init__(dropout, **kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.ff_multiplier = ff_multiplier
        self.cross_attention = cross_attention
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        self.context_norm = (
            keras.layers.LayerNormalization(epsilon=1e-5, name="context_norm") if cross_attention else None
        )
        self.attention = Attention(d_model, num_heads, name="attention")
        self.ff_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="ff_norm")
        self.ff_in = keras.layers.Dense(ff_multiplier * d_model, activation="gelu", name="ff_in")
        self.ff_out = keras.layers.Dense(d_model, name="ff_out")

    def build(self, input_shape):
        shape = [None, None, self.d_model]
        for norm in (self.attention_norm, self.context_norm, self.ff_norm):
            if norm is not None:
                norm.build(shape)
        self.attention.build(shape)
        self.ff_in.build(shape)
        self.ff_out.build([None, None, self.ff_multiplier * self.d_model])
        self.built = True

    def call(self, x, context=None, attention_mask=None, training=False, dropout_seed=None):
        """`dropout_seed` ([2] int, from `draw_dropout_seed`) fixes the dropout masks: a block
        recomputed for gradient checkpointing must drop the same units as its forward pass."""
        normed = self.attention_norm(x)
        if self.cross_attention:
            attended = self.attention(normed, self.context_norm(context), attention_mask=attention_mask)
        else:
            attended = self.attention(normed, attention_mask=attention_mask)
        x = x + self.apply_dropout(attended, training, dropout_seed, 0)
        hidden = self.ff_out(self.ff_in(self.ff_norm(x)))
        return x + self.apply_dropout(hidden, training, dropout_seed, 1)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, ff_multiplier=self.ff_multiplier,
                      dropout=self.dropout, cross_attention=self.cross_attention)
        return config


class ConvBlock(ResidualBlock):
    """Pre-norm residual convolution over time: x + Dense(ReLU(Conv1D_k(LN(x)))), zero past `keep`.

    The decoder's block: speech frames depend mostly on their neighbourhood, and a stack of these
    with growing dilation sees a few hundred milliseconds at a fraction of attention's cost over
    hundreds of frames. Inputs and outputs are zeroed on padded steps, so no padding leaks into
    valid steps through the kernel and the result does not depend on how much padding follows.
    """

    def __init__(self, d_model: int, kernel_size: int = 5, dilation: int = 1, dropout: float = 0.0, **kwargs):
        super().__init__(dropout, **kwargs)
        self.d_model = d_model
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")
        self.conv = keras.layers.Conv1D(d_model, kernel_size, padding="same", dilation_rate=dilation,
                                        activation="relu", name="conv")
        self.projection = keras.layers.Dense(d_model, name="projection")

    def build(self, input_shape):
        shape = [None, None, self.d_model]
        self.norm.build(shape)
        self.conv.build(shape)
        self.projection.build(shape)
        self.built = True

    def call(self, x, keep, training=False, dropout_seed=None):
        """x [B, T, d], keep [B, T, 1] (1.0 on valid steps, in x's dtype). Not called `mask`: Keras
        treats an argument of that name as its own mask propagation."""
        hidden = self.projection(self.conv(self.norm(x) * keep))
        return (x + self.apply_dropout(hidden, training, dropout_seed, 0)) * keep

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, kernel_size=self.kernel_size, dilation=self.dilation, dropout=self.dropout)
        return config


class ConvStack(keras.layers.Layer):
    """`num_layers` same-padded ReLU convolutions of width `channels` then a Dense to `outputs`: the frame classifier of the aligner (mel -> vocabulary logits) and the duration
    predictor (text encoding -> one log-duration per token) are both this shape. Zero past `keep`.

    Output float32: both feed losses through a softmax or a regression.
    """

    def __init__(self, channels: int, num_layers: int, outputs: int, kernel_size: int = 3, dropout: float = 0.0,
                 output_bias: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.output_bias = output_bias  # the head's initial bias: what the stack says before it has learned
        self.channels = channels
        self.num_layers = num_layers
        self.outputs = outputs
        self.kernel_size = kernel_size
        self.dropout = dropout
        self.convs = [
            keras.layers.Conv1D(channels, kernel_size, padding="same", activation="relu", name=f"conv_{i}")
            for i in range(num_layers)
        ]
        self.norms = [keras.layers.LayerNormalization(epsilon=1e-5, name=f"norm_{i}") for i in range(num_layers)]
        self.conv_dropout = keras.layers.Dropout(dropout)
        self.head = keras.layers.Dense(outputs, dtype="float32", name="head",
                                       bias_initializer=keras.initializers.Constant(output_bias))

    def build(self, input_shape):
        width = input_shape[-1]
        for conv, norm in zip(self.convs, self.norms):
            conv.build([None, None, width])
            norm.build([None, None, self.channels])
            width = self.channels
        self.head.build([None, None, width])
        self.built = True

    def call(self, x, keep, training=False):
        """x [B, T, features], keep [B, T, 1] (1.0 on valid steps) -> [B, T, outputs] float32."""
        for conv, norm in zip(self.convs, self.norms):
            x = self.conv_dropout(norm(conv(x * keep)), training=training)
        return self.head(x) * tf.cast(keep, tf.float32)

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, num_layers=self.num_layers, outputs=self.outputs,
                      kernel_size=self.kernel_size, dropout=self.dropout, output_bias=self.output_bias)
        return config
