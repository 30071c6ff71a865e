"""From a trained run to audio: load config, vocabulary and checkpoint; text + reference -> WAV.

Used by utilities/synthesize.py, export.py and train_main's closing sample. It reads run folders and
checkpoints, so it sits above `myxtts.models` and `myxtts.training` (models import neither). Features and tokens go
through the same functions as training (`phonemes.model_text` with the run's data.text_frontend and
data.language, `reference_log_mel`, `tokenize`), so inference sees exactly what the model was trained on.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import tensorflow as tf

from myxtts.config import Config, load_run_config
from myxtts.data.phonemes import model_text
from myxtts.data.pipeline import reference_log_mel
from myxtts.data.text import Vocabulary, tokenize
from myxtts.models.griffin_lim import log_mel_to_audio, write_wav
from myxtts.models.inference import generate
from myxtts.models.xtts import XTTS, network_for


class Synthesizer:
    def __init__(self, network: XTTS, config: Config, vocabulary: Vocabulary):
        self.network, self.config, self.vocabulary = network, config, vocabulary
        self._table = vocabulary.lookup_table()

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike, checkpoint: str | None = None) -> "Synthesizer":
        """Load `run_dir`'s config.yaml and vocab.txt, and `checkpoint` (default: best_mel, else latest)."""
        from myxtts.training.checkpoints import find_checkpoint, restore_network
        from myxtts.training.run_folder import read_vocabulary

        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"{run_dir} is not a MyXTTS run folder (no config.yaml); pass the --output-dir of a training run")
        config = load_run_config(run_dir / "config.yaml")
        vocabulary = read_vocabulary(run_dir)
        network = network_for(config, len(vocabulary), vocabulary.word_boundary_id)
        network.build()
        path = checkpoint or find_checkpoint(run_dir)
        restore_network(network, path)
        return cls(network, config, vocabulary)

    def reference(self, paths) -> tuple[tf.Tensor, tf.Tensor]:
        """Reference mels [N, R, n_mels] and lengths [N] for one or more clips of the voice."""
        clips = []
        for path in paths:
            if not Path(path).is_file():
                raise FileNotFoundError(f"reference audio not found: {path}")
            try:
                clips.append(reference_log_mel(tf.constant(str(path)), self.config.data))
            except tf.errors.InvalidArgumentError as error:
                raise ValueError(f"{path}: cannot use as a reference voice (16-bit PCM WAV expected; convert it "
                                 f"with utilities/prepare_dataset.py): {error.message.splitlines()[0]}") from None
        return tf.stack([m for m, _ in clips]), tf.stack([n for _, n in clips])

    def synthesize(self, text: str, reference_paths, max_seconds: float | None = None, duration_scale: float = 1.0):
        """(samples float32 [n], mel [frames, n_mels]) for `text` in the voice of the reference clip(s).

        `duration_scale` stretches the predicted durations (1.2 = 20% slower); `max_seconds` caps the length.
        """
        if not text or not text.strip():
            raise ValueError("the text to synthesize is empty")
        d = self.config.data
        text_for_model = model_text(text, d.text_frontend, d.language)
        if not text_for_model.strip():
            raise ValueError(f"espeak-ng ({d.language}) makes no phonemes of {text!r}; write it in words of data.language")
        tokens = tokenize(tf.constant(text_for_model), self._table, frontend=d.text_frontend)
        reference_mel, reference_length = self.reference(list(reference_paths))
        max_frames = math.ceil(max_seconds * d.frames_per_second) if max_seconds else None
        mel, length = generate(self.network, tokens, reference_mel, reference_length, max_frames=max_frames,
                               average_references=len(reference_paths) > 1, duration_scale=duration_scale)
        mel = mel[0, : int(length[0])]
        return log_mel_to_audio(mel, d), mel

    def synthesize_to_file(self, text: str, reference_paths, out_path: str | os.PathLike) -> dict:
        start = time.perf_counter()
        samples, mel = self.synthesize(text, reference_paths)
        seconds_taken = time.perf_counter() - start
        write_wav(str(out_path), samples, self.config.data.sample_rate)
        audio_seconds = int(samples.shape[0]) / self.config.data.sample_rate
        return {"out": str(out_path), "audio_seconds": audio_seconds, "frames": int(mel.shape[0]),
                "synthesis_seconds": seconds_taken, "real_time_factor": seconds_taken / max(audio_seconds, 1e-9)}


def validation_sample(run_dir: str | os.PathLike, out_path: str | os.PathLike) -> dict:
    """Speak a held-out sentence in its own speaker's voice (another clip as the reference), and
    measure it against the held-out recording of the same sentence: duration ratio and loudness.

    The demo's corpus is espeak-ng speech, so the recording *is* the reference rendering.
    """
    import numpy as np

    from myxtts.data.pipeline import assign_references
    from myxtts.training.run_setup import load_splits

    synthesizer = Synthesizer.from_run(run_dir)
    train_rows, val_rows = load_splits(synthesizer.config)
    target = val_rows[0]
    voice = [u for u in train_rows if u.speaker == target.speaker] or [target]
    reference = assign_references([target] + voice, synthesizer.config.seed)[0]
    result = synthesizer.synthesize_to_file(target.text, [reference], out_path)
    samples, rate = tf.audio.decode_wav(tf.io.read_file(str(out_path)))
    recording, _ = tf.audio.decode_wav(tf.io.read_file(target.audio_path))
    result.update(
        text=target.text,
        speaker=target.speaker,
        reference=reference,
        recording_seconds=int(recording.shape[0]) / int(rate),
        duration_ratio=result["audio_seconds"] / (int(recording.shape[0]) / int(rate)),
        rms=float(np.sqrt(np.mean(np.square(samples.numpy())))),
        recording_rms=float(np.sqrt(np.mean(np.square(recording.numpy())))),
    )
    return result
