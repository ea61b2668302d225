"""The best score of a run so far, which keeps RUN/checkpoints/best/: one metric, the settings it was
scored with, and its value restored on resume (for any task's scorer)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bigbatch import checkpoints
from bigbatch.engine import dist
from bigbatch.errors import warn


class Best:
    """Tracks the best value of `metric` (higher or lower is better). On resume it starts from the
    value recorded in RUN/checkpoints/best/, unless that was scored with other `settings` (then the
    numbers do not compare) or after the checkpoint resumed (a crash discarded that stretch)."""

    def __init__(
        self,
        metric: str,
        higher_is_better: bool,
        settings: dict[str, Any],
        run: Path,
        resumed_at: int | None,
        quiet: bool,
    ):
        self.metric, self.higher_is_better, self.settings = metric, higher_is_better, settings
        self.value = math.nan
        best = checkpoints.best_checkpoint(run)
        meta = (checkpoints.read_meta(best) or {}) if best is not None else {}
        record = meta.get("best") if isinstance(meta.get("best"), dict) else {}
        if isinstance(record.get("value"), (int, float)):
            before = record.get("settings") if isinstance(record.get("settings"), dict) else {}
            if before != settings:
                changed = [f"{k} {before.get(k)!r}, now {v!r}" for k, v in settings.items() if before.get(k) != v]
                changed += [f"{k} {before[k]!r}, now none" for k in before.keys() - settings.keys()]  # (QA: unsaid)
                why = "was scored with other eval settings" + (f" ({'; '.join(changed)})" if changed else "")
            elif resumed_at is not None and int(meta.get("nimg", 0)) > resumed_at:
                why = "is later than the checkpoint resumed from (a crash, or a rollback, discarded that training)"
            elif not (why := _damage(best)):
                self.value = float(record["value"])
            if why and not quiet:  # (found from outside: on stdout, unlike every other warning)
                warn(f"{best} {why}: the next evaluation replaces it")

    def improved(self, scores: dict[str, float]) -> bool:
        """Whether `scores` beat the best so far (and then become it)."""
        value = scores[self.metric]
        if not math.isfinite(value):
            return False
        better = (value > self.value) if self.higher_is_better else (value < self.value)
        if math.isnan(self.value) or better:
            self.value = value
            return True
        return False

    def record(self) -> dict[str, Any]:
        """What meta.json of checkpoints/best/ records."""
        return {"metric": self.metric, "value": self.value, "settings": self.settings}


def _damage(best: Path) -> str:
    """Why the best checkpoint kept cannot stand ("" if it is whole): found from outside, a damaged best was kept
    on resume while a worse score did not replace it, and only `eval --checkpoint best` later refused it. Read by
    the main process alone (the one that keeps the best); a file it may not read is refused, not called damaged."""
    if dist.active() and not dist.context().is_main:
        return ""
    try:
        checkpoints.verify(best)
    except checkpoints.Corrupt as e:
        return f"is damaged ({checkpoints.damage(e).removeprefix(f'checkpoint {best} is corrupt: ')})"
    return ""
