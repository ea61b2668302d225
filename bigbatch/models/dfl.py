"""DeepFaceLab's weight files, read safely and written as DFL writes them.

DFL saves each model part as `<name>_SAEHD_<part>.npy`, which is not a NumPy file but a pickle
(protocol 4) of {key: float32 array}, keys being the TF variable names without their first scope and
with ":0" (`down1/downs_0/conv1/weight:0`), arrays in TF layout (conv kernels H, W, in, out; dense in,
out). `<name>_SAEHD_data.dat` is a pickle of the options and the iteration count, `<name>_SAEHD_src_dst_opt.npy`
the optimizer's moments (a pickle too). Pickles can run code,
so these are read by an unpickler that builds only NumPy arrays and scalars, dicts, lists, tuples,
strings, numbers and booleans, and refuses anything else with one line naming what the file asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bigbatch import safe_pickle
from bigbatch.engine.memory import default_budget, format_bytes, state_bytes
from bigbatch.errors import BigbatchError, counted
from bigbatch.files import atomic_write


def read_pickle(path: str | Path) -> Any:
    """A DFL pickle (.npy weights, _data.dat), allowing nothing but arrays, containers, strings and numbers."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BigbatchError(f"cannot read {path}: {e.strerror or e}") from None
    return safe_pickle.loads(data, str(path))


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a DFL weight file, {key: array}."""
    weights = read_pickle(path)
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray | np.generic) for k, v in weights.items()
    ):
        raise BigbatchError(f"{path} is not a DeepFaceLab weight file (a dict of named arrays)")
    return weights


def dumps(obj: Any) -> bytes:
    """`obj` pickled as DFL pickles its files (protocol 4), readable under NumPy 1 and 2."""
    return safe_pickle.numpy1_dumps(obj, 4)


def write_weights(path: str | Path, weights: dict[str, np.ndarray]) -> None:
    """Write {key: array} as DFL does (pickle protocol 4, NumPy 1's names), atomically."""
    atomic_write(Path(path), dumps(dict(weights)))


def dfl_key(torch_key: str) -> str:
    """A torch parameter name of a part (`down1.downs.0.conv1.weight`) as DFL's key
    (`down1/downs_0/conv1/weight:0`): list items are `name_i` in leras."""
    out: list[str] = []
    for part in torch_key.split("."):
        if part.isdigit() and out:
            out[-1] = f"{out[-1]}_{part}"
        else:
            out.append(part)
    return "/".join(out) + ":0"


def to_dfl(tensor: torch.Tensor) -> np.ndarray:
    """A torch weight in TF layout: conv (out, in, h, w) -> (h, w, in, out); linear (out, in) -> (in, out)."""
    a = tensor.detach().cpu().float().numpy()
    if a.ndim == 4:
        return np.ascontiguousarray(a.transpose(2, 3, 1, 0))
    if a.ndim == 2:
        return np.ascontiguousarray(a.T)
    return a.copy()


def from_dfl(array: np.ndarray) -> torch.Tensor:
    """The inverse of `to_dfl`."""
    a = np.asarray(array, dtype=np.float32)
    if a.ndim == 4:
        a = a.transpose(3, 2, 0, 1)
    elif a.ndim == 2:
        a = a.T
    return torch.from_numpy(np.ascontiguousarray(a))


def export_part(module: nn.Module) -> dict[str, np.ndarray]:
    """One model part's weights as DFL's file holds them."""
    return {dfl_key(k): to_dfl(v) for k, v in module.state_dict().items()}


def import_part(module: nn.Module, weights: dict[str, np.ndarray], what: str) -> None:
    """Load a DFL part's arrays into `module`: every key must be there with its shape (a model built
    with other options or dimensions is named, key and shapes)."""
    state = module.state_dict()
    expected = {dfl_key(k): k for k in state}
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise BigbatchError(
            f"{what} lacks {counted(len(missing), 'weight')} of this model, e.g. {missing[0]!r}: it was trained with "
            "another archi or other dimensions"
        )
    loaded = {}
    for key, name in expected.items():
        if np.asarray(weights[key]).dtype.kind not in "fiu":
            raise BigbatchError(f"{what}: {key} holds {np.asarray(weights[key]).dtype} values, not weights")
        value = from_dfl(weights[key])
        if value.shape != state[name].shape:
            raise BigbatchError(
                f"{what}: {key} has shape {tuple(weights[key].shape)} where this model has "
                f"{tuple(to_dfl(state[name]).shape)}: it was built with other dimensions"
            )
        loaded[name] = value
    module.load_state_dict(loaded)


# ---- optimizer files --------------------------------------------------------------------------------
# DFL's `<name>_SAEHD_src_dst_opt.npy`: {"iters:0": steps, "<slot>_<part>/<key>_0:0": array} for every
# weight of the model (slots ms and vs for AdaBelief, acc for RMSprop), arrays in the weights' layout.
OPT_SLOTS = {"adabelief": {"ms": "m", "vs": "v"}, "rmsprop": {"acc": "acc"}}


def _opt_key(slot: str, part: str, key: str) -> str:
    """DFL's name of a weight's optimizer slot: TF's `ms_{v.name}` with ':' made '_', plus ':0'."""
    return f"{slot}_{part}/{key.removesuffix(':0')}_0:0"


def export_optimizer(
    model: nn.Module, state: dict[nn.Parameter, dict[str, torch.Tensor]], step: int, kind: str
) -> dict:
    """An RGB model's optimizer moments (`state`: per parameter, as bigbatch's AdaBelief/RMSprop keep
    them; zeros where a parameter has none) as DFL's optimizer file holds them, in BGR."""
    import copy

    out: dict[str, Any] = {"iters:0": np.int64(step)}
    for slot, ours in OPT_SLOTS[kind].items():
        moments = copy.deepcopy(model)
        with torch.no_grad():
            for mine, p in zip(moments.parameters(), model.parameters()):
                value = state.get(p, {}).get(ours)
                mine.copy_(value if value is not None else torch.zeros_like(p))
        flip_colour_order(moments)
        for part in moments.parts:
            for key, array in export_part(getattr(moments, part)).items():
                out[_opt_key(slot, part, key)] = array
    return out


def import_optimizer(model: nn.Module, arrays: dict[str, Any], kind: str, what: str) -> tuple[dict, int]:
    """DFL's optimizer file for an RGB model: ({parameter: {slot: tensor}}, steps). A file of the other
    optimizer, or for another model, is named in one line."""
    import copy

    slots = OPT_SLOTS[kind]
    if not any(k.startswith(f"{next(iter(slots))}_") for k in arrays):
        other = "RMSprop" if kind == "adabelief" else "AdaBelief"
        raise BigbatchError(
            f"{what} holds {other} state, not {kind}'s: set swap.optimizer to match, or delete the file"
        )
    state: dict[nn.Parameter, dict[str, torch.Tensor]] = {p: {} for p in model.parameters()}
    for slot, ours in slots.items():
        moments = copy.deepcopy(model)
        for part in moments.parts:
            module = getattr(moments, part)
            keys = {dfl_key(k): _opt_key(slot, part, dfl_key(k)) for k in module.state_dict()}
            missing = [v for v in keys.values() if v not in arrays]
            if missing:
                raise BigbatchError(f"{what} lacks {len(missing)} entries of this model, e.g. {missing[0]!r}")
            import_part(module, {k: arrays[v] for k, v in keys.items()}, what)
        flip_colour_order(moments)
        for p, value in zip(model.parameters(), moments.parameters()):
            state[p][ours] = value.detach().clone()
    iters = arrays.get("iters:0", 0)
    return state, int(np.asarray(iters))


# ---- whole model folders ----------------------------------------------------------------------------
def flip_colour_order(model: nn.Module) -> None:
    """Swap the first and third colour channels where a SAEHD model reads and writes images (its
    encoder's first conv, its decoders' output convs), in place: DFL's BGR model becomes an RGB one
    and back (it is its own inverse)."""
    encoder = model.encoder
    first = encoder.down1.conv1 if hasattr(encoder.down1, "conv1") else encoder.down1.downs[0].conv1
    with torch.no_grad():
        first.weight.copy_(first.weight[:, [2, 1, 0]])
        for decoder in (getattr(model, n) for n in ("decoder", "decoder_src", "decoder_dst") if hasattr(model, n)):
            for name in ("out_conv", "out_conv1", "out_conv2", "out_conv3"):
                conv = getattr(decoder, name, None)
                if conv is not None:
                    conv.weight.copy_(conv.weight[[2, 1, 0]])
                    conv.bias.copy_(conv.bias[[2, 1, 0]])


def load_model_folder(folder: str | Path, name: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """A DeepFaceLab SAEHD model folder (`<name>_SAEHD_data.dat` and its parts' .npy files) as a
    bigbatch SAEHD taking and giving RGB images, and DFL's model data (options, iter, ...)."""
    from bigbatch.models.saehd import SAEHD

    folder = Path(folder)
    found = sorted(folder.glob("*_SAEHD_data.dat"))
    if name is not None:
        found = [f for f in found if f.name == f"{name}_SAEHD_data.dat"]
    if not found:
        raise BigbatchError(
            f"{folder} holds no DeepFaceLab SAEHD model{f' named {name!r}' if name else ''} "
            "(a <name>_SAEHD_data.dat and its .npy files)"
        )
    if len(found) > 1:
        names = ", ".join(f.name.removesuffix("_SAEHD_data.dat") for f in found)
        raise BigbatchError(
            f"{folder} holds several SAEHD models ({names}): name the one to read by its file, {folder / found[0].name}"
        )
    prefix = found[0].name.removesuffix("data.dat")
    data = read_pickle(found[0])
    options = with_defaults(data.get("options")) if isinstance(data, dict) else None
    need = ("resolution", "archi", "ae_dims", "e_dims", "d_dims", "d_mask_dims")
    if not isinstance(options, dict) or any(k not in options for k in need):
        raise BigbatchError(f"{found[0]} lacks SAEHD's options ({', '.join(need)}): is it a SAEHD model's data file?")
    where = str(found[0])
    sizes = [option(options, k, kind, where) for k, kind in zip(need, (int, str, int, int, int, int))]
    try:  # (its size first: found from outside, dims of 100,000 were "out of memory, lower train.micro_batch")
        with torch.device("meta"):
            size = state_bytes([SAEHD(*sizes)], [])
    except (TypeError, OverflowError, RuntimeError):  # (a size past int64's: torch's own overflow)
        size = 2**63
    if size > (free := default_budget(torch.device("cpu"))):
        shown = ", ".join(f"{k} {_number(v)}" for k, v in zip(need[2:], sizes[2:]))
        raise BigbatchError(
            f"{where}: its options ({shown}) make a model of {format_bytes(size)}, more than the "
            f"{format_bytes(free)} this machine has free: the file is not a usable SAEHD model's"
        )
    model = SAEHD(*sizes)
    if "iter" in data and not 0 <= option(data, "iter", int, where) < 2**62:  # (found from outside: 10**400)
        raise BigbatchError(f"{where}: its iter is {_number(data['iter'])}, not a count of DFL's iterations")
    for part in model.parts:
        path = folder / f"{prefix}{part}.npy"
        if not path.is_file():  # (found from outside: "cannot read ...: No such file or directory")
            raise BigbatchError(
                f"{path} is missing: the model's options ({model.archi}) call for its {part}, so {folder} is "
                f"incomplete, or its {found[0].name} is another model's"
            )
        import_part(getattr(model, part), read_weights(path), str(path))
    flip_colour_order(model)
    return model, data


def _number(value: int) -> str:
    """A whole number for a message, one past 19 digits by about its count of them (found from outside: 10**400;
    str() of one past 4,300 digits is refused by Python)."""
    return (
        str(value)
        if abs(value).bit_length() <= 63
        else f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    )


def with_defaults(options: Any) -> Any:
    """A model's options with what DFL's SAEHD fills in where its _data.dat lacks them (load_or_def_option):
    d_mask_dims (added in 2020; d_dims // 3, made even) and face_type ("f"). Found from outside: an older
    model's file was refused."""
    if not isinstance(options, dict):
        return options
    filled = {"face_type": "f", **options}
    if "d_mask_dims" not in filled and isinstance(d := filled.get("d_dims"), (int, np.integer)):
        filled["d_mask_dims"] = int(d) // 3 + (int(d) // 3) % 2
    return filled


def option(options: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """A DFL option as `kind` (int: a whole number; float; str; bool), or one line naming the file and the key
    (found from outside: an `ae_dims` of "abc" in a well-formed pickle ended in a traceback)."""
    value = options[key]
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    fits = {
        int: number and (isinstance(value, (int, np.integer)) or float(value).is_integer()),  # (10**400: no float)
        float: number,
        str: isinstance(value, str),
        bool: isinstance(value, (bool, np.bool_, int, np.integer)),
    }[kind]
    if not fits:
        raise BigbatchError(
            f"{where}: its option {key} is {value!r}, not {kind.__name__}: the file is not a SAEHD model's"
        )
    return kind(value)


def save_model_folder(
    model: nn.Module,
    folder: str | Path,
    name: str = "new",
    options: dict[str, Any] | None = None,
    iteration: int = 0,
    data_file: bytes | None = None,
) -> None:
    """Write a bigbatch SAEHD (RGB) as a DeepFaceLab model folder DFL's trainer and merger read:
    `<name>_SAEHD_<part>.npy` in BGR, and `<name>_SAEHD_data.dat` with `options` (DFL's; its archi and
    dimensions are the model's) and the iteration count, or `data_file` as it is."""
    import copy

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bgr = copy.deepcopy(model)
    flip_colour_order(bgr)
    for part in bgr.parts:
        write_weights(folder / f"{name}_SAEHD_{part}.npy", export_part(getattr(bgr, part)))
    if data_file is None:
        data_file = dumps(model_data(model, options or {}, iteration))
    atomic_write(folder / f"{name}_SAEHD_data.dat", data_file)


def model_data(model: nn.Module, options: dict[str, Any], iteration: int) -> dict[str, Any]:
    """What DFL's `_data.dat` holds for a model of no history: the iteration count, `options` with the
    model's archi and dimensions, and an empty loss history."""
    dims = {k: getattr(model, k) for k in ("resolution", "archi", "ae_dims", "e_dims", "d_dims", "d_mask_dims")}
    return {
        "iter": int(iteration),
        "options": {**options, **dims},
        "loss_history": [],
        "sample_for_preview": None,
        "choosed_gpu_indexes": None,
    }
