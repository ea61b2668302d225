"""Intra-class FID (StudioGAN's `ifid`; Miyato & Koyama 2018's intra FID): a conditional generator scored class by
class, each class's samples against the data's images of that class, under one feature extractor (the run's: the
per-class scores compare with each other and with the run's own), and their mean."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bigbatch.data.split import Subset
from bigbatch.errors import BigbatchError, named_few, warn
from bigbatch.metrics.evaluate import NAMES, generated_features
from bigbatch.metrics.features import Extractor
from bigbatch.metrics.fid import feature_stats, frechet_distance
from bigbatch.metrics.stats import reference_stats


def intra_class_fid(
    G: nn.Module,
    data: Any,
    extractor: Extractor,
    seed: int = 0,
    truncation: float | None = None,
    batch_size: int = 64,
    n: int | None = None,
    cache: bool = True,
) -> dict[str, Any]:
    """Per class c of the conditional `G`: the FID (the extractor's: FCD for the classifier) of G's samples of c
    against `data`'s images of c, as many samples as c has images (StudioGAN's), or `n` each. Returns
    {"ifid": the mean over the classes scored, "per_class": {class name: score}, "per_class_n": {name: images of c}};
    a class with fewer than 2 images is left out, said."""
    classes = int(getattr(G, "n_classes", 0) or 0)
    if not classes:
        raise BigbatchError("intra-class FID scores a conditional generator class by class; this one is unconditional")
    labels = getattr(data, "labels", None)
    if labels is None or getattr(data, "n_classes", 0) != classes:
        raise BigbatchError(
            f"intra-class FID needs the data's labels of the generator's {classes} classes; "
            f"{getattr(data, 'source', 'the data')} holds {getattr(data, 'n_classes', 0)}"
        )
    labels = torch.as_tensor(labels)
    names = list(getattr(data, "class_names", None) or range(classes))
    fid = NAMES[extractor.family]["fid"]
    per, counts, few = {}, {}, []
    for c in range(classes):
        index = (labels == c).nonzero()[:, 0]
        if len(index) < 2:
            few.append(str(names[c]))
            continue
        ref = reference_stats(Subset(data, index, f"class {names[c]}"), extractor, batch_size=batch_size, cache=cache,
                              features=False)  # fmt: skip
        feats = generated_features(G, extractor, n or len(index), seed, truncation, batch_size, label=c)
        per[str(names[c])] = frechet_distance(*feature_stats(feats["pool"]), ref.mu, ref.sigma)
        counts[str(names[c])] = len(index)
    least = min((min(n or c, c) for c in counts.values()), default=extractor.dims)  # (samples and images a class)
    if least < extractor.dims:  # (as FID's own line says it; of the samples too, --n: found by review)
        warn(
            f"intra-class {fid.upper()}: some classes scored on {least} images, fewer than the {extractor.dims} "
            "feature dimensions: biased upward; compare it only with scores of as many images"
        )
    if few:
        warn(f"intra-class {fid.upper()}: {len(few)} classes ({named_few(few)}) have fewer than 2 images, left out")
    if not per:
        raise BigbatchError(f"intra-class {fid.upper()}: no class has 2 images or more")
    return {f"i{fid}": sum(per.values()) / len(per), "per_class": per, "per_class_n": counts}


def check_per_class(args: Any, G: nn.Module, kind: str, reference: Any) -> None:
    """`bigbatch eval RUN --per-class`: a conditional G's run, against a labelled data set of its classes (the run's,
    or B's), with none of the options of the other metrics."""
    if not getattr(G, "n_classes", 0):
        raise BigbatchError(f"--per-class scores a conditional GAN class by class; {args.path} is unconditional")
    theirs, mine = list(getattr(reference, "class_names", None) or []), list(G.class_names or range(G.n_classes))
    if kind != "data" or [str(c) for c in theirs] != [str(c) for c in mine]:  # (found by review: by count alone, a
        # digits run was scored against Fashion-MNIST's shirts, and classes in another order against each other)
        what = "not a data set" if kind != "data" else f"of the classes {', '.join(map(str, theirs[:4]))}, ..."
        raise BigbatchError(
            f"--per-class scores against a data set of the run's classes ({', '.join(map(str, mine[:4]))}, ... in "
            f"that order: its own, or B a DATA.h5 or builtin:NAME of them); {args.reference} is {what}"
        )
    given = [f for f in ("reference_n", "is_splits", "kid_subsets", "kid_subset_size") if getattr(args, f) is not None]
    given = ["metrics"] * (args.asked and args.metrics != "fid") + given  # (fid, what it scores, may be named)
    if given:
        flag = f"--{given[0].replace('_', '-')}"
        raise BigbatchError(f"--per-class scores FID per class, against each class's images: drop {flag}")
