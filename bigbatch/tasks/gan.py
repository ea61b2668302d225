"""The GAN task: a D step on `batch` real and `batch` generated images, then a G step, each an
optimizer step accumulated over this rank's micro-batches.

The real images of a step are those at its global positions; z, fake labels and flips are drawn for
the whole step from a stream keyed by the step, and each micro-batch takes its slice. So a micro-batch
sees the same data whatever rank computes it, and the step sees the same data whatever micro_batch
and world size split it.
Each micro-batch loss is a mean over its images divided by the accumulation, so the summed
gradient is the gradient of the mean loss over the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bigbatch import losses
from bigbatch.data.builtin import ImageData
from bigbatch.data.sampler import FLIP, Z_D, Z_G, GlobalOrder, generator
from bigbatch.engine.plan import Plan
from bigbatch.models.layers import set_sn_update


@dataclass
class GANTask:
    G: nn.Module
    D: nn.Module
    opt_G: torch.optim.Optimizer
    opt_D: torch.optim.Optimizer
    data: ImageData
    plan: Plan
    seed: int
    loss: str = "hinge"
    conditional: bool = True
    xflip: bool = False
    sn_update: str = "step"

    def __post_init__(self) -> None:
        self.order = GlobalOrder(len(self.data), self.seed)
        self.device = torch.device(self.plan.device)
        self.n_classes = self.data.n_classes if self.conditional else 0

    def _latents(self, stream: int, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """z and labels of the whole step (every rank draws them all: batch x dim_z numbers is cheap)."""
        g = generator(self.seed, stream, step)
        z = torch.randn(self.plan.batch, self.G.dim_z, generator=g)
        y = torch.randint(self.n_classes, (self.plan.batch,), generator=g) if self.n_classes else None
        return z, y

    def _slice(self, t: torch.Tensor | None, j: int) -> torch.Tensor | None:
        m = self.plan.micro_batch
        return None if t is None else t[j * m : (j + 1) * m].to(self.device)

    def _reals(self, nimg: int, j: int, flips: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        m = self.plan.micro_batch
        images, labels = self.data.get(self.order.indices(nimg + j * m, m))
        x = images.to(self.device).permute(0, 3, 1, 2).float() / 127.5 - 1
        if flips is not None:
            x = torch.where(self._slice(flips, j)[:, None, None, None], x.flip(3), x)
        return x, labels.to(self.device) if self.n_classes else None

    def _power_iteration(self, nets: tuple[nn.Module, ...], first: bool) -> None:
        # "step": power iteration on the first forward of each optimizer step, as the full batch would;
        # "micro": on every micro-batch, as BigGAN-PyTorch does under accumulation.
        for net in nets:
            set_sn_update(net, first or self.sn_update == "micro")

    def d_step(self, nimg: int) -> dict[str, float]:
        """One D optimizer step on the real images at positions nimg .. nimg + batch - 1."""
        self.G.requires_grad_(False)
        self.D.requires_grad_(True)
        acc = self.plan.accumulation
        stats = torch.zeros(3, device=self.device)
        zs, ys = self._latents(Z_D, nimg)
        flips = torch.rand(self.plan.batch, generator=generator(self.seed, FLIP, nimg)) < 0.5 if self.xflip else None
        for i, j in enumerate(self.plan.micro_indices()):
            real, y_real = self._reals(nimg, j, flips)
            z, y_fake = self._slice(zs, j), self._slice(ys, j)
            self._power_iteration((self.G, self.D), i == 0)
            with torch.no_grad():
                fake = self.G(z, y_fake)
            logits_real = self.D(real, y_real)
            set_sn_update(self.D, False)  # the fake half belongs to the same forward set
            logits_fake = self.D(fake, y_fake)
            loss = losses.D_LOSS[self.loss](logits_real.float(), logits_fake.float())
            (loss / acc).backward()
            stats += torch.stack([loss.detach(), logits_real.detach().mean(), logits_fake.detach().mean()]) / acc
        self.opt_D.step()
        self.opt_D.zero_grad(set_to_none=True)
        loss_D, d_real, d_fake = stats.tolist()
        return {"loss_D": loss_D, "D_real": d_real, "D_fake": d_fake}

    def g_step(self, step: int) -> dict[str, float]:
        """One G optimizer step on `batch` fresh draws of z and labels."""
        self.G.requires_grad_(True)
        self.D.requires_grad_(False)
        acc = self.plan.accumulation
        total = torch.zeros((), device=self.device)
        zs, ys = self._latents(Z_G, step)
        for i, j in enumerate(self.plan.micro_indices()):
            z, y = self._slice(zs, j), self._slice(ys, j)
            self._power_iteration((self.G, self.D), i == 0)
            loss = losses.G_LOSS[self.loss](self.D(self.G(z, y), y).float())
            (loss / acc).backward()
            total += loss.detach() / acc
        self.opt_G.step()
        self.opt_G.zero_grad(set_to_none=True)
        self.D.requires_grad_(True)
        return {"loss_G": total.item()}
