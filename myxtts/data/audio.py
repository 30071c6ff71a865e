"""Audio in TensorFlow ops only: WAV decoding, resampling and log-mel spectrograms.

Everything here runs inside `tf.data` graphs (no Python per clip), and the same `log_mel` runs on a
batch of waveforms inside the compiled train step when features are computed on the accelerator.

Conventions follow librosa's defaults so features are interchangeable with the PyTorch ecosystem's:
centered frames with zero padding, a periodic Hann window centred in `n_fft`, Slaney mel scale and
Slaney area normalisation (HTK mel scale as an option).
"""

from __future__ import annotations

import ast
import codecs
import contextlib
import functools
import math
import re

import numpy as np
import tensorflow as tf

from myxtts.data.wav_header import MAX_CHUNKS, SKIPPED_BEFORE_FMT

# Rates the in-graph resampler handles. Anything else is converted once by utilities/prepare_dataset.py.
SUPPORTED_RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)


def load_wav(path, middle_seconds: float | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Read a WAV file: (float32 samples in [-1, 1] of shape [samples], sample rate int32).

    Several channels are averaged to mono. With `middle_seconds`, only that much from the middle of
    the file is decoded (the voice reference needs 3 s, not the whole clip).

    Canonical 16-bit PCM files (a 44-byte header, which utilities/prepare_dataset.py writes) are
    decoded with `decode_raw` on the data bytes: about ten times cheaper than `tf.audio.decode_wav`
    and bit-identical (measured on the demo corpus). Any other layout goes through `decode_wav`.
    """
    return decode_wav_bytes(tf.io.read_file(path), middle_seconds, source=path)


def decode_wav_bytes(contents, middle_seconds: float | None = None, *,
                     source: tf.Tensor | str = "") -> tuple[tf.Tensor, tf.Tensor]:
    """`load_wav` of a WAV file's bytes (a scalar string): what an exported model takes from a client.

    Bytes TensorFlow cannot read as they are fail naming `source` and what to do: not a WAV file, a
    sample format other than 16-bit integer PCM (8-bit, 24-bit, float), a layout `decode_wav`
    refuses, and a truncated file (its header promises more samples than it holds; the fast path
    would otherwise train on the part that is there, silently).
    """

    def raw_pcm16():
        channels = _header_int(contents, 22, 2)
        rate = _header_int(contents, 24, 4)
        data_bytes, held = _header_int(contents, 40, 4), tf.strings.length(contents) - 44
        # Numbers, not a sentence: this is every clip's path, and string ops here cost ~50 us a clip.
        # (A size over 2 GiB reads as negative: promised, and not held, either way.)
        check = tf.debugging.Assert((data_bytes >= 0) & (data_bytes <= held), [
            "truncated WAV (its header promises", data_bytes, "bytes of samples, the file holds", held, "bytes):",
            source, f"- {_REPLACE}"])
        with tf.control_dependencies([check]):
            data_bytes = tf.identity(data_bytes)
        frames = data_bytes // (2 * channels)
        start, count = _middle(frames, rate, middle_seconds)
        pcm = tf.io.decode_raw(tf.strings.substr(contents, 44 + 2 * channels * start, 2 * channels * count), tf.int16)
        samples = tf.reshape(tf.cast(pcm, tf.float32) / 32768.0, [-1, channels])  # [frames, channels]
        return tf.reduce_mean(samples, axis=-1), rate

    def any_wav():
        # decode_wav's own error ("Header mismatch") names no file, and in a dataset of thousands
        # the user needs to know which one. Checked only here, off the canonical files' fast path.
        header = tf.strings.join([tf.strings.substr(contents, 0, 12), b"\0" * 12])  # 12 bytes at least
        is_wav = tf.equal(tf.strings.substr(header, 0, 4), b"RIFF") & tf.equal(tf.strings.substr(header, 8, 4), b"WAVE")
        check = tf.debugging.Assert(is_wav, ["not a WAV file (no RIFF/WAVE header):", source,
                                             "- check or convert the corpus with utilities/prepare_dataset.py"])
        with tf.control_dependencies([check]):  # then why decode_wav would refuse it, naming it too
            checked = _checked_wav_function()(contents, tf.convert_to_tensor(source, tf.string))
        audio, rate = tf.audio.decode_wav(checked)  # [frames, channels]
        start, count = _middle(tf.shape(audio)[0], rate, middle_seconds)
        return tf.reduce_mean(audio[start : start + count], axis=-1), rate

    return tf.cond(_is_canonical_pcm16(contents), raw_pcm16, any_wav)


# What to do about a file the checks refuse: a format TensorFlow does not read is converted once; a
# damaged file has nothing to convert (prepare_dataset.py rejects it, listing it in its report).
_CONVERT = "convert the corpus once with utilities/prepare_dataset.py"
_REPLACE = "re-export or remove the file (utilities/prepare_dataset.py lists every such file and leaves it out)"


def _check(refusal, broken, source) -> tf.Operation:
    """An Assert that `refusal` (a sentence, "" for none) is empty, naming `source` and what to do."""
    todo = tf.where(broken, _REPLACE, _CONVERT)
    return tf.debugging.Assert(tf.equal(refusal, ""), [tf.strings.join([refusal, ":"]), source,
                                                       tf.strings.join(["- ", todo])])


@functools.lru_cache(maxsize=None)
def _checked_wav_function():
    """(contents, source) -> contents, after `_check` of `wav_refusal`: one `tf.function`, not inlined,
    so a graph holds one call to it. Inline, its ~200 nodes cost every clip ~0.1 ms even on the fast
    path, where they do not run (a branch not taken still passes its nodes a dead signal)."""
    def checked(contents, source):
        with tf.control_dependencies([_check(*wav_refusal(contents), source)]):
            return tf.identity(contents)

    signature = [tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string)]
    return tf.function(checked, input_signature=signature, autograph=False, experimental_attributes={"_noinline": True})


def wav_refusal(contents) -> tuple[tf.Tensor, tf.Tensor]:
    """(why, broken): why `tf.audio.decode_wav` would refuse these RIFF/WAVE bytes, as a phrase ("" when
    it reads them), and whether the file is damaged (else only in a format TensorFlow does not read).

    Walks the chunks as decode_wav does (tensorflow/core/lib/wav/wav_io.cc: "fmt " after only the
    chunks it skips, 16 or 18 bytes of it, integer PCM of 16 bits, then every chunk to the end, one
    "data" chunk that holds what it declares), so that a file it refuses is refused here first, with
    the file's name: its own messages ("Can only read 16-bit WAV files, but received 8") name none.
    """
    size = tf.cast(tf.strings.length(contents), tf.int64)

    def read(offset, count):  # `count` bytes at `offset`, zeros past the end
        piece = tf.strings.substr(contents, tf.minimum(offset, size), tf.constant(count, tf.int64))
        return tf.strings.substr(tf.strings.join([piece, b"\0" * count]), 0, count)

    def u16(offset):
        return tf.cast(tf.io.decode_raw(read(offset, 2), tf.uint16)[0], tf.int64)

    def u32(offset):
        return tf.math.floormod(tf.cast(tf.io.decode_raw(read(offset, 4), tf.int32)[0], tf.int64), 2**32)

    def first(cases, default):
        """The value of the first (condition, value) whose condition holds."""
        chosen = tf.convert_to_tensor(default)
        for condition, value in reversed(cases):
            chosen = tf.where(condition, value, chosen)
        return chosen

    def number(value):
        return tf.strings.as_string(value)

    def misread_after(odd):
        """Why decode_wav fails once it has walked over the odd-sized chunk `odd` ("" for none): it
        skips no pad byte, so every chunk header after it is read one byte early."""
        return tf.strings.join(["WAV with an odd-sized ", odd, " chunk, whose pad byte TensorFlow does not skip"])

    def step(offset, fmt_seen, block, data_seen, refusal, broken, chunks, odd):
        chunk_id, chunk_size, start = read(offset, 4), u32(offset + 4), offset + 8
        header_cut = start > size
        # The "fmt " fields, read wherever this chunk is (used only when it is the "fmt " chunk).
        tag, channels, fmt_rate, byte_rate, fmt_block, bits = (
            u16(start), u16(start + 2), u32(start + 4), u32(start + 8), u16(start + 12), u16(start + 14))
        tag = tf.where(tf.equal(tag, 0xFFFE) & (chunk_size >= 26), u16(start + 24), tag)  # WAVE_FORMAT_EXTENSIBLE's subformat
        kind = first([(tf.equal(tag, 1), "integer"), (tf.equal(tag, 3), "float")],
                     tf.strings.join(["format-", number(tag)]))
        is_fmt = tf.equal(chunk_id, b"fmt ")
        skipped = tf.reduce_any(tf.equal(chunk_id, SKIPPED_BEFORE_FMT))
        is_data = tf.equal(chunk_id, b"data")
        frames = chunk_size // tf.maximum(block, 1)
        data_end = start + frames * block
        named = tf.strings.join(["'", chunk_id, "'"])
        before, after = ~fmt_seen, fmt_seen
        cases = [  # (condition, refusal, broken): the first that holds is the one reported
            (header_cut & data_seen, "WAV with stray bytes after its last chunk, which TensorFlow does not read", False),
            (header_cut, "damaged WAV (cut off inside a chunk header)", True),
            (before & is_fmt & (start + 16 > size), "damaged WAV (cut off inside its 'fmt ' chunk)", True),
            (before & ~is_fmt & ~skipped,
             tf.strings.join(["WAV with a ", named, " chunk before its 'fmt ' chunk, which TensorFlow does not read"]), False),
            (before & skipped & (start + chunk_size > size),
             tf.strings.join(["damaged WAV (cut off inside its ", named, " chunk)"]), True),
            (before & is_fmt & ~(tf.equal(tag, 1) & tf.equal(bits, 16)),
             tf.strings.join(["WAV of ", number(bits), "-bit ", kind, " samples (TensorFlow reads 16-bit integer PCM only)"]),
             False),
            (before & is_fmt & ~(tf.equal(chunk_size, 16) | tf.equal(chunk_size, 18)),
             tf.strings.join(["WAV with a ", number(chunk_size), "-byte 'fmt ' chunk (TensorFlow reads 16 or 18)"]), False),
            (before & is_fmt & ((channels < 1) | tf.not_equal(fmt_block, 2 * channels)
                                | tf.not_equal(byte_rate, fmt_block * fmt_rate)),
             "damaged WAV header (its channels, frame size and byte rate disagree)", True),
            (after & is_data & tf.equal(chunk_size, 0xFFFFFFFF),  # not damaged: prepare_dataset.py converts it whole
             "WAV of unknown length (its data size is 0xFFFFFFFF, as ffmpeg writing to a pipe leaves it)", False),
            (after & (chunk_size >= 2**31), tf.strings.join(["damaged WAV (a ", named, " chunk of over 2 GiB)"]), True),
            (after & is_data & data_seen, "WAV with more than one 'data' chunk", False),
            (after & is_data & (data_end > size),  # the same words as the fast path's check
             tf.strings.join(["truncated WAV (its header promises ", number(frames * block),
                              " bytes of samples, the file holds ", number(size - start), " bytes)"]), True),
        ]
        refusal = first([(c, r) for c, r, _ in cases], "")
        broken = first([(c, b) for c, _, b in cases], False)
        misread = tf.not_equal(refusal, "") & tf.not_equal(odd, "")  # this header was read off by a byte
        refusal, broken = tf.where(misread, misread_after(odd), refusal), broken & ~misread
        odd = tf.where(tf.equal(odd, "") & ~is_fmt & ~is_data & ~header_cut & tf.equal(chunk_size % 2, 1), named, odd)
        next_offset = first([(before & is_fmt, start + tf.where(tf.equal(chunk_size, 18), tf.constant(18, tf.int64), 16)),
                             (after & is_data, data_end)], start + chunk_size)
        return (next_offset, fmt_seen | is_fmt, tf.where(before & is_fmt, fmt_block, block), data_seen | (after & is_data),
                refusal, broken, chunks + 1, odd)

    def more(offset, fmt_seen, block, data_seen, refusal, broken, chunks, odd):
        return tf.equal(refusal, "") & (offset < size) & (chunks < MAX_CHUNKS)

    state = (tf.constant(12, tf.int64), tf.constant(False), tf.constant(0, tf.int64), tf.constant(False),
             tf.constant(""), tf.constant(False), tf.constant(0), tf.constant(""))
    offset, fmt_seen, _, data_seen, refusal, broken, _, odd = tf.while_loop(more, step, state)
    walked = tf.equal(refusal, "") & (offset >= size)  # to the end: what is missing is known
    missing = walked & ~(fmt_seen & data_seen)
    refusal = first([(missing & tf.not_equal(odd, ""), misread_after(odd)),
                     (walked & ~fmt_seen, "damaged WAV (no 'fmt ' chunk)"),
                     (walked & ~data_seen, "damaged WAV (no 'data' chunk)")], refusal)
    return refusal, broken | (missing & tf.equal(odd, ""))


def data_problem(error: tf.errors.OpError) -> str | None:
    """The message of one of this module's checks on an input file (not a WAV, a format or layout
    TensorFlow does not read, a truncated file, an unsupported sample rate: the `tf.debugging.Assert`s
    here, which name the file), without TensorFlow's framing; None for any other error."""
    eager = re.search(r"to be true\. Summarized data: (.*)\Z", error.message, re.DOTALL)
    if eager is not None:  # raised eagerly: each piece on a line of its own, as a Python bytes literal
        return " ".join(_literal(line) for line in eager.group(1).splitlines())
    match = re.search(r"assertion failed: \[(.*)\]$", error.message, re.MULTILINE)
    if match is None:
        return None
    # Assert prints each piece in brackets, computed strings C-escaped (a quote as \'): split on the
    # brackets' seams, not on every bracket (a file name may hold one), and undo the escapes.
    pieces = match.group(1).split("] [")
    return " ".join(codecs.escape_decode(piece.encode("utf-8"))[0].decode("utf-8", "replace") for piece in pieces)


def without_advice(problem: str) -> str:
    """A `data_problem` message without its closing "- what to do", which is advice for a corpus (the
    checks above end every message so), for a caller with advice of its own."""
    return problem.rsplit(" - ", 1)[0]


class DataProblem(ValueError):
    """An input file the pipeline's own checks refused; the message names it and what to do."""


@contextlib.contextmanager
def named_data_problems():
    """Within it, one of the pipeline's own input checks failing (a `data_problem`) raises `DataProblem`
    with that message alone, for a tool to print as one line; any other TensorFlow error is left whole."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        problem = data_problem(error)
        if problem is None:
            raise
        raise DataProblem(problem) from None


def _literal(line: str) -> str:
    try:
        value = ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return line
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _header_int(contents, offset: int, size: int) -> tf.Tensor:
    """A little-endian unsigned 16- or signed 32-bit header field as int32."""
    dtype = tf.uint16 if size == 2 else tf.int32
    return tf.cast(tf.io.decode_raw(tf.strings.substr(contents, offset, size), dtype, little_endian=True)[0], tf.int32)


def _is_canonical_pcm16(contents) -> tf.Tensor:
    def field(offset, value):
        return tf.equal(tf.strings.substr(contents, offset, len(value)), value)

    def header_fields():
        return tf.reduce_all(tf.stack([
            field(0, b"RIFF"), field(8, b"WAVE"), field(12, b"fmt "), field(36, b"data"),
            tf.equal(_header_int(contents, 16, 4), 16),  # plain PCM fmt chunk, no extension
            tf.equal(_header_int(contents, 20, 2), 1),  # format 1: integer PCM
            tf.equal(_header_int(contents, 34, 2), 16),  # 16 bits per sample
            _header_int(contents, 22, 2) > 0,
        ]))

    return tf.cond(tf.strings.length(contents) >= 44, header_fields, lambda: tf.constant(False))


def _middle(frames, rate, seconds):
    if seconds is None:
        return tf.constant(0), frames
    count = tf.minimum(frames, tf.cast(tf.round(seconds * tf.cast(rate, tf.float32)), tf.int32))
    return (frames - count) // 2, count


# --------------------------------------------------------------------------------------------------
# Resampling: a band-limited (windowed-sinc) polyphase filter applied as one matrix product.


@functools.lru_cache(maxsize=None)
def _polyphase_filter(from_rate: int, to_rate: int, zero_crossings: int, rolloff: float, beta: float):
    """The filter taps for resampling by to_rate/from_rate (both already divided by their gcd).

    Output sample m sits at input position p = m * from_rate / to_rate. Writing m = q * to_rate + r,
    its neighbourhood starts at input q * from_rate, and the weight of input q * from_rate + k is
    h(r * from_rate / to_rate - k): one filter per phase r. Returns (taps [width, to_rate], pad).
    """
    # Low-pass cutoff in cycles per input sample: just below the lower of the two Nyquist rates.
    cutoff = rolloff * min(from_rate, to_rate) / (2.0 * from_rate)
    half_width = zero_crossings / (2.0 * cutoff)  # in input samples
    pad = int(math.ceil(half_width))
    offsets = np.arange(-pad, from_rate + pad, dtype=np.float64)  # k
    phases = np.arange(to_rate, dtype=np.float64) * from_rate / to_rate  # r * from / to
    distance = phases[None, :] - offsets[:, None]  # [width, to_rate]
    inside = np.clip(1.0 - (distance / half_width) ** 2, 0.0, None)
    window = np.i0(beta * np.sqrt(inside)) / np.i0(beta)
    taps = 2.0 * cutoff * np.sinc(2.0 * cutoff * distance) * window * (np.abs(distance) <= half_width)
    return taps.astype(np.float32), pad


def resample(samples, from_rate: int, to_rate: int, *, zero_crossings: int = 32, rolloff: float = 0.97, beta: float = 8.0):
    """Resample a 1-D float waveform from `from_rate` to `to_rate` Hz (Python ints).

    Output length is len * to_rate / from_rate rounded to the nearest sample, as soxr does. The defaults were tuned against
    soxr's HQ setting (see tests/test_audio.py).
    """
    samples = tf.convert_to_tensor(samples, tf.float32)
    if from_rate == to_rate:
        return samples
    g = math.gcd(int(from_rate), int(to_rate))
    up, down = int(to_rate) // g, int(from_rate) // g
    taps, pad = _polyphase_filter(down, up, zero_crossings, rolloff, beta)
    length = tf.shape(samples)[0]
    out_length = (2 * length * up + down) // (2 * down)  # round(length * up / down), half up, like soxr
    num_blocks = (length + down - 1) // down  # each block of `down` inputs yields `up` outputs
    padded = tf.pad(samples, [[pad, pad + num_blocks * down - length + down]])
    frames = tf.signal.frame(padded, taps.shape[0], down)[:num_blocks]  # [blocks, width]
    out = tf.matmul(frames, taps)  # [blocks, up]
    return tf.reshape(out, [-1])[:out_length]


def resample_to(samples, sample_rate, target_rate: int, *, source: tf.Tensor | str = ""):
    """Resample when the file's (run-time) rate differs from the target; fail naming the file when
    the rate is not one of SUPPORTED_RATES.

    The rate is only known once the file is decoded, so each supported rate gets its own branch
    behind a single test for the common case, a file already at the target rate.
    """
    resampler = _resampler_to(int(target_rate))
    return resampler(tf.convert_to_tensor(samples, tf.float32), tf.cast(sample_rate, tf.int32),
                     tf.convert_to_tensor(source, tf.string))


@functools.lru_cache(maxsize=None)
def _resampler_to(target_rate: int):
    """`resample_to` for one target rate as a `tf.function`, traced once per process.

    Its seven branches take ~0.4 s to trace, and every dataset that decodes audio traces them again
    for each map it is used in (clips, references; training, validation, the first batch, ...):
    seconds at every run start. A graph calling this function only adds a call to it (0.01 s).
    """
    signature = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.string)]
    return tf.function(functools.partial(_resample_to, target_rate=target_rate), input_signature=signature,
                       autograph=False)


def _resample_to(samples, sample_rate, source, *, target_rate: int):
    others = [rate for rate in SUPPORTED_RATES if rate != target_rate]

    def convert():
        matches = tf.equal(sample_rate, others)
        check = tf.debugging.Assert(
            tf.reduce_any(matches),
            ["unsupported sample rate", sample_rate, "in", source,
             "- convert the corpus once with utilities/prepare_dataset.py"],
        )
        with tf.control_dependencies([check]):
            branch = tf.argmax(tf.cast(matches, tf.int32), output_type=tf.int32)
        return tf.switch_case(branch, [functools.partial(resample, samples, rate, target_rate) for rate in others])

    return tf.cond(tf.equal(sample_rate, target_rate), lambda: samples, convert)


# --------------------------------------------------------------------------------------------------
# Mel spectrogram


def hz_to_mel(hz, htk: bool = False):
    hz = np.asarray(hz, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + hz / 700.0)
    # Slaney: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above.
    linear = hz * 3.0 / 200.0
    log_step = np.log(6.4) / 27.0
    logarithmic = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step
    return np.where(hz >= 1000.0, logarithmic, linear)


def mel_to_hz(mel, htk: bool = False):
    mel = np.asarray(mel, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    log_step = np.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * 200.0 / 3.0)


@functools.lru_cache(maxsize=None)
def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float, htk: bool = False) -> np.ndarray:
    """Triangular mel filters with Slaney area normalisation: [n_fft // 2 + 1, n_mels] float32."""
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), n_mels + 2), htk)
    widths = np.diff(edges_hz)
    # Distance of every FFT bin from every filter edge, then the rising and falling slopes.
    offsets = edges_hz[:, None] - fft_hz[None, :]  # [n_mels + 2, bins]
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))  # [n_mels, bins]
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]  # equal area per filter
    return weights.T.astype(np.float32)


@functools.lru_cache(maxsize=None)
def _centered_window(n_fft: int, win_length: int) -> np.ndarray:
    window = np.zeros(n_fft, np.float32)
    start = (n_fft - win_length) // 2
    # Periodic Hann (scipy's `fftbins=True`), built in numpy: it is a constant, also inside graphs.
    window[start : start + win_length] = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win_length) / win_length)
    return window


def mel_spectrogram(samples, data_config) -> tf.Tensor:
    """Mel spectrogram of waveforms [..., samples] -> [..., frames, n_mels] (magnitude or power)."""
    c = data_config
    samples = tf.convert_to_tensor(samples, tf.float32)
    half = c.n_fft // 2
    paddings = [[0, 0]] * (samples.shape.rank - 1) + [[half, half]]
    frames = tf.signal.frame(tf.pad(samples, paddings), c.n_fft, c.hop_length)  # [..., frames, n_fft]
    spectrum = tf.signal.rfft(frames * _centered_window(c.n_fft, c.win_length))  # [..., frames, bins]
    filters = mel_filterbank(c.sample_rate, c.n_fft, c.n_mels, float(c.fmin), float(c.mel_fmax), c.mel_scale == "htk")
    # Bins above fmax have no filter weight: skip their magnitudes (372 of 513 bins at 8 kHz / 22 kHz).
    bins = int(np.max(np.nonzero(filters.any(axis=1)))) + 1
    spectrum = spectrum[..., :bins]
    # |z| written out: `tf.abs` of complex64 is 3-6x slower on a CPU (0.9-1.4 against 0.25-0.30 ms for
    # an 8 s clip, utilities/profile_features.py), as much as the FFT itself.
    magnitude = tf.math.square(tf.math.real(spectrum)) + tf.math.square(tf.math.imag(spectrum))
    if c.power != 2.0:
        magnitude = tf.math.sqrt(magnitude)
    return tf.matmul(magnitude, filters[:bins])  # [..., frames, n_mels]


def log_mel(samples, data_config) -> tf.Tensor:
    """Natural-log mel spectrogram [..., frames, n_mels], floored at `data.log_floor`."""
    return tf.math.log(tf.maximum(mel_spectrogram(samples, data_config), data_config.log_floor))


def trim_silence(samples, top_db: float, frame_length: int = 2048, hop_length: int = 512) -> tf.Tensor:
    """`samples` [n] without the leading and trailing frames quieter than `top_db` below the loudest.

    The same cut as `librosa.effects.trim` with its defaults (RMS of centred, zero-padded frames
    against the loudest frame; the kept span runs from the first loud frame's start to one hop past
    the last one's), so a corpus trimmed here matches one trimmed with librosa. Like librosa's, the
    threshold is relative: a clip of pure digital silence is its own loudest frame and stays whole.
    """
    start, end = silence_bounds(samples, top_db, frame_length, hop_length)
    return samples[start:end]


def silence_bounds(samples, top_db: float, frame_length: int = 2048, hop_length: int = 512):
    """(start, end) int32 scalars: the span of `samples` that `trim_silence` keeps."""
    half = frame_length // 2
    padded = tf.pad(samples, [[half, half]])
    num_frames = 1 + tf.size(samples) // hop_length  # of centred frames, as librosa counts them
    if frame_length % hop_length == 0:
        # Each frame is frame_length / hop consecutive blocks of one hop: sum the squares once per
        # block, then add neighbouring blocks. A quarter of the arithmetic of squaring every frame
        # (they overlap 4x at the defaults) and no framed copy: 0.1 instead of 0.4 ms per 8 s clip.
        blocks = frame_length // hop_length
        whole = tf.pad(padded, [[0, -tf.size(padded) % hop_length]])
        block_energy = tf.reduce_sum(tf.square(tf.reshape(whole, [-1, hop_length])), axis=-1)
        energy = tf.add_n([block_energy[k : k + num_frames] for k in range(blocks)])
    else:
        energy = tf.reduce_sum(tf.square(tf.signal.frame(padded, frame_length, hop_length)), axis=-1)
    rms = tf.maximum(tf.sqrt(energy / frame_length), 1e-5)  # 1e-5: librosa's amin
    decibels = 20.0 * tf.math.log(rms / tf.reduce_max(rms)) / math.log(10.0)
    loud = tf.cast(tf.where(decibels > -top_db)[:, 0], tf.int32)  # [loud frames], ascending
    # With no loud frame, first = the frame count and last = -1: an empty span, as librosa gives.
    first = tf.reduce_min(tf.concat([loud, [num_frames]], 0))
    last = tf.reduce_max(tf.concat([loud, [-1]], 0))
    start = tf.minimum(first * hop_length, tf.size(samples))
    end = tf.maximum(start, tf.minimum((last + 1) * hop_length, tf.size(samples)))
    return start, end


def peak_normalize(samples, peak: float) -> tf.Tensor:
    """Scale so the loudest sample reaches `peak` (silence stays silence); `peak <= 0` is a no-op."""
    if peak <= 0:
        return samples
    loudest = tf.reduce_max(tf.abs(samples))
    return samples * (peak / tf.maximum(loudest, 1e-6))
