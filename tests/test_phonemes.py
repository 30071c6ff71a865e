"""The phoneme front end: exact espeak-ng 1.52 IPA, other languages, errors, the cache, and
Persian and Korean speech through preparation, the pipeline and one training step."""

import json
import re
import wave

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts.config import load_config
from myxtts.data import phonemes as phonemes_module
from myxtts.data.demo_corpus import EspeakEngine
from myxtts.data.manifest import Utterance, read_manifest
from myxtts.data.phonemes import UnknownLanguage, check_language, model_texts, phonemize, phonemize_utterances
from myxtts.data.pipeline import build_dataset, build_vocabulary
from myxtts.data.prepare import prepare_dataset
from myxtts.data.text import Vocabulary, split_symbols, tokenize
from myxtts.diagnostics.graph_scan import find_python_ops

# Source scripts that must not survive phonemization: Arabic (Persian) and Hangul (Korean).
_SOURCE_SCRIPT = re.compile("[\u0600-\u06ff\ufb50-\ufdff\ufe70-\ufeff\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
SENTENCES = {
    "fa": ["سلام، حال شما چطور است؟", "امروز هوا خیلی خوب است.", "من کتاب می‌خوانم.", "این یک آزمایش است!"],
    "ko": ["안녕하세요, 만나서 반갑습니다.", "오늘 날씨가 정말 좋네요!", "저는 학생입니다.", "이것은 시험입니까?"],
}


def readable(text: str, language: str) -> str:
    """The phoneme string without its phoneme separators: plain IPA, as espeak-ng writes it."""
    return phonemize(text, language).replace("|", "")


def test_phonemes_are_espeak_ngs_own_units():
    # One symbol per phoneme: a diphthong, an affricate and an r-coloured vowel are one symbol each,
    # and a vowel carries its stress and length marks.
    assert phonemize("hello", "en-us") == "h|ə|l|ˈoʊ"
    assert phonemize("speech", "en-us") == "s|p|ˈiː|tʃ"
    assert phonemize("tired farmer", "en-us") == "t|ˈaɪɚ|d f|ˈɑːɹ|m|ɚ"
    assert phonemize("Hello, world!", "en-us") == "h|ə|l|ˈoʊ|, w|ˈɜː|l|d|!"


def test_known_english_words_in_ipa():
    # espeak-ng 1.52.0 (espeakng-loader 0.2.4), observed and pinned.
    assert readable("hello", "en-us") == "həlˈoʊ"
    assert readable("world", "en-us") == "wˈɜːld"
    assert readable("speech", "en-us") == "spˈiːtʃ"
    assert readable("thought", "en-us") == "θˈɔːt"
    assert readable("synthesis", "en-us") == "sˈɪnθəsˌɪs"
    assert readable("The quick brown fox jumps over the lazy dog.", "en-us") == (
        "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.")
    assert readable("hello", "en") == "həlˈəʊ"  # British English: another vowel


def test_clause_punctuation_is_kept_and_numbers_stay_whole():
    assert readable("Hello, world! How are you? Fine; thanks: yes.", "en-us") == (
        "həlˈoʊ, wˈɜːld! hˈaʊ ɑːɹ juː? fˈaɪn; θˈæŋks: jˈɛs.")
    # "3.50" and "1,000" are numbers, not clauses; quotes go, the marks inside them stay.
    assert readable('He paid 3.50 for "1,000 pens," she said.', "en-us") == (
        "hiː pˈeɪd θɹˈiː pɔɪnt fˈaɪv zˈiəɹoʊ fɔːɹ wˈʌn θˈaʊzənd pˈɛnz, ʃiː sˈɛd.")
    assert readable("Wait... what?!  OK", "en-us") == "wˈeɪt. wˌʌt? ˌoʊkˈeɪ"
    assert readable(" ... ", "en-us") == ""


@pytest.mark.parametrize("language, text, expected", [
    ("fa", "سلام، حال شما چطور است؟ خوبم.", "salˈɑm, hˈɑl ʃˈomɑ tʃˈetor ˈast? xˈuːbam."),
    ("ko", "안녕하세요. 만나서 반갑습니다!", "ˈɐnnjʌŋhˌɐsejˌo. mˈɐnnɐsˌʌpˈɐnqɐps-ˌɯpnidˌɐ!"),
])
def test_persian_and_korean_become_ipa(language, text, expected):
    ipa = readable(text, language)
    assert ipa == expected
    assert not _SOURCE_SCRIPT.search(ipa) and "ˈ" in ipa
    for sentence in SENTENCES[language]:
        ipa = readable(sentence, language)
        assert ipa and not _SOURCE_SCRIPT.search(ipa), (sentence, ipa)
        assert not re.search("[A-Z()]", ipa), ipa  # no espeak mnemonics, no language-switch marks


def test_language_switch_marks_are_removed():
    # espeak-ng reads Latin words in Persian text as English and marks them "(en)...(fa)".
    assert readable("I like the Internet", "fa") == "aɪ lˈaɪk ðɪ ˈɪntənˌɛt"


def test_unknown_language_is_a_clear_error():
    with pytest.raises(UnknownLanguage, match=r"data\.language: 'xx-yy' is not an espeak-ng voice or language code"):
        check_language("xx-yy")
    # espeak-ng keeps the previous voice for an unknown name: phonemizing must not go on with it.
    phonemize("hello", "de")
    with pytest.raises(UnknownLanguage):
        phonemize("hello", "xx-yy")
    # en-gb is a language of voice "en" but not a name espeak-ng selects: the error says so.
    with pytest.raises(UnknownLanguage, match=re.escape("did you mean en (English (Great Britain))")):
        check_language("en-gb")
    with pytest.raises(UnknownLanguage, match=re.escape("ko (Korean)")):
        check_language("kor", key="--language")
    # A voice without its dictionary in the bundled data would phonemize everything to nothing.
    with pytest.raises(UnknownLanguage, match="lacks its dictionary"):
        check_language("fo")
    check_language("en-us+f2")  # a variant is fine: it does not change the phonemes


def test_rows_are_phonemized_once_and_cached(tmp_path, monkeypatch):
    rows = [
        Utterance("/a/1.wav", "Hello, world!", "s"),
        Utterance("/a/2.wav", "Hello, world!", "s"),  # the same text: phonemized once
        Utterance("/a/3.wav", "Good day.", "s", phonemes="ɡʊd dˈeɪ.", language="en"),  # another language: redone
        Utterance("/a/4.wav", "By hand.", "s", phonemes="baɪ hænd"),  # no language: used as given
    ]
    calls = []
    monkeypatch.setattr(phonemes_module, "phonemize", lambda text, language: calls.append(text) or f"<{text}>")
    cache = tmp_path / "run" / "phonemes.json"
    done = phonemize_utterances(rows, "en-us", cache_path=cache)
    assert [u.phonemes for u in done] == ["<Hello, world!>", "<Hello, world!>", "<Good day.>", "baɪ hænd"]
    assert [u.language for u in done] == ["en-us", "en-us", "en-us", None]
    assert sorted(calls) == ["Good day.", "Hello, world!"]
    assert json.loads(cache.read_text(encoding="utf-8"))["language"] == "en-us"

    calls.clear()
    assert phonemize_utterances(rows, "en-us", cache_path=cache) == done and calls == []  # a resumed run
    phonemize_utterances(rows, "de", cache_path=cache)
    assert sorted(calls) == ["Good day.", "Hello, world!"]  # another language does not reuse the cache

    monkeypatch.setattr(phonemes_module, "phonemize", lambda text, language: "")
    with pytest.raises(ValueError, match=re.escape("/a/1.wav: espeak-ng (en-us) makes no phonemes")):
        phonemize_utterances(rows[:1], "en-us")
    with pytest.raises(ValueError, match="no phonemes; phonemize the rows first"):
        model_texts(rows[:1], "phonemes")


def test_in_graph_tokenization_equals_the_python_encoding():
    texts = [phonemize(s, "en-us") for s in ("Hello, world!", "Is it twelve o'clock?")]
    texts += [phonemize(s, language) for language, sentences in SENTENCES.items() for s in sentences]
    vocabulary = Vocabulary.from_texts(texts[:-1], frontend="phonemes")  # the last one may bring unseen symbols
    assert vocabulary.symbols == sorted({s for text in texts[:-1] for s in split_symbols(text, "phonemes")})
    table = vocabulary.lookup_table()
    in_graph = tf.data.Dataset.from_tensor_slices(texts).map(lambda t: tokenize(t, table, frontend="phonemes"))
    for text, ids in zip(texts, in_graph.as_numpy_iterator()):
        assert ids.tolist() == vocabulary.encode(text, "phonemes"), text
        known = [s for s in split_symbols(text, "phonemes") if s in vocabulary.symbols]
        assert vocabulary.decode(ids.tolist()) == "".join(known)


def _speech_corpus(folder, language):
    """SENTENCES[language] spoken by espeak-ng's own voice for it, in the LJSpeech layout."""
    engine = EspeakEngine()
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for index, sentence in enumerate(SENTENCES[language]):
        pcm, _ = engine.render(language, sentence)
        with wave.open(str(folder / "wavs" / f"{index}.wav"), "wb") as out:
            out.setnchannels(1), out.setsampwidth(2), out.setframerate(22050), out.writeframes(pcm)
        lines.append(f"{index}|{sentence}|{sentence}|spk_{language}\n")
    (folder / "metadata.csv").write_text("".join(lines), encoding="utf-8")
    return folder


@pytest.mark.parametrize("language", ["fa", "ko"])
def test_prepare_pipeline_and_one_training_step(language, tmp_path):
    from myxtts.models.xtts import network_for
    from myxtts.training.step import TrainingModel

    corpus = _speech_corpus(tmp_path / "corpus", language)
    report = prepare_dataset(corpus, tmp_path / "prepared", workers=1, progress=False, phoneme_language=language)
    assert report.kept == len(SENTENCES[language]), report.summary()
    rows = read_manifest(report.manifest_path)
    assert all(u.language == language and u.phonemes and not _SOURCE_SCRIPT.search(u.phonemes) for u in rows)

    config = load_config(overrides=[
        f"data.language={language}", "model.size=tiny", "data.batch_size=2", "data.deterministic=true",
        "data.max_duration_s=6.0", "data.bucket_boundaries_s=[3.0, 6.0]", "training.precision=fp32",
        "training.enable_xla_compilation=false",
    ])
    vocabulary = build_vocabulary(rows, config.data)
    assert set(vocabulary.symbols) == {s for u in rows for s in split_symbols(u.phonemes, "phonemes")}
    dataset = build_dataset(config, rows, training=False, vocabulary=vocabulary)
    assert find_python_ops(dataset) == []
    batch = next(iter(dataset))
    first = batch["tokens"][0, : int(batch["text_length"][0])].numpy().tolist()
    assert first in [vocabulary.encode(u.phonemes, "phonemes") for u in rows]  # tokens are the phonemes, not the letters

    keras.utils.set_random_seed(0)
    model = TrainingModel(network_for(config, len(vocabulary)))
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=False)
    logs = model.train_step(batch)
    assert np.isfinite(float(logs["loss"]))
