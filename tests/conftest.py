"""Shared fixtures, each built once per test session whichever pytest-xdist worker asks first:

* `demo_corpus`: a small demo corpus (24 clips, about two seconds to synthesize);
* `trained_run`: six updates of the tiny model on it, with validation, samples, a recognizer
  measure and checkpoints (latest, best_mel, best_wer); `train()` costs tens of seconds on two
  cores, so the tests that only need *a* trained run (fine-tuning, export, faults after a good
  start) share this one. Its TrainResult is in `result.json` beside it. Tests must not write into
  it: copy it first (`shutil.copytree`).
"""

import fcntl
import json
import os
import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    """The tests marked `slow` (20 s or more each on two cores) run first, in their order.

    pytest-xdist's worksteal gives each worker a contiguous share of the collection and lets an idle
    worker take from the end of a busy one's queue, so a minute-long test collected late could keep
    one core busy at the end while the other waits; started first, the long ones overlap the short."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # a stable sort


def tiny_config(corpus, *overrides):
    """The tiny model on `corpus`, set up for tests: one bucket, fp32, no XLA, quick schedule."""
    from myxtts.config import load_config

    return load_config(
        overrides=[
            f"data.train_data={corpus}",
            "model.size=tiny",
            "data.batch_size=4",
            "data.deterministic=true",
            "data.max_duration_s=6.0",
            "data.bucket_boundaries_s=[6.0]",  # one bucket: one compiled shape (tests/test_xla_compilations.py has two)
            "training.gradient_accumulation_steps=1",
            "training.precision=fp32",
            "training.enable_xla_compilation=false",  # XLA gains nothing on this CPU and compiles slowly
            "training.log_interval=1",
            "training.warmup_steps=2",
            "training.log_samples=false",  # synthesis traces its own loop; one test turns it on
            "training.wer_sentences=0",  # the recognizer's measure costs seconds per validation; one test turns it on
            *overrides,
        ]
    )


# The trained run's settings: 6 updates, validation and checkpoints every 3, samples and the
# recognizer on, decoding in parallel and unordered (the default data.deterministic: false).
TRAINED_RUN = ("training.max_steps=6", "training.eval_interval=3", "training.checkpoint_interval=3",
               "training.log_samples=true", "training.wer_sentences=1", "data.deterministic=false",
               "data.num_workers=4")


def build_once(tmp_path_factory, name, build):
    """`build(folder)` run once per session (under a file lock shared by the xdist workers); the folder."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above every worker's own
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            if folder.exists():  # a build that failed half-way in another worker
                shutil.rmtree(folder)
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """Tests neither read nor write the user's ~/.cache/myxtts (batch and precision probes,
    calibrations): a result cached there would hide what a test means to exercise."""
    before = os.environ.get("MYXTTS_CACHE_DIR")
    os.environ["MYXTTS_CACHE_DIR"] = str(tmp_path_factory.mktemp("myxtts_cache"))
    yield
    if before is None:
        os.environ.pop("MYXTTS_CACHE_DIR", None)
    else:
        os.environ["MYXTTS_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    from myxtts.data.demo_corpus import make_demo_corpus

    return build_once(tmp_path_factory, "demo",
                      lambda folder: make_demo_corpus(folder, num_utterances=24, seed=0, progress=False))


@pytest.fixture(scope="session")
def waveform_batch(demo_corpus):
    """(data config, {"audio", "mel_length"}): one waveform batch of the demo corpus, as the vocoder trains on."""
    from myxtts.data.manifest import read_manifest
    from myxtts.data.pipeline import build_dataset, build_vocabulary

    config = tiny_config(demo_corpus, "data.mel_on_device=true")
    rows = read_manifest(demo_corpus)
    batch = next(iter(build_dataset(config, rows, training=True, vocabulary=build_vocabulary(rows, config.data))))
    return config.data, {"audio": batch["audio"], "mel_length": batch["mel_length"]}


@pytest.fixture(scope="session")
def unseen_voices_corpus(tmp_path_factory):
    """Two voices the demo corpus does not use, five clips each (validation's unseen voices)."""
    from myxtts.data.demo_corpus import OTHER_VOICES, make_demo_corpus

    return build_once(tmp_path_factory, "unseen_voices",
                      lambda folder: make_demo_corpus(folder, num_utterances=10, seed=5, voices=OTHER_VOICES[:2],
                                                      progress=False))


@pytest.fixture(scope="session")
def trained_run(demo_corpus, unseen_voices_corpus, tmp_path_factory):
    def build(folder):
        import dataclasses

        import keras

        from myxtts.training.trainer import train

        keras.config.set_dtype_policy("float32")
        # Validation also speaks in two voices training never heard (evaluation/voices.py).
        unseen = (f"data.unseen_voices_data={unseen_voices_corpus}", "training.voice_sentences=1")
        log = []
        result = train(tiny_config(demo_corpus, *TRAINED_RUN, *unseen), folder / "run", echo=log.append)
        summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "workdir"}
        (folder / "result.json").write_text(json.dumps({**summary, "log": log}, default=float), encoding="utf-8")

    folder = build_once(tmp_path_factory, "trained_run", build)
    return folder / "run"


@pytest.fixture(scope="session")
def trained_result(trained_run):
    """The trained run's TrainResult fields (a dict), as `train()` returned them, and `log`: its lines."""
    return json.loads((trained_run.parent / "result.json").read_text(encoding="utf-8"))


def make_vocoder_folder(data_config, folder):
    """A tiny vocoder (models/vocoder.py) with random heads, saved to `folder` (an untrained one
    would give only the prior magnitude at phase zero, the same whatever the network)."""
    import keras
    import numpy as np

    from myxtts.models.vocoder import Vocoder, save_vocoder

    keras.utils.set_random_seed(7)
    vocoder = Vocoder(data_config, size="tiny")
    vocoder.build()
    rng = np.random.default_rng(7)
    for head, scale in ((vocoder.magnitude_head, 0.05), (vocoder.phase_head, 0.5)):
        head.kernel.assign(rng.normal(0, scale, head.kernel.shape).astype(np.float32))
    save_vocoder(vocoder, folder)
    return vocoder
