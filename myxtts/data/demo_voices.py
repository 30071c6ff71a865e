"""The named espeak-ng voice sets of the demo corpus (`make_demo_corpus.py --voices NAME`).

    demo     the demo's five speakers
    other    five American variants the demo never heard
    many     53 voices for training a model that must learn what a voice is (zero-shot cloning)
    heldout  9 voices never in `many`, for evaluating it on unseen voices (includes `other`)

A voice is an espeak-ng language code plus, optionally, a variant file of the bundled data's
`voices/!v` folder: "en-us+f2". espeak-ng looks the variant up by exact, case-sensitive name and,
if there is no such file, silently speaks the plain base voice ("en-us+alex" sounds exactly like
"en-us"), so `check_voices` refuses variants the data lacks.

How `many` and `heldout` were chosen (2026-11, espeak-ng 1.52 of espeakng-loader; every one of the
104 variants tried with 8 English bases on demo sentences):
- Base en-us only. The manifest's phonemes come from the front end in the corpus's language (en-us)
  while the timing files hold the phonemes the voice really spoke (its phoneme events). With the
  en-us base every variant spoke exactly the en-us phoneme sequence (stress marks aside) on all 40
  sentences tried; en, en-gb-x-rp, en-gb-scotland, en-gb-x-gbclan, en-gb-x-gbcwmd, en-029 and
  en-us-nyc disagreed on every sentence, so their audio would contradict its labels.
- Every variant selects (espeak_SetVoiceByName 0). Dropped before comparing voices: whispered
  (whisper, whisperf, caleb: under 30% voiced frames), robotic or long-echo effects (robosoft1-8,
  UniRobot, anikaRobot, announcer, RicishayMax1-3), Demonic (distorted: recognizer WER 0.56,
  spectral centroid 3.7 kHz), fast (espeak's speed test: the plain en-us voice), voices too slow for
  the 1-12 s window (AnxiousAndy and Alicia: 11 and 8 of 40 first-draw sentences outside it; Marco
  up to 14 s), and "Mr serious" (a space in the speaker name).
- Distinct: each voice's GE2E embedding (`myxtts.evaluation.speaker`) from 8 sentences. Two voices
  are near-duplicates when their cosine is at least the lower of their within-voice cosines (first
  4 sentences against the last 4): the encoder tells them apart no better than a voice from
  itself. From each such pair one was dropped, and every voice near a held-out one left `many`
  (so f3 and m3 of the demo, near f4 and m1, are not in it). Dropped: adam, benjamin (klatt6
  family), Diogo, miguel (michel), Gene2 (Gene), Mike, m4, croak (en-us), aunty, f3 (f4),
  grandpa, m3 (m1), f5 (f2), iven3 (iven2), klatt2 (klatt), klatt5 (klatt4), robert (rob), steph2
  (steph3).
- What is left, 64 voices in all: cross-voice cosine median 0.69, 95th percentile 0.86, largest
  0.964, within-voice at least 0.947; half-against-half speaker identification 64 of 64.
  `many`: median F0 86-350 Hz (median 104, 10 voices above 150 Hz), spectral centroid 621-2290 Hz.
- Then Andrea and Andy left `many`: the recognizer (`myxtts.evaluation.intelligibility`, a language
  model of the corpus sentences) heard them worst, WER 0.84 on 5 clips each, against 0.0-0.27 for
  en-us, f2, f3 and Alex. The other voices' WER was not measured (that run was cut short). 62 remain.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

# espeak voice variants that synthesize with the bundled data; each becomes one speaker.
DEMO_VOICES = ("en-us", "en-us+f2", "en-us+f3", "en-us+m3", "en+m7")
# Other American English variants that render every demo sentence within the duration window
# (checked on 400 utterances): for a corpus of voices the demo model never heard.
OTHER_VOICES = ("en-us+f1", "en-us+f4", "en-us+m1", "en-us+m2", "en-us+m5")

_MANY_VARIANTS = (
    "Alex", "Denis", "Gene", "Henrique", "Hugo", "Jacky", "Lee", "Mario", "Michael",
    "Nguyen", "Reed", "Storm", "Tweaky", "anika", "antonio", "belinda", "boris", "ed", "edward2", "f2",
    "grandma", "gustave", "ian", "iven", "iven2", "iven4", "john", "kaukovalta", "klatt", "klatt3",
    "klatt4", "klatt6", "linda", "m6", "m7", "m8", "marcelo", "max", "michel", "mike2", "norbert",
    "pablo", "paul", "pedro", "quincy", "rob", "sandro", "shelby", "steph", "steph3", "victor", "zac",
)
MANY_VOICES = ("en-us",) + tuple(f"en-us+{variant}" for variant in _MANY_VARIANTS)
HELDOUT_VOICES = OTHER_VOICES + ("en-us+Annie", "en-us+travis", "en-us+edward", "en-us+david")

VOICE_SETS: dict[str, tuple[str, ...]] = {
    "demo": DEMO_VOICES,
    "other": OTHER_VOICES,
    "many": MANY_VOICES,
    "heldout": HELDOUT_VOICES,
}


# Random voices: "en-us+rnd017" is en-us with random variant 17, a variant file that no data folder
# ships, written by `random_variant` from a stream seeded by its number alone (so a name is the same
# voice in every corpus). Its pitch and formants are drawn around the named variants' own values
# (formant frequencies 92-128% with a per-formant jitter, pitch rising with them): the named sets
# give a model a few dozen voices to learn what a voice is, these fill the space between them.
# `--voices many,random:150` in make_demo_corpus.py.
RANDOM_PREFIX = "rnd"


def random_voices(count: int) -> tuple[str, ...]:
    return tuple(f"en-us+{RANDOM_PREFIX}{index:03d}" for index in range(count))


def random_index(voice: str) -> int | None:
    """17 for "en-us+rnd017"; None for any other voice."""
    _, _, variant = voice.partition("+")
    number = variant.removeprefix(RANDOM_PREFIX)
    return int(number) if variant.startswith(RANDOM_PREFIX) and number.isdigit() else None


def random_variant(index: int) -> str:
    """The espeak-ng variant file of random voice `index`."""
    draw = random.Random(f"myxtts-random-voice:{index}")
    scale = draw.uniform(0.92, 1.28)  # formant frequencies: male-like near 0.95, female-like near 1.2
    base = (70 + (scale - 0.92) / 0.36 * 110) * draw.uniform(0.85, 1.15)  # Hz
    lines = ["language variant", f"name {RANDOM_PREFIX}{index:03d}",
             f"pitch {round(base)} {round(base + draw.uniform(30, 110))}"]
    for formant in range(9):
        frequency = scale * (draw.uniform(0.94, 1.06) if formant <= 5 else 1.0)
        lines.append(f"formant {formant} {round(100 * frequency)} {draw.randint(70, 140)} {draw.randint(80, 160)}")
    lines.append(f"flutter {draw.randint(0, 6)}")
    return "\n".join(lines) + "\n"


def expand_voices(spec: str) -> list[str]:
    """`--voices`: comma-separated voices, set names (`VOICE_SETS`) and `random:N` (N random voices)."""
    voices = []
    for item in (part.strip() for part in spec.split(",")):
        if item in VOICE_SETS:
            voices += VOICE_SETS[item]
        elif item.startswith("random:"):
            count = item.removeprefix("random:")
            if not count.isdigit() or not 0 < int(count) <= 1000:
                raise ValueError(f"--voices {item!r}: random:N takes a count from 1 to 1000")
            voices += random_voices(int(count))
        elif item:
            voices.append(item)
    return voices


# espeak-ng lists every language and variant file of its data folder in one table of 349 entries
# (N_VOICES_LIST) before it selects a voice; past that, files are left out of the table and even
# "en-us" can fail to select (measured: `--voices many,random:600` over the full data folder).
VOICE_LIST_LIMIT = 349


def data_with_random_voices(voices: Iterable[str], data_path: str | Path, folder: str | Path) -> Path:
    """An espeak-ng data folder in `folder` for `voices`: links to `data_path`'s files, but of its
    languages and variants only those `voices` use (espeak lists them all, VOICE_LIST_LIMIT), plus
    the variant files of the random voices among them. The installed data folder is left as it is."""
    voices = list(dict.fromkeys(voices))
    data_path, out = Path(data_path), Path(folder) / "espeak-ng-data"
    languages = {voice.partition("+")[0].lower() for voice in voices} | {"en-us"}  # the engine starts in en-us
    kept = [path for path in sorted((data_path / "lang").rglob("*")) if path.is_file() and path.name.lower() in languages]
    listed = len(kept) + len([v for v in voices if "+" in v])
    if listed > VOICE_LIST_LIMIT:
        raise ValueError(f"{len(voices)} voices: espeak-ng lists at most {VOICE_LIST_LIMIT} languages and variants, and "
                         f"these need {listed}; ask for {listed - VOICE_LIST_LIMIT} fewer (random:N takes fewer, or "
                         "build two corpora and list both in the manifest)")
    (out / "voices" / "!v").mkdir(parents=True)
    for entry in data_path.iterdir():
        if entry.name not in ("voices", "lang"):
            (out / entry.name).symlink_to(entry)
    for entry in (data_path / "voices").iterdir():
        if entry.name != "!v":
            (out / "voices" / entry.name).symlink_to(entry)
    for path in kept:
        target = out / path.relative_to(data_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path)
    for voice in voices:
        variant = voice.partition("+")[2]
        if not variant:
            continue
        index = random_index(voice)
        if index is not None:
            (variant_folder(out) / variant).write_text(random_variant(index), encoding="utf-8")
        elif (variant_folder(data_path) / variant).is_file():
            (variant_folder(out) / variant).symlink_to(variant_folder(data_path) / variant)
    return out


def variant_folder(data_path: str | Path) -> Path:
    """The folder of espeak-ng's voice variant files in its data folder."""
    return Path(data_path) / "voices" / "!v"


def check_voices(voices: Iterable[str], data_path: str | Path) -> None:
    """Raise ValueError for a voice whose variant ("+NAME") is not a file of the bundled data:
    espeak-ng would accept it and speak the plain base voice."""
    folder = variant_folder(data_path)
    for voice in voices:
        _, plus, variant = voice.partition("+")
        if plus and not (folder / variant).is_file():
            close = sorted(path.name for path in folder.iterdir() if path.name.lower() == variant.lower())
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"voice {voice!r}: espeak-ng has no variant {variant!r} in {folder} and would silently "
                f"speak the plain {voice.partition('+')[0]!r} voice; {hint}variants are case-sensitive file "
                f"names there (named sets: {', '.join(VOICE_SETS)})"
            )
