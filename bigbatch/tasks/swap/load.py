"""The swap model built from a config, or read back from a run, a checkpoint or a DeepFaceLab model
folder (`load_autoencoder`; train.init_from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch import checkpoint_find, checkpoints, models, safe_pickle
from bigbatch.config import Config
from bigbatch.data.load import check_one_shape, rectangles
from bigbatch.engine.determinism import seeded
from bigbatch.engine.precision import load_optimizer
from bigbatch.errors import BigbatchError
from bigbatch.models import dfl
from bigbatch.tasks.swap.optim import LR_COS, LR_DROPOUT, AdaBelief, RMSprop
from bigbatch.urls import public_name

DIMS = ("archi", "ae_dims", "e_dims", "d_dims", "d_mask_dims")


def build_model(cfg: Config) -> nn.Module:
    """The autoencoder the config describes, initialised from train.seed (the global RNG left as it was)."""
    with seeded(cfg.train.seed):
        return models.create_autoencoder(cfg.model.name, cfg.data.resolution, **cfg.model.options)


def dfl_model(path: str | Path) -> tuple[Path, str | None] | None:
    """(folder, name) of the DeepFaceLab SAEHD model `path` names: a folder holding `<name>_SAEHD_data.dat`
    (name None: its one model), or that file itself (a folder of several models); None if neither."""
    path = Path(path)
    if path.is_file() and path.name.endswith("_SAEHD_data.dat"):
        return path.parent, path.name.removesuffix("_SAEHD_data.dat")
    if path.is_dir() and any(path.glob("*_SAEHD_data.dat")):
        return path, None
    return None


def is_dfl_folder(path: str | Path) -> bool:
    """Whether `path` names a DeepFaceLab SAEHD model (its folder, or its `_data.dat`)."""
    return dfl_model(path) is not None


def load_autoencoder(path: str | Path, device: str | torch.device = "cpu", dfl_folders: bool = True) -> nn.Module:
    """The SAEHD of a swap run (its latest complete checkpoint), of a checkpoint folder, or (`dfl_folders`: for the
    commands that take one) of a DeepFaceLab model folder, in eval mode, taking and giving RGB in [0, 1]."""
    if dfl_folders and (named := dfl_model(path)) is not None:
        model, _ = dfl.load_model_folder(*named)
        return model.to(device).eval().requires_grad_(False)
    try:
        return checkpoint_find.read_newest(path, lambda ckpt: _load(ckpt, device))
    except checkpoint_find.NotARun:
        if not dfl_folders:
            raise
        raise BigbatchError(  # (found from outside: DFL's model folders, which the command takes, went unsaid)
            f"{path} is neither a swap run, a checkpoint folder nor a DeepFaceLab SAEHD model folder "
            "(NAME_SAEHD_data.dat beside its .npy weights)"
        ) from None


def _load(ckpt: Path, device: str | torch.device) -> nn.Module:
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "swap":
        raise BigbatchError(f"{ckpt} is a {cfg.task} run, not a face-swap (task swap) run")
    with torch.device("meta"):
        model = build_model(cfg)
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("model",), state=False)
    checkpoints.load_weights(model, weights["model"], f"the model of checkpoint {ckpt}", assign=True)
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
    """What the autoencoder's optimizer trains (the rest gets no gradient), in its order: every weight, but a
    liae model's inter_AB when random warp is off (DFL leaves it as it is then)."""
    frozen = set() if cfg.swap.random_warp or model.kind == "df" else {id(p) for p in model.inter_AB.parameters()}
    return [p for p in model.parameters() if id(p) not in frozen]


def optimizer_parameters(model: nn.Module, count: int | None = None) -> list[nn.Parameter]:
    """The autoencoder's optimizer's parameters in its order: every weight, as DFL's optimizer holds them all
    (a liae model's inter_AB too, whose moments stay as they are while random warp is off: found from outside,
    they were dropped, and zeros went to DFL). `count`: the size of a saved optimizer state to read, whose
    order, if a run saved before without random warp, is the weights without inter_AB."""
    every = list(model.parameters())
    if count is None or count == len(every):
        return every
    held = {id(p) for p in model.inter_AB.parameters()} if model.kind == "liae" else set()
    without = [p for p in every if id(p) not in held]
    if held and count == len(without):
        return without
    raise BigbatchError(
        f"the saved optimizer holds {count} weights, and this model has {len(every)}: it is another model's (archi or "
        "dims); start from its weights alone with a new run, or give the model the config it was trained with"
    )


def make_optimizer(cfg: Config, params: list[nn.Parameter], stream: int) -> torch.optim.Optimizer:
    """DFL's optimizer as swap.* configures it (lr dropout and its cosine together, as DFL couples them);
    `stream` keys its dropout masks (0: the autoencoder's, 1 and 2: the discriminators')."""
    cls = AdaBelief if cfg.swap.optimizer == "adabelief" else RMSprop
    return cls(params, **_rates(cfg), seed=(cfg.train.seed, stream))


def _rates(cfg: Config) -> dict[str, float]:
    """The optimizer's rate settings swap.* gives (lr dropout and its cosine together, as DFL couples them)."""
    drop, cos = (LR_DROPOUT, LR_COS) if cfg.swap.lr_dropout else (1.0, 0)
    return {"lr": cfg.swap.lr, "lr_dropout": drop, "lr_cos": cos}


def _dfl_file(model: str | Path, part: str) -> Path | None:
    """`<name>_SAEHD_<part>` of the DFL model `model` names (a folder of one model, or its _data.dat), if
    it is there."""
    folder, name = dfl_model(model) or (Path(model), None)
    found = [folder / f"{name}_SAEHD_data.dat"] if name else sorted(folder.glob("*_SAEHD_data.dat"))
    if len(found) != 1:
        return None
    path = folder / found[0].name.replace("_data.dat", f"_{part}")
    return path if path.is_file() else None


def dfl_record(path: str | Path) -> tuple[bytes | None, int]:
    """What DFL keeps beside the weights, carried so that export-dfl gives it back: the bytes of a DFL
    folder's `_data.dat` (its options, loss history, preview faces) and its iteration count; from a
    swap run or checkpoint, what it carries from the DFL model it started from, and its iterations
    counting its own. (None, 0) if nothing."""
    if is_dfl_folder(path):
        file = _dfl_file(path, "data.dat")
        if file is None:
            return None, 0
        raw = file.read_bytes()
        data = safe_pickle.loads(raw, str(file))
        return raw, dfl.option(data, "iter", int, str(file)) if isinstance(data, dict) and data.get("iter") else 0
    state = checkpoint_find.read_newest(path, lambda ckpt: checkpoints.load_checkpoint(ckpt, nets=())[1])
    return state.get("dfl_data"), int(state.get("dfl_iter", 0)) + int(state.get("steps", 0))


def init_optimizer(opt: torch.optim.Optimizer, model: nn.Module, path: str, kind: str) -> bool:
    """train.init_from a DFL model folder that holds its optimizer file, or a swap run or checkpoint of
    the same optimizer (one `bigbatch convert` made, for one): start `opt` from its moments and step
    count, so that training goes on as DFL's would have. False when there is none to read."""
    if not is_dfl_folder(path):
        return _init_optimizer_from_run(opt, model, path, kind)
    file = _dfl_file(path, "src_dst_opt.npy")
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


def _init_optimizer_from_run(opt: torch.optim.Optimizer, model: nn.Module, path: str, kind: str) -> bool:
    def read(ckpt: Path) -> tuple[Config, dict]:
        return Config.load(ckpt / "config.toml"), checkpoints.load_checkpoint(ckpt, nets=())[1]

    cfg, state = checkpoint_find.read_newest(path, read)
    saved = state.get("opt")
    if not saved or cfg.swap.optimizer != kind:
        return False
    # The saved state indexes the parameters its run trained (their names map onto this same model's).
    names = {id(p): name for name, p in model.named_parameters()}
    trained = [names[id(p)] for p in optimizer_parameters(model, sum(len(g["params"]) for g in saved["param_groups"]))]
    by_name = {trained[i]: moments for i, moments in saved["state"].items()}
    mine = [p for g in opt.param_groups for p in g["params"]]
    for p in mine:
        if names[id(p)] in by_name:
            opt.state[p] = {k: v.to(p.device) for k, v in by_name[names[id(p)]].items()}
    for group in opt.param_groups:
        group["step"] = int(saved["param_groups"][0].get("step", 0))
    return True


def init_discriminators(discs: dict[str, tuple[nn.Module, nn.Module, torch.optim.Optimizer]], path: str) -> list[str]:
    """train.init_from a swap run or checkpoint that trained the same discriminators (DFL keeps its GAN.npy
    across restarts): their weights and optimizer moments, so that they go on where they were. Returns the
    names carried (a DFL folder's, which bigbatch does not read, or one the source has not: none)."""
    if not discs or is_dfl_folder(path):
        return []

    def read(ckpt: Path) -> tuple[dict, dict]:
        saved = {f.removesuffix(".safetensors") for f in (checkpoints.read_meta(ckpt) or {}).get("files", {})}
        return checkpoints.load_checkpoint(ckpt, nets=tuple(n for n in discs if n in saved))

    weights, state = checkpoint_find.read_newest(path, read)
    carried = []
    for name, (plain, _, opt) in discs.items():
        theirs, moments = weights.get(name), state.get(f"opt_{name}")
        mine = plain.state_dict()
        if theirs is None or moments is None or any(theirs.get(k, v).shape != v.shape for k, v in mine.items()):
            continue  # (another gan_dims or patch size: a new one, as before)
        checkpoints.load_weights(plain, theirs, f"the {name} of train.init_from {path}")
        load_optimizer(opt, moments)
        carried.append(name)
    return carried


def source_face_type(path: str | Path) -> str | None:
    """DFL's face type a swap model (a train.init_from, or what swap and merge apply) was trained on, where known:
    a DFL folder's option (DFL's "f" if unset), a swap run's or checkpoint's record (or its swap.face_type)."""
    if is_dfl_folder(path):
        file = _dfl_file(path, "data.dat")
        data = safe_pickle.loads(file.read_bytes(), str(file)) if file is not None else None
        options = dfl.with_defaults(data.get("options")) if isinstance(data, dict) else None
        found = options.get("face_type") if isinstance(options, dict) else None
        return found if isinstance(found, str) and found else None

    def read(ckpt: Path) -> str | None:
        return checkpoints.model_info(ckpt).get("face_type") or Config.load(ckpt / "config.toml").swap.face_type

    return checkpoint_find.read_newest(path, read) or None


def check_source_face_type(path: str, face_type: str) -> None:
    """train.init_from a model trained on faces of another DFL face type than these (found from outside: taken
    silently, and export-dfl then wrote the faces' type for a model that learned the other's framing)."""
    theirs = source_face_type(path)
    if theirs and face_type and theirs != face_type:
        raise BigbatchError(
            f"train.init_from {path} was trained on faces of DFL's face type {theirs!r}, and these are "
            f"{face_type!r}: the model learned that framing, and DFL's merger crops by it; extract the faces "
            f"as {theirs!r} (bigbatch extract --face-type {theirs}), or train a new model"
        )


def resume_optimizer(opt: torch.optim.Optimizer, saved: dict, cfg: Config, model: nn.Module | None = None) -> None:
    """Load a swap run's optimizer state on resume, with the rates its config gives now (a resume may switch
    swap.lr and lr_dropout: the saved groups' would stand). `model`: the autoencoder whose trained set a switch
    of a checkpoint saved before without random warp (liae's inter_AB not in its optimizer): the moments follow
    their weights."""
    mine = [p for g in opt.param_groups for p in g["params"]]
    count = sum(len(g["params"]) for g in saved["param_groups"])
    if model is not None and count != len(mine):
        before = optimizer_parameters(model, count)
        by_param = {id(p): saved["state"][i] for i, p in enumerate(before) if i in saved["state"]}
        state = {i: by_param[id(p)] for i, p in enumerate(mine) if id(p) in by_param}
        saved = {"state": state, "param_groups": [{**saved["param_groups"][0], "params": list(range(len(mine)))}]}
    load_optimizer(opt, saved)
    for group in opt.param_groups:
        group.update(_rates(cfg))


def check_face_size(cfg: Config, side: str, source: str, r: int, meta: dict | None = None) -> None:
    """One side's faces are at the model's resolution (also --dry-run's check, from the file's metadata)."""
    if rect := rectangles(meta or {}):  # (found by review: "are 0 px")
        raise BigbatchError(
            f"the {side} faces {source} are {rect}: prepare them with --resolution {cfg.data.resolution}"
        )
    if r != cfg.data.resolution:
        raise BigbatchError(
            f"the {side} faces {source} are {r} px, the model data.resolution = {cfg.data.resolution}: prepare "
            f"them with --resolution {cfg.data.resolution}"
        )


def check_faces(cfg: Config, data: Any, side: str) -> Any:
    """`data` if the swap task can read it: 3, 4 or 5 channels at the model's resolution."""
    if data.channels not in (3, 4, 5):
        raise BigbatchError(
            f"the {side} faces {data.source} have {data.channels} channels; the swap task reads RGB (3), "
            "RGB + mask (4) or RGB + mask + eyes-and-mouth (5): prepare them with bigbatch prepare "
            "[--masks alpha|dfl|DIR]"
        )
    check_one_shape(f"data.{'dst_' if side == 'dst' else ''}path", data.source, len(getattr(data, "bucket_counts", [])))
    check_face_size(cfg, side, data.source, data.resolution, getattr(data, "meta", None))
    return data


NO_YAWS = (
    "prepare them again from aligned DeepFaceLab faces alone (bigbatch extract's or DFL's, which carry their "
    "landmarks; not with --buckets or --crop none), or set it to false"
)


def check_yaws(cfg: Config, src: Any, dst: Any) -> None:
    """swap.uniform_yaw needs each face's yaw, which prepare keeps from aligned DFL faces."""
    for side, data in (("src", src), ("dst", dst)):
        if cfg.swap.uniform_yaw and getattr(data, "yaws", None) is None:
            said = f"needs each face's yaw, and the {side} faces {data.source} have none: {NO_YAWS}"
            cfg.swap._fail("uniform_yaw", said)


def check_resumed_dst(run: Path, resumed_at: int, path: str, dst: Any) -> None:
    """On resume, the dst faces must be those the checkpoint was trained on (as the loop checks src's)."""
    meta = checkpoints.read_meta(run / "checkpoints" / checkpoints.checkpoint_name(resumed_at)) or {}
    before = meta.get("dst") if isinstance(meta.get("dst"), dict) else {}
    recorded, now = str(before.get("content_hash", "")), str(dst.content_hash)
    if recorded and recorded != now:
        raise BigbatchError(
            f"data.dst_path {public_name(path)} holds other images than the run was trained on (content hash "
            f"{now[:16]}…, the checkpoint recorded {recorded[:16]}… for {before.get('path')}); resume on that data "
            "(data.dst_path=...), or start a new run from its weights with train.init_from=RUN"
        )
