"""The alignment arithmetic (myxtts/models/alignment.py) against brute force, and learning a known alignment."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from myxtts.models import alignment


def monotonic_paths(frames: int, tokens: int):
    """Every path of `frames` frames over `tokens` tokens, in order, each token >= 1 frame."""
    for cuts in itertools.combinations(range(1, frames), tokens - 1):
        bounds = (0, *cuts, frames)
        yield [j for j in range(tokens) for _ in range(bounds[j + 1] - bounds[j])]


def random_log_probs(seed, batch, frames, tokens, mel_length, text_length):
    logits = tf.random.stateless_normal([batch, frames, tokens], seed=[seed, 0])
    valid = tf.sequence_mask(text_length, tokens)[:, None, :]
    log_probs = tf.nn.log_softmax(tf.where(valid, logits, -1e9), axis=-1)
    inside = tf.sequence_mask(mel_length, frames)[:, :, None]
    return tf.where(valid & inside, log_probs, alignment.IMPOSSIBLE)


def test_prior_rows_are_distributions_over_the_valid_tokens_and_follow_the_diagonal():
    mel_length, text_length = tf.constant([12, 7]), tf.constant([5, 3])
    prior = alignment.beta_binomial_log_prior(12, 6, mel_length, text_length).numpy()
    for b, (m, n) in enumerate([(12, 5), (7, 3)]):
        rows = np.exp(prior[b, :m, :n])
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)
        expected_token = (rows * np.arange(n)).sum(axis=1)
        assert np.all(np.diff(expected_token) > 0), "the prior's mean must move along the text"
        assert np.all(prior[b, m:] == 0) and np.all(prior[b, :, n:] == 0)


def test_forward_sum_equals_the_sum_over_every_path():
    mel_length, text_length = tf.constant([7, 5]), tf.constant([3, 2])
    log_probs = random_log_probs(1, 2, 8, 4, mel_length, text_length)
    loss = alignment.forward_sum_loss(log_probs, mel_length, text_length).numpy()
    for b, (m, n) in enumerate([(7, 3), (5, 2)]):
        scores = [sum(log_probs[b, t, j] for t, j in enumerate(path)) for path in monotonic_paths(m, n)]
        total = np.logaddexp.reduce(np.array(scores, dtype=np.float64))
        assert loss[b] == pytest.approx(-total / m, rel=1e-5)


def test_forward_sum_gradient_is_the_autodiff_gradient_of_the_recursion():
    """The hand-written forward-backward gradient against autodiff through a plain forward loop."""
    mel_length, text_length = tf.constant([9, 6, 4]), tf.constant([4, 6, 2])
    log_probs = random_log_probs(2, 3, 9, 6, mel_length, text_length)

    def plain(lp):
        losses = []
        for b in range(3):
            m, n = int(mel_length[b]), int(text_length[b])
            alpha = tf.concat([lp[b, 0, :1], tf.fill([n - 1], -1e9)], 0)
            for t in range(1, m):
                alpha = tf.reduce_logsumexp(tf.stack([alpha, tf.concat([[-1e9], alpha[:-1]], 0)]), 0) + lp[b, t, :n]
            losses.append(-alpha[n - 1] / m)
        return tf.stack(losses)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(log_probs)
        ours, reference = alignment.forward_sum_loss(log_probs, mel_length, text_length), plain(log_probs)
        weights = tf.constant([1.0, 2.0, -0.5])
        ours_total, reference_total = tf.reduce_sum(ours * weights), tf.reduce_sum(reference * weights)
    np.testing.assert_allclose(ours.numpy(), reference.numpy(), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours_total, log_probs).numpy(),
                               tape.gradient(reference_total, log_probs).numpy(), atol=1e-6)


def test_viterbi_is_the_best_path_and_covers_every_token():
    mel_length, text_length = tf.constant([8, 6, 4]), tf.constant([4, 6, 1])
    log_probs = random_log_probs(3, 3, 9, 6, mel_length, text_length)
    path = alignment.viterbi_alignment(log_probs, mel_length, text_length).numpy()
    for b, (m, n) in enumerate([(8, 4), (6, 6), (4, 1)]):
        best = max(monotonic_paths(m, n), key=lambda p: sum(float(log_probs[b, t, j]) for t, j in enumerate(p)))
        np.testing.assert_array_equal(path[b, :m].argmax(axis=1), best)
        np.testing.assert_array_equal(path[b, :m].sum(axis=1), 1.0)
        assert np.all(path[b, m:] == 0) and np.all(path[b, :, n:] == 0)
    assert alignment.durations_of(path).numpy().tolist() == [
        [int(c) for c in path[0].sum(0)], [1] * 6, [4, 0, 0, 0, 0, 0]]


def test_frame_tokens_is_the_length_regulator_index():
    index = alignment.frame_tokens(tf.constant([[2, 1, 3], [1, 1, 0]]), 7).numpy()
    assert index.tolist() == [[0, 0, 1, 2, 2, 2, 3], [0, 1, 3, 3, 3, 3, 3]]


def test_a_classifier_trained_by_the_forward_sum_finds_a_known_alignment():
    """Toy speech: each token type has its own sound (a noisy one-hot frame), sentences are random
    token strings with random durations. A linear frame classifier trained by the forward-sum
    objective alone, never shown a duration, must recover the durations exactly."""
    rng = np.random.default_rng(0)
    vocab, batch, tokens_max, frames_max = 6, 16, 6, 40
    tokens = rng.integers(0, vocab, size=(batch, tokens_max))
    for j in range(1, tokens_max):  # a different token than the previous one
        tokens[:, j] = (tokens[:, j - 1] + rng.integers(1, vocab, size=batch)) % vocab
    text_length = rng.integers(3, tokens_max + 1, size=batch)
    durations = rng.integers(1, 6, size=(batch, tokens_max)) * (np.arange(tokens_max) < text_length[:, None])
    mel_length = durations.sum(axis=1)
    sounds = np.eye(vocab, 8) * 2.0
    frames = np.zeros((batch, frames_max, 8), np.float32)
    for b in range(batch):
        spoken = np.repeat(tokens[b, : text_length[b]], durations[b, : text_length[b]])
        frames[b, : len(spoken)] = sounds[spoken] + rng.normal(0, 0.3, size=(len(spoken), 8))

    classifier = tf.keras.layers.Dense(vocab)
    optimizer = tf.keras.optimizers.Adam(0.05)
    inputs = [tf.constant(x) for x in (frames, tokens.astype(np.int32), mel_length.astype(np.int32),
                                       text_length.astype(np.int32))]

    @tf.function
    def scores(x, tok, m, n):
        return alignment.token_log_probs(tf.nn.log_softmax(classifier(x)), tok, m, n)

    @tf.function
    def step(x, tok, m, n):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(alignment.forward_sum_loss(scores(x, tok, m, n), m, n))
        grads = tape.gradient(loss, classifier.trainable_variables)
        optimizer.apply_gradients(zip(grads, classifier.trainable_variables))
        return loss

    first = float(step(*inputs))
    for _ in range(150):
        last = float(step(*inputs))
    assert last < first / 2
    path = alignment.viterbi_alignment(scores(*inputs), inputs[2], inputs[3])
    found = alignment.durations_of(path).numpy()
    assert math.isclose((found == durations).mean(), 1.0), f"{(found != durations).sum()} durations wrong"
