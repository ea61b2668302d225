"""A checkpoint of the engine used on its own (`Replicator.save` and `Replicator.load`): what a script
needs to resume bit for bit, written as bigbatch writes a run's checkpoints. One folder, complete before
it replaces the one before (a crash mid-save leaves the old one); models' weights in safetensors;
optimizers, the engine's state (loss scalers, skip counts, the plan of micro_batch "auto"), the RNGs and
the caller's values through torch.save, read back with weights_only=True, never unpickling anything else;
every file checked against the checksum written with it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.engine import dist
from bigbatch.engine import precision as prec
from bigbatch.errors import BigbatchError, warn

PLAIN = (bool, int, float, str, type(None))  # what a value may hold, with tensors (weights_only reads them back)


def _stateful(value: Any) -> bool:
    """An object saved by its state_dict() and restored by its load_state_dict() (a learning-rate scheduler, a
    GradScaler, a user's own), other than a model or an optimizer."""
    plain = not isinstance(value, (nn.Module, torch.optim.Optimizer))
    return plain and callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def save(rep: Any, path: str | Path, objects: dict[str, Any]) -> Path:
    """Write `objects` (name -> a model, an optimizer, an object of state_dict() and load_state_dict() such as a
    learning-rate scheduler, or plain data: numbers, strings, tensors, and lists and dicts of them) to the folder
    `path`. Called on every rank: they check that they hold rank 0's weights, the main process writes (the RNG saved
    is its), and every rank returns once it has written, or raises."""
    path = Path(path)
    nets = {k: _plain(rep, v) for k, v in objects.items() if isinstance(v, nn.Module)}
    optimizers = {k: v.state_dict() for k, v in objects.items() if isinstance(v, torch.optim.Optimizer)}
    # (found from outside: a scheduler, which Accelerate and Lightning save, was refused)
    stateful = {k: _plain_value(v.state_dict()) for k, v in objects.items() if _stateful(v)}
    values = {k: _plain_value(v) for k, v in objects.items() if k not in nets and k not in optimizers | stateful}
    for key, value in {**values, **stateful}.items():
        if not _plain_data(value):
            what = f"the state_dict() of {key!r} is not plain data" if key in stateful else (
                f"{key!r} holds a {type(value).__name__} object")  # fmt: skip
            raise BigbatchError(
                f"Replicator.save: {what}; give models, optimizers, objects of state_dict() and load_state_dict() "
                "(a scheduler) whose state is plain data, or plain data (numbers, strings, tensors, lists and dicts "
                "of them), which load reads back without unpickling"
            )
    if path.exists() and not (path / "meta.json").is_file():  # (the folder is replaced whole)
        raise BigbatchError(f"Replicator.save: {path} exists and is not a checkpoint; give a new path")
    if differ := dist.ranks_differing(nets):  # (found from outside: saved, the replicas having drifted apart)
        raise BigbatchError(
            f"Replicator.save: rank {', '.join(map(str, differ))} holds other weights than rank 0: a step called a "
            "model itself, not what rep.prepare returned (its gradients were never averaged), or a rank's kernels "
            "differ; nothing was saved"
        )
    failed, error = None, None
    if rep.is_main:
        try:
            _write(rep, path, objects, nets, optimizers, values, stateful)
        except Exception as e:  # (any: the other ranks wait for the word; found by review, an OSError hung them)
            failed, error = (str(e) if isinstance(e, BigbatchError) else f"{type(e).__name__}: {e}"), e
    if rep.world_size > 1:  # every rank returns once the checkpoint is written, or raises as rank 0 does
        failed = dist.broadcast(failed)
    if error is not None:
        raise error
    if failed is not None:
        raise BigbatchError(f"Replicator.save failed on rank 0: {failed}")
    return path


def _write(
    rep: Any,
    path: Path,
    objects: dict[str, Any],
    nets: dict[str, nn.Module],
    optimizers: dict[str, Any],
    values: dict[str, Any],
    stateful: dict[str, Any],
) -> None:
    """Rank 0's part of `save`: the folder written, and put in place of the one before."""
    # The engine's state of each optimizer (loss scaler, skip history) under the name it is saved under, as its
    # torch state is (found from outside: by wrap order, so a script that wrapped them in another order swapped it)
    engine = rep.state_dict()
    engine["optimizers"] = {
        k: engine["optimizers"][rep.optimizers[id(v)].name] for k, v in objects.items() if id(v) in rep.optimizers
    }
    kinds = {k: type(v).__name__ for k, v in objects.items() if k in optimizers or k in stateful}
    state = {"optimizers": optimizers, "values": values, "replicator": engine, "kinds": kinds, "stateful": stateful}
    state["engine_by"] = "saved name"
    state.update(rng_state(rep.device))
    path.parent.mkdir(parents=True, exist_ok=True)
    info, then = {"saved_by": "Replicator.save"}, "save again"
    tmp = checkpoints.write_folder(path.parent, path.name, 0, nets, state, "", info, then=then)
    checkpoints.replace_folder(tmp, path, _old(path))


def _old(path: Path) -> Path:
    """Where the checkpoint before goes while the new one is renamed into place (load falls back to it)."""
    return path.with_name(f".{path.name}-old")


def load(rep: Any, path: str | Path, objects: dict[str, Any]) -> dict[str, Any]:
    """Restore the models, optimizers and objects of load_state_dict() of `objects` (by the names they were saved
    under), the engine's state and the RNGs from the folder `path`; return the plain values saved with them."""
    path = Path(path)
    if not path.exists() and checkpoints.read_meta(_old(path)) is not None:  # (a save cut between its renames)
        path = _old(path)
    meta = checkpoints.read_meta(path)
    if meta is None:  # (found from outside: a path not there was "not a complete checkpoint")
        what = "does not exist" if not path.exists() else "is not a complete checkpoint written by Replicator.save"
        raise BigbatchError(f"Replicator.load: {path} {what}")
    if meta.get("saved_by") != "Replicator.save":  # (a run's checkpoint: it was a KeyError 'optimizers')
        raise BigbatchError(
            f"Replicator.load: {path} is a checkpoint of a bigbatch run, not one Replicator.save wrote: read its "
            "weights with safetensors (each net's .safetensors), or load the run with bigbatch's loaders"
        )
    for key, value in objects.items():
        if not isinstance(value, (nn.Module, torch.optim.Optimizer)) and not _stateful(value):
            raise BigbatchError(
                f"Replicator.load restores models, optimizers and objects of load_state_dict(), not {key!r} "
                f"({type(value).__name__}): the plain values saved come back as what load returns"
            )
    nets = {k: _plain(rep, v) for k, v in objects.items() if isinstance(v, nn.Module)}
    saved = {f[: -len(".safetensors")] for f in meta.get("files", {}) if f.endswith(".safetensors")}
    weights, state = checkpoints.load_checkpoint(path, tuple(k for k in nets if k in saved))
    stateful = state.get("stateful", {})
    held = {"model": saved, "optimizer": state["optimizers"], "object of load_state_dict()": stateful}
    missing = [k for k, v in objects.items() if k not in held[_kind(v)]]  # (of its kind: a model's name given for
    if missing:  # an optimizer is missing too)
        also = f" and objects {sorted(stateful)}" if stateful else ""
        if missing[0] in state["values"] and _stateful(objects[missing[0]]):  # (saved by its state_dict(), as this
            raise BigbatchError(  # said before it kept such objects itself)
                f"Replicator.load: {path} holds {missing[0]!r} as a plain value: leave it out of load and give "
                f"what load returns to its load_state_dict(): {missing[0]}.load_state_dict(values[{missing[0]!r}])"
            )
        raise BigbatchError(
            f"Replicator.load: {path} holds no {_kind(objects[missing[0]])} {missing[0]!r}; it holds models "
            f"{sorted(saved)}, optimizers {sorted(state['optimizers'])}{also} (restored by the names saved under)"
        )
    engine = _engine_state(rep, objects, state)  # (checked before anything is restored)
    for key, value in objects.items():
        if not isinstance(value, nn.Module):
            _check_kind(key, value, state)
        if isinstance(value, torch.optim.Optimizer):
            _check_groups(key, value, state)
    for key, net in nets.items():
        checkpoints.load_weights(net, weights[key], f"{path / key}.safetensors", model=f"the model given as {key!r}")
    for key, opt in objects.items():
        if isinstance(opt, torch.optim.Optimizer):
            prec.load_optimizer(opt, state["optimizers"][key])
    for key, value in objects.items():  # (after the optimizers: a scheduler's state is of its optimizer's)
        if _stateful(value):
            try:
                value.load_state_dict(stateful[key])
            except Exception as e:  # noqa: BLE001 -- the object's own refusal, in one line
                raise BigbatchError(
                    f"Replicator.load: {key!r} ({type(value).__name__}) did not take its saved state "
                    f"({type(e).__name__}: {e}); the models and optimizers are restored: build it as it was saved"
                ) from None
    rep.load_state_dict(engine)
    restore_rng(state, rep.device)
    if rep.is_main and (left := sorted((saved | set(state["optimizers"]) | set(stateful)) - set(objects))):
        warn(f"Replicator.load: {path} also holds {', '.join(map(repr, left))}, not restored (not given to load)")
    return state["values"]


def _engine_state(rep: Any, objects: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The engine's state saved, its optimizers' under the names they are wrapped under here (saved by the names
    given to save; a checkpoint of before that: by the names wrapped then); one wrapped but not given keeps its own."""
    engine = state["replicator"]
    if state.get("engine_by") != "saved name":
        return engine
    given = {k: v for k, v in objects.items() if isinstance(v, torch.optim.Optimizer)}
    if unwrapped := [k for k, v in given.items() if id(v) not in rep.optimizers]:  # (found from outside: its loss
        raise BigbatchError(  # scale and skip history were dropped without a word)
            f"Replicator.load: the optimizer given as {unwrapped[0]!r} is not wrapped: rep.wrap_optimizer(opt) before "
            "load, so that its loss scaler and skip history come back with it"
        )
    now = rep.state_dict()["optimizers"]  # (a wrapped optimizer not given keeps its own)
    names = {k: rep.optimizers[id(v)].name for k, v in given.items()}
    return {**engine, "optimizers": {**now, **{names[k]: engine["optimizers"].get(k, now[names[k]]) for k in given}}}


def _check_kind(key: str, value: Any, state: dict[str, Any]) -> None:
    """The optimizer or scheduler given as `key` is of the kind saved under that name (found from outside: an SGD
    took an Adam's state and failed at its first step)."""
    was = state.get("kinds", {}).get(key)
    if was is not None and was != type(value).__name__:
        raise BigbatchError(f"Replicator.load: {key!r} was saved as a {was}, and is given as a {type(value).__name__}")


def _check_groups(key: str, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The optimizer given as `key` is over as many parameters in each group as saved (found from outside: one of
    other groups failed in torch's words, the models already restored)."""
    saved = [len(g["params"]) for g in state["optimizers"][key]["param_groups"]]
    if saved != [len(g["params"]) for g in opt.param_groups]:
        raise BigbatchError(
            f"Replicator.load: {key!r} was saved over parameter groups of {saved} tensors, and is given over "
            f"{[len(g['params']) for g in opt.param_groups]}: build it over the same parameters, in the same groups"
        )


def _plain(rep: Any, module: nn.Module) -> nn.Module:
    """The plain model behind a prepared one (a module the Replicator did not prepare: itself)."""
    return next((plain for plain, wrapped in rep.models if module is wrapped), module)


def _kind(value: Any) -> str:
    if isinstance(value, nn.Module):
        return "model"
    return "optimizer" if isinstance(value, torch.optim.Optimizer) else "object of load_state_dict()"


def _plain_value(value: Any) -> Any:
    """NumPy's scalars as Python's (np.float64 is a float that weights_only would not read back)."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items()}
    return value


def _plain_data(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain_data(v) for k, v in value.items())
    return isinstance(value, torch.Tensor) or type(value) in PLAIN


def rng_state(device: torch.device, torch_only: bool = False) -> dict[str, Any]:
    """The global RNGs' state as checkpoints keep it: torch's, the CPU's and `device`'s (rng_cpu, rng_cuda), and
    Python's and NumPy's (rng_python, rng_numpy; found from outside: a step function's np.random noise was drawn
    again after a resume, as Accelerate's save_state keeps all four). `torch_only`: torch's alone (what a step
    puts back where it is abandoned: a microsecond, where NumPy's and Python's took fifty, found by review)."""
    cuda = {"rng_cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}
    if torch_only:
        return {"rng_cpu": torch.get_rng_state(), **cuda}
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy = {"rng_numpy": torch.from_numpy(keys.astype(np.int64)), "rng_numpy_at": (int(pos), has_gauss, gauss)}
    return {"rng_cpu": torch.get_rng_state(), **cuda, "rng_python": random.getstate(), **numpy}


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back what `rng_state` kept (a CPU checkpoint resumed on a GPU: the CPU's alone; one saved before Python's
    and NumPy's were kept: torch's alone)."""
    torch.set_rng_state(state["rng_cpu"])
    if device.type == "cuda" and "rng_cuda" in state:
        torch.cuda.set_rng_state(state["rng_cuda"], device)
    if "rng_python" in state:
        version, internal, gauss = state["rng_python"]
        random.setstate((version, tuple(internal), gauss))
    if "rng_numpy" in state:
        pos, has_gauss, gauss = state["rng_numpy_at"]
        np.random.set_state(("MT19937", state["rng_numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
