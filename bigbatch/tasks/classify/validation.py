"""A classifier's held-out split, scored: top-1, top-5 and mean loss, with square center-crop or
rectangular validation (fast.ai's DAWNBench ImageNet entry: images keep their aspect ratio).

Batches are cut from the split in file order, within one shape (aspect-ratio bucket) each, so a batch
is one tensor; the ranks take every world_size-th batch and their sums are added up, so the scores do
not depend on the number of ranks (the loss up to the order of float sums). A file of whole images
(`prepare --crop none`) is cropped as it is read, each image at its own aspect ratio with `rect`:
batches then gather the images of one output shape.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.data.load import stored_images, stored_side
from bigbatch.data.schedule import phase_sides
from bigbatch.engine import dist
from bigbatch.engine import precision as prec
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics.features import Progress
from bigbatch.sampling import from_uint8, to_uint8
from bigbatch.signals import check_stop

METRICS = ("val_top1", "val_top5", "val_loss")


def scores_top5(classes: int) -> bool:
    """Whether top-5 accuracy says anything of `classes` classes: of 5 or fewer it is always 100 (left out of
    eval's report and training's scores; found from outside, logged and drawn as a flat 100)."""
    return classes > 5


class Predictions(NamedTuple):
    """What `eval` keeps of each image's logits (row i: the split's image `index[i]`): 34 bytes an image
    whatever the number of classes, where the logits take 4 a class (4 KB an image of ImageNet's 1,000)."""

    index: torch.Tensor  # int64, positions in the split
    top: torch.Tensor  # int16/int32 (n, min(5, classes)): the classes of the highest logits, highest first
    labels: torch.Tensor  # int64
    loss: torch.Tensor  # float32: cross-entropy
    p_top: torch.Tensor  # float32: the probability of top[:, 0]


def warn_upscaled(cfg: Any, data: Any, val: Any = None) -> None:
    """Say where the run trains (`data`) or scores its held-out images (`val`; None: a share of `data`) above the
    side their file was prepared at: upscaled, no sharper (also the dry run's, from the files' metadata)."""
    # (a phase of resolution 0 trains at data.resolution: found from outside, its upscaling unsaid)
    largest = phase_sides(cfg)[-1]
    # (found from outside: the held-out side set by eval.resolution was blamed on the training's keys, and its fix
    # was the training's side; 16 px held-out images were scored at 32 px without a word)
    keys = "eval.resolution" if cfg.eval.resolution else "data.resolution, data.schedule"
    for which, held, side, why in (
        ("trains", data, largest, "data.resolution, data.schedule"),
        ("scores its held-out images", val, cfg.eval.resolution or largest, keys),
    ):
        stored = stored_side(held) if held is not None else 0
        if stored and side > stored:  # (whole images too: found from outside, 64 px ones trained at 128 unsaid)
            whole = getattr(held, "whole", False)
            if whole and stored < int(held.meta.get("resolution", 0)):  # (their sources are that small)
                fix = f"most were smaller than the side they were prepared at: train at {stored}px, or give larger ones"
            else:
                again = f"again with --resolution {side} --crop none" if whole else f"at {side}px (or with --crop none)"
                fix = f"prepare the images {again} for the detail"
            warn(
                f"data set {held.source} holds {stored_images(held, stored)}, and the run {which} at up to {side}px "
                f"({why}): they are upscaled, no sharper than at their own size; {fix}"
            )


# train.labels = "rotation": the classes, an image's rotation in degrees (label k: k x 90).
ROTATIONS = ["0", "90", "180", "270"]


def rotate(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """NCHW square images, image i rotated by k[i] x 90 degrees (each turn of every image, kept where it is
    the image's: no count of each turn's images read back from the device)."""
    out = x
    for r in range(1, 4):
        out = torch.where((k == r).view(-1, 1, 1, 1), torch.rot90(x, r, (2, 3)), out)
    return out


def rotation_labels(start: int, count: int) -> torch.Tensor:
    """The rotation label of the images at global positions start .. start + count - 1."""
    return torch.arange(start, start + count) % len(ROTATIONS)


def val_batches(counts: list[int], batch_size: int) -> list[torch.Tensor]:
    """Index batches of at most `batch_size`, bucket by bucket (`counts` images each, in file order:
    portrait to landscape for `prepare --buckets` data), never spanning two buckets."""
    out, start = [], 0
    for n in counts:
        out += list(torch.arange(start, start + n).split(batch_size)) if n else []
        start += n
    return out


def crop_size(height: int, width: int, size: int, rect: bool) -> tuple[int, int]:
    """The (h, w) a validation image of `height` x `width` is cropped to at `size`: size x size, or
    with `rect` its aspect ratio kept, the short side `size` and the long side floored to a multiple of
    8 (fast.ai's CropArTfm), never below `size`."""
    if not rect or height == width:
        return size, size
    long = max(size, int(size * max(height, width) / min(height, width)) // 8 * 8)
    return (long, size) if height > width else (size, long)


def val_geometry(height: int, width: int, size: int, crop: float, rect: bool) -> tuple[float, int, int, int, int]:
    """How a validation image of `height` x `width` is cut at `size`: (scale, resized h, w, cropped h, w):
    resized so that its short side is round(crop x size), then center-cropped to `crop_size`."""
    short = round(crop * size)
    scale = short / min(height, width)
    rh, rw = max(short, round(height * scale)), max(short, round(width * scale))
    ch, cw = crop_size(height, width, size, rect)
    return scale, rh, rw, min(ch, rh), min(cw, rw)


def val_transform(images: torch.Tensor, size: int, crop: float, rect: bool) -> torch.Tensor:
    """uint8 NHWC images of one shape -> float NCHW in [-1, 1], cut as `val_geometry` says (bicubic, antialiased
    resize: training's filter, in float as the exported files compute it, where the loader's runs in uint8 a level
    or so from it; and a whole image's validation crop; found from outside, bilinear here scored 0.7 points lower on
    Fashion-MNIST at 16 px)."""
    x = images.permute(0, 3, 1, 2).float()
    h, w = x.shape[-2:]
    _, rh, rw, ch, cw = val_geometry(h, w, size, crop, rect)
    if (rh, rw) != (h, w):
        x = F.interpolate(x, size=(rh, rw), mode="bicubic", align_corners=False, antialias=True)
    top, left = (rh - ch) // 2, (rw - cw) // 2  # (bicubic's overshoot clamped, as training's resizes clamp it)
    return x[:, :, top : top + ch, left : left + cw].clamp(0, 255) / 127.5 - 1


def with_mirror(logits: torch.Tensor, mirrored: torch.Tensor) -> torch.Tensor:
    """Flip TTA: the log of the mean of an image's and its mirror image's probabilities (fp32)."""
    return torch.logaddexp(logits.float().log_softmax(1), mirrored.float().log_softmax(1)) - math.log(2)


class Validation:
    """Scores a classifier on `data` (the held-out split) at the resolution `size()` gives (the phase in
    force): top-1 and top-5 accuracy in percent, and the mean cross-entropy (without smoothing). With
    `rotation`, the classes are the four rotations each image is given (train.labels = "rotation")."""

    def __init__(
        self,
        data: Any,
        size: Callable[[], int],
        batch_size: int,
        crop: float,
        rect: bool,
        precision: str,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        rotation: bool = False,
        tta: bool = False,
    ):
        self.data, self.size, self.crop, self.rect = data, size, crop, rect
        self.precision, self.device, self.rotation, self.tta = precision, device, rotation, tta
        self.classes = len(ROTATIONS) if rotation else data.n_classes  # what the network tells apart
        counts = list(getattr(data, "bucket_counts", [len(data)]))
        self.batches = val_batches(counts, batch_size)[rank::world_size]
        self.whole = bool(getattr(data, "whole", False))
        if rect and not self.whole and len(counts) == 1 and rank == 0:  # (found from outside: taken without a word)
            warn(
                f"data.val_rect keeps each image's aspect ratio, and {getattr(data, 'source', 'the data')} holds "
                "images of one shape: it changes nothing here (prepare with --crop none, or --buckets, for rectangular "
                "ones)",
                once=True,
            )
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self._sizes = data.stored_sizes(torch.arange(len(data))) if self.whole else None
        self._whole_batches: dict[int, list[tuple[torch.Tensor, list, tuple[int, int]]]] = {}

    def whole_batches(self, size: int) -> list[tuple[torch.Tensor, list, tuple[int, int]]]:
        """This rank's (index, boxes, output (h, w)) batches of a whole-image split at `size`: each image
        resized so that its short side is round(crop x size) and center-cropped to `crop_size` (its
        aspect ratio kept with `rect`), as the region of the stored image that becomes; batches of one
        output shape, in file order within it."""
        if size not in self._whole_batches:
            items = []
            for i in range(len(self._sizes)):  # type: ignore[arg-type]
                shape, box = self._region(i, size)
                items.append((shape, i, box))
            items.sort(key=lambda t: (t[0], t[1]))
            batches = []
            for k in range(len(items)):
                if k == 0 or items[k][0] != items[k - 1][0] or len(batches[-1][0]) == self.batch_size:
                    batches.append(([], [], items[k][0]))
                batches[-1][0].append(items[k][1])
                batches[-1][1].append(items[k][2])
            self._whole_batches[size] = [
                (torch.tensor(index), boxes, shape) for index, boxes, shape in batches[self.rank :: self.world_size]
            ]
        return self._whole_batches[size]

    def _region(self, i: int, size: int) -> tuple[tuple[int, int], tuple[float, float, float, float]]:
        """Whole image i's output (h, w) at `size` and the box (x, y, w, h) of it that becomes that."""
        h, w = self._sizes[i].tolist()  # type: ignore[index]
        _, rh, rw, ch, cw = val_geometry(h, w, size, self.crop, self.rect)
        # The box val_transform's resize-then-crop takes, its offsets whole pixels of the resized image as
        # torchvision's CenterCrop's (found from outside: the exact centre, half an output pixel from every other
        # path's where the margin was odd)
        sy, sx = h / rh, w / rw
        return (ch, cw), (((rw - cw) // 2) * sx, ((rh - ch) // 2) * sy, cw * sx, ch * sy)

    def _transform(self, index: torch.Tensor, size: int, boxes: list | None = None, shape: Any = None) -> tuple:
        """(float NCHW inputs on the device, labels) of images `index` (of one output shape) at `size`.
        Whole images are cut as they are read: `boxes` and `shape` as `whole_batches` gives them (one
        image's own without them)."""
        if self.whole:
            if boxes is None:
                shape, box = self._region(int(index[0]), size)
                boxes = [box]
            images, labels = self.data.get_regions(index, boxes, shape)
            return from_uint8(images).to(self.device), labels
        images, labels = self.data.get(index)
        return val_transform(images, size, self.crop, self.rect).to(self.device), labels

    def seen(self, i: int, size: int) -> tuple[torch.Tensor, int]:
        """Image i of the split as the network sees it at `size` (uint8 HWC; not rotated) and its label."""
        x, labels = self._transform(torch.tensor([i]), size)
        return to_uint8(x)[0], int(labels[0])

    def _batches(self, size: int) -> list[tuple[torch.Tensor, list | None, tuple[int, int] | None]]:
        """This rank's (index, boxes, output shape) batches at `size` (boxes and shape: whole images only)."""
        return self.whole_batches(size) if self.whole else [(index, None, None) for index in self.batches]

    def inputs(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This rank's batches at `size`: (indices in the split, float NCHW inputs on the device, labels)."""
        for index, boxes, shape in self._batches(size):
            x, labels = self._transform(index, size, boxes, shape)
            y = labels.to(self.device)
            if self.rotation:  # train.labels = "rotation": image i of the split turned by (i mod 4) x 90 degrees
                y = (index % len(ROTATIONS)).to(self.device)
                x = rotate(x, y)
            yield index, x, y

    @torch.no_grad()
    def predictions(self, model: nn.Module, tta: bool | None = None) -> Predictions:
        """This rank's share of the split as `Predictions`, on the CPU, reduced batch by batch. `tta`: each
        image's probabilities averaged with its mirror image's (flip TTA; fastai's tta averages 4 passes of the training
        transforms, blended with the plain prediction); None: as this Validation scores."""
        tta = self.tta if tta is None else tta
        was_training = model.training
        model.eval()
        out, size = [], self.size()
        shown = Progress(sum(len(index) for index, _, _ in self._batches(size)), "predictions")
        for index, x, y in self.inputs(size):
            with prec.autocast(self.precision, self.device):
                logits = model(x)
                mirrored = model(x.flip(-1)) if tta else None
            log_p = logits.float().log_softmax(1) if mirrored is None else with_mirror(logits, mirrored)
            top = log_p.topk(min(5, log_p.shape[1]), dim=1)
            loss = -log_p.gather(1, y[:, None])[:, 0]
            small = torch.int16 if log_p.shape[1] <= 2**15 else torch.int32
            out.append((index, top.indices.to(small).cpu(), y.cpu(), loss.cpu(), top.values[:, 0].exp().cpu()))
            shown.add(len(index))
        shown.close()
        model.train(was_training)
        if not out:
            nothing = torch.zeros(0, dtype=torch.long)
            return Predictions(nothing, torch.zeros(0, 0, dtype=torch.int16), nothing, torch.zeros(0), torch.zeros(0))
        return Predictions(*(torch.cat(parts) for parts in zip(*out)))

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict[str, float]:
        began, was_training = time.perf_counter(), model.training
        model.eval()
        # correct top-1, correct top-5, summed loss, images
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        try:
            for _, x, y in self.inputs(self.size()):
                check_stop()  # (a stop asked of training ends it)
                with prec.autocast(self.precision, self.device):
                    logits = model(x)
                    mirrored = model(x.flip(-1)) if self.tta else None
                logits = logits.float()
                if mirrored is not None:  # (eval.tta)
                    logits = with_mirror(logits, mirrored)
                top = logits.topk(min(5, logits.shape[1]), dim=1).indices
                hits = top == y[:, None]
                totals += torch.stack(
                    [
                        hits[:, 0].sum().double(),
                        hits.any(1).sum().double(),
                        F.cross_entropy(logits, y, reduction="sum").double(),
                        hits.new_full((), len(y), dtype=torch.float64),  # (a fill: no copy that waits)
                    ]
                )
        finally:
            model.train(was_training)
        top1, top5, loss, n = dist.sum(totals).tolist()
        scores = dict.fromkeys(METRICS, math.nan) if not n else {
            "val_top1": 100 * top1 / n,
            "val_top5": 100 * top5 / n,
            "val_loss": loss / n,
            "eval_seconds": round(time.perf_counter() - began, 3),
        }  # fmt: skip
        if not scores_top5(self.classes):
            del scores["val_top5"]
        return scores


def check_classes(data: Any, class_names: Sequence[str], whose: str, fix: str) -> None:
    """Refuse labelled images whose classes are not `class_names`, in order: their labels would be other
    classes' indices, and every score of them meaningless. `whose`: the classes' owner, `fix`: what to change."""
    theirs, mine = list(data.class_names), list(class_names)
    if theirs != mine:
        first = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
        here, there = (repr(names[first]) if first < len(names) else "none" for names in (theirs, mine))
        raise BigbatchError(
            f"{data.source} has other classes than {whose} ({len(theirs)} against {len(mine)}; the first that "
            f"differs is number {first}: {here} here, {there} in {whose}); {fix}"
        )
