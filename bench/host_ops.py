"""The host's share of a GPU step, measured on any machine: how many kernels the parts of a step that run
between the models' graphs launch, and how long the draws StyleGAN2 makes on the host take.

    python bench/host_ops.py                 # SAEHD 512's optimizer, BigGAN-128's G_ema and spectral norm,
                                             # ResNet-50's BatchNorm statistics, StyleGAN2's draws, the GPU
                                             # decode's crops
    python bench/host_ops.py --quick         # toy sizes (the test suite's run)

Launches are counted as the aten ops dispatched (views excluded: they launch nothing), each at least one
kernel launch on a GPU, where each costs the host some microseconds whatever its size: on meta tensors
(shapes without data), so the count is the GPU's and no memory is used (the BatchNorm and spectral norm rows on CPU
tensors: the replay reads counts back, and autocast takes no meta device). A multi-tensor (_foreach_) op is one
dispatch and a launch per block of tensors on a GPU. Each row gives the layout the CPU runs (what a GPU ran
before) beside the one a GPU now runs. StyleGAN2's draws are timed here, one thread against the pool
bigbatch.data.streams.per_row uses (a ratio of one run; the machine's cores decide it).
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from unittest import mock

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import bigbatch
from bigbatch.engine import running_stats
from bigbatch.engine.ema import make_ema, update_ema
from bigbatch.models.layers import SpectralNorm
from bigbatch.models.saehd import SAEHD
from bigbatch.tasks.swap import optim


class Launches(TorchDispatchMode):
    """Counts the aten ops dispatched under it, views excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 -- torch's signature
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def launches(fn) -> int:  # noqa: ANN001
    with Launches() as counter:
        fn()
    return counter.count


def saehd_optimizer(res: int, dims: tuple[int, int, int, int]) -> list[str]:
    with torch.device("meta"):
        model = SAEHD(res, "df-ud", ae_dims=dims[0], e_dims=dims[1], d_dims=dims[2], d_mask_dims=dims[3])
    params = list(model.parameters())
    counts = []
    for cpu in (True, False):  # the CPU's layout (cache-sized pieces, one at a time), then the GPU's
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = optim.AdaBelief(params, lr=5e-5)
        opt.step()  # (the moments made)
        with mock.patch.object(optim, "_on_device", optim._on_cpu) if cpu else nullcontext():
            counts.append(launches(opt.step))
    n = sum(p.numel() for p in params)
    return [f"SAEHD {res} px df-ud {'/'.join(map(str, dims))}: AdaBelief step", f"{n / 1e6:.0f}M in {len(params)}",
            f"{counts[0]:,}", f"{counts[1]:,}"]  # fmt: skip


def g_ema(res: int, ch: int) -> list[str]:
    G, _ = bigbatch.models.create("biggan", res, 1000, ch=ch, dim_z=120)
    G = G.to("meta")
    ema = make_ema(G)

    def loop() -> None:  # the update before: a tensor at a time
        for p_ema, p in zip(ema.parameters(), G.parameters()):
            p_ema.copy_(p.detach().lerp(p_ema, 0.99))
        for b_ema, b in zip(ema.buffers(), G.buffers()):
            b_ema.copy_(b)

    with torch.no_grad():
        per_tensor = launches(loop)
    now = launches(lambda: update_ema(ema, G, 10_000, 256, 10.0, 0.0))
    n = sum(p.numel() for p in G.parameters())
    return [f"BigGAN {res} px ch {ch}: G_ema update", f"{n / 1e6:.0f}M in {len(list(G.parameters()))}",
            f"{per_tensor:,}", f"{now:,}"]  # fmt: skip


def power_iterations(res: int, ch: int) -> list[str]:
    """Spectral norm's power iterations of G's and D's layers before a step: a layer at a time (F.normalize and
    copies into u and v, as each layer's before_micro_batch ran them before 1a0796a) against all at once
    (SpectralNorm.before_micro_batches, what the engine calls)."""
    nets = bigbatch.models.create("biggan", res, 1000, ch=ch, dim_z=120)
    layers = [m for net in nets for m in net.modules() if isinstance(m, SpectralNorm)]

    @torch.no_grad()
    def one_at_a_time() -> None:
        for m in layers:
            w = m.weight.flatten(1)
            v = F.normalize(m.sn_u @ w, dim=1, eps=m.sn_eps)
            m.sn_u.copy_(F.normalize(v @ w.t(), dim=1, eps=m.sn_eps))
            m.sn_v.copy_(v)

    alone = launches(one_at_a_time)
    now = launches(lambda: SpectralNorm.before_micro_batches(layers, 0))
    return [f"BigGAN {res} px ch {ch}: spectral norm's power iterations, a step", f"{len(layers)} layers",
            f"{alone:,}", f"{now:,}"]  # fmt: skip


def batchnorm_statistics(arch: str, ch: int) -> list[str]:
    """The engine's capture and replay of BatchNorm statistics around a step of one micro-batch (running_stats:
    the statistics before the step kept, replayed after it). Its copies were made a tensor at a time before
    (ResNet-50: 445 ops a step at 5e23e2f); there is no other way here to count, so the row has no "before"."""
    model = bigbatch.models.create_classifier(arch, 1000, ch=ch)
    bns = running_stats.captured([model])

    def cycle() -> None:
        step = running_stats.StepStatistics(bns)
        step.micro_batch()
        step.end(torch.cat(step.close()).tolist())

    return [f"{arch} ch {ch}: BatchNorm statistics kept and replayed, a step", f"{len(bns)} BatchNorms", "-",
            f"{launches(cycle):,}"]  # fmt: skip


def stylegan2_draws(res: int, batch: int, quick: bool) -> list[str]:
    cfg = bigbatch.preset("stylegan2_256")
    ch = 4 if quick else cfg.model.ch
    G, _ = bigbatch.models.create("stylegan2", res, 0, ch=ch, dim_z=cfg.model.dim_z, **cfg.model.options)
    G.train()
    z = torch.randn(batch, cfg.model.dim_z)

    def best(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * min(times)

    def in_turn(seeds: list[int], draw, numbers: int):  # noqa: ANN001, ANN202 -- per_row in one thread
        return [draw(i, torch.Generator().manual_seed(s)) for i, s in enumerate(seeds)]

    threaded = best(lambda: G._draws(z, True, True))
    with mock.patch("bigbatch.models.stylegan2.per_row", in_turn):
        alone = best(lambda: G._draws(z, True, True))
    noise = sum(layer.resolution**2 for layer in G._layers()) * batch
    return [f"StyleGAN2 {res} px, batch {batch}: noise and mixing draws", f"{noise / 1e6:.1f}M numbers",
            f"{alone:.0f} ms (one thread)", f"{threaded:.0f} ms ({alone / threaded:.2f}x, the pool)"]  # fmt: skip


def device_crops(n: int, out: int, quick: bool) -> list[str]:
    """data.decode = "gpu"'s cuts, resizes and flips of a step's crops (the loader's random-resized crops, of
    256 x 340 images): one region at a time (F.interpolate each, as the Feed did before ef29df3) against
    bigbatch.data.device_resize."""
    import numpy as np

    from bigbatch.data.crops import rrc_box, rrc_draws
    from bigbatch.data.device_resize import resized

    h, w = (64, 85) if quick else (256, 340)
    images = [torch.empty(3, h, w, dtype=torch.uint8, device="meta") for _ in range(n)]
    boxes = [rrc_box(w, h, draws, 0.08) for draws in rrc_draws(0, 0, n)]  # (left, top, width, height)
    regions = [(top, top + bh, left, left + bw) for left, top, bw, bh in boxes]
    flips = torch.arange(n) % 2 == 1

    def one_at_a_time() -> None:
        x = torch.cat([
            F.interpolate(image[None, :, y0:y1, x0:x1].float(), size=(out, out), mode="bilinear", antialias=True)
            for image, (y0, y1, x0, x1) in zip(images, regions)
        ]).round_().clamp_(0, 255).to(torch.uint8)  # fmt: skip
        torch.where(flips.to(x.device)[:, None, None, None], x.flip(3), x).permute(0, 2, 3, 1).contiguous()

    as_batch = launches(lambda: resized(images, np.array(regions), (out, out), flips, torch.device("meta")))
    return [f"data.decode gpu: {n} crops at {out} px of {h} x {w} images cut, resized and mirrored", "-",
            f"{launches(one_at_a_time):,} (one region at a time)", f"{as_batch:,}"]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="toy sizes (the test suite's run)")
    args = p.parse_args()
    rows = [
        saehd_optimizer(64, (32, 16, 16, 8)) if args.quick else saehd_optimizer(512, (320, 64, 72, 22)),
        g_ema(32, 8) if args.quick else g_ema(128, 96),
        power_iterations(32, 8) if args.quick else power_iterations(128, 96),
        batchnorm_statistics("resnet50", 8 if args.quick else 64),
        stylegan2_draws(64 if args.quick else 256, 8 if args.quick else 64, args.quick),
        device_crops(128, 32, True) if args.quick else device_crops(512, 224, False),
    ]
    from _env import measured_on  # (counts, not times: the code and torch they are of)

    print(measured_on())
    print("| part of a step | weights | before (the CPU's way) | now, on a GPU |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
