"""A trained swap model in and out of files: `load_autoencoder` (a run, a checkpoint or a DeepFaceLab
model folder), `convert_dfl` (`bigbatch convert DFL_FOLDER OUT_RUN`), `export_dfl` (`bigbatch
export-dfl RUN OUT_DIR`) and `swap_folder` (`bigbatch swap RUN IN_DIR OUT_DIR`).

Face detection, alignment and merging back into the frames stay DeepFaceLab's (its extractor and
merger): `swap_folder` takes faces already aligned, and `export_dfl` writes a model DFL's merger reads.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bigbatch import checkpoints, safe_pickle
from bigbatch.config import Config
from bigbatch.errors import BigbatchError, counted, named_few, warn
from bigbatch.files import atomic_write
from bigbatch.metrics_file import read_metrics
from bigbatch.models import dfl
from bigbatch.presets import preset
from bigbatch.tasks.swap.color import MERGE_MODES
from bigbatch.tasks.swap.discriminators import discriminators
from bigbatch.tasks.swap.load import (
    DIMS,
    dfl_model,
    dfl_record,
    init_optimizer,
    load_autoencoder,
    make_optimizer,
    optimizer_parameters,
    source_face_type,
)
from bigbatch.tasks.swap.task import swap_faces

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


# DFL's option -> (swap config key, how to read DFL's value)
_DFL_OPTIONS: dict[str, tuple[str, Any]] = {
    "masked_training": ("masked_training", bool),
    "eyes_mouth_prio": ("eyes_mouth_prio", bool),
    "true_face_power": ("true_face_power", float),
    "gan_power": ("gan_power", float),
    "gan_patch_size": ("gan_patch_size", int),
    "gan_dims": ("gan_dims", int),
    "random_warp": ("random_warp", bool),
    "random_src_flip": ("src_flip", bool),
    "random_dst_flip": ("dst_flip", bool),
    "lr_dropout": ("lr_dropout", lambda v: v in ("y", "cpu", True)),
    "adabelief": ("optimizer", lambda v: "adabelief" if v else "rmsprop"),
    "ct_mode": ("ct_mode", str),
    "random_hsv_power": ("random_hsv_power", float),
    "face_style_power": ("face_style_power", float),
    "bg_style_power": ("bg_style_power", float),
    "blur_out_mask": ("blur_out_mask", bool),
    "uniform_yaw": ("uniform_yaw", bool),
}


DFL_LR = 5e-5  # SAEHD's learning rate, fixed in DFL's code
FACE_TYPES = ("h", "mf", "f", "wf", "head")  # SAEHD's face_type option: half, mid, full, whole face, head


def config_of(options: dict[str, Any], base: Config | None = None) -> Config:
    """A swap config (saehd128's, or `base`) with a DFL model's options: its model, batch, clipping,
    face type and training options."""
    cfg = base or preset("saehd128")
    where = "the DeepFaceLab model's _data.dat"
    options = dfl.with_defaults(options)
    updates: dict[str, Any] = {
        # (its own name, not saehd128's: found from outside, a 64 px df-u model was shown and named as that recipe)
        "name": f"saehd{dfl.option(options, 'resolution', int, where)}-{dfl.option(options, 'archi', str, where)}",
        "data.resolution": dfl.option(options, "resolution", int, where),
        "model.options": {k: dfl.option(options, k, str if k == "archi" else int, where) for k in DIMS},
    }
    if str(options.get("face_type", "")) in FACE_TYPES:
        updates["swap.face_type"] = str(options["face_type"])
    for key, (ours, read) in _DFL_OPTIONS.items():
        if key in options:
            typed = read in (bool, int, float, str)  # (the others read any value: lr_dropout's "y"/"cpu"/True)
            updates[f"swap.{ours}"] = read(dfl.option(options, key, read, where) if typed else options[key])
    if "batch_size" in options:
        batch = dfl.option(options, "batch_size", int, where)
        updates.update({"train.batch": batch, "train.micro_batch": batch})
    if "clipgrad" in options:
        updates["train.grad_clip"] = 1.0 if options["clipgrad"] else 0.0
    return cfg.override(updates)


def convert_dfl(src: str | Path, out: str | Path, overrides: dict[str, Any] | None = None) -> Path:
    """Write a swap run directory (one checkpoint at 0 kimg) holding a DeepFaceLab SAEHD model: its
    weights (RGB), and a config with its options (saehd128's otherwise; `overrides` on top, e.g. the
    data paths to go on training with --resume, as DFL does)."""
    src, out = Path(src), Path(out)
    named = dfl_model(src)
    if named is None:
        raise BigbatchError(f"{src} is not a DeepFaceLab model folder (no <name>_SAEHD_data.dat in it)")
    if out.exists() and any(out.iterdir()):
        raise BigbatchError(f"{out} exists and is not empty; choose a new folder for the converted run")
    model, data = dfl.load_model_folder(*named)
    base = config_of(data["options"])
    cfg = base.override(overrides or {})
    if cfg.model != base.model or cfg.data.resolution != base.data.resolution:  # (found from outside: a run written
        # whose weights did not fit its config, refused by every later command)
        keys = [k for k in overrides or {} if k.startswith("model.") or k == "data.resolution"]
        raise BigbatchError(
            f"{', '.join(keys) or 'the overrides'}: the model is the one {src} holds ({model.archi}, "
            f"{model.resolution} px, as its options say); drop {'them' if len(keys) > 1 else 'it'} (data paths and "
            "training settings may be given)"
        )
    if base.swap.face_type and cfg.swap.face_type != base.swap.face_type:  # (found from outside: taken, and the
        # model's export-dfl and .dfm then told DFL's merger and DeepFaceLive to crop faces it was not trained on)
        raise BigbatchError(
            f"swap.face_type: {src} was trained on faces of DFL's face type {base.swap.face_type!r}, as its options "
            "say; drop it"
        )
    if data["options"].get("pretrain"):  # (found from outside: dropped without a word)
        parts = "inter" if model.kind == "df" else "inter_AB and inter_B"
        warn(
            f"{src} was pretrained (DFL's pretrain option): DFL, when pretraining ends, starts its {parts} afresh "
            "and counts iterations from 0; the weights are converted as they are"
        )
    # The optimizer's moments and step count (DFL's src_dst_opt.npy), so that training goes on where DFL
    # left it; DFL's _data.dat as it is (options bigbatch does not use, loss history, preview faces), so
    # that export-dfl gives back every file DFL wrote.
    opt = make_optimizer(cfg, optimizer_parameters(model), 0)
    init_optimizer(opt, model, str(src), cfg.swap.optimizer)
    dfl_data, dfl_iter = dfl_record(src)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.toml", cfg.dumps())
    info = {
        "img_channels": 3,
        "resolution": model.resolution,
        "archi": model.archi,
        "face_type": cfg.swap.face_type or None,
        "converted_from": str(src),
    }
    # A checkpoint at 0 images that `bigbatch train --run-dir OUT --resume` continues, as DFL would.
    rng = torch.Generator().manual_seed(cfg.train.seed).get_state()
    state = {"steps": 0, "opt": opt.state_dict(), "nimg": 0, "seconds": 0.0, "engine": {}, "rng_cpu": rng}
    state.update(converted_from=str(src), dfl_iter=dfl_iter, **({"dfl_data": dfl_data} if dfl_data else {}))
    # The discriminators DFL's options turn on, as training would start them (DFL's own files aside).
    discs = discriminators(cfg, model)
    for i, (name, disc) in enumerate(discs.items()):
        state[f"opt_{name}"] = make_optimizer(cfg, list(disc.parameters()), i + 1).state_dict()
    return checkpoints.save_checkpoint(out, 0, {"model": model, **discs}, state, cfg.dumps(), 1, info)


def dfl_options(cfg: Config, face_type: str) -> dict[str, Any]:
    """DFL's options for a swap config (what its trainer shows and its merger reads)."""
    s = cfg.swap
    inverse = {ours: key for key, (ours, _) in _DFL_OPTIONS.items()}
    options: dict[str, Any] = {}
    for f in dataclasses.fields(s):
        if f.name in inverse and f.name not in ("optimizer", "lr_dropout"):
            options[inverse[f.name]] = getattr(s, f.name)
    if cfg.train.grad_clip not in (0.0, 1.0):  # (found by reading: any clip was written as DFL's)
        warn(f"train.grad_clip {cfg.train.grad_clip:g} goes to DFL as its clipgrad, which clips to a norm of 1")
    if s.lr != DFL_LR:  # (found from outside: dropped without a word, and convert back took DFL's)
        warn(f"swap.lr {s.lr:g} stays here: DFL has no such option, and trains this model on at its fixed {DFL_LR:g}")
    options.update(
        gan_patch_size=s.gan_patch_size or cfg.data.resolution // 8,
        adabelief=s.optimizer == "adabelief",
        lr_dropout="y" if s.lr_dropout else "n",
        clipgrad=cfg.train.grad_clip > 0,
        batch_size=cfg.train.batch,
        face_type=face_type,
        pretrain=False,
    )
    return options


def _merged_options(carried: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """DFL's options as the model it started from had them (in their order, with the ones bigbatch does
    not use), updated with this run's where they mean another setting (a value written differently for
    the same setting, e.g. lr_dropout "cpu" for "y", stays as DFL wrote it)."""
    merged = dict(carried)
    for key, value in ours.items():
        if key in merged:
            read = _DFL_OPTIONS[key][1] if key in _DFL_OPTIONS else (lambda v: v)
            try:
                same = bool(read(merged[key]) == read(value))
            except (TypeError, ValueError):
                same = False
            if same:
                continue
        merged[key] = value
    return merged


def _data_file(data: dict[str, Any], carried: bytes | None, what: str) -> bytes:
    """DFL's `_data.dat` for `data` (dfl.model_data's): on top of the DFL model's own file when the run
    started from one (its history kept), and that file's very bytes when nothing in it changed."""
    if carried is None:
        return dfl.dumps(data)
    before = safe_pickle.loads(carried, f"the DeepFaceLab data {what} carries")
    if not isinstance(before, dict):
        before = {}
    merged = {**before, "iter": data["iter"], "options": _merged_options(before.get("options") or {}, data["options"])}
    if data["loss_history"]:  # (DFL's own iterations', then this run's)
        merged["loss_history"] = list(before.get("loss_history") or []) + data["loss_history"]
    new = dfl.dumps(merged)
    return carried if new == dfl.dumps(before) else new


def _loss_history(ckpt: Path, nimg: int) -> list[list[float]]:
    """DFL's loss history (its preview's graph) of the iterations this run trained up to `nimg`: [src_loss, dst_loss]
    an iteration, each its log row's mean (metrics.jsonl keeps a row's, not each iteration's); found from outside,
    written empty."""
    if ckpt.parent.name != "checkpoints":
        return []
    history: list[list[float]] = []
    for row in read_metrics(ckpt.parent.parent / "metrics.jsonl"):
        if "src_loss" in row and "dst_loss" in row and round(row["kimg"] * 1000) <= nimg:
            history += [[float(row["src_loss"]), float(row["dst_loss"])]] * max(0, int(row["step"]) - len(history))
    return history


def _in_dfl_range(name: str, dims: int) -> bool:
    """Whether DFL's prompt (Model_SAEHD) could give `dims` for option `name`: it clips what is typed to its
    range and rounds the encoder's and decoders' up to even."""
    return 32 <= dims <= 1024 if name == "ae_dims" else 16 <= dims <= 256 and dims % 2 == 0


def export_dfl(
    path: str | Path, out: str | Path, name: str = "new", face_type: str | None = None, overwrite: bool = False
) -> Path:
    """Write the model of a swap run (or checkpoint) as a DeepFaceLab SAEHD model folder `out`
    (`<name>_SAEHD_*.npy` in BGR, `<name>_SAEHD_data.dat`, and the optimizer's moments in
    `<name>_SAEHD_src_dst_opt.npy`), for DFL's merger or trainer. The face type (DFL's merger crops by
    it) is the run's (its config's swap.face_type, or the faces' as `prepare --masks dfl` read them);
    `face_type` gives it where the run does not know it. A run converted from DFL gives back DFL's
    options and history with it. A run of no step is written as iteration 1: DFL takes a model at
    iteration 0 for a new one and initialises every weight afresh. A model of the same name already in
    `out` is refused, unless `overwrite`: then its weight files this model has not (another archi's parts,
    its discriminators and their moments) are removed, so that DFL does not load them with the new model."""
    if Path(out).exists() and not Path(out).is_dir():
        raise BigbatchError(f"{out} is a file: give a folder for the DeepFaceLab model (made if missing)")
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):  # (found from outside: --name ../x wrote
        # the model beside the folder, and --name a/b failed once the folder was made)
        raise BigbatchError(f"--name {name!r}: give the model's name alone, without a folder (DFL's <name>_SAEHD_*)")
    if "_" in name:  # (found from outside: DFL lists models by the part of a file's name before its first "_", so it
        # took my_model_SAEHD_* for a model "my" and started a new one; DFL itself turns a "_" typed into a space)
        raise BigbatchError(
            f"--name {name!r}: DeepFaceLab reads a model's name up to the first '_' of its files' names, so it would "
            f"not find this one; give {name.replace('_', ' ')!r} (as DFL names it) or a name without '_'"
        )
    if dfl_model(path) is not None:  # (found from outside: a traceback)
        raise BigbatchError(
            f"{path} is a DeepFaceLab model folder already: DFL reads it as it is (copy its files to move it); "
            "export-dfl writes a swap run's model"
        )
    existing = sorted(Path(out).glob(f"{glob.escape(name)}_SAEHD_*")) if Path(out).is_dir() else []
    if existing and not overwrite:
        raise BigbatchError(
            f"{out} already holds a DeepFaceLab model named {name!r} ({existing[0].name}): give another --name "
            "or folder, or --overwrite to replace it"
        )
    model = load_autoencoder(path, dfl_folders=False)  # (a DFL folder: refused above)
    ckpt = model.checkpoint
    cfg = model.config
    known = checkpoints.model_info(ckpt).get("face_type") or cfg.swap.face_type
    if face_type is not None and face_type not in FACE_TYPES:
        raise BigbatchError(f"--face-type must be one of {', '.join(FACE_TYPES)}, got {face_type!r}")
    if face_type and known and face_type != known:
        raise BigbatchError(
            f"{path} was trained on faces of DFL's face type {known!r}, not {face_type!r}: drop --face-type"
        )
    face_type = face_type or known
    if not face_type:
        raise BigbatchError(
            f"the DFL face type of {path} is unknown (its faces were not prepared from DFL's aligned faces, "
            f"and swap.face_type is unset): give --face-type {'|'.join(FACE_TYPES)}, the type DFL extracted "
            "them with (its merger crops by it)"
        )
    # (map_location: a GPU run's optimizer moments were saved on its device)
    state = safe_pickle.torch_weights((ckpt / "state.pt").read_bytes(), str(ckpt / "state.pt"))  # (one line, not
    # torch's traceback advising weights_only=False for a crafted file: found from outside)
    iteration = max(1, int(state.get("steps", 0)) + int(state.get("dfl_iter", 0)))
    options = dfl_options(cfg, face_type)
    if not int(state.get("steps", 0)):  # (not trained here: DFL's pretrain as it was; found from outside, a model
        options.pop("pretrain")  # pretraining in DFL was no longer, so that DFL skipped what it does as it ends)
    data = {**dfl.model_data(model, options, iteration), "loss_history": _loss_history(ckpt, int(state.get("nimg", 0)))}
    dfl.save_model_folder(model, out, name, data_file=_data_file(data, state.get("dfl_data"), str(ckpt)))
    dims = {k: getattr(model, k) for k in ("ae_dims", "e_dims", "d_dims", "d_mask_dims")}
    if outside := [f"{k} {v}" for k, v in dims.items() if not _in_dfl_range(k, v)]:
        warn(  # (found from outside: written as they were, where DFL's prompt clips them when a user overrides)
            f"the model's {', '.join(outside)} lie outside DFL's own choices (ae_dims 32..1024; e_dims, d_dims and "
            "d_mask_dims even, 16..256): DFL trains and merges it as it is, but overriding its model settings "
            "there clips them, and the weights no longer fit"
        )
    trained = [k for k in ("gan_power", "true_face_power") if getattr(cfg.swap, k, 0) > 0]
    if trained:  # (found from outside: dropped without a word, though its options keep the powers)
        warn(
            f"the run's discriminators ({', '.join(f'swap.{k}' for k in trained)}) are not written (DFL's own "
            "layout of them is not this one's): DFL's trainer starts them anew from this model"
        )
    if "opt" in state:  # the optimizer's moments, so that DFL's trainer goes on where this run stopped
        saved = state["opt"]
        index = [i for group in saved["param_groups"] for i in group["params"]]
        params = optimizer_parameters(model, len(index))
        moments = {params[i]: saved["state"][i] for i in index if i in saved["state"]}
        step = int(saved["param_groups"][0].get("step", 0))
        arrays = dfl.export_optimizer(model, moments, step, cfg.swap.optimizer)
        dfl.write_weights(Path(out) / f"{name}_SAEHD_src_dst_opt.npy", arrays)
    # The replaced model's weights that this one has not (found from outside: another archi's decoders, a GAN's
    # discriminator and its moments were left, and DFL loads a GAN.npy whose shapes fit)
    written = {f"{name}_SAEHD_{part}.npy" for part in model.parts} | {f"{name}_SAEHD_data.dat"}
    written |= {f"{name}_SAEHD_src_dst_opt.npy"} if "opt" in state else set()
    for stale in existing:
        if stale.name not in written and stale.suffix == ".npy" and stale.is_file():
            stale.unlink()
    return Path(out)


def _check_face_types(path: str | Path, files: list[Path]) -> None:
    """Refuse DFL aligned faces of another face type than the model's (found from outside: swapped without a word,
    framed as the model never saw faces); faces without DFL's metadata are taken as they are."""
    from bigbatch.data.align import face_type
    from bigbatch.data.dfl_faces import NoFaceData, read_metadata

    own = source_face_type(path)
    if not own:
        return
    own = face_type(own).dfl_name
    for f in files:
        if f.suffix.lower() not in (".jpg", ".jpeg"):
            continue
        try:
            kind = face_type(str((read_metadata(f.read_bytes(), str(f)) or {}).get("face_type", own))).dfl_name
        except (NoFaceData, OSError, BigbatchError):  # (no DFL face, or a type of DFL's no model trains on)
            continue
        if kind != own:
            raise BigbatchError(
                f"{f} is a {kind} face and {path} swaps {own} faces: extract the faces with --face-type {own}, or "
                "swap them in their frames with bigbatch merge (it cuts them as the model was trained)"
            )


def _say_others(out_dir: Path, stems: dict[str, Path]) -> None:
    """Warn of images in OUT_DIR (or its masks/) that this swap does not write: an earlier swap's, of faces not among
    these, perhaps of another model (found from outside: left beside the new ones without a word; DFL's merger empties
    its output folder, `bigbatch merge` refuses one it did not write)."""
    folders = [f for f in (out_dir, out_dir / "masks") if f.is_dir()]
    others = sorted(
        str(p.relative_to(out_dir))
        for f in folders
        for p in f.iterdir()
        if p.suffix.lower() in IMAGE_SUFFIXES and p.stem not in stems
    )
    if others:
        warn(
            f"{out_dir} holds {counted(len(others), 'image')} this swap does not write ({named_few(others, 3)}), of an "
            "earlier swap: remove them, or give another OUT_DIR, for a folder of this swap's faces alone"
        )


def swap_folder(
    path: str | Path,
    in_dir: str | Path,
    out_dir: str | Path,
    device: str | torch.device = "cpu",
    batch: int = 8,
    color_transfer: str | None = None,
) -> int:
    """Swap every aligned face image in `in_dir` to src with the model of `path` (a run, a checkpoint
    or a DFL model folder): OUT_DIR/<name>.png, the swapped face blended into the input by the
    predicted mask at the input's own size (the model's output resized to it, as DFL's merger pastes
    it), and OUT_DIR/masks/<name>.png, the mask. `color_transfer`: DFL's merger's colour transfer of
    the swap to its dst face (rct, lct, mkl, mkl-m, idt, idt-m, sot-m; "none" as None). Returns the number of faces.
    Images of OUT_DIR that are none of these faces' (an earlier swap's) are said."""
    color_transfer = None if color_transfer == "none" else color_transfer  # (merge's word for it: found from outside)
    if color_transfer is not None and color_transfer not in MERGE_MODES:
        raise BigbatchError(
            f"unknown colour transfer {color_transfer!r}; valid: {', '.join(MERGE_MODES)} (DFL's merger's but "
            "mix-m, which round-trips through 8-bit L*a*b*)"
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BigbatchError(f"--batch (faces per forward) must be at least 1, got {batch!r}")
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    if not Path(path).exists():
        raise BigbatchError(
            f"{path} does not exist; give a swap run, one of its checkpoints/<kimg> folders, or a DeepFaceLab "
            "SAEHD model folder"
        )
    if not in_dir.is_dir():
        raise BigbatchError(f"{in_dir} is not a folder of aligned face images")
    if out_dir.exists() and not out_dir.is_dir():  # (found from outside: "OUT/masks: Not a directory")
        raise BigbatchError(f"{out_dir} is a file: give a folder for the swapped faces (made if missing)")
    if in_dir.resolve() in (out_dir.resolve(), (out_dir / "masks").resolve()):
        raise BigbatchError(
            f"{out_dir} would replace the faces of {in_dir} with their swaps: give another output folder"
        )
    files = sorted(p for p in in_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise BigbatchError(f"{in_dir} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    stems: dict[str, Path] = {}
    for f in files:
        if f.stem in stems:
            raise BigbatchError(
                f"{stems[f.stem].name} and {f.name} would both be written as {out_dir / (f.stem + '.png')}: rename one"
            )
        stems[f.stem] = f
    _say_others(out_dir, stems)
    model = load_autoencoder(path, device).pack_for_cpu()  # (used on a CPU only)
    _check_face_types(path, files)
    res = model.resolution
    done = 0
    for i in range(0, len(files), batch):
        faces, originals, names = [], [], []
        for f in files[i : i + batch]:
            try:  # one rule with predict and extract: an unreadable file is skipped and named, not fatal
                with Image.open(f) as img:
                    rgb = img.convert("RGB")
            except (OSError, ValueError, SyntaxError) as e:
                print(f"bigbatch: skipped {f.name}: not a readable image ({e})", file=sys.stderr)
                continue
            if rgb.width != rgb.height:
                warn(f"{f} is {rgb.width}x{rgb.height}, not square as aligned faces are: stretched to the model's "
                     "square, and its swap back to the image's shape", once=True)  # fmt: skip
            originals.append(np.asarray(rgb))
            faces.append(np.asarray(rgb.resize((res, res), Image.Resampling.LANCZOS)))
            names.append(f)
        if not faces:
            continue
        swapped, masks = swap_faces(model, torch.from_numpy(np.stack(faces)), batch, color_transfer, first=i)
        (out_dir / "masks").mkdir(parents=True, exist_ok=True)  # made once there is something to write
        done += len(names)
        for f, original, face, mask in zip(names, originals, swapped, masks):
            face_image, mask_image = Image.fromarray(face.numpy()), Image.fromarray(mask.numpy())
            size = (original.shape[1], original.shape[0])
            if size != face_image.size:  # back to the input's size, as DFL's merger pastes its face
                face_image = face_image.resize(size, Image.Resampling.LANCZOS)
                mask_image = mask_image.resize(size, Image.Resampling.BILINEAR)
            m = np.asarray(mask_image, np.float32)[..., None] / 255
            blended = np.asarray(face_image, np.float32) * m + original.astype(np.float32) * (1 - m)
            _save_png(Image.fromarray(blended.round().astype(np.uint8)), out_dir / f"{f.stem}.png")
            _save_png(mask_image, out_dir / "masks" / f"{f.stem}.png")
    if not done:
        raise BigbatchError(f"{in_dir} holds no readable image (each one skipped above)")
    return done


def _save_png(image: Image.Image, path: Path) -> None:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    atomic_write(path, buffer.getvalue())
