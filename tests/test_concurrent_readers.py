"""Tools that read a run folder while its training is still saving in it (the usual way to check on a
long run): synthesis, export and the free-running check (`Synthesizer.from_run`), and a fine-tuning
(`--init-from`) started from it.

A training deletes a checkpoint as soon as it has saved newer ones (`latest` keeps two, each best one),
so the checkpoint a tool found can be gone when it reads it. The race is simulated, not timed: the
"training" below saves twice between the tool finding its checkpoint and reading it.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from myxtts import config as config_lib
from myxtts.config import load_config
from myxtts.data.text import Vocabulary
from myxtts.models.xtts import network_for
from myxtts.training import checkpoints
from myxtts.training.checkpoints import CheckpointError, named_weights, network_variables


class TrainingInTheFolder:
    """A tiny run folder (config.yaml, vocab.txt, checkpoints/latest/ckpt-5), and its training's next
    saves: ckpt-10 and ckpt-15 of weights all `NEWER`, which delete ckpt-5 as `latest` keeps two."""

    NEWER = 0.25

    def __init__(self, run):
        self.run = run
        self.config = load_config(overrides=["model.size=tiny"])
        self.vocabulary = Vocabulary(["a", "b", "c", " "])
        run.mkdir()
        config_lib.save_config(self.config, run / "config.yaml")
        self.vocabulary.save(run / "vocab.txt")
        keras.utils.set_random_seed(0)
        self.network = network_for(self.config, len(self.vocabulary), self.vocabulary.word_boundary_id)
        self.network.build()
        self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(network=network_variables(self.network)),
                                                  run / "checkpoints" / "latest", max_to_keep=2)
        self._save(5)

    def _save(self, step):
        meta = {"step": step, "optimizer": "adamw", "config": (self.run / "config.yaml").read_text(encoding="utf-8")}
        (self.run / "checkpoints" / "latest").mkdir(parents=True, exist_ok=True)
        (self.run / "checkpoints" / "latest" / f"ckpt-{step}.meta.json").write_text(json.dumps(meta), encoding="utf-8")
        self.manager.save(checkpoint_number=step)

    def saves_twice(self):
        for variable in self.network.weights:
            variable.assign(tf.fill(variable.shape, self.NEWER))
        self._save(10)
        self._save(15)
        assert not (self.run / "checkpoints" / "latest" / "ckpt-5.index").exists()


@pytest.fixture
def training(tmp_path):
    return TrainingInTheFolder(tmp_path / "run")


def _saves_before_the_first_read(monkeypatch, training):
    """The training saves twice between the tool finding its checkpoint and reading it."""
    real, calls = checkpoints.find_checkpoint, []

    def find_then_the_training_saves(where):
        found = real(where)
        if not calls:
            training.saves_twice()
        calls.append(found)
        return found

    monkeypatch.setattr(checkpoints, "find_checkpoint", find_then_the_training_saves)
    return calls


@pytest.mark.parametrize("where", ["run", "latest"])
def test_synthesis_of_a_training_run_reads_its_newest_checkpoint_when_the_one_found_is_deleted(where, training,
                                                                                                 monkeypatch):
    from myxtts.synthesis import Synthesizer

    calls = _saves_before_the_first_read(monkeypatch, training)
    checkpoint = None if where == "run" else str(training.run / "checkpoints" / "latest")
    synthesizer = Synthesizer.from_run(training.run, checkpoint)  # stopped in TensorFlow's NotFoundError
    assert calls[0].endswith("ckpt-5") and calls[-1].endswith("ckpt-15")
    for name, variable in named_weights(synthesizer.network).items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), training.NEWER, err_msg=name)


def test_a_checkpoint_prefix_deleted_by_its_training_is_one_line_naming_it(training, monkeypatch):
    from myxtts.synthesis import Synthesizer

    _saves_before_the_first_read(monkeypatch, training)
    prefix = training.run / "checkpoints" / "latest" / "ckpt-5"
    with pytest.raises(CheckpointError, match=rf"checkpoint {prefix} was deleted while it was read: the training "
                                              r"running in its folder .* give its folder \(.*latest\)"):
        Synthesizer.from_run(training.run, str(prefix))


def test_fine_tuning_from_a_run_still_training_starts_from_its_newest_checkpoint(training, monkeypatch):
    from myxtts.training.init_from import initialize_from, load_source

    source = load_source(training.run / "checkpoints" / "latest")  # before the hardware probes
    assert source.checkpoint.endswith("ckpt-5")
    training.saves_twice()  # meanwhile, its training saved and deleted that one
    network = network_for(training.config, len(training.vocabulary), training.vocabulary.word_boundary_id)
    network.build()
    report = initialize_from(network, source, source.vocabulary)  # stopped in TensorFlow's NotFoundError
    assert report.checkpoint.endswith("ckpt-15") and "ckpt-15" in report.message()
    for name, variable in named_weights(network).items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), training.NEWER, err_msg=name)


def test_a_run_folder_without_a_checkpoint_yet_is_said_to_be_one(training, capsys):
    """A training just started has none: the line said to give a run folder, which it was."""
    from utilities import synthesize

    for path in (training.run / "checkpoints" / "latest").iterdir():  # as before its first save
        path.unlink()
    assert synthesize.main(["--checkpoint", str(training.run), "--text", "Hello.", "--reference", "a.wav",
                            "--out", str(training.run.parent / "out.wav")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: no checkpoint in the run folder {training.run} yet: its training saves the first one after "
        "training.checkpoint_interval updates (and at Ctrl-C); run this again then")


def test_the_free_running_check_names_the_checkpoint_it_measured(training, monkeypatch, capsys):
    """On a run still training, best_wer or best_mel (taken first) can be far behind its latest: the
    report named no checkpoint, so a WER of step 120 read as the run's at step 1,260."""
    from myxtts.training import run_setup
    from utilities import free_running_check

    _saves_before_the_first_read(monkeypatch, training)

    def corpus_gone(*args, **kwargs):  # stops the check once it has loaded its checkpoint
        raise FileNotFoundError("the corpus is elsewhere")

    monkeypatch.setattr(run_setup, "prepare_run", corpus_gone)
    assert free_running_check.main(["--run", str(training.run), "--vocoder", "griffin-lim"]) == 2
    latest = training.run / "checkpoints" / "latest"
    assert capsys.readouterr().out.splitlines()[0] == f"checkpoint: {latest / 'ckpt-15'} (step 15)"


def test_a_checkpoint_prefix_its_training_has_deleted_since_is_said_to_be_one(training, capsys):
    """A prefix copied from a report (`checkpoint: ...`) of a run still training: the line said to give a
    run folder or a checkpoint prefix, which it was."""
    from utilities import synthesize

    prefix = training.run / "checkpoints" / "latest" / "ckpt-5"
    training.saves_twice()
    assert synthesize.main(["--checkpoint", str(prefix), "--text", "Hello.", "--reference", "a.wav",
                            "--out", str(training.run.parent / "out.wav")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: checkpoint {prefix} is no longer there: the training of its run keeps only its newest checkpoints "
        f"(now ckpt-15); give its folder {prefix.parent} to read the newest")


def test_a_run_being_reset_is_said_to_be_not_lost(training):
    """A synthesis while --reset-training starts (its probes, a minute) said the run's token ids were lost."""
    from myxtts.synthesis import Synthesizer
    from myxtts.training.run_folder import reset_run

    reset_run(training.run, echo=lambda message: None)
    with pytest.raises(CheckpointError, match=rf"^{training.run} is being reset: --reset-training set its vocab.txt and "
                                              r"checkpoints aside in .*reset-pending until the new run starts"):
        Synthesizer.from_run(training.run)
