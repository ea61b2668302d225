"""Reading runs and checkpoints back: the EMA generator, and a summary of what a path holds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from bigbatch.config import Config
from bigbatch.engine import state
from bigbatch.errors import BigbatchError


def checkpoint_model_info(ckpt: Path) -> dict:
    meta = state.read_meta(ckpt)
    if meta is None or "n_classes" not in meta or "img_channels" not in meta:
        raise BigbatchError(
            f"checkpoint {ckpt} has no usable meta.json; it was not written by this version of bigbatch"
        )
    return meta


def load_generator(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The EMA generator of a run (its latest complete checkpoint) or of a checkpoint folder, in eval mode."""
    from bigbatch.train import build_models

    ckpt = state.find_checkpoint(path)
    meta = checkpoint_model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    G, _ = build_models(cfg, meta["n_classes"], meta["img_channels"])
    weights, _ = state.load_checkpoint(ckpt, nets=("G_ema",))
    state.load_weights(G, weights["G_ema"], f"G_ema of checkpoint {ckpt}")
    G.class_names = meta.get("class_names", [])
    return G.to(device).eval().requires_grad_(False)


def describe(path: str | Path) -> str:
    """What a run directory or checkpoint holds, as a few lines of text."""
    path = Path(path)
    ckpt = state.find_checkpoint(path)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    meta = checkpoint_model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    t, m = cfg.train, cfg.model
    lines = []
    if run is not None and path.resolve() == run.resolve():
        ckpts = state.complete_checkpoints(run)
        lines.append(f"run         {run}")
        lines.append(f"checkpoints {', '.join(p.name for p in ckpts)} (latest {ckpt.name})")
        if rows := read_metrics(run / "metrics.jsonl"):
            last = rows[-1]
            lines.append(
                "last log    "
                + "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in last.items())
            )
    lines.append(f"checkpoint  {ckpt} ({meta['kimg']:.3f} of {t.kimg:g} kimg)")
    lines.append(
        f"recipe      {cfg.name}: data {cfg.data.path} at {cfg.data.resolution}px, {meta['n_classes'] or 'no'} classes"
    )
    lines.append(f"model       {m.name} ch {m.ch} dim_z {m.dim_z}" + (f" {m.options}" if m.options else ""))
    lines.append(
        f"training    batch {t.batch} (micro {t.micro_batch}), d_steps {t.d_steps}, lr G {t.g_lr:g} D {t.d_lr:g}, "
        f"{t.loss} loss, {t.precision}, seed {t.seed}"
    )
    files = meta["files"]
    lines.append("files       " + ", ".join(f"{k} ({v / 1e6:.1f} MB)" for k, v in files.items()))
    return "\n".join(lines)


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (none if it is missing), skipping a line cut short by a crash."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
