"""The swap task: DeepFaceLab's SAEHD face-swap autoencoder (model family "saehd") trained on the
Replicator, with SAEHD's losses and optimizers (models/Model_SAEHD/Model.py).

Each iteration reads a step of src faces (data.path) and a step of dst faces (data.dst_path) at the
same global positions, warps them (`warp`), and takes one optimizer step of the autoencoder on both
sides' losses: DSSIM (fp32 whatever the precision) + 10·MSE on the image, inside the blurred face
mask when the data carry masks (masked training), 10·MSE on the predicted mask, 300·L1 inside the
eyes and mouth (eyes_mouth_prio), DFL's style losses on the swap (face_style_power, bg_style_power),
and the discriminators' terms. Then, when they are on, one step of
the code discriminator (true_face_power) and one of the patch discriminator (gan_power), each on
the codes and reconstructions of the autoencoder as its step left it, as DFL's sessions compute them
again for its discriminators' steps (one more forward of the autoencoder, without gradients).

DFL differentiates each loss summed over its samples; here each optimizer step's loss is the mean
over the whole batch times train.batch: the same gradient as DFL on one GPU at that batch (which
matters for the clip norm and AdaBelief's epsilon), whatever the micro-batches and ranks. The
logged src_loss and dst_loss are per-sample means, the numbers DFL prints.

Data: images of 3 channels (RGB), 4 (+ the face mask) or 5 (+ the eyes-and-mouth region), from
`bigbatch prepare --masks alpha|dfl|DIR [--eyes-mouth dfl|DIR]`; without masks the whole image is the face.
Before the warp, src faces may be recoloured like the dst face of their row (ct_mode; input and
target alike) and their input shifted in HSV (random_hsv_power); targets may have their background
blurred next to the mask (blur_out_mask).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.checkpoint import checkpoint

from bigbatch import models
from bigbatch.config import Config
from bigbatch.data.load import load_data, validation_data
from bigbatch.data.schedule import resize_batch, schedule_of
from bigbatch.data.split import holdout
from bigbatch.data.streams import COLOUR, ORDER_B, WARP, YawOrder, generator
from bigbatch.engine import batch_parts
from bigbatch.engine import precision as prec
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError, warn
from bigbatch.sampling import BLACK, captioned_sheet
from bigbatch.tasks.classify.task import GAN_TRAIN_KEYS
from bigbatch.tasks.gan.checks import CLASSIFY_KEYS
from bigbatch.tasks.interface import Feed, check_family, peek, refuse_sections, register
from bigbatch.tasks.swap import color, warp
from bigbatch.tasks.swap.discriminators import check_new_discriminators, discriminators
from bigbatch.tasks.swap.load import (
    build_model,
    check_faces,
    check_resumed_dst,
    check_source_face_type,
    check_yaws,
    dfl_record,
    init_discriminators,
    init_from,
    init_optimizer,
    make_optimizer,
    optimizer_parameters,
    resume_optimizer,
    trained_parameters,
)
from bigbatch.tasks.swap.losses import blur_out, dssim, gaussian_blur, reconstruction_loss, style_loss
from bigbatch.urls import public_name

# train keys of the other tasks, which the swap task does not read (its own are under [swap]): the GAN's and the
# classifier's, and those they share (found by review: a third list of them, which each new GAN key had to join).
FOREIGN_TRAIN_KEYS = (*GAN_TRAIN_KEYS, *CLASSIFY_KEYS, "lr_decay", "betas", "adam_eps", "ema_rampup")
PREVIEW_ROWS = 8


def check_config(cfg: Config) -> None:
    """What the swap task makes of the config: the saehd family and its options, a dst data set, none of
    the other tasks' keys, and options SAEHD has (true_face_power: df archis only)."""
    m, s = cfg.model, cfg.swap
    check_family(cfg, "swap", "face-swap")
    foreign = cfg.train.changed(*FOREIGN_TRAIN_KEYS) + m.changed("ch", "dim_z", "conditional", "sn_update")
    if foreign:
        raise BigbatchError(
            f"config key '{foreign[0]}' is not read by task = \"swap\": its model is set by model.options (archi, "
            "ae_dims, e_dims, d_dims, d_mask_dims), its optimizer by [swap] (optimizer, lr, lr_dropout); remove it"
        )
    refuse_sections(cfg, 'task = "swap"', "xseg", "augment")
    if not cfg.data.dst_path:
        cfg.data._fail("dst_path", 'must name the dst faces (a DATA.h5 or builtin:NAME) for task = "swap"')
    if cfg.data.xflip:
        cfg.data._fail("xflip", 'is not read by task = "swap": its mirroring is swap.src_flip and swap.dst_flip')
    archi = str(m.options.get("archi", models.registry.options(m.name)["archi"]))
    if s.true_face_power and not archi.startswith("df"):
        cfg.swap._fail("true_face_power", f"works with df archis only (DFL's rule), not {archi}; set it to 0")
    if cfg.eval.every_kimg and not cfg.data.val_fraction:
        raise BigbatchError(
            "config key 'eval.every_kimg' asks for held-out scores, but there are none to hold out: set "
            "data.val_fraction (e.g. 0.05; that fraction of both src and dst is never trained on)"
        )
    for key in ("val_path", "val_rect"):
        if cfg.data.changed(key):
            cfg.data._fail(key, "is a classify key; the swap task holds out data.val_fraction of src and dst")


@register("swap", check=check_config, new_run=check_new_discriminators)
def build(
    cfg: Config, rep: Replicator, data: Any, *, run: Path | None, resumed_at: int | None, quiet: bool
) -> SwapTask:
    """SAEHD on src (`data`) and dst (data.dst_path), prepared by `rep`, with DFL's optimizer for it and each disc."""
    s, d = cfg.swap, cfg.data
    check_faces(cfg, data, "src")  # data.path, less data.val_fraction
    dst = check_faces(cfg, load_data(d.dst_path, d.resolution, d.in_ram, d.storage_options or None), "dst")
    val = None
    if d.val_fraction:  # the same fraction of each, never trained on
        dst, dst_val = holdout(dst, d.val_fraction)
        val = (validation_data(cfg, data), dst_val)
    if run is not None and resumed_at is not None:
        check_resumed_dst(run, resumed_at, d.dst_path, dst)
    check_yaws(cfg, data, dst)
    if s.eyes_mouth_prio and min(data.channels, dst.channels) < 5:
        cfg.swap._fail(
            "eyes_mouth_prio",
            "needs the eyes-and-mouth region in both data sets (a fifth channel): prepare them with "
            "bigbatch prepare --masks dfl|DIR --eyes-mouth dfl|DIR, or set it to false",
        )
    made = all(f.startswith("builtin:") for f in (d.path, d.dst_path))  # (built-in sets have no masks to make)
    told = run and resumed_at is None and rep.is_main and not made
    if s.masked_training and max(data.channels, dst.channels) < 4 and told:
        warn(  # (found from outside: said by `bigbatch info` only, where a DFL user forgot --masks dfl)
            "swap.masked_training: neither data set has face masks, so this run trains unmasked, on whole faces (as "
            "DFL without masks): prepare both with --masks dfl|alpha|DIR to train inside the faces' masks"
        )
    if s.masked_training and (data.channels >= 4) != (dst.channels >= 4):  # (neither: trained unmasked, as DFL)
        only = "src" if data.channels >= 4 else "dst"
        if resumed_at is not None:  # (a run begun before this was refused trained unmasked: it goes on so)
            warn(f"swap.masked_training: only {only}'s data has face masks, so this run trains unmasked, as it did")
        else:
            cfg.swap._fail(
                "masked_training",
                f"needs face masks in both data sets, and only {only}'s has them: prepare the other with bigbatch "
                "prepare --masks alpha|dfl|DIR, or set it to false",
            )
    if s.blur_out_mask and min(data.channels, dst.channels) < 4:
        cfg.swap._fail(
            "blur_out_mask",
            "needs face masks in both data sets (a fourth channel): prepare them with bigbatch prepare "
            "--masks alpha|dfl|DIR, or set it to false",
        )
    net = build_model(cfg).train()
    if cfg.train.init_from and resumed_at is None:
        init_from(net, cfg.train.init_from)
    trained = trained_parameters(net, cfg)
    kept = {id(p) for p in trained}
    for p in net.parameters():  # liae's inter_AB without random warp: DFL leaves it, no gradient to compute
        p.requires_grad_(id(p) in kept)
    model = rep.prepare(net)
    kind = "adabelief" if s.optimizer == "adabelief" else "rmsprop"

    def optimizer(params: list[nn.Parameter], stream: int, name: str) -> torch.optim.Optimizer:
        return rep.wrap_optimizer(make_optimizer(cfg, params, stream), name)

    opt = optimizer(optimizer_parameters(net), 0, "model")  # (inter_AB's moments kept while it gets no gradient)
    discs: dict[str, tuple[nn.Module, nn.Module, torch.optim.Optimizer]] = {}
    for i, (name, plain) in enumerate(discriminators(cfg, net).items()):
        discs[name] = (plain, rep.prepare(plain, checkpointing=False), optimizer(list(plain.parameters()), i + 1, name))
    face_type = face_type_of(cfg, data, dst, resumed=resumed_at is not None)
    carried: tuple[bytes | None, int] = (None, 0)
    if cfg.train.init_from and resumed_at is None:  # (the model's face type; its moments, record, discriminators)
        check_source_face_type(cfg.train.init_from, face_type)
        init_optimizer(opt, net, cfg.train.init_from, kind)
        carried = dfl_record(cfg.train.init_from)
        carried_discs = init_discriminators(discs, cfg.train.init_from)
        if carried_discs and rep.is_main and not quiet:
            print(f"train.init_from {cfg.train.init_from}: its {', '.join(carried_discs)} carried on", flush=True)
    task = SwapTask(cfg, rep, data, dst, val, model, opt, discs, run, resumed_at, quiet)
    task.face_type = face_type
    task.dfl_data, task.dfl_iter = carried
    return task


def face_type_of(cfg: Config, src: Any, dst: Any, section: str = "swap", resumed: bool = False) -> str:
    """DFL's face type of the faces: `section`.face_type, or the one `prepare --masks dfl|labels` recorded (""
    if neither says); the two sides and the config must agree (`resumed`: the config's is the model's, which a
    resume cannot change)."""
    kinds = {side: getattr(data, "meta", {}).get("face_type") for side, data in (("src", src), ("dst", dst))}
    found = {side: kind for side, kind in kinds.items() if kind}
    model = "a SAEHD model" if section == "swap" else "an XSeg model"
    options = getattr(cfg, section)
    if len(set(found.values())) > 1:  # (the model's own type, where the config gives it: found from outside, the
        # src side's was offered, which the model's face_type then refused)
        want = options.face_type or found["src"]
        sides = [f"the {side} faces" for side, kind in found.items() if kind != want] or ["one side"]
        raise BigbatchError(
            f"the src faces are of DFL's face type {found['src']!r} and the dst faces of {found['dst']!r}; {model} "
            f"takes one: prepare {' and '.join(sides)} again with --face-type {want} (DFL's cut to it by the landmarks)"
        )
    recorded = next(iter(found.values()), "")
    if options.face_type and recorded and options.face_type != recorded:
        if resumed:  # (found from outside: told to give the faces' face_type, which the resume then refused)
            raise BigbatchError(
                f"{section}.face_type of this run's model is {options.face_type!r}, but the faces are {recorded!r}: "
                f"prepare them again with --face-type {options.face_type} (DFL's cut to it by the landmarks)"
            )
        options._fail(
            "face_type",
            f"is {options.face_type!r}, but the faces are {recorded!r}: give {section}.face_type={recorded} (a model "
            f"of another face type, e.g. train.init_from, needs faces prepared with --face-type {options.face_type})",
        )
    return options.face_type or recorded


def _float(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 NHWC -> float NCHW in [0, 1] on `device`."""
    return images.to(device, non_blocking=True).permute(0, 3, 1, 2).float() / 255


def _d_loss(logits: torch.Tensor, real: bool) -> torch.Tensor:
    """DFL's DLoss: sigmoid cross-entropy against all ones or all zeros, mean per sample (N,)."""
    logits = logits.float()
    target = torch.ones_like(logits) if real else torch.zeros_like(logits)
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none").flatten(1).mean(1)


class SwapTask:
    usage = (
        "Merge into frames with: bigbatch merge {run} FRAMES ALIGNED OUT [--video OUT.mp4]; swap aligned faces: "
        "bigbatch swap {run} IN_DIR OUT_DIR; deploy: bigbatch export {run} OUT.pt (or .onnx, .dfm for DeepFaceLive); "
        "for DeepFaceLab: bigbatch export-dfl {run} OUT_DIR"
    )

    def __init__(
        self,
        cfg: Config,
        rep: Replicator,
        src: Any,
        dst: Any,
        val: tuple[Any, Any] | None,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        discs: dict[str, tuple[nn.Module, nn.Module, torch.optim.Optimizer]],
        run: Path | None,
        resumed_at: int | None,
        quiet: bool,
    ):
        self.cfg, self.rep, self.src, self.dst, self.val = cfg, rep, src, dst, val
        self.model, self.opt, self.discs = model, opt, discs
        self.resolution = cfg.data.resolution
        self.masks = min(src.channels, dst.channels) >= 4
        self.steps = 0
        self.face_type = cfg.swap.face_type  # DFL's face type of the faces ("" unknown): build sets it
        self.dfl_data: bytes | None = None  # the _data.dat of the DFL model it started from, carried to export-dfl
        self.dfl_iter = 0  # the iterations of the model it started from (DFL's or a swap run's) before this run's
        self._read_dst: Any = None
        # swap.uniform_yaw: each side's faces in an order spread over yaw (the loop's Feed reads src's by data_order)
        self.data_order = YawOrder(src.yaws, cfg.train.seed) if cfg.swap.uniform_yaw else None
        self.dst_order = YawOrder(dst.yaws, cfg.train.seed, ORDER_B) if cfg.swap.uniform_yaw else None
        if self.data_order and self.dst_order and rep.is_main and not quiet:
            bins = f"src's {len(self.data_order.bins)}, dst's {len(self.dst_order.bins)}"
            print(f"swap.uniform_yaw: the faces in {bins} bins of yaw, each bin drawn as often", flush=True)
        self.scorer = None
        if cfg.eval.every_kimg and run is not None and val is not None:
            from bigbatch.tasks.swap.scorer import SwapScorer

            self.scorer = SwapScorer(self, run, resumed_at, quiet or not rep.is_main)

    def plain(self) -> nn.Module:
        return self.rep.unwrap(self.model)

    # lr-find (bigbatch.lr_find): the autoencoder's rate, swap.lr; the curve is DFL's src + dst loss.
    lr_key, range_loss = "swap.lr", ("src_loss", "dst_loss")

    def set_lr(self, rate: float) -> None:
        """Hold the autoencoder's rate at `rate` for the steps that follow (the discriminators keep theirs)."""
        for group in self.opt.param_groups:
            group["lr"] = rate

    # ---- one iteration --------------------------------------------------------------------------
    def step(self, feed: Feed) -> dict[str, float]:
        if self._read_dst is None:
            self._read_dst = feed.companion(self.dst, self.dst_order)
        nimg = feed.nimg
        src, dst = feed.next(), self._read_dst()
        batch = (src.images, dst.images, *self.draws(nimg))
        self._train_only(None)
        out = self.rep.step(self.loss, batch, self.opt)
        stats = {"grad_norm": self.rep.grad_norm(self.opt)}
        if not self.rep.skipped(self.opt):
            stats.update(out)
        judged = self.judged(self.rep.split(batch)) if self.discs else ()
        for name, (_, _, opt) in self.discs.items():
            self._train_only(name)
            parts = judged[:2] if name == "code_discriminator" else judged[2:]
            loss_fn = self.code_d_loss if name == "code_discriminator" else self.gan_d_loss
            d_out = self.rep.step(loss_fn, parts, opt)
            if not self.rep.skipped(opt):
                stats[f"loss_{name}"] = d_out / self.rep.batch
        self._train_only(None)
        self.steps += 1
        return stats

    def judged(self, micros: list) -> tuple[torch.Tensor, ...]:
        """What the discriminators judge, of the micro-batches `micros` of a step, from the autoencoder as its step
        left it: the src and dst codes, and the src reconstructions and targets the patch discriminator sees.
        DFL runs each discriminator's step as a session of its own, which computes them again after the
        autoencoder's update (found from outside: the forward before it was taken here, a step behind DFL's)."""
        net, device, parts = self.plain(), self.rep.device, []
        with torch.no_grad(), prec.autocast(self.rep.precision, device):
            for micro in micros:
                (src_in, src_t, src_m, _), (dst_in, *_) = self.sides(batch_parts.to_device(micro, device), device)
                pred_src, _, _, _, src_code, dst_code = net(src_in, dst_in)
                parts.append((src_code, dst_code, *self.patch_inputs(pred_src, src_t, src_m)))
        return tuple(torch.cat(p) for p in zip(*parts))

    def patch_inputs(self, pred_src: torch.Tensor, src_t: torch.Tensor, src_m: torch.Tensor) -> tuple:
        """What the patch discriminator judges, fake and real: src's reconstructions and targets, inside the blurred
        mask with masked training (DFL's)."""
        blur = self._patch_mask(src_m)
        return (pred_src, src_t) if blur is None else (pred_src * blur, src_t * blur)

    def _patch_mask(self, src_m: torch.Tensor) -> torch.Tensor | None:
        """The blurred face mask the patch discriminator judges inside (masked training), or None."""
        return self._blur(src_m) if self.masks and self.cfg.swap.masked_training else None

    def draws(self, nimg: int) -> tuple[torch.Tensor, ...]:
        """This rank's share of the step's random draws, drawn for the whole step: the warp's, src's then
        dst's, and src's colour draws (ct_mode's, the HSV shift)."""
        s, rep = self.cfg.swap, self.rep
        lo, hi = rep.rank * rep.share, (rep.rank + 1) * rep.share
        return tuple(t[lo:hi] for t in _draws(rep.batch, self.cfg.train.seed, s, nimg))

    def _train_only(self, name: str | None) -> None:
        """Gradients for one net's step: the autoencoder's (None) or a discriminator's."""
        for key, (plain, _, _) in self.discs.items():
            plain.requires_grad_(key == name)

    def targets(
        self, x: torch.Tensor, draws: tuple[torch.Tensor, ...], hsv: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(input, target image, target mask, eyes-and-mouth or None) of one side's faces (float, NCHW),
        the input shifted in HSV by `hsv`'s draws when given."""
        s = self.cfg.swap
        shifted = color.hsv_shift(x[:, :3], hsv) if hsv is not None and s.random_hsv_power else None
        warped, target = warp.apply(x, *draws, warp=s.random_warp, picture=shifted)
        mask = target[:, 3:4] if target.shape[1] >= 4 else torch.ones_like(target[:, :1])
        em = target[:, 4:5] if target.shape[1] >= 5 else None
        image = blur_out(target[:, :3], mask, self.resolution) if s.blur_out_mask and self.masks else target[:, :3]
        return warped, image, mask, em

    def side_loss(
        self,
        target: torch.Tensor,
        mask: torch.Tensor,
        em: torch.Tensor | None,
        pred: torch.Tensor,
        pred_mask: torch.Tensor,
    ) -> torch.Tensor:
        """One side's SAEHD loss per sample (N,): image terms (inside the blurred mask with masked
        training), eyes-and-mouth priority, mask MSE."""
        if self.masks and self.cfg.swap.masked_training:
            blur = self._blur(mask).to(pred.dtype)
            loss = reconstruction_loss(target * blur, pred * blur, self.resolution)
        else:
            loss = reconstruction_loss(target, pred, self.resolution)
        if em is not None and self.cfg.swap.eyes_mouth_prio:
            loss = loss + 300 * (target.float() * em - pred.float() * em).abs().mean(dim=(1, 2, 3))
        return loss + 10 * (mask.float() - pred_mask.float()).square().mean(dim=(1, 2, 3))

    def sides(self, micro: tuple[torch.Tensor, ...], device: torch.device) -> tuple[tuple[torch.Tensor, ...], ...]:
        """`targets` of src and of dst for a micro-batch (src faces, dst faces, the step's draws)."""
        src, dst = _float(micro[0], device), _float(micro[1], device)
        if self.cfg.swap.ct_mode != "none":  # src recoloured like its row's dst face (rows are drawn apart)
            recoloured = color.transfer(self.cfg.swap.ct_mode, src[:, :3], dst[:, :3], micro[10])
            src = torch.cat([recoloured, src[:, 3:]], dim=1)
        return self.targets(src, micro[2:6], micro[11]), self.targets(dst, micro[6:10])

    def loss(self, micro: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        s = self.cfg.swap
        (src_in, src_t, src_m, src_em), (dst_in, dst_t, dst_m, dst_em) = self.sides(micro, self.rep.device)
        pred_src, pred_srcm, pred_dst, pred_dstm, src_code, dst_code = self.model(src_in, dst_in)
        recompute = self.cfg.train.checkpointing and torch.is_grad_enabled()

        def kept(fn: Any) -> Any:
            """fn, its full-resolution fp32 intermediates (DSSIM's local means and variances, the blurred
            masks) recomputed in backward under checkpointing: at 512 px they outweigh the decoder's."""
            return (lambda *args: checkpoint(fn, *args, use_reentrant=False)) if recompute else fn

        src_loss = kept(self.side_loss)(src_t, src_m, src_em, pred_src, pred_srcm)
        dst_loss = kept(self.side_loss)(dst_t, dst_m, dst_em, pred_dst, pred_dstm)
        net = self.plain()
        if s.face_style_power:  # the swap's colours inside its mask learn dst's; the code left alone
            image, mask = net.swap_from_code(dst_code.detach())
            content, style = image * mask.detach(), (pred_dst * pred_dstm).detach()
            src_loss = src_loss + kept(style_loss)(content, style, self.resolution // 8, 100 * s.face_style_power)
        if s.bg_style_power:  # the swap outside src's mask learns dst's background
            image, _ = net.swap_from_code(dst_code)
            src_loss = src_loss + kept(self.bg_style_loss)(image, dst_t, src_m)
        total = src_loss + dst_loss
        if s.true_face_power:
            _, code_d, _ = self.discs["code_discriminator"]
            total = total + s.true_face_power * _d_loss(code_d(src_code), True)
        if s.gan_power:
            _, gan, _ = self.discs["gan"]
            blur = self._patch_mask(src_m)
            center, pixels = gan(pred_src if blur is None else pred_src * blur)
            total = total + s.gan_power * (_d_loss(center, True) + _d_loss(pixels, True))
            if blur is not None:  # DFL: a faint background term and total variation against the GAN's bright dots
                anti = 1 - blur
                total = total + 0.02 * ((pred_src - src_t) * anti).float().square().mean(dim=(1, 2, 3))
                total = total + 1e-6 * _total_variation_mse(pred_src)
        return {
            "loss": total.mean() * self.rep.batch,
            "src_loss": src_loss.detach().mean(),
            "dst_loss": dst_loss.detach().mean(),
        }

    def bg_style_loss(self, swapped: torch.Tensor, dst: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """DFL's background style term per sample: DSSIM + MSE of the swap against dst outside the
        blurred src target mask (DFL's choice of mask), × 10 · bg_style_power / 100."""
        anti = 1 - self._blur(src_mask).clamp(0, 1)
        a, b = swapped.float() * anti, dst.float() * anti
        loss = dssim(a, b, int(self.resolution / 11.6)).mean(1) + (a - b).square().mean(dim=(1, 2, 3))
        return loss * (10 * self.cfg.swap.bg_style_power / 100)

    def _blur(self, mask: torch.Tensor) -> torch.Tensor:
        """The mask masked training weighs by: blurred (σ res/32), clipped at 0.5 and doubled, as DFL's."""
        return gaussian_blur(mask.float(), max(1, self.resolution // 32)).clamp(0, 0.5) * 2

    def code_d_loss(self, micro: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The code discriminator: dst codes are "real", src codes "fake" (DFL's true face)."""
        _, code_d, _ = self.discs["code_discriminator"]
        src_code, dst_code = micro
        loss = (_d_loss(code_d(dst_code), True) + _d_loss(code_d(src_code), False)) * 0.5
        return loss.mean() * self.rep.batch

    def gan_d_loss(self, micro: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The patch discriminator: src faces real, their reconstructions fake, at the centre and per pixel."""
        _, gan, _ = self.discs["gan"]
        fake, real = micro
        (rc, rp), (fc, fp) = gan(real), gan(fake)
        loss = (_d_loss(rc, True) + _d_loss(fc, False)) * 0.5 + (_d_loss(rp, True) + _d_loss(fp, False)) * 0.5
        return loss.mean() * self.rep.batch

    def probe(self, m: int) -> None:
        """One forward and backward of every optimizer's loss at micro-batch m."""
        src, _ = self.src.get(torch.arange(m) % len(self.src))
        dst, _ = self.dst.get(torch.arange(m) % len(self.dst))
        micro = (src, dst, *_draws(m, 0, self.cfg.swap, 0))
        self._train_only(None)  # (the autoencoder's alone, as its step: the discriminators' were made too)
        self.rep.probe_step(self.loss, micro)
        kept = self.judged([micro]) if self.discs else ()
        # One optimizer's gradients at a time, as the steps hold them (found by review: the autoencoder's were kept
        # through the discriminators' probes, over the floor a dry run counts).
        self.opt.zero_grad(set_to_none=True)
        for name, (*_, opt) in self.discs.items():
            self._train_only(name)
            parts = kept[:2] if name == "code_discriminator" else kept[2:]
            self.rep.probe_step(self.code_d_loss if name == "code_discriminator" else self.gan_d_loss, parts)
            opt.zero_grad(set_to_none=True)
        self._train_only(None)

    # ---- checkpoints and previews ---------------------------------------------------------------
    def nets(self) -> dict[str, nn.Module]:
        return {"model": self.plain(), **{name: plain for name, (plain, _, _) in self.discs.items()}}

    def state_dict(self) -> dict[str, Any]:
        carried = {"dfl_data": self.dfl_data} if self.dfl_data is not None else {}
        return {
            "dfl_iter": self.dfl_iter,
            "steps": self.steps,
            "opt": self.opt.state_dict(),
            **{f"opt_{k}": d[2].state_dict() for k, d in self.discs.items()},
            **carried,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        resume_optimizer(self.opt, state["opt"], self.cfg, self.plain())
        for name, (_, _, opt) in self.discs.items():
            resume_optimizer(opt, state[f"opt_{name}"], self.cfg)
        self.steps = int(state["steps"])
        self.dfl_data, self.dfl_iter = state.get("dfl_data"), int(state.get("dfl_iter", 0))

    def model_info(self) -> dict[str, Any]:
        net = self.plain()
        return {
            "img_channels": 3,
            "resolution": net.resolution,
            "archi": net.archi,
            "masks": self.masks,
            "face_type": self.face_type or None,
            "dst": {"path": public_name(self.cfg.data.dst_path), "content_hash": str(self.dst.content_hash)},
        }

    def preview_faces(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed faces previews show: up to PREVIEW_ROWS evenly spaced src and dst faces (held-out
        ones when there is a split), uint8 NHWC."""
        src, dst = self.val if self.val is not None else (self.src, self.dst)
        n = min(PREVIEW_ROWS, self.cfg.sample.n, len(src), len(dst))
        pick = [torch.linspace(0, len(d) - 1, n).round().long() for d in (src, dst)]
        return src.get(pick[0])[0], dst.get(pick[1])[0]

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]:
        """DFL's preview: per row src, src reconstructed, dst, dst reconstructed, dst swapped to src; then
        the swap's mask (src-path mask x dst-path mask, as DFL's merger takes it) and the swap blended
        into dst by it."""
        src, dst = self.preview_faces()
        return {"preview": preview_sheet(self.plain(), src, dst)}

    def batch_sheet(self, nimg: int) -> Image.Image:
        """The step's first src and dst faces as the autoencoder receives them, a row each pair: src's
        warped input, its target and its mask, then dst's (colour transfer, HSV shift, flips, warp and
        background blur applied as training applies them)."""
        schedule, cfg = schedule_of(self.cfg), self.cfg
        n = min(PREVIEW_ROWS, schedule.phase_at(nimg).batch)
        src = peek(self.src, schedule, cfg, nimg, n, order=self.data_order).images
        dst = peek(self.dst, schedule, cfg, nimg, n, stream=ORDER_B, xflip=False, order=self.dst_order).images
        draws = [d[:n] for d in _draws(schedule.phase_at(nimg).batch, cfg.train.seed, cfg.swap, nimg)]
        with torch.no_grad():
            sides = self.sides((src, dst, *draws), torch.device("cpu"))
        cells = []
        for row in range(n):
            for side, (warped, target, mask, _) in zip(("src", "dst"), sides):
                for what, x in (("in", warped[:, :3]), ("target", target), ("mask", mask)):
                    image = (x[row].float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
                    cells.append((image, [(f"{side} {what}", BLACK)]))
        return captioned_sheet(cells, ncol=6)


def _draws(n: int, seed: int, s: Any, nimg: int) -> tuple[torch.Tensor, ...]:
    """A step's random draws for `n` images at `nimg`: the warp's (src's, then dst's), then src's colour
    draws (ct_mode's and the HSV shift's)."""
    out: list[torch.Tensor] = []
    for side, flip in ((0, s.src_flip), (1, s.dst_flip)):
        out += warp.draw(n, generator(seed, WARP, side, nimg), flip, scale=warp.SAEHD_SCALE)
    return (*out, *color.draw(n, generator(seed, COLOUR, nimg), s.ct_mode, s.random_hsv_power))


def _total_variation_mse(x: torch.Tensor) -> torch.Tensor:
    """DFL's total_variation_mse per sample: squared differences of neighbours, summed per image."""
    x = x.float()
    dy = (x[:, :, 1:, :] - x[:, :, :-1, :]).square().sum(dim=(1, 2, 3))
    dx = (x[:, :, :, 1:] - x[:, :, :, :-1]).square().sum(dim=(1, 2, 3))
    return dy + dx


@torch.no_grad()
def swap_faces(
    model: nn.Module, dst: torch.Tensor, batch: int = 8, color_transfer: str | None = None, first: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """dst faces (uint8 NHWC, any size: resized to the model's) swapped to src: (swapped uint8 NHWC,
    mask uint8 NHW: the src-path mask times the dst-path mask, DFL's merger's "learned-prd*dst").
    `color_transfer`: one of DFL's merger's (color.MERGE_MODES), the swap recoloured like its dst face;
    idt's and sot's draws are keyed by each face's index (`first` + its place in `dst`)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    faces, masks = [], []
    for i in range(0, len(dst), batch):
        x = _float(resize_batch(dst[i : i + batch], model.resolution)[..., :3], device)
        image, mask, dst_mask = model.swap(x)
        if color_transfer:
            kind = "idt" if "idt" in color_transfer else "sot" if "sot" in color_transfer else "none"
            keys = range(first + i, first + i + len(x))
            draws = [color.draw(1, generator(0, COLOUR, k), kind, 0.0, color.MERGE_SOT_BATCH)[0] for k in keys]
            image = color.merge_transfer(
                color_transfer, image.float().clamp(0, 1), x, mask * dst_mask, torch.cat(draws)
            )
        faces.append((image.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu())
        masks.append(((mask * dst_mask).float().clamp(0, 1) * 255).round().to(torch.uint8)[:, 0].cpu())
    model.train(was)
    return torch.cat(faces), torch.cat(masks)


@torch.no_grad()
def preview_sheet(model: nn.Module, src: torch.Tensor, dst: torch.Tensor) -> Image.Image:
    """Rows of src, src reconstructed, dst, dst reconstructed, swapped, swap mask, swap blended into dst."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    res = model.resolution
    s, d = (_float(resize_batch(x, res)[..., :3], device) for x in (src, dst))
    src_rec, _ = model.src(s)
    dst_rec, _ = model.dst(d)
    swapped, mask, dst_mask = model.swap(d)
    both = (mask * dst_mask).expand(-1, 3, -1, -1)
    blended = swapped * both + d * (1 - both)
    model.train(was)
    columns = [s, src_rec, d, dst_rec, swapped, both, blended]
    grid = torch.stack([c.float().clamp(0, 1) for c in columns], dim=1)  # (rows, 7, 3, H, W)
    rows, cols = grid.shape[:2]
    grid = grid.permute(0, 3, 1, 4, 2).reshape(rows * res, cols * res, 3)
    return Image.fromarray((grid * 255).round().to(torch.uint8).cpu().numpy())
