"""The least time an iteration's work can take on a GPU, counted on the CPU: each op of the step as bigbatch trains it,
with its FLOPs and the bytes it reads and writes, and its time at the roofline, the larger of its FLOPs at the GPU's
matmul rate and its bytes at the GPU's memory bandwidth. Beside the measured time, it says whether a target is out
of reach of the ops as they are (then only fusing them, or fewer of them, reaches it) or the kernels fall short of
what the device allows (then a profile says which).

    python bench/roofline.py                                   # ResNet-50, StyleGAN2 paper256, SAEHD 512, BigGAN-128
    python bench/roofline.py --works resnet50 --measured resnet50=0.0592   # and a measured s/iteration beside it
    python bench/roofline.py --quick                           # toy sizes (the test suite's run)
    python bench/roofline.py --works stylegan2 --fused         # StyleGAN2 with its fused kernels, as fused.ON runs it

How it counts:
- The ops are the aten ops the step dispatches (views excluded), each at least one kernel launch on a GPU. FLOPs are
  torch.utils.flop_counter's formulas (matmuls, convolutions, attention); the other ops count none. An op's bytes are
  the distinct elements of the tensors it reads and writes (an expanded tensor's once; the first argument of a
  write-only op such as copy_ or fill_, or of one that takes only its shape such as zeros_like, is not read), in
  the dtypes the CPU's autocast gives them.
- The work is counted on full-size models at two small micro-batches and, op by op, extended in a straight line to
  the GPU's micro-batch (an op's size is its weights' plus its images' share), so nothing is computed at the GPU's
  sizes: the ops with FLOPs return a constant of their outputs' shapes instead of computing (values change which ops
  a step runs only where the host reads them: the losses, the gradients' norm and finiteness, ADA's sign of D's
  outputs; the constant keeps them finite, so every optimizer step is taken).
- The host's own work is not counted: the data a step reads, and the draws made on the host (StyleGAN2's noise,
  style mixing and path length's images, the classifier's and SAEHD's augmentation draws), which a GPU run makes
  there too.
- A GAN iteration is one D and one G step, its lazy penalties weighted as they fall (R1 on 1 in r1_every D steps,
  path length on 1 in pl_every G steps); the classifier's and SAEHD's, one step. StyleGAN2 is counted as its GPU
  row (bench/gpu.py's stylegan2-bf16) measures it, at ADA's starting p of 0, where no image is augmented and ADA
  launches nothing; at a p that moves images, ADA's transforms add their ops (and its noise draws on the host).
- Rates: --tflops (bf16 dense; default the 786.7-801.9 TFLOP/s the H200 measured for bench/gpu.py on 2026-12-04,
  bench/RESULTS.md) and --bandwidth (default 4.8 TB/s, the H200's HBM3e as NVIDIA states it; a copy reaches less).

What it leaves out, each making the true least time larger: several kernels for one op (cuDNN's convolutions,
BatchNorm's backward), reads of a tensor too large for the cache more than once, and the host's time to launch
(the launches column: at a few microseconds each, the floor of an iteration that is not replayed as a graph).
Where bigbatch lays a step out by its device, the count takes the GPU's layout (`as_on_a_gpu`): BigGAN's attention
through scaled_dot_product_attention (the CPU's flash kernel: the same products), torch.optim's fused kernels, SAEHD's
optimizer over its device parts, no convolution kept in NCHW. The convolutions' layouts are the step's (channels-last
where it sets it); cuDNN may convert a layout on its own, which is not counted.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

sys.path.insert(0, str(Path(__file__).parent))
from _args import name_list, positive_float, positive_int  # noqa: E402
from _classify import classify_task  # noqa: E402
from _env import measured_on  # noqa: E402
from _gan import gan_task  # noqa: E402
from _gpu_sizes import CLASSES  # noqa: E402
from _kinds import kind_of as profiled_kind  # noqa: E402
from _swap import swap_feed, swap_task, synthetic_faces  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.config import Config  # noqa: E402
from bigbatch.engine import precision, wrap  # noqa: E402
from bigbatch.models import biggan, fused  # noqa: E402
from bigbatch.models.stylegan2 import StyleGAN2Generator  # noqa: E402
from bigbatch.tasks.gan import task as gan_task_module  # noqa: E402
from bigbatch.tasks.swap import optim as swap_optim  # noqa: E402

aten = torch.ops.aten
# The CPU's fused attention, counted as the GPU's (torch's formulas know the CUDA kernels only).
FLOPS = {
    **flop_registry,
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, out_val=None, **kw: sdpa_flop_count(
        q.shape, k.shape, v.shape
    ),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, out_val=None, **kw: (
        sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape)
    ),
}
WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_"}
SHAPE_ONLY = {"new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "empty_like", "zeros_like"}
SHAPE_ONLY |= {"ones_like", "full_like", "rand_like", "randn_like"}  # (their first argument: its shape, not read)


@dataclass
class Op:
    name: str
    flops: float
    bytes: float
    count: float = 1.0  # (extended to another micro-batch: an op once an image, as many times as images)


Phases = list[tuple[str, float, list[Op]]]  # (name, share of an iteration, ops)


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of `t`'s distinct elements (an expanded dimension, stride 0, counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride else 1
    return n * t.element_size()


def tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def stand_in(func, args: tuple, kwargs: dict) -> object:  # noqa: ANN001
    """`func`'s outputs as tensors of their shapes, dtypes and strides (from a run on meta tensors) holding 0.5: a
    value no later op divides by zero or takes the root of zero at (path length's norm of gradients)."""
    margs, mkwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
    meta = func(*margs, **mkwargs)
    if "out" in kwargs:  # (written into the tensors given, as the op would: spectral norm's vectors)
        for into in tensors(kwargs["out"]):
            into.fill_(0.5)
        return kwargs["out"]
    return tree_map(
        lambda m: (
            torch.empty_strided(m.shape, m.stride(), dtype=m.dtype).fill_(0.5) if isinstance(m, torch.Tensor) else m
        ),
        meta,
    )


class Work(TorchDispatchMode):
    """Each op dispatched while entered and not `paused` (views excluded): its name, FLOPs and bytes (see the
    module's docstring). The ops with FLOPs return a constant instead of computing (`stand_in`), paused or not."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 -- torch's signature
        kwargs = kwargs or {}
        formula = FLOPS.get(func._overloadpacket)
        out = stand_in(func, args, kwargs) if formula is not None else func(*args, **kwargs)
        if func.is_view or self.paused:
            return out
        name = func._overloadpacket.__name__
        read = tensors((args, {k: v for k, v in kwargs.items() if k != "out"}))
        if name in WRITE_ONLY or name in SHAPE_ONLY:
            read = read[1:]
        moved = sum(map(distinct_bytes, read)) + sum(map(distinct_bytes, tensors(out)))
        flops = formula(*args, **kwargs, out_val=out) if formula is not None else 0
        self.ops.append(Op(name, float(flops), float(moved)))
        return out

    @contextmanager
    def pause(self) -> Iterator[None]:
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


def host_side(work: Work, obj: object, names: list[str]) -> ExitStack:
    """`obj`'s methods `names` run with `work` paused (the host's work of a GPU step), until the stack closes."""
    stack = ExitStack()
    for name in names:
        fn = getattr(obj, name)

        def paused(*a, _fn=fn, **kw):  # noqa: ANN002, ANN003, ANN202
            with work.pause():
                return _fn(*a, **kw)

        stack.enter_context(mock.patch.object(obj, name, paused))
    return stack


# ---- the works: each counts its phases at a micro-batch, as (name, weight in an iteration, ops) --------------


@dataclass(frozen=True)
class Workload:
    describe: str
    config: Callable[[bool], Config]  # quick -> the config (its batch and micro_batch the GPU's)
    count: Callable[[Config, int], Phases]  # (cfg, micro) -> phases
    micros: tuple[int, int]  # the two micro-batches counted
    target_s: float  # the target, seconds an iteration at the GPU's batch
    splits: bool = False  # whether `count` takes a batch of several micro-batches (a GAN's: --micro)


@contextmanager
def fused_as_one_op() -> Iterator[None]:
    """StyleGAN2's layers as on a device in fused.ON (bigbatch/models/fused.py): each of its compiled kernels counted as
    one op (named "compiled:" and its function's name) that reads its tensors and writes its output once; the plain
    ops it computes are run uncounted."""

    def run(fn: Callable, *args: object) -> torch.Tensor:
        work = _get_current_dispatch_mode()
        with torch.no_grad(), torch.autocast("cpu", enabled=False), ExitStack() as stack:
            if isinstance(work, Work):
                stack.enter_context(work.pause())
            out = fn(*args)
        if isinstance(work, Work) and not work.paused:
            moved = sum(map(distinct_bytes, tensors(args))) + distinct_bytes(out)
            work.ops.append(Op("compiled:" + fn.__name__.strip("_"), 0.0, float(moved)))
        return out

    with mock.patch.object(fused, "runs", lambda x: True), mock.patch.object(fused, "run", run):
        yield


def counted(step: Callable[[], object], work: Work) -> list[Op]:
    work.ops = []
    with torch.compiler.set_stance("force_eager"), work:
        step()
    return work.ops


def count_gan(cfg: Config, micro: int, classes: int) -> Phases:
    """One D and one G step, plain and with their lazy penalties (as the GAN task runs them at r1_every and pl_every
    2, the same ops), after an uncounted iteration (the optimizers' state)."""
    t = cfg.train
    acc = t.batch // t.micro_batch
    cfg = cfg.override({"train.batch": micro * acc, "train.micro_batch": micro})
    lazy = {"r1_every": 2, "pl_every": 2}
    task, _ = gan_task(cfg.override({f"train.{k}": v for k, v in lazy.items()}), classes)
    work = Work()
    phases = []
    with ExitStack() as stack:
        stack.enter_context(host_side(work, task, ["d_batch", "g_batch"]))
        if isinstance(task.G, StyleGAN2Generator):
            stack.enter_context(host_side(work, task.G, ["_draws"]))
        stack.enter_context(host_side(work, gan_task_module, ["host_rows", "per_row"]))  # (path length's noise)
        with work:  # (the ops with FLOPs not computed, here too)
            task.d_step(0)
            task.g_step(0)
        d_plain, g_plain = counted(lambda: task.d_step(1), work), counted(lambda: task.g_step(1), work)
        r1, pl = t.r1_gamma > 0 or t.r2_gamma > 0, t.pl_weight > 0  # (R2 on R1's lazy steps; WGAN-GP's on each)
        d_lazy = counted(lambda: task.d_step(2), work) if r1 else []
        g_lazy = counted(lambda: task.g_step(2), work) if pl else []
    phases.append(("D", 1 - 1 / t.r1_every if r1 else 1.0, d_plain))
    if r1:
        phases.append(("D with R1" if t.r1_gamma else "D with R2", 1 / t.r1_every, d_lazy))
    phases.append(("G", 1 - 1 / t.pl_every if pl else 1.0, g_plain))
    if pl:
        phases.append(("G with path length", 1 / t.pl_every, g_lazy))
    return phases


def count_classify(cfg: Config, micro: int) -> Phases:
    task, _, feed = classify_task(cfg.override({"train.batch": micro, "train.micro_batch": micro}), CLASSES)
    work = Work()
    with host_side(work, task, ["batch"]):
        with work:
            task.step(feed)
        return [("step", 1.0, counted(lambda: task.step(feed), work))]


def count_swap(cfg: Config, micro: int) -> Phases:
    with synthetic_faces(cfg.override({"train.batch": micro, "train.micro_batch": micro})) as faces:
        task, rep = swap_task(faces)
        work = Work()
        with closing(swap_feed(task, rep)) as feed, host_side(work, feed, ["next"]):
            with work, host_side(work, task, ["draws"]):
                task.step(feed)
            with host_side(work, task, ["draws", "_read_dst"]):
                ops = counted(lambda: task.step(feed), work)
        rep.close()
    return [("step", 1.0, ops)]


def resnet50(quick: bool) -> Config:
    size = {"data.resolution": 32, "model.ch": 8} if quick else {"data.resolution": 224, "model.ch": 64}
    train = {
        "precision": "bf16",
        "channels_last": True,
        "batch": 8 if quick else 256,
        "micro_batch": 8 if quick else 256,
    }
    base = {"name": "resnet50", "task": "classify", "model": {"name": "resnet50"}, "train": train}
    return Config.from_dict(base).override({**size, "train.device": "cpu"})


def stylegan2(quick: bool) -> Config:
    toy = {"data.resolution": 16, "model.ch": 2, "model.options.ch_max": 16, "model.options.w_dim": 16}
    cfg = bigbatch.preset("stylegan2_256").override({**(toy if quick else {}), "train.micro_batch": 64})
    # (the minibatch-statistic group: 1, so that the counted micro-batches hold whole groups; its ops are 4x4 px)
    return cfg.override({"model.options.mbstd_group": 1, "train.device": "cpu", "train.precision": "bf16"})


def saehd512(quick: bool) -> Config:
    toy = {"data.resolution": 64, "model.options.ae_dims": 32, "model.options.e_dims": 8, "model.options.d_dims": 8}
    cfg = bigbatch.preset("saehd512_df_ud").override({**(toy if quick else {}), "model.options.d_mask_dims": 4})
    return cfg.override({"train.micro_batch": cfg.train.batch, "train.device": "cpu"})


def biggan128(quick: bool) -> Config:
    toy = {"data.resolution": 32, "model.ch": 8}
    cfg = bigbatch.preset("biggan128_bs2048").override({**(toy if quick else {}), "train.batch": 256})
    return cfg.override({"train.micro_batch": 256, "train.device": "cpu", "train.precision": "bf16"})


WORKS = {
    "resnet50": Workload(
        "ResNet-50, 224 px, batch 256, bf16, channels-last", resnet50, count_classify, (2, 4), 256 / 6000
    ),
    "stylegan2": Workload(
        "StyleGAN2 paper256, batch 64, bf16",
        stylegan2,
        functools.partial(count_gan, classes=0),
        (2, 4),
        64 / 250,
        splits=True,
    ),
    "saehd512": Workload("SAEHD 512 df-ud, batch 8, bf16, checkpointing", saehd512, count_swap, (1, 2), 0.15),
    "biggan128": Workload(
        "BigGAN-128 ch 96, batch 256, bf16",
        biggan128,
        functools.partial(count_gan, classes=CLASSES),
        (2, 4),
        256 / 1200,
        splits=True,
    ),
}


# ---- from two micro-batches to the GPU's ------------------------------------------------------------------------


def extended(a: list[Op], b: list[Op], ma: int, mb: int, m: int) -> list[Op]:
    """The ops at micro-batch `m`, from the same step counted at `ma` (a) and `mb` (b), matched in order by name: an
    op both ran (or one that took another form at the other size, a copy for a view), its FLOPs and bytes on the
    straight line through its two counts; an op b ran beyond those (once an image: more images, more of them), as
    many times more as the images; one a ran beyond them, none."""
    s = (m - ma) / (mb - ma)
    out = []
    for _, i0, i1, j0, j1 in difflib.SequenceMatcher(
        None, [o.name for o in a], [o.name for o in b], False
    ).get_opcodes():
        n = min(i1 - i0, j1 - j0)
        out += [Op(y.name, max(0.0, x.flops + s * (y.flops - x.flops)), max(0.0, x.bytes + s * (y.bytes - x.bytes)))
                for x, y in zip(a[i0 : i0 + n], b[j0 : j0 + n])]  # fmt: skip
        out += [Op(y.name, y.flops, y.bytes, count=max(0.0, s)) for y in b[j0 + n : j1]]
    return out


def kind_of(name: str) -> str:
    """A counted op's kind, as the profiles sort theirs (bench/_kinds.py)."""
    return profiled_kind("aten::" + name)


@dataclass
class Bound:
    launches: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    seconds: float = 0.0  # the sum of each op's roofline time
    by_kind: dict[str, float] = field(default_factory=dict)


def bound(phases: Phases, tflops: float, bandwidth: float) -> Bound:
    b = Bound()
    for _, share, ops in phases:
        for op in ops:
            weight = share * op.count
            s = weight * max(op.flops / (tflops * 1e12), op.bytes / (bandwidth * 1e12))
            b.launches += weight
            b.flops += weight * op.flops
            b.bytes += weight * op.bytes
            b.seconds += s
            b.by_kind[kind_of(op.name)] = b.by_kind.get(kind_of(op.name), 0.0) + s
    return b


def work_phases(name: str, quick: bool, micro: int | None = None) -> Phases:
    """The work's phases at the GPU's micro-batch (`micro`: another): (name, share of an iteration, ops)."""
    w = WORKS[name]
    cfg = w.config(quick)
    if micro is not None:
        if why := micro_refused(name, micro, cfg.train.batch):
            raise ValueError(why)
        cfg = cfg.override({"train.micro_batch": micro})
    ma, mb = w.micros
    at = [w.count(cfg, m) for m in (ma, mb)]
    return [(n, share, extended(a, b, ma, mb, cfg.train.micro_batch)) for (n, share, a), (_, _, b) in zip(*at)]


def micro_refused(name: str, micro: int, batch: int) -> str:
    """Why a work cannot be counted at micro-batch `micro` of its `batch` ("" if it can)."""
    if not WORKS[name].splits:
        return f"--micro {name}: its step is counted as one micro-batch (a GAN's splits)"
    return f"--micro {name}={micro} does not divide its batch of {batch}" if batch % micro else ""


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}" if seconds >= 0.01 else f"{1e3 * seconds:.3g}"


def table(works: dict[str, Phases], measured: dict[str, float], args: argparse.Namespace) -> str:
    sizes = "the toy sizes of --quick (the rows name the GPU's)" if args.quick else "the GPU's batch"
    lines = [
        f"Roofline at {args.tflops:g} TFLOP/s and {args.bandwidth:g} TB/s; ms an iteration at {sizes}.",
        "",
        "| work | launches | TFLOP | GB moved | FLOPs at the rate | bytes at the bandwidth | roofline (op by op) "
        "| target | measured | measured / roofline | the roofline's largest kinds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, phases in works.items():
        w, b = WORKS[name], bound(phases, args.tflops, args.bandwidth)
        kinds = ", ".join(f"{k} {ms(s)}" for k, s in sorted(b.by_kind.items(), key=lambda kv: -kv[1])[:3])
        m, micro = measured.get(name), args.micro.get(name)
        split = "" if micro is None else f", micro-batches of {micro}"
        split += ", its compiled kernels (--fused)" if args.fused and name == "stylegan2" else ""
        lines.append(
            f"| {w.describe}{split} | {b.launches:,.0f} | {b.flops / 1e12:.3g} | {b.bytes / 1e9:.3g} | "
            f"{ms(b.flops / args.tflops / 1e12)} | {ms(b.bytes / args.bandwidth / 1e12)} | {ms(b.seconds)} | "
            f"{ms(w.target_s)} | {'-' if m is None else ms(m)} | "
            f"{'-' if m is None or args.quick else f'{m / b.seconds:.3g}'} | {kinds} |"  # (toy sizes: no ratio, found
            # from outside, a full-size time over a toy count printed 1.71e+04)
        )
    lines += ["", "Each phase, once (a share: how many of an iteration's it is):", ""]
    lines += ["| work | phase | share | launches | convolutions | roofline |", "|---|---|---|---|---|---|"]
    for name, phases in works.items():
        for phase, share, ops in phases:
            b = bound([(phase, 1.0, ops)], args.tflops, args.bandwidth)
            convs = sum(o.count for o in ops if kind_of(o.name) == "convolutions")
            lines.append(f"| {name} | {phase} | {share:.4g} | {b.launches:,.0f} | {convs:,.0f} | {ms(b.seconds)} |")
    return "\n".join(lines)


def work_pairs(value: Callable[[str], float], what: str) -> Callable[[str], dict]:
    """An argparse type: WORK=`what` pairs, comma-separated, each work once, each value through `value`."""

    def parse(text: str) -> dict:
        pairs = [p.split("=", 1) for p in text.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise argparse.ArgumentTypeError(f"{text!r}: give WORK={what} pairs, comma-separated")
        names = [k for k, _ in pairs]
        unknown = sorted(set(names) - set(WORKS))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown work {', '.join(unknown)}; valid: {', '.join(WORKS)}")
        if len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(f"{text!r}: each work once")
        return {k: value(v) for k, v in pairs}

    return parse


measured_pairs = work_pairs(positive_float, "SECONDS")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--works", type=name_list(tuple(WORKS)), default=list(WORKS), help=f"comma-separated, of {', '.join(WORKS)}"
    )
    p.add_argument("--quick", action="store_true", help="toy sizes (the test suite's run)")
    p.add_argument(
        "--fused", action="store_true", help="StyleGAN2 with its compiled kernels (bigbatch.models.fused), each one op"
    )
    p.add_argument("--tflops", type=positive_float, default=790.0, help="the GPU's bf16 matmul rate, TFLOP/s")
    p.add_argument("--bandwidth", type=positive_float, default=4.8, help="the GPU's memory bandwidth, TB/s")
    p.add_argument("--measured", type=measured_pairs, default={}, help="WORK=SECONDS,...: measured s/iteration")
    p.add_argument(
        "--micro",
        type=work_pairs(positive_int, "IMAGES"),
        default={},
        help="WORK=IMAGES,...: a GAN's micro-batch other than the one micro_batch auto plans on an H200",
    )
    args = p.parse_args()
    print(measured_on())
    for flag in ("measured", "micro"):
        if set(getattr(args, flag)) - set(args.works):
            p.error(f"--{flag} names {', '.join(sorted(set(getattr(args, flag)) - set(args.works)))}, not in --works")
    for name, micro in args.micro.items():
        if why := micro_refused(name, micro, WORKS[name].config(args.quick).train.batch):
            p.error(why)
    torch.manual_seed(0)
    works = {}
    for name in args.works:
        with fused_as_one_op() if args.fused else nullcontext():
            works[name] = work_phases(name, args.quick, args.micro.get(name))
        print(f"counted {name}", file=sys.stderr, flush=True)
    print(table(works, args.measured, args))


@contextmanager
def as_on_a_gpu() -> Iterator[None]:
    """The step as bigbatch lays it out on a GPU where it picks by device: attention through
    scaled_dot_product_attention, torch.optim's fused kernels, SAEHD's optimizer over its device parts, no
    convolution kept in NCHW for oneDNN's sake."""
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(biggan, "FUSED_ON", ("cuda", "cpu")))
        stack.enter_context(mock.patch.object(precision, "optimizer_kernels", lambda device: {"fused": True}))
        stack.enter_context(mock.patch.object(swap_optim, "_on_cpu", swap_optim._on_device))
        stack.enter_context(mock.patch.object(wrap, "keep_nchw", lambda model, device: []))
        yield


if __name__ == "__main__":
    with as_on_a_gpu():
        main()
