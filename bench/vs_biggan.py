"""CPU seconds per BigGAN training iteration, side by side: ajbrock/BigGAN-PyTorch's own training function
against bigbatch's GAN task, the same model, one thread a side.

    mkdir -p /tmp/biggan_pt && git --git-dir=/work/.mirror/ajbrock+BigGAN-PyTorch/repo archive HEAD \
        | tar -x -C /tmp/biggan_pt
    .venv/bin/python bench/vs_biggan.py --biggan /tmp/biggan_pt                 # the table
    .venv/bin/python bench/vs_biggan.py --biggan /tmp/biggan_pt --profile 10    # and where the time goes
    .venv/bin/python bench/vs_biggan.py --biggan /tmp/biggan_pt --variants fp32,bf16,fp32+nhwc,bf16+nhwc+compile

The model is BigGAN-PyTorch's launch_cifar_ema.sh (bigbatch: preset biggan_cifar) at --ch 32 and --batch 16:
32 px, 10 classes, dim_z 128, per-layer class embeddings in G's BN (no shared embedding, no hierarchical
z), no attention, spectral norm in G and D (eps 1e-8, one power iteration), hinge loss, --d-steps 4 D
steps (each on `batch` real and `batch` generated images) per G step, G and D lr 2e-4, Adam betas
(0, 0.999), eps 1e-8, G_ema updated every iteration (BigGAN-PyTorch --ema --ema_start 1000, bigbatch
the preset's ema_start_kimg: both still in the copy phase here, which costs the same blend as later).

Each row is its own worker process: OMP_NUM_THREADS=1, torch.set_num_threads(1). The workers are built
(not timed) and take --warmup untimed iterations; then the rows take one iteration each in turn, round
after round (order reversed every other round), so machine load falls on all alike. Counted: the
worker's CPU time (time.process_time: all its threads) around one iteration.

BigGAN-PyTorch: BigGAN.Generator/Discriminator/G_D, their own Adam, utils.ema and
train_fns.GAN_training_function, imported unchanged from --biggan and built as its train.py builds them
(device cpu, no DataParallel); one iteration is train.py's loop body without logging: itr += 1,
G/D/G_ema .train(), train(x, y) on one fixed random float batch of batch x d_steps real images. Its D
step runs D once on fake and real images concatenated (the script's default), and so does bigbatch's
(with --biggan-args=--split_D BigGAN-PyTorch runs them apart).
torchvision (imported by its utils.py, datasets.py and train_fns.py for data loading and image saving
only, and not importable on this CPU build of torch) is stubbed in sys.modules by empty modules.
bigbatch: `task.step(feed)` of the GAN task built as bench/_gan.py builds it; the feed hands over
d_steps fixed random uint8 batches (no data loading on either side). Its bf16 row runs under
train.precision=bf16 (weights, Adam and losses fp32), against BigGAN-PyTorch's fp32.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import at_least, checkout, positive_int  # noqa: E402
from _procs import BEFORE_HELP, Rows, become_worker, before_command, serve  # noqa: E402

TORCHVISION = ("torchvision", "torchvision.datasets", "torchvision.datasets.utils", "torchvision.transforms")


def serve_profiled(step, warmup: int) -> None:
    """_procs.serve, with the worker's thread count when ready and "profile N": one iteration under
    torch.profiler, its top N ops by self CPU time."""
    import torch

    def profile(n: str) -> dict:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        return {"table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=int(n))}

    serve(step, warmup, {"threads": torch.get_num_threads()}, {"profile": profile})


class Stub(types.ModuleType):
    """An empty module whose every attribute is its submodule if imported, else an empty class."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return sys.modules.get(f"{self.__name__}.{name}") or type(name, (), {})


def biggan_worker(a: argparse.Namespace) -> None:
    for name in TORCHVISION:
        sys.modules[name] = Stub(name)
    sys.path.insert(0, a.biggan)
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import BigGAN
    import train_fns
    import utils

    args = "--shuffle --num_G_accumulations 1 --num_D_accumulations 1 --dataset C10 --G_ortho 0.0 --G_attn 0"
    args += " --D_attn 0 --G_init N02 --D_init N02 --ema --use_ema --ema_start 1000 --seed 0"  # launch_cifar_ema.sh
    args += f" --batch_size {a.batch} --num_D_steps {a.d_steps} --G_lr 2e-4 --D_lr 2e-4 --G_ch {a.ch} --D_ch {a.ch}"
    args += f" {a.biggan_args}"
    config = vars(utils.prepare_parser().parse_args(args.split()))
    config["resolution"], config["n_classes"] = utils.imsize_dict["C10"], utils.nclass_dict["C10"]
    config["G_activation"] = utils.activation_dict[config["G_nl"]]
    config["D_activation"] = utils.activation_dict[config["D_nl"]]
    utils.seed_rng(config["seed"])
    G, D = BigGAN.Generator(**config), BigGAN.Discriminator(**config)
    G_ema = BigGAN.Generator(**{**config, "skip_init": True, "no_optim": True})
    ema = utils.ema(G, G_ema, config["ema_decay"], config["ema_start"])
    GD = BigGAN.G_D(G, D)
    state = {"itr": 0, "epoch": 0, "save_num": 0, "save_best_num": 0, "best_IS": 0, "best_FID": 999999}
    z_, y_ = utils.prepare_z_y(config["batch_size"], G.dim_z, config["n_classes"], device="cpu")
    train = train_fns.GAN_training_function(G, D, GD, z_, y_, ema, state, config)
    n = a.batch * a.d_steps  # train.py's D_batch_size: the real images of all D steps at once
    x, y = torch.rand(n, 3, config["resolution"], config["resolution"]) * 2 - 1, torch.randint(10, (n,))
    print(f"BigGAN-PyTorch G {sum(p.numel() for p in G.parameters())} D {sum(p.numel() for p in D.parameters())} "
          f"params; config {config}", file=sys.stderr)  # fmt: skip

    def step() -> None:
        state["itr"] += 1
        G.train(), D.train(), G_ema.train()
        train(x, y)

    serve_profiled(step, a.warmup)


def bigbatch_worker(a: argparse.Namespace, variant: str) -> None:
    """`variant`: the precision, then "+compile" (train.compile) and "+nhwc" (train.channels_last) if set."""
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from _gan import config, gan_task

    from bigbatch.data.loader import Batch

    overrides = [f"model.ch={a.ch}", f"train.batch={a.batch}", f"train.micro_batch={a.batch}", "train.device='cpu'"]
    cfg = config("biggan_cifar", [*overrides, f"train.d_steps={a.d_steps}", "train.loss='hinge'"])
    torch.manual_seed(0)
    precision, *options = variant.split("+")
    task, rep = gan_task(cfg, 10, precision=precision, compile="compile" in options, channels_last="nhwc" in options)
    r = cfg.data.resolution
    real = [torch.randint(0, 256, (a.batch, r, r, 3), dtype=torch.uint8) for _ in range(a.d_steps)]
    labels = [torch.randint(10, (a.batch,)) for _ in range(a.d_steps)]

    class Feed:  # what GANTask.step reads of a bigbatch Feed: nimg, next()
        nimg = 0

        def next(self) -> Batch:
            i = self.nimg // a.batch % a.d_steps
            self.nimg += a.batch
            return Batch(self.nimg - a.batch, real[i], labels[i], None)

    G, D = task.plain("G"), task.plain("D")
    print(f"bigbatch G {sum(p.numel() for p in G.parameters())} D {sum(p.numel() for p in D.parameters())} "
          f"params; plan {rep.plan}; {cfg.model}; {cfg.train}", file=sys.stderr)  # fmt: skip
    feed = Feed()
    serve_profiled(lambda: task.step(feed), a.warmup)


REFERENCE = ("BigGAN-PyTorch", "fp32")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--biggan",
        required=True,
        type=checkout("BigGAN-PyTorch", "BigGAN.py"),
        help="BigGAN-PyTorch's source folder (unchanged)",
    )
    p.add_argument("--ch", type=positive_int, default=32)
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--d-steps", type=positive_int, default=4, help="D steps per G step (both sides)")
    p.add_argument("--steps", type=positive_int, default=5, help="timed iterations a row")
    p.add_argument("--warmup", type=at_least(0), default=2, help="untimed iterations a row first")
    p.add_argument("--biggan-args", default="", help="more BigGAN-PyTorch train.py flags, e.g. --biggan-args=--split_D")
    p.add_argument("--profile", type=at_least(0), default=0, help="then print each row's top N ops of one iteration")
    p.add_argument("--logs", default="", help="folder for the workers' logs (default: a temporary one)")
    p.add_argument("--variants", default="fp32+nhwc,bf16+nhwc", help="bigbatch's rows: precision[+compile][+nhwc], "
                   "e.g. fp32,bf16,fp32+nhwc,bf16+nhwc+compile (train.compile, train.channels_last; without +nhwc "
                   "NCHW; the default is a GAN's default layout, channels-last)")  # fmt: skip
    p.add_argument("--before", default="", help=BEFORE_HELP)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        become_worker()
        return biggan_worker(a) if a.worker == "biggan" else bigbatch_worker(a, a.worker)

    start = time.perf_counter()
    logs = Path(a.logs or tempfile.mkdtemp(prefix="vs-biggan-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    common = [f"--biggan={a.biggan}", f"--biggan-args={a.biggan_args}", f"--ch={a.ch}", f"--batch={a.batch}"]
    common += [f"--d-steps={a.d_steps}", f"--warmup={a.warmup}"]
    variants = a.variants.split(",")
    rows = [REFERENCE] + [("bigbatch", v) for v in variants] + [("before", v) for v in variants if a.before]
    commands = {}
    for side, v in rows:
        worker = [f"--worker={'biggan' if side == 'BigGAN-PyTorch' else v}", *common]
        cmd = [sys.executable, __file__, *worker]
        if side == "before":
            cmd = before_command(a.before, "bench/vs_biggan.py", worker)
        commands[side, v] = (cmd, logs / f"{side}-{v}.log")
    tables = {}
    with Rows(commands, env) as workers:
        threads = {key: workers.ask(key)["threads"] for key in rows}
        print(f"built and warmed up in {time.perf_counter() - start:.0f} s; threads {threads}; logs in {logs}",
              file=sys.stderr)  # fmt: skip
        workers.rounds(a.steps)
        if a.profile:
            tables = {key: workers.ask(key, f"profile {a.profile}")["table"] for key in rows}
        workers.close()
    stats = workers.stats

    ref = stats(REFERENCE)
    from _env import measured_on

    print(measured_on("cpu", threads=1))
    print(f"# BigGAN 32 px, ch {a.ch}, batch {a.batch}, {a.d_steps} D steps per G step, 10 classes, hinge, SN, "
          f"G_ema; BigGAN-PyTorch's extra flags: '{a.biggan_args}'; one thread a side; {a.steps} timed iterations "
          f"a row after {a.warmup} warm-up, rows alternating\n")  # fmt: skip
    print("| side | precision | CPU s/iteration min | median | ratio BigGAN-PyTorch/bigbatch (min, median) "
          "| CPU/wall |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for side, prec in rows:
        lo, med, load = stats((side, prec))
        ratio = "-" if side == "BigGAN-PyTorch" else f"{ref[0] / lo:.2f}, {ref[1] / med:.2f}"
        print(f"| {side} | {prec} | {lo:.3f} | {med:.3f} | {ratio} | {load:.2f} |")
    for (side, prec), table in tables.items():
        print(f"\n## {side} {prec}: one iteration under torch.profiler, top {a.profile} by self CPU time\n")
        print(f"```\n{table}```")
    print(f"\nwall time {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
