"""Score a generator, or any set of images, against a data set, an image set or saved statistics: FID,
IS and KID with the Inception, or their classifier counterparts (fcd, cs, kcd) with the data set's own
classifier. Feature extraction is split across ranks; every rank returns the same scores."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bigbatch.config_types import IS_SPLITS, KID_SUBSET_SIZE, KID_SUBSETS
from bigbatch.engine import dist
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics import inception as inc
from bigbatch.metrics.extractors import falls_back, get_extractor
from bigbatch.metrics.features import Extractor, extract_sharded
from bigbatch.metrics.fid import feature_stats, frechet_distance
from bigbatch.metrics.image_sets import any_size, read_images
from bigbatch.metrics.inception_score import inception_score
from bigbatch.metrics.kid import kid
from bigbatch.metrics.manifold import density_coverage, precision_recall
from bigbatch.metrics.stats import ReferenceStats, reference_stats, subset_indices

METRICS = ("fid", "is", "kid")  # the default; pr and dc when asked for
# What each metric is called for each extractor family: a classifier's Fréchet distance is not FID.
NAMES = {
    "inception": {"fid": "fid", "is": "is", "kid": "kid", "pr": "pr", "dc": "dc"},
    "classifier": {"fid": "fcd", "is": "cs", "kid": "kcd", "pr": "cpr", "dc": "cdc"},
}
_ALIASES = {name: metric for names in NAMES.values() for metric, name in names.items()}
COMPARING = {"fid", "kid", "pr", "dc"}  # what compares with reference images (IS does not)
PER_IMAGE = {"kid", "pr", "dc"}  # what needs each reference image's features, not only their moments
# The values pr and dc give, as logged (a classifier's with "c_" before them).
MANIFOLD = {"pr": ("precision", "recall"), "dc": ("density", "coverage")}


def score_names(metric: str, family: str = "inception") -> tuple[str, ...]:
    """The values `metric` gives, as they are logged: ("fid",), ("kid", "kid_std"), ("precision",
    "recall"), ...; for the classifier extractor ("fcd",), ("c_precision", "c_recall"), ..."""
    if metric in MANIFOLD:
        return tuple(("" if family == "inception" else "c_") + v for v in MANIFOLD[metric])
    name = NAMES[family][metric]
    return (name,) if metric == "fid" else (name, name + "_std")


def parse_metrics(metrics: str | Iterable[str]) -> list[str]:
    """ "fid,is,kid" or a list -> canonical metric names (fid, is, kid, pr, dc); fcd, cs, kcd, cpr and
    cdc are accepted as the classifier's names for them."""
    items = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    out = []
    for item in (m.strip().lower() for m in items):
        if item not in _ALIASES:
            raise BigbatchError(f"unknown metric {item!r}{_theirs(item)}; valid: {', '.join(sorted(_ALIASES))}")
        if _ALIASES[item] not in out:
            out.append(_ALIASES[item])
    if not out:
        raise BigbatchError(f"no metrics given; valid: {', '.join(METRICS)}")
    return out


# StyleGAN2-ADA's metric names (metrics/metric_main.py) as they are here (found from outside: refused with the list
# alone): fid50k_full and kid50k_full against every real image, fid50k and kid50k their first 50,000.
ADA_METRICS = {
    "fid50k_full": "`--metrics fid --n 50000` here, against the whole data set",
    "fid50k": "`--metrics fid --n 50000 --reference-n 50000` here",
    "kid50k_full": "`--metrics kid --n 50000` here, against the whole data set",
    "kid50k": "`--metrics kid --n 50000 --reference-n 50000` here",
    "is50k": "`--metrics is --n 50000` here",
    "pr50k3_full": "`--metrics pr --n 50000` here (Inception's features, not ADA's VGG-16: not its values)",
    "pr50k3": "`--metrics pr --n 50000` here (Inception's features, not ADA's VGG-16: not its values)",
}


def _theirs(item: str) -> str:
    """How StyleGAN2-ADA's name of a metric is given here, for the line that refuses it."""
    if item.startswith("ppl"):
        return " (StyleGAN2-ADA's perceptual path length is not offered: it needs LPIPS's VGG weights)"
    return f" (StyleGAN2-ADA's {item} is {ADA_METRICS[item]})" if item in ADA_METRICS else ""


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


def check_reference(stats: ReferenceStats, extractor: Extractor, metrics: str | Iterable[str]) -> None:
    """Refuse statistics the extractor's features cannot be compared with, or that lack what the metrics
    need (KID: every reference image's features), before any image is processed."""
    names = NAMES[extractor.family]
    where = stats.meta.get("file") or stats.meta.get("source") or "the reference statistics"
    if stats.mu.shape != (extractor.dims,):
        raise BigbatchError(
            f"{where} holds {stats.mu.shape[0]}-dimensional statistics and the {extractor.name} extractor gives "
            f"{extractor.dims} features: they were computed with another network (FID statistics are Inception "
            "pool features, 2048 of them)"
        )
    made_with = stats.meta.get("extractor_digest")
    if made_with and made_with != extractor.digest:
        raise BigbatchError(
            f"{where} was computed with other {stats.meta.get('extractor', '')} weights or input pipeline than "
            f"this {extractor.name} extractor; compute the statistics again with it"
        )
    per_image = [names[m] for m in parse_metrics(metrics) if m in PER_IMAGE]
    if per_image and not stats.has_features:
        raise BigbatchError(
            f"{', '.join(per_image)} need{'s' * (len(per_image) == 1)} every reference image's features and {where} "
            "holds only their mean and "
            f"covariance: give the reference images or data set instead, or leave {', '.join(per_image)} out of "
            f"the metrics (--metrics {names['fid']})"
        )


def reference_for(
    reference: object,
    extractor: Extractor,
    metrics: str | Iterable[str],
    n: int | None = None,
    batch_size: int = 64,
    cache: bool = True,
) -> ReferenceStats | None:
    """The statistics the metrics compare against: None when none of them needs any (IS alone), the given
    ReferenceStats once checked, else those of the data set or image set `reference` (cached)."""
    wanted = parse_metrics(metrics)
    names = NAMES[extractor.family]
    if not COMPARING & set(wanted):
        return None
    if reference is None:
        needs = ", ".join(names[m] for m in wanted if m in COMPARING)
        raise BigbatchError(
            f"{needs} compare with reference images: give a data set, images or statistics to compare with"
        )
    if isinstance(reference, ReferenceStats):
        check_reference(reference, extractor, wanted)
        return reference
    per_image = bool(PER_IMAGE & set(wanted))
    return reference_stats(reference, extractor, n=n, batch_size=batch_size, cache=cache, features=per_image)


def score(
    features: dict[str, torch.Tensor],
    reference: ReferenceStats | None,
    metrics: str | Iterable[str] = METRICS,
    family: str = "inception",
    is_splits: int = IS_SPLITS,
    kid_subsets: int = KID_SUBSETS,
    kid_subset_size: int = KID_SUBSET_SIZE,
    seed: int = 2020,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Scores of generated `features` ({"pool": ..., "logits": ...}) against `reference` statistics,
    named for the extractor `family`: {"fid"}, {"is", "is_std"}, {"kid", "kid_std"}, {"precision",
    "recall"}, {"density", "coverage"} (or fcd, cs, kcd, c_precision, ...). Precision, recall, density and
    coverage compare sets of one size, a seeded subset of the larger side as large as the other (as the papers
    compute them: a larger set has smaller balls; a smaller reference is said), on `device` (the extractor's: its
    distances are the work; default the features')."""
    names = NAMES[family]
    out: dict[str, float] = {}
    first = dist.first()  # (its warnings said once: found from outside, by each rank)
    for metric in parse_metrics(metrics):
        if metric in COMPARING and reference is None:
            raise BigbatchError(f"{names[metric]} needs reference statistics of the data set")
        if metric in PER_IMAGE and not reference.has_features:
            raise BigbatchError(
                f"{names[metric]} needs the reference images' features; these statistics were computed "
                "for FID only (reference_stats(..., features=True) keeps them)"
            )
        if metric in MANIFOLD:
            # Both sides of one size (found from outside: 10,000 samples were compared with 1,797 digits, said nowhere)
            n = min(len(features["pool"]), len(reference.features))
            for side, held, other in (("generated", len(features["pool"]), "the reference"),
                                      ("reference", len(reference.features), "the generated set")):  # fmt: skip
                if n < held and first:  # (the reference's cut too: found from outside, unsaid)
                    warn(
                        f"{' and '.join(score_names(metric, family))} compare sets of one size: {n} of the {held} "
                        f"{side} images, as {other} holds {n}",
                        once=True,
                    )
            real, fake = _equal_subset(reference.features, n, seed), _equal_subset(features["pool"], n, seed)
            measure = precision_recall if metric == "pr" else density_coverage
            fake = fake if device is None else fake.to(device)
            values = measure(fake, real).values()
            out |= dict(zip(score_names(metric, family), values, strict=True))
        elif metric == "fid":
            n, dims = features["pool"].shape
            if n < dims and first:  # (found from outside: FID of 20 images against 120 was 15% above that of 120)
                warn(
                    f"{names['fid'].upper()} of {n} images is biased upward (fewer than its {dims} feature "
                    "dimensions): compare it only with scores of as many images (the papers': 50,000)",
                    once=True,
                )
            out[names["fid"]] = frechet_distance(*feature_stats(features["pool"]), reference.mu, reference.sigma)
        elif metric == "kid":
            mean, std = kid(
                features["pool"], reference.features, kid_subsets, kid_subset_size, seed=seed, name=names["kid"]
            )
            out[names["kid"]], out[names["kid"] + "_std"] = mean, std
        elif metric == "is":
            if "logits" not in features:
                raise BigbatchError(no_logits_message())
            count = len(features["logits"])
            if count < 2 * is_splits and first:  # (a split of one image scores exactly 1, whatever the image)
                warn(
                    f"{names['is'].upper()} of {count} images in {min(is_splits, count)} splits: a split of one image "
                    f"scores 1 whatever it shows; give at least {2 * is_splits} (the standard is 50,000)"
                )
            mean, std = inception_score(features["logits"], min(is_splits, count), seed)
            out[names["is"]], out[names["is"] + "_std"] = mean, std
    return out


def _equal_subset(features: Any, n: int, seed: int) -> Any:
    """`n` of `features` (all when they hold no more), drawn with `seed`, in their order."""
    if len(features) <= n:
        return features
    return features[np.sort(np.random.RandomState(seed).choice(len(features), n, replace=False))]


@torch.no_grad()
def generated_features(
    G: nn.Module,
    extractor: Extractor,
    n: int,
    seed: int = 0,
    truncation: float | None = None,
    batch_size: int = 64,
    label: int | None = None,
) -> dict[str, torch.Tensor]:
    """Features of images 0 .. n-1 of `bigbatch.sample(G, n, seed, truncation=...)`, split across ranks.
    Image i depends only on (seed, i), so the set of images is the same for any number of ranks. `label`: every
    image of that class (a conditional G's), its z as it would be."""
    from bigbatch.sampling import draw_latents, eval_mode, generate

    n_classes = getattr(G, "n_classes", 0)
    trunc = math.inf if truncation is None else truncation

    def images_at(start: int, count: int) -> torch.Tensor:
        z, y = draw_latents(count, G.dim_z, seed, n_classes, start=start, truncation=trunc)
        y = y if label is None else torch.full((count,), label, dtype=torch.long)
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
    is_splits: int = IS_SPLITS,
    kid_subsets: int = KID_SUBSETS,
    kid_subset_size: int = KID_SUBSET_SIZE,
    reference: object = None,
) -> dict[str, float]:
    """Score n samples of G (pass the EMA generator) against `data`.

    extractor: a name ("auto", "inception", "inception-torchscript", "classifier") or an Extractor
    built once with `get_extractor` and reused. The "classifier" one (or what "auto" falls back to
    without Inception weights) is `data`'s own classifier, loaded from its cache: the metrics do not
    train it; bigbatch.tasks.classify.features.classifier_extractor(data) does, and gives the Extractor.
    device: where features are extracted (default: G's).
    reference_n: images of `data` for the reference statistics (default all), cached by hash.
    reference: what to compare with instead of `data` (whose own classifier the classifier extractor
    still is): another data set, an image set (`open_images`) or ReferenceStats (`read_stats`).
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
    ref = reference_for(data if reference is None else reference, ext, wanted, reference_n, batch_size, cache)
    feats = generated_features(G, ext, n, seed, truncation, batch_size)
    return score(feats, ref, wanted, ext.family, is_splits, kid_subsets, kid_subset_size, device=ext.device)


@torch.no_grad()
def image_features(
    images: object, extractor: Extractor, n: int | None = None, seed: int = 0, batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """Features of a data set's or image set's images (all, or the seeded subset of n that reference
    statistics would take), split across ranks; images of different sizes are each resized by the
    extractor's pipeline."""
    index = subset_indices(len(images), n, seed)
    ext = any_size(extractor)
    return extract_sharded(ext, len(index), lambda s, c: read_images(images, index[s : s + c]), batch_size)


def extractor_for(
    reference: object,
    name: str | Extractor = "auto",
    path: str | Path | None = None,
    device: torch.device | str | None = "auto",
    **classifier_options: object,
) -> Extractor:
    """`get_extractor(name, ...)` for scoring against `reference`: the "classifier" extractor (also what
    "auto" falls back to without Inception weights) is trained on the reference images (by the classify
    task, bigbatch.tasks.classify.features.feature_extractor; here only loaded from its cache), so it is
    refused when the reference is statistics or missing."""
    if isinstance(name, Extractor):
        return name
    train_on = None if isinstance(reference, ReferenceStats) else reference
    if train_on is None:
        fallback = falls_back(name, path)
        if name == "classifier" or fallback:
            raise BigbatchError(
                (f"{inc.missing_weights_message()}; and " if fallback else "")
                + "the classifier extractor trains on the reference images, which statistics do not hold: give a "
                "data set or images to compare with"
            )
    return get_extractor(name, path=path, device=device, data=train_on, **classifier_options)


def evaluate_images(
    images: object,
    reference: object = None,
    metrics: str | Iterable[str] = METRICS,
    n: int | None = None,
    extractor: str | Extractor = "auto",
    batch_size: int = 64,
    seed: int = 0,
    device: torch.device | str | None = "auto",
    reference_n: int | None = None,
    cache: bool = True,
    is_splits: int = IS_SPLITS,
    kid_subsets: int = KID_SUBSETS,
    kid_subset_size: int = KID_SUBSET_SIZE,
) -> dict[str, float]:
    """Score a set of images, from any generator, as `evaluate` scores a generator's samples: `images`
    and `reference` are data sets (`load_data`) or image sets (`open_images`: a folder, .zip or .npz);
    `reference` may also be ReferenceStats (`read_stats`), or None for IS alone.

    n and reference_n: take a seeded subset of so many images of each (default all); the reference's
    statistics are cached by content hash. The "classifier" extractor is `reference`'s own classifier
    (loaded from its cache; see `evaluate`).
    """
    parse_metrics(metrics)
    if n is not None and n < 2:
        raise BigbatchError(f"evaluation needs at least 2 images, got n={n}")
    ext = extractor_for(reference, extractor, device=device)
    wanted = check_metrics(ext, metrics)
    ref = reference_for(reference, ext, wanted, reference_n, batch_size, cache)
    feats = image_features(images, ext, n, seed, batch_size)
    return score(feats, ref, wanted, ext.family, is_splits, kid_subsets, kid_subset_size, device=ext.device)
