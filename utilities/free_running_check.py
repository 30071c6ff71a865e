#!/usr/bin/env python3
"""Does a trained run say its sentences? Every validation sentence spoken from its text alone, measured.

    python utilities/free_running_check.py --run runs/demo [--sentences 24] [--json report.json] [--quality]

For each validation clip of the run: synthesis of its text in its own voice (another clip of the
speaker as the reference, durations predicted, nothing taken from the recording), the run's vocoder
(RUN/vocoder when train_vocoder.py made one, else Griffin-Lim; --vocoder picks another), and an
offline recognizer (pocketsphinx, with a language model of the corpus's own sentences). Printed:

- the word error rate of the syntheses, beside the recordings' own WER through the same log-mel
  and vocoder (the ceiling: what the recognizer makes of perfect features), per sentence too;
- the length of each synthesis against its recording's (trimmed) length (a synthesis is cut at 3 times it:
  an untrained model's durations run far longer, and the cap says so);
- where the demo corpus's espeak-ng phoneme timings exist: how far the model's learned alignment
  puts each phoneme's start from where espeak-ng started it (median and 90th percentile, ms);
- with --unseen-voices CORPUS (default: the run's data.unseen_voices_data): sentences spoken in
  voices training never heard, from one clip of each, and how close they sound to those voices by
  an independent speaker encoder (similarity and identification, beside the recordings' own);
  with --heard-voices, a corpus whose voices training used is measured too (new sentences in them:
  a voice learned by fine-tuning, or training voices as what the decoder renders at best); with
  --fit-voice N, the same sentences again in each voice fitted to its reference clips' words, and
  with --fit-head too, each voice also wearing a mel head fitted to those clips; the WER of each
  route's syntheses is measured where the language is;
- with --quality: DNSMOS of the syntheses (and of each unseen-voice route's), and the vocoder's
  copy-synthesis of the sentences' recordings (STOI, PESQ-WB when `pesq` is installed, DNSMOS) beside Griffin-Lim's (evaluation/quality.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--run", required=True, help="a training run folder (its --output-dir)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint prefix or one of the run's checkpoint folders (default: the run's best_wer, else best_mel, else latest)")
    parser.add_argument("--sentences", type=int, default=0, help="measure only the first N validation sentences (default: all)")
    parser.add_argument("--json", default=None, help="also write the report to this JSON file")
    parser.add_argument("--unseen-voices", default=None, metavar="CORPUS",
                        help="a corpus of voices training never used (default: the run's data.unseen_voices_data)")
    parser.add_argument("--voice-sentences", type=int, default=2, help="sentences spoken per unseen voice (default 2)")
    parser.add_argument("--reference-clips", type=int, default=1,
                        help="clips of each unseen voice averaged into its voice (default 1; the last K - 1 of its clips join the first)")
    parser.add_argument("--fit-voice", type=int, default=0, metavar="N",
                        help="also measure the unseen voices fitted to their reference clips and those clips' words "
                             "(N updates of each voice vector, the model unchanged; synthesize.py --reference-text; default: 0, not measured)")
    # const is voice_fit.DEFAULT_HEAD_RIDGE, written out: --help stays quick, without importing TensorFlow.
    parser.add_argument("--fit-head", nargs="?", type=float, const=3.0, default=None, metavar="RIDGE",
                        help="with --fit-voice, also measure each fitted voice with a mel head fitted to its clips "
                             "(synthesize.py --fit-head; RIDGE default 3)")
    parser.add_argument("--vocoder", default=None, metavar="FOLDER",
                        help="a vocoder folder (train_vocoder.py --output-dir) or griffin-lim (default: the run's own, "
                             "RUN/vocoder, else training.vocoder, else Griffin-Lim)")
    parser.add_argument("--quality", action="store_true",
                        help="also measure sound quality: DNSMOS of the syntheses, copy-synthesis against Griffin-Lim")
    parser.add_argument("--heard-voices", action="store_true",
                        help="measure --unseen-voices even where training used its voices (a fine-tuned voice; "
                             "training voices as the decoder's best)")
    args = parser.parse_args(argv)
    for flag, value in (("--sentences", args.sentences), ("--voice-sentences", args.voice_sentences),
                        ("--fit-voice", args.fit_voice)):
        if value < 0:
            parser.error(f"{flag} must be >= 0, got {value}")
    if args.reference_clips < 1:
        parser.error(f"--reference-clips must be at least 1, got {args.reference_clips}")
    if args.fit_head is not None and (not args.fit_voice or args.fit_head <= 0):
        parser.error("--fit-head needs --fit-voice N and a RIDGE above 0")
    from myxtts.output_paths import file_problem

    if args.json and (problem := file_problem(args.json, "--json")):
        parser.error(problem)  # now, not after minutes of measuring

    if args.quality:
        from myxtts.evaluation.quality import missing_packages

        if missing := missing_packages():  # now, not as a traceback after minutes of measuring
            parser.error(f"--quality needs {', '.join(missing)}, not installed here: pip install -r requirements-quality.txt")
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    import numpy as np

    from myxtts.evaluation.intelligibility import IntelligibilityScorer, default_workers, skip_reason
    from myxtts.evaluation.speech import HeldOutSentences, alignment_errors, cap_note, recordings_wer
    from myxtts.models.vocoder import VocoderMismatch
    from myxtts.synthesis import GRIFFIN_LIM, Synthesizer
    from myxtts.training.checkpoints import CheckpointError
    from myxtts.training.run_setup import prepare_run

    try:
        synthesizer = Synthesizer.from_run(args.run, args.checkpoint, vocoder=args.vocoder)
    except (FileNotFoundError, CheckpointError, VocoderMismatch) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(synthesizer.checkpoint_line())  # a run still training: which of its checkpoints was measured
    config, network = synthesizer.config, synthesizer.network
    # The rows as training read them (phonemized the same way, the run's vocabulary).
    try:
        text = prepare_run(config, args.run, resume="require", echo=lambda message: None).text
    except ValueError as error:  # a bad row (ManifestError), tokens not in vocab.txt: the corpus changed since
        print(f"error: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"error: {error}. The check speaks the run's validation rows, split from its data.train_data as "
              f"training split them: put that corpus back, or point data.train_data in "
              f"{Path(args.run) / 'config.yaml'} at where it is now", file=sys.stderr)
        return 2
    train_rows, val_rows = text.train_rows, text.val_rows
    rows = val_rows[: args.sentences] if args.sentences else val_rows
    if not rows:
        print(f"error: {args.run} has no validation rows to speak (data.val_fraction {config.data.val_fraction}, "
              f"data.val_data {config.data.val_data!r}); train with some held out", file=sys.stderr)
        return 2
    vocoder = synthesizer.vocoder
    sentences = HeldOutSentences.from_rows(rows, train_rows, synthesizer.vocabulary, config, vocoder=vocoder)
    # The unseen voices' corpus is checked now, not after minutes of measuring the validation sentences.
    voices = None
    unseen = args.unseen_voices if args.unseen_voices is not None else config.data.unseen_voices_data
    if unseen:
        import dataclasses

        from myxtts.evaluation.voices import unseen_voices_for

        voice_config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, unseen_voices_data=unseen),
            training=dataclasses.replace(config.training, voice_sentences=args.voice_sentences))
        try:
            voices = unseen_voices_for(voice_config, train_rows, synthesizer.vocabulary, print, heard_ok=args.heard_voices,
                                       vocoder=vocoder, reference_clips=args.reference_clips)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    vocoder_name = vocoder.folder if vocoder is not None else GRIFFIN_LIM
    print(f"vocoder: {vocoder_name}")
    report = {"run": str(args.run), "sentences": len(rows), "vocoder": vocoder_name}

    reason = skip_reason(config.data.language)
    if reason:
        print(f"intelligibility: {reason}")
        mels = sentences.synthesize(network)
        ratios = [len(m) / max(n, 1) for m, n in zip(mels, sentences.recorded_frames)]
    else:
        scorer = IntelligibilityScorer([u.text for u in train_rows + val_rows], config.data.language,
                                       workers=default_workers(len(rows)))
        spoken = sentences.measure(network, scorer, show_progress=True)
        ceiling = recordings_wer(rows, config.data, scorer, vocoder, show_progress=True)
        mels = spoken.mels
        ratios = [len(m) / max(n, 1) for m, n in zip(spoken.mels, sentences.recorded_frames)]
        for row, ratio in zip(spoken.rows, ratios):
            print(f"{row.errors:2d}/{row.words:2d} words wrong, length x{ratio:.2f}: {row.reference!r} -> heard {row.hypothesis!r}")
        print(f"syntheses:  {spoken.summary}")
        print(f"recordings: {ceiling.summary()} (the same log-mel and vocoder: the ceiling)")
        report.update(wer=spoken.wer, recordings_wer=ceiling.wer,
                      per_sentence=[{"text": r.reference, "heard": r.hypothesis, "errors": r.errors, "words": r.words}
                                    for r in spoken.rows])
    print(f"length: synthesis / recording median {np.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
          f"{cap_note(max(ratios))}")
    report.update(length_ratio_median=float(np.median(ratios)), length_ratio_min=float(min(ratios)),
                  length_ratio_max=float(max(ratios)))

    aligned = alignment_errors(network, rows, synthesizer.vocabulary, config.data)
    if aligned["clips"]:
        print(f"alignment: phoneme starts found by the model vs espeak-ng's, {aligned['phonemes']} phonemes in "
              f"{aligned['clips']} clips: median {aligned['median_ms']:.0f} ms, 90th percentile {aligned['p90_ms']:.0f} ms "
              f"({aligned['skipped']} clips without matching timing files skipped)")
    else:
        print("alignment: no clip has an espeak-ng timing file matching its phonemes (only the demo corpus has them)")
    report["alignment"] = aligned

    if voices is not None:
        # The recognizer's closed grammar must hold these sentences, which validation's may not.
        voice_scorer = None if reason else IntelligibilityScorer(
            [u.text for u in train_rows] + voices.sentences.texts, config.data.language,
            workers=default_workers(len(voices.speakers)))

        def shown(label, measured) -> dict:  # printed, and what the JSON report keeps of every route
            print(f"{label}: {measured.summary()}")
            print("  per voice: " + ", ".join(f"{voice} {value:.3f}" for voice, value in sorted(measured.per_voice.items())))
            return {"similarity": measured.similarity, "identified": measured.identified, "per_voice": measured.per_voice,
                    "wer": measured.wer, "dnsmos": measured.dnsmos}

        measured = voices.measure(network, scorer=voice_scorer, quality=args.quality)
        report["unseen_voices"] = {"corpus": unseen, "voices": measured.voices, "sentences": measured.total,
                                   "reference_clips": args.reference_clips,
                                   "recordings_similarity": measured.ceiling_similarity,
                                   "recordings_identified": measured.ceiling_identified, "heard": list(measured.heard),
                                   **shown("voices", measured)}
        routes = [("fitted", None, "voices fitted to their references' words")] if args.fit_voice else []
        if args.fit_head is not None:
            routes.append(("fitted_head", args.fit_head, f"... and each with its own mel head (ridge {args.fit_head:g})"))
        for key, ridge, label in routes:
            fitted = voices.measure(network, fit_steps=args.fit_voice, head_ridge=ridge, scorer=voice_scorer,
                                    quality=args.quality, show_progress=True)
            report["unseen_voices"][key] = {"steps": args.fit_voice, "head_ridge": ridge,
                                            **shown(f"{label} ({args.fit_voice} updates each, {fitted.seconds:.0f} s)", fitted)}
    if args.quality:
        report["quality"] = measure_quality(sentences, mels, rows, config.data)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def measure_quality(sentences, mels, rows, d) -> dict:
    """DNSMOS of the syntheses; copy-synthesis of the rows' recordings through the vocoder and Griffin-Lim."""
    import numpy as np

    from myxtts.evaluation import quality
    from myxtts.progress import ProgressLine

    progress = ProgressLine("quality: DNSMOS of the syntheses", len(mels), "sentences", enabled=True)
    scores = [quality.dnsmos(sentences.waveform(mel), d.sample_rate) for mel in progress.each(mels)]
    synthesized = {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}
    print(f"quality: DNSMOS of the {len(mels)} syntheses: overall {synthesized['ovrl']:.2f}, P.808 {synthesized['p808']:.2f}")
    paths = [u.audio_path for u in rows]
    result = {"dnsmos_syntheses": synthesized}
    makers = {"griffin-lim": None}
    if sentences.vocoder is not None:
        makers["vocoder"] = sentences.to_audio
    recordings = quality.RecordingScores()  # scored once for both
    for name, maker in makers.items():
        copy = quality.measure_copy_synthesis(paths, d, maker, label=f"quality: {name}", recordings=recordings)
        print(f"quality: {copy.line(name)}")
        result[f"copy_synthesis_{name}"] = vars(copy)
    return result


if __name__ == "__main__":
    sys.exit(main())
