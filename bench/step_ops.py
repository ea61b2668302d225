"""A whole training iteration's kernel launches as `bigbatch train` runs it, against a bare PyTorch loop of the
same model: how much host work the engine adds to a GPU step, measured on any machine.

    python bench/step_ops.py             # ResNet-50 (classify) and BigGAN-128 (GAN), bf16
    python bench/step_ops.py --quick     # BigGAN at 32 px (the test suite's run)

On a GPU each launch costs the host some microseconds whatever its size; where the host launches slower than
the GPU runs, the GPU waits. Launches are counted as bench/host_ops.py counts them (aten ops dispatched,
views excluded), in the third iteration of a run on scikit-learn's digits (the counts do not depend on the
width or the batch), with the optimizers' kernels a GPU takes (fused), one micro-batch a step.

The bare loops are what a careful user writes by hand: autocast, fused optimizer, no bookkeeping. ResNet-50's:
forward, label-smoothed cross-entropy, backward, SGD. BigGAN's (as BigGAN-PyTorch's train_fns, modernised):
a D step on real and fake images in one forward with the hinge loss, a G step, G_ema blended by one
multi-tensor op; spectral norm's power iteration in every forward of a net in training mode (the models'
own behaviour outside an engine), where bigbatch runs it once a step for all layers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory
from unittest import mock

import torch
import torch.nn.functional as F

import bigbatch
from bigbatch import loop
from bigbatch.engine import precision
from bigbatch.models.layers import SpectralNorm

sys.path.insert(0, str(Path(__file__).parent))
from host_ops import Launches  # noqa: E402 -- bench/ is not a package

COUNTED = 2  # iterations run before the one counted (the first makes the optimizers' state)


class ByOp(Launches):
    """Launches, and how many of each op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 -- torch's signature
        if not func.is_view:
            self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def fused(device: torch.device) -> dict[str, bool]:
    return {"fused": True}  # the kernels engine.precision.optimizer_kernels gives a CUDA GPU


def through_bigbatch(cfg: bigbatch.Config) -> ByOp:
    """The launches of the third iteration of `bigbatch.train(cfg)`."""
    counted: list[ByOp] = []
    build = loop.build_task

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        task = build(*args, **kwargs)
        step, seen = task.step, []

        def one(feed):  # noqa: ANN001, ANN202
            seen.append(None)
            if len(seen) != COUNTED + 1:
                return step(feed)
            with ByOp() as ops:
                out = step(feed)
            counted.append(ops)
            return out

        task.step = one
        return task

    with TemporaryDirectory() as tmp, mock.patch.object(loop, "build_task", counting):
        with mock.patch.object(precision, "optimizer_kernels", fused):
            bigbatch.train(cfg, run_dir=Path(tmp) / "run", quiet=True)
    return counted[0]


def bare(iteration) -> ByOp:  # noqa: ANN001
    for _ in range(COUNTED):
        iteration()
    with ByOp() as ops:
        iteration()
    return ops


def short(cfg: bigbatch.Config, batch: int) -> dict:
    return {"train.batch": batch, "train.micro_batch": batch, "train.kimg": (COUNTED + 1) * batch / 1000,
            "train.precision": "bf16", "train.compile": False, "train.log_every_kimg": 1.0,
            "checkpoint.every_kimg": 1.0, "sample.every_kimg": 0.0, "eval.every_kimg": 0.0}  # fmt: skip


def resnet50() -> tuple[ByOp, ByOp, str]:
    res, batch = 32, 4
    cfg = bigbatch.preset("imagenet_resnet50_fast")
    cfg = cfg.override({"data.path": "builtin:digits", "data.resolution": res, "data.val_fraction": 0.0,
                        "data.schedule": [], "data.val_path": "", "data.workers": 1, **short(cfg, batch)})  # fmt: skip
    ours = through_bigbatch(cfg)
    t = cfg.train
    model = bigbatch.models.create_classifier("resnet50", 10, ch=64).to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5, fused=True)
    x = torch.randn(batch, 3, res, res).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))

    def iteration() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y, label_smoothing=t.label_smoothing)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return ours, bare(iteration), "ResNet-50 (imagenet_resnet50_fast), a step of one micro-batch, bf16"


def biggan(res: int) -> tuple[ByOp, ByOp, str]:
    batch, ch, classes = 4, 8, 10
    cfg = bigbatch.preset("biggan128_bs2048")
    cfg = cfg.override({"data.path": "builtin:digits", "data.resolution": res, "model.ch": ch,
                        "train.ema_start_kimg": 0.0, **short(cfg, batch)})  # fmt: skip
    ours = through_bigbatch(cfg)
    t = cfg.train
    G, D = bigbatch.models.create("biggan", res, classes, ch=ch, dim_z=cfg.model.dim_z)
    G, D = G.to(memory_format=torch.channels_last), D.to(memory_format=torch.channels_last)
    G_ema = bigbatch.models.create("biggan", res, classes, ch=ch, dim_z=cfg.model.dim_z)[0]
    G_ema.load_state_dict(G.state_dict())
    kw = {"betas": t.betas, "eps": t.adam_eps, "fused": True}
    opt_G, opt_D = torch.optim.Adam(G.parameters(), t.g_lr, **kw), torch.optim.Adam(D.parameters(), t.d_lr, **kw)
    real = torch.rand(batch, 3, res, res).mul(2).sub(1).to(memory_format=torch.channels_last)
    y_real = torch.randint(0, classes, (batch,))

    def iteration() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            D.requires_grad_(True)
            z, y = torch.randn(batch, cfg.model.dim_z), torch.randint(0, classes, (batch,))
            with torch.no_grad():
                fake = G(z, y).to(real.dtype)
            logits = D(torch.cat([real, fake]), torch.cat([y_real, y])).float()
            loss = F.relu(1 - logits[:batch]).mean() + F.relu(1 + logits[batch:]).mean()
        loss.backward()
        opt_D.step()
        opt_D.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            D.requires_grad_(False)
            z, y = torch.randn(batch, cfg.model.dim_z), torch.randint(0, classes, (batch,))
            loss = -D(G(z, y), y).float().mean()
        loss.backward()
        opt_G.step()
        opt_G.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_lerp_(list(G_ema.parameters()), list(G.parameters()), 1e-4)
            torch._foreach_copy_(list(G_ema.buffers()), list(G.buffers()))

    layers = sum(isinstance(m, SpectralNorm) for net in (G, D) for m in net.modules())
    return ours, bare(iteration), f"BigGAN {res} px (biggan128_bs2048's G and D; {layers} spectral-norm layers), bf16"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="BigGAN at 32 px (the test suite's run)")
    args = p.parse_args()
    rows = [biggan(32)] if args.quick else [resnet50(), biggan(128)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores\n")
    print(
        "| iteration | bare loop | bigbatch | ratio | bigbatch's most beyond the bare loop | the bare loop's beyond |"
    )
    print("|---|---|---|---|---|---|")
    for ours, alone, name in rows:
        more, fewer = ours.ops - alone.ops, alone.ops - ours.ops
        top = ", ".join(f"{op} +{n}" for op, n in more.most_common(5)) or "-"
        less = ", ".join(f"{op} +{n}" for op, n in fewer.most_common(5)) or "-"
        print(f"| {name} | {alone.count:,} | {ours.count:,} | {ours.count / alone.count:.2f} | {top} | {less} |")


if __name__ == "__main__":
    main()
