"""Tokenisation in TensorFlow ops (tf.strings + tf.lookup): model text -> symbols -> ids.

The model text is what `data.text_frontend` makes of a transcript:

* `phonemes` (the default): its phoneme string from `phonemes.py`, made once in Python, one symbol
  per phoneme: "w|ˌaɪ k|ˈʊ|d" is the symbols w, ˌaɪ, " ", k, ˈʊ, d ("|" separates the phonemes of
  a word, a space is itself a symbol, the word boundary). A phoneme keeps its stress mark and
  length mark, so every symbol is a sound the aligner can find in the audio (stress marks as
  symbols of their own were measured to become catch-alls that absorb whole words). Nothing is
  folded: stress, punctuation and case are meaning.
* `characters`: the transcript itself, normalised here (lower case, one spelling of quotes and
  dashes), one symbol per character.

The vocabulary is built once from the training set's model texts (through the same graph function
that runs in the pipeline, so the two can never disagree) and saved with the run; synthesis loads
that file, so a checkpoint always tokenises text the way it was trained.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

from myxtts.data.phonemes import PHONEME_SEPARATOR

TEXT_FRONTENDS = ("phonemes", "characters")
PAD, UNK = "<pad>", "<unk>"
SPECIAL_TOKENS = (PAD, UNK)
PAD_ID, UNK_ID = range(2)

# Typographic variants folded to one ASCII spelling so "don’t" and "don't" share tokens.
TEXT_REPLACEMENTS = (
    ("[‘’ʼ`´]", "'"),
    ("[“”„«»]", '"'),
    ("[‐‑‒–—―]", "-"),
    ("…", "..."),
    (r"\s+", " "),
)


def normalize_text(text) -> tf.Tensor:
    """Lower-case, fold quotes and dashes, collapse whitespace, strip. Works on any string tensor."""
    text = tf.strings.lower(tf.convert_to_tensor(text, tf.string), encoding="utf-8")
    for pattern, replacement in TEXT_REPLACEMENTS:
        text = tf.strings.regex_replace(text, pattern, replacement)
    return tf.strings.strip(text)


def model_text_tensor(text, frontend: str) -> tf.Tensor:
    """The string tokens are cut from: normalised characters, or the phoneme string untouched."""
    if frontend == "characters":
        return normalize_text(text)
    if frontend == "phonemes":
        return tf.convert_to_tensor(text, tf.string)
    raise ValueError(f"data.text_frontend must be one of {', '.join(TEXT_FRONTENDS)}, got {frontend!r}")


def symbols(model_text, frontend: str) -> tf.Tensor:
    """The symbols of model texts: [n] strings for a scalar, a ragged [batch, None] for a vector."""
    text = model_text_tensor(model_text, frontend)
    if frontend == "characters":
        return tf.strings.unicode_split(text, "UTF-8")
    # "a|b c" -> "a|b| |c" -> a, b, " ", c; empty pieces (a doubled separator) are dropped.
    pieces = tf.strings.split(tf.strings.regex_replace(text, " ", PHONEME_SEPARATOR + " " + PHONEME_SEPARATOR),
                              PHONEME_SEPARATOR)
    return tf.ragged.boolean_mask(pieces, tf.strings.length(pieces) > 0)


def split_symbols(model_text: str, frontend: str) -> list[str]:
    """`symbols` in Python, for one string."""
    if frontend == "characters":
        return list(model_text)
    return [piece for piece in model_text.replace(" ", f"{PHONEME_SEPARATOR} {PHONEME_SEPARATOR}").split(PHONEME_SEPARATOR)
            if piece]


class Vocabulary:
    """Symbols <-> ids; ids 0 and 1 are the special tokens pad and unk."""

    def __init__(self, symbols):
        self.symbols = list(symbols)
        self.tokens = list(SPECIAL_TOKENS) + self.symbols

    @property
    def word_boundary_id(self) -> int:
        """The id of the space between words (a token with no sound of its own), -1 if there is none."""
        return self.tokens.index(" ") if " " in self.tokens else -1

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_texts(cls, texts, *, frontend: str) -> "Vocabulary":
        """Every symbol that occurs in the model texts (`phonemes.model_texts`), sorted."""
        texts = list(texts)
        if not texts:
            raise ValueError("cannot build a vocabulary from no transcripts")
        found = symbols(tf.constant(texts), frontend).flat_values
        return cls(sorted({s.decode("utf-8") for s in tf.unique(found).y.numpy()}))

    def save(self, path: str | os.PathLike) -> None:
        # One token per line; a space is a legal character, so lines are not stripped when read.
        Path(path).write_text("".join(token + "\n" for token in self.tokens), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        try:
            tokens = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
        except FileNotFoundError:
            raise FileNotFoundError(f"vocabulary file not found: {path} (it is saved with every run as vocab.txt)") from None
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"{path}: not a MyXTTS vocabulary (it must start with {', '.join(SPECIAL_TOKENS)})")
        return cls(tokens[len(SPECIAL_TOKENS) :])

    def lookup_table(self) -> tf.lookup.StaticHashTable:
        keys = tf.constant(self.symbols, tf.string)
        values = tf.range(len(SPECIAL_TOKENS), len(self.tokens), dtype=tf.int32)
        return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=UNK_ID)

    def decode(self, ids) -> str:
        """The symbols of `ids` written one after the other (readable IPA for phonemes); pad and unk dropped."""
        return "".join(self.tokens[i] for i in ids if i >= len(SPECIAL_TOKENS))

    def encode(self, model_text: str, frontend: str) -> list[int]:
        """The ids `tokenize` gives, computed in Python, for a string that needs no normalising
        (a phoneme string, or characters already normalised)."""
        index = {symbol: i for i, symbol in enumerate(self.tokens) if i >= len(SPECIAL_TOKENS)}
        return [index.get(symbol, UNK_ID) for symbol in split_symbols(model_text, frontend)]


def tokenize(text, table: tf.lookup.StaticHashTable, *, frontend: str) -> tf.Tensor:
    """One model text (scalar string) -> int32 ids [length], one per symbol."""
    return table.lookup(symbols(text, frontend))
