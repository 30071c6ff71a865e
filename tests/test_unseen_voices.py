"""Validation's voices that training never heard (evaluation/voices.py): what it refuses, and its ceiling."""

from __future__ import annotations

import dataclasses

import pytest

from myxtts.config import load_config
from myxtts.data.manifest import read_manifest
from myxtts.data.text import Vocabulary
from myxtts.evaluation.voices import UnseenVoices, VoicesReport


def _vocabulary(rows, config):
    from myxtts.data.phonemes import model_texts

    return Vocabulary.from_texts(model_texts(rows, config.data.text_frontend), frontend=config.data.text_frontend)


def test_voices_that_training_uses_or_that_have_too_few_clips_are_refused(unseen_voices_corpus):
    config = load_config()
    rows = read_manifest(unseen_voices_corpus)
    vocabulary = _vocabulary(rows, config)
    heard = [dataclasses.replace(rows[0], audio_path="/elsewhere/a.wav")]  # a training row in an unseen voice
    with pytest.raises(ValueError, match=f"voices that training uses: {rows[0].speaker}"):
        UnseenVoices.from_rows(rows, heard, vocabulary, config)
    # Asked for (a fine-tuned voice, free_running_check.py --heard-voices): measured, and the report names it.
    measured = UnseenVoices.from_rows(rows, heard, vocabulary, config, sentences_per_voice=1, heard_ok=True)
    assert measured.heard == (rows[0].speaker,) and len(measured.centroids) == 2
    assert "2 voices (1 of them heard in training: a)" in VoicesReport(0.8, 1, 2, 0.9, 2, 2, heard=("a",)).summary()
    # Five clips per voice: 1 reference + 3 sentences leaves 1 recording for the voice, too few.
    with pytest.raises(ValueError, match="fewer than 6 clips"):
        UnseenVoices.from_rows(rows, [], vocabulary, config, sentences_per_voice=3)
    one_voice = [u for u in rows if u.speaker == rows[0].speaker]
    with pytest.raises(ValueError, match="at least two voices"):
        UnseenVoices.from_rows(one_voice, [], vocabulary, config, sentences_per_voice=1)


def test_the_ceiling_is_the_recordings_own_score_and_names_their_voices(unseen_voices_corpus, demo_corpus):
    # The recordings of the spoken sentences, through Griffin-Lim, against each voice's centroid
    # from its other recordings: each is nearest its own voice, and closer to it than to the other.
    config = load_config()
    rows = read_manifest(unseen_voices_corpus)
    voices = UnseenVoices.from_rows(rows, read_manifest(demo_corpus), _vocabulary(rows, config), config,
                                    sentences_per_voice=2)
    assert sorted(voices.centroids) == sorted({u.speaker for u in rows}) and len(voices.speakers) == 4
    assert voices.ceiling_identified == 4
    assert 0.6 < voices.ceiling_similarity <= 1.0
    # The spoken sentences are the ones after each voice's reference clip, none used for its centroid.
    first_voice = [u for u in rows if u.speaker == voices.speakers[0]]
    assert voices.sentences.texts[:2] == [u.text for u in first_voice[1:3]]
