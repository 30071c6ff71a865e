"""Tokenisation in TensorFlow ops (tf.strings + tf.lookup): one token per character of the model text.

The model text is what `data.text_frontend` makes of a transcript: with `phonemes` (the default)
its IPA string from `phonemes.py`, made once in Python and read here as it is (stress marks,
punctuation and case are meaning, so nothing is folded); with `characters` the transcript itself,
normalised here (lower case, one spelling of quotes and dashes).

The vocabulary is built once from the training set's model texts (through the same graph function
that runs in the pipeline, so the two can never disagree) and saved with the run; synthesis loads
that file, so a checkpoint always tokenises text the way it was trained.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

TEXT_FRONTENDS = ("phonemes", "characters")
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)

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


class Vocabulary:
    """Characters <-> ids; ids 0-3 are the special tokens pad, unk, bos, eos."""

    def __init__(self, characters):
        self.characters = list(characters)
        self.tokens = list(SPECIAL_TOKENS) + self.characters

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_texts(cls, texts, *, frontend: str) -> "Vocabulary":
        """Every character that occurs in the model texts (`phonemes.model_texts`), sorted."""
        texts = list(texts)
        if not texts:
            raise ValueError("cannot build a vocabulary from no transcripts")
        characters = tf.strings.unicode_split(model_text_tensor(tf.constant(texts), frontend), "UTF-8").flat_values
        unique = sorted({c.decode("utf-8") for c in tf.unique(characters).y.numpy()})
        return cls(unique)

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
        keys = tf.constant(self.characters, tf.string)
        values = tf.range(len(SPECIAL_TOKENS), len(self.tokens), dtype=tf.int32)
        return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=UNK_ID)

    def decode(self, ids) -> str:
        return "".join(self.tokens[i] for i in ids if i >= len(SPECIAL_TOKENS))

    def encode(self, model_text: str) -> list[int]:
        """The ids `tokenize` gives, computed in Python, for a string that needs no normalising
        (a phoneme string, or characters already normalised)."""
        index = {character: i for i, character in enumerate(self.tokens) if i >= len(SPECIAL_TOKENS)}
        return [BOS_ID] + [index.get(character, UNK_ID) for character in model_text] + [EOS_ID]


def tokenize(text, table: tf.lookup.StaticHashTable, *, frontend: str) -> tf.Tensor:
    """One model text (scalar string) -> int32 ids [length] framed by BOS and EOS."""
    characters = tf.strings.unicode_split(model_text_tensor(text, frontend), "UTF-8")
    ids = table.lookup(characters)
    return tf.concat([[BOS_ID], ids, [EOS_ID]], axis=0)
