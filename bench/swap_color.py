"""What the swap task's colour augmentation costs: milliseconds per batch of each swap.ct_mode (and of
the HSV shift), beside one training iteration's forward and backward of the same batch, so a user
can see what turning one on adds. One table.

    python bench/swap_color.py [--resolution 128] [--batch 8] [--device cpu|cuda] [--repeat 3]

The faces are random smooth images (the cost does not depend on their content); every mode runs on
the whole batch on the device, as in training (bigbatch/tasks/swap/color.py).
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from _args import device_arg, positive_int

from bigbatch.data.streams import COLOUR, generator
from bigbatch.models.saehd import SAEHD
from bigbatch.tasks.swap import color


def _faces(n: int, size: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 8, 8, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear").to(device)


def _time(fn, repeat: int, device: torch.device) -> float:
    """Best of `repeat` wall times of fn() in ms, after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=positive_int, default=128)
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--device", default="cpu", type=device_arg)
    parser.add_argument("--repeat", type=positive_int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    n, res = args.batch, args.resolution
    x, y = _faces(n, res, 0, device), _faces(n, res, 1, device)
    rows = []
    for mode in color.MODES:
        ct, _ = color.draw(n, generator(0, COLOUR, 0), mode, 0.0)
        run = functools.partial(color.transfer, mode, x, y, ct)
        rows.append((f"ct_mode {mode}", _time(run, args.repeat, device)))
    _, hsv = color.draw(n, generator(0, COLOUR, 0), "none", 0.05)
    rows.append(("random_hsv_power", _time(lambda: color.hsv_shift(x, hsv), args.repeat, device)))
    net = SAEHD(res, "liae-ud").to(device)  # DFL's default model, for scale

    def iteration() -> None:
        out = net(x, y)
        sum(o.float().mean() for o in out[:4]).backward()

    rows.append(("(one forward + backward of liae-ud 256/64/64/22)", _time(iteration, args.repeat, device)))
    print(f"{res} px, batch {n}, {device}, best of {args.repeat}:\n")
    print("| what | ms per batch |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
