"""Checkpoints: RUN/checkpoints/<kimg>/ with a task's nets in safetensors (a GAN's G, D, G_ema) and
the rest of the state.

A checkpoint is written into a hidden temporary folder, its meta.json last, then renamed into place;
`latest` is rewritten (atomically) after that. A folder without a valid meta.json is never used.
Nothing is unpickled: weights are safetensors, the state goes through torch.load(weights_only=True).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from bigbatch.errors import BigbatchError, warn
from bigbatch.files import atomic_write

BEST = "best"  # RUN/checkpoints/best/: the checkpoint with the best eval score so far


def checkpoint_name(nimg: int) -> str:
    """Folder name of the checkpoint at `nimg` images: kimg with three decimals, zero-padded to sort."""
    return f"{nimg // 1000:06d}.{nimg % 1000:03d}"


def save_checkpoint(
    run_dir: Path,
    nimg: int,
    nets: dict[str, nn.Module],
    state: dict[str, Any],
    config_text: str,
    keep: int,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint at `nimg`, point `latest` at it, and delete all but the newest `keep`.
    `info` (JSON-able: what the models were built for) goes into meta.json."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(nimg)
    final = root / name
    if is_complete(final):  # nothing trained since it was written (e.g. a signal right after a save)
        atomic_write(root / "latest", name + "\n")
        return final
    tmp = _write_folder(root, name, nimg, nets, state, config_text, info)
    shutil.rmtree(final, ignore_errors=True)  # an incomplete folder of the same name
    os.replace(tmp, final)
    atomic_write(root / "latest", name + "\n")
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(
    run_dir: Path,
    nimg: int,
    nets: dict[str, nn.Module],
    state: dict[str, Any],
    config_text: str,
    info: dict[str, Any],
) -> Path:
    """Replace RUN/checkpoints/best/ with the checkpoint at `nimg` (a full one, with the optimizer
    state: sample, eval and --init-from take it). The new folder is complete before the old one moves aside; the old
    one is deleted last, and `best_checkpoint` falls back to it if a crash came in between."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = _write_folder(root, BEST, nimg, nets, state, config_text, info)
    final, old = root / BEST, root / f".{BEST}-old"
    if not final.exists() and is_complete(old):  # a crash came between the renames last time
        os.replace(old, final)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def best_checkpoint(run_dir: Path) -> Path | None:
    """RUN/checkpoints/best/ if complete (else the previous best, if a crash interrupted its replacement)."""
    root = Path(run_dir) / "checkpoints"
    for folder in (root / BEST, root / f".{BEST}-old"):
        if is_complete(folder):
            return folder
    return None


def _write_folder(
    root: Path,
    name: str,
    nimg: int,
    nets: dict[str, nn.Module],
    state: dict[str, Any],
    config_text: str,
    info: dict[str, Any] | None,
) -> Path:
    """A complete checkpoint in a hidden temporary folder under `root` (meta.json last), to rename into place."""
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for key, net in nets.items():
        tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
        save_file(tensors, str(tmp / f"{key}.safetensors"))
    torch.save(state, tmp / "state.pt")
    (tmp / "config.toml").write_text(config_text)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
    for p in tmp.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    atomic_write(
        tmp / "meta.json", json.dumps({"nimg": nimg, "kimg": nimg / 1000, **(info or {}), "files": files}, indent=1)
    )
    return tmp


def read_meta(ckpt: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((Path(ckpt) / "meta.json").read_text())
        return meta if isinstance(meta, dict) and isinstance(meta.get("files"), dict) else None
    except (OSError, ValueError):
        return None


def model_info(ckpt: Path) -> dict[str, Any]:
    """meta.json of a checkpoint with what its nets were built for (class count, channels), or a
    BigbatchError saying it has none."""
    meta = read_meta(ckpt)
    if meta is None or "n_classes" not in meta or "img_channels" not in meta:
        raise BigbatchError(
            f"checkpoint {ckpt} has no usable meta.json; it was not written by this version of bigbatch"
        )
    return meta


def is_complete(ckpt: Path) -> bool:
    """Whether every file that meta.json lists is there with its recorded size."""
    meta = read_meta(ckpt)
    if meta is None:
        return False
    for fname, size in meta["files"].items():
        p = Path(ckpt) / fname
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != BEST and is_complete(p)
    ]
    return sorted(found, key=lambda p: (read_meta(p).get("nimg", -1), p.name))


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a checkpoint folder itself, or a run's `latest` (falling back to
    its newest complete checkpoint when `latest` is missing or names an incomplete one)."""
    path = Path(path)
    if not path.exists():
        raise BigbatchError(f"{path} does not exist; give a run directory or one of its checkpoints/<kimg> folders")
    if (path / "meta.json").exists() or (path / "state.pt").exists():
        if not is_complete(path):
            raise BigbatchError(f"checkpoint {path} is incomplete (interrupted while being written); use another one")
        return path
    if not (path / "checkpoints").is_dir() and not (path / "config.toml").exists():
        raise BigbatchError(f"{path} is neither a run directory nor a checkpoint folder")
    complete = complete_checkpoints(path)
    try:
        name = (path / "checkpoints" / "latest").read_text().strip()
    except OSError:
        name = ""
    if name and (path / "checkpoints" / name) in complete:
        return path / "checkpoints" / name
    if not complete:
        raise BigbatchError(f"run {path} has no complete checkpoint yet")
    warn(f"checkpoints/latest of {path} names no complete checkpoint ({name or 'missing'}); using {complete[-1].name}")
    return complete[-1]


def load_checkpoint(ckpt: Path, nets: tuple[str, ...]) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """Read the weights of `nets` and the training state of a complete checkpoint."""
    weights = {}
    for key in nets:
        try:
            weights[key] = load_file(str(Path(ckpt) / f"{key}.safetensors"))
        except (SafetensorError, OSError) as e:
            raise BigbatchError(f"checkpoint {ckpt} is corrupt: {key}.safetensors cannot be read ({e})") from None
    try:
        state = torch.load(Path(ckpt) / "state.pt", map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BigbatchError(f"checkpoint {ckpt} is corrupt: state.pt cannot be read ({first})") from None
    return weights, state


def load_weights(net: nn.Module, state_dict: dict[str, torch.Tensor], what: str) -> None:
    """Load a state dict, turning a mismatch into one line naming the first differences."""
    try:
        result = net.load_state_dict(state_dict, strict=False)
    except RuntimeError as e:
        detail = " ".join(str(e).split("\n\t")[1:2]).strip() or str(e).splitlines()[0]
        raise BigbatchError(f"{what} does not fit the model built from its config: {detail}") from None
    problems = [f"missing {k}" for k in result.missing_keys] + [f"unexpected {k}" for k in result.unexpected_keys]
    if problems:
        raise BigbatchError(f"{what} does not fit the model built from its config: {', '.join(problems[:3])}")
