"""XTTS: text + a reference clip of a voice -> log-mel, with an alignment it learns on its own.

    reference_mel -> ConditioningEncoder -> K voice latents -> mean -> voice [B, d]
    tokens -> embedding + positions -> conv blocks -> transformer blocks -> + voice -> text [B, L, d]
    mel -> FrameClassifier -> log P(token | frame) [B, T, V] -> sentence's tokens + prior [B, T, L]
        -> forward-sum loss (trains the classifier) and Viterbi path -> durations [B, L]
    text, durations -> each frame takes its token's vector -> conv decoder -> mel [B, T, n_mels]
    stop_gradient(text) -> duration predictor -> log(1 + frames) per token  (used at synthesis)

The decoder is not autoregressive: every frame is predicted at once from the text vector its
token's duration assigns it. Training uses the durations the aligner finds in the recording;
synthesis uses the durations the predictor learned from them. This replaced a decoder-only
transformer that continued the voice prompt frame group by frame group: after 3,000 CPU updates
that decoder still had not learned to follow the text (12.5% closed-set sentence identification
by a speech recogniser, the recordings 67%), because nothing tied its attention to the text
before the frame regression was learned. Here the alignment is its own small problem with its own
loss, solved in the first few hundred updates, and the decoder never has to discover it
(BENCHMARKS.md, "Choosing the model").

Voice cloning is unchanged in spirit: the voice comes only from a reference clip (several
averaged), through the same perceiver-style conditioning encoder, never from a speaker id.

The batch dict is the pipeline's (`myxtts.data.pipeline`); shapes are static per bucket, so an
XLA-compiled step sees one program per bucket. Outputs are float32 whatever the dtype policy.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from myxtts.models import alignment
from myxtts.models.conditioning_encoder import ConditioningEncoder
from myxtts.models.layers import (ConvBlock, ConvStack, TransformerBlock, denormalize_mel, normalize_mel,
                                  sinusoidal_positions)
from myxtts.models.sizes import get_size


@keras.saving.register_keras_serializable(package="myxtts")
class XTTS(keras.Model):
    """The network. `size` names a row of `MODEL_SIZES`; the vocabulary and mel bands come from the data."""

    def __init__(self, vocab_size: int, n_mels: int, size: str = "small", gradient_checkpointing: bool = False,
                 decoder_window: int = 0, silent_token: int = -1, alignment_frames_per_iteration: int = 0,
                 speaker_loss_weight: float = 0.0, reference_frames: int = 0, **kwargs):
        super().__init__(**kwargs)
        spec = get_size(size)
        self.vocab_size = vocab_size
        self.n_mels = n_mels
        self.size = size
        # Recompute each block's activations in the backward pass instead of keeping them: about a
        # block's forward pass more compute for much less activation memory. The gradients are
        # those of the plain pass, dropout included (tests/test_model.py).
        self.gradient_checkpointing = gradient_checkpointing
        self.spec = spec
        # The token with no sound of its own (the space between words; -1: none): the alignment
        # skips it and gives it 0 frames. Aligned like a phoneme, its class became a catch-all that
        # took whole words while the phonemes around it got a frame each (BENCHMARKS.md).
        self.silent_token = silent_token
        # Training decodes one random window of this many frames per clip instead of the whole clip
        # (0 = whole clips). The decoder is convolutional with a receptive field of a few dozen
        # frames, so a window teaches it what a whole clip does, at a fraction of the cost: the
        # alignment, which needs whole clips, is then most of a step (BENCHMARKS.md).
        self.decoder_window = decoder_window
        self.window_seed = keras.random.SeedGenerator(name="decoder_window_seed") if decoder_window else None
        # How the alignment's frame loops run (same results; alignment.AlignmentLoops): 0 = for the
        # device. `alignment_loops` is what `align` and the loss use; TrainingModel.compile sets it
        # for the step it compiles. Not part of get_config: it is how to run the model, not the model.
        self.alignment_frames_per_iteration = alignment_frames_per_iteration
        self.alignment_loops = alignment.DEFAULT_LOOPS
        # A speaker objective for the conditioning encoder (losses.speaker_loss; 0 = off): the voice of
        # each clip's reference against the voice of the clip's own first `reference_frames` frames.
        # A training setting, like the decoder window: not part of get_config.
        self.speaker_loss_weight = speaker_loss_weight
        self.reference_frames = reference_frames
        d = spec.d_model

        self.conditioning_encoder = ConditioningEncoder(
            d, spec.num_heads, spec.conditioning_latents, spec.conditioning_layers, spec.ff_multiplier, spec.dropout,
            name="conditioning_encoder",
        )
        self.voice_projection = keras.layers.Dense(d, name="voice_projection")
        self.text_embedding = keras.layers.Embedding(vocab_size, d, name="text_embedding")
        self.text_blocks = [ConvBlock(d, 5, 1, spec.dropout, name=f"text_conv_{i}") for i in range(spec.text_conv_blocks)]
        self.text_attention = [
            TransformerBlock(d, spec.num_heads, spec.ff_multiplier, spec.dropout, name=f"text_attention_{i}")
            for i in range(spec.text_attention_blocks)
        ]
        self.text_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="text_norm")
        self.frame_classifier = ConvStack(spec.aligner_channels, spec.aligner_layers, vocab_size, kernel_size=5,
                                          name="frame_classifier")
        # Starts at log(1 + 4): a phoneme lasts about 4 frames (the demo corpus: 4.3 per symbol), so even
        # an untrained model speaks each token audibly instead of skipping it.
        self.duration_predictor = ConvStack(spec.duration_channels, 2, 1, kernel_size=3, dropout=spec.dropout,
                                            output_bias=math.log1p(4.0), name="duration_predictor")
        self.decoder_input = keras.layers.Dense(d, name="decoder_input")
        self.decoder_blocks = [
            ConvBlock(d, spec.decoder_kernel, dilation, spec.dropout, name=f"decoder_{i}")
            for i, dilation in enumerate(spec.decoder_dilations)
        ]
        self.decoder_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="decoder_norm")
        # float32: the regression feeds the loss, and the output is the model's product.
        self.mel_head = keras.layers.Dense(n_mels, dtype="float32", name="mel_head")

    def build(self, input_shape=None):
        d = self.spec.d_model
        self.conditioning_encoder.build([None, None, self.n_mels])
        self.voice_projection.build([None, d])
        self.text_embedding.build([None])
        for block in [*self.text_blocks, *self.text_attention, *self.decoder_blocks]:
            block.build([None, None, d])
        for layer in (self.text_norm, self.decoder_input, self.decoder_norm, self.mel_head):
            layer.build([None, None, d])
        self.frame_classifier.build([None, None, self.n_mels])
        self.duration_predictor.build([None, None, d])
        self.built = True

    # ----------------------------------------------------------------------------------------------

    def call(self, batch, training=False):
        """Teacher-forced on the recording's own alignment. Returns float32
        mel [B, T, n_mels] and what it is compared with, mel_target and mel_target_length (the
        batch's mel, or with `decoder_window` in training one window of it per clip, [B, W, n_mels]);
        alignment_scores [B, T, L] over the sounding tokens (`align`) and their count aligned_length [B],
        durations [B, L] (int32, from the recording; 0 for the silent token), log_durations [B, L]
        (the predictor's)."""
        voice = self.voice(batch["reference_mel"], batch["reference_length"], training=training)
        text = self.encode_text(batch["tokens"], batch["text_length"], voice, training=training)
        scores, aligned_length, durations = self.align(batch["mel"], batch["mel_length"], batch["tokens"],
                                                       batch["text_length"], training=training)
        index = alignment.frame_tokens(durations, tf.shape(batch["mel"])[1])  # [B, T]
        target, target_length = batch["mel"], batch["mel_length"]
        if training and self.decoder_window:
            index, target, target_length = self._window(index, target, target_length)
        outputs = {
            "mel": self.decode_frames(text, index, target_length, training=training),
            "mel_target": target,
            "mel_target_length": target_length,
            "alignment_scores": scores,
            "aligned_length": aligned_length,
            "durations": durations,
            "log_durations": self.predict_log_durations(text, batch["text_length"], training=training),
        }
        if self.speaker_loss_weight > 0:
            # The clip's own voice, from its opening frames (as long as a reference clip at most).
            frames = self.reference_frames or tf.shape(batch["reference_mel"])[1]
            clip = batch["mel"][:, :frames]
            outputs["voice"] = voice
            outputs["clip_voice"] = self.voice(clip, tf.minimum(batch["mel_length"], tf.shape(clip)[1]), training=training)
        return outputs

    def voice(self, reference_mel, reference_length, training=False, average=False):
        """The voice vector [B, d] of reference clips [B, R, n_mels] (valid up to `reference_length`).

        `average=True` treats the B clips as one voice and returns [1, d]: several short clips of a
        speaker make a steadier voice than any one of them.
        """
        latents = self.conditioning_encoder(reference_mel, reference_length, training=training)  # [B, K, d]
        latents = tf.reduce_mean(latents, axis=1)
        if average:
            latents = tf.reduce_mean(latents, axis=0, keepdims=True)
        return self.voice_projection(latents)

    def encode_text(self, tokens, text_length, voice, training=False):
        """[B, L, d]: each token in its sentence's context, plus the voice (zero past text_length)."""
        tokens = tf.convert_to_tensor(tokens)
        length = tf.shape(tokens)[1]
        valid = tf.sequence_mask(text_length, length)  # [B, L]
        mask = tf.expand_dims(tf.cast(valid, self.compute_dtype), 2)
        x = (self.text_embedding(tokens) + tf.expand_dims(sinusoidal_positions(length, self.spec.d_model, self.compute_dtype), 0)) * mask
        x = self._blocks(self.text_blocks, x, training, keep=mask)
        x = self._blocks(self.text_attention, x, training, attention_mask=tf.expand_dims(valid, 1))
        return (self.text_norm(x) + tf.expand_dims(tf.cast(voice, self.compute_dtype), 1)) * mask

    def align(self, mel, mel_length, tokens, text_length, training=False):
        """The recording's alignment: (scores [B, T, L] of the sounding tokens, packed to the front;
        their count [B]; durations [B, L] int32 of every token, 0 for `silent_token`)."""
        length = tf.shape(tokens)[1]
        positions = tf.range(length)[None]
        sounding = (positions < text_length[:, None]) & (tokens != self.silent_token)  # [B, L]
        # The sounding tokens' positions in order, first: sort keys put every other position after them.
        order = tf.argsort(tf.where(sounding, positions, positions + length), axis=1, stable=True)  # [B, L]
        count = tf.reduce_sum(tf.cast(sounding, tf.int32), axis=1)
        packed = tf.where(positions < count[:, None], tf.gather(tokens, order, batch_dims=1), 0)
        scores = self.alignment_scores(mel, mel_length, packed, count, training=training)
        path = alignment.viterbi_alignment(scores, mel_length, count, self.alignment_loops)
        packed_durations = alignment.durations_of(path)  # [B, L]
        packed_durations = tf.where(positions < count[:, None], packed_durations, 0)
        # Back to the tokens' own positions: order is a permutation, so a scatter is a sum of one-hots.
        durations = tf.reduce_sum(tf.one_hot(order, length, dtype=tf.int32) * packed_durations[:, :, None], axis=1)
        return scores, count, durations

    def alignment_scores(self, mel, mel_length, tokens, text_length, training=False):
        """[B, T, L] float32: log P(frame t says token j) from the frame classifier, plus the prior."""
        mask = tf.sequence_mask(mel_length, tf.shape(mel)[1], dtype=self.compute_dtype)[:, :, None]
        logits = self.frame_classifier(normalize_mel(tf.cast(mel, tf.float32)), mask, training=training)
        return alignment.token_log_probs(tf.nn.log_softmax(logits), tokens, mel_length, text_length)

    def decode(self, text, durations, frames, mel_length, training=False):
        """mel [B, frames, n_mels] float32 from text [B, L, d] stretched by durations [B, L]."""
        return self.decode_frames(text, alignment.frame_tokens(durations, frames), mel_length, training=training)

    def decode_frames(self, text, index, mel_length, training=False):
        """mel [B, frames, n_mels] float32 where frame t speaks token index[b, t] of text [B, L, d]."""
        features, mask = self.decoder_features(text, index, mel_length, training)
        return denormalize_mel(self.mel_head(features)) * tf.cast(mask, tf.float32)

    def decoder_features(self, text, index, mel_length, training=False):
        """(what the mel head reads [B, frames, d], the valid frames [B, frames, 1]) for `decode_frames`."""
        frames = tf.shape(index)[1]
        mask = tf.expand_dims(tf.sequence_mask(mel_length, frames, dtype=self.compute_dtype), 2)
        length = tf.shape(text)[1]
        x = tf.gather(text, tf.minimum(index, length - 1), batch_dims=1) * mask  # [B, frames, d]
        x = self._blocks(self.decoder_blocks, self.decoder_input(x) * mask, training, keep=mask)
        return self.decoder_norm(x), mask

    def _window(self, index, mel, mel_length):
        """One random window of `decoder_window` frames per clip, inside the clip where it is longer:
        (its token index [B, W], its mel [B, W, n_mels], its valid length [B])."""
        window = self.decoder_window
        room = tf.maximum(mel_length - window, 0)  # [B]: latest start that keeps the window in the clip
        draw = keras.random.uniform(tf.shape(mel_length), seed=self.window_seed)
        start = tf.minimum(tf.cast(draw * tf.cast(room + 1, tf.float32), tf.int32), room)
        positions = tf.minimum(start[:, None] + tf.range(window)[None], tf.shape(mel)[1] - 1)  # [B, W]
        length = tf.minimum(mel_length - start, window)
        return (tf.gather(index, positions, batch_dims=1), tf.gather(mel, positions, batch_dims=1), length)

    def predict_log_durations(self, text, text_length, training=False):
        """[B, L] float32: log(1 + frames) per token. Reads the text encoding without training it:
        the encoder learns from the mel loss alone, the predictor learns to read it."""
        mask = tf.expand_dims(tf.sequence_mask(text_length, tf.shape(text)[1], dtype=self.compute_dtype), 2)
        return self.duration_predictor(tf.stop_gradient(text), mask, training=training)[..., 0]

    def _blocks(self, blocks, x, training, **call_kwargs):
        for block in blocks:
            # The dropout seed is drawn here, outside the recomputed function: drawn inside it, the
            # recomputation would advance the generator and drop other units than the forward pass.
            seed = block.draw_dropout_seed() if training and self.spec.dropout > 0.0 else None
            if self.gradient_checkpointing and training:
                x = keras.remat(lambda h, block=block, seed=seed: block(
                    h, training=training, dropout_seed=seed, **call_kwargs))(x)
            else:
                x = block(x, training=training, dropout_seed=seed, **call_kwargs)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, n_mels=self.n_mels, size=self.size,
                      gradient_checkpointing=self.gradient_checkpointing, decoder_window=self.decoder_window,
                      silent_token=self.silent_token)
        return config


def network_for(config, vocab_size: int, silent_token: int = -1) -> XTTS:
    """The network a run's config describes (`silent_token`: the vocabulary's `word_boundary_id`).
    Training, synthesis and the tools all build it here."""
    return XTTS(vocab_size=vocab_size, n_mels=config.data.n_mels, size=config.model.size,
                gradient_checkpointing=config.training.gradient_checkpointing,
                decoder_window=config.training.decoder_window, silent_token=silent_token,
                alignment_frames_per_iteration=config.training.alignment_frames_per_iteration,
                speaker_loss_weight=config.training.speaker_loss_weight, reference_frames=config.data.reference_frames)
