"""Score a generator against a data set: FID, IS and KID with the Inception, or their classifier
counterparts (fcd, cs, kcd) with the data set's own classifier. Feature extraction is split across
ranks; every rank returns the same scores."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.metrics import inception as inc
from bigbatch.metrics.extractors import get_extractor
from bigbatch.metrics.features import Extractor, extract_sharded
from bigbatch.metrics.fid import feature_stats, frechet_distance
from bigbatch.metrics.inception_score import inception_score
from bigbatch.metrics.kid import kid
from bigbatch.metrics.stats import ReferenceStats, reference_stats

METRICS = ("fid", "is", "kid")
# What each metric is called for each extractor family: a classifier's Fréchet distance is not FID.
NAMES = {
    "inception": {"fid": "fid", "is": "is", "kid": "kid"},
    "classifier": {"fid": "fcd", "is": "cs", "kid": "kcd"},
}
_ALIASES = {name: metric for names in NAMES.values() for metric, name in names.items()}


def parse_metrics(metrics: str | Iterable[str]) -> list[str]:
    """ "fid,is,kid" or a list -> canonical metric names (fid, is, kid); fcd, cs and kcd are accepted as
    the classifier's names for them."""
    items = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    out = []
    for item in (m.strip().lower() for m in items):
        if item not in _ALIASES:
            raise BigbatchError(f"unknown metric {item!r}; valid: {', '.join(sorted(_ALIASES))}")
        if _ALIASES[item] not in out:
            out.append(_ALIASES[item])
    if not out:
        raise BigbatchError(f"no metrics given; valid: {', '.join(METRICS)}")
    return out


def no_logits_message() -> str:
    return (
        f"IS needs the Inception's output layer, and these weights have no output layer: put {inc.PTH_NAME} "
        f"(from {inc.PTH_URL}) in {inc.weights_dir()}, or leave 'is' out of the metrics"
    )


def check_metrics(extractor: Extractor, metrics: str | Iterable[str]) -> list[str]:
    """The canonical metric names, once `extractor` is known to give them (IS needs its logits):
    checked before any image is generated or any reference statistic computed."""
    wanted = parse_metrics(metrics)
    if "is" in wanted and not extractor.has_logits:
        raise BigbatchError(no_logits_message())
    return wanted


def score(
    features: dict[str, torch.Tensor],
    reference: ReferenceStats | None,
    metrics: str | Iterable[str] = METRICS,
    family: str = "inception",
    is_splits: int = 10,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    seed: int = 2020,
) -> dict[str, float]:
    """Scores of generated `features` ({"pool": ..., "logits": ...}) against `reference` statistics,
    named for the extractor `family`: {"fid"}, {"is", "is_std"}, {"kid", "kid_std"} (or fcd, cs, kcd)."""
    names = NAMES[family]
    out: dict[str, float] = {}
    for metric in parse_metrics(metrics):
        if metric in ("fid", "kid") and reference is None:
            raise BigbatchError(f"{names[metric]} needs reference statistics of the data set")
        if metric == "fid":
            out[names["fid"]] = frechet_distance(*feature_stats(features["pool"]), reference.mu, reference.sigma)
        elif metric == "kid":
            if not reference.has_features:
                raise BigbatchError(
                    f"{names['kid']} needs the reference images' features; these statistics were computed "
                    "for FID only (reference_stats(..., features=True) keeps them)"
                )
            mean, std = kid(features["pool"], reference.features, kid_subsets, kid_subset_size, seed=seed)
            out[names["kid"]], out[names["kid"] + "_std"] = mean, std
        elif metric == "is":
            if "logits" not in features:
                raise BigbatchError(no_logits_message())
            mean, std = inception_score(features["logits"], min(is_splits, len(features["logits"])), seed)
            out[names["is"]], out[names["is"] + "_std"] = mean, std
    return out


@torch.no_grad()
def generated_features(
    G: nn.Module,
    extractor: Extractor,
    n: int,
    seed: int = 0,
    truncation: float | None = None,
    batch_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Features of images 0 .. n-1 of `bigbatch.sample(G, n, seed, truncation=...)`, split across ranks.
    Image i depends only on (seed, i), so the set of images is the same for any number of ranks."""
    from bigbatch.sampling import draw_latents, eval_mode, generate

    n_classes = getattr(G, "n_classes", 0)
    trunc = math.inf if truncation is None else truncation

    def images_at(start: int, count: int) -> torch.Tensor:
        z, y = draw_latents(count, G.dim_z, seed, n_classes, start=start, truncation=trunc)
        return generate(G, z, y, batch_size)

    with eval_mode(G):
        return extract_sharded(extractor, n, images_at, batch_size)


def evaluate(
    G: nn.Module,
    data: object,
    metrics: str | Iterable[str] = METRICS,
    n: int = 50_000,
    extractor: str | Extractor = "auto",
    batch_size: int = 64,
    seed: int = 0,
    truncation: float | None = None,
    device: torch.device | str | None = None,
    reference_n: int | None = None,
    cache: bool = True,
    is_splits: int = 10,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
) -> dict[str, float]:
    """Score n samples of G (pass the EMA generator) against `data`.

    extractor: a name ("auto", "inception", "inception-torchscript", "classifier") or an Extractor
    built once with `get_extractor` and reused. device: where features are extracted (default: G's).
    reference_n: images of `data` for the reference statistics (default all), cached by hash.
    Returns e.g. {"fid": ..., "is": ..., "is_std": ..., "kid": ..., "kid_std": ...}; with the
    classifier, {"fcd", "cs", "kcd", ...}.
    """
    parse_metrics(metrics)  # a misspelt metric fails before anything is loaded
    if n < 2:
        raise BigbatchError(f"evaluation needs at least 2 samples, got n={n}")
    if device is None:
        device = next(G.parameters()).device
    ext = get_extractor(extractor, device=device, data=data)
    wanted = check_metrics(ext, metrics)
    ref = None
    if "fid" in wanted or "kid" in wanted:
        ref = reference_stats(data, ext, n=reference_n, batch_size=batch_size, cache=cache, features="kid" in wanted)
    feats = generated_features(G, ext, n, seed, truncation, batch_size)
    return score(feats, ref, wanted, ext.family, is_splits, kid_subsets, kid_subset_size)
