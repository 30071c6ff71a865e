"""Text normalisation and tokenisation, eagerly and inside tf.data, for both text front ends."""

import tensorflow as tf

from myxtts.data.text import PAD_ID, UNK_ID, Vocabulary, normalize_text, split_symbols, tokenize


def test_normalize_folds_case_quotes_dashes_and_spaces():
    text = "  Don’t  SAY “Crème brûlée” — ever…\t\nÑandú "
    assert normalize_text(text).numpy().decode() == "don't say \"crème brûlée\" - ever... ñandú"


def test_vocabulary_round_trip_keeps_the_space_and_special_tokens(tmp_path):
    vocab = Vocabulary.from_texts(["Hello, world!", "Ça va?"], frontend="characters")
    assert " " in vocab.symbols and "ç" in vocab.symbols and "H" not in vocab.symbols
    vocab.save(tmp_path / "vocab.txt")
    loaded = Vocabulary.load(tmp_path / "vocab.txt")
    assert loaded.tokens == vocab.tokens and loaded.tokens[:2] == ["<pad>", "<unk>"]


def test_tokenize_gives_one_id_per_character_and_maps_unknown_ones():
    vocab = Vocabulary.from_texts(["abc def"], frontend="characters")
    ids = tokenize(tf.constant("Bad cafe!"), vocab.lookup_table(), frontend="characters").numpy().tolist()
    assert len(ids) == len("bad cafe!")
    assert ids.count(UNK_ID) == 1  # "!" was never seen
    assert vocab.decode(ids) == "bad cafe"  # unk is dropped
    assert PAD_ID not in ids


def test_tokenize_inside_a_dataset_matches_eager():
    vocab = Vocabulary.from_texts(["a quick test", "über"], frontend="characters")
    table = vocab.lookup_table()
    texts = ["a quick test", "Über Test"]
    mapped = list(tf.data.Dataset.from_tensor_slices(texts).map(
        lambda t: tokenize(t, table, frontend="characters")).as_numpy_iterator())
    for text, ids in zip(texts, mapped):
        assert ids.tolist() == tokenize(tf.constant(text), table, frontend="characters").numpy().tolist()


def test_phoneme_strings_are_one_symbol_per_phoneme_with_word_spaces():
    written = "w|ˈɜː|l|d|, h|ə|l|ˈoʊ|!"
    assert split_symbols(written, "phonemes") == ["w", "ˈɜː", "l", "d", ",", " ", "h", "ə", "l", "ˈoʊ", "!"]
    vocab = Vocabulary.from_texts([written], frontend="phonemes")
    assert vocab.symbols == sorted({"w", "ˈɜː", "l", "d", ",", " ", "h", "ə", "ˈoʊ", "!"})
    ids = tokenize(tf.constant(written), vocab.lookup_table(), frontend="phonemes").numpy().tolist()
    assert ids == vocab.encode(written, "phonemes") and len(ids) == 11
    assert vocab.decode(ids) == "wˈɜːld, həlˈoʊ!"  # readable IPA


def test_phoneme_strings_are_tokenized_as_written():
    # Case, quotes, dashes and ellipses are folded for characters; a phoneme string keeps every
    # code point (a stress mark, a length mark and an apostrophe-like letter are different symbols).
    written = "ˈA|ʔ|’|-|… ɐ"
    vocab = Vocabulary.from_texts([written], frontend="phonemes")
    assert vocab.symbols == sorted({"ˈA", "ʔ", "’", "-", "…", " ", "ɐ"})
    ids = tokenize(tf.constant(written), vocab.lookup_table(), frontend="phonemes").numpy().tolist()
    assert vocab.decode(ids) == written.replace("|", "") and ids == vocab.encode(written, "phonemes")
    folded = tokenize(tf.constant(written), vocab.lookup_table(), frontend="characters").numpy().tolist()
    assert vocab.decode(folded) != written  # the characters front end would have changed it
    try:
        tokenize(tf.constant(written), vocab.lookup_table(), frontend="letters")
    except ValueError as error:
        assert "data.text_frontend" in str(error)
    else:
        raise AssertionError("an unknown front end was accepted")


def test_loading_a_foreign_file_is_a_clear_error(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    try:
        Vocabulary.load(tmp_path / "vocab.txt")
    except ValueError as error:
        assert "vocab.txt" in str(error) and "<pad>" in str(error)
    else:
        raise AssertionError("a file without the special tokens was accepted")
