"""`bigbatch plot RUN`: the curves of a run's metrics.jsonl in one PNG (matplotlib, no display needed)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from bigbatch.errors import BigbatchError
from bigbatch.files import save_figure
from bigbatch.metrics_file import FACES, SCORES, read_metrics

# Panels of training log lines: title and the keys drawn in it (those the run logged).
TRAINING_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("losses", ("loss_D", "loss_G", "loss")),
    ("losses per face (DFL's)", ("src_loss", "dst_loss", "loss_xseg")),  # (found from outside: a swap run's
    ("discriminators' losses", ("loss_code_discriminator", "loss_gan")),  # were not drawn)
    ("D outputs (mean logits)", ("D_real", "D_fake")),
    ("D augmentation: p, and r_t = E[sign(D(real))]", ("augment_p", "D_real_sign")),
    (
        "regularizers: R1, R2, gradient penalty, LeCam, path length and its mean",
        ("r1_penalty", "r2_penalty", "gp_penalty", "lecam_penalty", "pl_penalty", "pl_length"),
    ),  # (found from
    ("training top-1 accuracy (%, augmented batches)", ("train_top1",)),  # outside: logged, not drawn; and
    ("orthogonal regularization (BigGAN's, weighted)", ("ortho_G", "ortho_D")),  # BigGAN's ortho)
    ("consistency regularization: CR of real and fake images (unweighted)", ("cr_real_penalty", "cr_fake_penalty")),
    # (zCR's apart: found from outside, flat on 0 beside CR's, a thousand times theirs)
    ("zCR: D's penalty and G's distance (unweighted)", ("zcr_d_penalty", "zcr_g_distance")),
    ("spectral norm: the largest sigma of G's and D's layers (BigGAN's sv0)", ("sv_max_G", "sv_max_D")),
    ("learning rate", ("lr",)),
    ("gradient norm (before clipping)", ("grad_norm_D", "grad_norm_G", "grad_norm")),
    ("images per second", ("img_per_s",)),
    ("batch (data.schedule)", ("batch",)),
    ("resolution (data.schedule)", ("resolution",)),
    ("steps skipped (non-finite gradients)", ("skipped_D", "skipped_G")),
    ("fp16 loss scale", ("loss_scale_D", "loss_scale_G")),
)
NAMED = {title for title, keys in TRAINING_PANELS if len(keys) > 1}  # (panels whose curves a legend names)
# Evaluation scores, each with its spread where the metric has one.
EVAL_METRICS = SCORES
MANY_RUNS = 8  # more runs than this: one legend of them under the panels
LINES = ("-", "--", ":", "-.")  # a run's several curves in a panel, told apart


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's training curves and evaluation scores against kimg into `out` (default
    RUN/plots.png, written atomically); return its path."""
    return plot_runs([run], out)


def plot_runs(paths: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Draw the curves of several runs together, one colour per run (a folder that holds runs, such as
    a sweep's, stands for all of them), into `out` (default: RUN/plots.png for one run, else
    plots.png in the folder that holds them); return its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the environment's display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    runs = _expand([Path(p) for p in paths])
    data = {}
    for run in runs:
        rows = [r for r in read_metrics(run / "metrics.jsonl") if _finite(r.get("kimg"))]
        if not rows and len(runs) == 1:
            raise BigbatchError(
                f"{run} has logged nothing to plot yet (metrics.jsonl gets a line every train.log_every_kimg); "
                "plot it again later"
            )
        logs = [r for r in rows if "eval_seconds" not in r]
        data[run] = (logs, [r for r in rows if "eval_seconds" in r])
    several = len(runs) > 1
    names = _short_names(runs)
    panels = []
    for title, keys in TRAINING_PANELS:
        series = []
        for run, (logs, _) in data.items():
            present = [k for k in keys if any(_number(r.get(k)) for r in logs)]
            if title.startswith(("batch", "resolution")) and len({r.get(keys[0]) for r in logs}) < 2 and not several:
                continue  # a constant batch says nothing; an fp32 run has no loss scale
            if title.startswith("steps skipped") and not any(r.get(k) for r in logs for k in present):
                continue
            series += [(_label(names[run], k, len(present), several), k, logs, None, run) for k in present]
        if series:
            panels.append((title, series, title.startswith("fp16")))
    for metric in EVAL_METRICS:
        series, ns = [], {}
        for run, (_, evals) in data.items():
            if any(_number(r.get(metric)) for r in evals):
                spread = f"{metric}_std" if any(f"{metric}_std" in r for r in evals) else None
                # Scores of another eval.n apart, each said (found from outside: joined in one curve, labelled with
                # the n the config says now); a row of before eval_n was logged: the config's
                by_n: dict[str, list[dict]] = {}
                now = _eval_n([run]) if any("eval_n" not in r for r in evals) else ""
                for r in evals:
                    by_n.setdefault(str(r.get("eval_n", now)), []).append(r)
                for n, rows in by_n.items():
                    label = (names[run] if several else metric) + (f" (n={n})" if len(by_n) > 1 else "")
                    series.append((label, metric, rows, spread, run))
                ns.update(dict.fromkeys(by_n))
        if series:
            held_out = metric.startswith("val_") or metric in FACES
            where = "held-out split" if held_out else f"eval, n={'/'.join(ns)}"
            panels.append((f"{metric} ({where})", series, False))
    if not any(_finite(r.get(key)) for _, series, _ in panels for _, key, rows, *_ in series for r in rows):
        where = f"{runs[0]}/metrics.jsonl holds" if not several else "the runs' metrics.jsonl hold"
        raise BigbatchError(f"{where} no finite losses, speeds or scores to plot")

    cols = 2 if len(panels) > 1 else 1
    rows_n = math.ceil(len(panels) / cols)
    # Constrained: room made for the legends (found from outside: tight_layout's raw UserWarning, and legends over
    # the panels, with 23 runs).
    fig, axes = plt.subplots(rows_n, cols, figsize=(6 * cols, 3.2 * rows_n), squeeze=False, layout="constrained")
    # One colour per run in every panel (matplotlib's cycle restarts in each, giving a run another colour where
    # another run has no curve), each run its own past ten; a run's several curves in a panel told apart by their
    # line style. Many runs: one legend of them under the panels, each panel's naming its line styles alone.
    many = len(runs) > MANY_RUNS
    if len(runs) <= 10:
        colours = {run: f"C{i}" for i, run in enumerate(runs)}
    else:
        cmap = plt.get_cmap("tab20" if len(runs) <= 20 else "turbo")
        colours = {run: cmap(i if len(runs) <= 20 else i / (len(runs) - 1)) for i, run in enumerate(runs)}
    for ax, (title, series, log_y) in zip(axes.flat, panels):
        styles: dict[Path, int] = {}
        keys: dict[str, str] = {}  # (many runs: each key's line style)
        marked = False  # (a value not finite drawn: the legend says what the red crosses are)
        for label, key, source, spread, run in series:
            points = [
                (r["kimg"], r[key], r[spread] if spread and _finite(r.get(spread)) else 0.0)
                for r in source
                if _finite(r.get(key))
            ]
            x, y, s = (list(v) for v in zip(*points)) if points else ([], [], [])
            colour = colours[run] if several else None
            if many:  # (a style a key in every run: found by review, told by each run's order, legend mismatched)
                style = keys.setdefault(label.rpartition(": ")[2] if ": " in label else key, LINES[len(keys) % 4])
            else:
                style = LINES[styles.get(run, 0) % 4] if several else "-"
                styles[run] = styles.get(run, 0) + 1
            if points:
                shown = "_" + label if many else label  # (many: named in the figure's legend)
                ax.plot(x, y, style, color=colour, marker="o" if len(x) < 30 else None, markersize=3, label=shown)
            bad = [r["kimg"] for r in source if isinstance(r.get(key), float) and not math.isfinite(r[key])]
            if bad:  # (NaN or inf, which a line cannot show: marked at the foot of the panel)
                at_foot, marked = ax.get_xaxis_transform(), True
                ax.scatter(
                    bad, [0.03] * len(bad), marker="x", color="red", transform=at_foot,
                    label="not finite" if many else f"{label}: not finite",
                )  # fmt: skip
                ax.update_datalim([(k, 0.0) for k in bad], updatey=False)  # (a run that diverged: past its last
                ax.autoscale_view()  # finite point, where the axis would end without them)
            if spread:
                ax.fill_between(
                    x, [a - b for a, b in zip(y, s)], [a + b for a, b in zip(y, s)], color=colour, alpha=0.2
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("kimg")
        ax.grid(alpha=0.3)
        if log_y:
            ax.set_yscale("log", base=2)
        if many:
            handles = [Line2D([], [], color="black", linestyle=st, label=k) for k, st in keys.items()]
            crosses = [h for h, text in zip(*ax.get_legend_handles_labels()) if text == "not finite"][:1]
            if len(handles) > 1 or crosses:  # (what each line style is; the crosses)
                ax.legend(handles=[*handles, *crosses], fontsize=7)
        # (whose curve it is, when several are drawn, or which of a panel's keys: found from outside, a lone
        # gp_penalty unnamed under a title of five)
        elif len(series) > 1 or several or marked or title in NAMED:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if many:
        handles = [Line2D([], [], color=colours[run], label=names[run]) for run in runs]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(4, len(runs)), fontsize=7)
    if several:
        fig.suptitle(f"{len(runs)} runs", fontsize=11)
    else:
        logs, evals = data[runs[0]]
        fig.suptitle(f"{runs[0].name}: {logs[-1]['kimg'] if logs else evals[-1]['kimg']:g} kimg", fontsize=11)
    if out is None:
        given = [Path(p) for p in paths]
        out = given[0] if len(given) == 1 else _holding(runs, relative=not any(p.is_absolute() for p in given))
        out = out / "plots.png"
    return save_figure(fig, out)


def _holding(runs: Sequence[Path], relative: bool) -> Path:
    """The folder that holds `runs`: relative to the working folder where it lies under it and `relative` (the
    runs were named so), as the plot of one run is named; the working folder where only the file system's root
    holds them all (found from outside: /plots.png was written)."""
    common = Path(os.path.commonpath([p.resolve() for p in runs]))
    if common == Path(common.anchor):
        return Path(".")
    if relative and common.is_relative_to(Path.cwd().resolve()):
        return common.relative_to(Path.cwd().resolve())
    return common


def _expand(paths: list[Path]) -> list[Path]:
    """The runs the paths name: a run directory itself, or each run directory inside a folder of runs."""
    runs = []
    for p in paths:
        if not p.exists():  # (found from outside: said to be no run directory)
            raise BigbatchError(f"{p} does not exist; give a run directory or a folder of runs")
        if not p.is_dir():
            raise BigbatchError(f"{p} is not a run directory (nor a folder of runs)")
        if p.resolve().parent.name == "checkpoints" and (p.resolve().parent.parent / "metrics.jsonl").exists():
            run = p.resolve().parent.parent
            raise BigbatchError(f"{p} is a checkpoint of the run {run}, whose curves it does not hold: plot the run")
        if (p / "metrics.jsonl").exists() or (p / "config.toml").exists():
            runs.append(p)
            continue
        inside = sorted(c for c in p.iterdir() if c.is_dir() and (c / "metrics.jsonl").exists())
        if not inside:
            raise BigbatchError(f"{p} has no metrics.jsonl lines to plot yet (is it a run directory?)")
        runs += inside
    return list(dict.fromkeys(runs))


def _short_names(runs: list[Path]) -> dict[Path, str]:
    """Legend names: the runs' folder names (with their parents' where two share a name)."""
    names = {run: run.name for run in runs}
    if len(set(names.values())) < len(runs):
        names = {run: f"{run.parent.name}/{run.name}" for run in runs}
    return names


def _label(run_name: str, key: str, keys: int, several: bool) -> str:
    if not several:
        return key
    return f"{run_name}: {key}" if keys > 1 else run_name


def _number(v: object) -> bool:  # (NaN and inf too: drawn as marks)
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _eval_n(runs: list[Path]) -> str:
    """eval.n of the runs (their values, when they differ)."""
    from bigbatch.config import Config

    found = []
    for run in runs:
        try:
            found.append(str(Config.load(run / "config.toml").eval.n))
        except BigbatchError:
            found.append("?")
    return "/".join(dict.fromkeys(found))
