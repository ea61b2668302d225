"""fastai 2.8's `fit_one_cycle` on Fashion-MNIST with bigbatch's ResNet-20, scored every half epoch on the
10k test images: the side-by-side of the `fashion_resnet_fast` preset (bench/time_to_accuracy.py).

fastai is never a dependency of bigbatch: this script runs in a throwaway environment, and imports only
the standard library until main() has checked it is in one. Build it so (pinning torch first keeps pip
from resolving an unpinned torch and its CUDA packages; fastai.vision needs torchvision, this script
does not, and spaCy is for fastai.text):

    python3 -m venv /tmp/fastai-env
    /tmp/fastai-env/bin/pip install torch==2.13.0
    /tmp/fastai-env/bin/pip install --no-deps "fastai==2.8.*"
    /tmp/fastai-env/bin/pip install "fastcore>=2.2.22" "fasttransform>=0.0.3" "fastprogress>=0.2.4" \
        "fastdownload>=0.0.8,<2" "plum-dispatch<2.10" pandas matplotlib pillow scikit-learn scipy \
        pyyaml requests packaging cloudpickle numpy
    OMP_NUM_THREADS=1 /tmp/fastai-env/bin/python bench/fastai_fashion.py --epochs 5 --seed 0 --threads 1

As a fastai user trains: `Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy)` and
`fit_one_cycle(epochs, lr_max)` with fastai's defaults (Adam, weight decay 0.01 decoupled, none on BN
and biases; cosine one-cycle with 25% warm-up, momentum 0.95-0.85-0.95). lr_max is 3e-3 unless --lr-find,
which takes `lr_find()`'s valley suggestion. The data and network are bigbatch's: Debian's
dataset-fashion-mnist IDX files read as `builtin:fashion-mnist[-test]` reads them, grey repeated to 3
channels, scaled to [-1, 1], training images mirrored with probability 1/2 (data.xflip); the network is
built by bigbatch's own `create_classifier("resnet_cifar", ch=16, depth=20, zero_init_residual=True)`,
the preset's model and init. Times count from the start of fit, evaluations included, as bigbatch's do.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

from _args import at_least, positive_int  # (this folder: on the path of a script run from it)

ROOT = Path(__file__).resolve().parents[1]
FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # bigbatch.data.builtin.FASHION_DIR


def read_fashion(split: str):
    """Fashion-MNIST's `split` ("train" or "t10k") as uint8 images (N, 1, 28, 28) and int64 labels (N,)."""
    import numpy as np
    import torch

    root = Path(os.environ.get("BIGBATCH_FASHION_MNIST", FASHION_DIR))
    arrays = []
    for part in (f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte"):
        found = [p for p in (root / part, root / f"{part}.gz") if p.exists()]
        if not found:
            sys.exit(f"{part}[.gz] is not in {root}: install dataset-fashion-mnist or set BIGBATCH_FASHION_MNIST")
        with (gzip.open if found[0].suffix == ".gz" else open)(found[0], "rb") as f:
            raw = f.read()
        ndim = raw[3]
        shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
        arrays.append(np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape))
    images, labels = arrays
    return torch.from_numpy(images.copy())[:, None], torch.from_numpy(labels.astype(np.int64))


def bigbatch_resnet20():
    """bigbatch's ResNet-20 from its own builder and init. bigbatch.models/__init__ imports every family
    and with them h5py and the data layer, which this environment lacks; a bare package stands in for it,
    so that only models/resnet.py, registry.py, layers.py and errors.py load (they need only torch)."""
    sys.path.insert(0, str(ROOT))
    package = types.ModuleType("bigbatch.models")
    package.__path__ = [str(ROOT / "bigbatch" / "models")]
    sys.modules.setdefault("bigbatch.models", package)
    from bigbatch.models import registry, resnet  # noqa: F401  (resnet registers resnet_cifar)

    return registry.create_classifier("resnet_cifar", 10, ch=16, img_channels=3, depth=20, zero_init_residual=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=positive_int, default=5)
    p.add_argument("--batch", type=positive_int, default=128, help="batch size (fastai's default is 64)")
    p.add_argument("--lr-max", type=float, default=3e-3)
    p.add_argument("--lr-find", action="store_true", help="use lr_find()'s valley suggestion as lr_max")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--target", type=float, default=90.0, help="top-1 %% whose first reaching is summarised")
    p.add_argument("--stop", action="store_true", help="end the fit at the first evaluation at or above --target")
    p.add_argument("--limit", type=at_least(0), default=0, help="train on the first N training images (smoke tests)")
    p.add_argument("--json", metavar="OUT", help="write the evaluation rows there")
    args = p.parse_args()
    try:
        import fastai
        import torch
        from fastai.basics import (
            Callback,
            CancelFitException,
            CrossEntropyLossFlat,
            DataLoader,
            DataLoaders,
            Learner,
            accuracy,
            set_seed,
        )
        from fastai.callback.progress import ProgressCallback
        from fastai.callback.schedule import fit_one_cycle  # noqa: F401  (patches Learner)
    except ImportError as e:
        sys.exit(f"{e}: run this with the throwaway fastai environment's python (see the docstring)")

    torch.set_num_threads(args.threads)
    set_seed(args.seed, reproducible=True)
    train_x, train_y = read_fashion("train")
    if args.limit:
        train_x, train_y = train_x[: args.limit], train_y[: args.limit]
    test_x, test_y = read_fashion("t10k")
    dls = DataLoaders(
        DataLoader(torch.utils.data.TensorDataset(train_x, train_y), bs=args.batch, shuffle=True, drop_last=True),
        DataLoader(torch.utils.data.TensorDataset(test_x, test_y), bs=500),
        device="cpu",
    )
    model = bigbatch_resnet20()
    n_params = sum(q.numel() for q in model.parameters())

    def to_input(x: torch.Tensor, flip: bool) -> torch.Tensor:
        """uint8 (N, 1, H, W) -> float (N, 3, H, W) in [-1, 1], each image mirrored with p 1/2 if `flip`."""
        x = x.float() / 127.5 - 1
        if flip:
            x = torch.where((torch.rand(len(x)) < 0.5)[:, None, None, None], x.flip(3), x)
        return x.expand(-1, 3, -1, -1).contiguous()

    class BigbatchInputs(Callback):
        """The network's inputs as bigbatch feeds them (to_input), mirrored in training only."""

        def before_batch(self):
            self.learn.xb = (to_input(self.xb[0], flip=self.training),)

    class HalfEpochEval(Callback):
        """(kimg, wall s, CPU s, top-1) at each half epoch: fastai's own validation at the end of an
        epoch, the same pass over the 10k test images at its middle. The times leave out the mid-epoch
        passes (a fastai user's run does not make them), so they are the times of fastai's own run."""

        def before_fit(self):
            self.rows, self.nimg = [], 0
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def after_batch(self):
            if not self.training:
                return
            self.nimg += len(self.yb[0])
            if self.iter + 1 == self.n_iter // 2:
                t, c = time.perf_counter(), time.process_time()
                self.model.eval()
                with torch.no_grad():
                    hits = sum((self.model(to_input(x, False)).argmax(1) == y).sum().item() for x, y in self.dls.valid)
                self.model.train()
                self.t0 += time.perf_counter() - t  # not counted: see the docstring
                self.c0 += time.process_time() - c
                self.record(self.epoch + 0.5, 100 * hits / len(test_y))

        def after_validate(self):
            self.record(self.epoch + 1, 100 * float(self.recorder.metrics[0].value))

        def record(self, epoch: float, top1: float) -> None:
            wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            self.rows.append(
                {"epoch": epoch, "kimg": self.nimg / 1000, "wall_s": wall, "cpu_s": cpu, "top1": round(top1, 3)}
            )
            if args.stop and top1 >= args.target:
                raise CancelFitException()

    with tempfile.TemporaryDirectory() as tmp:  # lr_find saves and restores the weights under learn.path
        learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), metrics=accuracy, path=tmp, cbs=BigbatchInputs())
        if not sys.stdout.isatty():  # in a log, fastprogress's bar is one line of \r-joined updates
            learn.remove_cb(ProgressCallback)  # (and the Recorder prints each epoch's row plainly)
        lr_max = args.lr_max
        if args.lr_find:
            lr_max = float(learn.lr_find(show_plot=False).valley)
        print(
            f"fastai {fastai.__version__}, torch {torch.__version__}, {args.threads} thread(s); {len(train_y)} "
            f"training images, batch {args.batch}, lr_max {lr_max:.3g}; bigbatch resnet_cifar depth 20 ch 16 "
            f"(3 input channels): {n_params:,} parameters"
        )
        evals = HalfEpochEval()
        learn.fit_one_cycle(args.epochs, lr_max, cbs=evals)
    rows = evals.rows

    print("\n| epoch | kimg | wall s | CPU s | top-1 % |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['epoch']:g} | {r['kimg']:.2f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['top1']:.2f} |")
    hit = next((r for r in rows if r["top1"] >= args.target), None)
    reached = (
        f"{hit['kimg']:.2f} kimg / {hit['wall_s']:.1f} s wall / {hit['cpu_s']:.1f} s CPU" if hit else "not reached"
    )
    best = max(r["top1"] for r in rows)
    print(f"\ntarget {args.target:g}%: {reached}; best top-1 {best:.2f}%, final {rows[-1]['top1']:.2f}%")
    if args.json:
        meta = {"fastai": fastai.__version__, "torch": torch.__version__, "params": n_params, "lr_max": lr_max}
        Path(args.json).write_text(json.dumps({**meta, "args": vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
