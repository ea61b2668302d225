"""`bigbatch eval RUN [SRC] [--dst DST]` for a swap run: how well its autoencoder reconstructs faces, as
SSIM in SAEHD's window (the score the run keeps its best checkpoint by), src faces through the src path
and dst faces through the dst path. By default the run's held-out faces (data.val_fraction of each
side); SRC and DST score other data sets of faces. Written under RUN/eval/<data>-<checkpoint>/: metrics.json and
preview.png (DFL's preview columns for the first faces)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from bigbatch.checkpoint_find import read_picked
from bigbatch.config import Config
from bigbatch.data.load import load_data, validation_data
from bigbatch.data.split import holdout
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.run_data import eval_folder, run_config
from bigbatch.sampling import save_png
from bigbatch.tasks.swap.load import check_faces, load_autoencoder, source_face_type
from bigbatch.tasks.swap.scorer import reconstruction_ssim
from bigbatch.tasks.swap.task import PREVIEW_ROWS, preview_sheet
from bigbatch.urls import public_name


def _faces(path: str, side: str, cfg: Config, face_type: str) -> Any:
    """Faces to score on, checked as training checks them (channels; the model's resolution; its face type)."""
    data = load_data(path, cfg.data.resolution, storage_options=cfg.data.storage_options or None)
    data = check_faces(cfg, data, side)
    theirs = getattr(data, "meta", {}).get("face_type")
    if face_type and theirs and theirs != face_type:  # (found from outside: scored without a word; swap refuses)
        raise BigbatchError(
            f"{public_name(path)} holds faces of DFL's face type {theirs!r}, and the model was trained on "
            f"{face_type!r} faces: prepare them with --face-type {face_type}"
        )
    return data


def evaluate_swap(
    run: str | Path,
    src_path: str | None = None,
    dst_path: str | None = None,
    which: str = "latest",
    device: str | torch.device = "cpu",
    endpoint_url: str | None = None,
) -> dict[str, Any]:
    """Score a swap run's autoencoder; write RUN/eval/<data>-<checkpoint>/ (metrics.json, preview.png) and return
    the scores: src_ssim and dst_ssim (each side scored only when it has data) and their mean. `endpoint_url`: the
    S3 endpoint to read the data from, in place of the run's data.storage_options' (their other options kept)."""

    def read(ckpt: Path) -> tuple[Path, Config, Any]:
        cfg = run_config(ckpt, endpoint_url)
        if cfg.task != "swap":
            raise BigbatchError(f"{ckpt} is a {cfg.task} run, not a face swap")
        return ckpt, cfg, load_autoencoder(ckpt, device)

    ckpt, cfg, model = read_picked(run, which, read)  # (a run's latest pruned meanwhile: its newest)
    d = cfg.data
    if src_path is None and dst_path is None:
        if not d.val_fraction:
            raise BigbatchError(
                f"{run} held no faces out (data.val_fraction = 0): give faces to score on, "
                "bigbatch eval RUN SRC.h5 [--dst DST.h5]"
            )
        dst = load_data(d.dst_path, d.resolution, d.in_ram, d.storage_options or None)
        sides = {"src": validation_data(cfg), "dst": holdout(dst, d.val_fraction)[1]}
        name, described = "heldout", "held-out faces"
    else:
        given = {"src": src_path, "dst": dst_path}
        face_type = source_face_type(ckpt) or ""
        sides = {side: _faces(path, side, cfg, face_type) for side, path in given.items() if path is not None}
        stems = [Path(path.removeprefix("builtin:")).stem for path in given.values() if path is not None]
        name = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "data" for stem in stems)
        described = ", ".join(f"{side} {public_name(path)}" for side, path in given.items() if path is not None)
    scores: dict[str, Any] = {}
    for side, data in sides.items():
        scores[f"{side}_ssim"] = round(reconstruction_ssim(model, data, side, cfg.eval.batch_size), 6)
        scores[f"{side}_n"] = len(data)
    values = [v for k, v in scores.items() if k.endswith("_ssim")]
    scores["ssim"] = round(sum(values) / len(values), 6)
    out = eval_folder(run, ckpt, name, described)
    report = {"data": described, "checkpoint": str(ckpt), "resolution": model.resolution, **scores, "folder": str(out)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "metrics.json", json.dumps(report, indent=1) + "\n")
    faces = {side: data.get(torch.arange(min(PREVIEW_ROWS, len(data))))[0] for side, data in sides.items()}
    src, dst = faces.get("src", faces.get("dst")), faces.get("dst", faces.get("src"))
    rows = min(len(src), len(dst))
    save_png(preview_sheet(model, src[:rows], dst[:rows]), out / "preview.png")
    return report


def describe(report: dict[str, Any]) -> str:
    """The lines `bigbatch eval` prints for a swap run."""
    sides = [
        f"{side} SSIM {report[f'{side}_ssim']:.4f} ({report[f'{side}_n']} faces)"
        for side in ("src", "dst")
        if f"{side}_ssim" in report
    ]
    return "\n".join(
        [
            f"{report['data']} at {report['resolution']} px, checkpoint {report['checkpoint']}",
            "  ".join(sides) + f"  mean {report['ssim']:.4f}",
            f"wrote {report['folder']}/: metrics.json, preview.png",
        ]
    )
