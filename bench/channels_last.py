"""train.channels_last on this machine: the speed of NHWC against NCHW for the GAN and classifier models
(one forward and backward, fp32 and bf16), and what it does to accuracy: every gradient of one step
against a float64 NCHW reference, and PyTorch's BatchNorm alone on a batch whose gradient cancels.

    python bench/channels_last.py                 # one thread, the tables
    python bench/channels_last.py --device cuda   # on a GPU (speed rows only are meaningful there)

The last table is the option in training: the GAN and classify tasks' own steps (bench/_gan.py,
bench/_classify.py: built as `bigbatch.train` builds them, one batch in memory) with
train.channels_last false and true, alternating.

On CPU, PyTorch's channels-last BatchNorm sums each channel's statistics and gradients in one pass
over N*H*W values, where its NCHW kernel sums in blocks: a BN alone, on a gradient whose sums cancel,
loses accuracy (the last table); a whole step's gradient stays within fp32's rounding (the middle one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _args import device_arg, positive_int  # noqa: E402
from _classify import SameBatch, classify_task  # noqa: E402
from _env import measured_on  # noqa: E402
from _gan import config, gan_task, sync  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.engine.wrap import to_channels_last  # noqa: E402
from bigbatch.models import create, create_classifier  # noqa: E402

MODELS = {  # name -> (builder, input shape: images, or the batch of a GAN's z)
    "resnet20 (ch 16, 32 px, batch 128)": (lambda: create_classifier("resnet_cifar", 10, ch=16), (128, 3, 32, 32)),
    "resnet50 (ch 64, 128 px, batch 16)": (lambda: create_classifier("resnet50", 1000), (16, 3, 128, 128)),
    "biggan G+D (ch 32, 32 px, batch 64)": (lambda: create("biggan", 32, 10, ch=32), (64,)),
}  # fmt: skip


def step(model, shape: tuple, device: torch.device, nhwc: bool, dtype: torch.dtype, bf16: bool = False):
    """One forward and backward of `model` (a classifier, or a (G, D) pair) on fixed inputs; the loss."""
    g = torch.Generator().manual_seed(0)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        if isinstance(model, tuple):
            G, D = model
            z = torch.randn(shape[0], G.dim_z, generator=g).to(device, dtype)
            y = torch.randint(10, (shape[0],), generator=g).to(device)
            loss = D(G(z, y), y).to(dtype).square().mean()
        else:
            x = torch.randn(shape, generator=g).to(device, dtype)
            y = torch.randint(10, (shape[0],), generator=g).to(device)
            x = x.contiguous(memory_format=torch.channels_last) if nhwc else x
            loss = F.cross_entropy(model(x).to(dtype), y)
    loss.backward()
    return loss


def build(name: str, device: torch.device, nhwc: bool, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    built = MODELS[name][0]()
    nets = built if isinstance(built, tuple) else (built,)
    for net in nets:
        net.to(device, dtype)
        if nhwc:
            to_channels_last(net, device)
    return built


def params(model) -> list[torch.nn.Parameter]:
    return [p for net in (model if isinstance(model, tuple) else (model,)) for p in net.parameters()]


def seconds(name: str, device: torch.device, nhwc: bool, bf16: bool, repeat: int) -> float:
    model, shape = build(name, device, nhwc), MODELS[name][1]
    step(model, shape, device, nhwc, torch.float32, bf16)  # warm-up
    clock = time.perf_counter if device.type == "cuda" else time.process_time  # (CPU: other load does not count)
    best = float("inf")
    for _ in range(repeat):
        sync(device)
        t = clock()
        step(model, shape, device, nhwc, torch.float32, bf16)
        sync(device)
        best = min(best, clock() - t)
    return best


def gradient_error(name: str, device: torch.device) -> tuple[float, float]:
    """The error of one step's whole gradient (all parameters, L2, relative to the gradient's norm) against
    float64 NCHW: for fp32 NCHW and fp32 NHWC."""
    shape = MODELS[name][1]
    ref = build(name, device, False, torch.float64)
    step(ref, shape, device, False, torch.float64)
    errors = []
    for nhwc in (False, True):
        model = build(name, device, nhwc)
        step(model, shape, device, nhwc, torch.float32)
        got = torch.cat([q.grad.double().flatten() for q in params(model)])
        want = torch.cat([r.grad.flatten() for r in params(ref)])
        errors.append(((got - want).norm() / want.norm()).item())
    return errors[0], errors[1]


def batch_norm_error(device: torch.device) -> list[tuple[str, float, float, float]]:
    """PyTorch's BatchNorm2d (32 x 16 x 32 x 32, batch statistics) with an output gradient of mean 0.5 and
    spread 1e-3 (its sums cancel): the error of input, weight and bias gradients against float64."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, 32, 32, generator=g) * 3 + 1
    gy = torch.randn(32, 16, 32, 32, generator=g) * 1e-3 + 0.5

    def grads(dtype, nhwc):
        bn = torch.nn.BatchNorm2d(16).to(device, dtype)
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        xx = x.to(device, dtype).clone(memory_format=fmt).requires_grad_()
        bn(xx).backward(gy.to(device, dtype).contiguous(memory_format=fmt))
        return [t.double() for t in (xx.grad, bn.weight.grad, bn.bias.grad)]

    ref = grads(torch.float64, False)
    rows = []
    for nhwc in (False, True):
        e = [((a - r).abs().max() / r.abs().max()).item() for a, r in zip(grads(torch.float32, nhwc), ref)]
        rows.append(("NHWC" if nhwc else "NCHW", *e))
    return rows


def task_rates(device: torch.device, repeat: int) -> list[tuple[str, float, float]]:
    """img/s of the GAN step (biggan_cifar at ch 32, batch 16, 4 D steps: vs_biggan's) and the classify
    step (fashion_resnet_fast at 28 px, batch 256) with train.channels_last false and true."""

    def gan(channels_last: bool):
        over = ["model.ch=32", "train.batch=16", "train.micro_batch=16", "train.d_steps=4", f"train.device='{device}'"]
        task, _ = gan_task(config("biggan_cifar", over), 10, channels_last=channels_last)
        feed = SameBatch(torch.randint(0, 256, (16, 32, 32, 3), dtype=torch.uint8), torch.zeros(16, dtype=torch.long))
        return lambda: task.step(feed), 16 * 4

    def classify(channels_last: bool):
        cfg = bigbatch.preset("fashion_resnet_fast").override(
            {"data.resolution": 28, "train.batch": 256, "train.micro_batch": 256, "train.device": str(device)}
        )
        task, _, feed = classify_task(cfg, 10, channels_last=channels_last)
        return lambda: task.step(feed), 256

    rows = []
    for name, make in (
        ("GAN step (biggan_cifar, ch 32)", gan),
        ("classify step (fashion_resnet_fast, 28 px)", classify),
    ):
        steps = {flag: make(flag) for flag in (False, True)}
        best = {flag: float("inf") for flag in steps}
        for fn, _ in steps.values():
            fn()  # warm-up
        for _ in range(repeat):
            for flag, (fn, _) in steps.items():
                t = time.process_time()
                fn()
                best[flag] = min(best[flag], time.process_time() - t)
        rows.append((name, steps[False][1] / best[False], steps[True][1] / best[True]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", type=device_arg)
    p.add_argument("--repeat", type=positive_int, default=3)
    a = p.parse_args()
    print(measured_on(a.device))
    device = torch.device(a.device)
    torch.set_num_threads(1)
    kind = "wall" if device.type == "cuda" else "CPU"
    print(f"| model | precision | NCHW {kind} s | NHWC {kind} s | NHWC speed-up |\n|---|---|---|---|---|")
    for name in MODELS:
        for bf16 in (False, True):
            nchw, nhwc = (seconds(name, device, layout, bf16, a.repeat) for layout in (False, True))
            print(f"| {name} | {'bf16' if bf16 else 'fp32'} | {nchw:.3f} | {nhwc:.3f} | {nchw / nhwc:.2f}x |")
    print("\nThe error of one fp32 step's whole gradient against float64 NCHW (L2, relative to its norm):")
    print("\n| model | NCHW | NHWC |\n|---|---|---|")
    for name in MODELS:
        print("| {} | {:.1e} | {:.1e} |".format(name, *gradient_error(name, device)))
    print("\nBatchNorm2d alone, an output gradient whose sums cancel (mean 0.5, spread 1e-3), error against float64:")
    print("\n| layout | input gradient | weight gradient | bias gradient |\n|---|---|---|---|")
    for row in batch_norm_error(device):
        print("| {} | {:.1e} | {:.1e} | {:.1e} |".format(*row))
    print("\nIn training (the tasks' steps, img/s, best of the repeats, alternating):")
    print("\n| step | channels_last false | true | speed-up |\n|---|---|---|---|")
    for name, off, on in task_rates(device, a.repeat):
        print(f"| {name} | {off:.0f} | {on:.0f} | {on / off:.2f}x |")


if __name__ == "__main__":
    main()
