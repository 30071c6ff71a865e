"""Does the trained model say its sentences? Synthesis of held-out sentences, measured.

    sentences = HeldOutSentences.from_rows(val_rows, train_rows, vocabulary, config)   # once
    report = sentences.measure(network, scorer)      # at every validation
    report.wer, report.length_ratio, report.rows

Each held-out sentence is spoken from its text alone (durations predicted, nothing taken from its
recording) in its own speaker's voice, with another clip of that speaker as the reference, exactly
as a user would synthesize it. The audio goes through the same vocoder as `utilities/synthesize.py`
(the neural vocoder passed in, else Griffin-Lim), then through the recognizer (`intelligibility.py`).
The recordings' own WER through the same vocoder is the ceiling to read it against (`recordings_wer`).
A synthesis is cut at `LENGTH_CAP` times its recording's length: an untrained model's durations run
to ~20 times it, and the vocoder, the recognizer and the speaker encoder would spend that much longer
on audio that says nothing; a model that speaks lands near 1 (0.96-0.98 in BENCHMARKS.md's runs).

`alignment_errors` measures the learned alignment itself where ground truth exists (the demo
corpus's espeak-ng phoneme timings): where the model's aligner puts each phoneme's start, against
where espeak-ng says it started.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from myxtts.data import audio
from myxtts.data.manifest import Utterance
from myxtts.data.phoneme_timing import read_timing, timing_path
from myxtts.data.phonemes import model_texts
from myxtts.data.clip_features import reference_log_mel
from myxtts.data.references import assign_references
from myxtts.data.text import PAD_ID, Vocabulary, split_symbols
from myxtts.evaluation.intelligibility import IntelligibilityScorer
from myxtts.models.inference import generate
from myxtts.models.vocoder import waveform_maker
from myxtts.progress import ProgressLine

# Sentences synthesized per call: a batch pads to its longest text and frame count.
_BATCH = 8
# A synthesis is cut at this many times its recording's frames (length_ratio is at most this).
LENGTH_CAP = 3.0


def cap_note(ratio: float) -> str:
    """What to add after a length ratio that reached `LENGTH_CAP`: the durations ran longer still."""
    return f" (the cap: a synthesis is cut at x{LENGTH_CAP:g} its recording)" if ratio >= LENGTH_CAP else ""


@dataclass
class SpeechReport:
    wer: float | None  # None when the language is not measured (summary says why)
    length_ratio: float  # median of synthesized / recorded (trimmed) length, at most LENGTH_CAP
    rows: list = field(default_factory=list)  # intelligibility rows: reference, hypothesis, errors
    seconds: float = 0.0  # wall time of synthesis + vocoder + recognition
    summary: str = ""
    mels: list = field(default_factory=list)  # the synthesized log-mels [frames, n_mels]


class HeldOutSentences:
    """The sentences, their tokens, their speakers' reference clips and recorded lengths: built once."""

    def __init__(self, texts, audio_paths, tokens, reference_mel, reference_length, recorded_frames, data_config,
                 vocoder=None, extra_references=None):
        self.texts = list(texts)
        self.audio_paths = list(audio_paths)
        self.tokens = tokens  # [N, L] int32, PAD_ID-padded
        self.reference_mel, self.reference_length = reference_mel, reference_length
        self.recorded_frames = np.asarray(recorded_frames)
        self.data_config = data_config
        # Per sentence, (mel, length) of more clips of its voice, averaged with the first; None: one clip.
        self.extra_references = extra_references
        self.vocoder = vocoder  # a models.vocoder.Vocoder, or None: Griffin-Lim
        self.to_audio = waveform_maker(data_config, vocoder)

    @classmethod
    def from_rows(cls, rows: list[Utterance], train_rows: list[Utterance], vocabulary: Vocabulary, config,
                  limit: int | None = None, vocoder=None) -> "HeldOutSentences":
        """The first `limit` of `rows` (phonemized when the front end needs it). The voice reference
        of each is another clip of its speaker, chosen as the validation set chooses it."""
        rows = list(rows)[:limit] if limit else list(rows)
        if not rows:
            raise ValueError("no held-out sentences to measure")
        pool = rows + [u for u in train_rows if u.speaker in {r.speaker for r in rows}]
        return cls.with_references(rows, assign_references(pool, config.seed)[: len(rows)], vocabulary, config, vocoder)

    @classmethod
    def with_references(cls, rows: list[Utterance], references: list[str], vocabulary: Vocabulary,
                        config, vocoder=None, extra: list[list[str]] | None = None) -> "HeldOutSentences":
        """`rows` (phonemized when the front end needs it), each spoken in the voice of the clip at the
        same place in `references`, averaged with the clips `extra[i]` when given (as
        `synthesize.py --reference A --reference B` does)."""
        d = config.data
        ids = [vocabulary.encode(text, d.text_frontend) for text in model_texts(rows, d.text_frontend)]
        tokens = np.full((len(ids), max(map(len, ids))), PAD_ID, np.int32)
        for i, row in enumerate(ids):
            tokens[i, : len(row)] = row
        mels, lengths = zip(*(reference_log_mel(tf.constant(path), d) for path in references))
        recorded = [_recorded_frames(u.audio_path, d) for u in rows]
        extra_mels = None if extra is None else [[reference_log_mel(tf.constant(p), d) for p in paths] for paths in extra]
        return cls([u.text for u in rows], [u.audio_path for u in rows], tokens, tf.stack(mels), tf.stack(lengths), recorded, d,
                   vocoder, extra_mels)

    def synthesize(self, network, voices=None, only: list[int] | None = None) -> list[np.ndarray]:
        """Log-mels [frames, n_mels] of every sentence (or those at `only`), each cut to its own length;
        in `voices` [N, d] (one per sentence, e.g. fitted: `voice_fit`) instead of the references' when
        given."""
        chosen = list(only) if only is not None else list(range(len(self.texts)))
        mels = []
        for start in range(0, len(chosen), _BATCH):
            rows = chosen[start:start + _BATCH]
            tokens = self.tokens[rows]
            tokens = tokens[:, : int((tokens != PAD_ID).sum(axis=1).max())]
            caps = [max(math.ceil(LENGTH_CAP * self.recorded_frames[i]), 1) for i in rows]
            limit = max(caps)
            if voices is not None:
                mel, length = generate(network, tokens, voice=tf.gather(voices, rows), max_frames=limit)
            elif self.extra_references is None:
                mel, length = generate(network, tokens, tf.gather(self.reference_mel, rows),
                                       tf.gather(self.reference_length, rows), max_frames=limit)
            else:
                mel, length = generate(network, tokens, voice=self._averaged_voices(network, rows), max_frames=limit)
            mels += [m[:min(n, cap)] for m, n, cap in zip(mel.numpy(), length.numpy(), caps)]
        return mels

    def _averaged_voices(self, network, rows: list[int]) -> tf.Tensor:
        voices = []
        for i in rows:
            mels = [self.reference_mel[i]] + [m for m, _ in self.extra_references[i]]
            lengths = [self.reference_length[i]] + [n for _, n in self.extra_references[i]]
            voices.append(network.voice(tf.stack(mels), tf.stack(lengths), average=True)[0])
        return tf.stack(voices)

    def recording_mel(self, index: int) -> np.ndarray:
        """The log-mel of sentence `index`'s recording, as training sees it."""
        return audio.log_mel(trimmed_clip(self.audio_paths[index], self.data_config)[0], self.data_config).numpy()

    def waveform(self, log_mel) -> np.ndarray:
        """Samples of a log-mel [frames, n_mels] through this measure's vocoder."""
        return self.to_audio(tf.constant(log_mel)).numpy()

    def measure(self, network, scorer: IntelligibilityScorer, show_progress: bool = False) -> SpeechReport:
        """Speak every sentence and score its words; with `show_progress`, a progress line on stderr (a
        real corpus's validation split is hundreds of sentences: minutes)."""
        start = time.perf_counter()
        progress = ProgressLine("speaking the sentences", len(self.texts), "sentences", enabled=show_progress)
        rate, mels = self.data_config.sample_rate, []

        def clips():  # a batch spoken and vocoded as the recognizer asks for its sentences
            for first in range(0, len(self.texts), _BATCH):
                batch = list(range(first, min(first + _BATCH, len(self.texts))))
                for i, mel in zip(batch, self.synthesize(network, only=batch)):
                    mels.append(mel)
                    yield self.waveform(mel), rate, self.texts[i]
                    progress.update(len(mels))

        result = scorer.score(clips())
        progress.close()
        if len(mels) < len(self.texts):  # a scorer without a recognizer (its language) reads no clip
            mels += self.synthesize(network, only=range(len(mels), len(self.texts)))
        ratio = float(np.median([len(m) / max(n, 1) for m, n in zip(mels, self.recorded_frames)]))
        return SpeechReport(result.wer, ratio, list(result.rows), time.perf_counter() - start, result.summary(), mels)


def recordings_wer(rows: list[Utterance], data_config, scorer: IntelligibilityScorer, vocoder=None,
                   show_progress: bool = False):
    """The ceiling: the recordings of `rows`, trimmed as in training, to log-mel and back through
    the same vocoder (`vocoder`, else Griffin-Lim), through the same recognizer (an IntelligibilityResult)."""
    to_audio = waveform_maker(data_config, vocoder)
    progress = ProgressLine("the recordings through the vocoder", len(rows), "clips", enabled=show_progress)

    def clips():
        for done, u in enumerate(rows, 1):
            mel = audio.log_mel(trimmed_clip(u.audio_path, data_config)[0], data_config)
            yield to_audio(mel).numpy(), data_config.sample_rate, u.text
            progress.update(done)

    result = scorer.score(clips())
    progress.close()
    return result


def alignment_errors(network, rows: list[Utterance], vocabulary: Vocabulary, data_config) -> dict:
    """Phoneme start times of the model's aligner against espeak-ng's (demo corpus timing files).

    For each row with a timing file whose phonemes are the row's phoneme symbols (stress marks
    aside; a voice with another accent, `en+m7`, says other phonemes and is skipped), the
    recording is trimmed and featurized as in training, aligned by the model (Viterbi path of its
    frame classifier), and each phoneme's first frame is compared with espeak-ng's start sample
    (shifted by the trimmed lead-in). Returns {"clips", "skipped", "phonemes", "median_ms", "p90_ms"}.
    """
    d = data_config
    errors_ms, clips, skipped = [], 0, 0
    for row, text in zip(rows, model_texts(rows, d.text_frontend)):
        path = timing_path(row.audio_path)
        if d.text_frontend != "phonemes" or not path.is_file():
            skipped += 1
            continue
        timing = read_timing(path)
        symbols = split_symbols(text, d.text_frontend)
        spoken = [(i, _unstressed(s)) for i, s in enumerate(symbols) if s.strip(" ,.?!;:")]
        truth = [(_unstressed(name), start) for name, start in zip(timing.phonemes, timing.start_samples) if name != "_"]
        if [name for name, _ in truth] != [name for _, name in spoken]:
            skipped += 1
            continue
        samples, lead_in = trimmed_clip(row.audio_path, d)
        mel = audio.log_mel(samples, d)[None]
        tokens = tf.constant([vocabulary.encode(text, d.text_frontend)], tf.int32)
        mel_length, text_length = tf.shape(mel)[1:2], tf.shape(tokens)[1:2]
        durations = network.align(mel, mel_length, tokens, text_length)[2][0].numpy()
        first_frame = np.concatenate([[0], np.cumsum(durations)[:-1]])
        for (token, _), (_, start) in zip(spoken[1:], truth[1:]):  # the first phoneme starts the trimmed clip
            truth_ms = (start - lead_in) / d.sample_rate * 1000.0
            found_ms = first_frame[token] * d.hop_length / d.sample_rate * 1000.0
            errors_ms.append(abs(found_ms - truth_ms))
        clips += 1
    if not errors_ms:
        return {"clips": 0, "skipped": skipped, "phonemes": 0, "median_ms": math.nan, "p90_ms": math.nan}
    return {"clips": clips, "skipped": skipped, "phonemes": len(errors_ms),
            "median_ms": float(np.median(errors_ms)), "p90_ms": float(np.percentile(errors_ms, 90))}


def _unstressed(phoneme: str) -> str:
    return phoneme.replace("ˈ", "").replace("ˌ", "")


def trimmed_clip(path: str, d):
    """The clip as training sees it (resampled, trimmed, peak-normalised) and the samples cut from its start."""
    samples, rate = audio.load_wav(tf.constant(path))
    samples = audio.resample_to(samples, rate, d.sample_rate, source=path)
    start = 0
    if d.trim_silence_db > 0:
        start, end = audio.silence_bounds(samples, d.trim_silence_db)
        samples = samples[start:end]
    return audio.peak_normalize(samples, d.peak_normalize), int(start)


def _recorded_frames(path: str, d) -> int:
    return d.frames_for_samples(int(tf.shape(trimmed_clip(path, d)[0])[0]))

