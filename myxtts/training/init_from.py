"""Fine-tuning: a new run that starts from another run's weights (`training.init_from`, `--init-from`).

    runs/base (vocabulary V)  --init-from-->  runs/new (vocabulary V, then the tokens the new data adds)

Weights are matched by their names, which checkpoints store (`checkpoints.py`), not by the model's
code, so this works for whatever network `network_for` builds:

* a weight of the same shape is copied;
* a weight whose shape differs only along axes of the vocabulary's size (the old size in the
  checkpoint, the new one now: a token embedding, a per-token output head) is copied row by row
  for the tokens both vocabularies hold; the rows of new tokens keep the values the fresh network
  was initialized with, exactly as a model trained from scratch would start them;
* anything else (another model size, number of mel bands or architecture) is refused, naming the
  weights that differ.

The optimizer is new and the step count starts at 0: this starts a run, it does not resume one.
The new run's vocabulary keeps the old tokens in their order and appends the new ones, so every
old token keeps its id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import yaml

from myxtts.config import Config, saved_text_frontend
from myxtts.data.text import Vocabulary
from myxtts.models.vocoder import features_of
from myxtts.training.checkpoints import (CheckpointError, CheckpointMismatch, find_checkpoint, named_weights,
                                         read_meta, read_newest, stored_weights)


@dataclass
class InitSource:
    """A checkpoint to start from, with the vocabulary and the config it was trained with."""

    checkpoint: str
    vocabulary: Vocabulary
    saved_config: dict
    given: str | None = None  # the path named (a run or checkpoint folder): its newest is read if `checkpoint` is gone


def load_source(path: str | Path) -> InitSource:
    """The checkpoint of a run folder (best_mel, else latest) or a checkpoint prefix, and its run's vocab.txt."""
    try:
        checkpoint = find_checkpoint(path)
    except CheckpointError as error:
        raise CheckpointError(f"training.init_from (--init-from): {error}") from None
    folders = [Path(path), *Path(checkpoint).parents[:3]]
    vocab_path = next((folder / "vocab.txt" for folder in folders if (folder / "vocab.txt").is_file()), None)
    if vocab_path is None:
        raise CheckpointError(f"training.init_from (--init-from): no vocab.txt beside {checkpoint} or in its run folder; "
                              "give the run folder the checkpoint was trained in")
    saved = yaml.safe_load(read_meta(checkpoint).get("config") or "") or {}
    return InitSource(checkpoint, Vocabulary.load(vocab_path), saved if isinstance(saved, dict) else {}, str(path))


def check_same_inputs(source: InitSource, config: Config) -> None:
    """A token's rows mean what the source's front end made of text; another front end would reuse
    them for other sounds. And its weights make log-mels of its settings: another sample rate, hop or
    mel scale keeps every shape (only n_mels changes one), and fine-tuned from spectrograms it never saw."""
    saved_data = source.saved_config.get("data") if isinstance(source.saved_config.get("data"), dict) else {}
    before = (saved_text_frontend(source.saved_config), saved_data.get("language", config.data.language))
    now = (config.data.text_frontend, config.data.language)
    if before[0] != now[0] or (now[0] == "phonemes" and before[1] != now[1]):
        raise ValueError(f"training.init_from: {source.checkpoint} reads text as data.text_frontend={before[0]}, "
                         f"data.language={before[1]}; this run asks for {now[0]}, {now[1]}: set those keys as the "
                         "source run had them (its token rows mean its tokens)")
    if differ := feature_differences(saved_data, config.data):
        raise ValueError(f"training.init_from: {source.checkpoint} was trained on log-mels of other settings than this "
                         f"run's ({'; '.join(differ)}): set those keys as the source run had them (its run's config.yaml)")


def feature_differences(saved_data: dict, data_config) -> list[str]:
    """"data.KEY: then, now" for each log-mel setting (`vocoder.features_of`) in which `data_config`
    differs from a saved config's data section; a key the saved one lacks is taken as unchanged."""
    # The saved keys over this run's data settings, so that fmax: 0 and the Nyquist it means compare equal.
    fields = {item.name for item in dataclasses.fields(data_config)}
    then = features_of(dataclasses.replace(data_config, **{k: v for k, v in saved_data.items() if k in fields}))
    return [f"data.{'fmax' if key == 'mel_fmax' else key}: {then[key]!r} then, {value!r} now"
            for key, value in features_of(data_config).items() if then[key] != value]


def extended_vocabulary(source: Vocabulary, data: Vocabulary) -> Vocabulary:
    """The source's tokens in their order, then the tokens only `data` has (sorted)."""
    known = set(source.symbols)
    return Vocabulary(source.symbols + sorted(set(data.symbols) - known))


@dataclass
class InitReport:
    checkpoint: str
    weights: int  # network weights loaded
    mapped: list[str]  # of those, loaded row by row along the vocabulary
    kept_tokens: int  # tokens whose rows came from the checkpoint
    new_tokens: list[str] = field(default_factory=list)  # tokens initialized fresh

    def message(self) -> str:
        rows = (f"; by vocabulary row: {', '.join(self.mapped)} ({self.kept_tokens} tokens kept their rows)"
                if self.mapped else "")
        new = (f"; {len(self.new_tokens)} new tokens start as a fresh model would: "
               + " ".join(repr(token) for token in self.new_tokens)) if self.new_tokens else "; no new tokens"
        return (f"initialized from {self.checkpoint}: {self.weights} weights{rows}{new}; "
                "a new optimizer, from step 0")


def initialize_from(network, source: InitSource, vocabulary: Vocabulary) -> InitReport:
    """Load `source`'s weights into the built `network` (for `vocabulary`), mapping token rows."""
    old_ids = {token: i for i, token in enumerate(source.vocabulary.tokens)}
    rows = np.array([old_ids.get(token, -1) for token in vocabulary.tokens])  # new id -> old id, -1 = new
    old_size, new_size = len(source.vocabulary), len(vocabulary)
    if old_size == new_size and not np.array_equal(rows, np.arange(new_size)):
        raise ValueError(f"this run's vocabulary has as many tokens as {source.checkpoint}'s but not the same ones in "
                         "the same order, so token rows cannot be told from other axes; start from "
                         "extended_vocabulary(source, data)")
    # Read after the hardware probes, a minute after `load_source` found it: a source run still
    # training has deleted that checkpoint by then, and its newest is read instead (`read_newest`).
    try:
        checkpoint, stored_values = read_newest(source.given or source.checkpoint, _network_values)
    except CheckpointError as error:
        raise CheckpointError(f"training.init_from (--init-from): {error}") from None
    source = dataclasses.replace(source, checkpoint=checkpoint)
    weights, values, mapped, differences = named_weights(network), {}, [], []
    for name, variable in weights.items():
        if name not in stored_values:
            differences.append(f"{name}: not in the checkpoint")
            continue
        stored, now = stored_values[name], tuple(variable.shape)
        axes = [a for a in range(len(now)) if len(stored.shape) == len(now) and stored.shape[a] != now[a]]
        if stored.shape == now:
            values[name] = stored
        elif len(stored.shape) == len(now) and all(stored.shape[a] == old_size and now[a] == new_size for a in axes):
            values[name] = _map_rows(stored, keras.ops.convert_to_numpy(variable), axes, rows)
            mapped.append(name)
        else:
            differences.append(f"{name}: {list(stored.shape)} in the checkpoint, {list(now)} now")
    differences += [f"{name}: only in the checkpoint" for name in sorted(set(stored_values) - set(weights))]
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise CheckpointMismatch(
            f"training.init_from: {source.checkpoint} does not fit this model beyond its vocabulary "
            f"({len(differences)} weights differ: {shown}); it is another model size or architecture: "
            f"set model.size and the data keys as in its run's config.yaml{_model_differences(source)}",
            differences)
    for name, value in values.items():
        weights[name].assign(value.astype(weights[name].dtype))
    return InitReport(source.checkpoint, len(values), mapped, int(np.sum(rows >= 0)),
                      [vocabulary.tokens[i] for i in np.flatnonzero(rows < 0)])


def _network_values(path: str) -> dict[str, np.ndarray]:
    """Every network weight stored in checkpoint `path`, by name, read now (its files may be deleted next)."""
    reader, keys = stored_weights(path)
    return {name: reader.get_tensor(key) for name, key in keys.items()}


def _map_rows(stored: np.ndarray, fresh: np.ndarray, axes: list[int], rows: np.ndarray) -> np.ndarray:
    """`fresh` with the slices of shared tokens along `axes` taken from `stored` (old ids `rows`)."""
    kept = np.flatnonzero(rows >= 0)
    new_index = [kept if a in axes else np.arange(size) for a, size in enumerate(fresh.shape)]
    old_index = [rows[kept] if a in axes else np.arange(size) for a, size in enumerate(fresh.shape)]
    result = fresh.copy()
    result[np.ix_(*new_index)] = stored[np.ix_(*old_index)]
    return result


def _model_differences(source: InitSource) -> str:
    saved = source.saved_config.get("model")
    return f" (the source's model section: {saved})" if isinstance(saved, dict) else ""
