"""From a trained run to files that serve without this package: a SavedModel, and a TFLite model.

    <out>/                 SavedModel (Keras 3 `ExportArchive`), loadable by `tf.saved_model.load`,
                           TF Serving or any TensorFlow runtime; no `myxtts` import, no Python code
      assets/vocab.txt     the run's tokens, one per line: a token's id is its line number from 0
      assets/settings.json the audio settings (sample rate, mel bands, hop, ...) and the text front end
    <out>/model.tflite     with --tflite: text tokens + reference mel -> mel and audio, built-in ops only

Endpoints of the SavedModel:

    reference_mel(wav_bytes: string [])          -> {"mel": [R, n_mels], "length": int32 []}
    tokenize(phonemes: string [])                -> {"tokens": int32 [L]}
    synthesize(tokens: int32 [L], reference_mel: [N, R, n_mels], reference_length: int32 [N],
               max_frames: int32 [])             -> {"audio": [samples], "mel": [frames, n_mels]}

`synthesize` checks its inputs before any work and fails with an `InvalidArgumentError` that names the
input and the rule (`checked_inputs`): tokens are 1 to `MAX_TOKENS` ids (also in settings.json as
`max_tokens`) of symbols in assets/vocab.txt, so neither 0 (padding) nor 1 (<unk>: a symbol the run never
trained on, which `tokenize` gives for one; leave it out); at least one reference clip, each
reference_length between 1 and the padded reference_mel's frames; max_frames at least 1.

`reference_mel` reads a WAV file's bytes (any rate in `audio.SUPPORTED_RATES`, any channel count),
so a client needs no feature code; several references of one voice are stacked and averaged, as
`utilities/synthesize.py` does. `tokenize` takes the model text as training saw it: for the phoneme
front end, espeak-ng's phonemes with "|" between phonemes (`myxtts.data.phonemes.model_text`), which
a client makes with espeak-ng itself; the characters front end takes the text.

There is no decoding loop to put in the graph: the model is not autoregressive (`models/xtts.py`),
so a sentence is one parallel pass, the same computation as `models.inference.generate`, followed by
the same vocoder as `utilities/synthesize.py`: the run's neural vocoder when it has one (RUN/vocoder,
`models/vocoder.py`; `vocoder=` picks another or "griffin-lim"), else Griffin-Lim (`models.griffin_lim`,
32 iterations, seed 0). settings.json names which (`vocoder`: "neural" or "griffin-lim").

`<out>` is written beside itself first and moved into place at the end, so a failed export leaves
what was there. It may be a new or empty folder, or an earlier export (the files above and nothing
else), which it replaces; any other folder (a run, a corpus, a folder holding anything an export does
not write) is refused with `ExportFolderError` and left untouched (`export_folder.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import keras
import tensorflow as tf

from myxtts.data.clip_features import reference_log_mel_of_bytes
from myxtts.data.text import SPECIAL_TOKENS, tokenize
from myxtts.export_folder import check_export_target, staged
from myxtts.models.griffin_lim import log_mel_to_audio
from myxtts.models.inference import synthesize_sentence
from myxtts.synthesis import Synthesizer

SETTINGS_KEYS = ("sample_rate", "n_mels", "n_fft", "hop_length", "win_length", "fmin", "mel_fmax", "mel_scale",
                 "power", "log_floor", "reference_duration_s", "text_frontend", "language")
# The most tokens one `synthesize` call takes. Training keeps clips up to data.max_duration_s (12 s by
# default, some 150-200 phonemes): 512 (about 40 s of speech) leaves room for a long sentence while
# refusing a whole text in one call, which the model never learnt to speak in one pass and whose
# attention and frames grow with it. Split longer text into sentences.
MAX_TOKENS = 512


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, checkpoint: str | None = None,
               tflite: bool = False, echo=print, vocoder: str | None = None) -> dict:
    """Write the SavedModel (and with `tflite` the TFLite file) of a run; returns what was written.
    `vocoder`: a vocoder folder or "griffin-lim"; by default the run's own (`synthesis.vocoder_folder`).

    Raises `ExportFolderError` (nothing written) when `out_dir` is neither new, empty nor an earlier export.
    """
    check_export_target(out_dir, run_dir)  # before minutes of loading and tracing
    synthesizer = Synthesizer.from_run(run_dir, checkpoint, vocoder=vocoder)
    network, d, vocabulary, neural = synthesizer.network, synthesizer.config.data, synthesizer.vocabulary, synthesizer.vocoder
    table = vocabulary.lookup_table()
    n_mels = d.n_mels

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def reference_mel(wav_bytes):
        mel, length = reference_log_mel_of_bytes(wav_bytes, d, source="wav_bytes")
        return {"mel": mel, "length": tf.cast(length, tf.int32)}

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def tokenize_text(model_text):
        return {"tokens": tokenize(model_text, table, frontend=d.text_frontend)}

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, None, n_mels], tf.float32),
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])
    def synthesize(tokens, reference_mel, reference_length, max_frames):
        tokens, reference_mel, reference_length, max_frames = checked_inputs(
            tokens, reference_mel, reference_length, max_frames, len(vocabulary))
        mel = synthesize_sentence(network, tokens, reference_mel, reference_length, max_frames)
        audio = log_mel_to_audio(mel, d) if neural is None else neural(mel[None])[0]
        return {"audio": audio, "mel": mel}

    out = Path(out_dir)
    # Tracing, writing and converting take half a minute for the base model on a CPU, silent without these.
    stages = 2 if tflite else 1
    with staged(out) as folder:
        echo(f"export 1/{stages}: tracing the endpoints and writing the SavedModel")
        archive = keras.export.ExportArchive()
        archive.track(network)
        if neural is not None:
            archive.track(neural)
        archive.track(table)
        archive.add_endpoint("reference_mel", reference_mel)
        archive.add_endpoint("tokenize", tokenize_text)
        archive.add_endpoint("synthesize", synthesize)
        archive.write_out(str(folder), verbose=False)
        assets = folder / "assets"
        assets.mkdir(exist_ok=True)
        vocabulary.save(assets / "vocab.txt")
        settings = {**{key: getattr(d, key) for key in SETTINGS_KEYS}, "max_tokens": MAX_TOKENS,
                    "vocoder": "griffin-lim" if neural is None else "neural"}
        (assets / "settings.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        if tflite:
            from myxtts.export_tflite import convert

            echo(f"export 2/{stages}: converting to TFLite")
            (folder / "model.tflite").write_bytes(convert(network, d, neural))
    written = {"saved_model": str(out), "vocoder": settings["vocoder"]}
    echo(f"wrote the SavedModel {out} (endpoints reference_mel, tokenize, synthesize; audio by {settings['vocoder']}; "
         f"{synthesizer.checkpoint_line()})")
    if tflite:
        path = out / "model.tflite"
        written["tflite"] = str(path)
        echo(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, built-in ops only)")
    return written


def checked_inputs(tokens, reference_mel, reference_length, max_frames, vocabulary_size: int):
    """The `synthesize` endpoint's inputs, passed on only once every rule of the module docstring holds.

    Without these a bad id reached the embedding's gather: an out-of-range one failed as a bare
    GatherV2 error naming no input, and -1 or an empty sentence gave audio. The checks are control
    dependencies of the returned tensors, so no op of the synthesis runs before they pass.
    """
    first = len(SPECIAL_TOKENS)
    rule = (f"synthesize: tokens must be 1 to {MAX_TOKENS} ids from {first} to {vocabulary_size - 1}, the lines of "
            "assets/vocab.txt counted from 0 (0 is padding; 1 is <unk>, what tokenize gives for a symbol the model "
            "never trained on: leave it out)")
    references = tf.shape(reference_mel)
    checks = [
        tf.debugging.assert_positive(tf.size(tokens), message=f"{rule}; got none"),
        tf.debugging.assert_less_equal(tf.size(tokens), MAX_TOKENS,
                                       message=f"{rule}; got more: split the text into sentences"),
        tf.debugging.assert_greater_equal(tokens, first, message=rule),
        tf.debugging.assert_less(tokens, vocabulary_size, message=rule),
        tf.debugging.assert_positive(references[0], message="synthesize: reference_mel holds no clip; give at least one "
                                                            "(reference_mel's output for a WAV of the voice, stacked)"),
        tf.debugging.assert_equal(tf.size(reference_length), references[0],
                                  message="synthesize: reference_length needs one length per reference_mel clip"),
        tf.debugging.assert_positive(reference_length, message="synthesize: every reference_length must be at least 1"),
        tf.debugging.assert_less_equal(reference_length, references[1],
                                       message="synthesize: a reference_length is longer than the frames of reference_mel"),
        tf.debugging.assert_positive(max_frames, message="synthesize: max_frames must be at least 1"),
    ]
    with tf.control_dependencies(checks):
        return (tf.identity(tokens), tf.identity(reference_mel), tf.identity(reference_length),
                tf.identity(max_frames))
