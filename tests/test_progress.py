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
    assert lines == ["job: 8/10 items, 0.1 items/s, ETA 20 s", "job: 10/10 items, 0.1 items/s, ETA 0 s",
                     "job: 10/10 items, 0.1 items/s, done in 40.0 s"], lines
