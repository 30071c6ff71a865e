"""The run folder: what ties it to one run, and what may be written to it when.

    <run>/checkpoints/   latest, best_mel, best_wer (checkpoints.py); damaged/, checkpoints a
                         resume skipped (checkpoint_fallback.py)
    <run>/train.lock     while a training runs in the folder (run_lock.py)
    <run>/vocab.txt      the token ids the checkpoints' embedding rows follow
    <run>/phonemes.json  transcripts phonemized before (saves espeak-ng the work on a resume)
    <run>/config.yaml    the resolved config of the last start

A run resumes with its own vocabulary and the text front end and log-mel settings its checkpoints
were trained with, or stops (`prepare_text`, `check_resumed_inputs`); `--reset-training` sets aside
what ties the folder to the old run (`reset_run`) and deletes it once the new run writes
(`finish_reset`), or puts it back if the new run never gets that far (`undo_reset`); nothing here
writes until `RunText.save`, which the trainer calls only once the folder's checkpoint, if any, has
been restored.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from myxtts import config as config_lib
from myxtts.config import Config
from myxtts.data.phonemes import model_texts, needs_phonemes, phonemize_utterances, read_phonemes_cache, save_phonemes_cache
from myxtts.data.text import Vocabulary
from myxtts.training.callbacks import console_echo
from myxtts.training.checkpoint_fallback import candidates
from myxtts.training.checkpoints import CheckpointError, read_meta
from myxtts.training.init_from import extended_vocabulary, feature_differences

VOCABULARY_FILE, PHONEMES_CACHE = "vocab.txt", "phonemes.json"


def has_checkpoint(workdir: Path) -> bool:
    """Whether the run folder holds a checkpoint of any kind, intact or not (a damaged state file
    does not make a run new: its vocabulary still holds)."""
    return bool(candidates(workdir / "checkpoints"))


# What ties a run folder to its run, and where --reset-training keeps it until the new run writes.
RUN_STATE = ("checkpoints", VOCABULARY_FILE, PHONEMES_CACHE)
RESET_ASIDE = "reset-pending"


def reset_run(workdir: Path, echo=console_echo) -> None:
    """--reset-training: set aside what ties the folder to the old run (its checkpoints, its vocabulary:
    new data may hold new tokens, and its phonemes cache) in `RESET_ASIDE`. Deleted at once, they were
    lost to a new run that then stopped on a mistyped corpus path or a bad setting."""
    aside = workdir / RESET_ASIDE
    for name in RUN_STATE:
        path = workdir / name
        if path.exists():
            aside.mkdir(exist_ok=True)
            _remove(aside / name)  # an older copy that could not go back (the folder had its own again)
            path.rename(aside / name)
            echo(f"--reset-training: {path} set aside until the new run starts (in {aside})")


def check_reset_source(config: Config, workdir: Path) -> None:
    """--reset-training with training.init_from naming this run folder (or a checkpoint in it): the
    reset sets its checkpoints aside before the source is read, which then stopped the run saying
    there was no checkpoint there. Said before anything is moved."""
    source = config.training.init_from
    if not source:
        return
    source_path, run = Path(source).resolve(), workdir.resolve()
    if source_path == run or run in source_path.parents:
        raise ValueError(
            f"training.init_from ({source}) names a checkpoint of {workdir}, which --reset-training deletes: fine-tune "
            f"from it in another folder (--init-from {source} --output-dir NEW), or leave out --reset-training to "
            f"resume it. Nothing in {workdir} was moved or deleted")


def finish_reset(workdir: Path, echo=console_echo) -> None:
    """The new run is about to write: what `reset_run` set aside goes for good."""
    aside = workdir / RESET_ASIDE
    if aside.exists():
        for path in sorted(aside.iterdir()):
            echo(f"--reset-training: removed {workdir / path.name}")
        shutil.rmtree(aside)


def undo_reset(workdir: Path, echo=console_echo) -> None:
    """The new run stopped before writing (or an earlier one was killed then): the old run's state
    goes back where it was, and the folder resumes as before the reset."""
    aside = workdir / RESET_ASIDE
    if not aside.exists():
        return
    back = []
    for path in sorted(aside.iterdir()):
        target = workdir / path.name
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        if not target.exists():
            path.rename(target)
            back.append(path.name)
    if not any(aside.iterdir()):
        aside.rmdir()
    if back:
        echo(f"--reset-training: the new run did not start, so the old run's {', '.join(back)} are back in {workdir}")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


@dataclass
class RunText:
    """The rows with their model texts, and the run's vocabulary; `save` writes them to the run folder."""

    train_rows: list
    val_rows: list
    vocabulary: Vocabulary
    language: str
    new_phonemes: dict  # transcript -> phonemes made now, for the run's phonemes cache

    def save(self, workdir: Path) -> None:
        self.vocabulary.save(workdir / VOCABULARY_FILE)
        if self.new_phonemes:
            cache = workdir / PHONEMES_CACHE
            save_phonemes_cache(cache, self.language, {**read_phonemes_cache(cache, self.language), **self.new_phonemes})


def prepare_text(config: Config, workdir: Path | None, train_rows, val_rows, *, keep_vocabulary: bool = False,
                 base_vocabulary: Vocabulary | None = None) -> RunText:
    """The rows with their model texts ready, and the run's vocabulary; nothing is written (`RunText.save`).

    With `data.text_frontend: phonemes`, rows without phonemes (a raw LJSpeech folder) are phonemized
    here, once, before any graph is built; the run's cache (workdir/phonemes.json) answers for the
    transcripts phonemized before. `keep_vocabulary` (a run resuming its checkpoint): the vocabulary
    is the run's vocab.txt, since its checkpoint's token rows follow it; a training token it lacks is
    an error, not a silent <unk>. Otherwise the vocabulary is built from the training rows, after the
    tokens of `base_vocabulary` (fine-tuning: `init_from.extended_vocabulary`). `workdir` None: a run
    without a folder (the diagnosis), so no phonemes cache and nothing to keep.
    """
    d = config.data
    new_phonemes = {}
    if d.text_frontend == "phonemes":
        rows = train_rows + val_rows
        cache = workdir / PHONEMES_CACHE if workdir is not None else None
        phonemized = phonemize_utterances(rows, d.language, cache_path=cache, progress=True, write_cache=False)
        new_phonemes = {before.text: after.phonemes for before, after in zip(rows, phonemized)
                        if needs_phonemes(before, d.language)}
        train_rows, val_rows = phonemized[: len(train_rows)], phonemized[len(train_rows) :]
    from_data = Vocabulary.from_texts(model_texts(train_rows, d.text_frontend), frontend=d.text_frontend)
    if keep_vocabulary:
        vocab_path = workdir / VOCABULARY_FILE
        try:
            vocabulary = read_vocabulary(workdir)
        except CheckpointError as error:
            raise CheckpointError(f"{error} {WAYS_OUT.format(run=workdir)}") from None
        check_resumed_inputs(workdir, d)
        unknown = sorted(set(from_data.symbols) - set(vocabulary.symbols))
        if unknown:
            raise ValueError(
                f"{len(unknown)} tokens of the training data are not in {vocab_path}, which {workdir} was started "
                f"with: {' '.join(repr(token) for token in unknown)}; they would all be read as <unk>. Start a new run "
                f"from this one's weights (--init-from {workdir} --output-dir NEW: its vocabulary adds them), or "
                "--reset-training (starts over here), or train without the rows that hold them")
    elif base_vocabulary is not None:
        vocabulary = extended_vocabulary(base_vocabulary, from_data)
    else:
        vocabulary = from_data
    return RunText(train_rows, val_rows, vocabulary, d.language, new_phonemes)


def read_vocabulary(workdir: Path) -> Vocabulary:
    """The vocabulary a run's checkpoints follow (training resuming, synthesis, export)."""
    path = Path(workdir) / VOCABULARY_FILE
    if not path.exists() and (Path(workdir) / RESET_ASIDE / VOCABULARY_FILE).exists():
        # a reset under way (a synthesis or an export while it starts): nothing is lost, as the old line said
        raise CheckpointError(f"{workdir} is being reset: --reset-training set its {VOCABULARY_FILE} and checkpoints "
                              f"aside in {Path(workdir) / RESET_ASIDE} until the new run starts (a new run that stops "
                              "first puts them back); run this again once the new run has saved a checkpoint")
    if not path.exists():
        raise CheckpointError(f"{workdir} has no {VOCABULARY_FILE}, so the token ids of its checkpoints are lost.")
    return Vocabulary.load(path)


WAYS_OUT = ("Nothing in it was written or deleted. Either run with that run's own settings (e.g. --config "
             "{run}/config.yaml), or train in a new folder (--output-dir NEW; --init-from {run} starts it from "
             "these weights), or pass --reset-training to delete its checkpoints and start over in {run}")


def check_resumed_inputs(workdir: Path, d) -> None:
    """A run's vocab.txt holds the tokens of the front end it started with, and its checkpoints learnt
    log-mels of its feature settings; a resumed run that read text another way would look every token
    up wrong, and one with another sample rate, hop or mel scale (same weight shapes) trained on
    spectrograms its weights never saw, both without any error."""
    saved = trained_config(workdir)
    if saved is None:
        return
    saved_data = saved.get("data") if isinstance(saved.get("data"), dict) else {}
    before = (config_lib.saved_text_frontend(saved), saved_data.get("language", d.language))
    now = (d.text_frontend, d.language)
    if before[0] != now[0] or (now[0] == "phonemes" and before[1] != now[1]):
        raise ValueError(
            f"{workdir} was started with data.text_frontend={before[0]}, data.language={before[1]} and its "
            f"vocab.txt holds those tokens; this run asks for {now[0]}, {now[1]}: pass --reset-training "
            "(starts over), another --output-dir, or the run's own settings"
        )
    if differ := feature_differences(saved_data, d):
        raise ValueError(
            f"{workdir} was trained on log-mels of other settings than this run's ({'; '.join(differ)}), which its "
            f"weights would go on learning from as if they were the same. {WAYS_OUT.format(run=workdir)}"
        )


def trained_config(workdir: Path) -> dict | None:
    """The settings the run's newest checkpoint was trained with (its meta file), else its config.yaml,
    else None. The checkpoint's first: config.yaml is the file a user edits and passes back as --config
    (the run's own settings), so an edited one would agree with any change made in it."""
    for candidate in candidates(workdir / "checkpoints"):
        try:
            saved = yaml.safe_load(read_meta(candidate.path).get("config") or "")
        except (CheckpointError, ValueError, AttributeError, yaml.YAMLError):  # damaged: the restore says so
            continue
        if isinstance(saved, dict):
            return saved
    path = workdir / "config.yaml"
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    return saved if isinstance(saved, dict) else None


def settings_changed(path: str, config: Config) -> str:
    """ Settings the checkpoint was saved with that differ now (a hint at the cause), or ""."""
    try:
        saved = yaml.safe_load(read_meta(path).get("config") or "")
    except CheckpointError:
        return ""
    if not isinstance(saved, dict):
        return ""
    now = config_lib.to_dict(config)
    changed = [f"{section}.{key}: {value!r} then, {now[section].get(key)!r} now"
               for section, values in saved.items() if isinstance(values, dict) and isinstance(now.get(section), dict)
               for key, value in values.items() if now[section].get(key) != value]
    return f" Settings that differ from the checkpoint's: {'; '.join(changed[:8])}." if changed else ""
