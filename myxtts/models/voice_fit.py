"""A voice fitted to clips of it whose words are known: the model unchanged, only its voice vector tuned.

    voice, before, after = fit_voice(network, reference_mel, reference_length, mel, mel_length, tokens, text_length)
    mel, length = inference.generate(network, new_tokens, voice=voice)

Zero-shot, the conditioning encoder reads a voice from a clip in one pass, and on voices it never heard
it falls short of what the decoder can render (BENCHMARKS.md, "Voices the model never heard"). With the
clips' transcripts the voice can be fitted instead: start from the encoder's voice (several clips
averaged), then Adam on that one vector against the mel loss of the clips decoded on their own
alignment (teacher-forced, as training decodes). The network's weights are not touched, so every other
voice sounds as before, unlike fine-tuning (`train_main.py --init-from`), and a voice costs seconds.
This is the speaker-embedding adaptation of Arik et al. (2018), started from the encoder's guess.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from myxtts.data import audio
from myxtts.data.text import PAD_ID
from myxtts.models import alignment, losses

# On the 343-voice model at 2,800 updates, 200 at 0.05 took its 9 unseen voices from 86.2% of the
# recordings' similarity to 88.6%; 400 updates, or 0.1, gave no more (BENCHMARKS.md).
DEFAULT_STEPS = 200
DEFAULT_LEARNING_RATE = 0.05


def fit_voice(network, reference_mel, reference_length, mel, mel_length, tokens, text_length,
              steps: int = DEFAULT_STEPS, learning_rate: float = DEFAULT_LEARNING_RATE):
    """(voice [1, d] float32, the clips' mel loss with the encoder's voice, and with the fitted one).

    reference_mel [N, R, n_mels], reference_length [N]: the encoder's input (`reference_log_mel` of each
    clip), whose averaged voice is the start; mel [N, T, n_mels], mel_length [N]: the same clips whole,
    as training reads them; tokens [N, L], text_length [N]: their words, tokenized as training does."""
    mel = tf.convert_to_tensor(mel, tf.float32)
    mel_length = tf.convert_to_tensor(mel_length, tf.int32)
    tokens = tf.convert_to_tensor(tokens, tf.int32)
    text_length = tf.convert_to_tensor(text_length, tf.int32)
    # The recording's own alignment, once: it reads the mel and the tokens, not the voice. Traced, as
    # the alignment's frame loops would otherwise dispatch every frame's ops from Python.
    durations = tf.function(network.align)(mel, mel_length, tokens, text_length)[2]
    index = alignment.frame_tokens(durations, tf.shape(mel)[1])
    start = network.voice(tf.convert_to_tensor(reference_mel, tf.float32),
                          tf.convert_to_tensor(reference_length, tf.int32), average=True)
    voice = tf.Variable(tf.cast(start, tf.float32), name="fitted_voice")
    optimizer = keras.optimizers.Adam(learning_rate)

    def loss():
        text = network.encode_text(tokens, text_length, tf.broadcast_to(voice, [tf.shape(tokens)[0], voice.shape[1]]))
        return tf.reduce_mean(losses.mel_loss(mel, mel_length, network.decode_frames(text, index, mel_length)))

    @tf.function
    def update():
        with tf.GradientTape() as tape:
            value = loss()
        optimizer.apply([tape.gradient(value, voice)], [voice])
        return value

    before = float(update())  # the loss of the encoder's voice: measured before the first change
    for _ in range(steps - 1):
        update()
    return tf.convert_to_tensor(voice), before, float(tf.function(loss)())


def fit_voice_to_clips(network, reference_mel, reference_length, waveforms, token_ids, data_config,
                       steps: int = DEFAULT_STEPS, learning_rate: float = DEFAULT_LEARNING_RATE):
    """`fit_voice` from the clips as training reads them: `waveforms` (each trimmed and normalised as
    training trims them, float32 [n]) and `token_ids` (each clip's words as token ids [L])."""
    mels = [audio.log_mel(tf.convert_to_tensor(w, tf.float32), data_config) for w in waveforms]
    frames, symbols = max(int(m.shape[0]) for m in mels), max(len(t) for t in token_ids)
    mel = tf.stack([tf.pad(m, [[0, frames - int(m.shape[0])], [0, 0]]) for m in mels])
    tokens = tf.stack([tf.pad(tf.cast(t, tf.int32), [[0, symbols - len(t)]], constant_values=PAD_ID)
                       for t in token_ids])
    return fit_voice(network, reference_mel, reference_length, mel, [int(m.shape[0]) for m in mels], tokens,
                     [len(t) for t in token_ids], steps=steps, learning_rate=learning_rate)
