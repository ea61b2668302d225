"""Evaluation during training (eval.*): G_ema scored every eval.every_kimg, the best kept."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from bigbatch import checkpoints
from bigbatch.config import Config


class Scorer:
    """eval.*: scores G_ema (on a copy with standing statistics if asked) and tracks the best value of
    eval.best (restored from RUN/checkpoints/best/ on resume). The feature extractor and the reference
    statistics are made when training starts, so missing weights or an unusable metric stop the run
    before it trains, not hours later at the first evaluation."""

    def __init__(self, cfg: Config, data: Any, device: torch.device, run: Path, resumed_at: int | None, quiet: bool):
        from bigbatch.metrics import get_extractor, reference_stats
        from bigbatch.metrics.evaluate import NAMES, check_metrics

        e = self.e = cfg.eval
        self.device = device
        self.metric = e.best_metric()
        self.higher_is_better = self.metric == "is"
        self.best = math.nan
        with self._rng_untouched():
            options = e.classifier_options()
            self.extractor = get_extractor(
                e.extractor, path=e.weights or None, device=device, data=data, options=options
            )
            wanted = check_metrics(self.extractor, e.metrics)
            self.reference = None
            if {"fid", "kid"} & set(wanted):  # features of every reference image only for KID
                self.reference = reference_stats(
                    data, self.extractor, n=e.reference_n or None, batch_size=e.batch_size, features="kid" in wanted
                )
        self.metric_name = NAMES[self.extractor.family][self.metric]
        # What makes two scores comparable: a best kept under other settings does not count.
        self.settings = {
            "metric": self.metric_name,
            "extractor": self.extractor.digest,
            "n": e.n,
            "seed": e.seed,
            "truncation": str(e.truncation),
            "reference_n": e.reference_n,
            "standing_stats": e.standing_stats,
        }
        best = checkpoints.best_checkpoint(run)
        meta = (checkpoints.read_meta(best) or {}) if best is not None else {}
        record = meta.get("best") if isinstance(meta.get("best"), dict) else {}
        if isinstance(record.get("value"), (int, float)):
            if record.get("settings") != self.settings:
                why = "was scored with other eval settings"
            elif resumed_at is not None and int(meta.get("nimg", 0)) > resumed_at:
                why = "is later than the checkpoint resumed from (a crash discarded that stretch of training)"
            else:
                why, self.best = "", float(record["value"])
            if why and not quiet:
                print(f"{best} {why}: the next evaluation replaces it", flush=True)

    def _rng_untouched(self) -> Any:
        """Evaluation leaves training as it was: the global RNG (which training a classifier reseeds)
        is restored afterwards."""
        return torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])

    def __call__(self, G_ema: torch.nn.Module) -> dict[str, float]:
        import copy

        from bigbatch.metrics import generated_features, score
        from bigbatch.sampling import standing_stats

        e, began = self.e, time.perf_counter()
        with self._rng_untouched():
            G = G_ema  # standing statistics go into a copy
            if e.standing_stats:
                G = standing_stats(copy.deepcopy(G_ema), e.standing_stats, e.batch_size, e.seed, e.truncation)
            feats = generated_features(G, self.extractor, e.n, e.seed, e.truncation, e.batch_size)
            scores = score(feats, self.reference, e.metrics, self.extractor.family)
        return {**scores, "eval_seconds": round(time.perf_counter() - began, 3)}

    def improved(self, scores: dict[str, float]) -> bool:
        """Whether `scores` beat the best so far (and then become it)."""
        value = scores[self.metric_name]
        if not math.isfinite(value):
            return False
        better = (value > self.best) if self.higher_is_better else (value < self.best)
        if math.isnan(self.best) or better:
            self.best = value
            return True
        return False

    def best_record(self) -> dict[str, Any]:
        return {"metric": self.metric_name, "value": self.best, "settings": self.settings}
