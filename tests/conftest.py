"""Shared fixtures: one small demo corpus synthesized per test session (about two seconds)."""

import pytest


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    from myxtts.data.demo_corpus import make_demo_corpus

    return make_demo_corpus(tmp_path_factory.mktemp("demo"), num_utterances=24, seed=0, progress=False)
