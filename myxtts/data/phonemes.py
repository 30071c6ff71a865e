"""The text front end: text -> IPA phonemes with espeak-ng, once, in Python, before any graph.

    phonemize("Hello, world!", "en-us")  ->  "h|ə|l|ˈoʊ|, w|ˈɜː|l|d|!"

With `data.text_frontend: phonemes` (the default) the model reads phonemes, not letters, so it
does not have to learn a language's spelling, and any language espeak-ng speaks (`data.language`:
en-us, fa, ko, de, ...) trains the same way. The string keeps what the audio follows:

* one symbol per phoneme, "|" between the phonemes of a word (espeak-ng's own division: "aɪ" and
  "tʃ" are one phoneme each), each vowel with its stress mark (ˈ primary, ˌ secondary) and length;
* words separated by single spaces;
* the clause punctuation , . ? ! ; : as a symbol after the clause it ends, because pauses and
  intonation follow it (Persian ، ؟ ؛, full-width and CJK marks are written as their ASCII
  equivalents, an ellipsis as "."); other punctuation is dropped, as espeak-ng drops it.

Text is split into clauses where clause punctuation is followed by a space or the end (espeak-ng
splits there too; "3.50" and "1,000" stay whole), and each clause goes to `espeak_TextToPhonemes`,
which returns one clause per call. Language-switch marks such as "(en)...(fa)", which espeak-ng
writes around words it reads in another language, are removed.

Phonemization runs where rows are prepared (`utilities/prepare_dataset.py`, the demo corpus), or
once before a run builds its graphs when the rows have none (`phonemize_utterances`, cached in
the run folder); the tf.data pipeline only looks the characters of the finished strings up.
This module is pure Python: preparation's worker processes import it without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from myxtts.data.espeak import library
from myxtts.data.manifest import Utterance
from myxtts.progress import ProgressLine

# Between the phonemes of a word in a phoneme string (espeak-ng writes it there for us). Defined here,
# not in text.py, which needs TensorFlow: the demo corpus's worker processes import this module.
PHONEME_SEPARATOR = "|"

# Bump when the strings `phonemize` makes change for the same espeak-ng, so caches are redone.
FRONTEND_VERSION = 2
# Every mark that ends a clause, and the ASCII mark it is written as.
_CLAUSE_MARKS = {
    ",": ",", "،": ",", "、": ",", "，": ",",
    ".": ".", "。": ".", "…": ".", "．": ".",
    "?": "?", "؟": "?", "？": "?",
    "!": "!", "！": "!",
    ";": ";", "؛": ";", "；": ";",
    ":": ":", "：": ":",
}
# A run of clause marks, then closing quotes or brackets, then a space or the end of the text.
_CLAUSE_END = re.compile("([" + re.escape("".join(_CLAUSE_MARKS)) + "]+)[\"'”’»)\\]]*(?=\\s|$)")
_LANGUAGE_SWITCH = re.compile(r"\([^()\s]*\)")
# Phonemized to check that a voice's dictionary loaded: without it, espeak-ng returns nothing.
_PROBE_TEXT = "hello 123"


class UnknownLanguage(ValueError):
    """A language code espeak-ng cannot phonemize; the message names the key and close valid codes."""


def phonemize(text: str, language: str) -> str:
    """IPA phonemes of `text` read in `language` (an espeak-ng voice or language code).

    Raises `UnknownLanguage` for a code espeak-ng does not know (see `check_language`).
    """
    espeak = library()
    with espeak.lock:
        _select(espeak, language, "data.language")
        clauses = []
        for clause, mark in _split_clauses(" ".join(text.split())):
            parts = espeak.text_to_phonemes(clause, separator=PHONEME_SEPARATOR)
            phonemes = " ".join(_LANGUAGE_SWITCH.sub("", part) for part in parts)
            phonemes = " ".join(word.strip(PHONEME_SEPARATOR) for word in phonemes.split())
            if phonemes:  # a clause of symbols only says nothing, and so ends nothing
                clauses.append(phonemes + (PHONEME_SEPARATOR + mark if mark else ""))
    return " ".join(clauses)


def _split_clauses(text: str) -> list[tuple[str, str]]:
    """(clause text, the ASCII mark that ends it or "") for each clause of `text`."""
    clauses, start = [], 0
    for end in _CLAUSE_END.finditer(text):
        mark = end.group(1)
        # "?!" is a question, "..." a full stop: the first mark decides, except that ? or ! wins.
        ascii_mark = next((m for m in ("?", "!") if m in {_CLAUSE_MARKS[c] for c in mark}), _CLAUSE_MARKS[mark[0]])
        clauses.append((text[start : end.end()], ascii_mark))
        start = end.end()
    if text[start:].strip():
        clauses.append((text[start:], ""))
    return clauses


def check_language(language: str, key: str = "data.language") -> None:
    """Raise `UnknownLanguage` unless espeak-ng can phonemize `language`; `key` is what the
    message tells the user to change (a config key or a flag)."""
    espeak = library()
    with espeak.lock:
        _select(espeak, language, key)


# Codes whose dictionary was seen to work in this process (checked once, not per text).
_usable_languages: set[str] = set()


def _select(espeak, language: str, key: str) -> None:
    if espeak.voice == language and language in _usable_languages:
        return
    if espeak.select_voice(language) != 0:
        raise UnknownLanguage(f"{key}: {language!r} is not an espeak-ng voice or language code; {_suggest(language)}")
    # A voice whose dictionary file is missing from the bundled data (fo, kaa, xex in espeak-ng 1.52)
    # is selected without an error, then phonemizes everything to nothing.
    if not "".join(espeak.text_to_phonemes(_PROBE_TEXT)).strip():
        raise UnknownLanguage(
            f"{key}: espeak-ng knows {language!r} but the bundled data lacks its dictionary, so it "
            f"phonemizes nothing; pick another code ({_suggest(language)})"
        )
    _usable_languages.add(language)


def known_languages() -> list[str]:
    """Every code `data.language` accepts without a variant: the bundled voices' codes ("en-us", "fa")."""
    return sorted({voice.code for voice in library().voices()})


def _suggest(language: str) -> str:
    """'did you mean ...?' with usable codes near `language`: voices declaring it as a language
    ("en-gb" is declared by voice "en" but is no name espeak-ng selects), voices named like it
    ("korean" -> ko), then codes spelled like it."""
    voices = library().voices()
    wanted = language.split("+", 1)[0].lower()
    names = {voice.code: voice.name for voice in voices}
    candidates = sorted({v.code for v in voices if wanted in (code.lower() for code in v.languages)})
    by_name = {v.name.lower(): v.code for v in voices}
    candidates += [by_name[n] for n in difflib.get_close_matches(wanted, list(by_name), n=3, cutoff=0.7)]
    candidates += difflib.get_close_matches(wanted, sorted(names), n=4, cutoff=0.5)
    usable = [code for code in dict.fromkeys(candidates) if _has_dictionary(code)]
    if not usable:
        return f"valid codes include en-us, en, de, fr, es, fa, ko, cmn ({len(names)} in all: myxtts.data.phonemes.known_languages())"
    return "did you mean " + ", ".join(f"{code} ({names[code]})" for code in usable[:6]) + "?"


def _has_dictionary(code: str) -> bool:
    """Whether voice `code` phonemizes anything (fo, kaa and xex lack their dictionary file).
    Only for suggestions: it changes the current voice and writes espeak-ng's complaint to stderr."""
    espeak = library()
    with espeak.lock:
        return espeak.select_voice(code) == 0 and bool("".join(espeak.text_to_phonemes(_PROBE_TEXT)).strip())


# ------------------------------------------------------------------------------------------------
# Rows of a corpus


def needs_phonemes(utterance: Utterance, language: str) -> bool:
    """Whether a row must be phonemized for `language`: it has no phonemes, or phonemes of another
    language. Phonemes without a language (written by hand or another tool) are used as given."""
    return utterance.phonemes is None or (utterance.language is not None and utterance.language != language)


def phonemize_utterances(
    utterances: Sequence[Utterance],
    language: str,
    *,
    cache_path: str | os.PathLike | None = None,
    progress: bool = False,
    write_cache: bool = True,
) -> list[Utterance]:
    """`utterances` with `phonemes` filled in (see `needs_phonemes`) for `language`.

    Each distinct transcript is phonemized once. With `cache_path`, transcripts phonemized before
    (same language, espeak-ng and front-end version) are read from that JSON file instead, and new
    ones are added to it (unless `write_cache` is false: the trainer writes the cache only once it knows
    the run folder is its own, see `save_phonemes_cache`), so a resumed run does not phonemize its corpus
    again. Raises ValueError
    naming the audio file when a transcript gives no phonemes at all.
    """
    missing = [u for u in utterances if needs_phonemes(u, language)]
    if not missing:
        return list(utterances)
    check_language(language)
    stamp = _stamp(language)
    cached = _read_cache(cache_path, stamp)
    texts = sorted({u.text for u in missing} - set(cached))
    line = ProgressLine(f"phonemizing ({language})", len(texts), "texts", enabled=progress)
    for done, text in enumerate(texts, start=1):
        cached[text] = phonemize(text, language)
        line.update(done)
    line.close()
    if texts and cache_path is not None and write_cache:
        _write_cache(cache_path, stamp, cached)
    result = []
    for utterance in utterances:
        if needs_phonemes(utterance, language):
            phonemes = cached[utterance.text]
            if not phonemes:
                raise ValueError(
                    f"{utterance.audio_path}: espeak-ng ({language}) makes no phonemes of its transcript "
                    f"{utterance.text!r}; check data.language, fix or remove the row (utilities/prepare_dataset.py "
                    "lists such rows in rejected.tsv as no_phonemes)"
                )
            utterance = dataclasses.replace(utterance, phonemes=phonemes, language=language)
        result.append(utterance)
    return result


def read_phonemes_cache(cache_path: str | os.PathLike, language: str) -> dict[str, str]:
    """{transcript: phonemes} a cache file holds for `language` and this espeak-ng ({} if none applies)."""
    return _read_cache(cache_path, _stamp(language))


def save_phonemes_cache(cache_path: str | os.PathLike, language: str, phonemes: dict[str, str]) -> None:
    """Write {transcript: phonemes} of `language` as the cache `phonemize_utterances` reads."""
    _write_cache(cache_path, _stamp(language), phonemes)


def _stamp(language: str) -> dict:
    return {"frontend_version": FRONTEND_VERSION, "espeak_version": library().version, "language": language}


def _read_cache(cache_path, stamp: dict) -> dict[str, str]:
    if cache_path is None or not Path(cache_path).is_file():
        return {}
    try:
        content = json.loads(Path(cache_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # unreadable: phonemize again and overwrite it
    if not isinstance(content, dict) or any(content.get(k) != v for k, v in stamp.items()):
        return {}  # another language or espeak-ng: its strings do not apply
    phonemes = content.get("phonemes")
    return dict(phonemes) if isinstance(phonemes, dict) else {}


def _write_cache(cache_path, stamp: dict, phonemes: dict[str, str]) -> None:
    path = Path(cache_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({**stamp, "phonemes": phonemes}, ensure_ascii=False, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)  # a reader never sees half a cache


def model_texts(utterances: Iterable[Utterance], text_frontend: str) -> list[str]:
    """The strings the tokenizer reads: each row's phonemes (whitespace collapsed; they must be
    there, see `phonemize_utterances`) or its transcript (normalised later, in the graph)."""
    if text_frontend == "characters":
        return [u.text for u in utterances]
    if text_frontend != "phonemes":
        raise ValueError(f"data.text_frontend must be phonemes or characters, got {text_frontend!r}")
    texts = []
    for u in utterances:
        if u.phonemes is None:
            raise ValueError(f"{u.audio_path}: no phonemes; phonemize the rows first (phonemize_utterances)")
        texts.append(" ".join(u.phonemes.split()))
    return texts


def model_text(text: str, text_frontend: str, language: str) -> str:
    """What the tokenizer reads for one text to synthesize: its phonemes, or the text itself."""
    if text_frontend == "characters":
        return text
    if text_frontend != "phonemes":
        raise ValueError(f"data.text_frontend must be phonemes or characters, got {text_frontend!r}")
    return phonemize(text, language)
