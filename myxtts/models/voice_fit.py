"""A voice fitted to clips of it whose words are known: its voice vector tuned (and, if asked, a mel head of its own).

    fitted = fit_voice(network, reference_mel, reference_length, mel, mel_length, tokens, text_length)
    with speaking_as(network, fitted):  # puts the voice's own mel head in place, when it has one
        mel, length = inference.generate(network, new_tokens, voice=fitted.voice)

Zero-shot, the conditioning encoder reads a voice from a clip in one pass, and on voices it never heard
it falls short of what the decoder can render (BENCHMARKS.md, "Voices the model never heard"). With the
clips' transcripts the voice can be fitted instead: start from the encoder's voice (several clips
averaged), then Adam on that one vector against the mel loss of the clips decoded on their own
alignment (teacher-forced, as training decodes). The network's weights are not touched, so every other
voice sounds as before, unlike fine-tuning (`train_main.py --init-from`), and a voice costs seconds.
This is the speaker-embedding adaptation of Arik et al. (2018), started from the encoder's guess.

With `head_ridge`, the mel head (the last layer: decoder features -> the 80 bands) is refitted too, to
the same clips, by ridge regression toward its trained weights: a head for this voice alone, worn only
while it speaks (`speaking_as`), the trained weights back in place after. The decoder renders a voice
it never heard less closely than the voice's own recordings whatever the voice vector (teacher-forced
on the recording's own timing it scored no higher), and the head is where that rendering becomes a
spectrum. It costs words: the head learns the reference clips' sounds, and sounds the clips lack drift
(BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from myxtts.data import audio
from myxtts.data.text import PAD_ID
from myxtts.models import alignment, losses
from myxtts.models.layers import normalize_mel

# On the 343-voice model at 2,800 updates, 200 at 0.05 took its 9 unseen voices from 86.2% of the
# recordings' similarity to 88.6%; 400 updates, or 0.1, gave no more (BENCHMARKS.md).
DEFAULT_STEPS = 200
DEFAULT_LEARNING_RATE = 0.05
# The head's penalty, relative to the clips' own evidence (see `fit_head`). On the same model and
# voices: 10 gave 89.7% at WER 0.110, 3 gave 91.1% at 0.136, 1 gave 91.8% at 0.174 (voice alone:
# 88.2% at 0.085): 3 is the least that kept WER within issue 26's 0.15.
DEFAULT_HEAD_RIDGE = 3.0


@dataclass
class FittedVoice:
    voice: tf.Tensor  # [1, d] float32: what `generate(voice=)` takes
    loss_before: float  # the clips' mel loss with the encoder's voice and the trained head
    loss_after: float  # ... with the fitted voice (and head)
    head: list[np.ndarray] | None = None  # the mel head's [kernel, bias] for this voice; None: the trained one


@contextlib.contextmanager
def speaking_as(network, fitted: FittedVoice):
    """The network with `fitted`'s own mel head in place, the trained one restored on leaving. The head
    is the network's own layer, so two threads must not speak different fitted voices on one network
    at once."""
    if fitted.head is None:
        yield network
        return
    trained = network.mel_head.get_weights()
    network.mel_head.set_weights(fitted.head)
    try:
        yield network
    finally:
        network.mel_head.set_weights(trained)


def fit_voice(network, reference_mel, reference_length, mel, mel_length, tokens, text_length,
              steps: int = DEFAULT_STEPS, learning_rate: float = DEFAULT_LEARNING_RATE,
              head_ridge: float | None = None) -> FittedVoice:
    """The voice fitted to the clips (and with `head_ridge`, a mel head refitted to them: `fit_head`).

    reference_mel [N, R, n_mels], reference_length [N]: the encoder's input (`reference_log_mel` of each
    clip), whose averaged voice is the start; mel [N, T, n_mels], mel_length [N]: the same clips whole,
    as training reads them; tokens [N, L], text_length [N]: their words, tokenized as training does."""
    clips = (tf.convert_to_tensor(mel, tf.float32), tf.convert_to_tensor(mel_length, tf.int32),
             tf.convert_to_tensor(tokens, tf.int32), tf.convert_to_tensor(text_length, tf.int32))
    fitter = _fitter(network)
    # The recording's own alignment, once: it reads the mel and the tokens, not the voice.
    clips += (alignment.frame_tokens(fitter.align(*clips), tf.shape(clips[0])[1]),)
    fitter.start(network.voice(tf.convert_to_tensor(reference_mel, tf.float32),
                               tf.convert_to_tensor(reference_length, tf.int32), average=True), learning_rate)
    before = float(fitter.update(*clips))  # the loss of the encoder's voice: measured before the first change
    for _ in range(steps - 1):
        fitter.update(*clips)
    fitted = FittedVoice(tf.identity(fitter.voice), before, 0.0)
    if head_ridge is not None:
        fitted.head = fit_head(network, fitted.voice, *clips, head_ridge)
    with speaking_as(network, fitted):
        fitted.loss_after = float(fitter.loss(*clips))
    return fitted


class _Fitter:
    """The compiled steps of fitting voices to one network, traced once for every voice it fits. Built
    anew for each voice, they were traced anew too: most of a fit's time, and TensorFlow's retracing
    warning from the sixth voice on."""

    def __init__(self, network):
        network = weakref.ref(network)  # as inference.generate's cache: it must not keep the network alive
        self.voice = tf.Variable(tf.zeros([1, network().spec.d_model]), name="fitted_voice")
        self.optimizer = keras.optimizers.Adam(DEFAULT_LEARNING_RATE)
        self.optimizer.build([self.voice])
        # Traced: the alignment's frame loops would otherwise dispatch every frame's ops from Python.
        self.align = tf.function(lambda *clip: network().align(*clip)[2], reduce_retracing=True)
        self.loss = tf.function(lambda *clips: _clips_loss(network(), self.voice, *clips), reduce_retracing=True)

        def update(*clips):
            with tf.GradientTape() as tape:
                value = _clips_loss(network(), self.voice, *clips)
            self.optimizer.apply([tape.gradient(value, self.voice)], [self.voice])
            return value

        self.update = tf.function(update, reduce_retracing=True)

    def start(self, voice, learning_rate: float):
        """A fresh fit from `voice`: Adam's step count and moments back to zero."""
        self.voice.assign(tf.cast(voice, tf.float32))
        for variable in self.optimizer.variables:
            variable.assign(tf.zeros_like(variable))
        self.optimizer.learning_rate = learning_rate


_FITTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _fitter(network) -> _Fitter:
    if network not in _FITTERS:
        _FITTERS[network] = _Fitter(network)
    return _FITTERS[network]


def _encoded(network, voice, tokens, text_length):
    """The clips' words [N, L, d] encoded in the one voice [1, d]."""
    return network.encode_text(tokens, text_length, tf.broadcast_to(voice, [tf.shape(tokens)[0], voice.shape[1]]))


def _clips_loss(network, voice, mel, mel_length, tokens, text_length, index):
    """The clips' mel loss decoded in `voice` on their own alignment `index`, as training decodes."""
    text = _encoded(network, voice, tokens, text_length)
    return tf.reduce_mean(losses.mel_loss(mel, mel_length, network.decode_frames(text, index, mel_length)))


def fit_head(network, voice, mel, mel_length, tokens, text_length, index, ridge: float) -> list[np.ndarray]:
    """The mel head's [kernel, bias] that, on the clips' frames, maps the decoder's features in `voice`
    closest to their recorded mel (least squares), pulled toward the trained head by `ridge`.

    Closed form, in float64: with X the valid frames' features (and a 1 for the bias), W0 the trained
    head and Y the recorded frames (normalised as the head predicts them), the change is
    (X'X + p I)^-1 X'(Y - X W0), where p = ridge x the mean diagonal of X'X: `ridge` weighs the trained
    head against the clips, whatever their length and the features' scale."""
    text = _encoded(network, voice, tokens, text_length)
    features, _ = network.decoder_features(text, index, mel_length)
    valid = tf.sequence_mask(mel_length, tf.shape(mel)[1])
    x = tf.boolean_mask(features, valid).numpy().astype(np.float64)
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    y = normalize_mel(tf.boolean_mask(mel, valid)).numpy().astype(np.float64)
    kernel, bias = network.mel_head.get_weights()
    trained = np.concatenate([kernel, bias[None]]).astype(np.float64)
    gram = x.T @ x
    penalty = ridge * np.trace(gram) / len(gram)
    head = trained + np.linalg.solve(gram + penalty * np.eye(len(gram)), x.T @ (y - x @ trained))
    return [head[:-1].astype(kernel.dtype), head[-1].astype(bias.dtype)]


def fit_voice_to_clips(network, reference_mel, reference_length, waveforms, token_ids, data_config,
                       steps: int = DEFAULT_STEPS, learning_rate: float = DEFAULT_LEARNING_RATE,
                       head_ridge: float | None = None) -> FittedVoice:
    """`fit_voice` from the clips as training reads them: `waveforms` (each trimmed and normalised as
    training trims them, float32 [n]) and `token_ids` (each clip's words as token ids [L])."""
    mels = [audio.log_mel(tf.convert_to_tensor(w, tf.float32), data_config) for w in waveforms]
    frames, symbols = max(int(m.shape[0]) for m in mels), max(len(t) for t in token_ids)
    mel = tf.stack([tf.pad(m, [[0, frames - int(m.shape[0])], [0, 0]]) for m in mels])
    tokens = tf.stack([tf.pad(tf.cast(t, tf.int32), [[0, symbols - len(t)]], constant_values=PAD_ID)
                       for t in token_ids])
    return fit_voice(network, reference_mel, reference_length, mel, [int(m.shape[0]) for m in mels], tokens,
                     [len(t) for t in token_ids], steps=steps, learning_rate=learning_rate, head_ridge=head_ridge)
