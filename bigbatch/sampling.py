"""Seeds to images: latent draws, truncation, grids, class sheets and interpolations.

Image i of `sample(G, n, seed)` depends only on (seed, i): its z and label come from a generator
seeded by both, and G runs in eval mode, so the same seed gives the same images however n is
split into batches, and the first k of n images are the images of sample(G, k, seed).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import nn

from bigbatch.config import MIN_TRUNCATION
from bigbatch.data.streams import SAMPLE, generator
from bigbatch.engine import running_stats
from bigbatch.errors import BigbatchError, whole_number
from bigbatch.files import atomic_write


def draw_latents(
    n: int, dim_z: int, seed: int, n_classes: int, start: int = 0, truncation: float = math.inf
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """z (n, dim_z) and labels (n,) (None when unconditional) of images start, ..., start + n - 1.

    Truncation resamples every entry of z whose magnitude exceeds the threshold (Brock et al. 2019); an image's
    label is drawn before that, so it is the same at every threshold (found from outside: it moved with it, and
    a truncation sheet compared images of other classes).
    """
    if not truncation >= MIN_TRUNCATION:  # below it, resampling until every entry fits takes forever
        raise BigbatchError(f"truncation must be a threshold >= {MIN_TRUNCATION} (None or inf: off), got {truncation}")
    z = torch.empty(n, dim_z)
    y = torch.empty(n, dtype=torch.long) if n_classes else None
    for row in range(n):
        g = generator(seed, SAMPLE, start + row)
        zi = torch.randn(dim_z, generator=g)
        if y is not None:
            y[row] = torch.randint(n_classes, (1,), generator=g)
        while (out := zi.abs() > truncation).any():
            zi[out] = torch.randn(int(out.sum()), generator=g)
        z[row] = zi
    return z, y


@torch.no_grad()
def standing_stats(
    G: nn.Module, n_batches: int = 16, batch_size: int = 64, seed: int = 0, truncation: float = math.inf
) -> nn.Module:
    """Re-estimate G's BatchNorm running statistics from its own samples ("standing statistics",
    BigGAN-PyTorch's option for evaluation); returns G in eval mode.

    The running statistics of training are an exponential average over micro-batches of a G that
    kept changing; here they become the plain average over `n_batches` batches of `batch_size` draws
    of the final G (z with the same truncation as the images to come). Only the BatchNorms run in
    training mode, so nothing else (spectral-norm vectors) changes. Draws use the stream of `sample` at
    positions past 10**9, so they never coincide with the images being evaluated.
    """
    device = next(G.parameters()).device

    def latents() -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        for i in range(n_batches):
            z, y = draw_latents(batch_size, G.dim_z, seed, G.n_classes, 10**9 + i * batch_size, truncation)
            yield z.to(device), None if y is None else y.to(device)

    running_stats.reestimate(G.eval(), latents(), lambda zy: G(*zy))
    return G


def uint8_nhwc(x: torch.Tensor) -> torch.Tensor:
    """G's output in [-1, 1], NCHW -> uint8 NHWC, on x's device (an exported G's: found from outside, a TorchScript
    G copied its images to the host, its graph naming the CPU)."""
    return ((x.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """G's output in [-1, 1], NCHW -> uint8 NHWC on the CPU (to write or show)."""
    return uint8_nhwc(x).cpu()


def from_uint8(images: torch.Tensor) -> torch.Tensor:
    """uint8 NHWC images (as data sets hold them) -> float NCHW in [-1, 1], what the models take."""
    return images.permute(0, 3, 1, 2).float() / 127.5 - 1


@torch.no_grad()
def generate(G: nn.Module, z: torch.Tensor, y: torch.Tensor | None, batch_size: int = 64) -> torch.Tensor:
    """Run G on given latents and labels (or class weights) in batches -> uint8 NHWC."""
    device = next(G.parameters()).device
    out = []
    for i in range(0, z.shape[0], batch_size):
        yi = None if y is None else y[i : i + batch_size].to(device)
        out.append(to_uint8(G(z[i : i + batch_size].to(device), yi)))
    return torch.cat(out) if out else torch.empty(0, G.resolution, G.resolution, G.img_channels, dtype=torch.uint8)


def _family(G: nn.Module) -> str:
    """G's model family, as its run's config names it (its class's name where it has none)."""
    config = getattr(G, "config", None)
    return config.model.name if config is not None else type(G).__name__


NOISE_MODES = ("random", "const", "none")  # StyleGAN2's: each image's own (from its z), each layer's fixed, none


def restyle(G: nn.Module, psi: float | None = None, noise_mode: str | None = None, options: bool = False) -> None:
    """Set a StyleGAN2 G's truncation of w (`psi`, 1: off) and noise mode (NOISE_MODES), checked; None leaves
    either as it is. `options`: messages name the command line's --psi and --noise-mode."""
    named = ("--psi", "--noise-mode") if options else ("psi", "noise_mode")
    family = _family(G)
    if psi is not None:
        if not isinstance(psi, (int, float)) or not math.isfinite(psi):
            raise BigbatchError(f"{named[0]} must be a number (1 = off, 0.7 typical), got {psi!r}")
        if psi != 1 and not hasattr(G, "truncation_psi"):
            raise BigbatchError(
                f'{named[0]} needs a generator with a mapping network (model.name = "stylegan2"); this one is '
                f"{family}: use {'--truncation' if options else 'truncation'} (BigGAN's truncation of z)"
            )
        if hasattr(G, "truncation_psi"):
            G.truncation_psi = float(psi)
    if noise_mode is not None:
        if noise_mode not in NOISE_MODES:
            raise BigbatchError(f"{named[1]} must be one of {', '.join(NOISE_MODES)}, got {noise_mode!r}")
        if noise_mode != "random" and not hasattr(G, "noise_mode"):
            raise BigbatchError(f'{named[1]} is a StyleGAN2\'s (model.name = "stylegan2"); this one is {family}')
        if hasattr(G, "noise_mode"):
            G.noise_mode = noise_mode


def sample(
    G: nn.Module,
    n: int = 64,
    seed: int = 0,
    classes: Sequence[int] | None = None,
    truncation: float | None = None,
    batch_size: int = 64,
    with_labels: bool = False,
    psi: float | None = None,
    noise_mode: str | None = None,
) -> Any:
    """n images from G as a uint8 NHWC tensor. `classes`: labels to cycle through (image i gets
    classes[i % len(classes)]); by default each image's label is drawn from its seed. `with_labels`:
    (images, labels int64, None for an unconditional G). A StyleGAN2's `psi` (truncation of w, 1: off) and
    `noise_mode` ("random", "const" as ADA's generate.py, "none"), for these images only (G keeps its own)."""
    if not isinstance(G, nn.Module) or not hasattr(G, "dim_z"):
        raise BigbatchError(
            f"sample takes a generator (bigbatch.load_generator(RUN) or one of bigbatch.models), got {type(G).__name__}"
        )
    kept = {k: getattr(G, k) for k in ("truncation_psi", "noise_mode") if hasattr(G, k)}
    try:  # (its own psi and noise kept, whatever is refused: a psi set before a bad noise_mode too)
        restyle(G, psi, noise_mode)  # (found from outside: the API had no truncation of w, the CLI's --psi)
        return _sample(G, n, seed, classes, truncation, batch_size, with_labels)
    finally:
        for k, v in kept.items():
            setattr(G, k, v)


def _sample(
    G: nn.Module,
    n: int,
    seed: int,
    classes: Sequence[int] | None,
    truncation: float | None,
    batch_size: int,
    with_labels: bool,
) -> Any:
    n, batch_size = whole_number("n", n, 0), whole_number("batch_size", batch_size, 1)
    seed = whole_number("seed", seed, 0)  # (found from outside: seed="a", a TypeError deep in the streams)
    n_classes = getattr(G, "n_classes", 0)
    if classes is not None and not n_classes:
        raise BigbatchError("this generator is unconditional: it takes no classes")
    if classes is not None:
        try:
            listed = hasattr(classes, "__len__") and not isinstance(classes, (str, bytes))
            labels = [whole_number("a class", c) for c in classes] if listed else []
        except BigbatchError:
            labels = []
        if not labels or max(labels) >= n_classes:
            raise BigbatchError(f"classes must be a non-empty list of labels in 0..{n_classes - 1}, got {classes!r}")
    z, y = draw_latents(n, G.dim_z, seed, n_classes, truncation=math.inf if truncation is None else truncation)
    if classes is not None:
        y = torch.tensor([labels[i % len(labels)] for i in range(n)], dtype=torch.long)
    images = _eval(G, z, y, batch_size)
    return (images, y if n_classes else None) if with_labels else images


def grid(images: torch.Tensor, ncol: int = 8, pad: int = 2) -> Image.Image:
    """Tile uint8 NHWC images into one picture, `ncol` to a row."""
    n, h, w, c = images.shape
    nrow = max(1, math.ceil(n / ncol))
    canvas = np.full((nrow * (h + pad) + pad, ncol * (w + pad) + pad, c), 255, np.uint8)
    for i, img in enumerate(images.numpy()):
        r, col = divmod(i, ncol)
        canvas[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + col * (w + pad) : pad + col * (w + pad) + w] = img
    return Image.fromarray(canvas[..., 0] if c == 1 else canvas)


Caption = tuple[str, tuple[int, int, int]]  # a line of text under a picture, and its colour
BLACK, GREEN, RED = (0, 0, 0), (0, 128, 0), (200, 0, 0)


@functools.lru_cache(maxsize=1)
def caption_font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans at 10 px, from matplotlib's files: class names in Latin, Greek and Cyrillic letters
    (Pillow's own default font draws ASCII only: "ünï" came out as boxes); Pillow's without matplotlib. Found,
    not imported: importing matplotlib took half a second of each run that wrote a captioned sheet."""
    spec = importlib.util.find_spec("matplotlib")
    font = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf" if spec and spec.origin else None
    try:
        return ImageFont.truetype(str(font), 10) if font else ImageFont.load_default()
    except OSError:
        return ImageFont.load_default()


def _fit(draw: ImageDraw.ImageDraw, text: str, width: int) -> str:
    """`text`, cut (with an ellipsis) to `width` pixels in the caption font."""
    font = caption_font()
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def captioned_sheet(
    cells: Sequence[tuple[torch.Tensor, Sequence[Caption]]], ncol: int = 8, min_cell: int = 64
) -> Image.Image:
    """Pictures (uint8 HWC, 1 or 3 channels, any sizes) `ncol` to a row, each scaled (nearest) into a
    square at least `min_cell` px wide, with its caption lines under it, in a column as wide as its longest caption
    line up to 256 px, cut to that width beyond it."""
    if not cells:
        return Image.new("RGB", (min_cell, min_cell), "white")
    cell = max(min_cell, max(max(img.shape[:2]) for img, _ in cells))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))  # (found from outside: ImageNet's synsets cut to "n02085…")
    widest = max(
        (measure.textlength(text, font=caption_font()) for _, caption in cells for text, _ in caption), default=0
    )
    column = max(cell, min(256, math.ceil(widest) + 4))  # (the pictures kept at their size: found by review, 16x)
    lines = max(len(caption) for _, caption in cells)
    ncol = min(ncol, len(cells))
    width, height = column + 2, cell + 2 + 12 * lines + (2 if lines else 0)  # a grey frame around each picture
    sheet = Image.new("RGB", (ncol * width, math.ceil(len(cells) / ncol) * height), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (img, caption) in enumerate(cells):
        img = img.cpu()  # (a picture on the GPU: NumPy takes only the host's)
        pic = Image.fromarray(img[..., 0].numpy() if img.shape[-1] == 1 else img[..., :3].numpy()).convert("RGB")
        scale = cell / max(pic.size)
        pic = pic.resize((max(1, round(pic.width * scale)), max(1, round(pic.height * scale))), Image.NEAREST)
        x, y = (k % ncol) * width, (k // ncol) * height
        draw.rectangle((x, y, x + cell + 1, y + cell + 1), fill=(160, 160, 160))
        sheet.paste(pic, (x + 1, y + 1))
        for i, (text, colour) in enumerate(caption):
            draw.text((x + 2, y + cell + 1 + 12 * i), _fit(draw, text, column - 2), fill=colour, font=caption_font())
    return sheet


def save_png(image: Image.Image, path: str | Path) -> Path:
    """Write a PNG atomically."""
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
    return path


def class_sheet(G: nn.Module, seed: int, per_class: int = 8, truncation: float | None = None) -> Image.Image:
    """One row per class (up to 32 classes), `per_class` samples each, same z in every row."""
    rows = min(G.n_classes, 32)
    z, _ = draw_latents(per_class, G.dim_z, seed, 0, truncation=math.inf if truncation is None else truncation)
    z = z.repeat(rows, 1)
    y = torch.arange(rows).repeat_interleave(per_class)
    return grid(_eval(G, z, y), ncol=per_class)


def interpolation_sheet(
    G: nn.Module,
    seed: int,
    rows: int = 4,
    steps: int = 8,
    truncation: float | None = None,
    classes: Sequence[int] | None = None,
) -> Image.Image:
    """Rows interpolating z between two draws with the class fixed; for a conditional G, further rows
    interpolate the class (a mix of class embeddings) with z fixed. `truncation`: of the z drawn;
    `classes`: the fixed class of each row (and the first of each class interpolation), cycled."""
    n_classes = getattr(G, "n_classes", 0)
    cut = math.inf if truncation is None else truncation
    ends, ends_y = draw_latents(2 * rows, G.dim_z, seed, n_classes, truncation=cut)
    if classes and ends_y is not None:
        ends_y[0::2] = torch.as_tensor(list(classes), dtype=torch.long)[torch.arange(rows) % len(classes)]
    t = torch.linspace(0, 1, steps)[None, :, None]
    z = torch.lerp(ends[0::2, None], ends[1::2, None], t).reshape(-1, G.dim_z)
    if not n_classes:
        return grid(_eval(G, z, None), ncol=steps)
    # z interpolation, class of the first end fixed; then class interpolation, z of the first end fixed.
    y_fixed = torch.nn.functional.one_hot(ends_y[0::2], n_classes).float().repeat_interleave(steps, 0)
    y_a = torch.nn.functional.one_hot(ends_y[0::2], n_classes).float()[:, None]
    # The target class: the second draw's label, shifted so that it always differs from the first.
    target = (ends_y[0::2] + 1 + ends_y[1::2] % max(n_classes - 1, 1)) % n_classes
    y_b = torch.nn.functional.one_hot(target, n_classes)
    y_mix = torch.lerp(y_a, y_b.float()[:, None], t).reshape(-1, n_classes)
    z_fixed = ends[0::2].repeat_interleave(steps, 0)
    images = _eval(G, torch.cat([z, z_fixed]), torch.cat([y_fixed, y_mix]))
    return grid(images, ncol=steps)


def check_styled(G: nn.Module) -> None:
    """One line where G has no w of a layer of its own to mix (not a StyleGAN2)."""
    if not hasattr(G, "num_ws"):
        raise BigbatchError(f"style mixing needs a StyleGAN2 generator, with a w a layer; this one is {_family(G)}")


@torch.no_grad()
def style_mixing(
    G: nn.Module,
    rows: torch.Tensor,
    cols: torch.Tensor,
    styles: Sequence[int],
    row_y: torch.Tensor | None = None,
    col_y: torch.Tensor | None = None,
) -> torch.Tensor:
    """StyleGAN2-ADA's style_mixing.py sheet of a StyleGAN2 G (truncation and noise as `restyle` set them), as uint8
    NHWC images in its order, one more column than `cols` a row: a black corner, then each column's image (z of
    `cols`), and per row of `rows` its own image, then it with the w of each column at the layers `styles`. Noise is
    drawn from the row's z."""
    check_styled(G)
    if bad := [s for s in styles if not 0 <= s < G.num_ws]:
        raise BigbatchError(f"styles {bad} are not layers of this G: its w are 0-{G.num_ws - 1}")
    device, step = next(G.parameters()).device, 64  # (G runs on 64 images at a time: found from outside, a sheet of
    with eval_mode(G):  # 4,000 rows ran at once)
        z = torch.cat([rows, cols]).to(device)
        y = None if row_y is None or col_y is None else torch.cat([row_y, col_y]).to(device)
        parts = [
            G(z[i : i + step], None if y is None else y[i : i + step], return_ws=True) for i in range(0, len(z), step)
        ]
        own, ws = to_uint8(torch.cat([p[0] for p in parts])), torch.cat([p[1] for p in parts])
        layers = torch.as_tensor(list(styles), device=device, dtype=torch.long)
        out = [torch.zeros_like(own[0])] + list(own[len(rows) :])  # the corner, then the columns' images
        for r in range(len(rows)):
            out.append(own[r])
            for c in range(0, len(cols), step):
                mixed = ws[r].expand(len(cols[c : c + step]), -1, -1).clone()
                mixed[:, layers] = ws[len(rows) + c : len(rows) + c + step][:, layers]
                z_row = z[r].expand(len(mixed), -1)  # (its noise: the row's)
                y_row = None if y is None else y[r].expand(len(mixed), *y.shape[1:])
                out += list(to_uint8(G(z_row, y_row, ws=mixed)))
    return torch.stack(out)


@contextmanager
def eval_mode(G: nn.Module) -> Iterator[nn.Module]:
    """G in eval mode (running BN statistics) for the block, then back in the mode it was in."""
    was_training = G.training
    G.eval()
    try:
        yield G
    finally:
        G.train(was_training)


def _eval(G: nn.Module, z: torch.Tensor, y: torch.Tensor | None, batch_size: int = 64) -> torch.Tensor:
    with eval_mode(G):
        return generate(G, z, y, batch_size)
