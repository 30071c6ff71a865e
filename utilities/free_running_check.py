"""How long does a trained run speak each validation sentence, next to its recording?

    python utilities/free_running_check.py --run runs/demo [--max-seconds 12]

For every validation clip of the run: free-running synthesis of its text in its own voice (the
same reference clip as in training), stopping as synthesis does (the stop head says p > 0.5, or
the frames have gone silent: `inference.end_silence`), what ended it, and the ratio of that
length to the recording's (trimmed) length. Teacher-forced losses say how well the model
predicts the next frames; this says whether it can pace itself through a text on its own, which is
what the demo's "speech-shaped" check asks (a ratio between 0.5 and 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a training run folder (its --output-dir)")
    parser.add_argument("--max-seconds", type=float, default=None, help="decoding limit (default: the longest bucket)")
    args = parser.parse_args(argv)

    import numpy as np

    from myxtts.data.pipeline import build_dataset
    import tensorflow as tf

    from myxtts.models.inference import autoregress, end_silence
    from myxtts.models.synthesizer import Synthesizer
    from myxtts.training.checkpoints import CheckpointError
    from myxtts.training.trainer import load_splits

    try:
        synthesizer = Synthesizer.from_run(args.run)
    except (FileNotFoundError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config, network = synthesizer.config, synthesizer.network
    d = config.data
    max_frames = d.bucket_mel_lengths[-1]
    if args.max_seconds:
        max_frames = min(max_frames, int(args.max_seconds * d.frames_per_second))
    _, val_rows = load_splits(config)
    rule = end_silence(d)
    ratios, ended_by_model = [], []
    for batch in build_dataset(config, val_rows, training=False, vocabulary=synthesizer.vocabulary):
        latents = network.conditioning_latents(batch["reference_mel"], batch["reference_length"])
        mel, length = autoregress(network, latents, batch["tokens"], batch["text_length"], max_frames, **rule)
        # Which rule ended a row: one teacher-forced pass over the generated frames replays the
        # loop's stop probabilities exactly (causality), so the stop head ended it if its last
        # frame is over the threshold; otherwise the frames had gone silent.
        stop = tf.sigmoid(network.decode(latents, batch["tokens"], batch["text_length"], mel)["stop_logits"]).numpy()
        for row, (spoken, recorded) in enumerate(zip(length.numpy(), batch["mel_length"].numpy())):
            ratios.append(spoken / recorded)
            ended_by_model.append(spoken < max_frames)
            if spoken == max_frames:
                ended = "hit the limit"
            elif stop[row, spoken - 1] > 0.5:
                ended = "stop head"
            else:
                ended = "went silent"
            print(f"recording {recorded:4d} frames, synthesis {spoken:4d} ({ended}): ratio {spoken / recorded:.2f}")
    ratios, by_model = np.array(ratios), np.array(ended_by_model, bool)
    within = (ratios >= 0.5) & (ratios <= 2.0)
    # A sentence cut by the limit says nothing about pacing, even when the limit is within 2x.
    print(f"{int(np.sum(within & by_model))} of {len(ratios)} validation sentences ended by the model within 2x of "
          f"their recording's length ({int(np.sum(by_model))} ended by the model, {int(np.sum(~by_model))} at the "
          f"decoding limit); median ratio {np.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
