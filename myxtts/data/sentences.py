"""A deterministic generator of varied English sentences for the embedded demo corpus.

The demo corpus needs text that exercises a TTS front end the way real read speech does:
lengths from a two-word exclamation to a three-clause sentence, commas, questions,
exclamations, contractions and possessives, and numbers. Numbers are always spelled out
(`number_to_words`) so the text never contains a digit: the synthesizer and the model's
text normalizer must agree on how "1984" is read, and spelling it out removes the question.

Everything is driven by one seeded `random.Random`, so the same seed gives the same
sentences on every machine and Python version (string and int seeds are both stable).
"""

from __future__ import annotations

import random

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
    "seventeen", "eighteen", "nineteen",
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ORDINAL_ENDINGS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}

NAMES = (
    "Anna", "Peter", "Maria", "Oliver", "Grace", "Samuel", "Lucy", "Daniel", "Helen",
    "Thomas", "Clara", "Victor", "Rosa", "Henry", "Julia", "Arthur",
)
PEOPLE = (
    "the old captain", "my neighbour", "our teacher", "the baker", "a young doctor",
    "the night guard", "my grandmother", "the new student", "a tired farmer",
    "the station master", "her little brother", "the quiet librarian",
)
ADJECTIVES = (
    "small", "heavy", "bright", "quiet", "broken", "yellow", "ancient", "curious",
    "wooden", "gentle", "enormous", "silver", "dusty", "careful", "strange", "warm",
)
# Singular and plural are listed together because English plurals are irregular enough
# ("shelf" -> "shelves") that a suffix rule would produce wrong words.
NOUNS = (
    ("lamp", "lamps"), ("letter", "letters"), ("bicycle", "bicycles"), ("map", "maps"),
    ("shelf", "shelves"), ("basket", "baskets"), ("window", "windows"), ("key", "keys"),
    ("boat", "boats"), ("clock", "clocks"), ("garden", "gardens"), ("candle", "candles"),
    ("box", "boxes"), ("painting", "paintings"), ("bridge", "bridges"), ("coat", "coats"),
)
# (past tense, base form): questions and negations need the base form.
VERBS = (
    ("found", "find"), ("carried", "carry"), ("repaired", "repair"), ("borrowed", "borrow"),
    ("counted", "count"), ("noticed", "notice"), ("painted", "paint"), ("sold", "sell"),
    ("opened", "open"), ("cleaned", "clean"), ("hid", "hide"), ("measured", "measure"),
)
PLACES = (
    "near the harbour", "in the kitchen", "behind the library", "at the station",
    "under the old bridge", "on the top floor", "beside the river", "in the market square",
    "at the end of the road", "inside the museum",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
)
CONNECTORS = ("and", "but", "so", "because", "although", "while", "until", "after")
# Short clauses that bring contractions into long sentences.
TAG_CLAUSES = (
    "but it wasn't enough", "and that's all we know", "so we'll see", "though nobody's sure why",
    "and they're still talking about it", "but you can't have everything", "and I'd do it again",
)
SHORT_EXCLAMATIONS = (
    "Thank you, {name}!", "Good morning, {name}.", "Not today, {name}.", "Watch out, {name}!",
    "Well, that's {adjective}!", "Of course, {name}.", "Come back soon!",
    "Where's the {noun}?", "Really, {name}?", "What {a_adjective} {noun}!",
)


def number_to_words(number: int) -> str:
    """Spells out 0 <= number < 1,000,000 the way it is read in British/American prose.

    >>> number_to_words(342)
    'three hundred and forty-two'
    """
    if not 0 <= number < 1_000_000:
        raise ValueError(f"number_to_words supports 0 to 999,999, got {number}")
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        head = f"{_ONES[hundreds]} hundred"
        return head + (f" and {number_to_words(rest)}" if rest else "")
    thousands, rest = divmod(number, 1000)
    head = f"{number_to_words(thousands)} thousand"
    if not rest:
        return head
    # "two thousand and five" but "two thousand three hundred": after "thousand", "and"
    # only joins a remainder below one hundred, as in spoken English.
    return head + (f" and {number_to_words(rest)}" if rest < 100 else f" {number_to_words(rest)}")


def ordinal_to_words(number: int) -> str:
    """Spells out an ordinal: 1 -> 'first', 23 -> 'twenty-third', 40 -> 'fortieth'."""
    cardinal = number_to_words(number)
    head, separator, last = cardinal.rpartition("-" if "-" in cardinal.split(" ")[-1] else " ")
    if last in _ORDINAL_ENDINGS:
        last = _ORDINAL_ENDINGS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + separator + last


def year_to_words(year: int) -> str:
    """Reads a year as people say it: 1984 -> 'nineteen eighty-four', 2007 -> 'two thousand and seven'."""
    century, rest = divmod(year, 100)
    if 2000 <= year < 2010 or year % 1000 == 0:
        return number_to_words(year)
    if rest == 0:
        return f"{number_to_words(century)} hundred"
    if rest < 10:
        return f"{number_to_words(century)} oh {number_to_words(rest)}"
    return f"{number_to_words(century)} {number_to_words(rest)}"


class SentenceGenerator:
    """Produces an endless, reproducible stream of English sentences from a seed.

    Each sentence first draws a length class (tiny, short, medium, long) so spoken
    durations spread from about one second to about twelve, instead of clustering
    around one typical template length.
    """

    # Target word counts per length class; espeak's default rate is about three words/s,
    # plus pauses at commas. Tiny sentences are drawn half as often as the others: they
    # all last about a second, while each other class covers several seconds.
    LENGTH_CLASSES = ((2, 4), (5, 12), (13, 22), (23, 32))
    LENGTH_CLASS_WEIGHTS = (1, 2, 2, 2)

    def __init__(self, seed: int | str):
        self.rng = random.Random(seed)

    def sentence(self) -> str:
        """Returns the next sentence of the stream."""
        min_words, max_words = self.rng.choices(self.LENGTH_CLASSES, self.LENGTH_CLASS_WEIGHTS)[0]
        if max_words <= 4:
            return self._fill(self.rng.choice(SHORT_EXCLAMATIONS))
        target_words = self.rng.randint(min_words, max_words)
        # A final clause can overshoot the target by a dozen words; drawing again keeps the
        # long class from producing sentences that run past the corpus's duration limit.
        while True:
            text = self._sentence_of_about(target_words)
            if len(text.split()) <= max_words + 4:
                return text

    def sentences(self, count: int) -> list[str]:
        """Returns the next `count` sentences of the stream."""
        return [self.sentence() for _ in range(count)]

    def _sentence_of_about(self, target_words: int) -> str:
        if self.rng.random() < 0.3:
            text = _capitalize(self._question())
            if len(text.split()) < target_words:
                # A question followed by an answer keeps long questions natural.
                text += " " + _capitalize(self._clause_chain(target_words - len(text.split())))
            return text
        return _capitalize(self._clause_chain(target_words))

    def _fill(self, template: str) -> str:
        adjective = self.rng.choice(ADJECTIVES)
        return template.format(
            name=self.rng.choice(NAMES),
            adjective=adjective,
            a_adjective=f"{_indefinite_article(adjective)} {adjective}",
            noun=self.rng.choice(NOUNS)[0],
        )

    def _subject(self) -> str:
        return self.rng.choice(NAMES) if self.rng.random() < 0.5 else self.rng.choice(PEOPLE)

    def _object(self) -> str:
        singular, plural = self.rng.choice(NOUNS)
        adjective = self.rng.choice(ADJECTIVES)
        roll = self.rng.random()
        if roll < 0.3:
            # Mostly small counts, sometimes a long spelled-out one ("six hundred and twelve").
            count = self.rng.randint(2, 12) if roll < 0.15 else self.rng.randint(13, 999)
            return f"{number_to_words(count)} {adjective} {plural}"
        if roll < 0.5:
            return f"{self.rng.choice(NAMES)}'s {singular}"
        if roll < 0.75:
            return f"{_indefinite_article(adjective)} {adjective} {singular}"
        return f"the {singular}"

    def _time(self) -> str:
        roll = self.rng.random()
        if roll < 0.25:
            return f"at {number_to_words(self.rng.randint(1, 12))} o'clock"
        if roll < 0.5:
            return f"on the {ordinal_to_words(self.rng.randint(1, 31))} of {self.rng.choice(MONTHS)}"
        if roll < 0.7:
            return f"in {year_to_words(self.rng.randint(1850, 2029))}"
        return self.rng.choice(("yesterday", "last winter", "before sunrise", "on Monday morning"))

    def _clause(self, subject: str) -> str:
        """One 'subject verb object [place] [time]' clause; modifiers appear at most once each."""
        past, _ = self.rng.choice(VERBS)
        words = [subject, past, self._object()]
        if self.rng.random() < 0.5:
            words.append(self.rng.choice(PLACES))
        if self.rng.random() < 0.35:
            words.append(self._time())
        return " ".join(words)

    def _clause_chain(self, target_words: int) -> str:
        """Joins clauses with commas and connectors until about `target_words` words."""
        opening = "it's true, " if self.rng.random() < 0.1 else ""
        text = opening + self._clause(self._subject())
        tag_used = False
        while len(text.split()) < target_words:
            if not tag_used and self.rng.random() < 0.25:
                # Tag clauses bring contractions; one per sentence keeps them from piling up.
                text += ", " + self.rng.choice(TAG_CLAUSES)
                tag_used = True
                continue
            connector = self.rng.choice(CONNECTORS)
            pronoun = self.rng.choice(("we", "she", "he", "they", "nobody"))
            text += f", {connector} {self._clause(pronoun)}"
        # Mostly plain statements; an exclamation now and then.
        return text + self.rng.choice(".....!")

    def _question(self) -> str:
        _, base = self.rng.choice(VERBS)
        if self.rng.random() < 0.5:
            negation = self.rng.choice(("didn't", "couldn't", "wouldn't"))
            return f"why {negation} {self._subject()} {base} {self._object()}?"
        return f"did {self._subject()} really {base} {self._object()} {self.rng.choice(PLACES)}?"


def _capitalize(text: str) -> str:
    # str.capitalize() would lower-case the names that follow the first letter.
    return text[0].upper() + text[1:]


def _indefinite_article(word: str) -> str:
    # Spelling-based rule; every adjective in the lists above follows it.
    return "an" if word[0] in "aeiou" else "a"


def generate_sentences(count: int, seed: int | str = 0) -> list[str]:
    """Convenience wrapper: the first `count` sentences for `seed`."""
    return SentenceGenerator(seed).sentences(count)
