"""The xseg task: DeepFaceLab's XSeg (models/xseg.py) trained as DFL's Model_XSeg trains it, on the Replicator.

Data: labelled faces at 256 px, RGB + the label (`bigbatch prepare ALIGNED OUT.h5 --masks labels --resolution
256`: the polygons drawn in DFL's XSeg editor; any face set with a fourth channel does). data.dst_path may
name a second labelled set: DFL trains on src's and dst's labelled faces as one list, and so does this task.
Each face gets another labelled face as its background and DFL's augmentation (augment.py); the loss is the
sigmoid cross-entropy of the mask's logits per pixel, mean per face; the optimizer DFL's RMSprop (lr 1e-4,
each weight updated with probability 0.3). As for SAEHD, each step's loss is the batch's mean times
train.batch: DFL's gradient at that batch, whatever the micro-batches and ranks.

data.val_fraction holds out that fraction of each labelled set, scored every eval.every_kimg (`iou`, `val_loss`;
the best keeps RUN/checkpoints/best/): what DFL does not measure, whether the masks hold on faces not trained on.

DFL's pretraining mode (on unlabelled faces, DSSIM and MSE) is not here: start from DFL's generic XSeg model
instead (`train.init_from = "DFL/_internal/model_generic_xseg"`), as DFL users do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from bigbatch import checkpoints, models
from bigbatch.config import Config
from bigbatch.data.load import load_data, validation_data
from bigbatch.data.schedule import schedule_of
from bigbatch.data.split import Joined, holdout
from bigbatch.data.streams import ORDER_B, XSEG_AUG, generator
from bigbatch.engine import dist
from bigbatch.engine.determinism import seeded
from bigbatch.engine.precision import load_optimizer
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError, warn
from bigbatch.faces.xseg import load_xseg
from bigbatch.models.xseg import RESOLUTION
from bigbatch.sampling import BLACK, captioned_sheet
from bigbatch.signals import check_stop
from bigbatch.tasks.best import Best
from bigbatch.tasks.interface import Feed, check_family, peek, refuse_sections, register
from bigbatch.tasks.swap.load import check_face_size
from bigbatch.tasks.swap.optim import LR_DROPOUT, RMSprop
from bigbatch.tasks.swap.task import FOREIGN_TRAIN_KEYS, PREVIEW_ROWS, _float, face_type_of
from bigbatch.tasks.xseg import augment
from bigbatch.urls import public_name


def check_config(cfg: Config) -> None:
    """What the xseg task makes of the config: the xseg family at 256 px, none of the other tasks' keys."""
    check_family(cfg, "xseg", "face segmenter")
    foreign = cfg.train.changed(*FOREIGN_TRAIN_KEYS) + cfg.model.changed("ch", "dim_z", "conditional", "sn_update")
    if foreign:
        raise BigbatchError(  # (found from outside: model.ch and train.mixup were told of the optimizer)
            f"config key '{foreign[0]}' is not read by task = \"xseg\": its network is DFL's XSeg (base_ch 32), its "
            "augmentation DFL's own, and its optimizer set by [xseg] (lr, lr_dropout); remove it"
        )
    refuse_sections(cfg, 'task = "xseg"', "swap", "augment")
    if cfg.data.resolution != RESOLUTION:
        cfg.data._fail("resolution", f'must be {RESOLUTION} for task = "xseg" (DFL\'s XSeg reads 256 px faces)')
    if cfg.data.xflip:
        cfg.data._fail("xflip", 'is not read by task = "xseg": its augmentation mirrors faces as DFL\'s (p 0.4)')
    for key in ("val_path", "val_rect"):
        if cfg.data.changed(key):
            cfg.data._fail(key, "is a classify key; the xseg task holds out data.val_fraction of its labelled faces")
    if cfg.eval.every_kimg and not cfg.data.val_fraction:
        raise BigbatchError(
            "config key 'eval.every_kimg' asks for held-out scores, but there are none to hold out: set "
            "data.val_fraction (e.g. 0.1: that fraction of the labelled faces, src's and dst's, is never trained on)"
        )
    if cfg.eval.best not in ("", *SCORES):
        cfg.eval._fail("best", f'must be one of {", ".join(SCORES)} for task = "xseg", got {cfg.eval.best!r}')


def labelled(cfg: Config, data: Any, side: str) -> Any:
    """`data` if it holds labelled faces the model reads: RGB + the label, 256 px."""
    if data.channels != 4:
        raise BigbatchError(
            f"the {side} faces {data.source} have {data.channels} channels; XSeg trains on RGB + its label (4): "
            "prepare them with bigbatch prepare ALIGNED OUT.h5 --masks labels --resolution 256"
        )
    check_face_size(cfg, side, data.source, data.resolution, getattr(data, "meta", None))
    if getattr(data, "meta", {}).get("masks") == "dfl":  # (found from outside: a swap's set, landmarks' hulls where no
        # XSeg mask is applied, trained XSeg without a word; masks drawn by hand, --masks DIR or alpha, it may learn)
        warn(
            f"the {side} faces {data.source} hold masks prepared with --masks dfl, not XSeg labels: XSeg learns to "
            "draw those; for your labels, prepare the faces with --masks labels"
        )
    return data


@register("xseg", check=check_config)
def build(
    cfg: Config, rep: Replicator, data: Any, *, run: Path | None, resumed_at: int | None, quiet: bool
) -> XSegTask:
    """XSeg on the labelled faces of data.path (and data.dst_path), prepared by `rep`, with DFL's RMSprop."""
    d = cfg.data
    labelled(cfg, data, "src")
    dst = val = None
    if d.dst_path:
        dst = labelled(cfg, load_data(d.dst_path, d.resolution, d.in_ram, d.storage_options or None), "dst")
    if d.val_fraction:  # the same fraction of each, never trained on
        val = validation_data(cfg, data)
        if dst is not None:
            dst, dst_val = holdout(dst, d.val_fraction)
            val = Joined(val, dst_val)
    if run is not None and resumed_at is not None:
        check_resumed_dst(run, resumed_at, d.dst_path, dst)
    face_type = face_type_of(cfg, data, dst if dst is not None else data, "xseg", resumed_at is not None)
    with seeded(cfg.train.seed):
        net = models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options)
    if cfg.train.init_from and resumed_at is None:
        init_from(net, cfg.train.init_from, face_type)
    model = rep.prepare(net.train())
    opt = rep.wrap_optimizer(RMSprop(list(net.parameters()), **_rates(cfg), seed=(cfg.train.seed, 0)), "model")
    task = XSegTask(cfg, rep, data if dst is None else Joined(data, dst), model, opt, face_type, dst)
    if cfg.eval.every_kimg and run is not None and val is not None:
        task.scorer = XSegScorer(task, val, run, resumed_at, quiet or not rep.is_main)
    return task


def check_resumed_dst(run: Path, resumed_at: int, path: str, dst: Any) -> None:
    """On resume, the dst faces must be those the checkpoint trained on, or none if it trained on none (the loop
    checks src's): a set added, dropped or changed would change every step's faces."""
    meta = checkpoints.read_meta(run / "checkpoints" / checkpoints.checkpoint_name(resumed_at)) or {}
    if not isinstance(meta.get("dst"), dict):
        return
    recorded, now = str(meta["dst"].get("content_hash") or ""), "" if dst is None else str(dst.content_hash)
    if recorded != now:
        said = f"with the dst faces {meta['dst'].get('path')}" if recorded else "without dst faces"
        raise BigbatchError(
            f"the run was trained {said}, and data.dst_path {public_name(path) if path else '(none)'} "
            f"{'holds other faces' if now and recorded else 'differs'}: resume with the faces it trained on, or "
            "start a new run from its weights with train.init_from=RUN"
        )


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
    scorer: Any = None
    lr_key, range_loss = "xseg.lr", ("loss_xseg",)

    def __init__(
        self, cfg: Config, rep: Replicator, data: Any, model: nn.Module, opt: Any, face_type: str, dst: Any = None
    ) -> None:
        self.cfg, self.rep, self.model, self.opt, self.face_type = cfg, rep, model, opt, face_type
        self.feed_data = data  # (the loop's feed reads it: src's labelled faces, and dst's after them)
        self.steps = 0
        self.dst_hash = "" if dst is None else str(dst.content_hash)  # (recorded, and checked on resume)
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

    def draws(self, nimg: int) -> tuple[np.ndarray, ...]:
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
        dst = {"path": public_name(self.cfg.data.dst_path), "content_hash": self.dst_hash}
        return {"img_channels": 3, "resolution": RESOLUTION, "face_type": self.face_type or None, "dst": dst}

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]:
        """DFL's XSeg preview: per face, the face with its label (the rest greened), the predicted mask, the
        face with the prediction; of faces evenly spaced over the labelled ones (src's, then dst's; the held-out
        ones when there are)."""
        data = self.scorer.val if self.scorer is not None else self.feed_data
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


SCORES = ("iou", "val_loss")  # the held-out scores; the first keeps RUN/checkpoints/best/ unless eval.best says


@torch.no_grad()
def held_out_scores(model: nn.Module, data: Any, batch: int = 16, rank: int = 0, world: int = 1) -> dict[str, float]:
    """XSeg on labelled faces it never trained on, unaugmented: `iou`, the mean over faces of the intersection
    over union of its mask (cut at 0.5, as `xseg apply` cuts it) and the label (a face where both are empty
    counts 1), and `val_loss`, the training loss's cross-entropy; with `world` ranks each scores every
    world-th batch and the sums are combined."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # IoUs, losses, faces
    try:
        for start in range(rank * batch, len(data), batch * world):
            check_stop()  # (a stop asked of training ends it, as the swap score's)
            faces, _ = data.get(torch.arange(start, min(start + batch, len(data))))
            x = _float(faces, device)
            logits = model(x[:, :3].flip(1)).float()
            label = (x[:, 3:4] >= 0.5).float()
            pred = (logits >= 0).float()  # (sigmoid >= 0.5)
            inter, union = (pred * label).sum(dim=(1, 2, 3)), ((pred + label) > 0).float().sum(dim=(1, 2, 3))
            iou = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))
            loss = F.binary_cross_entropy_with_logits(logits, label, reduction="none").mean(dim=(1, 2, 3))
            sums += torch.stack([iou.sum(), loss.sum(), iou.new_full((), len(x))]).double()  # (no copy that waits)
    finally:
        model.train(was)
    sums = dist.sum(sums).cpu()
    n = max(1.0, float(sums[2]))
    return {"iou": float(sums[0]) / n, "val_loss": float(sums[1]) / n}


class XSegScorer:
    """The held-out scores every eval.every_kimg; the best `iou` (or eval.best) keeps RUN/checkpoints/best/."""

    def __init__(self, task: XSegTask, val: Any, run: Path, resumed_at: int | None, quiet: bool) -> None:
        self.task, self.val = task, val
        cfg = task.cfg
        metric = cfg.eval.best or SCORES[0]
        settings = {"metric": metric, "val_fraction": cfg.data.val_fraction}
        self.tracker = Best(metric, metric == "iou", settings, run, resumed_at, quiet)

    def __call__(self) -> dict[str, float]:
        began = time.perf_counter()
        rep = self.task.rep
        scores = held_out_scores(self.task.plain(), self.val, self.task.cfg.eval.batch_size, rep.rank, rep.world_size)
        return {**scores, "eval_seconds": time.perf_counter() - began}

    def improved(self, scores: dict[str, float]) -> bool:
        return self.tracker.improved(scores)

    def best_record(self) -> dict[str, Any]:
        return self.tracker.record()


def _draws(n: int, seed: int, nimg: int) -> tuple[np.ndarray, ...]:
    """The augmentation's draws for the `n` faces of the step at `nimg`, as NumPy: host parts of the step's batch
    (the Replicator sends tensors to the device, where the augmentation would read them back)."""
    return tuple(t.numpy() for t in augment.draw(n, RESOLUTION, generator(seed, XSEG_AUG, nimg)))


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
