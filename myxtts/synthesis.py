"""From a trained run to audio: load config, vocabulary and checkpoint; text + reference -> WAV.

Used by utilities/synthesize.py, export.py and train_main's closing sample. It reads run folders and
checkpoints, so it sits above `myxtts.models` and `myxtts.training` (models import neither). Features and tokens go
through the same functions as training (`phonemes.model_text` with the run's data.text_frontend and
data.language, `reference_log_mel`, `tokenize`), so inference sees exactly what the model was trained on.

A phoneme (or character) the run's training set never held has no token of its own: `tokenize` reads
it as <unk>, whose embedding training never updated. Training refuses such tokens (`run_folder`), and
so does synthesis: `UnknownSymbols` names them, the words that hold them, and the ways out; with
`drop_unknown=True` they are left out and listed in the result instead.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from myxtts.config import Config, load_run_config
from myxtts.data.audio import data_problem, load_wav, without_advice
from myxtts.data.phonemes import model_text
from myxtts.data.clip_features import reference_log_mel
from myxtts.data.text import PAD_ID, UNK_ID, Vocabulary, symbols, tokenize
from myxtts.data.wav_header import SILENT_PEAK
from myxtts.evaluation.speech import trimmed_clip
from myxtts.models.griffin_lim import write_wav
from myxtts.models import voice_fit
from myxtts.models.inference import generate
from myxtts.models.vocoder import Vocoder, is_vocoder_folder, load_vocoder, waveform_maker
from myxtts.models.xtts import XTTS, network_for


# A reference clip shorter than this, or whose loudest sample is below SILENT_PEAK (-60 dBFS), carries
# no voice: the model would still speak, in whatever voice its encoder makes of silence or a click,
# and say nothing of it. Training's references are 3 s (data.reference_duration_s).
MIN_REFERENCE_S = 0.5
# What a reference clip must be: what `reference_log_mel` reads (`audio.decode_wav_bytes`, `audio.SUPPORTED_RATES`).
REFERENCE_FORMAT = "give a whole 16-bit PCM WAV of the voice (mono or stereo, 8 to 48 kHz)"


def reference_problem(path, middle_seconds: float) -> str | None:
    """Why the WAV at `path` (readable) cannot lend its voice: too short, or silent in the middle
    `middle_seconds`, which is what the voice is read from (`reference_log_mel`); None when it can."""
    samples, rate = load_wav(str(path), middle_seconds=middle_seconds)
    seconds = int(samples.shape[0]) / int(rate)
    if seconds < MIN_REFERENCE_S:
        return f"{path} holds {seconds:.2f} s of audio; a voice needs at least {MIN_REFERENCE_S:g} s (3 s or more clones best)"
    peak = float(tf.reduce_max(tf.abs(samples)))
    if peak < SILENT_PEAK:
        level = f"its loudest sample at {20 * math.log10(peak):.0f} dBFS" if peak > 0 else "every sample zero"
        return (f"{path} is silent where its voice is read (at most its middle {middle_seconds:g} s: {level}); "
                f"give a clip of the voice speaking")
    return None


# Text is spoken a sentence at a time: the model learned from clips of one sentence (at most
# data.max_duration_s), and a paragraph spoken whole loses its words as it grows (BENCHMARKS.md,
# "Long text": 8 sentences whole, WER 0.15-0.35; one by one, 0-0.006). Between sentences, a pause.
SENTENCE_PAUSE_S = 0.3
_SENTENCES_PER_CALL = 8  # a call pads its sentences to the longest one
# Where a sentence may end: . ! ? an ellipsis or the Arabic question mark, any closing quotes or
# brackets, then space; the full-width 。！？ need no space after them.
_SENTENCE_END = re.compile("(?:(?<=[.!?\u2026\u061f])[\"'\u201d\u2019\u00bb)\\]]*\\s+"
                           "|(?<=[\u3002\uff01\uff1f])[\"'\u201d\u2019\u00bb)\\]]*\\s*)")
# English abbreviations whose period ends no sentence ("Dr. Smith"), and initials ("J. R. Tolkien").
_NOT_AN_END = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Jr|Sr|St|Mt)|\b[A-Z])\.[\"'\u201d\u2019\u00bb)\]]*$")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, in order, stripped: a sentence ends at a line break, or at a sentence
    mark and space unless a lowercase letter follows ("e.g. this") or the mark ends an abbreviation or
    an initial. A text without one is one sentence."""
    sentences, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        if text[end.end():end.end() + 1].islower() or _NOT_AN_END.search(text[start:end.start()] + end.group().strip()):
            continue  # a line break inside the match still ends the sentence, below
        sentences.append(text[start:end.end()].strip())
        start = end.end()
    sentences.append(text[start:].strip())
    lines = [line for sentence in sentences for line in sentence.splitlines()]  # a line break ends one too
    return [line.strip() for line in lines if line.strip()]


# Characters of the text a message quotes: enough to recognise it; a 5,000-character text quoted
# whole buried the words that say what is wrong.
_QUOTED_CHARS = 60


def _quoted(text: str) -> str:
    """`text` as a message quotes it: repr'd, cut to its first _QUOTED_CHARS characters."""
    return repr(text) if len(text) <= _QUOTED_CHARS else f"{text[:_QUOTED_CHARS]!r}... ({len(text):,} characters)"


class UnknownSymbols(ValueError):
    """The text holds symbols the run's vocabulary lacks; `symbols` lists them in order of appearance."""

    def __init__(self, message: str, unknown: list[str]):
        super().__init__(message)
        self.symbols = unknown


GRIFFIN_LIM = "griffin-lim"
RUN_VOCODER = "vocoder"  # RUN/vocoder: the run's own vocoder (train_vocoder.py --run RUN writes it)


def vocoder_folder(run_dir, config: Config, choice: str | None = None) -> str | None:
    """Where the vocoder to speak with lies, or None for Griffin-Lim: `choice` when given (a vocoder
    folder, or "griffin-lim"); else the run's own (RUN/vocoder); else the config's `training.vocoder`."""
    if choice:
        return None if choice == GRIFFIN_LIM else str(choice)
    if run_dir is not None and is_vocoder_folder(Path(run_dir) / RUN_VOCODER):
        return str(Path(run_dir) / RUN_VOCODER)
    return config.training.vocoder or None


def run_vocoder(run_dir, config: Config, choice: str | None = None) -> Vocoder | None:
    """The loaded vocoder `vocoder_folder` names (None: Griffin-Lim); errors name the folder and what is wrong."""
    folder = vocoder_folder(run_dir, config, choice)
    return None if folder is None else load_vocoder(folder, config.data)


class Synthesizer:
    def __init__(self, network: XTTS, config: Config, vocabulary: Vocabulary, run_dir: str | os.PathLike | None = None,
                 vocoder: Vocoder | None = None):
        self.network, self.config, self.vocabulary = network, config, vocabulary
        self.run_dir = run_dir  # named in messages; None for a synthesizer built in memory
        self.vocoder = vocoder  # None: Griffin-Lim
        self.checkpoint: str | None = None  # the checkpoint its weights came from (`from_run`), named in reports
        self.to_audio = waveform_maker(config.data, vocoder)
        self._table = vocabulary.lookup_table()

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike, checkpoint: str | None = None, vocoder: str | None = None) -> "Synthesizer":
        """Load `run_dir`'s config.yaml and vocab.txt, and `checkpoint`: a checkpoint prefix or one of the
        run's checkpoint folders (default: the run's best_wer, else best_mel, else latest; `find_checkpoint`).
        `vocoder`: a vocoder folder or "griffin-lim"; by default the run's own (`vocoder_folder`)."""
        from myxtts.training.checkpoints import read_newest, restore_network
        from myxtts.training.run_folder import read_vocabulary

        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"{run_dir} is not a MyXTTS run folder (no config.yaml); pass the --output-dir of a training run")
        config = load_run_config(run_dir / "config.yaml")
        vocabulary = read_vocabulary(run_dir)
        network = network_for(config, len(vocabulary), vocabulary.word_boundary_id)
        network.build()
        # the newest when a training running in the folder deleted the one found (`read_newest`)
        path, _ = read_newest(checkpoint or run_dir, lambda path: restore_network(network, path))
        synthesizer = cls(network, config, vocabulary, run_dir, run_vocoder(run_dir, config, vocoder))
        synthesizer.checkpoint = path
        return synthesizer

    def checkpoint_line(self) -> str:
        """"checkpoint: PATH (step N)": which weights a report measured; a run still training has newer ones,
        and best_wer or best_mel (taken first) can be far behind its latest."""
        from myxtts.training.checkpoints import CheckpointError, read_meta

        try:
            step = read_meta(self.checkpoint).get("step")
        except (CheckpointError, OSError, ValueError):  # not written by MyXTTS, or deleted since by its training
            step = None
        return f"checkpoint: {self.checkpoint}" + (f" (step {step})" if isinstance(step, int) else "")

    def reference(self, paths) -> tuple[tf.Tensor, tf.Tensor]:
        """Reference mels [N, R, n_mels] and lengths [N] for one or more clips of the voice."""
        clips = []
        for path in paths:
            if Path(path).is_dir():
                raise FileNotFoundError(f"reference audio {path} is a folder: give one or more of its WAV files")
            if not Path(path).is_file():
                raise FileNotFoundError(f"reference audio not found: {path}")
            try:
                clips.append(reference_log_mel(tf.constant(str(path)), self.config.data))
            except tf.errors.InvalidArgumentError as error:
                problem = data_problem(error)  # names the file and what to do with it in a corpus
                if problem:  # one clip is not converted by prepare_dataset.py (it wants a manifest with words)
                    problem = f"{without_advice(problem)} - {REFERENCE_FORMAT}"
                raise ValueError(f"cannot use as a reference voice: {problem}" if problem else
                                 f"cannot use as a reference voice: {path} ({error.message.strip().splitlines()[-1]}) "
                                 f"- {REFERENCE_FORMAT}") from None
            if problem := reference_problem(path, self.config.data.reference_duration_s):
                raise ValueError(f"cannot use as a reference voice: {problem}")
        return tf.stack([m for m, _ in clips]), tf.stack([n for _, n in clips])

    def tokens(self, text: str, drop_unknown: bool = False) -> tuple[tf.Tensor, list[str]]:
        """The token ids [L] int32 of `text`, and the symbols left out as unknown (in order, repeats kept).

        Raises `UnknownSymbols` when the text holds symbols the run never trained on, unless
        `drop_unknown`; ValueError when nothing of the text is left to say.
        """
        if not text or not text.strip():
            raise ValueError("the text to synthesize is empty")
        d = self.config.data
        text_for_model = model_text(text, d.text_frontend, d.language)
        if not text_for_model.strip():
            raise ValueError(f"espeak-ng ({d.language}) makes no phonemes of {_quoted(text)}; write it in words of data.language")
        tokens = tokenize(tf.constant(text_for_model), self._table, frontend=d.text_frontend)
        unknown_at = tf.where(tokens == UNK_ID)[:, 0].numpy().tolist()
        if not unknown_at:
            return tokens, []
        pieces = [piece.decode("utf-8") for piece in symbols(tf.constant(text_for_model), d.text_frontend).numpy()]
        unknown = [pieces[i] for i in unknown_at]
        if not drop_unknown:
            raise UnknownSymbols(self._unknown_message(text, pieces, unknown_at), unknown)
        kept = tf.boolean_mask(tokens, tokens != UNK_ID)
        if int(tf.size(kept)) == 0:
            distinct = ", ".join(map(repr, dict.fromkeys(unknown)))
            raise ValueError(f"every symbol of {_quoted(text)} is unknown to this run ({distinct}); nothing is left to say")
        return kept, unknown

    def _unknown_message(self, text: str, pieces: list[str], unknown_at: list[int]) -> str:
        d = self.config.data
        kind = "phonemes" if d.text_frontend == "phonemes" else "characters"
        words, start = [], 0  # the model text's words (the space symbol ends one), each as (first, last) index
        for i, piece in enumerate(pieces + [" "]):
            if piece == " ":
                words.append((start, i))
                start = i + 1
        where = {}
        separator = "|" if d.text_frontend == "phonemes" else ""
        for i in unknown_at:
            if pieces[i] == " ":  # the word boundary itself: a run trained on one-word texts lacks it
                where.setdefault(" ", "between words")
                continue
            first, last = next(word for word in words if word[0] <= i < word[1])
            where.setdefault(pieces[i], f"in {separator.join(pieces[first:last])!r}")
        listed = ", ".join(f"{symbol!r} ({word})" for symbol, word in where.items())
        vocab = f"{self.run_dir}/vocab.txt" if self.run_dir is not None else "the run's vocab.txt"
        run = self.run_dir if self.run_dir is not None else "RUN"
        return (f"{len(where)} {kind} of {_quoted(text)} never occurred in this run's training data, so they are not in "
                f"{vocab} and the model would read each as <unk>, a token it never learnt: {listed}. Write the text "
                f"with other words, or fine-tune on clips that hold them (train_main.py --init-from {run} "
                "--output-dir NEW: its vocabulary adds them), or pass --drop-unknown to leave them out")

    def fitted_voice(self, reference_paths, reference_texts, steps: int = voice_fit.DEFAULT_STEPS,
                     head_ridge: float | None = None) -> voice_fit.FittedVoice:
        """The voice fitted to the reference clips and their words (`voice_fit.fit_voice`; with
        `head_ridge`, a mel head of its own too), for `synthesize(voice=)`."""
        paths, texts = list(reference_paths), list(reference_texts)
        if len(texts) != len(paths):
            raise ValueError(f"{len(paths)} reference clip(s) but {len(texts)} reference text(s): give each clip's words, in order")
        reference_mel, reference_length = self.reference(paths)
        waveforms = [trimmed_clip(str(path), self.config.data)[0] for path in paths]
        return voice_fit.fit_voice_to_clips(self.network, reference_mel, reference_length, waveforms,
                                            [self.tokens(text)[0] for text in texts], self.config.data, steps=steps,
                                            head_ridge=head_ridge)

    def synthesize(self, text: str, reference_paths, max_seconds: float | None = None, duration_scale: float = 1.0,
                   drop_unknown: bool = False, voice=None):
        """(samples float32 [n], mel [frames, n_mels]) for `text` in the voice of the reference clip(s),
        or in `voice` (`fitted_voice`) when given.

        Each sentence (`split_sentences`) is spoken on its own, a batch at a time, and the sentences are
        joined with SENTENCE_PAUSE_S of silence between them. `duration_scale` stretches the predicted
        durations (1.2 = 20% slower); `max_seconds` caps the length. Symbols the run never trained on
        raise `UnknownSymbols`, or with `drop_unknown` are left out.
        """
        d = self.config.data
        whole, _ = self.tokens(text, drop_unknown)  # the whole text's unknown symbols, named with their words
        rows = []
        for sentence in split_sentences(text):
            try:
                rows.append(self.tokens(sentence, drop_unknown)[0].numpy())
            except UnknownSymbols:
                raise
            except ValueError:  # nothing of it to say: a lone "...", or only symbols drop_unknown leaves out
                continue
        rows = rows or [whole.numpy()]
        max_frames = math.ceil(max_seconds * d.frames_per_second) if max_seconds else None
        reference = None if voice is not None else self.reference(list(reference_paths))
        pause = np.full((round(SENTENCE_PAUSE_S * d.frames_per_second), d.n_mels), math.log(d.log_floor), np.float32)
        pieces = []
        for first in range(0, len(rows), _SENTENCES_PER_CALL):
            batch = rows[first:first + _SENTENCES_PER_CALL]
            tokens = np.full((len(batch), max(map(len, batch))), PAD_ID, np.int32)
            for i, row in enumerate(batch):
                tokens[i, : len(row)] = row
            if voice is None:
                mel, length = generate(self.network, tokens, *reference, max_frames=max_frames,
                                       average_references=len(reference_paths) > 1, duration_scale=duration_scale)
            else:
                with voice_fit.speaking_as(self.network, voice):
                    mel, length = generate(self.network, tokens, voice=voice.voice, max_frames=max_frames,
                                           duration_scale=duration_scale)
            for row_mel, row_length in zip(mel.numpy(), length.numpy()):
                pieces += [pause, row_mel[:row_length]] if pieces else [row_mel[:row_length]]
        mel = tf.constant(np.concatenate(pieces)[:max_frames])
        return self.to_audio(mel), mel

    def synthesize_to_file(self, text: str, reference_paths, out_path: str | os.PathLike, drop_unknown: bool = False,
                           voice=None) -> dict:
        """Write the WAV; the result says how long it is, how fast it came, and which unknown symbols
        `drop_unknown` left out (`dropped`, empty when none)."""
        _, dropped = self.tokens(text, drop_unknown)  # raises before any work; cheap next to synthesis
        start = time.perf_counter()
        samples, mel = self.synthesize(text, reference_paths, drop_unknown=drop_unknown, voice=voice)
        seconds_taken = time.perf_counter() - start
        write_wav(str(out_path), samples, self.config.data.sample_rate)
        audio_seconds = int(samples.shape[0]) / self.config.data.sample_rate
        return {"out": str(out_path), "audio_seconds": audio_seconds, "frames": int(mel.shape[0]),
                "synthesis_seconds": seconds_taken, "real_time_factor": seconds_taken / max(audio_seconds, 1e-9),
                "dropped": dropped}


def validation_sample(run_dir: str | os.PathLike, out_path: str | os.PathLike, vocoder: str | None = None) -> dict:
    """Speak a held-out sentence in its own speaker's voice (another clip as the reference), and
    measure it against the held-out recording of the same sentence: duration ratio and loudness.

    The demo's corpus is espeak-ng speech, so the recording *is* the reference rendering.
    """
    import numpy as np

    from myxtts.data.pipeline import assign_references
    from myxtts.data.splits import load_splits

    synthesizer = Synthesizer.from_run(run_dir, vocoder=vocoder)
    train_rows, val_rows = load_splits(synthesizer.config)
    target = val_rows[0]
    voice = [u for u in train_rows if u.speaker == target.speaker] or [target]
    reference = assign_references([target] + voice, synthesizer.config.seed)[0]
    # A held-out sentence may hold a phoneme the training rows lack: it is left out, and listed.
    result = synthesizer.synthesize_to_file(target.text, [reference], out_path, drop_unknown=True)
    samples, rate = tf.audio.decode_wav(tf.io.read_file(str(out_path)))
    recording, _ = tf.audio.decode_wav(tf.io.read_file(target.audio_path))
    result.update(
        text=target.text,
        speaker=target.speaker,
        reference=reference,
        recording_seconds=int(recording.shape[0]) / int(rate),
        duration_ratio=result["audio_seconds"] / (int(recording.shape[0]) / int(rate)),
        rms=float(np.sqrt(np.mean(np.square(samples.numpy())))),
        recording_rms=float(np.sqrt(np.mean(np.square(recording.numpy())))),
    )
    return result
