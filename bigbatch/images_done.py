"""How far a pass over images has come, on stderr: a bar on a terminal, else a line every LINE_EVERY_S (a log's
reader, under nohup, a batch system or CI, sees it going: found from outside, `prepare` said nothing there)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

LINE_EVERY_S = 30.0  # off a terminal: one progress line this often


class ImagesDone:
    """Images done out of `total`, `label` first; silent unless `on`. `kept`: how many of those done so far were
    not made now (read back from an interrupted run's parts), left out of the rate."""

    def __init__(self, total: int, label: str, on: bool = True, kept: Callable[[], int] = lambda: 0) -> None:
        self.on, self.kept = on and total > 0, kept
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.label, self.last, self.bar = label, self.start, None
        if self.on and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="img", leave=False, file=sys.stderr, dynamic_ncols=True)

    def add(self, n: int) -> None:
        if not self.on:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last >= LINE_EVERY_S and self.done < self.total:
            self.last, rate = now, max(0, self.done - self.kept()) / max(now - self.start, 1e-9)
            left = (self.total - self.done) / rate if rate > 0 else 0.0  # (none made yet: all read back so far)
            eta = f", about {left / 60:.0f} min left" if left >= 90 else f", about {left:.0f} s left" if left else ""
            print(f"{self.label}: {self.done}/{self.total} images, {rate:.1f} img/s{eta}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
