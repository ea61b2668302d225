"""A trained classifier put to use: `bigbatch predict RUN IMAGES...` and `bigbatch export RUN OUT`.

Both run the same module, `Inference`: a uint8 RGB image (H, W, 3) of any size -> its center square
-> resized (bicubic, antialiased, as F.interpolate and training's resizes) so that its side is data.val_crop x
the resolution the run last trained at -> center-cropped to that resolution -> [-1, 1] -> the
network -> class probabilities.
That is the run's validation transform applied to the image as `prepare` stores it (center square),
so an image already at the data's resolution gets the probabilities `bigbatch eval` computes on data
stored as center squares, within 1e-6 (rectangular validation and whole-image data are not
reproduced). `bigbatch export` (bigbatch.export) writes this module as one file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import torch
from torch import nn

from bigbatch.config import Config
from bigbatch.data.listing import IMAGE_ENDINGS, IMAGE_EXTENSIONS
from bigbatch.data.schedule import resolution_scored
from bigbatch.data.sources import decode_or_reason, list_source
from bigbatch.data.tars import read_by_listing
from bigbatch.errors import BigbatchError, warn
from bigbatch.metrics.classifier import load_classifier
from bigbatch.metrics.image_sets import ImageFiles
from bigbatch.urls import Location, unreachable


def antialiased_weights(
    n_in: int, n_out: int, start: int, length: int, device: torch.device | None = None
) -> torch.Tensor:
    """(n_out, n_in): the rows of a bicubic, antialiased resize (F.interpolate's, align_corners=False: Pillow's
    BICUBIC filter, a = -0.5, widened by the scale where it shrinks; what training's resizes are) of the span
    start .. start + length - 1 of an axis of n_in to n_out, in float32 as PyTorch's CPU kernel computes them,
    zero outside the span, on `device` (the image's: `predict` runs on a GPU). As matrix products the crop and
    resize export to ONNX and torch.export for any image size with no branch on it, and match F.interpolate
    within 3e-4 of a level of 255; a span of n_out gives the identity."""
    j = torch.arange(n_in, dtype=torch.float32, device=device) - start
    i = torch.arange(n_out, dtype=torch.float32, device=device)[:, None]
    scale = torch.ones((), dtype=torch.float32, device=device) * length / n_out
    stretch = scale.clamp(min=1.0)  # the filter widened by the scale when shrinking
    center = scale * (i + 0.5)
    low = (center - 2 * stretch + 0.5).floor().clamp(min=0)
    high = torch.minimum(
        (center + 2 * stretch + 0.5).floor(), torch.ones((), dtype=torch.float32, device=device) * length
    )
    t = ((j - center + 0.5) / stretch).abs()
    a = -0.5
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    w = torch.where(t < 1, near, torch.where(t < 2, far, torch.zeros_like(t)))
    w = torch.where((j >= low) & (j < high), w, torch.zeros_like(w))
    return w / w.sum(1, keepdim=True)


@torch.jit.unused
def _sym_min(a: int, b: int) -> int:
    return torch.sym_min(a, b)  # under torch.export the sides are symbolic: a min it can keep


class Inference(nn.Module):
    """uint8 images (N, H, W, C) of one size, C 3 or 4 -> class probabilities (N, classes); one image (H, W, C) ->
    (classes,), as PyTorch's modules answer an unbatched input (found from outside: (1, classes))."""

    def __init__(self, net: nn.Module, resolution: int, crop: float, class_names: list[str]):
        super().__init__()
        self.net = net
        self.resolution = int(resolution)
        self.side = max(self.resolution, round(crop * resolution))
        self.class_names = list(class_names)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.probabilities(self.inputs(images))
        return p[0] if images.dim() == 3 else p

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """The class probabilities of the network's input `x` (`inputs`'s)."""
        return self.net(x).float().softmax(1)

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """What the network is given: the images composited, resized and cropped as validation's, in [-1, 1], NCHW."""
        # (an exported module is called by code that may pass a float image in [0, 1], torchvision's habit: refused)
        torch._assert(images.dtype == torch.uint8, "images must be uint8 RGB, 0..255, (H, W, 3) or (N, H, W, 3)")
        # (found from outside: an NCHW batch was taken as an image of 3 rows and 28 "channels", without a word)
        torch._assert(
            (images.dim() == 3 or images.dim() == 4) and images.shape[-1] >= 3 and images.shape[-1] <= 4,
            "images must be channels last, RGB or RGBA, (H, W, 3 or 4) or (N, H, W, 3 or 4): an NCHW tensor is "
            "permute(0, 2, 3, 1), a grayscale one (H, W, 1) expand(-1, -1, 3)",
        )
        x = images.unsqueeze(0) if images.dim() == 3 else images
        # (the RGB planes by index, not a slice: torch.export would trace a slice of 3 planes apart from one of more)
        rgb = x.index_select(3, torch.arange(3, device=x.device)).float()
        # An alpha plane composited onto white, as predict and prepare decode a transparent file (Pillow's
        # alpha_composite, exactly: found from outside, the alpha was dropped and the class changed). Without
        # one, an opaque plane after the image's is its alpha.
        opaque = torch.full_like(x.narrow(3, 0, 1), 255)
        alpha = torch.cat([x, opaque], dim=3).index_select(3, torch.full((1,), 3, device=x.device)).float()
        x = torch.floor((rgb * alpha + 255 * (255 - alpha)) / 255 + 0.5).permute(0, 3, 1, 2)
        h, w = x.shape[2], x.shape[3]
        s = min(h, w) if torch.jit.is_scripting() else _sym_min(h, w)  # the center square, resized
        rows = antialiased_weights(h, self.side, (h - s) // 2, s, x.device)
        x = rows @ x @ antialiased_weights(w, self.side, (w - s) // 2, s, x.device).T
        c = (self.side - self.resolution) // 2
        return x[:, :, c : c + self.resolution, c : c + self.resolution].clamp(0, 255) / 127.5 - 1  # (as eval's)


def inference_of(run: str | Path, which: str = "latest", device: str | torch.device = "cpu") -> Inference:
    """The `Inference` module of a classify run (or checkpoint) at the checkpoint `which` names (a run's latest
    that its training prunes meanwhile: its newest)."""
    from bigbatch import checkpoint_find, checkpoints

    def read(ckpt: Path) -> Inference:
        cfg = Config.load(ckpt / "config.toml")
        if cfg.task != "classify":
            raise BigbatchError(f"{run} is a {cfg.task} run: predict takes a classify run's classifier")
        net = load_classifier(ckpt, device)
        resolution = resolution_scored(cfg, int((checkpoints.read_meta(ckpt) or {}).get("nimg", 0)))
        module = Inference(net, resolution, cfg.data.val_crop, list(net.class_names)).eval()
        module.checkpoint = str(ckpt)  # type: ignore[assignment]
        return module

    return checkpoint_find.read_picked(run, which, read)


def each_image(paths: list[str], chunk: int = 64) -> Iterator[tuple[str, torch.Tensor | str]]:
    """(name, uint8 HWC image, or why it was skipped) for each image of `paths` in turn, a folder's, zip's or tar's
    read `chunk` files at a time (found from outside: predict held every image of a folder decoded at once). Every
    path is listed first: one missing, or a folder of no images, is refused before any image is read."""
    sources = [_source(path) for path in _globbed(paths)]
    return _images(sources, chunk)


def _source(path: str) -> tuple[str, Path | Location, ImageFiles | None]:
    """(what its images are named under, its path (a URL's Location), its listing; None for one image file)."""
    where = Location.of(path)
    p = Path(where.text) if not where.url else Path(path)  # (file://PATH is the path)
    listed = read_by_listing(where)
    if not listed and p.is_file() and not p.name.lower().endswith(ARCHIVES):
        return str(p), p, None
    if where.url and PurePosixPath(urlsplit(where.text).path).suffix.lower() in IMAGE_EXTENSIONS:  # (was refused)
        fs, root = where.fs()
        try:  # (info, not isfile: fsspec's HTTP isfile says False of a server down; found from outside)
            there = fs.info(root).get("type") == "file"
        except FileNotFoundError as e:
            raise BigbatchError(unreachable(e, where.name) or f"{where.name} does not exist") from None
        except Exception as e:  # noqa: BLE001 - fsspec's filesystems raise their own: one line for all
            raise BigbatchError(f"cannot read {where.name}: {type(e).__name__}: {e}") from None
        if not there:
            raise BigbatchError(f"{where.name} is not a file; give image files, folders, .zip or .tar files of images")
        return where.name, where, None
    give = "give image files, folders, .zip or .tar files of images"
    if not (listed or p.exists()):
        raise BigbatchError(f"{path} does not exist; {give}")
    files = ImageFiles(list_source(where, classes=False, as_named=True), where.name, give)
    return (where.name.rstrip("/") if where.url else str(p)), p, files


def _fetched(where: Location) -> bytes | str:
    """The bytes of one object at a URL, or why they could not be read."""
    fs, root = where.fs()
    try:
        return fs.cat_file(root)
    except Exception as e:  # noqa: BLE001 - as _source
        return f"cannot be read ({type(e).__name__}: {e})"


def _images(
    sources: list[tuple[str, Path | Location, ImageFiles | None]], chunk: int
) -> Iterator[tuple[str, torch.Tensor | str]]:
    for base, p, files in sources:
        if files is None and isinstance(p, Path) and p.suffix.lower() in (".h5", ".hdf5"):  # (not "corrupt")
            yield base, f"a data file, not an image: score a run on it with bigbatch eval RUN {p}"
        elif files is None:
            try:
                data: bytes | str = p.read_bytes() if isinstance(p, Path) else _fetched(p)
            except OSError as e:
                data = f"cannot be read ({e.strerror or e})"
            yield base, _decoded(data)
        else:
            yield from files.skipped
            shown = getattr(files.reader, "shown", None)  # (a tar's: its shard, then its member)
            # Files passed over by their names, each in its place among the images (found from outside: listed
            # first); a zip in a folder too (found from outside: unsaid); a tar sample's other fields are not.
            others = list(reversed(files.others)) if shown is None else []
            for start in range(0, len(files.keys), chunk):
                keys, names = files.keys[start : start + chunk], files.names[start : start + chunk]
                for key, name, data in zip(keys, names, files.reader.read(keys)):
                    while others and others[-1] < name:
                        yield f"{base}/{others[-1]}", _not_an_image(others.pop())
                    yield (shown(key, name) if shown else f"{base}/{name}"), _decoded(data)
            yield from ((f"{base}/{name}", _not_an_image(name)) for name in reversed(others))


def _not_an_image(name: str) -> str:
    if name.lower().endswith(ARCHIVES):
        return "not opened inside a folder: give it to predict on its own"
    return f"not an image file by its name ({IMAGE_ENDINGS})"


def _decoded(data: bytes | str) -> torch.Tensor | str:
    result = decode_or_reason(data, None, None)
    return result if isinstance(result, str) else torch.from_numpy(result[1].copy())


# What predict reads as a folder of images, not one image file (a compressed tar: one line saying so).
ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def _globbed(paths: list[str]) -> list[str]:
    """A quoted pattern ('imgs/*.JPEG', for a list too long for the shell) as the files it matches; a name
    that exists is itself, whatever its characters (and a brace pattern of tar shards is read as those)."""
    import glob

    out = []
    for path in paths:
        if Path(path).exists() or not glob.has_magic(path):
            out.append(path)
        elif matches := sorted(glob.glob(path)):
            out += matches
        else:
            raise BigbatchError(f"{path} matches no file; give image files, folders, .zip or .tar files of images")
    return out


def check_tta(cfg: Config, run: str | Path) -> None:
    """--tta averages with the mirror image: refused for a run that learned rotations (a mirror turns 90 degrees
    into 270), said for one trained without mirrored images (found from outside: both taken without a word)."""
    if cfg.train.labels == "rotation":
        raise BigbatchError(
            f'{run} learned rotations (train.labels = "rotation"), which a mirror image swaps (90 for 270 degrees): '
            "drop --tta"
        )
    if not cfg.data.xflip:
        warn(
            f"{run} trained without mirrored images (data.xflip = false): --tta averages each image with its "
            "mirror, which the model never saw; drop --tta unless mirrored images mean the same"
        )


def predict(
    module: Inference, images: Iterable[tuple[str, torch.Tensor]], topk: int = 5, tta: bool = False
) -> list[dict[str, Any]]:
    """Per image: its name and its top `topk` classes with their probabilities (`tta`: averaged with those
    of its mirror image)."""
    return list(predict_each(module, images, topk, tta))


@torch.no_grad()
def predict_each(
    module: Inference, images: Iterable[tuple[str, torch.Tensor]], topk: int = 5, tta: bool = False
) -> Iterator[dict[str, Any]]:
    """`predict`'s rows one image at a time, as `images` come."""
    device = next(module.parameters()).device
    for name, image in images:
        x = module.inputs(image.to(device))
        probs = module.probabilities(x)[0].cpu()
        if tta:  # the network's input mirrored, as eval's (found from outside: the image mirrored before its crop
            # moved the crop by a pixel where its margin is odd, and the probabilities differed from eval's)
            probs = (probs + module.probabilities(x.flip(-1))[0].cpu()) / 2
        p, k = probs.topk(min(topk, len(probs)))
        yield {"file": name, "top": [{"class": module.class_names[i], "p": float(v)} for v, i in zip(p, k)]}
