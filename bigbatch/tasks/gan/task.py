"""The GAN task on the Replicator: each iteration d_steps D steps, each on `batch` real and `batch`
generated images, then one G step; each is one optimizer step accumulated over this rank's
micro-batches (`Replicator.step`, which replays BN statistics alike on every rank); then G_ema updated.

The real images of a step are those at its global positions; z, fake labels and flips are drawn for
the whole step from a stream keyed by the step, and each rank takes its share (positions
rank * share ..), which the Replicator cuts into micro-batches. So a micro-batch sees the same data
whatever rank computes it, and the step sees the same data whatever micro_batch and world size.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from bigbatch.config import Config
from bigbatch.data.loader import Batch, Step, read_batch
from bigbatch.data.schedule import schedule_of
from bigbatch.data.streams import (
    AUG_D,
    AUG_G,
    GP,
    PATH_LENGTH,
    Z_D,
    Z_G,
    GlobalOrder,
    generator,
    host_rows,
    per_row,
    row_seeds,
)
from bigbatch.engine import precision as prec
from bigbatch.engine.ema import make_ema, update_ema
from bigbatch.engine.precision import load_optimizer
from bigbatch.engine.replicator import Replicator
from bigbatch.engine.wrap import to_channels_last
from bigbatch.errors import BigbatchError, warn
from bigbatch.models import contract
from bigbatch.models.layers import set_sn_every_micro_batch, singular_values
from bigbatch.models.registry import is_own
from bigbatch.sampling import BLACK, captioned_sheet, from_uint8, to_uint8
from bigbatch.tasks.gan import losses
from bigbatch.tasks.gan.augment import Augment
from bigbatch.tasks.gan.checks import (
    build_models,
    check_config,
    check_new_gan,
    check_path_length,
    check_stored_size,
    reads_batch_whole,
    warn_built,
    warn_new_gan,
)
from bigbatch.tasks.gan.consistency import FAKE, NEAR_D, NEAR_G, REAL, Consistency, mean_square
from bigbatch.tasks.gan.finetune import freeze_d_blocks, init_from, load_pretrained
from bigbatch.tasks.gan.scorer import Scorer
from bigbatch.tasks.gan.sheets import Sheets
from bigbatch.tasks.interface import BATCH_SHEET, Feed, peek, refuse_face_sets, register


def linear_decay(lr: float, nimg: int, total: int) -> float:
    """train.lr_decay="linear": the learning rate after `nimg` of `total` images, falling to 0 at the end."""
    return lr * max(0.0, 1 - nimg / total)


@register("gan", check=check_config, new_run=check_new_gan, says=warn_new_gan)
def build(cfg: Config, rep: Replicator, data: Any, *, run: Path | None, resumed_at: int | None, quiet: bool) -> GANTask:
    """G, D and G_ema (fine-tuned from train.init_from, FreezeD), prepared by `rep`, with Adam for each."""
    check_stored_size(cfg, data.resolution, getattr(data, "whole", False), getattr(data, "meta", None))
    refuse_face_sets(data, "the GAN task")
    if cfg.model.conditional and not data.n_classes and rep.is_main and resumed_at is None:
        warn(
            f"data set {cfg.data.path} has no classes: G and D are unconditional, whatever model.conditional = true "
            "says (set it to false to say so; a folder of class sub-folders prepares a labelled set)"
        )
    t = cfg.train
    G, D = build_models(cfg, data.n_classes, data.channels)
    if not is_own(cfg.model.name):  # (a user's own family: its contract checked on two inputs)
        n_classes = data.n_classes if cfg.model.conditional else 0
        contract.check_gan(cfg.model.name, G, D, n_classes, data.channels, cfg.data.resolution)
    check_path_length(cfg, G)
    if rep.is_main and resumed_at is None:
        warn_built(cfg, D)
    if t.penalizes_d_gradient:  # (differentiated: no fused attention kernels, which have no double backward)
        for m in D.modules():
            if hasattr(m, "fused_attention"):
                m.fused_attention = False
    if cfg.train.deterministic and rep.device.type == "cuda" and "geom" in cfg.augment.transforms:
        raise BigbatchError(
            "ADA's geom transform (the g of its bgc shorthands) resamples the images with grid_sample, whose CUDA "
            "backward has no deterministic kernel: with train.deterministic = true, leave geom out of augment.policy "
            '(e.g. "blit,color"), or set train.deterministic = false'
        )
    # Fine-tuning starts from pretrained G, D and G_ema with fresh optimizers; FreezeD fixes D's first blocks.
    fine_tune = t.init_from and resumed_at is None
    pretrained = init_from(t.init_from, G, D, cfg.model.name, rep.is_main, quiet) if fine_tune else None
    freeze_d_blocks(D, t.freeze_d)
    G_ema = make_ema(G.train())  # from the plain G, before the engine wraps it
    if pretrained is not None:
        load_pretrained(G_ema, pretrained, "G_ema")
    G_train, D_train = rep.prepare(G.train()), rep.prepare(D.train())
    G_ema.to(rep.device)
    if rep.channels_last:  # (G's memory order: the EMA's multi-tensor kernels need equal strides)
        to_channels_last(G_ema, rep.device)
    group = getattr(D, "mbstd_group", 1)  # (StyleGAN2's D groups a micro-batch, one below a group whole)
    if group > 1:
        rep.takes_micro = lambda m: m < group or m % group == 0

    def adam(net: nn.Module, lr: float) -> torch.optim.Optimizer:
        trained = [p for p in net.parameters() if p.requires_grad]
        return torch.optim.Adam(trained, lr=lr, betas=t.betas, eps=t.adam_eps, **prec.optimizer_kernels(rep.device))

    opt_G, opt_D = rep.wrap_optimizer(adam(G, t.g_lr), "G"), rep.wrap_optimizer(adam(D, t.d_lr), "D")
    # Evaluation of G_ema (all ranks: feature extraction is split across them); the best is kept.
    scorer = None
    if cfg.eval.every_kimg and run is not None:
        scorer = Scorer(G_ema, cfg, data, run, resumed_at, quiet or not rep.is_main)
    return GANTask(cfg, rep, data, G_train, D_train, G_ema, opt_G, opt_D, scorer)


class GANTask:
    """G and D trained in turn on the Replicator (see the module docstring); G_ema their average."""

    usage = "Sample with: bigbatch sample {run}"

    def __init__(
        self,
        cfg: Config,
        rep: Replicator,
        data: Any,
        G: nn.Module,
        D: nn.Module,
        G_ema: nn.Module,
        opt_G: torch.optim.Optimizer,
        opt_D: torch.optim.Optimizer,
        scorer: Scorer | None = None,
    ):
        self.cfg, self.rep, self.data = cfg, rep, data
        self.G, self.D, self.G_ema = G, D, G_ema  # G and D as prepared by `rep` (what to call)
        self.opt_G, self.opt_D, self.scorer = opt_G, opt_D, scorer
        t = cfg.train
        self.seed, self.loss, self.d_steps, self.gp = t.seed, t.loss, t.d_steps, t.gp
        self.xflip = cfg.data.xflip
        self.order = GlobalOrder(len(data), self.seed)
        self.n_classes = data.n_classes if cfg.model.conditional else 0
        self.dim_z = self.plain("G").dim_z
        self.augment = Augment(cfg.augment, self.seed)  # D's inputs through DiffAugment's transforms, if asked
        self.resolution = cfg.data.resolution
        # The R1 and R2 weights of the D step under way: gamma / 2 x r1_every on its lazy steps, else 0
        self._r1 = self._r2 = 0.0
        self._pl = 0.0  # the path length weight of the G step under way: pl_weight x pl_every on its lazy steps
        self.pl_mean = 0.0  # the running mean of path lengths
        self.lecam = losses.LeCam(t.lecam, t.lecam_decay, t.lecam_start) if t.lecam else None
        self.consistency = Consistency(t, self.seed)  # CR, bCR, zCR (consistency.py)
        self.g_steps = 0
        # G_ema holds a trained average (a fine-tune's, a converted run's): blended from the first step, not copied
        # from G until train.ema_start_kimg (found from outside: a BigGAN fine-tune replaced it with G for 20k steps),
        # and at its full half-life: train.ema_rampup off, as StyleGAN2-ADA's resume turns it off
        self.ema_pretrained = bool(t.init_from)
        self.total = t.images
        # What each step trains is what its optimizer holds: frozen blocks (FreezeD) stay frozen.
        self._trained = {
            "G": [p for g in self.opt_G.param_groups for p in g["params"]],
            "D": [p for g in self.opt_D.param_groups for p in g["params"]],
        }
        # Spectral norm's power iteration: once per optimizer step, armed by the engine on what it prepared
        # (model.sn_update "micro": per micro-batch).
        for net in ("G", "D"):
            set_sn_every_micro_batch(self.plain(net), cfg.model.sn_update == "micro")
        self._sheets = Sheets(cfg.sample, self.dim_z, self.n_classes)
        # D reads real and fake images as one batch (BigGAN-PyTorch's G_D: larger convolutions, one weight
        # normalisation and cast), unless its statistics across the batch must see them apart
        self._joint_d = not reads_batch_whole(self.plain("D"))
        # An auxiliary classifier in D (model.options.d_cond "AC"): its logits beside each image's, trained on the real
        # images' classes in D's step and on the fakes' in G's, at train.cond_lambda (StudioGAN's ACGAN)
        self._classify = getattr(getattr(self.plain("D"), "classify", None), "holds_classes", False)  # (layers.py's)
        self._adc = self._classify and getattr(self.plain("D").classify, "discriminative", False)  # (ADCGAN's)

    @property
    def steps(self) -> int:
        """Iterations done (one G step each)."""
        return self.g_steps

    def plain(self, name: str) -> nn.Module:
        """G or D as a plain model (what is saved)."""
        return self.rep.unwrap(self.G if name == "G" else self.D)

    # ---- one iteration -------------------------------------------------------------------------
    def step(self, feed: Feed) -> dict[str, float]:
        """d_steps D steps on the feed's next batches, one G step (BN statistics of momentum=None averaged
        over ranks), G_ema updated. The D steps' values are reported as their mean; a skipped step's are not."""
        before = feed.nimg
        if self.cfg.train.lr_decay == "linear":  # by images seen, so a resumed run continues the same schedule
            for opt, lr in ((self.opt_G, self.cfg.train.g_lr), (self.opt_D, self.cfg.train.d_lr)):
                for group in opt.param_groups:
                    group["lr"] = linear_decay(lr, before, self.total)
        taken: dict[str, list[float]] = {}  # each D step's values: the iteration's are their means (ADA's r_t too)
        for _ in range(self.d_steps):
            real = feed.next()
            out = self.d_step(real.nimg, real)
            if not self.rep.skipped(self.opt_D):
                for k, v in out.items():
                    taken.setdefault(k, []).append(v)
                if self.augment.on:  # ADA: p follows r_t = E[sign(D(real))], the step's over all ranks
                    self.augment.observe(out["D_real_sign"], self.rep.batch)
        stats = {k: sum(v) / len(v) for k, v in taken.items()}
        out = self.g_step(self.g_steps, real)  # (RpGAN's G pairs its images with the last D step's real ones)
        stats.update({} if self.rep.skipped(self.opt_G) else out)
        G, D = self.plain("G"), self.plain("D")
        if hasattr(G, "track_w_avg"):  # StyleGAN2's w_avg, from the whole step's latents: alike on every rank
            G.track_w_avg(*self._step_latents(Z_G, self.g_steps))
        self.g_steps += 1
        self.rep.average_running_stats(G)
        self.rep.average_running_stats(D)
        t = self.cfg.train
        average = t.ema_buffers == "average"
        update_ema(
            self.G_ema,
            G,
            feed.nimg,
            feed.nimg - before,
            t.ema_halflife_kimg,
            0.0 if self.ema_pretrained else t.ema_start_kimg,
            # (a pretrained G_ema is not ramped up from the fine-tune's first image: its first step would copy G
            # over it; StyleGAN2-ADA turns ema_rampup off on a resume, whose image count starts at 0)
            0.0 if self.ema_pretrained else t.ema_rampup,
            average,
        )
        if self.augment.on:
            stats["augment_p"] = self.augment.p
        return stats

    def _train_only(self, net: str) -> None:
        for name, params in self._trained.items():
            for p in params:
                p.requires_grad_(name == net)

    def _ortho(self, net: nn.Module, beta: float) -> torch.Tensor | float:
        return beta * losses.ortho_penalty(self.rep.unwrap(net)) if beta else 0.0

    def _share(self, t: torch.Tensor | None) -> torch.Tensor | None:
        share = self.rep.share
        return None if t is None else t[self.rep.rank * share : (self.rep.rank + 1) * share]

    def _step_latents(self, stream: int, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The whole step's z and labels (every rank draws them all: cheap)."""
        g = generator(self.seed, stream, step)
        z = torch.randn(self.rep.batch, self.dim_z, generator=g)
        y = torch.randint(self.n_classes, (self.rep.batch,), generator=g) if self.n_classes else None
        return z, y

    def _latents(self, stream: int, step: int, near: int | None = None) -> tuple:
        """This rank's share of the step's z (a host part of the batch: see _fake) and labels, and of latents near z
        (zCR: `near` the kind of draw, NEAR_D or NEAR_G; else None)."""
        z, y = self._step_latents(stream, step)
        z_near = None if near is None else self._share(self.consistency.nearby(z, near, step)).numpy()
        return self._share(z).numpy(), self._share(y), z_near

    def _fake(self, z: np.ndarray, y: torch.Tensor | None, keys: np.ndarray | None = None, **kw: Any) -> Any:
        """G's images of latents `z` (the host's copy), copied to the device without waiting on it; a G that
        draws per image (StyleGAN2's noise and mixing) keys its draws by `z` on the host, not by reading the
        device's copy back, which would wait for the device's queue and leave it idle while the host draws;
        or by `keys` (zCR's nearby latents take the draws of the latents they are near)."""
        G = self.plain("G")
        with G.keyed(z if keys is None else keys) if hasattr(G, "keyed") else nullcontext():
            return self.G(torch.from_numpy(z).to(self.rep.device, non_blocking=True), y, **kw)

    def request(self, nimg: int) -> Step:
        """This rank's data request for the D step at `nimg` (what a RankSampler over `order` yields)."""
        offset = self.rep.rank * self.rep.share
        return Step(nimg, self.rep.batch, 0, offset, self.order.indices(nimg + offset, self.rep.share))

    def _transforms(self, stream: int, *keys: int) -> np.ndarray | None:
        """This rank's share of the step's augmentation parameters (None without [augment]): a host part of
        the batch, where ADA reads which images each transform moves."""
        if not self.augment.on:
            return None
        return self._share(self.augment.draw(self.rep.batch, self.resolution, stream, *keys)).numpy()

    def d_batch(self, nimg: int, real: Batch | None = None) -> tuple:
        """This rank's share of the D step at `nimg`: real images (uint8 NHWC, x-flipped if asked), their
        labels, z, fake labels, the transforms of the real and of the fake images ([augment]; None
        without), CR's of each, zCR's nearby latents, train.gp's mix of each real image with the fake one beside it
        (None where off). `real`: the step's Batch as a Feed read it ahead; else read here, with the same result."""
        if real is None:
            real = read_batch(self.data, self.request(nimg), self.xflip, self.seed)
        z, y_fake, z_near = self._latents(Z_D, nimg, NEAR_D if self.consistency.d else None)
        aug_real, aug_fake = self._transforms(AUG_D, nimg, 0), self._transforms(AUG_D, nimg, 1)
        cr = (self._share(self.consistency.draw(self.rep.batch, self.resolution, nimg, w)) for w in (REAL, FAKE))
        cr_real, cr_fake = (None if t is None else t.numpy() for t in cr)
        labels = real.labels if self.n_classes else None
        if labels is not None and self.loss == "rpgan":  # (R3GAN's pairs: each fake of its real image's class)
            y_fake = labels
        mix = self._share(torch.rand(self.rep.batch, generator=generator(self.seed, GP, nimg))) if self.gp else None
        return real.images, labels, z, y_fake, aug_real, aug_fake, cr_real, cr_fake, z_near, mix

    def _adv(self, out: torch.Tensor) -> torch.Tensor:
        """D's logit of each image in its output `out` (the first column, beside an auxiliary classifier's)."""
        return out[:, 0] if self._classify else out

    def _judge(self, *parts: tuple[torch.Tensor, torch.Tensor | None]) -> list[torch.Tensor]:
        """D's outputs (float32) on each part's images and labels: in one batch where D reads them so (_joint_d)."""
        if not self._joint_d:
            return [self.D(x, y).float() for x, y in parts]
        y = None if parts[0][1] is None else torch.cat([y for _, y in parts])
        return list(self.D(torch.cat([x for x, _ in parts]), y).float().split([len(x) for x, _ in parts]))

    def d_loss(self, micro: tuple) -> dict[str, torch.Tensor]:
        images, y_real, z, y_fake, aug_real, aug_fake, cr_real, cr_fake, z_near, mix = micro
        real = read = from_uint8(images)
        shown = real.requires_grad_() if self._r1 else real  # R1: D's gradient with respect to the real images
        with torch.no_grad():
            fake = self._fake(z, y_fake).to(real.dtype)
            near = None if z_near is None else self._fake(z_near, y_fake, keys=z).to(real.dtype)
        made = fake.requires_grad_() if self._r2 else fake  # R2: with respect to the fake ones
        # CR's copies (of the images as read), zCR's images of nearby latents (as their G(z)'s, augmented alike)
        copies = [(self.consistency.copy(x, t), y) for x, y, t in ((real, y_real, cr_real), (fake, y_fake, cr_fake))]
        if aug_real is not None:
            real, fake = self.augment(real, aug_real), self.augment(fake, aug_fake)
            near = None if near is None else self.augment(near, aug_fake)
        extra = [(x, y) for x, y in (*copies, (near, y_fake)) if x is not None]
        # R1, R2 and the gradient penalty differentiate D's gradient, and the fused attention kernels (flash, memory-
        # efficient, cuDNN) have no derivative of their backward: their steps run attention as its products' composite.
        with sdpa_kernel(SDPBackend.MATH) if self._penalized else nullcontext():
            outs = self._judge((real, y_real), (fake, y_fake), *extra)
            logits_real, logits_fake, *judged = map(self._adv, outs)
            judge = lambda x: self._adv(self.D(x, y_real))  # noqa: E731 (what the gradient penalty differentiates)
            gp = None if mix is None else losses.gradient_penalty(judge, read, made, mix)
        adversarial = losses.D_LOSS[self.loss](logits_real, logits_fake)
        ortho = self._ortho(self.D, self.cfg.train.d_ortho)
        loss, lecam = adversarial + ortho, None
        if self.lecam is not None and (lecam := self.lecam.penalty(logits_real, logits_fake, self.g_steps)) is not None:
            loss = loss + self.lecam.weight * lecam
        out = {"loss": loss, "D_real": logits_real.detach().mean(), "D_fake": logits_fake.detach().mean()}
        for name, (weight, penalty) in self.consistency.d_penalties(logits_real, logits_fake, judged).items():
            out["loss"] = out["loss"] + weight * penalty
            out[name] = penalty.detach()  # (unweighted, as r1_penalty)
        # (logged: the adversarial loss, as ADA's Loss/D/loss and BigGAN-PyTorch's D_loss; R1, LeCam, CR and the
        # orthogonal regularization apart: found from outside, ortho's in loss_D)
        # The classifier's cross-entropy (unweighted, as r1_penalty): of the reals' classes; ADC's of twice the classes,
        # class c 2c of a real image and 2c + 1 of a fake, of the fakes' too.
        classes = [("ac_real", outs[0], y_real)] if self._classify else []
        for name, judged, y in classes + ([("adc_fake", outs[1], y_fake)] if self._adc else []):
            classified = F.cross_entropy(judged[:, 1:], 2 * y + (name == "adc_fake") if self._adc else y)
            out["loss"], out[name] = out["loss"] + self.cfg.train.cond_lambda * classified, classified.detach()
        if torch.is_tensor(ortho) or self._penalized or lecam is not None or extra or self._classify:
            out["loss_D"] = adversarial.detach()
        if gp is not None:  # (unweighted, as r1_penalty)
            out["loss"] = out["loss"] + self.gp * gp
            out["gp_penalty"] = gp.detach()
        if lecam is not None:  # (unweighted, as r1_penalty)
            out["lecam_penalty"] = lecam.detach()
        if torch.is_tensor(ortho):
            out["ortho_D"] = ortho.detach()
        for name, weight, logits, images in (("r1", self._r1, logits_real, shown), ("r2", self._r2, logits_fake, made)):
            if weight:
                penalty = losses.r1_penalty(logits, images)
                out["loss"] = out["loss"] + weight * penalty
                out[f"{name}_penalty"] = penalty.detach()
        if aug_real is not None:  # ADA's r_t
            out["D_real_sign"] = logits_real.detach().sign().mean()
        return out

    def d_step(self, nimg: int, real: Batch | None = None) -> dict[str, float]:
        """One D optimizer step on the real images at positions nimg .. nimg + batch - 1 (`real`: this
        rank's share of them as a Feed read it)."""
        self._train_only("D")
        t = self.cfg.train
        index = self.rep.steps(self.opt_D)  # D steps before this one (resumed with the engine's state)
        lazy = t.r1_every if index % t.r1_every == 0 else 0
        self._r1, self._r2 = t.r1_gamma / 2 * lazy, t.r2_gamma / 2 * lazy
        try:
            with self._eager_if(self._penalized):
                out = self.rep.step(self.d_loss, self.d_batch(nimg, real), self.opt_D)
        finally:
            self._r1 = self._r2 = 0.0
        if self.lecam is not None and not self.rep.skipped(self.opt_D):  # (the step's means, over every rank)
            self.lecam.observe(out["D_real"], out["D_fake"], self.g_steps)
        total = out.pop("loss")  # (with R1's scaled penalty on its lazy steps: found from outside, loss_D leapt then)
        return {"loss_D": out.pop("loss_D", total), **out, "grad_norm_D": self.rep.grad_norm(self.opt_D)}

    _penalized = property(lambda self: bool(self._r1 or self._r2 or self.gp))  # (D's gradient, in the D step under way)

    def _eager_if(self, regularized: float) -> AbstractContextManager:
        """Compiled models run eagerly for a step that penalizes a gradient (R1, R2, train.gp, path lengths): a double
        backward, which torch.compile does not support (R1's, R2's and path lengths' are lazy, a step in so many)."""
        return torch.compiler.set_stance("force_eager") if regularized and self.rep.compile else nullcontext()

    def g_batch(self, step: int, real: Batch | None = None) -> tuple:
        """This rank's share of the G step: z, labels, zCR's nearby latents (None without train.zcr_g), transforms and,
        on a path length step, which images it regularizes (those at global positions that are multiples of
        train.pl_batch_shrink); with train.loss "rpgan", the real images its fakes are paired with (`real`, the last D
        step's as a Feed read them; else those of D step 0, whose labels the fakes take) and their transforms (else
        None)."""
        regularized = None
        if self._pl:
            regularized = self._share(torch.arange(self.rep.batch) % self.cfg.train.pl_batch_shrink == 0).numpy()
        latents = self._latents(Z_G, step, NEAR_G if self.consistency.g else None)
        paired: tuple = (None, None)
        if self.loss == "rpgan":
            if real is None:
                real = read_batch(self.data, self.request(0), self.xflip, self.seed)
            paired = (real.images, self._transforms(AUG_G, step, 1))
            if self.n_classes:  # (each fake of the class of the real image it is paired with, as R3GAN's)
                latents = (latents[0], real.labels, latents[2])
        return *latents, self._transforms(AUG_G, step), regularized, *paired

    def g_loss(self, micro: tuple) -> torch.Tensor | dict[str, torch.Tensor]:
        z, y, z_near, aug, regularized, images, aug_real = micro
        fake = self._fake(z, y)
        # zCR: G's images of nearby latents, pushed apart
        distance = None if z_near is None else mean_square(fake, self._fake(z_near, y, keys=z))
        if aug is not None:
            fake = self.augment(fake, aug)
        judged = self.D(fake, y).float()
        logits = self._adv(judged)
        if self.loss != "rpgan":
            adversarial = losses.G_LOSS[self.loss](logits)
        else:  # (RpGAN: D's outputs on the real images, which D's weights, not trained here, take no gradient from)
            real = from_uint8(images) if aug_real is None else self.augment(from_uint8(images), aug_real)
            with torch.no_grad():
                logits_real = self._adv(self.D(real, y).float())  # (y: the real images' labels, the fakes' too)
            adversarial = losses.g_relativistic(logits, logits_real)
        ortho = self._ortho(self.G, self.cfg.train.g_ortho)
        loss = adversarial + ortho
        apart = {"ortho_G": ortho.detach()} if torch.is_tensor(ortho) else {}
        if self._classify:  # (unweighted, as r1_penalty; ADC's: G's fakes toward their real class, from their own)
            classified = F.cross_entropy(judged[:, 1:], y * (2 if self._adc else 1))
            classified = classified - F.cross_entropy(judged[:, 1:], 2 * y + 1) if self._adc else classified
            loss, apart["ac_fake"] = loss + self.cfg.train.cond_lambda * classified, classified.detach()
        if distance is not None:
            loss = loss - self.consistency.g * distance
            apart["zcr_g_distance"] = distance.detach()
        if apart:
            apart["loss_G"] = adversarial.detach()
        if regularized is None:
            return {"loss": loss, **apart} if apart else loss
        rows = torch.from_numpy(regularized.nonzero()[0]).to(self.rep.device, non_blocking=True)
        penalty, lengths = self._path_length(z[regularized], None if y is None else y[rows])
        # Sums over this micro-batch's regularized images, scaled so that the step's gradient is that of
        # the mean over all of the step's (the engine divides each micro-batch by batch / len(z)).
        per_image = self.rep.batch / len(z) / self._pl_images()
        return {
            "loss": loss + self._pl * per_image * penalty,
            "loss_G": adversarial.detach(),
            **apart,
            "pl_penalty": penalty.detach() * per_image,
            "pl_length": lengths * per_image,
        }

    def _pl_images(self) -> int:
        """How many of a step's images path length regularization sees."""
        return -(-self.rep.batch // self.cfg.train.pl_batch_shrink)

    def _path_length(self, z: np.ndarray, y: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """StyleGAN2's path length penalty, summed over these images, and the sum of their lengths
        |J_w^T r|, r each image's own random image of std 1 / sqrt(pixels) (seeded by its z, on the host)."""
        if not len(z):
            return torch.zeros((), device=self.rep.device), torch.zeros((), device=self.rep.device)
        images, ws = self._fake(z, y, return_ws=True)
        n, c, h, w = images.shape
        noise = host_rows(n, (c, h, w), images.device)
        seeds = row_seeds(torch.from_numpy(z), PATH_LENGTH)
        per_row(seeds, lambda i, g: torch.randn(c, h, w, generator=g, out=noise[i]), c * h * w)
        noise = noise.to(images.device, non_blocking=True) / math.sqrt(h * w)
        (grads,) = torch.autograd.grad((images.float() * noise).sum(), ws, create_graph=True)
        lengths = grads.float().square().sum(dim=2).mean(dim=1).sqrt()
        return (lengths - self.pl_mean).square().sum(), lengths.detach().sum()

    def g_step(self, step: int, real: Batch | None = None) -> dict[str, float]:
        """One G optimizer step on `batch` fresh draws of z and labels (path length regularized on its lazy
        steps, whose mean length then moves the running mean); `real`: RpGAN's real images (g_batch)."""
        self._train_only("G")
        t = self.cfg.train
        self._pl = t.pl_weight * t.pl_every if t.pl_weight and step % t.pl_every == 0 else 0.0
        try:
            with self._eager_if(self._pl):
                out = self.rep.step(self.g_loss, self.g_batch(step, real), self.opt_G)
        finally:
            self._pl = 0.0
        self._train_only("D")
        stats = {"grad_norm_G": self.rep.grad_norm(self.opt_G)}
        if not isinstance(out, dict):
            return {"loss_G": out, **stats}
        said = {k: out[k] for k in ("loss_G", "ortho_G", "zcr_g_distance", "ac_fake") if k in out}  # (terms apart)
        if "pl_length" not in out:
            return {**said, **stats}
        # The engine's mean over micro-batches and ranks of each one's scaled sums: the step's means.
        if not self.rep.skipped(self.opt_G):
            self.pl_mean += t.pl_decay * (out["pl_length"] - self.pl_mean)
        return {**said, **stats, "pl_penalty": out["pl_penalty"], "pl_length": out["pl_length"]}

    def probe(self, m: int) -> None:
        """One D and one G forward/backward at micro-batch m (for micro_batch="auto")."""
        head: Any = lambda batch: tuple(None if t is None else t[:m] for t in batch)
        self._train_only("D")
        self._r1, self._r2 = float(self.cfg.train.r1_gamma), float(self.cfg.train.r2_gamma)  # (the costliest steps)
        self._pl = float(self.cfg.train.pl_weight)
        p, self.augment.p = self.augment.p, self.augment.highest_p  # every transform on that p can turn on
        try:
            self.rep.probe_step(self.d_loss, head(self.d_batch(0)))
            self.opt_D.zero_grad(set_to_none=True)
            self._train_only("G")
            self.rep.probe_step(self.g_loss, head(self.g_batch(0)))
        finally:
            self._r1, self._r2, self._pl, self.augment.p = 0.0, 0.0, 0.0, p
        self.opt_G.zero_grad(set_to_none=True)
        self._train_only("D")

    def monitored(self) -> tuple[dict[str, float], dict[str, float]]:
        """What a log row adds of the models' state: the largest sigma of G's and of D's spectrally normalized layers
        (sv_max_G, sv_max_D), and each layer's by "G/<layer>" for TensorBoard (BigGAN-PyTorch's SV log, StudioGAN's
        SN_of_dis: found from outside, unlogged); none of a model without spectral norm."""
        sigmas = {f"{net}/{name}": s for net in ("G", "D") for name, s in singular_values(self.plain(net)).items()}
        if not sigmas:
            return {}, {}
        each = dict(zip(sigmas, torch.stack(list(sigmas.values())).tolist()))  # (one read of the device)
        largest: dict[str, float] = {}
        for key, sigma in each.items():
            name = f"sv_max_{key.split('/', 1)[0]}"
            largest[name] = max(largest.get(name, sigma), sigma)
        return largest, each

    # ---- checkpoints and previews --------------------------------------------------------------
    def nets(self) -> dict[str, nn.Module]:
        return {"G": self.plain("G"), "D": self.plain("D"), "G_ema": self.G_ema}

    def state_dict(self) -> dict[str, Any]:
        state = {"g_steps": self.g_steps, "opt_G": self.opt_G.state_dict(), "opt_D": self.opt_D.state_dict()}
        if self.cfg.train.pl_weight:
            state["pl_mean"] = self.pl_mean
        if self.augment.on:
            state["augment"] = self.augment.state_dict()
        if self.lecam is not None:
            state["lecam"] = self.lecam.state_dict()
        if self.ema_pretrained:
            state["ema_pretrained"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # `convert`'s checkpoint holds weights brought from elsewhere, without their optimizers' moments: these start
        # afresh (found from outside: its --resume failed on the missing opt_G)
        if "opt_G" in state or "converted_from" not in state:
            load_optimizer(self.opt_G, state["opt_G"])
            load_optimizer(self.opt_D, state["opt_D"])
        self.ema_pretrained = self.ema_pretrained or bool(state.get("ema_pretrained"))
        self.g_steps = int(state["g_steps"])
        self.pl_mean = float(state.get("pl_mean", 0.0))
        if self.augment.on and "augment" in state:
            self.augment.load_state_dict(state["augment"])
        if self.lecam is not None:  # (train.lecam is the run's own: a resume may not turn it on or off)
            self.lecam.load_state_dict(state["lecam"])

    def model_info(self) -> dict[str, Any]:
        info = {"n_classes": self.n_classes, "img_channels": self.data.channels, "class_names": self.data.class_names}
        if self.augment.on and self.augment.target:  # ADA's p where the checkpoint is (what `info` shows of it)
            info["augment_p"] = self.augment.p
        return info

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]:
        return self._sheets(self.G_ema, at_checkpoint)

    def batch_sheet(self, nimg: int) -> Image.Image:
        """The first real images of the D step at `nimg` as D receives them (flipped where drawn, through
        [augment]'s transforms at the p in force), under their class names when G is conditional."""
        real = peek(self.data, schedule_of(self.cfg), self.cfg, nimg, BATCH_SHEET)
        images = real.images
        if self.augment.on:
            params = self.augment.draw(schedule_of(self.cfg).phase_at(nimg).batch, self.resolution, AUG_D, nimg, 0)
            images = to_uint8(self.augment(from_uint8(images), params[: len(images)]))
        names = self.data.class_names
        captions = [[(names[int(y)], BLACK)] if self.n_classes else [] for y in real.labels]
        return captioned_sheet(list(zip(images, captions)))
