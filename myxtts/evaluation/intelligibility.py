"""Intelligibility as a number: word error rate of an offline recognizer (pocketsphinx) on speech.

    scorer = IntelligibilityScorer(corpus_sentences, language=config.data.language)   # once
    result = scorer.score([(samples, 22050, "The old captain cleaned the clock."), ...])
    print(result.summary())      # "intelligibility: WER 0.18 (74 errors / 412 words, 24 clips), ..."

The recognizer is pocketsphinx's bundled en-us acoustic model with a language model built from the
corpus's own sentences (pocketsphinx's general English model gets espeak-ng speech mostly wrong:
WER 0.6-1.5 on the demo recordings). So it measures whether the sentence the model was asked for can be
heard among the corpus's sentences: a closed-vocabulary test, good for comparing checkpoints of one
run and telling speech from babble, not an absolute figure to compare with published ASR numbers.
On the demo corpus the recordings score 0.16-0.24, Griffin-Lim of their log-mel 0.07-0.09, white
noise and silence 1.0 (BENCHMARKS.md, "Intelligibility measure").

Text is normalized the same way for references and hypotheses (`normalize_text`). pocketsphinx is
imported when a recognizer is built, never at import; this module imports no TensorFlow. English
only: for another `data.language` the scorer returns a one-line "skipped" result instead of a number.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from myxtts.evaluation.pronunciation import Pronunciations, bundled_dictionary_path, pronunciations_for, read_dictionary

RECOGNIZER_SAMPLE_RATE = 16_000  # what the bundled acoustic model was trained on
# Level the recognizer hears; loudness is not what is measured, and int16 must not clip.
_INPUT_PEAK = 0.9
# Probability mass the language model keeps for n-grams the corpus lacks (pocketsphinx's builder
# defaults to 0.5). The corpus is the closed set the speech was drawn from, so trust its n-grams more:
# 0.2 gave WER 0.34 against 0.37 on 60 demo recordings, and 0.35 against 0.38 on the 24 validation
# recordings with a model of the other sentences only (4 Gaussians per frame).
_LM_DISCOUNT_MASS = 0.2
# Gaussians scored per frame (pocketsphinx default 4). On espeak-ng speech more help a lot: WER of
# 60 demo recordings 0.34 / 0.29 / 0.25 / 0.23 with 4 / 8 / 16 / 32, decoding at 0.06 / 0.07 /
# 0.10 / 0.17 s per audio second on this project's 2-core machine. 16 is the knee.
_GAUSSIANS_PER_FRAME = 16


# ---------------------------------------------------------------------------- text and word errors

def normalize_text(text: str) -> str:
    """Lower case, punctuation and hyphens to spaces, apostrophes inside words kept ("o'clock", "can't").

    Apostrophes at a word's edges are quotation marks and go; the CMU dictionary spells contractions
    and possessives with the apostrophe, so "Rosa's" stays "rosa's".
    """
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    words = (word.strip("'") for word in re.sub(r"[^\w']+|_", " ", text).split())
    return " ".join(word for word in words if word)


@dataclass(frozen=True)
class WordEdits:
    """The fewest word substitutions, deletions and insertions turning a reference into a hypothesis."""

    substitutions: int
    deletions: int
    insertions: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions


def word_edits(reference: Sequence[str], hypothesis: Sequence[str]) -> WordEdits:
    """Levenshtein alignment of two word lists; among equally short alignments, the one with most substitutions."""
    # cost[j] = (errors, -substitutions, deletions, insertions) of reference[:i] -> hypothesis[:j]; tuples
    # compare errors first, so the minimum is the edit distance, ties broken towards substitutions.
    previous = [(j, 0, 0, j) for j in range(len(hypothesis) + 1)]
    for i, reference_word in enumerate(reference, start=1):
        current = [(i, 0, i, 0)]
        for j, hypothesis_word in enumerate(hypothesis, start=1):
            e, s, d, n = previous[j - 1]
            diagonal = (e, s, d, n) if reference_word == hypothesis_word else (e + 1, s - 1, d, n)
            e, s, d, n = previous[j]
            deletion = (e + 1, s, d + 1, n)
            e, s, d, n = current[j - 1]
            insertion = (e + 1, s, d, n + 1)
            current.append(min(diagonal, deletion, insertion))
        previous = current
    _, negative_substitutions, deletions, insertions = previous[-1]
    return WordEdits(-negative_substitutions, deletions, insertions)


@dataclass(frozen=True)
class UtteranceScore:
    """One clip: normalized reference and hypothesis, word errors and reference word count."""

    reference: str
    hypothesis: str
    errors: int
    words: int

    @property
    def rate(self) -> float:
        """errors / reference words (0 for an empty reference heard as nothing, inf if words were heard)."""
        if self.words == 0:
            return 0.0 if self.errors == 0 else float("inf")
        return self.errors / self.words


def utterance_word_errors(references: Sequence[str], hypotheses: Sequence[str]) -> list[UtteranceScore]:
    """Per-utterance form of `word_error_rate`: one `UtteranceScore` per (reference, hypothesis) pair."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses; they must pair up")
    scores = []
    for reference, hypothesis in zip(references, hypotheses):
        reference, hypothesis = normalize_text(reference), normalize_text(hypothesis)
        edits = word_edits(reference.split(), hypothesis.split())
        scores.append(UtteranceScore(reference, hypothesis, edits.errors, len(reference.split())))
    return scores


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total word edits (substitutions + deletions + insertions) / total reference words, over all pairs.

    Both sides are normalized with `normalize_text`. Can exceed 1 when the hypotheses insert words.
    """
    scores = utterance_word_errors(references, hypotheses)
    words = sum(score.words for score in scores)
    if words == 0:
        raise ValueError("the references hold no words, so there is no word error rate; pass the texts that were spoken")
    return sum(score.errors for score in scores) / words


# ------------------------------------------------------------------------------------- recognizer

def skip_reason(language: str) -> str | None:
    """Why intelligibility cannot be measured for this espeak language code, or None for English."""
    code = language.strip().lower().replace("_", "-")
    if code == "en" or code.startswith("en-"):
        return None
    return (f"skipped: the bundled recognizer (pocketsphinx en-us) hears English only, and data.language "
            f"is {language!r}")


class Recognizer:
    """pocketsphinx with a language model of a corpus's own sentences; built once, then `transcribe`.

    `sentences` are the texts the speech may say (all of the corpus's, or the training split's to
    keep the validation sentences unseen). `pronunciations` adds ARPAbet entries for words the CMU
    dictionary lacks (see myxtts/evaluation/pronunciation.py for those derived automatically).
    `directory` keeps the language model (corpus.lm, ARPA) and dictionary (corpus.dict) written
    there; by default they go to a temporary folder deleted once the decoder has loaded them.
    """

    def __init__(self, sentences: Iterable[str], *, pronunciations: Mapping[str, str] | None = None,
                 directory: str | os.PathLike | None = None):
        from pocketsphinx import Decoder, get_model_path
        from pocketsphinx.lm import ArpaBoLM

        texts = [text for text in (normalize_text(sentence) for sentence in sentences) if text]
        if not texts:
            raise ValueError("no sentences with words to build the recognizer's language model from")
        words = {word for text in texts for word in text.split()}
        self.pronunciations: Pronunciations = pronunciations_for(words, read_dictionary(bundled_dictionary_path()), pronunciations)
        unpronounceable = set(self.pronunciations.unpronounceable)
        # The language model may only hold words with a pronunciation; those without stay in the references.
        lm_lines = [" ".join(w for w in text.split() if w not in unpronounceable) for text in texts]
        language_model = ArpaBoLM(text="\n".join(line for line in lm_lines if line), add_start=True,  # <s> ... </s>
                                  discount_mass=_LM_DISCOUNT_MASS)
        language_model.compute()

        with tempfile.TemporaryDirectory(prefix="myxtts-recognizer-") as scratch:
            folder = os.fspath(directory) if directory is not None else scratch
            os.makedirs(folder, exist_ok=True)
            lm_path, dictionary_path = os.path.join(folder, "corpus.lm"), os.path.join(folder, "corpus.dict")
            with open(lm_path, "w", encoding="utf-8") as out:
                language_model.write(out)
            self.pronunciations.write(dictionary_path)
            self._decoder = Decoder(hmm=get_model_path("en-us/en-us"), lm=lm_path, dict=dictionary_path,
                                    samprate=RECOGNIZER_SAMPLE_RATE, topn=_GAUSSIANS_PER_FRAME, loglevel="FATAL")

    @property
    def unpronounceable(self) -> tuple[str, ...]:
        """Corpus words without a pronunciation: never recognized, so an error wherever they are said."""
        return self.pronunciations.unpronounceable

    def transcribe(self, audio, sample_rate: int) -> str:
        """Normalized text heard in mono `audio` (float samples [n], any scale) at `sample_rate` Hz."""
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"transcribe takes mono samples [n], got shape {samples.shape}; average the channels first")
        if samples.size == 0:
            return ""
        if sample_rate != RECOGNIZER_SAMPLE_RATE:
            import soxr

            samples = soxr.resample(samples, sample_rate, RECOGNIZER_SAMPLE_RATE)
        peak = float(np.max(np.abs(samples)))
        if not np.isfinite(peak):
            raise ValueError("audio holds NaN or infinite samples")
        if peak > 0:
            samples = samples * (_INPUT_PEAK / peak)
        pcm = np.round(samples * 32767.0).astype("<i2")
        # Each clip heard afresh: without this the features carry state from the clips before, and one
        # clip in 30 was heard differently in reverse order, so decoding in processes changed the WER.
        self._decoder.reinit_feat()
        self._decoder.start_utt()
        self._decoder.process_raw(pcm.tobytes(), full_utt=True)
        self._decoder.end_utt()
        hypothesis = self._decoder.hyp()
        return normalize_text(hypothesis.hypstr) if hypothesis is not None else ""


def read_pcm16(path) -> tuple[np.ndarray, int]:
    """(float samples in [-1, 1), sample rate) of a 16-bit mono WAV clip, as corpora hold them;
    ValueError naming the file for any other format."""
    import wave

    try:
        with wave.open(str(path), "rb") as clip:
            if clip.getsampwidth() != 2 or clip.getnchannels() != 1:
                raise ValueError(f"{path}: 16-bit mono WAV expected; convert it with utilities/prepare_dataset.py")
            return np.frombuffer(clip.readframes(clip.getnframes()), "<i2").astype(np.float32) / 32768.0, clip.getframerate()
    except (wave.Error, EOFError) as error:  # EOFError: shorter than a RIFF header
        raise ValueError(f"{path}: not a readable WAV file ({str(error) or 'cut off before its header ends'}); check or "
                         "convert the corpus with utilities/prepare_dataset.py") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None


# ---------------------------------------------------------------------------------------- scoring

@dataclass(frozen=True)
class IntelligibilityResult:
    """WER over clips, with per-clip rows; `skipped` holds the reason when nothing was measured."""

    wer: float | None
    rows: tuple[UtteranceScore, ...] = ()
    audio_seconds: float = 0.0
    decode_seconds: float = 0.0
    unpronounceable: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def seconds_per_audio_second(self) -> float:
        """Decoding time per second of audio (resampling included); below 1 is faster than real time."""
        return self.decode_seconds / self.audio_seconds if self.audio_seconds else 0.0

    def summary(self) -> str:
        """One line for the console or a log."""
        if self.skipped is not None:
            return f"intelligibility: {self.skipped}"
        errors, words = sum(r.errors for r in self.rows), sum(r.words for r in self.rows)
        line = (f"intelligibility: WER {self.wer:.3f} ({errors} errors / {words} words, {len(self.rows)} clips), "
                f"decoded {self.audio_seconds:.1f} s of audio in {self.decode_seconds:.1f} s")
        if self.unpronounceable:
            line += f"; {len(self.unpronounceable)} words without a pronunciation count as errors: {', '.join(self.unpronounceable[:5])}"
        return line


def score_intelligibility(clips: Iterable[tuple[object, int, str]], recognizer: Recognizer, pool=None) -> IntelligibilityResult:
    """Transcribe each (audio, sample_rate, reference_text) and score the hypotheses against the references.

    With `pool` (an executor whose workers each hold a `Recognizer` of the same sentences, as
    `IntelligibilityScorer` makes it), each clip is decoded there as soon as `clips` yields it, so
    decoding runs beside whatever makes the next clip; decode_seconds is then the wall time."""
    references, hypotheses, pending = [], [], []
    audio_seconds = decode_seconds = 0.0
    started = time.perf_counter()
    for audio, sample_rate, reference in clips:
        if pool is None:
            start = time.perf_counter()
            hypotheses.append(recognizer.transcribe(audio, sample_rate))
            decode_seconds += time.perf_counter() - start
        else:
            pending.append(pool.submit(_transcribe_in_worker, np.asarray(audio, dtype=np.float32), sample_rate))
        audio_seconds += np.shape(audio)[0] / sample_rate
        references.append(reference)
    if not references:
        raise ValueError("no clips to score")
    if pool is not None:
        hypotheses = [future.result() for future in pending]
        decode_seconds = time.perf_counter() - started
    rows = tuple(utterance_word_errors(references, hypotheses))
    heard = set(recognizer.unpronounceable) & {w for row in rows for w in row.reference.split()}
    return IntelligibilityResult(word_error_rate(references, hypotheses), rows, audio_seconds, decode_seconds,
                                 tuple(sorted(heard)))


# One recognizer per worker process: pocketsphinx holds the GIL while it decodes, so threads would
# take turns; processes decode side by side (on the H200's 16 cores the demo's 24 clips took 27.8 s
# one after another).
_worker_recognizer: Recognizer | None = None


def _start_worker(sentences: list[str], options: dict) -> None:
    global _worker_recognizer
    _worker_recognizer = Recognizer(sentences, **options)


def _transcribe_in_worker(audio: np.ndarray, sample_rate: int) -> str:
    return _worker_recognizer.transcribe(audio, sample_rate)


def default_workers(clips: int | None = None) -> int:
    """Decoding processes: the usable cores, at most 8, and at most one per 4 of `clips` (a process
    takes about a second to start: a few clips decode sooner here)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable, 8, clips // 4 if clips is not None else 8))


class IntelligibilityScorer:
    """Build once per run (the language model is fitted here), then `score` at every validation.

    For a non-English `language` (espeak code, `data.language`) nothing is built, and `score` returns
    a result whose `summary()` says it was skipped and why. With `workers` > 1 (default: the usable
    cores, at most 8) clips are decoded in that many processes, started at the first `score` and
    kept until `close()` or the end of the program; 1 decodes in this process.
    """

    def __init__(self, sentences: Iterable[str], language: str = "en-us", workers: int | None = None,
                 **recognizer_options):
        self.skipped = skip_reason(language)
        self.sentences = list(sentences)
        self.recognizer = None if self.skipped else Recognizer(self.sentences, **recognizer_options)
        self.workers = default_workers() if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        # Each worker writes its own model files: a shared `directory` would be written by all at once.
        self._options = {key: value for key, value in recognizer_options.items() if key != "directory"}
        self._pool = None

    def score(self, clips: Iterable[tuple[object, int, str]]) -> IntelligibilityResult:
        if self.recognizer is None:
            return IntelligibilityResult(wer=None, skipped=self.skipped)
        if self.workers > 1 and self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a fork of a process running TensorFlow's threads can deadlock.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start_worker, initargs=(self.sentences, self._options))
        if self._pool is None:
            return score_intelligibility(clips, self.recognizer)
        clips, seen = iter(clips), []  # what was handed out is kept: decoded here if the processes fail

        def passing():
            for clip in clips:
                seen.append(clip)
                yield clip

        try:
            return score_intelligibility(passing(), self.recognizer, self._pool)
        except BrokenProcessPool as error:  # a worker died (killed, or a main module without its guard)
            warnings.warn(f"intelligibility: the decoding processes failed ({error}); decoding in this process")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self.workers = None, 1
            return score_intelligibility(itertools.chain(seen, clips), self.recognizer)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
