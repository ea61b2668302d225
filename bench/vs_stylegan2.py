"""CPU seconds per StyleGAN2 training iteration, side by side: NVlabs/stylegan2-ada-pytorch's own training code
against bigbatch's GAN task (model.name = "stylegan2"), the same networks, one thread a side.

    mkdir -p /tmp/sg2ada && git --git-dir=/work/.mirror/NVlabs+stylegan2-ada-pytorch/repo archive HEAD \
        | tar -x -C /tmp/sg2ada
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_stylegan2.py --ada /tmp/sg2ada               # the table
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_stylegan2.py --ada /tmp/sg2ada --profile 25  # and where the time goes
    OMP_NUM_THREADS=1 .venv/bin/python bench/vs_stylegan2.py --ada /tmp/sg2ada --check       # weights cross

The model, alike on both sides: StyleGAN2 at 32 px, class-conditional on 10 classes, 3 channels, z_dim =
w_dim = 64, 2 mapping layers in G (8 in D's class mapping, ADA's default), 128 channels at 4-16 px and 64
at 32 px (ADA: channel_base 2048, channel_max 128; bigbatch: model.ch 8, model.options.ch_max 128), skip
G, residual D, fp32 throughout (ADA: num_fp16_res 0, conv_clamp None), batch 16 in one micro-batch,
minibatch-stddev groups of 4, style mixing 0.9, non-saturating loss, Adam lr 0.0025 betas (0, 0.99) eps
1e-8, G_ema (half-life 10 kimg), no augmentation. G and D have the same parameter counts on both sides
(printed to the workers' logs). Lazy regularization on both sides as StyleGAN2 runs it: path length
(weight 2, on half the batch: pl_batch_shrink 2) every 4th iteration, R1 (gamma 1) every 16th. A timed
round is --steps iterations (default 16: one whole cycle, 4 path length steps and 1 R1 step on each side,
both sides at the same point of the cycle); the figure is the round's CPU seconds / --steps.

ADA's code: training.networks.Generator/Discriminator, training.loss.StyleGAN2Loss, torch.optim.Adam,
imported unchanged from --ada and built as training/training_loop.py builds them (dnnlib's
construct_class_by_name with train.py's kwargs; device cpu; G_ema a deep copy; lazy regularization's
Adam lr and betas scaled by mb_ratio). One iteration is training_loop's loop body up to and including
"Update state" (the data fetch's conversions and z/c draws, its phases Gmain, Greg, Dmain, Dreg with
zero_grad, requires_grad_, accumulate_gradients, nan_to_num and opt.step, then the G_ema update), copied
here because training_loop itself is hard-wired to CUDA and to a DataLoader. Left out: the DataLoader
(one fixed uint8 batch instead, converted as the loop converts it), pin_memory() (no CUDA here), the CUDA
timing events and the tick maintenance (logging, snapshots, metrics; none would run in a tick this short).
Its custom ops need no change: bias_act and upfirdn2d take their reference PyTorch paths for CPU tensors
without building a plugin, and conv2d_gradfix and grid_sample_gradfix fall back to torch.nn.functional off
CUDA. As a guard (not a change of behaviour), torch_utils.custom_ops.get_plugin is monkeypatched to raise,
so a plugin build would fail loudly instead of compiling.

bigbatch: the GAN task built as tests/test_stylegan2.py builds it (bigbatch.preset("digits").override(...),
replicator_for, build_task, load_data("builtin:digits", 32)); one iteration is `task.step(feed)`: one D
step (R1 joined to it on its lazy steps), one G step (the path length term joined to it on its lazy
steps), w_avg tracking and the G_ema update; the engine's defaults for a GAN (channels-last convolutions
unless the row says nchw). Both sides see the same 16 real digits (the data set's first, its labels)
every iteration; no data loading is timed on either side.

Unlike by design (each side's own algorithm): ADA runs lazy regularization as separate phases (Greg: its
own G forward on half the batch and an extra G optimizer step; Dreg: its own D forward on the real images
and an extra D optimizer step), bigbatch joins each penalty to the ordinary step (its path length forward
is still a separate G forward on half the batch; R1 uses the ordinary step's real forward). ADA draws the
noise inputs and style mixing from the global RNG, one cut-off per batch; bigbatch per image, from a seed
made of each image's z. ADA's Dmain and Dreg run D on real and fake images in separate forwards, as does
bigbatch (its minibatch statistic must see them apart).

Each row is its own worker process: OMP_NUM_THREADS=1, torch.set_num_threads(1). The workers are built
and take --warmup untimed iterations at once; then the rows take one round each in turn, --rounds rounds
(order reversed every other round), so machine load falls on both alike. Counted: the worker's CPU time
(time.process_time) around a round.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import at_least, checkout, positive_int  # noqa: E402
from _procs import Rows, become_worker, serve  # noqa: E402

RES, N_CLASSES, CHANNELS = 32, 10, 3


def real_digits(batch: int):
    """The digits data set's first `batch` images (uint8 NHWC, 32 px) and labels: both sides' real batch."""
    import torch

    from bigbatch.data import load_data

    data = load_data("builtin:digits", RES)
    images, labels = data.get(torch.arange(batch))
    return images, labels


def serve_rounds(iteration, a: argparse.Namespace) -> None:
    """_procs.serve with a round of --steps iterations as its step, after --warmup iterations; "profile N":
    one round under torch.profiler, its top N ops by self CPU time."""
    import torch

    def round_() -> None:
        for _ in range(a.steps):
            iteration()

    def profile(n: str) -> dict:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            round_()
        return {"table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=int(n))}

    for _ in range(a.warmup):
        iteration()
    serve(round_, 0, {"threads": torch.get_num_threads()}, {"profile": profile})


def ada_worker(a: argparse.Namespace) -> None:
    sys.path.insert(0, a.ada)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import dnnlib
    from torch_utils import custom_ops, misc
    from torch_utils.ops import conv2d_gradfix, grid_sample_gradfix

    def no_plugin(*args, **kwargs):
        raise RuntimeError("vs_stylegan2: ADA's code tried to build a CUDA plugin on the CPU")

    custom_ops.get_plugin = no_plugin  # a guard: the ops take their reference paths for CPU tensors

    images, labels = real_digits(a.batch)
    batch_size = batch_gpu = a.batch
    device = torch.device("cpu")
    # train.py's kwargs (its "stylegan2" cfg, with this benchmark's sizes), as setup_training_loop_kwargs builds them.
    G_kwargs = dnnlib.EasyDict(class_name="training.networks.Generator", z_dim=a.z_dim, w_dim=a.z_dim,
                               mapping_kwargs=dnnlib.EasyDict(), synthesis_kwargs=dnnlib.EasyDict())  # fmt: skip
    D_kwargs = dnnlib.EasyDict(class_name="training.networks.Discriminator", block_kwargs=dnnlib.EasyDict(),
                               mapping_kwargs=dnnlib.EasyDict(), epilogue_kwargs=dnnlib.EasyDict())  # fmt: skip
    G_kwargs.synthesis_kwargs.channel_base = D_kwargs.channel_base = a.ch * 256
    G_kwargs.synthesis_kwargs.channel_max = D_kwargs.channel_max = a.ch_max
    G_kwargs.mapping_kwargs.num_layers = 2
    G_kwargs.synthesis_kwargs.num_fp16_res = D_kwargs.num_fp16_res = 0
    G_kwargs.synthesis_kwargs.conv_clamp = D_kwargs.conv_clamp = None
    D_kwargs.epilogue_kwargs.mbstd_group_size = 4
    G_opt_kwargs = dnnlib.EasyDict(class_name="torch.optim.Adam", lr=0.0025, betas=[0, 0.99], eps=1e-8)
    D_opt_kwargs = dnnlib.EasyDict(class_name="torch.optim.Adam", lr=0.0025, betas=[0, 0.99], eps=1e-8)
    loss_kwargs = dnnlib.EasyDict(class_name="training.loss.StyleGAN2Loss", r1_gamma=a.r1_gamma, pl_weight=2,
                                  pl_batch_shrink=2, style_mixing_prob=a.mixing)  # fmt: skip
    ema_kimg, ema_rampup, G_reg_interval, D_reg_interval = 10, None, 4, 16

    # training_loop's set-up, on the CPU.
    np.random.seed(0)
    torch.manual_seed(0)
    conv2d_gradfix.enabled = True
    grid_sample_gradfix.enabled = True
    common_kwargs = dict(c_dim=N_CLASSES, img_resolution=RES, img_channels=CHANNELS)
    G = dnnlib.util.construct_class_by_name(**G_kwargs, **common_kwargs).train().requires_grad_(False).to(device)
    D = dnnlib.util.construct_class_by_name(**D_kwargs, **common_kwargs).train().requires_grad_(False).to(device)
    G_ema = copy.deepcopy(G).eval()
    ddp_modules = {"G_mapping": G.mapping, "G_synthesis": G.synthesis, "D": D, "augment_pipe": None}
    loss = dnnlib.util.construct_class_by_name(device=device, **ddp_modules, **loss_kwargs)
    phases = []
    for name, module, opt_kwargs, reg_interval in [("G", G, G_opt_kwargs, G_reg_interval),
                                                   ("D", D, D_opt_kwargs, D_reg_interval)]:  # fmt: skip
        mb_ratio = reg_interval / (reg_interval + 1)
        opt_kwargs = dnnlib.EasyDict(opt_kwargs)
        opt_kwargs.lr = opt_kwargs.lr * mb_ratio
        opt_kwargs.betas = [beta**mb_ratio for beta in opt_kwargs.betas]
        opt = dnnlib.util.construct_class_by_name(module.parameters(), **opt_kwargs)
        phases += [dnnlib.EasyDict(name=name + "main", module=module, opt=opt, interval=1)]
        phases += [dnnlib.EasyDict(name=name + "reg", module=module, opt=opt, interval=reg_interval)]
    # The data set's images as training_loop's DataLoader yields them (uint8 NCHW, one-hot float labels).
    real_img = images.permute(0, 3, 1, 2).contiguous()
    label_rows = np.eye(N_CLASSES, dtype=np.float32)[labels.numpy()]
    real_c = torch.from_numpy(label_rows)
    print(f"ADA G {sum(p.numel() for p in G.parameters())} D {sum(p.numel() for p in D.parameters())} params; "
          f"G {G_kwargs} D {D_kwargs} loss {loss_kwargs}", file=sys.stderr)  # fmt: skip
    state = {"cur_nimg": 0, "batch_idx": 0}

    def iteration() -> None:  # training_loop's loop body, up to "Update state"
        cur_nimg, batch_idx = state["cur_nimg"], state["batch_idx"]
        with torch.autograd.profiler.record_function("data_fetch"):
            phase_real_img, phase_real_c = real_img, real_c
            phase_real_img = (phase_real_img.to(device).to(torch.float32) / 127.5 - 1).split(batch_gpu)
            phase_real_c = phase_real_c.to(device).split(batch_gpu)
            all_gen_z = torch.randn([len(phases) * batch_size, G.z_dim], device=device)
            all_gen_z = [phase_gen_z.split(batch_gpu) for phase_gen_z in all_gen_z.split(batch_size)]
            all_gen_c = [label_rows[np.random.randint(len(label_rows))] for _ in range(len(phases) * batch_size)]
            all_gen_c = torch.from_numpy(np.stack(all_gen_c)).to(device)
            all_gen_c = [phase_gen_c.split(batch_gpu) for phase_gen_c in all_gen_c.split(batch_size)]
        for phase, phase_gen_z, phase_gen_c in zip(phases, all_gen_z, all_gen_c):
            if batch_idx % phase.interval != 0:
                continue
            phase.opt.zero_grad(set_to_none=True)
            phase.module.requires_grad_(True)
            for round_idx, (real_img_, real_c_, gen_z, gen_c) in enumerate(
                zip(phase_real_img, phase_real_c, phase_gen_z, phase_gen_c)
            ):
                sync = round_idx == batch_size // batch_gpu - 1
                loss.accumulate_gradients(phase=phase.name, real_img=real_img_, real_c=real_c_, gen_z=gen_z,
                                          gen_c=gen_c, sync=sync, gain=phase.interval)  # fmt: skip
            phase.module.requires_grad_(False)
            with torch.autograd.profiler.record_function(phase.name + "_opt"):
                for param in phase.module.parameters():
                    if param.grad is not None:
                        misc.nan_to_num(param.grad, nan=0, posinf=1e5, neginf=-1e5, out=param.grad)
                phase.opt.step()
        with torch.autograd.profiler.record_function("Gema"):
            ema_nimg = ema_kimg * 1000
            if ema_rampup is not None:
                ema_nimg = min(ema_nimg, cur_nimg * ema_rampup)
            ema_beta = 0.5 ** (batch_size / max(ema_nimg, 1e-8))
            for p_ema, p in zip(G_ema.parameters(), G.parameters()):
                p_ema.copy_(p.lerp(p_ema, ema_beta))
            for b_ema, b in zip(G_ema.buffers(), G.buffers()):
                b_ema.copy_(b)
        state["cur_nimg"], state["batch_idx"] = cur_nimg + batch_size, batch_idx + 1

    serve_rounds(iteration, a)


def bigbatch_worker(a: argparse.Namespace, variant: str) -> None:
    """`variant`: "default" (the engine's GAN defaults: channels-last convolutions) or "nchw"."""
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import bigbatch
    from bigbatch.batching import replicator_for
    from bigbatch.data import load_data
    from bigbatch.data.loader import Batch
    from bigbatch.tasks import build_task

    overrides = {
        "model.name": "stylegan2",
        "model.ch": a.ch,
        "model.dim_z": a.z_dim,
        "model.options": {"ch_max": a.ch_max, "w_dim": a.z_dim, "map_layers": 2, "mbstd_group": 4, "mixing": a.mixing},
        "train.loss": "ns",
        "train.batch": a.batch,
        "train.micro_batch": a.batch,
        "train.g_lr": 0.0025,
        "train.d_lr": 0.0025,
        "train.betas": (0.0, 0.99),
        "train.adam_eps": 1e-8,
        "train.r1_gamma": a.r1_gamma,
        "train.r1_every": 16,
        "train.pl_weight": 2.0,
        "train.pl_every": 4,
        "train.pl_batch_shrink": 2,
        "train.ema_halflife_kimg": 10.0,
        "train.device": "cpu",
        "train.precision": "fp32",
    }
    if variant == "nchw":
        overrides["train.channels_last"] = False
    cfg = bigbatch.preset("digits").override(overrides)
    rep = replicator_for(cfg)
    task = build_task(cfg, rep, load_data("builtin:digits", RES))
    images, labels = real_digits(a.batch)

    class Feed:  # what GANTask.step reads of a bigbatch Feed: nimg, next()
        nimg = 0

        def next(self) -> Batch:
            self.nimg += a.batch
            return Batch(self.nimg - a.batch, images, labels, None)

    G, D = task.plain("G"), task.plain("D")
    print(f"bigbatch G {sum(p.numel() for p in G.parameters())} D {sum(p.numel() for p in D.parameters())} "
          f"params; channels_last {rep.channels_last}; {cfg.model}; {cfg.train}", file=sys.stderr)  # fmt: skip
    feed = Feed()
    serve_rounds(lambda: task.step(feed), a)


REFERENCE = "ADA's code"


def check(a: argparse.Namespace) -> None:
    """Weights cross: bigbatch's G, D and G_ema (built at this benchmark's sizes, conditional and not) copied into
    ADA's networks through bigbatch.models.convert (ADA's layout), and both computing: G's images (each layer's
    fixed noise, no style mixing; 8 of them), D's logits (of 4 of them) and, of the unconditional G, the style-mixing
    sheet (ADA's style_mixing.py's steps on its G, psi 0.7, layers 0-6, against bigbatch.sampling.style_mixing),
    the largest differences printed."""
    sys.path.insert(0, a.ada)
    import torch
    from training import networks

    import bigbatch
    from bigbatch.models import convert

    kw = {"channel_base": a.ch * 256, "channel_max": a.ch_max, "num_fp16_res": 0, "conv_clamp": None}
    print("| classes | D | G: largest difference (largest value) | D: largest difference (largest value) | mixing |")
    print("|---|---|---|---|---|")
    for n_classes, d_resnet in ((N_CLASSES, True), (0, False)):
        torch.manual_seed(0)
        ours = bigbatch.models.create("stylegan2", RES, n_classes, ch=a.ch, dim_z=a.z_dim, ch_max=a.ch_max,
                                      w_dim=a.z_dim, map_layers=2, mixing=0.0, d_resnet=d_resnet)  # fmt: skip
        G = networks.Generator(z_dim=a.z_dim, c_dim=n_classes, w_dim=a.z_dim, img_resolution=RES, img_channels=3,
                               mapping_kwargs={"num_layers": 2}, synthesis_kwargs=kw)  # fmt: skip
        D = networks.Discriminator(c_dim=n_classes, img_resolution=RES, img_channels=3,
                                   architecture="resnet" if d_resnet else "orig", **kw)  # fmt: skip
        ours[0].w_avg.normal_()  # (a trained G's: crossing too)
        for theirs, mine in zip((G, D), ours):
            theirs.load_state_dict(convert.to_reference(mine))  # strict: every name and shape of theirs
            theirs.eval(), mine.eval()
        ours[0].noise_mode = "const"
        z = torch.randn(8, a.z_dim)
        c = torch.nn.functional.one_hot(torch.arange(8) % n_classes, n_classes).float() if n_classes else None
        with torch.no_grad():
            images, mine = G(z, c, noise_mode="const"), ours[0](z, c)
            # One minibatch-statistic group (4): ADA strides its groups across the batch, bigbatch groups
            # consecutive images, so only a batch of one group is the same computation on both sides.
            four, c4 = images[:4], None if c is None else c[:4]
            logits, our_logits = D(four, c4).flatten(), ours[1](four, c4)
        g = f"{(images - mine).abs().max():.1e} ({images.abs().max():.2f})"
        d = f"{(logits - our_logits).abs().max():.1e} ({logits.abs().max():.2f})"
        mixing = "-" if n_classes else mixing_difference(G, ours[0], a.z_dim)
        print(f"| {n_classes} | {'resnet' if d_resnet else 'orig'} | {g} | {d} | {mixing} |")


def mixing_difference(G, ours, z_dim: int) -> str:  # noqa: ANN001 (ADA's G and bigbatch's, imported late)
    """The largest difference in 8-bit levels of ADA's style_mixing.py sheet (its steps, on ADA's G: 3 rows, 2 columns,
    psi 0.7, layers 0-6 of the columns) and bigbatch.sampling.style_mixing's, ours in its order."""
    import numpy as np
    import torch

    from bigbatch.sampling import restyle, style_mixing

    rows, cols, styles, psi = [85, 100, 75], [55, 821], list(range(7)), 0.7
    z = {s: torch.from_numpy(np.random.RandomState(s).randn(1, z_dim)).float() for s in rows + cols}

    def image(w: torch.Tensor) -> torch.Tensor:
        return (G.synthesis(w[None], noise_mode="const").permute(0, 2, 3, 1) * 127.5 + 128).clamp(0, 255)[0]

    with torch.no_grad():
        w_avg = G.mapping.w_avg
        ws = {s: w_avg + (G.mapping(z[s], None)[0] - w_avg) * psi for s in z}
        theirs = [torch.zeros_like(image(ws[rows[0]]))] + [image(ws[c]) for c in cols]
        for r in rows:
            theirs.append(image(ws[r]))
            for c in cols:
                w = ws[r].clone()
                w[styles] = ws[c][styles]
                theirs.append(image(w))
        restyle(ours, psi, "const")
        mine = style_mixing(ours, torch.cat([z[s] for s in rows]), torch.cat([z[s] for s in cols]), styles)
    return f"{(torch.stack(theirs).to(torch.uint8).int() - mine.int()).abs().max()} levels"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--ada",
        required=True,
        type=checkout("stylegan2-ada-pytorch", "training/networks.py"),
        help="stylegan2-ada-pytorch's source folder (unchanged)",
    )
    p.add_argument("--steps", type=positive_int, default=16, help="iterations a timed round (16: one "
                   "lazy-regularization cycle, 4 path length and 1 R1 steps)")  # fmt: skip
    p.add_argument("--warmup", type=at_least(0), default=4, help="untimed iterations a row first")
    p.add_argument("--rounds", type=positive_int, default=3, help="timed rounds a row, alternating")
    p.add_argument("--ch", type=positive_int, default=8, help="bigbatch's model.ch; ADA's channel_base is 256 x this")
    p.add_argument("--ch-max", type=positive_int, default=128, help="model.options.ch_max, ADA's channel_max")
    p.add_argument("--z-dim", type=positive_int, default=64, help="z_dim = w_dim")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--mixing", type=float, default=0.9, help="style mixing probability")
    p.add_argument("--r1-gamma", type=float, default=1.0)
    p.add_argument("--variants", default="default", help="bigbatch's rows: default (channels-last, the engine's "
                   "GAN default), nchw (train.channels_last=False); comma-separated")  # fmt: skip
    p.add_argument("--profile", type=at_least(0), default=0, help="then print each row's top N ops of one round")
    p.add_argument("--logs", default="", help="folder for the workers' logs (default: a temporary one)")
    p.add_argument("--check", action="store_true", help="only check that the weights cross: bigbatch's copied "
                   "into ADA's networks compute the same images and logits")  # fmt: skip
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.check:
        return check(a)
    if a.worker:
        become_worker()
        return ada_worker(a) if a.worker == "ada" else bigbatch_worker(a, a.worker)

    start = time.perf_counter()
    logs = Path(a.logs or tempfile.mkdtemp(prefix="vs-stylegan2-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    common = [f"--ada={a.ada}", f"--steps={a.steps}", f"--warmup={a.warmup}", f"--ch={a.ch}", f"--ch-max={a.ch_max}"]
    common += [f"--z-dim={a.z_dim}", f"--batch={a.batch}", f"--mixing={a.mixing}", f"--r1-gamma={a.r1_gamma}"]
    rows = [REFERENCE] + [f"bigbatch {v}" for v in a.variants.split(",")]
    commands = {}
    for row in rows:
        worker = "ada" if row == REFERENCE else row.split()[1]
        commands[row] = ([sys.executable, __file__, f"--worker={worker}", *common], logs / f"{worker}.log")
    tables = {}
    with Rows(commands, env) as workers:
        threads = {key: workers.ask(key)["threads"] for key in rows}
        print(f"built and warmed up in {time.perf_counter() - start:.0f} s; threads {threads}; logs in {logs}",
              file=sys.stderr)  # fmt: skip
        workers.rounds(a.rounds)
        if a.profile:
            tables = {key: workers.ask(key, f"profile {a.profile}")["table"] for key in rows}
        workers.close()

    def per_iteration(key: str) -> tuple[float, float, float]:
        lo, med, load = workers.stats(key)
        return lo / a.steps, med / a.steps, load

    ref = per_iteration(REFERENCE)
    from _env import measured_on

    print(measured_on("cpu", threads=1))
    widths = ", ".join(f"{min(a.ch * 256 // r, a.ch_max)} at {r} px" for r in (4, 8, 16, 32))
    print(f"# StyleGAN2 32 px, 10 classes, channels {widths}, z = w "
          f"{a.z_dim}, batch {a.batch}, mbstd 4, mixing {a.mixing}, fp32; path length every 4, R1 every 16; "
          f"one thread a side; {a.rounds} timed rounds of {a.steps} iterations a row after {a.warmup} warm-up, "
          "rows alternating\n")  # fmt: skip
    print("| side | CPU s/iteration min | median | ratio ADA/bigbatch (min, median) | CPU/wall |")
    print("|---|---|---|---|---|")
    for key in rows:
        lo, med, load = per_iteration(key)
        ratio = "-" if key == REFERENCE else f"{ref[0] / lo:.2f}, {ref[1] / med:.2f}"
        print(f"| {key} | {lo:.3f} | {med:.3f} | {ratio} | {load:.2f} |")
    for key, table in tables.items():
        print(f"\n## {key}: one round ({a.steps} iterations) under torch.profiler, top {a.profile} by self CPU time\n")
        print(f"```\n{table}```")
    print(f"\nwall time {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
