"""The xseg task: DeepFaceLab's XSeg (models/xseg.py) trained as DFL's Model_XSeg trains it, on the Replicator.

Data: labelled faces at 256 px, RGB + the label (`bigbatch prepare ALIGNED OUT.h5 --masks labels --resolution
256`: the polygons drawn in DFL's XSeg editor; any face set with a fourth channel does). data.dst_path may
name a second labelled set: DFL trains on src's and dst's labelled faces as one list, and so does this task.
Each face gets another labelled face as its background and DFL's augmentation (augment.py); the loss is the
sigmoid cross-entropy of the mask's logits per pixel, mean per face; the optimizer DFL's RMSprop (lr 1e-4,
each weight updated with probability 0.3). As for SAEHD, each step's loss is the batch's mean times
train.batch: DFL's gradient at that batch, whatever the micro-batches and ranks.

DFL's pretraining mode (on unlabelled faces, DSSIM and MSE) is not here: start from DFL's generic XSeg model
instead (`train.init_from = "DFL/_internal/model_generic_xseg"`), as DFL users do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from bigbatch import models
from bigbatch.config import Config
from bigbatch.data.load import load_data
from bigbatch.data.schedule import schedule_of
from bigbatch.data.split import Joined
from bigbatch.data.streams import ORDER_B, XSEG_AUG, generator
from bigbatch.engine.precision import load_optimizer
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError
from bigbatch.faces.xseg import load_xseg
from bigbatch.models.xseg import RESOLUTION
from bigbatch.sampling import BLACK, captioned_sheet
from bigbatch.tasks.interface import Feed, check_family, peek, refuse_sections, register
from bigbatch.tasks.swap.load import check_face_size
from bigbatch.tasks.swap.optim import LR_DROPOUT, RMSprop
from bigbatch.tasks.swap.task import FOREIGN_TRAIN_KEYS, PREVIEW_ROWS, _float, face_type_of
from bigbatch.tasks.xseg import augment


def check_config(cfg: Config) -> None:
    """What the xseg task makes of the config: the xseg family at 256 px, none of the other tasks' keys."""
    check_family(cfg, "xseg", "face segmenter")
    foreign = cfg.train.changed(*FOREIGN_TRAIN_KEYS) + cfg.model.changed("ch", "dim_z", "conditional", "sn_update")
    if foreign:
        raise BigbatchError(f"config key '{foreign[0]}' is not read by task = \"xseg\": its optimizer is set by [xseg]")
    refuse_sections(cfg, 'task = "xseg"', "swap", "augment")
    if cfg.data.resolution != RESOLUTION:
        cfg.data._fail("resolution", f'must be {RESOLUTION} for task = "xseg" (DFL\'s XSeg reads 256 px faces)')
    if cfg.data.xflip:
        cfg.data._fail("xflip", 'is not read by task = "xseg": its augmentation mirrors faces as DFL\'s (p 0.4)')
    for key in ("val_path", "val_rect", "val_fraction"):
        if cfg.data.changed(key):
            cfg.data._fail(key, 'is not read by task = "xseg": it holds out no faces (train on all your labels)')
    if cfg.eval.every_kimg:
        cfg.eval._fail("every_kimg", 'must be 0 for task = "xseg": it has no held-out score; watch its previews')


def labelled(cfg: Config, data: Any, side: str) -> Any:
    """`data` if it holds labelled faces the model reads: RGB + the label, 256 px."""
    if data.channels != 4:
        raise BigbatchError(
            f"the {side} faces {data.source} have {data.channels} channels; XSeg trains on RGB + its label (4): "
            "prepare them with bigbatch prepare ALIGNED OUT.h5 --masks labels --resolution 256"
        )
    check_face_size(cfg, side, data.source, data.resolution, getattr(data, "meta", None))
    return data


@register("xseg", check=check_config)
def build(
    cfg: Config, rep: Replicator, data: Any, *, run: Path | None, resumed_at: int | None, quiet: bool
) -> XSegTask:
    """XSeg on the labelled faces of data.path (and data.dst_path), prepared by `rep`, with DFL's RMSprop."""
    d = cfg.data
    labelled(cfg, data, "src")
    dst = None
    if d.dst_path:
        dst = labelled(cfg, load_data(d.dst_path, d.resolution, d.in_ram, d.storage_options or None), "dst")
    face_type = face_type_of(cfg, data, dst if dst is not None else data, "xseg")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        net = models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options)
    if cfg.train.init_from and resumed_at is None:
        init_from(net, cfg.train.init_from, face_type)
    model = rep.prepare(net.train())
    opt = rep.wrap_optimizer(RMSprop(list(net.parameters()), **_rates(cfg), seed=(cfg.train.seed, 0)), "model")
    return XSegTask(cfg, rep, data if dst is None else Joined(data, dst), model, opt, face_type)


def _rates(cfg: Config) -> dict[str, float]:
    return {"lr": cfg.xseg.lr, "lr_dropout": LR_DROPOUT if cfg.xseg.lr_dropout else 1.0, "lr_cos": 0}


def init_from(net: nn.Module, path: str, face_type: str) -> None:
    """train.init_from: the weights of a DFL XSeg model (e.g. its generic one) or of an xseg run, trained on the
    faces' type (refused otherwise: its masks would cut other faces)."""
    source, kind = load_xseg(path)
    if kind and face_type and kind != face_type:
        raise BigbatchError(
            f"train.init_from {path} was trained on {kind} faces, and these are {face_type}: start from an XSeg "
            "model of their face type (or from scratch)"
        )
    if source.base_ch != net.base_ch:
        raise BigbatchError(f"train.init_from {path} has base_ch {source.base_ch}, the config {net.base_ch}")
    net.load_state_dict(source.state_dict())


class XSegTask:
    usage = (
        "Mask aligned faces with: bigbatch xseg apply {run} ALIGNED; merge with it: bigbatch merge SWAP_RUN ... "
        "--mask xseg --xseg {run}; for DeepFaceLab: bigbatch export-dfl {run} OUT_DIR"
    )
    scorer = None
    lr_key, range_loss = "xseg.lr", ("loss_xseg",)

    def __init__(self, cfg: Config, rep: Replicator, data: Any, model: nn.Module, opt: Any, face_type: str) -> None:
        self.cfg, self.rep, self.model, self.opt, self.face_type = cfg, rep, model, opt, face_type
        self.feed_data = data  # (the loop's feed reads it: src's labelled faces, and dst's after them)
        self.steps = 0
        self._backgrounds: Any = None

    def plain(self) -> nn.Module:
        return self.rep.unwrap(self.model)

    def set_lr(self, rate: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = rate

    def step(self, feed: Feed) -> dict[str, float]:
        if self._backgrounds is None:  # other labelled faces, in an order of their own (DFL's bg_shuffle_idxs)
            self._backgrounds = feed.companion(self.feed_data)
        nimg = feed.nimg
        faces = feed.next().images
        out = self.rep.step(self.loss, (faces, self._backgrounds().images, *self.draws(nimg)), self.opt)
        stats = {"grad_norm": self.rep.grad_norm(self.opt)}
        if not self.rep.skipped(self.opt):
            stats.update(out)
        self.steps += 1
        return stats

    def draws(self, nimg: int) -> tuple[torch.Tensor, ...]:
        rep = self.rep
        lo, hi = rep.rank * rep.share, (rep.rank + 1) * rep.share
        return tuple(t[lo:hi] for t in _draws(rep.batch, self.cfg.train.seed, nimg))

    def inputs(self, micro: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(augmented faces BGR, labels) of a micro-batch (faces, backgrounds, the step's draws)."""
        image, label = augment.apply(_float(micro[0], device), _float(micro[1], device), micro[2:])
        return image.flip(1), label  # (BGR: the network is DFL's, its weights read cv2's order)

    def loss(self, micro: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        x, label = self.inputs(micro, self.rep.device)
        logits = self.model(x).float()
        loss = F.binary_cross_entropy_with_logits(logits, label, reduction="none").mean(dim=(1, 2, 3))
        return {"loss": loss.mean() * self.rep.batch, "loss_xseg": loss.detach().mean()}

    def probe(self, m: int) -> None:
        faces, _ = self.feed_data.get(torch.arange(m) % len(self.feed_data))
        micro = (faces, faces.roll(1, 0), *_draws(m, 0, 0))
        self.rep.probe_step(self.loss, micro)
        self.opt.zero_grad(set_to_none=True)

    def nets(self) -> dict[str, nn.Module]:
        return {"model": self.plain()}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_optimizer(self.opt, state["opt"])
        for group in self.opt.param_groups:  # (a resume may change xseg.lr and lr_dropout)
            group.update(_rates(self.cfg))
        self.steps = int(state["steps"])

    def model_info(self) -> dict[str, Any]:
        return {"img_channels": 3, "resolution": RESOLUTION, "face_type": self.face_type or None}

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]:
        """DFL's XSeg preview: per face, the face with its label (the rest greened), the predicted mask, the
        face with the prediction; of faces evenly spaced over the labelled ones (src's, then dst's)."""
        data = self.feed_data
        n = min(PREVIEW_ROWS, self.cfg.sample.n, len(data))
        faces, _ = data.get(torch.linspace(0, len(data) - 1, n).round().long())
        return {"preview": preview_sheet(self.plain(), faces)}

    def batch_sheet(self, nimg: int) -> Image.Image:
        """The step's first faces as the network receives them (backgrounds, warps, flares, colours, blurs) and
        their labels."""
        schedule, cfg = schedule_of(self.cfg), self.cfg
        n = min(PREVIEW_ROWS, schedule.phase_at(nimg).batch)
        faces = peek(self.feed_data, schedule, cfg, nimg, n, xflip=False).images
        backgrounds = peek(self.feed_data, schedule, cfg, nimg, n, stream=ORDER_B, xflip=False).images
        draws = [d[:n] for d in _draws(schedule.phase_at(nimg).batch, cfg.train.seed, nimg)]
        with torch.no_grad():
            x, label = self.inputs((faces, backgrounds, *draws), torch.device("cpu"))
        cells = []
        for row in range(len(x)):
            for what, img in (("in", x[row].flip(0)), ("label", label[row].expand(3, -1, -1))):
                pixels = (img.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
                cells.append((pixels, [(what, BLACK)]))
        return captioned_sheet(cells, ncol=4)


def _draws(n: int, seed: int, nimg: int) -> tuple[torch.Tensor, ...]:
    """The augmentation's draws for the `n` faces of the step at `nimg`."""
    return augment.draw(n, RESOLUTION, generator(seed, XSEG_AUG, nimg))


@torch.no_grad()
def preview_sheet(model: nn.Module, faces: torch.Tensor) -> Image.Image:
    """Rows of: the face with its label (outside it half green, as DFL's), the predicted mask, the face with it."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    x = _float(faces, device)
    image, label = x[:, :3], x[:, 3:4] if x.shape[1] > 3 else torch.ones_like(x[:, :1])
    pred = torch.sigmoid(model(image.flip(1)).float())
    model.train(was)
    green = torch.tensor([0.0, 1.0, 0.0], device=device).view(1, 3, 1, 1)

    def shown(mask: torch.Tensor) -> torch.Tensor:
        return image * mask + 0.5 * image * (1 - mask) + 0.5 * green * (1 - mask)

    grid = torch.stack([shown(label), pred.expand(-1, 3, -1, -1), shown(pred)], dim=1).clamp(0, 1)
    rows, cols, _, res, _ = grid.shape
    grid = grid.permute(0, 3, 1, 4, 2).reshape(rows * res, cols * res, 3)
    return Image.fromarray((grid * 255).round().to(torch.uint8).cpu().numpy())
