"""The one ctypes binding of the espeak-ng library bundled by the `espeakng-loader` package.

Two parts of the project use espeak-ng: the text front end (`phonemes.py`, text -> IPA with
`espeak_TextToPhonemes`) and the demo corpus renderer (`demo_corpus.py`, text -> audio plus the
phoneme timings). Both go through `library()`, which loads and initializes espeak-ng once per
process, on first use (importing this module does nothing).

espeak-ng is initialized the one way that serves both: synchronous audio output, phoneme events on
and phoneme names in IPA (`espeak_Initialize` options 0x01 | 0x02; only this legacy entry point can
enable the events). The events change nothing in the audio: the same text renders the same samples
with them on or off. The library keeps global state (the current voice, the synthesis callback),
so every call goes through this one object, under its lock.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from dataclasses import dataclass

SAMPLE_RATE = 22_050
# When set, the espeak-ng data folder to initialize with instead of the bundled one.
DATA_PATH_VARIABLE = "MYXTTS_ESPEAK_DATA"

# Constants from espeak-ng's speak_lib.h.
AUDIO_OUTPUT_SYNCHRONOUS = 2
INITIALIZE_PHONEME_EVENTS = 0x01
INITIALIZE_PHONEME_IPA = 0x02  # phoneme events carry IPA names ("ˈoʊ"), not espeak's mnemonics ("'oU")
CHARS_UTF8 = 1
ENDPAUSE = 0x1000  # a short silence at the end, as after a spoken sentence
POS_CHARACTER = 1
PHONEMES_IPA = 0x02  # espeak_TextToPhonemes' phonememode: IPA as UTF-8
EVENT_LIST_TERMINATED = 0
EVENT_END = 5
EVENT_PHONEME = 7
# espeak_SetVoiceByName returns EE_NOT_FOUND (2) for a name it does not know, and keeps the old voice.
_EE_OK = 0


class Event(ctypes.Structure):
    """espeak_EVENT. `sample` is the event's position in samples from the start of the utterance."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # milliseconds
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # union { int number; const char *name; char string[8]; }
    ]


class _Voice(ctypes.Structure):
    """espeak_VOICE, as espeak_ListVoices returns it."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),  # (priority byte, NUL-terminated code) pairs, then a 0 byte
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


# int SynthCallback(short *wav, int numsamples, espeak_EVENT *events)
SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(Event))


@dataclass(frozen=True)
class VoiceInfo:
    """One voice of the bundled data: `name` ("English (America)"), `identifier` ("gmw/en-US") and
    the language codes it declares (["en-us", "en"])."""

    name: str
    identifier: str
    languages: tuple[str, ...]

    @property
    def code(self) -> str:
        """What `espeak_SetVoiceByName` accepts for it: the identifier's last part, lower case ("en-us")."""
        return self.identifier.rsplit("/", 1)[-1].lower()


class EspeakLibrary:
    """The process's espeak-ng, initialized; use `library()` rather than constructing one."""

    def __init__(self):
        try:
            import espeakng_loader
        except ImportError as error:
            raise RuntimeError(
                "espeak-ng (the phoneme front end and the demo corpus use it) comes from the "
                "'espeakng-loader' package: pip install espeakng-loader"
            ) from error
        self.path = espeakng_loader.get_library_path()
        # Another data folder (DATA_PATH_VARIABLE): the bundled one plus variant files written for a
        # corpus (demo_voices.data_with_random_voices), set by the corpus builder in its worker processes.
        self.data_path = os.environ.get(DATA_PATH_VARIABLE) or espeakng_loader.get_data_path()
        self.lock = threading.RLock()
        lib = ctypes.CDLL(self.path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetSynthCallback.argtypes = [SYNTH_CALLBACK]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        lib.espeak_Info.restype = ctypes.c_char_p
        if not hasattr(lib, "espeak_ng_SetRandSeed"):
            raise RuntimeError(
                f"{self.path} lacks espeak_ng_SetRandSeed (espeakng-loader 0.2.4 ships espeak-ng "
                "1.52.0, which has it); without it the demo corpus is not reproducible. "
                "Upgrade espeakng-loader."
            )
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        options = INITIALIZE_PHONEME_EVENTS | INITIALIZE_PHONEME_IPA
        sample_rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data_path.encode(), options)
        if sample_rate != SAMPLE_RATE:
            raise RuntimeError(
                f"espeak-ng from {self.path} with data {self.data_path} initialized with result "
                f"{sample_rate}; expected its sample rate, {SAMPLE_RATE}. Reinstall espeakng-loader."
            )
        self._lib = lib
        self.version = lib.espeak_Info(None).decode()
        self._callback = None  # the installed trampoline, kept alive (see set_synth_callback)
        self.voice: str | None = None  # the name last selected successfully


    def select_voice(self, name: str) -> int:
        """`espeak_SetVoiceByName`; 0 on success. On failure espeak keeps the previous voice, so a
        caller must check the status rather than trust what is spoken or phonemized next."""
        with self.lock:
            status = self._lib.espeak_SetVoiceByName(name.encode("utf-8"))
            if status == _EE_OK:
                self.voice = name
            return status

    def text_to_phonemes(self, text: str, separator: str = "") -> list[str]:
        """IPA phonemes of `text` in the current voice's language: one string per clause espeak-ng
        finds (it ends clauses at punctuation followed by a space, and after a long run of words).
        The clause punctuation itself is not part of the result. A `separator` character is
        written between the phonemes of a word ("w|ˈɜː|l|d"); a phoneme keeps its stress mark."""
        mode = PHONEMES_IPA | (ord(separator) << 8 if separator else 0)
        buffer = ctypes.create_string_buffer(text.encode("utf-8"))
        pointer = ctypes.c_void_p(ctypes.addressof(buffer))
        clauses = []
        with self.lock:
            # espeak advances the pointer past each clause and sets it to NULL after the last one.
            while pointer.value:
                result = self._lib.espeak_TextToPhonemes(ctypes.byref(pointer), CHARS_UTF8, mode)
                clauses.append(result.decode("utf-8") if result else "")
        return clauses

    def voices(self) -> list[VoiceInfo]:
        """Every voice of the bundled data (espeak_ListVoices)."""
        found = []
        with self.lock:
            listing = self._lib.espeak_ListVoices(None)
            index = 0
            while listing[index]:
                voice = listing[index].contents
                languages, position = [], voice.languages
                while ctypes.string_at(position, 1) != b"\x00":  # a zero priority ends the list
                    code = ctypes.string_at(position + 1)
                    languages.append(code.decode("utf-8"))
                    position += len(code) + 2
                found.append(VoiceInfo(voice.name.decode("utf-8"), voice.identifier.decode("utf-8"), tuple(languages)))
                index += 1
        return found

    def set_synth_callback(self, callback) -> None:
        """Route synthesized audio and events to `callback(samples, num_samples, events) -> int`."""
        with self.lock:
            # Kept on self: ctypes frees the C trampoline when the Python object is collected, and
            # espeak would then call into freed memory.
            self._callback = SYNTH_CALLBACK(callback)
            self._lib.espeak_SetSynthCallback(self._callback)

    def set_random_seed(self, seed: int) -> None:
        """Seed the noise generator that breathy variants (`+f2`) mix in."""
        with self.lock:
            self._lib.espeak_ng_SetRandSeed(seed)

    def synthesize(self, text: str) -> int:
        """`espeak_Synth` of `text` in the current voice, delivered to the synth callback before
        this returns (synchronous mode). Returns espeak's status, 0 on success."""
        encoded = text.encode("utf-8")
        with self.lock:
            return self._lib.espeak_Synth(
                encoded, len(encoded) + 1, 0, POS_CHARACTER, 0, CHARS_UTF8 | ENDPAUSE, None, None
            )


@functools.cache
def library() -> EspeakLibrary:
    """This process's espeak-ng, loaded and initialized on the first call. A forked child inherits it."""
    return EspeakLibrary()


def event_name(event: Event) -> str:
    """A phoneme event's IPA name; espeak gives pauses an empty IPA name, written here as "_"."""
    return bytes(event.id).split(b"\x00", 1)[0].decode("utf-8", errors="replace") or "_"
