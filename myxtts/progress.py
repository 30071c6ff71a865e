"""A progress line for long jobs: count, rate and time left on stderr.

Redrawn in place on a terminal; in a log file (CI, nohup) one line every 10 s plus the final one,
so the file does not fill with redraws.
"""

from __future__ import annotations

import sys
import time


class ProgressLine:
    """`label: done/total unit, rate unit/s, ETA` (the final line says how long it took)."""

    def __init__(self, label: str, total: int, unit: str, *, enabled: bool, start: int = 0):
        """`start`: items done before this run (a resumed job); the rate counts only this run's."""
        self.label, self.total, self.unit = label, total, unit
        self.enabled = enabled and total > 0
        self.interactive = sys.stderr.isatty()
        # The first line waits one interval too: before then the rate is noise.
        self.started = self.last_draw = time.monotonic()
        self.done = self.start = start

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        # Redrawing on every item would make the terminal the bottleneck. The last item's line is
        # close()'s: drawn here too, a log file held "n/n ..., ETA 0 s" just above "n/n ..., done in".
        if self.enabled and done < self.total and now - self.last_draw >= (0.25 if self.interactive else 10.0):
            self.last_draw = now
            self._draw(now, final=False)

    def each(self, items):
        """`items`, each counted once the caller is done with it (asks for the next); closed after the last."""
        for done, item in enumerate(items, 1):
            yield item
            self.update(done)
        self.close()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic(), final=True)

    def _draw(self, now: float, *, final: bool) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.start) / elapsed
        eta = f"done in {elapsed:.1f} s" if final else f"ETA {(self.total - self.done) / max(rate, 1e-9):.0f} s"
        text = f"{self.label}: {self.done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s, {eta}"
        sys.stderr.write(("\r" + text + ("\n" if final else "")) if self.interactive else text + "\n")
        sys.stderr.flush()
