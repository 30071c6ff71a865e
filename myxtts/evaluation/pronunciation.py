"""Pronunciations for the recognizer: the CMU dictionary bundled with pocketsphinx, plus derived entries.

The recognizer can only output words that have a pronunciation, and a reference word it cannot output
is an error on every clip that says it. So every word of the corpus is looked up here, and a word the
dictionary lacks gets one derived from entries it has, tried in this order:

1. an explicit entry from the caller (`extra`: word -> ARPAbet phones, e.g. ``{"sharnbrook": "SH AA R N B R UH K"}``);
2. the American spelling of a British one: our -> or (flavour), ise -> ize (organise), isation ->
   ization, yse -> yze, consonant + re -> er (centre, manoeuvre), ll -> l before e/i/ing (travelled), sc -> sk (sceptical),
   ogue -> og, ae / oe -> e, ence -> ense (defence), grey -> gray; the first rewrite (or all of them
   together) the dictionary knows wins;
3. a possessive or plural of a known word: base + Z, S or IH Z after the base's last phone
   (the rule English follows: IH Z after a sibilant, S after another voiceless consonant, else Z);
4. a compound of two known words of at least three letters each (harbourmaster = harbour + master).

A word none of these reach stays in every reference (nothing is dropped: it is counted as an error
each time) and is listed in `Pronunciations.unpronounceable`, which the scorer reports. The demo
corpus's sentence generator needs none of this: all 276 words in 50,000 of its sentences are in the
dictionary (British "neighbour" and "harbour" included; the tests check 3,000).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# (pattern, replacement) applied to a British spelling to get the American one.
_AMERICAN_SPELLINGS = (
    (r"our", "or"),
    (r"isation", "ization"),
    (r"is(e|ed|es|ing|er|ers)$", r"iz\1"),
    (r"ys(e|ed|es|ing)$", r"yz\1"),
    (r"([bcdfgklmnpstv])re(s?)$", r"\1er\2"),
    (r"ll(ed|er|ers|ing)$", r"l\1"),
    (r"^sc(?=ep)", "sk"),
    (r"ogue(s?)$", r"og\1"),
    (r"ae", "e"),
    (r"oe", "e"),
    (r"ence(s?)$", r"ense\1"),
    (r"^grey", "gray"),
)
_SIBILANTS = {"S", "Z", "SH", "ZH", "CH", "JH"}
_VOICELESS = {"P", "T", "K", "F", "TH"}
_MIN_COMPOUND_PART = 3


def bundled_dictionary_path() -> Path:
    """The CMU pronouncing dictionary (en-us) shipped inside the pocketsphinx wheel."""
    import pocketsphinx

    return Path(pocketsphinx.get_model_path("en-us")) / "cmudict-en-us.dict"


def read_dictionary(path: str | Path) -> dict[str, list[str]]:
    """word -> its pronunciations (ARPAbet phone strings), variants "word(2)" folded into the word's list."""
    entries: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            word, _, phones = line.strip().partition(" ")
            if phones:
                entries.setdefault(re.sub(r"\(\d+\)$", "", word), []).append(phones.strip())
    return entries


@dataclass
class Pronunciations:
    """Pronunciations of one vocabulary: `entries` (word -> phone strings), what was derived and what failed."""

    entries: dict[str, list[str]] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)  # word -> "how", e.g. "flavour" -> "from flavor"
    unpronounceable: tuple[str, ...] = ()

    def write(self, path: str | Path) -> None:
        """A pocketsphinx dictionary file of exactly these words ("word(2)" for second pronunciations)."""
        with open(path, "w", encoding="utf-8") as out:
            for word in sorted(self.entries):
                for index, phones in enumerate(self.entries[word]):
                    out.write(f"{word}{f'({index + 1})' if index else ''} {phones}\n")


def pronunciations_for(
    words: Iterable[str], dictionary: Mapping[str, list[str]], extra: Mapping[str, str] | None = None
) -> Pronunciations:
    """Look up (or derive, see the module docstring) every word of `words` (already normalized)."""
    extra = {word.lower(): phones.upper() for word, phones in (extra or {}).items()}
    result = Pronunciations()
    missing = []
    for word in sorted(set(words)):
        if word in extra:
            result.entries[word], result.derived[word] = [extra[word]], "given"
        elif word in dictionary:
            result.entries[word] = list(dictionary[word])
        else:
            found = _derive(word, dictionary)
            if found is None:
                missing.append(word)
            else:
                result.entries[word], result.derived[word] = found
    result.unpronounceable = tuple(missing)
    return result


def _derive(word: str, dictionary: Mapping[str, list[str]], depth: int = 0) -> tuple[list[str], str] | None:
    """(pronunciations, how) for a word missing from `dictionary`, or None."""
    for american in _american_spellings(word):
        if american in dictionary:
            return list(dictionary[american]), f"from {american}"
    for suffix in ("'s", "s", "es"):
        base = word[: -len(suffix)]
        if not word.endswith(suffix) or len(base) < 2:
            continue
        base_entries = dictionary.get(base)
        how = f"{base} + {suffix}"
        if base_entries is None and depth == 0:
            found = _derive(base, dictionary, depth + 1)
            if found is not None:
                base_entries, how = found[0], f"{base} ({found[1]}) + {suffix}"
        if base_entries is not None:
            return [_with_s(phones) for phones in base_entries], how
    # Most balanced split first ("harbour + master" before "har + bourmaster"), dictionary parts before derived ones.
    splits = sorted(range(_MIN_COMPOUND_PART, len(word) - _MIN_COMPOUND_PART + 1), key=lambda i: -min(i, len(word) - i))
    for derive_parts in (False, True) if depth == 0 else (False,):
        for split in splits:
            head, tail = word[:split], word[split:]
            parts = [dictionary.get(part) or (_entries_of(_derive(part, dictionary, 1)) if derive_parts else None)
                     for part in (head, tail)]
            if all(parts):
                return [f"{parts[0][0]} {parts[1][0]}"], f"{head} + {tail}"
    return None


def _entries_of(found):
    return None if found is None else found[0]


def _american_spellings(word: str) -> list[str]:
    """Each single rewrite of `word` that changes it, then all rewrites applied together."""
    candidates = []
    combined = word
    for pattern, replacement in _AMERICAN_SPELLINGS:
        rewritten = re.sub(pattern, replacement, word)
        if rewritten != word:
            candidates.append(rewritten)
        combined = re.sub(pattern, replacement, combined)
    if combined != word and combined not in candidates:
        candidates.append(combined)
    return candidates


def _with_s(phones: str) -> str:
    """Phones of a word + the -s / 's ending, voiced or not after its last phone."""
    last = phones.split()[-1]
    if last in _SIBILANTS:
        return f"{phones} IH Z"
    return f"{phones} {'S' if last in _VOICELESS else 'Z'}"
