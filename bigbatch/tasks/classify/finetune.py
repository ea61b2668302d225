"""Fine-tuning a classifier (fastai's `fine_tune`): train.init_from a classify run or a state dict in
torchvision's or timm's layout (bigbatch's ResNets keep torchvision's names), the body loaded, the
head (`fc`) new for the data's classes; train.freeze_kimg trains the head alone first and
train.body_lr_mult gives the body a rate of its own. State dicts are read with weights_only (.pth)
or as safetensors: nothing is unpickled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.errors import BigbatchError, first_line
from bigbatch.models.registry import is_own
from bigbatch.safe_pickle import torch_weights
from bigbatch.urls import public_name

HEAD = "fc."  # the classifier layer every bigbatch classifier family ends in


def read_state_dict(
    path: str, family: str = "", input_stats: str | None = None
) -> tuple[dict[str, torch.Tensor], list[str] | None, str]:
    """The tensors of a .pth/.pt (torch.load, weights_only) or .safetensors file, or of a classify
    run's (or checkpoint's) network, with its class names where known (a run's) and the entry of a training
    checkpoint they were taken from (its average of the weights first, as timm's load_checkpoint takes it:
    `state_dict_ema` or `model_ema`, else `state_dict` or `model`; "" for none), DDP's `module.` prefixes dropped.
    `family`: the model.name to load into, which a run of another is refused by name; `input_stats`: the network's
    to load into, which a run fed otherwise is refused by (found by review: a run fed [-1, 1] was fine-tuned fed
    ImageNet's statistics)."""
    p = Path(path)
    if p.is_dir():
        from bigbatch import checkpoint_find
        from bigbatch.metrics.classifier import classifier_weights

        def named(ckpt: Path) -> tuple[dict[str, torch.Tensor], list[str] | None, str]:
            _a_run_to_load(ckpt, path, family, input_stats)
            return classifier_weights(ckpt), (checkpoints.read_meta(ckpt) or {}).get("class_names"), ""

        return checkpoint_find.read_newest(p, named)
    # A network's file of a checkpoint: its run's classes and settings checked as the checkpoint's (found from
    # outside: CKPT/model.safetensors fine-tuned on classes in another order kept its head, said to be the data's).
    names = None
    if p.suffix == ".safetensors" and (p.parent / "config.toml").is_file() and (p.parent / "meta.json").is_file():
        _a_run_to_load(p.parent, path, family, input_stats)
        names = (checkpoints.read_meta(p.parent) or {}).get("class_names")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise BigbatchError(f"train.init_from {public_name(path)}: {e.strerror or e}") from None
    if p.suffix == ".safetensors":
        from safetensors.torch import load

        try:
            state: Any = load(data)
        except Exception as e:  # noqa: BLE001 -- safetensors raises several types on bad files
            raise BigbatchError(
                f"train.init_from {public_name(path)} is not a safetensors file ({first_line(e)})"
            ) from None
    else:
        state = torch_weights(data, f"train.init_from {public_name(path)}")
    entry = ""  # (timm's and DeiT's wrappers; found from outside: timm's --model-ema weights passed over)
    for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state, entry = state[key], key
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BigbatchError(f"train.init_from {public_name(path)} does not hold a state dict of named tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}, names, entry


def _a_run_to_load(ckpt: Path, path: str, family: str, input_stats: str | None) -> None:
    """Refuse a checkpoint a classifier of `family` fed `input_stats` cannot start from (see read_state_dict)."""
    from bigbatch.config import Config

    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "classify":  # (found from outside: a GAN run's checkpoint was called corrupt)
        raise BigbatchError(
            f'train.init_from {path} is a {cfg.task} run, not a classifier (task = "classify"): give a '
            "classify run, its checkpoint, or a .pth/.safetensors file of a classifier's weights"
        )
    if family and cfg.model.name != family:  # (found from outside: called "another network's state dict")
        raise BigbatchError(
            f"train.init_from {path} is a {cfg.model.name} run, and this config's model.name is {family}: "
            f"give weights of a {family}, or model.name = {cfg.model.name!r} (and its options) to fine-tune it"
        )
    theirs = cfg.model.options.get("input_stats", "")
    if input_stats is not None and theirs != input_stats:
        fed = {"imagenet": "normalized by ImageNet's mean and std"}
        raise BigbatchError(
            f"train.init_from {path} learned on images {fed.get(theirs, 'in [-1, 1]')} (its "
            f"model.options.input_stats = {theirs!r}), and this config gives them "
            f"{fed.get(input_stats, 'in [-1, 1]')}: set model.options.input_stats = {theirs!r}"
        )


def load_pretrained(net: nn.Module, path: str, class_names: list[str], family: str = "") -> str:
    """Load the body of `net` from `path` (every tensor but the head must be there, of the same shape);
    the head too when it has the same shape and, from a run, the same classes (`class_names`, the data's),
    else it stays new. Returns the line that says which. `family`: read_state_dict's."""
    theirs, names, entry = read_state_dict(path, family, getattr(net, "input_stats", None))
    mine = net.state_dict()
    for key, value in mine.items():
        if key.startswith(HEAD) or (key.endswith("num_batches_tracked") and key not in theirs):
            continue  # (BatchNorm's step count, which files saved before PyTorch 0.4 lack: PyTorch loads them so)
        if key not in theirs:
            raise BigbatchError(
                f"train.init_from {public_name(path)} is another network's state dict: it lacks {key} "
                f"(it holds {min(theirs, default='nothing')}, ...); give one of this model's layout"
            )
        if theirs[key].shape != value.shape:
            width = ""  # (found from outside: a preset's model.ch kept for another family, resnet18 a quarter wide)
            if key == next(iter(mine)) and theirs[key].shape[1:] == value.shape[1:] and is_own(family):
                width = f": model.ch sets this model's width, the file's is model.ch={theirs[key].shape[0]}"
            raise BigbatchError(
                f"train.init_from {public_name(path)} is another network's state dict: its {key} is "
                f"{tuple(theirs[key].shape)}, this model's {tuple(value.shape)}{width}"
            )
    head = [k for k in mine if k.startswith(HEAD)]
    shaped = all(k in theirs and theirs[k].shape == mine[k].shape for k in head)
    head_fits = shaped and (names is None or list(names) == list(class_names))
    load = {k: theirs[k].to(mine[k].dtype) for k in mine if k in theirs and (not k.startswith(HEAD) or head_fits)}
    checkpoints.refuse_not_finite(load, net, f"train.init_from {public_name(path)}")
    net.load_state_dict(load, strict=False)
    unused = sorted(set(theirs) - set(mine))
    if head_fits:  # (a file names no classes: its head's are taken to be the data's, in order; said)
        new = "" if names else f"; its head too: its {net.fc.out_features} classes taken as the data's, in order"
    else:
        other = " (the run's classes are others)" if shaped else ""
        new = f"; new for the data's {net.fc.out_features} classes{other}: {', '.join(head)}"
    extra = f"; not used: {len(unused)} ({unused[0]}, ...)" if unused else ""
    if names is None and getattr(net, "input_stats", None) == "":  # (a file, not a run: found from outside, fed
        extra += (  # [-1, 1] where torchvision's weights were trained on ImageNet's mean and std)
            "; weights trained on ImageNet's mean and std (torchvision's, timm's) want model.options.input_stats = "
            '"imagenet"'
        )
    entry = f" of its {entry!r}" + (" (the average of the weights)" if "ema" in entry else "") if entry else ""
    return f"train.init_from {public_name(path)}: loaded {len(load)} tensors{entry}{new}{extra}"


# What fastai's train_bn keeps training in a frozen body (its `norm_types`).
NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
NORM_TYPES += (nn.LayerNorm, nn.SyncBatchNorm)


def body_and_head(
    groups: list[dict[str, Any]], net: nn.Module, body_lr_mult: float, train_bn: bool = False
) -> list[dict[str, Any]]:
    """Each optimizer group split into the body's part (`body`, at `body_lr_mult` x the rate; frozen
    while train.freeze_kimg lasts) and the head's; `train_bn`: the body's normalization layers in a part of
    their own (`norm`), which trains while the rest of the body is frozen."""
    head = {id(p) for p in net.fc.parameters()}
    modules = net.modules() if train_bn else ()
    norms = {id(p) for m in modules if isinstance(m, NORM_TYPES) for p in m.parameters(recurse=False)}
    out = []
    for g in groups:
        for part in ("body", "norm", "head"):  # (no "norm" part without train_bn: its groups as before)
            params = [p for p in g["params"] if _part(p, head, norms) == part]
            if params:
                mult = 1.0 if part == "head" else body_lr_mult
                out.append({**g, "params": params, "body": part != "head", "norm": part == "norm", "lr_mult": mult})
    return out


def _part(p: torch.Tensor, head: set[int], norms: set[int]) -> str:
    return "head" if id(p) in head else "norm" if id(p) in norms else "body"
