"""The content measure of utilities/free_running_check.py: its vectorized DTW against the textbook
double loop, and that it finds a sentence in a time-stretched copy of itself."""

import numpy as np

from utilities.free_running_check import dtw_distance


def _textbook_dtw(a, b):
    n, m = len(a), len(b)
    cost = np.abs(a[:, None] - b[None]).mean(axis=-1)
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            total[i, j] = cost[i - 1, j - 1] + min(total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
    return total[n, m] / (n + m)


def test_matches_the_textbook_recursion():
    rng = np.random.default_rng(0)
    for n, m in [(1, 1), (1, 6), (6, 1), (9, 14), (31, 20)]:
        a, b = rng.normal(size=(n, 5)), rng.normal(size=(m, 5))
        assert np.isclose(dtw_distance(a, b), _textbook_dtw(a, b), rtol=1e-12)


def test_a_stretched_copy_is_nearer_than_another_sequence_or_a_constant():
    rng = np.random.default_rng(1)
    sentence, other = rng.normal(size=(40, 8)), rng.normal(size=(40, 8))
    stretched = np.repeat(sentence, 2, axis=0)[::3] + 0.1 * rng.normal(size=(27, 8))  # 1.5x faster, noisy
    constant = np.broadcast_to(stretched.mean(axis=0), stretched.shape)
    near = dtw_distance(stretched, sentence)
    assert near < dtw_distance(stretched, other) and near < dtw_distance(constant, sentence)
    assert dtw_distance(sentence, sentence) == 0.0
