"""Text normalisation and tokenisation, eagerly and inside tf.data, for both text front ends."""

import tensorflow as tf

from myxtts.data.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary, normalize_text, tokenize


def test_normalize_folds_case_quotes_dashes_and_spaces():
    text = "  Don’t  SAY “Crème brûlée” — ever…\t\nÑandú "
    assert normalize_text(text).numpy().decode() == "don't say \"crème brûlée\" - ever... ñandú"


def test_vocabulary_round_trip_keeps_the_space_and_special_tokens(tmp_path):
    vocab = Vocabulary.from_texts(["Hello, world!", "Ça va?"], frontend="characters")
    assert " " in vocab.characters and "ç" in vocab.characters and "H" not in vocab.characters
    vocab.save(tmp_path / "vocab.txt")
    loaded = Vocabulary.load(tmp_path / "vocab.txt")
    assert loaded.tokens == vocab.tokens and loaded.tokens[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]


def test_tokenize_frames_with_bos_eos_and_maps_unknown_characters():
    vocab = Vocabulary.from_texts(["abc def"], frontend="characters")
    ids = tokenize(tf.constant("Bad cafe!"), vocab.lookup_table(), frontend="characters").numpy().tolist()
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and len(ids) == len("bad cafe!") + 2
    assert ids.count(UNK_ID) == 1  # "!" was never seen
    assert vocab.decode(ids) == "bad cafe"  # specials (BOS, EOS, UNK) are dropped
    assert PAD_ID not in ids


def test_tokenize_inside_a_dataset_matches_eager():
    vocab = Vocabulary.from_texts(["a quick test", "über"], frontend="characters")
    table = vocab.lookup_table()
    texts = ["a quick test", "Über Test"]
    mapped = list(tf.data.Dataset.from_tensor_slices(texts).map(
        lambda t: tokenize(t, table, frontend="characters")).as_numpy_iterator())
    for text, ids in zip(texts, mapped):
        assert ids.tolist() == tokenize(tf.constant(text), table, frontend="characters").numpy().tolist()


def test_phoneme_strings_are_tokenized_as_written():
    # Case, quotes, dashes and ellipses are folded for characters; a phoneme string keeps every
    # code point (a stress mark, a length mark and an apostrophe-like letter are different tokens).
    written = "ˈAʔ’-… ɐ"
    vocab = Vocabulary.from_texts([written], frontend="phonemes")
    assert vocab.characters == sorted(set(written))
    ids = tokenize(tf.constant(written), vocab.lookup_table(), frontend="phonemes").numpy().tolist()
    assert vocab.decode(ids) == written and ids == vocab.encode(written)
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
