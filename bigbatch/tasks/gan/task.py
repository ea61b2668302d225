"""The GAN task on the Replicator: a D step on `batch` real and `batch` generated images, then a G
step, each one optimizer step accumulated over this rank's micro-batches (`Replicator.step`).

The real images of a step are those at its global positions; z, fake labels and flips are drawn for
the whole step from a stream keyed by the step, and each rank takes its share (positions
rank * share ..), which the Replicator cuts into micro-batches. So a micro-batch sees the same data
whatever rank computes it, and the step sees the same data whatever micro_batch and world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bigbatch.data.images import ImageData
from bigbatch.data.loader import Batch, Step, read_batch
from bigbatch.data.streams import Z_D, Z_G, GlobalOrder, generator
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError
from bigbatch.tasks.gan import losses


@dataclass
class GANTask:
    rep: Replicator
    G: nn.Module
    """G as prepared by `rep` (what to call); `rep.unwrap(G)` is the plain model."""
    D: nn.Module
    opt_G: torch.optim.Optimizer
    opt_D: torch.optim.Optimizer
    data: ImageData
    seed: int
    loss: str = "hinge"
    conditional: bool = True
    xflip: bool = False
    g_ortho: float = 0.0
    """Orthogonal regularization strength of G (losses.ortho_penalty), 0 = off."""
    d_ortho: float = 0.0

    def __post_init__(self) -> None:
        self.order = GlobalOrder(len(self.data), self.seed)
        self.n_classes = self.data.n_classes if self.conditional else 0
        self.dim_z = self.rep.unwrap(self.G).dim_z
        # What each step trains is what its optimizer holds: frozen blocks (FreezeD) stay frozen.
        self._trained = {
            "G": [p for g in self.opt_G.param_groups for p in g["params"]],
            "D": [p for g in self.opt_D.param_groups for p in g["params"]],
        }

    def _train_only(self, net: str) -> None:
        for name, params in self._trained.items():
            for p in params:
                p.requires_grad_(name == net)

    def _ortho(self, net: nn.Module, beta: float) -> torch.Tensor | float:
        return beta * losses.ortho_penalty(self.rep.unwrap(net)) if beta else 0.0

    def _share(self, t: torch.Tensor | None) -> torch.Tensor | None:
        share = self.rep.share
        return None if t is None else t[self.rep.rank * share : (self.rep.rank + 1) * share]

    def _latents(self, stream: int, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This rank's share of the step's z and labels (every rank draws the whole step: cheap)."""
        g = generator(self.seed, stream, step)
        z = torch.randn(self.rep.batch, self.dim_z, generator=g)
        y = torch.randint(self.n_classes, (self.rep.batch,), generator=g) if self.n_classes else None
        return self._share(z), self._share(y)

    def request(self, nimg: int) -> Step:
        """This rank's data request for the D step at `nimg` (what a RankSampler over `order` yields)."""
        offset = self.rep.rank * self.rep.share
        return Step(nimg, self.rep.batch, 0, offset, self.order.indices(nimg + offset, self.rep.share))

    def d_batch(self, nimg: int, real: Batch | None = None) -> tuple:
        """This rank's share of the D step at `nimg`: real images (uint8 NHWC, x-flipped if asked), their
        labels, z and fake labels. `real` is the step's Batch from a BatchLoader over `request`s (read
        ahead in workers); without it the images are read here, with the same result."""
        if real is None:
            real = read_batch(self.data, self.request(nimg), self.xflip, self.seed)
        elif real.nimg != nimg or len(real.images) != self.rep.share:
            raise BigbatchError(
                f"the loader's batch is for step {real.nimg} ({len(real.images)} images), not for step {nimg} "
                f"({self.rep.share} images per rank)"
            )
        z, y_fake = self._latents(Z_D, nimg)
        return real.images, real.labels if self.n_classes else None, z, y_fake

    def d_loss(self, micro: tuple) -> dict[str, torch.Tensor]:
        images, y_real, z, y_fake = micro
        real = images.permute(0, 3, 1, 2).float() / 127.5 - 1
        with torch.no_grad():
            fake = self.G(z, y_fake)
        logits_real = self.D(real, y_real).float()
        logits_fake = self.D(fake, y_fake).float()
        loss = losses.D_LOSS[self.loss](logits_real, logits_fake) + self._ortho(self.D, self.d_ortho)
        return {"loss": loss, "D_real": logits_real.detach().mean(), "D_fake": logits_fake.detach().mean()}

    def d_step(self, nimg: int, real: Batch | None = None) -> dict[str, float]:
        """One D optimizer step on the real images at positions nimg .. nimg + batch - 1 (`real`: this
        rank's share of them as a BatchLoader read it)."""
        self._train_only("D")
        out = self.rep.step(self.d_loss, self.d_batch(nimg, real), self.opt_D)
        return {"loss_D": out["loss"], "D_real": out["D_real"], "D_fake": out["D_fake"]}

    def g_batch(self, step: int) -> tuple:
        return self._latents(Z_G, step)

    def g_loss(self, micro: tuple) -> torch.Tensor:
        z, y = micro
        return losses.G_LOSS[self.loss](self.D(self.G(z, y), y).float()) + self._ortho(self.G, self.g_ortho)

    def g_step(self, step: int) -> dict[str, float]:
        """One G optimizer step on `batch` fresh draws of z and labels."""
        self._train_only("G")
        loss = self.rep.step(self.g_loss, self.g_batch(step), self.opt_G)
        self._train_only("D")
        return {"loss_G": loss}

    def probe(self, m: int) -> None:
        """One D and one G forward/backward at micro-batch m (for micro_batch="auto")."""
        head: Any = lambda batch: tuple(None if t is None else t[:m] for t in batch)
        self._train_only("D")
        self.rep.probe_step(self.d_loss, head(self.d_batch(0)))
        self.opt_D.zero_grad(set_to_none=True)
        self._train_only("G")
        self.rep.probe_step(self.g_loss, head(self.g_batch(0)))
        self.opt_G.zero_grad(set_to_none=True)
        self._train_only("D")
