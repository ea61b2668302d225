"""A GAN's scorer during training (eval.*): G_ema scored every eval.every_kimg, the best kept."""

from __future__ import annotations

import time
import typing
from pathlib import Path
from typing import Any

import torch

from bigbatch.config import Config, EvalConfig
from bigbatch.config_types import typed
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics.classifier import ClassifierOptions
from bigbatch.metrics.evaluate import parse_metrics
from bigbatch.tasks.best import Best


def check_eval(e: EvalConfig) -> None:
    """eval.metrics and eval.best name metrics; eval.classifier holds options of the classifier extractor."""
    try:
        wanted = parse_metrics(e.metrics)
    except BigbatchError as err:
        e._fail("metrics", str(err).replace("unknown metric", "names an unknown metric"))
    if e.best:
        try:
            best = parse_metrics(e.best)
        except BigbatchError as err:
            e._fail("best", str(err).replace("unknown metric", "names an unknown metric"))
        if len(best) != 1 or best[0] not in wanted:
            e._fail("best", f"must name one of eval.metrics ({e.metrics}), got {e.best!r}")
    hints = typing.get_type_hints(ClassifierOptions)
    for key, value in e.classifier.items():
        if key not in hints:
            e._fail("classifier", f"has unknown option {key!r}; valid: {', '.join(hints)}")
        typed(value, hints[key], f"config key 'eval.classifier' option {key!r}")
        least = ">= 0" if key == "seed" else "positive"
        if not (value >= 0 if key == "seed" else value > 0):
            e._fail("classifier", f"option {key!r} must be {least}, got {value!r}")


def classifier_options(e: EvalConfig) -> ClassifierOptions:
    """eval.classifier as the classifier extractor's options."""
    hints = typing.get_type_hints(ClassifierOptions)
    return ClassifierOptions(
        **{k: typed(v, hints[k], f"eval.classifier option {k!r}") for k, v in e.classifier.items()}
    )


def best_metric(e: EvalConfig) -> str:
    """The canonical name (fid, is or kid) of the metric that picks checkpoints/best/."""
    return parse_metrics(e.best or e.metrics)[0]


class Scorer:
    """eval.*: scores G_ema (on a copy with standing statistics if asked) and tracks the best value of
    eval.best (restored from RUN/checkpoints/best/ on resume). The feature extractor and the reference
    statistics are made when training starts, so missing weights or an unusable metric stop the run
    before it trains, not hours later at the first evaluation."""

    def __init__(self, G_ema: torch.nn.Module, cfg: Config, data: Any, run: Path, resumed_at: int | None, quiet: bool):
        from bigbatch.metrics import reference_stats
        from bigbatch.metrics.evaluate import NAMES, check_metrics
        from bigbatch.tasks.classify.features import feature_extractor

        e = self.e = cfg.eval
        self.G_ema = G_ema
        self.device = device = next(G_ema.parameters()).device
        self.metric = best_metric(e)
        self.higher_is_better = self.metric == "is"
        with self._rng_untouched():
            options = classifier_options(e)
            self.extractor = feature_extractor(e.extractor, data, e.weights or None, device, options=options)
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
        self.tracker = Best(self.metric_name, self.higher_is_better, self.settings, run, resumed_at, quiet)
        # (found from outside: a 0.128 kimg run of a preset then spent hours, silently, in its end-of-run FID)
        if device.type == "cpu" and e.n > 10_000 and self.extractor.family == "inception" and not quiet:
            hours = e.n * 0.1 / 3600
            warn(
                f"eval.n {e.n} on a CPU: each evaluation, the one at the end of the run too, takes {hours:.1f} hours "
                "or more (Inception-v3 at about 0.1 s an image): give a smaller eval.n, or eval.every_kimg=0"
            )

    def _rng_untouched(self) -> Any:
        """Evaluation leaves training as it was: the global RNG (which training a classifier reseeds)
        is restored afterwards."""
        return torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])

    def __call__(self) -> dict[str, float]:
        import copy

        from bigbatch.metrics import generated_features, score
        from bigbatch.sampling import standing_stats

        e, began = self.e, time.perf_counter()
        with self._rng_untouched():
            G = self.G_ema  # standing statistics go into a copy
            if e.standing_stats:
                G = standing_stats(copy.deepcopy(G), e.standing_stats, e.batch_size, e.seed, e.truncation)
            feats = generated_features(G, self.extractor, e.n, e.seed, e.truncation, e.batch_size)
            scores = score(feats, self.reference, e.metrics, self.extractor.family)
        return {**scores, "eval_seconds": round(time.perf_counter() - began, 3)}

    def improved(self, scores: dict[str, float]) -> bool:
        return self.tracker.improved(scores)

    def best_record(self) -> dict[str, Any]:
        return self.tracker.record()
