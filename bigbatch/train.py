"""The training loop: one function, read top to bottom. Progress is counted in images shown to D."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bigbatch import checkpoints, models
from bigbatch.config import Config, EvalConfig
from bigbatch.data import BatchLoader, RankSampler, load_data
from bigbatch.engine import dist
from bigbatch.engine.ema import make_ema, update_ema
from bigbatch.engine.memory import Probe, format_bytes
from bigbatch.engine.plan import Plan, make_plan
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.runs import read_metrics
from bigbatch.sampling import class_sheet, draw_latents, generate, grid, interpolation_sheet, save_png
from bigbatch.tasks.gan.scorer import Scorer
from bigbatch.tasks.gan.task import GANTask


def replicator_for(cfg: Config) -> Replicator:
    """The engine this process would train `cfg` with (joins torchrun's process group if there is one)."""
    t = cfg.train
    check_schedule(cfg, dist.context(t.device))
    return Replicator(
        cfg.schedule().phases[0].batch,
        t.micro_batch,
        t.precision,
        device=t.device,
        memory_budget=t.memory_budget or None,
        checkpointing=t.checkpointing,
        compile=t.compile,
        sync_bn=t.sync_bn,
        sn_update=cfg.model.sn_update,
        grad_clip=t.grad_clip,
        skip_limit=t.skip_limit,
        skip_window=t.skip_window,
    )


def check_schedule(cfg: Config, ctx: dist.Context) -> None:
    """Every phase's batch splits over this many processes (and the fixed micro-batch): checked before
    anything is written, not when the phase begins hours later."""
    for p in cfg.schedule().phases[1:]:
        where = f"data.schedule's phase from {p.start / 1000:g} kimg"
        if cfg.train.micro_batch == "auto":
            if p.batch % ctx.world_size:
                raise BigbatchError(f"{where} has batch {p.batch}, not a multiple of the {ctx.world_size} processes")
        else:
            try:
                make_plan(p.batch, cfg.train.micro_batch, cfg.train.precision, ctx)
            except BigbatchError as e:
                raise BigbatchError(f"{where}: {e}") from None


def describe_plan(cfg: Config, plan: Plan | None = None) -> str:
    """The batch plan of `cfg` in one line (`plan`: as resolved at start; without it nothing is built
    and "auto" is described as probed at start), then the batches of later phases."""
    ctx = dist.context(cfg.train.device)
    if plan is None:  # (a resolved plan was built by replicator_for, which checked the schedule)
        check_schedule(cfg, ctx)
    phases = cfg.schedule().phases
    batch = phases[0].batch
    if plan is not None:
        line = plan.describe()
    elif cfg.train.micro_batch == "auto":
        budget = cfg.train.memory_budget or "the device's memory"
        line = (
            f"batch {batch} = micro_batch auto (largest that fits {budget}, probed at start) x accumulation"
            f" x world_size {ctx.world_size}; precision {cfg.train.precision}; device {ctx.device}"
        )
    else:
        line = make_plan(batch, cfg.train.micro_batch, cfg.train.precision, ctx).describe()
    if len(phases) > 1:
        line += "; then batch " + ", ".join(f"{p.batch} from {p.start / 1000:g} kimg" for p in phases[1:])
    return line


def build_models(cfg: Config, n_classes: int, img_channels: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """G and D as the config describes them, initialised from train.seed."""
    torch.manual_seed(cfg.train.seed)
    return models.create(
        cfg.model.name,
        cfg.data.resolution,
        n_classes if cfg.model.conditional else 0,
        ch=cfg.model.ch,
        dim_z=cfg.model.dim_z,
        img_channels=img_channels,
        **cfg.model.options,
    )


def init_from(path: str, G: torch.nn.Module, D: torch.nn.Module, quiet: bool) -> dict[str, torch.Tensor]:
    """Load G and D from a run or checkpoint; return its G_ema weights (loaded once G_ema exists)."""
    ckpt = checkpoints.find_checkpoint(path)
    weights, _ = checkpoints.load_checkpoint(ckpt)
    fresh = load_pretrained(G, weights["G"], f"G of {ckpt}") + load_pretrained(D, weights["D"], f"D of {ckpt}")
    if not quiet and dist.context().rank == 0:
        print(f"Fine-tuning from {ckpt}", flush=True)
        if fresh:
            print(f"  re-initialised for this data set's classes: {', '.join(sorted(set(fresh)))}", flush=True)
    return weights["G_ema"]


def load_pretrained(net: torch.nn.Module, weights: dict[str, torch.Tensor], what: str) -> list[str]:
    """Load pretrained `weights` into `net`. Class embeddings (and D's projection) whose shape differs,
    because the number of classes does, keep their fresh initialisation; return their names."""
    ours = net.state_dict()
    class_keys = {
        f"{name}.{k}" if name else k
        for name, m in net.named_modules()
        if isinstance(m, torch.nn.Embedding)
        for k in m.state_dict()
    }
    take, fresh = {}, []
    for key, value in ours.items():
        w = weights.get(key)
        if w is not None and w.shape == value.shape:
            take[key] = w
        elif key in class_keys:
            fresh.append(key)
        else:
            found = "is missing" if w is None else f"has shape {tuple(w.shape)}, this model needs {tuple(value.shape)}"
            raise BigbatchError(
                f"cannot fine-tune from {what}: {key} {found}; model.name, ch, dim_z, options and data.resolution "
                "must match the pretrained run's"
            )
    net.load_state_dict(take, strict=False)
    return fresh


def freeze_d_blocks(D: torch.nn.Module, n: int) -> None:
    """FreezeD: stop training D's first `n` blocks (and its input layer and any attention among them)."""
    if n == 0:
        return
    blocks = getattr(D, "blocks", None)
    if blocks is None or n > len(blocks):
        raise BigbatchError(f"train.freeze_d={n}, but this D has {len(blocks or [])} blocks")
    for block in list(blocks)[:n]:
        block.requires_grad_(False)
    if getattr(D, "input_conv", None) is not None:
        D.input_conv.requires_grad_(False)
    if getattr(D, "attention", None) is not None and D.attn_after < n:
        D.attention.requires_grad_(False)


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False, quiet: bool = False) -> Path:
    """Train the GAN that `cfg` describes into `run_dir` (default runs/<name>-NNNNN); return the run dir.

    Under torchrun every process calls this; rank 0 alone writes the run directory."""
    rep = replicator_for(cfg)
    try:
        return _train(cfg, rep, run_dir, resume, quiet)
    finally:
        rep.close()


def _train(cfg: Config, rep: Replicator, run_dir: str | Path | None, resume: bool, quiet: bool) -> Path:
    # Where we run: rank 0 picks (and checks) the run directory, the others follow.
    main = rep.is_main
    quiet = quiet or not main
    found = _catch(lambda: open_run_dir(run_dir, cfg.name, resume)) if main else None
    ok, found = dist.broadcast(found)
    if not ok:
        raise BigbatchError(found)
    run = Path(found)
    if resume:
        ckpt = checkpoints.find_checkpoint(run)
        cfg = resume_config(run, cfg)

    # Data and networks (before the run directory is written, so a bad config leaves nothing behind);
    # everything random below is decided by train.seed.
    data = load_data(cfg.data.path, cfg.data.resolution, cfg.data.in_ram, cfg.data.storage_options or None)
    if data.resolution != cfg.data.resolution:
        raise BigbatchError(
            f"data set {cfg.data.path} holds {data.resolution}px images but data.resolution is {cfg.data.resolution}"
        )
    G, D = build_models(cfg, data.n_classes, data.channels)
    t = cfg.train
    # Fine-tuning starts from pretrained G, D and G_ema with fresh optimizers; FreezeD fixes D's first blocks.
    pretrained = init_from(t.init_from, G, D, quiet) if t.init_from and not resume else None
    freeze_d_blocks(D, t.freeze_d)
    G_ema = make_ema(G.train())  # from the plain G, before the engine wraps it
    if pretrained is not None:
        load_pretrained(G_ema, pretrained, "G_ema")
    G_train, D_train = rep.prepare(G.train()), rep.prepare(D.train())
    G_ema.to(rep.device)

    def adam(net: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=lr, betas=t.betas, eps=t.adam_eps)

    opt_G, opt_D = rep.wrap_optimizer(adam(G, t.g_lr), "G"), rep.wrap_optimizer(adam(D, t.d_lr), "D")
    task = GANTask(
        rep,
        G_train,
        D_train,
        opt_G,
        opt_D,
        data,
        t.seed,
        t.loss,
        cfg.model.conditional,
        cfg.data.xflip,
        g_ortho=t.g_ortho,
        d_ortho=t.d_ortho,
    )
    # Evaluation of G_ema (all ranks: feature extraction is split across them); the best is kept.
    resumed_at = int((checkpoints.read_meta(ckpt) or {}).get("nimg", 0)) if resume else None
    scorer = Scorer(cfg, data, rep.device, run, resumed_at, quiet) if cfg.eval.every_kimg else None
    saved_plan = _read_plan(run) if resume else {}
    if t.micro_batch == "auto" and saved_plan.get("world_size") == rep.world_size and "probes" in saved_plan:
        # A resumed run keeps its planned micro-batch: free memory varies, BN statistics must not.
        rep.use_micro_batch(int(saved_plan["micro_batch"]))
        rep.budget, rep.probes = saved_plan["memory_budget_bytes"], [Probe(**p) for p in saved_plan["probes"]]
    elif t.micro_batch == "auto":
        rep.plan_micro_batch(task.probe, [opt_G, opt_D])
        if main and not quiet:
            print(f"micro_batch auto, budget {format_bytes(rep.budget)} per process:", flush=True)
            for p in rep.probes:
                verdict = "fits" if p.fits else "does not fit"
                print(f"  micro_batch {p.micro_batch:5d}: peak {format_bytes(p.peak_bytes)}, {verdict}", flush=True)
    plan = rep.plan
    nimg, g_steps = 0, 0
    if main:
        run.mkdir(parents=True, exist_ok=True)
        atomic_write(run / "config.toml", cfg.dumps())
        atomic_write(run / "plan.json", json.dumps(plan_record(rep, cfg), indent=1) + "\n")

    # Resume: weights, optimizer moments, loss scalers and counters; all draws are keyed by counters.
    if resume:
        weights, saved = checkpoints.load_checkpoint(ckpt)
        for key, net in (("G", G), ("D", D), ("G_ema", G_ema)):
            checkpoints.load_weights(net, weights[key], f"{key} of checkpoint {ckpt}")
        try:
            opt_G.load_state_dict(saved["opt_G"])
            opt_D.load_state_dict(saved["opt_D"])
            rep.load_state_dict(saved.get("engine", {}))
            nimg, g_steps = int(saved["nimg"]), int(saved["g_steps"])
            torch.set_rng_state(saved["rng_cpu"])
            if rep.device.type == "cuda" and "rng_cuda" in saved:
                torch.cuda.set_rng_state(saved["rng_cuda"], rep.device)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise BigbatchError(f"checkpoint {ckpt} has an unusable state.pt ({e})") from None
        if main:
            truncate_metrics(run / "metrics.jsonl", nimg)
            print(f"Resuming {run} from {ckpt.name} ({nimg / 1000:.3f} kimg)", flush=True)

    # Logging (rank 0): metrics.jsonl, TensorBoard, a progress bar with img/s and ETA.
    from torch.utils.tensorboard import SummaryWriter

    tb = SummaryWriter(str(run / "tb"), purge_step=nimg if resume else None) if main else None
    total = math.ceil(t.kimg * 1000)
    bar = tqdm(
        total=total,
        initial=min(nimg, total),
        unit="img",
        unit_scale=True,
        dynamic_ncols=True,
        disable=quiet or not sys.stderr.isatty(),
        desc=cfg.name,
    )
    fixed_z, fixed_y = draw_latents(cfg.sample.n, G.dim_z, cfg.sample.seed, 0, truncation=cfg.sample.truncation)
    if task.n_classes:
        fixed_y = (torch.arange(cfg.sample.n) // 8) % task.n_classes  # one class per row of the grid

    def snapshot() -> dict[str, Any]:
        return {
            "nimg": nimg,
            "g_steps": g_steps,
            "opt_G": opt_G.state_dict(),
            "opt_D": opt_D.state_dict(),
            "engine": rep.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            **({"rng_cuda": torch.cuda.get_rng_state(rep.device)} if rep.device.type == "cuda" else {}),
        }

    def model_info() -> dict[str, Any]:
        return {"n_classes": task.n_classes, "img_channels": data.channels, "class_names": data.class_names}

    def checkpoint() -> Path:
        nets = {"G": G, "D": D, "G_ema": G_ema}
        path = checkpoints.save_checkpoint(run, nimg, nets, snapshot(), cfg.dumps(), cfg.checkpoint.keep, model_info())
        if task.n_classes:
            save_png(
                class_sheet(G_ema, cfg.sample.seed),
                run / "samples" / f"classes-{checkpoints.checkpoint_name(nimg)}.png",
            )
        save_png(
            interpolation_sheet(G_ema, cfg.sample.seed),
            run / "samples" / f"interp-{checkpoints.checkpoint_name(nimg)}.png",
        )
        return path

    def crossed(every_kimg: float, before: int) -> bool:
        every = max(1, round(every_kimg * 1000))
        return nimg // every > before // every

    # The real images: this rank's share of each step, read ahead in data.workers processes, the
    # batch size following data.schedule (the engine's accumulation follows it at phase boundaries).
    schedule = cfg.schedule()
    sampler = RankSampler(task.order, schedule, rep.rank, rep.world_size, start=nimg)
    loader = BatchLoader(data, sampler, cfg.data.workers, cfg.data.xflip, t.seed, pin_memory=rep.device.type == "cuda")
    if main:
        print(
            f"Training {cfg.name} in {run}: {describe_plan(cfg, plan)}; {t.kimg:g} kimg",
            flush=True,
        )
    window = Window()
    with stop_signals() as stop, closing(loader):
        while nimg < total and not dist.any_rank(stop.requested):
            # One iteration: d_steps D steps (each on `batch` new real images), then one G step.
            start, before = time.perf_counter(), nimg
            if t.lr_decay == "linear":  # by images seen, so a resumed run continues the same schedule
                for opt, lr in ((opt_G, t.g_lr), (opt_D, t.d_lr)):
                    for group in opt.param_groups:
                        group["lr"] = lr * max(0.0, 1 - nimg / total)
            stats: dict[str, float] = {}
            skipped = {"skipped_D": 0, "skipped_G": 0}
            for _ in range(t.d_steps):
                batch = schedule.phase_at(nimg).batch
                if batch != rep.batch:
                    rep.set_batch(batch)
                    if main and not quiet:
                        print(f"kimg {nimg / 1000:g}: data.schedule phase begins: {rep.plan.describe()}", flush=True)
                out = task.d_step(nimg, next(loader))
                skipped["skipped_D"] += rep.skipped(opt_D)
                stats.update({} if rep.skipped(opt_D) else out)  # a skipped step's losses are not logged
                nimg += batch
            out = task.g_step(g_steps)
            skipped["skipped_G"] += rep.skipped(opt_G)
            stats.update({} if rep.skipped(opt_G) else out)
            g_steps += 1
            rep.average_running_stats(G)
            rep.average_running_stats(D)
            update_ema(G_ema, G, nimg, nimg - before, t.ema_halflife_kimg, t.ema_start_kimg)
            window.add(time.perf_counter() - start, nimg - before, stats, skipped)
            bar.update(min(nimg, total) - min(before, total))

            # Evaluation, where due, on every rank; rank 0 logs it and keeps the best checkpoint.
            if scorer is not None and (crossed(cfg.eval.every_kimg, before) or nimg >= total):
                scores = scorer(G_ema)
                if main:
                    log_row(run, tb, nimg, {"kimg": round(nimg / 1000, 3), "step": g_steps, **scores})
                    if not quiet:
                        shown = "  ".join(f"{k} {v:.4g}" for k, v in scores.items() if k != "eval_seconds")
                        print(f"kimg {nimg / 1000:g}  {shown}  ({scores['eval_seconds']:.0f} s)", flush=True)
                    if scorer.improved(scores):
                        nets = {"G": G, "D": D, "G_ema": G_ema}
                        info = {**model_info(), "eval": scores, "best": scorer.best_record()}
                        checkpoints.save_best(run, nimg, nets, snapshot(), cfg.dumps(), info)

            # Maintenance (rank 0), on the image counts where it falls due: log, sample grid, checkpoint.
            if not main:
                continue
            if crossed(t.log_every_kimg, before) or nimg >= total:
                row = {"kimg": round(nimg / 1000, 3), "step": g_steps, "batch": rep.batch, **window.row()}
                for name, counters in rep.counters().items():
                    if "loss_scale" in counters:
                        row[f"loss_scale_{name}"] = counters["loss_scale"]
                log_row(run, tb, nimg, row)
                loss_D, loss_G = row.get("loss_D", math.nan), row.get("loss_G", math.nan)  # nan: all skipped
                bar.set_postfix(loss_D=f"{loss_D:.3f}", loss_G=f"{loss_G:.3f}")
                if bar.disable and not quiet:
                    eta = (total - nimg) / max(row["img_per_s"], 1e-9)
                    print(
                        f"kimg {row['kimg']:.1f}/{t.kimg:g}  loss_D {loss_D:.3f}  loss_G {loss_G:.3f}"
                        f"  {row['img_per_s']:.0f} img/s  ETA {format_seconds(eta)}",
                        flush=True,
                    )
                window = Window()
            if crossed(cfg.sample.every_kimg, before) or nimg >= total:
                images = generate(G_ema, fixed_z.to(rep.device), None if fixed_y is None else fixed_y.to(rep.device))
                save_png(grid(images), run / "samples" / f"grid-{checkpoints.checkpoint_name(nimg)}.png")
            if crossed(cfg.checkpoint.every_kimg, before) or nimg >= total:
                checkpoint()
        stopped = nimg < total
        if stopped and main:
            path = checkpoint()
            print(
                f"Stopped by signal; saved {path}. Continue with: bigbatch train --run-dir {run} --resume", flush=True
            )
    bar.close()
    if tb is not None:
        tb.close()
    if main and not stopped:
        print(f"Done: {run} ({nimg / 1000:.3f} kimg). Sample with: bigbatch sample {run}", flush=True)
    return run


class Window:
    """Sums over the iterations between two log lines (the caller leaves out skipped steps' losses)."""

    def __init__(self) -> None:
        self.seconds, self.images, self.sums, self.counts, self.skipped = 0.0, 0, {}, {}, {}

    def add(self, seconds: float, images: int, stats: dict[str, float], skipped: dict[str, int]) -> None:
        self.seconds += seconds
        self.images += images
        for k, v in stats.items():
            if math.isfinite(v):
                self.sums[k] = self.sums.get(k, 0.0) + v
                self.counts[k] = self.counts.get(k, 0) + 1
        for k, v in skipped.items():
            self.skipped[k] = self.skipped.get(k, 0) + v

    def row(self) -> dict[str, float]:
        means = {k: self.sums[k] / self.counts[k] for k in self.sums}
        return {**means, **self.skipped, "img_per_s": self.images / max(self.seconds, 1e-9)}


def plan_record(rep: Replicator, cfg: Config) -> dict[str, Any]:
    """What RUN/plan.json holds: the resolved batch plan and how it was found."""
    record: dict[str, Any] = {
        **rep.plan.to_dict(),
        "checkpointing": cfg.train.checkpointing,
        "compile": cfg.train.compile,
        "sync_bn": cfg.train.sync_bn,
        "sn_update": cfg.model.sn_update,
    }
    if cfg.train.micro_batch == "auto":
        record["memory_budget_bytes"] = rep.budget
        record["probes"] = [
            {"micro_batch": p.micro_batch, "peak_bytes": p.peak_bytes, "fits": p.fits} for p in rep.probes
        ]
    return record


def _read_plan(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "plan.json").read_text())
    except (OSError, ValueError):
        return {}


def _catch(fn: Any) -> tuple[bool, str]:
    """(True, str(fn())) or (False, its BigbatchError's message): plain data to hand to the other ranks."""
    try:
        return True, str(fn())
    except BigbatchError as e:
        return False, str(e)


def open_run_dir(run_dir: str | Path | None, name: str, resume: bool) -> Path:
    """The run directory: a new numbered one by default; an existing run only with --resume."""
    if run_dir is None:
        if resume:
            raise BigbatchError("--resume needs --run-dir naming the run to continue")
        root = Path("runs")
        taken = {p.name for p in root.iterdir()} if root.is_dir() else set()
        number = next(i for i in range(100000) if f"{name}-{i:05d}" not in taken)
        return root / f"{name}-{number:05d}"
    run = Path(run_dir)
    holds_run = (run / "config.toml").exists() or (run / "checkpoints").exists()
    if resume and not holds_run:
        raise BigbatchError(f"{run} holds no run to resume; drop --resume to start a new run there")
    if not resume and holds_run:
        raise BigbatchError(f"{run} already holds a run; add --resume to continue it, or choose another --run-dir")
    if not resume and run.exists() and not run.is_dir():
        raise BigbatchError(f"{run} is a file; --run-dir must name a directory")
    return run


def resume_config(run: Path, cfg: Config) -> Config:
    """On resume the run's own config holds; only the run length and output cadences may change."""
    saved, given = flatten(Config.load(run / "config.toml").to_dict()), flatten(cfg.to_dict())
    changed = [k for k in given if given[k] != saved.get(k)]
    fixed = [k for k in changed if not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)]
    if fixed:
        raise BigbatchError(
            f"the config differs from the run's in {', '.join(fixed)}; a resumed run may change only "
            f"{', '.join(sorted(RESUMABLE_CHANGES))} (start a new run to change more)"
        )
    return cfg


RESUMABLE_CHANGES = {
    "train.kimg",
    "train.micro_batch",
    "train.memory_budget",
    "train.checkpointing",
    "train.compile",
    "train.device",
    "train.log_every_kimg",
    "checkpoint.every_kimg",
    "checkpoint.keep",
    "sample.every_kimg",
    "data.workers",
    "data.in_ram",
    "data.storage_options",
    *(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)),
}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and k != "options":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def log_row(run: Path, tb: Any, nimg: int, row: dict[str, Any]) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    for k, v in row.items():
        if k not in ("kimg", "step"):
            tb.add_scalar(k, v, nimg)
    tb.add_scalar("kimg", row["kimg"], nimg)
    tb.flush()


def truncate_metrics(path: Path, nimg: int) -> None:
    """Drop log lines past the checkpoint being resumed, so metrics.jsonl reads as one run."""
    if path.exists():
        keep = [row for row in read_metrics(path) if round(row.get("kimg", math.inf) * 1000) <= nimg]
        atomic_write(path, "".join(json.dumps(row) + "\n" for row in keep))


def format_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Stop:
    requested = False


@contextmanager
def stop_signals():
    """SIGINT/SIGTERM ask the loop to save a checkpoint and return; a second SIGINT stops at once."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.requested = True

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
