"""The progress line of long jobs (myxtts/progress.py)."""

from myxtts import progress
from myxtts.progress import ProgressLine


def test_a_resumed_jobs_rate_and_eta_count_only_what_this_run_did(monkeypatch, capsys):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    line = ProgressLine("job", 10, "items", enabled=True, start=6)  # 6 done by an interrupted run
    clock[0] += 20.0
    line.update(8)  # 2 items in this run's 20 s: 0.1 a second, so 2 left take 20 s
    clock[0] += 20.0
    line.update(10)
    line.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["job: 8/10 items, 0.1 items/s, ETA 20 s", "job: 10/10 items, 0.1 items/s, done in 40.0 s"], lines


def test_the_last_item_is_said_once_by_the_closing_line(monkeypatch, capsys):
    """A log file held "2/2 clips, ETA 0 s" just above "2/2 clips, done in 15.2 s" (measure_quality.py)."""
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    line = ProgressLine("job", 2, "clips", enabled=True)
    for done in (1, 2):
        clock[0] += 11.0  # past the 10 s between a log file's lines
        line.update(done)
    line.close()
    assert capsys.readouterr().err.splitlines() == ["job: 1/2 clips, 0.1 clips/s, ETA 11 s",
                                                    "job: 2/2 clips, 0.1 clips/s, done in 22.0 s"]


def test_each_item_is_counted_once_the_caller_is_done_with_it(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    seen = []
    for item in ProgressLine("job", 2, "clips", enabled=True).each(["a", "b"]):
        clock[0] += 11.0  # the work on the item, before it is counted
        seen.append(item)
    assert seen == ["a", "b"]
    assert capsys.readouterr().err.splitlines() == ["job: 1/2 clips, 0.1 clips/s, ETA 11 s",
                                                    "job: 2/2 clips, 0.1 clips/s, done in 22.0 s"]


def test_validation_counts_the_sentences_it_speaks(monkeypatch, capsys):
    """A validation with training.wer_sentences (24 in the demo: ~50 s on 2 cores) was silent after the
    last step line's "ETA 0:00:00"; SpeechCheck now has the sentences counted as they are spoken."""
    import numpy as np

    from myxtts.evaluation.speech import HeldOutSentences, SpeechReport
    from myxtts.training.callbacks import SpeechCheck

    def measure(self, network, scorer, show_progress=False):
        line = ProgressLine("speaking the sentences", 3, "sentences", enabled=show_progress)
        line.update(3)
        line.close()
        return SpeechReport(0.5, 1.0, [], 1.0, "intelligibility: WER 0.500", [np.zeros((4, 80), np.float32)])

    monkeypatch.setattr(HeldOutSentences, "measure", measure)
    echoed, logs = [], {"val_loss": 1.0}
    check = SpeechCheck(None, HeldOutSentences.__new__(HeldOutSentences), "scorer", None, echo=echoed.append)
    check.on_epoch_end(0, logs)
    assert "speaking the sentences: 3/3 sentences" in capsys.readouterr().err
    assert logs["val_wer"] == 0.5 and echoed[0].startswith("held-out sentences spoken from text: intelligibility: WER 0.500")
