"""A fine-tuning's frozen phase (train.freeze_kimg): the step's time with the frozen body's parameters not
requiring grad (bigbatch in one process, as fastai's freeze), against the same step computing their gradients
and dropping them (bigbatch under DDP, and before this), and against the whole network training. With
train_bn (fastai's default) the body's norms train, so backward still runs through the body but skips its
convolutions' weight gradients; without it backward stops at the head.

    python bench/frozen_step.py                 # one thread, the table
    python bench/frozen_step.py --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _args import device_arg, name_list, positive_int  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.engine import frozen  # noqa: E402
from bigbatch.models import create_classifier  # noqa: E402
from bigbatch.tasks.classify.finetune import body_and_head  # noqa: E402

MODELS = {  # name -> (builder, batch, resolution)
    "resnet18 (ch 32, 64 px, batch 32)": (lambda: create_classifier("resnet18", 10, ch=32), 32, 64),
    "resnet50 (ch 64, 128 px, batch 16)": (lambda: create_classifier("resnet50", 1000), 16, 128),
}
hold_of_the_engine = frozen.hold
WAYS = ("frozen, no gradient", "frozen, computed and dropped", "whole network")


def seconds_per_step(name: str, train_bn: bool, way: str, steps: int, device: str) -> float:
    build, batch, res = MODELS[name]
    torch.manual_seed(0)
    net = build()
    x = torch.randn(batch, 3, res, res)
    y = torch.randint(0, net.fc.out_features, (batch,))
    hold = frozen.hold
    if way == WAYS[1]:
        frozen.hold = lambda *args, **kwargs: None  # (the gradients computed, then dropped: as under DDP)
    try:
        with bigbatch.Replicator(batch, batch, device=device) as rep:
            model = rep.prepare(net)
            groups = body_and_head([{"params": list(net.parameters())}], net, 0.1, train_bn)
            for g in groups:
                g["frozen"] = way != WAYS[2] and g["body"] and not g["norm"]
            opt = rep.wrap_optimizer(torch.optim.SGD(groups, lr=0.01, momentum=0.9))
            loss = torch.nn.CrossEntropyLoss()
            times = []
            for i in range(steps + 1):
                t = time.perf_counter()
                rep.step(lambda m: loss(model(m[0]), m[1]), (x, y), opt)
                if rep.device.type == "cuda":
                    torch.cuda.synchronize()
                if i:  # (the first: warm-up)
                    times.append(time.perf_counter() - t)
    finally:
        frozen.hold = hold
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", type=device_arg)
    p.add_argument("--steps", type=positive_int, default=5)
    models = tuple(n.split()[0] for n in MODELS)
    p.add_argument("--models", type=name_list(models), default=",".join(models), help=f"of {', '.join(models)}")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    names = [n for n in MODELS if n.split()[0] in args.models]
    print(f"Fine-tuning's frozen phase, s a step (median of {args.steps}), {args.device}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}\n")  # fmt: skip
    print("| model | train_bn | " + " | ".join(WAYS) + " | no gradient / dropped |")
    print("|---|---|" + "---|" * (len(WAYS) + 1))
    for name in names:
        for train_bn in (True, False):
            s = {w: seconds_per_step(name, train_bn, w, args.steps, args.device) for w in WAYS}
            cells = " | ".join(f"{s[w]:.3f}" for w in WAYS)
            print(f"| {name} | {train_bn} | {cells} | {s[WAYS[0]] / s[WAYS[1]]:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
