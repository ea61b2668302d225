"""A CPU step's resident memory against what micro_batch "auto" counts, with the freed memory a CPU process keeps
between steps (bigbatch.engine.memory.hold_freed_memory) and without it (BIGBATCH_KEEP_FREED=0).

The memory budget counts PyTorch's tensors (weights, activations, gradients, optimizer state); oneDNN's scratch and
reordered weights, and the heap a kept step leaves, come on top. Each cell runs in a process of its own (resident
memory is a process's): the planner's probe of the model at one micro-batch, then two steps; the growth of VmHWM
over them (the weights counted in, as the probe's count has them), beside the peak the probe counts.

    python bench/cpu_resident.py                       # resnet_cifar in bf16 at 64, a 3-layer conv net in fp32 at 256
    python bench/cpu_resident.py --micro 32 --precision fp32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import at_least  # noqa: E402
from _env import measured_on  # noqa: E402

MODELS = ("resnet_cifar", "conv3")


def cell(model: str, micro: int, precision: str) -> None:
    """One cell, in this process: print its counted peak and resident growth as JSON."""
    import re

    import torch
    from torch import nn

    import bigbatch
    from bigbatch.engine import memory

    def vm(key: str) -> int:
        return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

    torch.manual_seed(0)
    x, y = torch.randn(micro, 3, 32, 32), torch.randint(0, 10, (micro,))
    rep = bigbatch.Replicator(batch=micro, micro_batch=micro, precision=precision, device="cpu", channels_last=True)
    if model == "resnet_cifar":
        net = bigbatch.models.create_classifier("resnet_cifar", 10)
    else:
        convs = [nn.Conv2d(3, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)]
        net = nn.Sequential(*(m for c in convs for m in (c, nn.ReLU())), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        net.append(nn.Linear(64, 10))
    wrapped = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))

    def step(batch):
        return nn.functional.cross_entropy(wrapped(batch[0]), batch[1])

    baseline = memory.state_bytes([net], [opt], True)  # (weights and optimizer state, as the planner adds them)
    before = vm("VmRSS") - sum(t.numel() * t.element_size() for t in (*net.parameters(), *net.buffers()))
    counted = memory.measure(lambda m: rep.probe_step(step, (x, y)), micro, rep.device, 2**62, baseline).peak_bytes
    opt.zero_grad(set_to_none=True)
    for _ in range(2):
        rep.step(step, (x, y), opt)
    print(json.dumps({"counted": counted, "resident": vm("VmHWM") - before}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro", type=at_least(2), help="one micro-batch for both models (default: 64 and 256)")
    p.add_argument("--precision", choices=("fp32", "bf16"), help="for both (default: bf16 and fp32)")
    p.add_argument("--cell", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.cell:
        return cell(a.cell[0], int(a.cell[1]), a.cell[2])
    print(measured_on())
    runs = [("resnet_cifar", a.micro or 64, a.precision or "bf16"), ("conv3", a.micro or 256, a.precision or "fp32")]
    print("| model | precision | micro-batch | counted peak | resident, kept | resident, BIGBATCH_KEEP_FREED=0 |")
    print("|---|---|---|---|---|---|")
    for model, micro, precision in runs:
        got = {}
        for kept in ("1", "0"):
            env = {**os.environ, "BIGBATCH_KEEP_FREED": kept, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
            out = subprocess.run(
                [sys.executable, __file__, "--cell", model, str(micro), precision],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            got[kept] = json.loads(out.stdout.strip().splitlines()[-1])
        mib = [got["1"]["counted"] / 2**20, got["1"]["resident"] / 2**20, got["0"]["resident"] / 2**20]
        print(f"| {model} | {precision} | {micro} | " + " | ".join(f"{v:.1f} MiB" for v in mib) + " |")


if __name__ == "__main__":
    main()
