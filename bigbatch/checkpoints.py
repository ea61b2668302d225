"""Checkpoints: RUN/checkpoints/<kimg>/ with a task's nets in safetensors (a GAN's G, D, G_ema) and
the rest of the state.

A checkpoint is written into a hidden temporary folder, its meta.json last; `latest` is rewritten (atomically) to
name it, then it is renamed into place, so that a checkpoint once in place is the one `latest` names (a kill between
the two: `latest` names a folder not there yet, and the one before is used). A folder without a valid meta.json is
never used. meta.json records each file's size and checksum (xxh3_128: about 0.1 s per GB on one core, see
bench/checksum.py); a file that no longer matches is corrupt, and is never loaded. Nothing is unpickled: weights are
safetensors, the state goes through torch.load(weights_only=True). Which checkpoint a path names, and which one a
run resumes from: checkpoint_find.py.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, NoReturn

import torch
import xxhash
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write, json_loads, remove_stale, write_file
from bigbatch.provenance import code_version

BEST = "best"  # RUN/checkpoints/best/: the checkpoint with the best eval score so far
CHECKSUM = "xxh3_128"  # of every file, in meta.json: fast (non-cryptographic), to find damage, not tampering


class Corrupt(BigbatchError):
    """A checkpoint file that does not match the checksum (or size) meta.json recorded for it."""

    def __init__(self, message: str, ckpt: Path | None = None):
        super().__init__(message)
        self.ckpt = ckpt


ADVICE = "; use another checkpoint of the run"  # how Corrupt's messages end, for one reader of one checkpoint


def damage(e: BigbatchError) -> str:
    """What is wrong with a checkpoint, without the advice to a reader of that one checkpoint."""
    return str(e).removesuffix(ADVICE)


class Pruned(BigbatchError):
    """A checkpoint deleted (by its run, which keeps the newest checkpoint.keep) while it was being read."""


class Forbidden(BigbatchError):
    """A checkpoint's file this user may not read: not a damaged one."""


def file_checksum(path: Path) -> str:
    """The CHECKSUM of a file's bytes, as hex."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_name(nimg: int) -> str:
    """Folder name of the checkpoint at `nimg` images: kimg with three decimals, zero-padded to sort."""
    return f"{nimg // 1000:06d}.{nimg % 1000:03d}"


CHECKPOINT_NAME = re.compile(r"\d{6,}\.\d{3}")  # what checkpoint_name writes (and nothing else: never a path)
ASIDE = ".corrupt-"  # a damaged checkpoint moved aside: kept to look at, never resumed nor counted as newest
SUPERSEDED = ".superseded-"  # one newer than the checkpoint a run resumed from (rolled back to): kept, never pruned


def not_finite(nets: dict[str, nn.Module]) -> list[str]:
    """The names of `nets` holding a weight that is not finite (one read of the device a net; buffers are left out:
    a model's own may hold an infinity on purpose, a mask's, and BatchNorm's statistics are guarded at each step)."""
    bad = []
    for name, net in nets.items():
        tensors = [t.detach() for t in net.parameters() if t.is_floating_point()]
        if tensors and not torch.stack([torch.isfinite(t).all() for t in tensors]).all():
            bad.append(name)
    return bad


def save_checkpoint(
    run_dir: Path,
    nimg: int,
    nets: dict[str, nn.Module],
    state: dict[str, Any],
    config_text: str,
    keep: int,
    info: dict[str, Any] | None = None,
    replace: bool = False,
) -> Path:
    """Write the checkpoint at `nimg`, point `latest` at it, and delete all but the newest `keep`.
    `info` (JSON-able: what the models were built for) goes into meta.json. An intact checkpoint at
    `nimg` is kept as it is unless `replace` (its state changed though nothing trained)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(nimg)
    final = root / name
    if final.exists() and not final.is_dir():  # (found from outside: the error named the temporary folder)
        raise BigbatchError(
            f"cannot write checkpoint {final}: a file is in its place; move it away, then resume with: bigbatch train "
            f"--run-dir {shlex.quote(str(run_dir))} --resume"
        )
    if not replace and is_complete(final) and intact(final):  # nothing trained since (a signal right after a save)
        atomic_write(root / "latest", name + "\n")
        return final
    tmp = write_folder(root, name, nimg, nets, state, config_text, info)
    # latest first (found from outside: killed between the rename and latest, a run resumed from the one before)
    before = (root / "latest").read_bytes() if (root / "latest").is_file() else b""
    atomic_write(root / "latest", name + "\n")
    try:
        if replace and is_complete(final):  # (moved aside, deleted once the new one is in place: found by review)
            replace_folder(tmp, final, root / f".pruned-{name}-{os.getpid()}")  # (what a crash leaves: removed)
        else:
            shutil.rmtree(final, ignore_errors=True)  # an incomplete folder of the same name
            os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):  # (found by review: latest left naming a folder not there)
            atomic_write(root / "latest", before)
        raise
    for old in complete_checkpoints(run_dir)[:-keep]:
        if old != final:  # hidden first, so that a prune cut short leaves no published half of a checkpoint
            gone = old.with_name(f".pruned-{old.name}-{os.getpid()}")
            os.replace(old, gone)
            shutil.rmtree(gone, ignore_errors=True)
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
    tmp = write_folder(root, BEST, nimg, nets, state, config_text, info)
    return replace_folder(tmp, root / BEST, root / f".{BEST}-old")


def replace_folder(tmp: Path, final: Path, old: Path) -> Path:
    """Put the complete folder `tmp` at `final`: the one there moves aside to `old` first and is deleted last,
    so that a reader falls back to `old` if a crash comes between the renames (and the next replacement puts
    it back first)."""
    if not final.exists() and is_complete(old):  # a crash came between the renames last time
        os.replace(old, final)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def best_checkpoint(run_dir: Path, damaged_too: bool = False) -> Path | None:
    """RUN/checkpoints/best/ if complete (else the previous best, if a crash interrupted its replacement); with
    `damaged_too`, best/ wherever it is there (found from outside: a damaged one was left out of info --verify)."""
    folders = (Path(run_dir) / "checkpoints" / name for name in (BEST, f".{BEST}-old"))
    return next((f for f in folders if is_complete(f) or (damaged_too and f.is_dir())), None)


def write_folder(
    root: Path,
    name: str,
    nimg: int,
    nets: dict[str, nn.Module],
    state: dict[str, Any],
    config_text: str,
    info: dict[str, Any] | None,
    then: str = "",
) -> Path:
    """A complete checkpoint in a hidden temporary folder under `root` (meta.json last), to rename into place.
    `then`: what to do once space is freed (default: resume the run `root` is the checkpoints of; given, `root`
    is the user's folder, where only this checkpoint's leftovers are swept)."""
    mine = f".tmp-{name}-*" if then else ".tmp-*"  # (of processes killed while saving or pruning)
    remove_stale([*root.glob(mine), *([] if then else root.glob(".pruned-*"))])
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        # Serialized in memory, then written by us: a full disk is an OSError naming the file.
        contents: dict[str, Any] = {}
        for key, net in nets.items():
            tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
            contents[f"{key}.safetensors"] = save_safetensors(tensors)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        contents["state.pt"] = buffer.getbuffer()
        contents["config.toml"] = config_text.encode()
        files, sums = {}, {}
        for fname, data in sorted(contents.items()):  # (not `name`: the checkpoint's, in the message below)
            write_file(tmp / fname, data)
            files[fname], sums[fname] = len(data), xxhash.xxh3_128(data).hexdigest()
        meta = {"nimg": nimg, "kimg": nimg / 1000, "bigbatch": code_version(), **(info or {}), "files": files}
        meta["checksums"] = {CHECKSUM: sums}
        atomic_write(tmp / "meta.json", json.dumps(meta, indent=1))
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # (found from outside: the temporary folder was named, and "free space" was said of any error)
        failed = Path(e.filename) if e.filename else None
        what = f"{failed.name}: " if failed is not None and failed.parent == tmp else ""
        fix = "free space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"mend that (in {root})"
        fix = "raise the file size limit (ulimit -f)" if e.errno == errno.EFBIG else fix  # (found from outside)
        before = "the checkpoints before it are intact" if complete_checkpoints(root.parent) else "it is the first"
        raise BigbatchError(
            f"cannot write checkpoint {root / name}: {what}{e.strerror or e} (its partial folder is removed; "
            f"{before}); {fix}, then "
            f"{then or 'resume with: bigbatch train --run-dir ' + shlex.quote(str(root.parent)) + ' --resume'}"
        ) from None
    return tmp


def mark_stopped(ckpt: Path) -> Path:
    """`ckpt`, its meta.json saying a stop saved it (a checkpoint already at the stop's nimg is kept as it was, its
    files, state and checksums; meta.json, which none of them covers, is rewritten atomically)."""
    meta = read_meta(ckpt)
    if meta is not None and meta.get("stopped") is not True:
        atomic_write(Path(ckpt) / "meta.json", json.dumps({**meta, "stopped": True}, indent=1))
    return ckpt


def read_meta(ckpt: Path) -> dict[str, Any] | None:
    """A checkpoint's meta.json, or None if it is missing or damaged (not JSON, or of the wrong shape:
    files not {name: size}, nimg not a count)."""
    try:
        meta = json_loads((Path(ckpt) / "meta.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        return None
    sizes_ok = all(isinstance(k, str) and _count(v) for k, v in meta["files"].items())
    return meta if sizes_ok and _count(meta.get("nimg", 0)) else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def model_info(ckpt: Path) -> dict[str, Any]:
    """meta.json of a checkpoint with what its nets were built for (channels; class count for GANs and
    classifiers), or a BigbatchError saying it has none."""
    meta = read_meta(ckpt)
    if meta is not None and meta.get("saved_by") == "Replicator.save":  # (found from outside: "not written by this
        # bigbatch version")
        raise BigbatchError(
            f"{ckpt} is a Replicator.save checkpoint of a loop of your own, not a run's: rep.load reads it"
        )
    if meta is None or "img_channels" not in meta:
        raise BigbatchError(f"checkpoint {ckpt} has no usable meta.json: it was not written by this bigbatch version")
    return meta


def is_complete(ckpt: Path) -> bool:
    """Whether every file that meta.json lists is there with its recorded size."""
    return _complete_meta(ckpt) is not None


def _complete_meta(ckpt: Path) -> dict[str, Any] | None:
    """meta.json of a complete checkpoint (every file it lists there, at its recorded size), else None:
    read once, so that a folder pruned meanwhile is simply not complete."""
    meta = read_meta(ckpt)
    if meta is None:
        return None
    try:
        if all((Path(ckpt) / f).stat().st_size == size for f, size in meta["files"].items()):
            return meta
    except OSError:  # a file missing (or the folder pruned meanwhile)
        pass
    return None


def corrupt_by_size(ckpt: Path) -> Corrupt | None:
    """A checkpoint file of another size than its meta.json records, as Corrupt. A checkpoint is written in
    a hidden folder and renamed into place whole, so in a published one this is damage (a file cut short
    or replaced), not an interrupted write. (A missing file is not: the run may be pruning the folder.)"""
    for fname, size in (read_meta(ckpt) or {"files": {}})["files"].items():
        p = Path(ckpt) / fname
        if p.is_file() and p.stat().st_size != size:
            return Corrupt(
                f"checkpoint {ckpt} is corrupt: {fname} is {p.stat().st_size} bytes, {size} when it was written "
                f"(damaged on disk, or edited){ADVICE}",
                ckpt,
            )
    return None


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        meta = _complete_meta(p) if p.is_dir() and not p.name.startswith(".") and p.name != BEST else None
        if meta is not None:  # (read once: the run may prune the folder while we look)
            found.append((meta.get("nimg", -1), p.name, p))
    return [p for *_, p in sorted(found)]


def verify(ckpt: Path, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Check files of a checkpoint (`names`, default all) against the checksums in its meta.json, and
    return that meta.json: Corrupt names the first file that differs, Pruned says the checkpoint was
    deleted meanwhile. Checkpoints written before checksums were recorded pass on their sizes."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt)
    if meta is None:
        _raise_unreadable(ckpt, "meta.json", "it is missing or not valid JSON")
    for name in names if names is not None else tuple(meta["files"]):
        try:
            found = file_checksum(ckpt / name)
        except PermissionError as e:
            _refuse_permission(ckpt, name, e)
        except OSError as e:
            _raise_unreadable(ckpt, name, e.strerror or str(e))
        _check_sum(ckpt, meta, name, found)
    return meta


def _check_sum(ckpt: Path, meta: dict[str, Any], name: str, found: str) -> None:
    """Corrupt unless `found` is the checksum `meta` (the checkpoint's meta.json) records for the file
    `name` (files of checkpoints written before checksums were recorded pass)."""
    recorded = meta.get("checksums")
    sums = recorded.get(CHECKSUM) if isinstance(recorded, dict) else None
    if "bigbatch" in meta and not (isinstance(sums, dict) and name in sums):  # (a bigbatch that names itself records
        raise Corrupt(  # them: found from outside, a meta.json edited of its checksums passed a damaged file)
            f"checkpoint {ckpt} is corrupt: its meta.json records no {CHECKSUM} checksum of {name}, which the bigbatch "
            f"that wrote it records (damaged on disk, or edited){ADVICE}",
            ckpt,
        )
    if isinstance(sums, dict) and name in sums and found != sums[name]:
        raise Corrupt(
            f"checkpoint {ckpt} is corrupt: {name} does not match the {CHECKSUM} checksum recorded when it was "
            f"written (damaged on disk, or edited){ADVICE}",
            ckpt,
        )


def _refuse_permission(ckpt: Path, name: str, e: OSError) -> NoReturn:
    """A file this user may not read is not a damaged one (found from outside: an intact newest checkpoint was
    moved aside as corrupt, and the run went back one)."""
    raise Forbidden(
        f"cannot read {Path(ckpt) / name}: {e.strerror or e}; give this user read access to {ckpt} (it is not "
        "damaged), then run again"
    )


def _raise_unreadable(ckpt: Path, name: str, why: str) -> NoReturn:
    """Pruned if the checkpoint's folder is gone (its run deleted it meanwhile), else Corrupt."""
    if not (Path(ckpt) / "meta.json").exists():
        raise Pruned(
            f"checkpoint {ckpt} was deleted while being read (its run keeps only the newest checkpoint.keep); "
            "name the run instead of one checkpoint to read its newest"
        )
    raise Corrupt(f"checkpoint {ckpt} is corrupt: {name} cannot be read ({why})", ckpt)


def intact(ckpt: Path) -> bool:
    """Whether every file of the complete checkpoint `ckpt` matches its checksum."""
    try:
        verify(ckpt)
        return True
    except BigbatchError:
        return False


def load_checkpoint(
    ckpt: Path, nets: tuple[str, ...], state: bool = True
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """Read the weights of `nets` and (if `state`; else {}) the training state of a complete checkpoint, each
    file checked against its checksum as it is read (Corrupt, or Pruned if the checkpoint was deleted
    meanwhile). A loader of weights alone passes state=False: state.pt holds the optimizers' moments, twice a
    swap model's weights."""
    ckpt = Path(ckpt)
    meta = verify(ckpt, ("config.toml",))
    weights = {}
    for key in nets:
        data = _read_checked(ckpt, meta, f"{key}.safetensors")
        try:
            weights[key] = load_safetensors(data)
        except SafetensorError as e:
            _raise_unreadable(ckpt, f"{key}.safetensors", str(e))
    if not state:
        return weights, {}
    data = _read_checked(ckpt, meta, "state.pt")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message advises weights_only=False: never, for a file we did not vet
        _raise_unreadable(ckpt, "state.pt", "it holds objects other than tensors and plain data, never unpickled")
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 (a crafted pickle fails many ways: found from outside, a TypeError's traceback)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _raise_unreadable(ckpt, "state.pt", first)
    return weights, state


def _read_checked(ckpt: Path, meta: dict[str, Any], name: str) -> bytes:
    """A checkpoint file's bytes, once they match the checksum meta.json recorded for them."""
    try:
        data = (ckpt / name).read_bytes()
    except PermissionError as e:
        _refuse_permission(ckpt, name, e)
    except OSError as e:
        _raise_unreadable(ckpt, name, e.strerror or str(e))
    _check_sum(ckpt, meta, name, xxhash.xxh3_128(data).hexdigest())
    return data


def refuse_not_finite(state_dict: dict[str, torch.Tensor], net: nn.Module, what: str, fix: str = "") -> None:
    """One line where a weight of `state_dict` for `net` is not finite, or a buffer is NaN (a buffer may hold an
    infinity on purpose, a mask's): what a run never saves (it refuses it), so it came from elsewhere and would be
    trained, sampled or scored as it is (found from outside: a resumed G with one NaN skipped every step, blamed on
    the learning rate; a NaN G_ema sampled black images and scored an FID)."""
    params = {name for name, _ in net.named_parameters()}
    for key, v in state_dict.items():
        if not v.is_floating_point() or bool(torch.isfinite(v.sum())):  # (a sum: one pass, no mask the tensor's size)
            continue
        if not bool((torch.isfinite(v) if key in params else ~torch.isnan(v)).all()):  # (or a sum that overflowed)
            raise BigbatchError(f"{what}: its {key} holds NaN or infinite values{fix}")


def load_weights(
    net: nn.Module,
    state_dict: dict[str, torch.Tensor],
    what: str,
    assign: bool = False,
    model: str = "the model built from its config",
    fix: str = "",
) -> None:
    """Load a state dict, turning a mismatch, or a tensor not finite, into one line naming the first differences (or
    it; `fix` then ends the line). `assign`: the tensors themselves become the weights (for a model built on the meta
    device: nothing is allocated twice). `model`: what the message calls `net`."""
    try:
        result = net.load_state_dict(state_dict, strict=False, assign=assign)
    except RuntimeError as e:
        detail = " ".join(str(e).split("\n\t")[1:2]).strip() or str(e).splitlines()[0]
        raise BigbatchError(f"{what} does not fit {model}: {detail}") from None
    problems = [f"missing {k}" for k in result.missing_keys] + [f"unexpected {k}" for k in result.unexpected_keys]
    if problems:
        raise BigbatchError(f"{what} does not fit {model}: {', '.join(problems[:3])}")
    refuse_not_finite(state_dict, net, what, fix)  # (a file of another model is named as one first)
