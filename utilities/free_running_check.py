"""How long does a trained run speak each validation sentence, next to its recording?

    python utilities/free_running_check.py --run runs/demo [--max-seconds 12]

For every validation clip of the run: free-running synthesis of its text in its own voice (the
same reference clip as in training), stopping as synthesis does (the stop head says p > 0.5, or
the frames have gone silent: `inference.end_silence`), what ended it, and the ratio of that
length to the recording's (trimmed) length. Teacher-forced losses say how well the model
predicts the next frames; this says whether it can pace itself through a text on its own, which is
what the demo's "speech-shaped" check asks (a ratio between 0.5 and 2).

Then whether a synthesis says *its* sentence: its dynamic-time-warping distance (mean L1 between
log-mel frames along the best alignment) to every validation recording of the same voice. Content
shows as the synthesis lying nearest its own recording more often than a constant frame does (the
synthesis' mean frame, at the synthesis' length): that baseline has the voice and the length but no
syllables, so it shows how often timbre and length alone pick the right recording.
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
    ratios, ended_by_model, own_nearest, constant_nearest, rivals = [], [], 0, 0, []
    for speaker in sorted({u.speaker for u in val_rows}):
        # One voice per stream: each synthesis is compared with the recordings of its own voice.
        rows = [u for u in val_rows if u.speaker == speaker]
        spoken, recorded = [], []
        for batch in build_dataset(config, rows, training=False, vocabulary=synthesizer.vocabulary):
            latents = network.conditioning_latents(batch["reference_mel"], batch["reference_length"])
            mel, length = autoregress(network, latents, batch["tokens"], batch["text_length"], max_frames, **rule)
            # Which rule ended a row: one teacher-forced pass over the generated frames replays the
            # loop's stop probabilities exactly (causality), so the stop head ended it if its last
            # frame is over the threshold; otherwise the frames had gone silent.
            stop = tf.sigmoid(network.decode(latents, batch["tokens"], batch["text_length"], mel)["stop_logits"]).numpy()
            for row, (n, m) in enumerate(zip(length.numpy(), batch["mel_length"].numpy())):
                spoken.append(mel[row, :n].numpy())
                recorded.append(batch["mel"][row, :m].numpy())
                ratios.append(n / m)
                ended_by_model.append(n < max_frames)
                if n == max_frames:
                    ended = "hit the limit"
                elif stop[row, n - 1] > 0.5:
                    ended = "stop head"
                else:
                    ended = "went silent"
                print(f"{speaker}: recording {m:4d} frames, synthesis {n:4d} ({ended}): ratio {n / m:.2f}")
        for i, synthesis in enumerate(spoken):
            constant = np.broadcast_to(synthesis.mean(axis=0), synthesis.shape)
            own_nearest += int(np.argmin([dtw_distance(synthesis, r) for r in recorded]) == i)
            constant_nearest += int(np.argmin([dtw_distance(constant, r) for r in recorded]) == i)
            rivals.append(len(recorded))
    ratios, by_model = np.array(ratios), np.array(ended_by_model, bool)
    within = (ratios >= 0.5) & (ratios <= 2.0)
    print(f"content: {own_nearest} of {len(ratios)} syntheses lie nearest their own recording among their voice's "
          f"{min(rivals)}-{max(rivals)} recordings (DTW); a constant frame of the same length and mean: "
          f"{constant_nearest}; chance: {sum(1 / k for k in rivals):.1f}")
    # A sentence cut by the limit says nothing about pacing, even when the limit is within 2x.
    print(f"{int(np.sum(within & by_model))} of {len(ratios)} validation sentences ended by the model within 2x of "
          f"their recording's length ({int(np.sum(by_model))} ended by the model, {int(np.sum(~by_model))} at the "
          f"decoding limit); median ratio {np.median(ratios):.2f}")
    return 0


def dtw_distance(a, b) -> float:
    """Dynamic time warping between frame sequences a [n, bins] and b [m, bins]: the least total
    L1 frame distance (mean over bins) along a monotonic alignment, divided by n + m.

    One numpy pass per row of a: the cell (i, j) costs c(i, j) plus the least of its three
    neighbours; the horizontal neighbour chain within a row is a running minimum of
    (diagonal-or-vertical total - cumulative cost), so no Python loop runs over j."""
    import numpy as np

    cost = np.abs(a[:, None, :] - b[None, :, :]).mean(axis=-1)  # [n, m]
    previous = np.cumsum(cost[0])
    for i in range(1, len(a)):
        from_above = np.minimum(previous, np.concatenate([[np.inf], previous[:-1]])) + cost[i]
        running = np.cumsum(cost[i])
        previous = running + np.minimum.accumulate(from_above - running)
    return float(previous[-1] / (len(a) + len(b)))


if __name__ == "__main__":
    sys.exit(main())
