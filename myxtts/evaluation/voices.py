"""Voices training never heard: does the model speak in a new voice from one clip of it?

    voices = UnseenVoices.from_rows(unseen_rows, train_rows, vocabulary, config)   # once
    report = voices.measure(network)                                              # at each validation
    report.similarity, report.identified, report.ceiling_similarity

For each voice of a corpus that no training row uses (`data.unseen_voices_data`, e.g. the demo
corpus builder's `--voices heldout`), in its rows' order: the first clip is the reference, the next
`sentences_per_voice` are the sentences the model speaks from their text in that voice (as
`utilities/synthesize.py --reference` would), and the rest are what the voice is: their speaker
embedding, averaged, is the voice's centroid. With `reference_clips` K > 1, the last K - 1 clips
join the first as references, averaged into one voice (`synthesize.py` with K `--reference`s), and
leave the centroid: the same sentences, spoken from more of the voice. Embeddings come from `speaker.py`, an encoder
independent of the model being trained.

`heard_ok=True` (free_running_check.py --heard-voices) measures a corpus whose voices training did use
the same way, with new sentences: the fine-tuning route (one voice learned from a few minutes of
it), or training voices as the measure of what the decoder renders at best.

- similarity: cosine between each synthesized sentence and its voice's centroid, averaged;
- identified: how many synthesized sentences are nearest their own voice's centroid among all the
  unseen voices;
- the ceiling: the same two for the recordings of the very sentences spoken, sent through the same
  Griffin-Lim as the model's output, so that the vocoder costs both sides alike.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.phonemes import model_texts, needs_phonemes, phonemize_utterances
from myxtts.data.text import Vocabulary
from myxtts.evaluation.speaker import SpeakerEncoder, cosine_similarity, identify
from myxtts.evaluation.speech import HeldOutSentences, trimmed_clip
from myxtts.progress import ProgressLine

# A centroid from fewer recordings than this is mostly the words, not the voice.
MIN_CENTROID_CLIPS = 2


@dataclass
class VoicesReport:
    similarity: float  # mean cosine of the synthesized sentences to their voice's centroid
    identified: int  # synthesized sentences nearest their own voice among the unseen voices
    total: int
    ceiling_similarity: float  # the same for the recordings of those sentences through Griffin-Lim
    ceiling_identified: int
    voices: int
    seconds: float = 0.0
    heard: tuple[str, ...] = ()  # voices of the corpus that training used (only with heard_ok)
    per_voice: dict[str, float] = field(default_factory=dict)  # each voice's mean similarity
    wer: float | None = None  # of the synthesized sentences, when measured with a scorer
    dnsmos: dict[str, float] | None = None  # their mean DNSMOS (ovrl, sig, bak, p808), when asked for

    @property
    def relative_similarity(self) -> float:
        return self.similarity / self.ceiling_similarity if self.ceiling_similarity > 0 else 0.0

    def summary(self) -> str:
        which = (f"{self.voices} voices ({len(self.heard)} of them heard in training: {', '.join(self.heard)})"
                 if self.heard else f"{self.voices} voices training never heard")
        return (f"{which}, {self.total} sentences: speaker similarity "
                f"{self.similarity:.3f} ({self.relative_similarity:.1%} of the recordings' {self.ceiling_similarity:.3f}), "
                f"identified {self.identified}/{self.total} (recordings {self.ceiling_identified}/{self.total})"
                + (f", WER {self.wer:.3f}" if self.wer is not None else "")
                + (f", DNSMOS overall {self.dnsmos['ovrl']:.2f}" if self.dnsmos else ""))


class UnseenVoices:
    """References, sentences and centroids of the unseen voices: built once, measured at each validation."""

    def __init__(self, sentences: HeldOutSentences, speakers: list[str], centroids: dict[str, np.ndarray],
                 ceiling: tuple[float, int], encoder: SpeakerEncoder, heard: tuple[str, ...] = (),
                 references: dict[str, list[Utterance]] | None = None, vocabulary: Vocabulary | None = None):
        self.sentences, self.speakers, self.centroids, self.encoder = sentences, speakers, centroids, encoder
        self.ceiling_similarity, self.ceiling_identified = ceiling
        self.heard = heard
        # Each voice's reference clips with their words, and the vocabulary to read them: what
        # `measure(fit_steps=)` fits the voice to.
        self.references, self.vocabulary = references or {}, vocabulary

    @classmethod
    def from_rows(cls, rows: list[Utterance], train_rows: list[Utterance], vocabulary: Vocabulary, config,
                  sentences_per_voice: int = 2, encoder: SpeakerEncoder | None = None,
                  heard_ok: bool = False, vocoder=None, reference_clips: int = 1) -> "UnseenVoices":
        d = config.data
        heard = {u.speaker for u in train_rows}
        by_voice: dict[str, list[Utterance]] = defaultdict(list)
        for u in rows:
            by_voice[u.speaker].append(u)
        overlap = sorted(set(by_voice) & heard)
        if overlap and not heard_ok:
            raise ValueError(f"data.unseen_voices_data has voices that training uses: {', '.join(overlap)}; "
                             "build it from other voices (utilities/make_demo_corpus.py --voices heldout), or measure "
                             "them as voices it heard (utilities/free_running_check.py --heard-voices)")
        needed = reference_clips + sentences_per_voice + MIN_CENTROID_CLIPS
        short = sorted(v for v, clips in by_voice.items() if len(clips) < needed)
        if short:
            raise ValueError(f"data.unseen_voices_data: voices {', '.join(short)} have fewer than {needed} clips "
                             f"({reference_clips} reference(s), {sentences_per_voice} sentences, {MIN_CENTROID_CLIPS} for the voice)")
        if len(by_voice) < 2:
            raise ValueError("data.unseen_voices_data needs at least two voices (identification picks among them)")
        encoder = encoder or SpeakerEncoder()
        speakers, spoken, references, extra, centroids, reference_rows = [], [], [], [], {}, {}
        for voice in sorted(by_voice):
            clips = by_voice[voice]
            more = clips[len(clips) - (reference_clips - 1):] if reference_clips > 1 else []
            reference_rows[voice] = [clips[0], *more]
            references += [clips[0].audio_path] * sentences_per_voice
            extra += [[u.audio_path for u in more]] * sentences_per_voice
            spoken += clips[1:1 + sentences_per_voice]
            speakers += [voice] * sentences_per_voice
            rest = [_recording(u.audio_path, d) for u in clips[1 + sentences_per_voice:len(clips) - len(more)]]
            centroids[voice] = encoder.embed_speaker(rest, d.sample_rate)
        sentences = HeldOutSentences.with_references(spoken, references, vocabulary, config, vocoder,
                                                     extra if reference_clips > 1 else None)
        # The ceiling: the recordings of the spoken sentences, through the same vocoder.
        recordings = [sentences.waveform(sentences.recording_mel(i)) for i in range(len(spoken))]
        ceiling = _totals(_score(encoder, recordings, speakers, centroids, d.sample_rate))
        return cls(sentences, speakers, centroids, ceiling, encoder, tuple(overlap), reference_rows, vocabulary)

    def measure(self, network, fit_steps: int = 0, head_ridge: float | None = None, scorer=None,
                quality: bool = False, show_progress: bool = False) -> VoicesReport:
        """The report; with `fit_steps`, each voice is fitted to its reference clips and their words
        (`voice_fit`, that many updates; with `head_ridge`, a mel head of its own too) instead of read
        from them by the encoder in one pass. With `scorer` (an IntelligibilityScorer whose language
        model holds these sentences), the syntheses' WER too; with `quality`, their DNSMOS
        (requirements-quality.txt). With `show_progress`, a progress line on stderr counts the voices
        fitted (seconds a clip each on a CPU: minutes for a corpus of voices)."""
        start = time.perf_counter()
        d = self.sentences.data_config
        mels = (self._fitted_mels(network, fit_steps, head_ridge, show_progress) if fit_steps
                else self.sentences.synthesize(network))
        waveforms = [self.sentences.waveform(mel) for mel in mels]
        scores = _score(self.encoder, waveforms, self.speakers, self.centroids, d.sample_rate)
        similarity, identified = _totals(scores)
        wer = None
        if scorer is not None:
            wer = scorer.score([(w, d.sample_rate, text) for w, text in zip(waveforms, self.sentences.texts)]).wer
        mos = None
        if quality:
            from myxtts.evaluation.quality import dnsmos

            each = [dnsmos(w, d.sample_rate) for w in waveforms]
            mos = {key: float(np.mean([clip[key] for clip in each])) for key in each[0]}
        by_voice = defaultdict(list)
        for speaker, (cosine, _) in zip(self.speakers, scores):
            by_voice[speaker].append(cosine)
        return VoicesReport(similarity, identified, len(waveforms), self.ceiling_similarity, self.ceiling_identified,
                            len(self.centroids), time.perf_counter() - start, self.heard,
                            {voice: float(np.mean(cosines)) for voice, cosines in by_voice.items()}, wer, mos)

    def _fitted_voices(self, network, steps: int, head_ridge: float | None = None, show_progress: bool = False) -> dict:
        """{voice: voice_fit.FittedVoice}, each fitted once to its reference clips and their words."""
        import tensorflow as tf

        from myxtts.data.clip_features import reference_log_mel
        from myxtts.models.voice_fit import fit_voice_to_clips

        d, fitted = self.sentences.data_config, {}
        progress = ProgressLine(f"fitting the voices ({steps} updates each)", len(self.references), "voices",
                                enabled=show_progress)
        for voice, rows in self.references.items():
            mels, lengths = zip(*(reference_log_mel(tf.constant(u.audio_path), d) for u in rows))
            token_ids = [self.vocabulary.encode(text, d.text_frontend) for text in model_texts(rows, d.text_frontend)]
            fitted[voice] = fit_voice_to_clips(network, tf.stack(mels), tf.stack(lengths),
                                               [trimmed_clip(u.audio_path, d)[0] for u in rows], token_ids, d,
                                               steps=steps, head_ridge=head_ridge)
            progress.update(len(fitted))
        progress.close()
        return fitted

    def _fitted_mels(self, network, steps: int, head_ridge: float | None, show_progress: bool = False) -> list[np.ndarray]:
        """Every sentence spoken in its fitted voice: a voice's sentences together, as each may wear
        its own mel head."""
        import tensorflow as tf

        from myxtts.models.voice_fit import speaking_as

        fitted = self._fitted_voices(network, steps, head_ridge, show_progress)
        voices = tf.concat([fitted[speaker].voice for speaker in self.speakers], axis=0)
        mels = [None] * len(self.speakers)
        for voice, fit in fitted.items():
            only = [i for i, speaker in enumerate(self.speakers) if speaker == voice]
            with speaking_as(network, fit):
                for i, mel in zip(only, self.sentences.synthesize(network, voices=voices, only=only)):
                    mels[i] = mel
        return mels


def unseen_voices_for(config, train_rows, vocabulary, echo=print, heard_ok: bool = False,
                      vocoder=None, reference_clips: int = 1) -> "UnseenVoices | None":
    """`data.unseen_voices_data` ready to measure at each validation (evaluation/voices.py), or None."""
    d, t = config.data, config.training
    if not d.unseen_voices_data or not t.voice_sentences:
        return None
    rows = read_manifest(d.unseen_voices_data)
    if d.text_frontend == "phonemes" and any(needs_phonemes(u, d.language) for u in rows):
        rows = phonemize_utterances(rows, d.language, write_cache=False)
    voices = UnseenVoices.from_rows(rows, train_rows, vocabulary, config, sentences_per_voice=t.voice_sentences,
                                    heard_ok=heard_ok, vocoder=vocoder, reference_clips=reference_clips)
    through = "the vocoder" if vocoder is not None else "Griffin-Lim"
    echo(f"unseen voices: {len(voices.centroids)} from {d.unseen_voices_data}; their recordings through {through} "
         f"score speaker similarity {voices.ceiling_similarity:.3f}, identified {voices.ceiling_identified}/"
         f"{len(voices.speakers)} (the ceiling of val_speaker_similarity / val_speaker_identified)")
    return voices


def _recording(path: str, d) -> np.ndarray:
    return trimmed_clip(path, d)[0].numpy()


def _score(encoder: SpeakerEncoder, waveforms, speakers, centroids, sample_rate) -> list[tuple[float, bool]]:
    """Per waveform: (cosine to its voice's centroid, whether its voice is the nearest centroid)."""
    embeddings = encoder.embed_many(waveforms, sample_rate)
    return [(float(cosine_similarity(e, centroids[s])), identify(e, centroids) == s) for e, s in zip(embeddings, speakers)]


def _totals(scores) -> tuple[float, int]:
    return float(np.mean([cosine for cosine, _ in scores])), int(sum(named for _, named in scores))



