"""The swap model built from a config, or read back from a run, a checkpoint or a DeepFaceLab model
folder (`load_autoencoder`; train.init_from)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch import checkpoints, models
from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.models import dfl

DIMS = ("archi", "ae_dims", "e_dims", "d_dims", "d_mask_dims")


def build_model(cfg: Config) -> nn.Module:
    """The autoencoder the config describes, initialised from train.seed (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        return models.create_autoencoder(cfg.model.name, cfg.data.resolution, **cfg.model.options)


def is_dfl_folder(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and any(path.glob("*_SAEHD_data.dat"))


def load_autoencoder(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The SAEHD of a swap run (its latest complete checkpoint), of a checkpoint folder, or of a
    DeepFaceLab model folder, in eval mode, taking and giving RGB in [0, 1]."""
    if is_dfl_folder(path):
        model, _ = dfl.load_model_folder(path)
        return model.to(device).eval().requires_grad_(False)
    return checkpoints.read_newest(path, lambda ckpt: _load(ckpt, device))


def _load(ckpt: Path, device: str | torch.device) -> nn.Module:
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "swap":
        raise BigbatchError(f"{ckpt} is a {cfg.task} run, not a face-swap (task swap) run")
    with torch.device("meta"):
        model = build_model(cfg)
    model = model.to_empty(device="cpu")
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("model",))
    checkpoints.load_weights(model, weights["model"], f"the model of checkpoint {ckpt}")
    model.checkpoint, model.config = ckpt, cfg
    return model.to(device).eval().requires_grad_(False)


def init_from(model: nn.Module, path: str) -> None:
    """train.init_from for the swap task: start from the weights of a swap run, a checkpoint or a DFL
    model folder, whose model must be the one the config describes."""
    source = load_autoencoder(path)
    mine = {k: getattr(model, k) for k in ("resolution", *DIMS)}
    theirs = {k: getattr(source, k) for k in ("resolution", *DIMS)}
    if mine != theirs:
        diff = ", ".join(f"{k} {theirs[k]} (config: {mine[k]})" for k in mine if mine[k] != theirs[k])
        raise BigbatchError(f"train.init_from {path} holds another SAEHD: {diff}; set the config to match")
    model.load_state_dict(source.state_dict())


def trained_parameters(model: nn.Module, cfg: Config) -> list[nn.Parameter]:
    """What the autoencoder's optimizer trains, in its order: every weight, but a liae model's
    inter_AB when random warp is off (DFL leaves it as it is then)."""
    frozen = set() if cfg.swap.random_warp or model.kind == "df" else {id(p) for p in model.inter_AB.parameters()}
    return [p for p in model.parameters() if id(p) not in frozen]


def _dfl_optimizer_file(folder: Path) -> Path | None:
    found = sorted(folder.glob("*_SAEHD_data.dat"))
    if len(found) != 1:
        return None
    path = folder / found[0].name.replace("_data.dat", "_src_dst_opt.npy")
    return path if path.is_file() else None


def init_optimizer(opt: torch.optim.Optimizer, model: nn.Module, path: str, kind: str) -> bool:
    """train.init_from a DFL model folder that holds its optimizer file: start `opt` from its moments
    and step count (DFL's training goes on as it would have). False when there is none to read."""
    folder = Path(path)
    file = _dfl_optimizer_file(folder) if is_dfl_folder(folder) else None
    if file is None:
        return False
    state, step = dfl.import_optimizer(model, dfl.read_weights(file), kind, str(file))
    trained = {id(p) for g in opt.param_groups for p in g["params"]}
    for p, moments in state.items():
        if id(p) in trained:
            opt.state[p] = {k: v.to(p.device) for k, v in moments.items()}
    for group in opt.param_groups:
        group["step"] = step
    return True
