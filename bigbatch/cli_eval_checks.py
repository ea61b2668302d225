"""What `bigbatch eval` checks and says of its reference B before anything is scored: the images it stands for, a
subset asked of statistics, B of other classes or of too few images, sets too small for the neighbours of precision
and recall."""

from __future__ import annotations

from typing import Any

from bigbatch.errors import BigbatchError, warn


def reference_count(kind: str, ref: object, n: int | None) -> int | None:
    """Images the reference statistics stand for (None when a statistics file does not say)."""
    if kind == "stats":
        return ref.meta.get("n")
    return min(n or len(ref), len(ref))


def subset_of_stats(kind: str, ref: object, reference_n: int | None, where: str, named: str = "B") -> None:
    """A subset of B asked for when B is statistics (which cannot be subset): one line, not ignored; more
    of B than it holds: said, as for A. `named`: the reference as the user knows it (a run's data set, no B given:
    found from outside, called B)."""
    if kind != "stats" and reference_n and reference_n > len(ref):
        warn(f"{named} holds {len(ref)} images, fewer than {where} {reference_n}: using all of them")
    if kind == "stats" and reference_n:
        n = ref.meta.get("n")
        raise BigbatchError(
            f"{where} {reference_n} asks for a subset of B's images, and B is statistics"
            f"{f' of {n} images' if n else ''}, made from the images they were: drop it, or give B's images"
        )


def say_a_reference_apart(
    ref: Any, kind: str, G: Any, reference_n: int | None, extractor: Any, metrics: str, named: str = "B"
) -> None:
    """Warn where B cannot be what the run's samples are compared with (found from outside: a 10-class digits GAN
    scored against 60 images of 4 other classes, without a word, for hours): B of other classes than the run's, and
    FID's reference statistics of fewer images than its features' dimensions (`named`: the reference, as the user
    knows it)."""
    from bigbatch.metrics.evaluate import NAMES, parse_metrics

    theirs, mine = set(getattr(ref, "class_names", None) or []), set(G.class_names or [])
    if theirs and len(mine) > 1 and theirs != mine:  # (in any order: FID and KID do not read labels)
        extra, parts = sorted(theirs - mine), []
        if extra:
            parts.append(f"{len(extra)} classes the run has not ({', '.join(extra[:3])}{', ...' * (len(extra) > 3)})")
        if mine - theirs:
            parts.append(f"no images of {len(mine - theirs)} of the run's {len(mine)}")
        warn(f"B holds {' and '.join(parts)}: the run's samples are compared with images of other classes")
    if kind == "stats" and len(ref.mu) != extractor.dims:  # (refused next, for its features: found from outside,
        return  # a count against the extractor's dimensions said first)
    count = ref.meta.get("n") if kind == "stats" else min(len(ref), reference_n or len(ref))
    fid = NAMES[extractor.family]["fid"]
    if "fid" in parse_metrics(metrics) and count is not None and int(count) < extractor.dims:
        warn(
            f"{named}: reference statistics of {int(count)} images, fewer than their {extractor.dims} feature "
            f"dimensions: {fid.upper()} against them is biased upward, and comparable only with scores against the "
            "same reference"
        )


def check_neighbours(metrics: str, n: int, ref: object, reference_n: int | None) -> None:
    """Sets too small for precision/recall's or density/coverage's neighbours refused before any extraction."""
    from bigbatch.metrics import ReferenceStats
    from bigbatch.metrics.evaluate import parse_metrics
    from bigbatch.metrics.manifold import DC_K, PR_K, check_sizes

    wanted = parse_metrics(metrics)
    k = max([PR_K] * ("pr" in wanted) + [DC_K] * ("dc" in wanted), default=0)
    if k and ref is not None and getattr(ref, "has_features", True):  # (statistics without: refused elsewhere)
        real = len(ref.features) if isinstance(ref, ReferenceStats) else len(ref)  # type: ignore[arg-type]
        check_sizes(n, min(reference_n or real, real), k)
