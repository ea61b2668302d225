"""Held-out splits: a fixed, seeded fraction of a data set set aside for validation, and views of a
data set restricted to some of its images (`Subset`), with the interface every data set has."""

from __future__ import annotations

import math
from typing import Any

import torch

from bigbatch.data.streams import VAL_SPLIT, generator
from bigbatch.errors import BigbatchError

# The split does not depend on train.seed: every run on a data set holds out the same images, so
# their validation scores compare.
SPLIT_SEED = 0


class Subset:
    """The images of `data` at `indices` (ascending, so aspect-ratio buckets stay contiguous), as a
    data set: `len`, `get`, `n_classes`, `class_names`, `channels`, `resolution`, `source`,
    `bucket_counts` and `content_hash` (of the parent and the indices)."""

    def __init__(self, data: Any, indices: torch.Tensor, part: str):
        self.data, self.indices, self.part = data, indices.long(), part

    def __len__(self) -> int:
        return len(self.indices)

    def _picked(self, index: torch.Tensor) -> torch.Tensor:
        return self.indices[torch.as_tensor(index, dtype=torch.long)]

    def get(self, index: torch.Tensor, resolution: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.get(self._picked(index), resolution) if resolution else self.data.get(self._picked(index))

    # A data file's reading of encoded and whole images (bigbatch/data/hdf5.py), for the subset's images.
    def stored_sizes(self, index: torch.Tensor) -> Any:
        return self.data.stored_sizes(self._picked(index))

    def get_regions(
        self, index: torch.Tensor, boxes: list, out: Any, placed: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.get_regions(self._picked(index), boxes, out, placed)

    # ... and data.decode = "gpu"'s (bigbatch/data/loader.py): the regions to cut, the encoded bytes.
    def crop_boxes(self, index: torch.Tensor, draws: torch.Tensor, min_scale: float) -> list:
        return self.data.crop_boxes(self._picked(index), draws, min_scale)

    def get_encoded(self, index: torch.Tensor, boxes: list | None = None, out: Any = 0) -> tuple[Any, torch.Tensor]:
        return self.data.get_encoded(self._picked(index), boxes, out)

    @property
    def encoded(self) -> bool:
        return bool(getattr(self.data, "encoded", False))

    @property
    def whole(self) -> bool:
        return bool(getattr(self.data, "whole", False))

    @property
    def meta(self) -> dict[str, Any]:
        """The data file's metadata ({} for a built-in set)."""
        return getattr(self.data, "meta", {})

    @property
    def yaws(self) -> Any:
        """The subset's faces' yaws (a data file's from aligned DFL faces), or None."""
        yaws = getattr(self.data, "yaws", None)
        return None if yaws is None else yaws[self.indices.numpy()]

    @property
    def n_classes(self) -> int:
        return self.data.n_classes

    @property
    def class_names(self) -> list[str]:
        return self.data.class_names

    @property
    def channels(self) -> int:
        return self.data.channels

    @property
    def resolution(self) -> int:
        return self.data.resolution

    @property
    def source(self) -> str:
        return f"{self.data.source} ({self.part})"

    @property
    def bucket_counts(self) -> list[int]:
        counts = getattr(self.data, "bucket_counts", [len(self.data)])
        ends = torch.tensor(counts).cumsum(0)
        return torch.bincount(torch.searchsorted(ends, self.indices, right=True), minlength=len(counts)).tolist()

    @property
    def content_hash(self) -> str:
        import hashlib

        digest = hashlib.sha256(self.indices.numpy().tobytes()).hexdigest()[:16]
        return f"{self.data.content_hash}[{self.part}:{digest}]"


def holdout(data: Any, fraction: float, val_path: bool = False) -> tuple[Subset, Subset]:
    """(train, val): `fraction` of the images of each aspect-ratio bucket (of all, for square data)
    held out by a fixed seed, the rest for training; the same split on every run and every rank. `val_path`: the
    task may take held-out images from a file of their own (a classifier's), said where none are held out."""
    counts = list(getattr(data, "bucket_counts", [len(data)]))
    val, start = [], 0
    for b, n in enumerate(counts):
        k = math.ceil(n * fraction) if n > 1 else 0
        perm = torch.randperm(n, generator=generator(SPLIT_SEED, VAL_SPLIT, b))
        val.append(perm[:k] + start)
        start += n
    held = torch.zeros(len(data), dtype=torch.bool)
    held[torch.cat(val)] = True
    if fraction and not held.any():  # (found from outside: one face held out none, and the preview of none crashed)
        raise BigbatchError(
            f"data.val_fraction {fraction:g} holds out none of the {len(data)} image(s) of "
            f"{getattr(data, 'source', 'the data')}: give more images, or data.val_fraction = 0"
            + (" (or the held-out images as data.val_path)" if val_path else "")  # (found from outside: said to XSeg)
        )
    if held.all():  # (a ZeroDivisionError deep in the data order, found from outside)
        raise BigbatchError(
            f"data.val_fraction {fraction:g} holds out all {len(data)} images, leaving none to train on: lower it"
        )
    everything = torch.arange(len(data))
    return Subset(data, everything[~held], "train"), Subset(data, everything[held], "val")


class Joined:
    """Two data sets of one shape as one (`a`'s images, then `b`'s): what a step reads through `get` (DFL's XSeg
    trains on src's and dst's labelled faces as one list). Whole-image crops and device decoding are not
    offered: a task that joins data sets reads square stored images."""

    def __init__(self, a: Any, b: Any):
        if (a.channels, a.resolution) != (b.channels, b.resolution):
            raise BigbatchError(
                f"{a.source} holds {a.channels}-channel {a.resolution} px images and {b.source} "
                f"{b.channels}-channel {b.resolution} px ones: prepare both alike"
            )
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)

    def get(self, index: torch.Tensor, resolution: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(index, dtype=torch.long)
        in_b = index >= len(self.a)
        images, labels = [], []
        for part, data, offset in ((~in_b, self.a, 0), (in_b, self.b, len(self.a))):
            if part.any():
                i = index[part] - offset
                got = data.get(i, resolution) if resolution else data.get(i)
                images.append(got[0])
                labels.append(got[1])
        order = torch.cat([torch.nonzero(~in_b).flatten(), torch.nonzero(in_b).flatten()]).argsort()
        return torch.cat(images)[order], torch.cat(labels)[order]

    @property
    def encoded(self) -> bool:
        return bool(getattr(self.a, "encoded", False) or getattr(self.b, "encoded", False))

    @property
    def meta(self) -> dict[str, Any]:
        return getattr(self.a, "meta", {})

    @property
    def n_classes(self) -> int:
        return 0

    @property
    def class_names(self) -> list[str]:
        return []

    @property
    def channels(self) -> int:
        return self.a.channels

    @property
    def resolution(self) -> int:
        return self.a.resolution

    @property
    def source(self) -> str:
        return f"{self.a.source} + {self.b.source}"

    @property
    def bucket_counts(self) -> list[int]:
        return [len(self)]

    @property
    def content_hash(self) -> str:
        return f"{self.a.content_hash}+{self.b.content_hash}"
