"""A trained classifier put to use: `bigbatch predict RUN IMAGES...` and `bigbatch export RUN OUT`.

Both run the same module, `Inference`: a uint8 RGB image (H, W, 3) of any size -> its center square
-> resized (bilinear, antialiased) so that its side is data.val_crop x the resolution the run last
trained at -> center-cropped to that resolution -> [-1, 1] -> the network -> class probabilities.
That is the run's validation transform applied to the image as `prepare` stores it (center square),
so an image already at the data's resolution gets exactly the logits `bigbatch eval` computes on data
stored as center squares (rectangular validation and whole-image data are not reproduced). The
exported TorchScript file carries the module and the class names and loads with torch alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.config import Config
from bigbatch.data.schedule import resolution_trained
from bigbatch.data.sources import decode_or_reason, list_source
from bigbatch.errors import BigbatchError
from bigbatch.metrics.classifier import load_classifier
from bigbatch.metrics.image_sets import ImageFiles


class Inference(nn.Module):
    """uint8 images (H, W, 3) or (N, H, W, 3) of one size -> class probabilities (N, classes)."""

    def __init__(self, net: nn.Module, resolution: int, crop: float, class_names: list[str]):
        super().__init__()
        self.net = net
        self.resolution = int(resolution)
        self.side = max(self.resolution, round(crop * resolution))
        self.class_names = list(class_names)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.unsqueeze(0) if images.dim() == 3 else images
        x = x[..., :3].permute(0, 3, 1, 2).float()
        h, w = x.shape[2], x.shape[3]
        s = min(h, w)
        top, left = (h - s) // 2, (w - s) // 2
        x = x[:, :, top : top + s, left : left + s]
        if s != self.side:
            x = F.interpolate(x, size=[self.side, self.side], mode="bilinear", align_corners=False, antialias=True)
        c = (self.side - self.resolution) // 2
        x = x[:, :, c : c + self.resolution, c : c + self.resolution] / 127.5 - 1
        return self.net(x).float().softmax(1)


def inference_of(run: str | Path, which: str = "latest", device: str | torch.device = "cpu") -> Inference:
    """The `Inference` module of a classify run (or checkpoint) at the checkpoint `which` names."""
    from bigbatch import checkpoints
    from bigbatch.checkpoints import pick_checkpoint

    ckpt = pick_checkpoint(run, which)
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "classify":
        raise BigbatchError(f"{run} is a {cfg.task} run: predict and export take a classify run's classifier")
    net = load_classifier(ckpt, device)
    resolution = resolution_trained(cfg, int((checkpoints.read_meta(ckpt) or {}).get("nimg", 0)))
    module = Inference(net, resolution, cfg.data.val_crop, list(net.class_names)).eval()
    module.checkpoint = str(ckpt)  # type: ignore[assignment]
    return module


def read_images(paths: list[str]) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, str]]]:
    """The images of files, folders (recursively) and zips, decoded as `prepare` decodes them (EXIF
    orientation, 8-bit RGB): ([(name, uint8 HWC)], [(name, why it was skipped)])."""
    images, skipped = [], []
    for path in paths:
        p = Path(path)
        if p.is_file() and p.suffix.lower() != ".zip":
            try:
                data: bytes | str = p.read_bytes()
            except OSError as e:
                data = f"cannot be read ({e.strerror or e})"
            items = [(str(p), data)]
        elif p.exists():  # every image file of a folder or zip, as image sets list them (sub-folders too)
            files = ImageFiles(list_source(str(p)), str(p))
            items = list(zip((f"{p}/{n}" for n in files.names), files.reader.read(files.keys)))
        else:
            raise BigbatchError(f"{path} does not exist; give image files, folders or .zip files of images")
        for name, data in items:
            result = decode_or_reason(data, None, None)
            if isinstance(result, str):
                skipped.append((name, result))
            else:
                images.append((name, torch.from_numpy(result[1].copy())))
    return images, skipped


@torch.no_grad()
def predict(module: Inference, images: list[tuple[str, torch.Tensor]], topk: int = 5) -> list[dict[str, Any]]:
    """Per image: its name and its top `topk` classes with their probabilities."""
    device = next(module.parameters()).device
    out = []
    for name, image in images:
        probs = module(image.to(device))[0].cpu()
        p, k = probs.topk(min(topk, len(probs)))
        out.append({"file": name, "top": [{"class": module.class_names[i], "p": float(v)} for v, i in zip(p, k)]})
    return out


def export(run: str | Path, out: str | Path, which: str = "latest") -> Path:
    """Write the run's `Inference` module as one TorchScript file (class names inside, and in its
    extra file `class_names.json`), loadable with torch.jit.load alone."""
    from bigbatch.files import atomic_write

    module = inference_of(run, which, "cpu")
    try:
        # The network always sees resolution x resolution: traced there (any family); the wrapper,
        # which takes any image size, scripted.
        with torch.no_grad():
            module.net = torch.jit.trace(module.net, torch.zeros(1, 3, module.resolution, module.resolution))
        scripted = torch.jit.script(module)
    except Exception as e:  # noqa: BLE001 -- TorchScript raises many types for what it cannot compile
        raise BigbatchError(f"this model cannot be exported to TorchScript ({type(e).__name__}: {e})") from None
    import io

    buffer = io.BytesIO()
    meta = {"class_names": module.class_names, "resolution": module.resolution, "checkpoint": module.checkpoint}
    torch.jit.save(scripted, buffer, _extra_files={"bigbatch.json": json.dumps(meta)})
    atomic_write(Path(out), buffer.getvalue())
    return Path(out)
