"""Reading runs and checkpoints back: the EMA generator, and a summary of what a path holds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError, warn
from bigbatch.files import atomic_write


def checkpoint_model_info(ckpt: Path) -> dict:
    meta = checkpoints.read_meta(ckpt)
    if meta is None or "n_classes" not in meta or "img_channels" not in meta:
        raise BigbatchError(
            f"checkpoint {ckpt} has no usable meta.json; it was not written by this version of bigbatch"
        )
    return meta


def load_generator(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The EMA generator of a run (its latest complete checkpoint) or of a checkpoint folder, in eval mode."""
    from bigbatch.train import build_models

    ckpt = checkpoints.find_checkpoint(path)
    meta = checkpoint_model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    G, _ = build_models(cfg, meta["n_classes"], meta["img_channels"])
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("G_ema",))
    checkpoints.load_weights(G, weights["G_ema"], f"G_ema of checkpoint {ckpt}")
    G.class_names = meta.get("class_names", [])
    return G.to(device).eval().requires_grad_(False)


def describe(path: str | Path) -> str:
    """What a run directory or checkpoint holds, as a few lines of text."""
    path = Path(path)
    ckpt = checkpoints.find_checkpoint(path)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    meta = checkpoint_model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    t, m = cfg.train, cfg.model
    lines = []
    if run is not None and path.resolve() == run.resolve():
        ckpts = checkpoints.complete_checkpoints(run)
        lines.append(f"run         {run}")
        lines.append(f"checkpoints {', '.join(p.name for p in ckpts)} (latest {ckpt.name})")
        rows = read_metrics(run / "metrics.jsonl")
        logs = [r for r in rows if "eval_seconds" not in r]
        evals = [r for r in rows if "eval_seconds" in r]
        if logs:
            lines.append("last log    " + _row_text(logs[-1]))
        if evals:
            lines.append("last eval   " + _row_text(evals[-1]))
        best = checkpoints.best_checkpoint(run)
        record = (checkpoints.read_meta(best) or {}).get("best") if best is not None else None
        if isinstance(record, dict):
            lines.append(f"best        {best} ({record.get('metric')} {record.get('value', float('nan')):.4g})")
    lines.append(f"checkpoint  {ckpt} ({meta['kimg']:.3f} of {t.kimg:g} kimg)")
    lines.append(
        f"recipe      {cfg.name}: data {cfg.data.path} at {cfg.data.resolution}px, {meta['n_classes'] or 'no'} classes"
    )
    lines.append(f"model       {m.name} ch {m.ch} dim_z {m.dim_z}" + (f" {m.options}" if m.options else ""))
    lines.append(
        f"training    batch {t.batch} (micro {t.micro_batch}), d_steps {t.d_steps}, lr G {t.g_lr:g} D {t.d_lr:g}, "
        f"{t.loss} loss, {t.precision}, seed {t.seed}"
    )
    if cfg.data.schedule:
        phases = cfg.schedule().phases
        lines.append("schedule    " + ", ".join(f"batch {p.batch} from {p.start / 1000:g} kimg" for p in phases))
    files = meta["files"]
    lines.append("files       " + ", ".join(f"{k} ({v / 1e6:.1f} MB)" for k, v in files.items()))
    return "\n".join(lines)


def _row_text(row: dict) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (none if it is missing), skipping a line cut short by a crash."""
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def convert_reference(src: str | Path, out: str | Path, cfg: Config, n_classes: int | None = None) -> Path:
    """Write a run directory (one checkpoint at 0 kimg) holding BigGAN-PyTorch weights: `src` is its
    weights folder (G.pth, G_ema.pth and D.pth; G_ema or G suffices) or a single generator .pth.
    The model is the one `cfg` describes; the name mapping is in bigbatch.models.convert."""
    from bigbatch.engine.ema import make_ema
    from bigbatch.models import convert
    from bigbatch.train import build_models

    src, out = Path(src), Path(out)
    if cfg.model.name not in convert.FAMILIES:
        raise BigbatchError(
            f"BigGAN-PyTorch weights convert into {', '.join(convert.FAMILIES)}; model.name is {cfg.model.name}"
        )
    if src.is_dir():
        files = {net: src / f"{net}.pth" for net in ("G", "G_ema", "D") if (src / f"{net}.pth").exists()}
        if "G" not in files and "G_ema" not in files:
            raise BigbatchError(f"{src} holds neither G.pth nor G_ema.pth (BigGAN-PyTorch's weight files)")
    elif src.exists():
        files = {"G_ema": src}
    else:
        raise BigbatchError(f"{src} does not exist; give BigGAN-PyTorch's weights folder or a G .pth file")
    if out.exists() and any(out.iterdir()):
        raise BigbatchError(f"{out} exists and is not empty; choose a new folder for the converted run")
    ref = {net: convert.load_reference_file(str(path)) for net, path in files.items()}
    if n_classes is None:
        found = [sd[k].shape[0] for sd in ref.values() for k in ("shared.weight", "embed.weight") if k in sd]
        if not found:
            raise BigbatchError("cannot tell the number of classes from the weights; pass --classes N")
        n_classes = int(found[0])
    G, D = build_models(cfg, n_classes, 3)
    for net, model in (("G_ema", G), ("G", G)):
        if net in ref:  # G carries G_ema's weights while G.pth is read, so G_ema is never empty
            model.load_state_dict(convert.from_reference(model, ref[net], f"the weights in {files[net]}"))
    G_ema = make_ema(G)
    if "G_ema" in ref:
        G_ema.load_state_dict(convert.from_reference(G_ema, ref["G_ema"], f"the weights in {files['G_ema']}"))
    if "D" in ref:
        D.load_state_dict(convert.from_reference(D, ref["D"], f"the weights in {files['D']}"))
    else:
        warn(f"no D.pth in {src}: D is freshly initialised (fine-tuning will train it from scratch)")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.toml", cfg.dumps())
    info = {
        "n_classes": n_classes,
        "img_channels": G.img_channels,
        "class_names": [str(i) for i in range(n_classes)],
        "converted_from": str(src),
    }
    nets = {"G": G, "D": D, "G_ema": G_ema}
    return checkpoints.save_checkpoint(out, 0, nets, {"converted_from": str(src)}, cfg.dumps(), 1, info)
