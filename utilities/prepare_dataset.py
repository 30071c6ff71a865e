"""Prepares a corpus for training, once: checks every row, converts audio TensorFlow cannot read.

    python utilities/prepare_dataset.py --input LJSpeech-1.1 --output data/ljspeech
    python utilities/prepare_dataset.py --input corpus.jsonl --output data/corpus --config configs/config.yaml
    python utilities/prepare_dataset.py --input persian_corpus --output data/fa --language fa

Writes OUTPUT/manifest.jsonl (train on this; each row carries its `phonemes`, the model's text),
OUTPUT/rejected.tsv (every row left out, with its line number and reason) and OUTPUT/audio/
(converted files). Rerunning skips conversions that are already done. See myxtts/data/prepare.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Check every row of an LJSpeech folder, metadata.csv or .jsonl manifest once; convert "
            "audio that is not 16-bit PCM mono WAV at the target rate; phonemize the text with "
            "espeak-ng; write OUTPUT/manifest.jsonl and OUTPUT/rejected.tsv. Original files are "
            "never modified."
        ),
        epilog=__doc__.split("\n\n", 1)[1],  # the examples and what is written
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", type=Path, required=True,
                        help="LJSpeech folder (metadata.csv + wavs/), a metadata.csv file or a .jsonl manifest")
    parser.add_argument("--output", type=Path, required=True,
                        help="folder for manifest.jsonl, rejected.tsv and converted audio: a new folder or an "
                             "earlier preparation's; the input's own folder, or one holding a manifest.jsonl, "
                             "rejected.tsv or audio/ that no preparation wrote, is refused")
    parser.add_argument("--config", type=Path, default=None,
                        help="take data.sample_rate, data.min_duration_s, data.max_duration_s, "
                             "data.text_frontend and data.language from this YAML config (default: the "
                             "built-in defaults, 22050 Hz, 0.5-12 s, phonemes, en-us)")
    parser.add_argument("--language", default=None,
                        help="espeak-ng language code to phonemize the text in: en-us, en, fa, ko, de, ... "
                             "(default: data.language of --config, else en-us)")
    parser.add_argument("--text-frontend", choices=["phonemes", "characters"], default=None,
                        help="characters writes no phonemes (default: data.text_frontend of --config, else phonemes)")
    parser.add_argument("--workers", type=int, default=0,
                        help="worker processes; 0 uses every usable core (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="print neither the progress line nor the summary")
    arguments = parser.parse_args(argv)
    if arguments.workers < 0:
        parser.error(f"--workers must be >= 0, got {arguments.workers}")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    # Lets `python utilities/prepare_dataset.py` import the package from a checkout without
    # installing it.
    repository_root = str(Path(__file__).resolve().parent.parent)
    if repository_root not in sys.path:
        sys.path.insert(0, repository_root)
    from myxtts.data.manifest import ManifestError
    from myxtts.data.prepare import prepare_dataset

    if not arguments.input.exists():
        print(f"error: --input {arguments.input} does not exist", file=sys.stderr)
        return 2

    from myxtts.config import DataConfig, load_config

    limits = {}
    data_config = DataConfig()
    if arguments.config is not None:
        try:
            data_config = load_config(arguments.config).data
        except ValueError as error:  # ConfigError is a ValueError
            print(f"error: {error}", file=sys.stderr)
            return 2
        limits = dict(
            sample_rate=data_config.sample_rate,
            min_duration_s=data_config.min_duration_s,
            max_duration_s=data_config.max_duration_s,
        )
    frontend = arguments.text_frontend or data_config.text_frontend
    language = (arguments.language or data_config.language) if frontend == "phonemes" else None

    try:
        if language is not None:
            from myxtts.data.phonemes import check_language

            check_language(language, key="--language" if arguments.language else "data.language")
        report = prepare_dataset(
            arguments.input, arguments.output, workers=arguments.workers, progress=not arguments.quiet,
            phoneme_language=language, **limits
        )
    except (ManifestError, FileNotFoundError, ValueError) as error:  # ValueError: an unknown --language
        print(f"error: {error}", file=sys.stderr)
        return 2
    if report.rows == 0:
        print(f"error: {arguments.input} has no rows; nothing to prepare", file=sys.stderr)
        return 1
    if report.kept == 0:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in report.rejected_by_reason.items())
        print(
            f"error: every one of the {report.rows} rows was rejected ({reasons}); see {report.rejected_path}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
