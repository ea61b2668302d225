"""`bigbatch plot RUN`: the curves of a run's metrics.jsonl in one PNG (matplotlib, no display needed)."""

from __future__ import annotations

import io
import math
from pathlib import Path

from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.rundir import read_metrics

# Panels of training log lines: title and the keys drawn in it (those the run logged).
TRAINING_PANELS = (
    ("losses", ("loss_D", "loss_G", "loss")),
    ("D outputs (mean logits)", ("D_real", "D_fake")),
    ("training top-1 accuracy (%, augmented batches)", ("train_top1",)),
    ("learning rate", ("lr",)),
    ("gradient norm (before clipping)", ("grad_norm_D", "grad_norm_G", "grad_norm")),
    ("images per second", ("img_per_s",)),
    ("batch (data.schedule)", ("batch",)),
    ("steps skipped (non-finite gradients)", ("skipped_D", "skipped_G")),
    ("fp16 loss scale", ("loss_scale_D", "loss_scale_G")),
)
# Evaluation scores, each with its spread where the metric has one.
EVAL_METRICS = ("fid", "is", "kid", "fcd", "cs", "kcd", "val_top1", "val_top5", "val_loss")


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's training curves and evaluation scores against kimg into `out` (default
    RUN/plots.png, written atomically); return its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the environment's display
    import matplotlib.pyplot as plt

    run = Path(run)
    if not run.is_dir():
        raise BigbatchError(f"{run} is not a run directory")
    rows = [r for r in read_metrics(run / "metrics.jsonl") if _finite(r.get("kimg"))]
    if not rows:
        raise BigbatchError(f"{run} has no metrics.jsonl lines to plot yet (is it a run directory?)")
    logs = [r for r in rows if "eval_seconds" not in r]
    evals = [r for r in rows if "eval_seconds" in r]
    panels = []
    for title, keys in TRAINING_PANELS:
        present = [k for k in keys if any(_finite(r.get(k)) for r in logs)]
        if not present or (title.startswith("batch") and len({r.get("batch") for r in logs}) < 2):
            continue  # a constant batch says nothing; an fp32 run has no loss scale
        if title.startswith("steps skipped") and not any(r.get(k) for r in logs for k in present):
            continue
        panels.append((title, [(k, logs, None) for k in present], title.startswith("fp16")))
    for metric in EVAL_METRICS:
        if any(_finite(r.get(metric)) for r in evals):
            spread = f"{metric}_std" if any(f"{metric}_std" in r for r in evals) else None
            where = "held-out split" if metric.startswith("val_") else f"eval, n={_eval_n(run)}"
            panels.append((f"{metric} ({where})", [(metric, evals, spread)], False))
    if not panels:
        raise BigbatchError(f"{run}/metrics.jsonl holds no finite losses, speeds or scores to plot")

    cols = 2 if len(panels) > 1 else 1
    rows_n = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(6 * cols, 3.2 * rows_n), squeeze=False)
    for ax, (title, series, log_y) in zip(axes.flat, panels):
        for key, source, spread in series:
            points = [
                (r["kimg"], r[key], r[spread] if spread and _finite(r.get(spread)) else 0.0)
                for r in source
                if _finite(r.get(key))
            ]
            x, y, s = (list(v) for v in zip(*points))
            ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, label=key)
            if spread:
                ax.fill_between(x, [a - b for a, b in zip(y, s)], [a + b for a, b in zip(y, s)], alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("kimg")
        ax.grid(alpha=0.3)
        if log_y:
            ax.set_yscale("log", base=2)
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{run.name}: {logs[-1]['kimg'] if logs else evals[-1]['kimg']:g} kimg", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    path = Path(out) if out is not None else run / "plots.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
    return path


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _eval_n(run: Path) -> str:
    from bigbatch.config import Config

    try:
        return str(Config.load(run / "config.toml").eval.n)
    except BigbatchError:
        return "?"
