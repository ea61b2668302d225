"""`bigbatch xseg apply MODEL FACES` and `bigbatch xseg remove FACES`: DeepFaceLab's XSeg masks, as its
`XSegUtil.apply_xseg` and `remove_xseg` write them into aligned faces, from a trained XSeg model in DFL's own
files (its model folder's `XSeg_256.npy`, e.g. the generic XSeg model DFL ships), without DFL's TensorFlow.

Each face (BGR in [0, 1], DFL's order) is resized to 256 px with Lanczos and masked by the network; the
mask's sigmoid is clipped, set to 0 under 0.1 and cut at 0.5, as DFL's, and stored in the face's metadata as
`xseg_mask`: a 256 px PNG (DFL falls back to a JPEG past 50,000 bytes), a uint8 array as DFL keeps it.
`prepare --masks dfl` and training then take it, as DFL's trainer does. A model trained on another face type
(its `XSeg_data.dat` says, or --face-type) sees each face cut to its type from the frame's landmarks and
gives the mask back through the same warp, as DFL's (its forward warp bilinear: DFL's LANCZOS4 flag lands in
warpAffine's `dst`, as in its extractor).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import torch

from bigbatch import checkpoint_find, checkpoints, models, safe_pickle
from bigbatch.config import Config
from bigbatch.data import align
from bigbatch.data.dfl_faces import NoFaceData, extracted_type, read_metadata, write_metadata
from bigbatch.errors import BigbatchError, counted, named_few, warn
from bigbatch.faces.image_file import TooLarge, imdecode
from bigbatch.faces.video import natural_key
from bigbatch.files import atomic_write
from bigbatch.models import dfl
from bigbatch.models.xseg import RESOLUTION, XSeg

WEIGHTS = f"XSeg_{RESOLUTION}.npy"
MAX_BYTES = 50_000  # DFL's set_xseg_mask: a larger PNG is written as a JPEG of the highest quality that fits


def weights_of(path: str | Path) -> Path:
    """The XSeg weight file `path` names (a model folder, or the file); one line if there is none."""
    path = Path(path)
    file = path if path.is_file() else path / WEIGHTS
    if not path.exists():  # (found from outside: a missing folder "held no XSeg model")
        raise BigbatchError(f"{path} does not exist: give a trained XSeg model's folder, or its {WEIGHTS}")
    if not file.is_file():
        raise BigbatchError(
            f"{path} holds no DeepFaceLab XSeg model ({WEIGHTS}): give a trained XSeg model's folder (DFL's "
            "workspace/model, or its _internal/model_generic_xseg) or that file"
        )
    return file


def is_run(path: str | Path) -> bool:
    """Whether `path` names a bigbatch run or one of its checkpoints (not a DFL model folder or file)."""
    path = checkpoint_find.run_named(path)
    return (
        path.is_dir()
        and not (path / WEIGHTS).is_file()
        and any((path / name).exists() for name in ("checkpoints", "meta.json", "state.pt"))
    )


def load_xseg(path: str | Path) -> tuple[XSeg, str | None]:
    """The XSeg model in `path`, in eval mode, and the face type it was trained on (None: none said, the faces'
    own): DFL's (its model folder, or the `XSeg_256.npy` itself; the type its `XSeg_data.dat` says), or an xseg
    run's (its latest checkpoint, or the checkpoint folder named; the type its faces were)."""
    if is_run(path):
        return checkpoint_find.read_newest(path, _load_run)
    file = weights_of(path)
    weights = dfl.read_weights(file)
    first = np.asarray(weights.get("conv01/conv/weight:0", np.zeros((3, 3, 3, 32))))
    model = XSeg(base_ch=int(first.shape[-1]) if first.ndim == 4 else 32)  # (DFL's is 32; smaller in tests)
    dfl.import_part(model, weights, str(file))
    kind = None
    dat = file.parent / "XSeg_data.dat"
    if dat.is_file():
        data = dfl.read_pickle(dat)
        options = data.get("options") if isinstance(data, dict) else None
        kind = options.get("face_type") if isinstance(options, dict) else None
    return model.eval().requires_grad_(False), (str(kind) if kind else None)


def model_file(path: str | Path) -> Path:
    """The file holding the weights of the XSeg model `path` names: DFL's `XSeg_256.npy`, or the run's checkpoint's."""
    return checkpoint_find.find_checkpoint(path) / "model.safetensors" if is_run(path) else weights_of(path)


def _load_run(ckpt: Path) -> tuple[XSeg, str | None]:
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "xseg":
        raise BigbatchError(f"{ckpt} is a {cfg.task} run, not an XSeg (task xseg) run")
    with torch.random.fork_rng(devices=[]):  # (built on the host, not on "meta": BlurPool's kernels are made here)
        model = models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options)
    weights, _ = checkpoints.load_checkpoint(ckpt, nets=("model",), state=False)
    checkpoints.load_weights(model, weights["model"], f"the model of checkpoint {ckpt}")
    kind = checkpoints.model_info(ckpt).get("face_type") or cfg.xseg.face_type or None
    return model.eval().requires_grad_(False), kind


def export_dfl(path: str | Path, out: str | Path, overwrite: bool = False, face_type: str | None = None) -> Path:
    """Write an xseg run's model (its latest checkpoint, or the one named) as DFL's XSeg model folder `out`:
    `XSeg_256.npy` and `XSeg_data.dat` (its face type, iteration count and DFL's options), which DFL's XSeg
    trainer goes on training and its apply and merger read. Its RMSprop moments are not written: DFL starts them
    afresh. `face_type`: the faces' (h, mf, f, wf, head), where the run does not know it; DFL cuts faces by it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BigbatchError(f"{out} is a file: give a folder for the DeepFaceLab XSeg model (made if missing)")
    if (out / WEIGHTS).exists() and not overwrite:
        raise BigbatchError(f"{out} already holds a DeepFaceLab XSeg model ({WEIGHTS}): give --overwrite to replace it")
    ckpt = checkpoint_find.find_checkpoint(path)
    model, kind = checkpoint_find.read_newest(ckpt, _load_run)
    if model.base_ch != 32:  # (DFL builds XSeg(3, 32, 1) and would start afresh: its loader reshapes to that)
        raise BigbatchError(
            f"{path} is an XSeg of base_ch {model.base_ch}, and DFL's is 32: train with model.options={{}} to hand it "
            "to DFL"
        )
    if face_type and kind and face_type != kind:
        raise BigbatchError(f"{path} was trained on faces of DFL's face type {kind!r}, not {face_type!r}: drop it")
    kind = kind or face_type
    if not kind:
        raise BigbatchError(
            f"the DFL face type of {path} is unknown (its faces were not prepared from DFL's aligned faces, and "
            "xseg.face_type is unset): give --face-type h|mf|f|wf|head, the type DFL extracted them with"
        )
    state = safe_pickle.torch_weights((ckpt / "state.pt").read_bytes(), str(ckpt / "state.pt"))
    cfg = Config.load(ckpt / "config.toml")
    options = {"face_type": kind, "pretrain": False, "batch_size": cfg.train.batch}
    out.mkdir(parents=True, exist_ok=True)
    # An earlier model's RMSprop moments there (DFL's trainer leaves them) would be read with these weights: removed
    # first, so that DFL starts them afresh (found from outside: kept by --overwrite)
    if (stale := out / WEIGHTS.replace(".npy", "_opt.npy")).exists():
        stale.unlink()
        warn(f"removed {stale}: an earlier model's RMSprop moments, which DFL would take for this one's")
    dfl.write_weights(out / WEIGHTS, dfl.export_part(model))
    data = {"iter": max(1, int(state.get("steps", 0))), "options": options, "loss_history": []}
    atomic_write(out / "XSeg_data.dat", dfl.dumps({**data, "sample_for_preview": None, "choosed_gpu_indexes": None}))
    return out


def read_face(path: Path) -> tuple[bytes, dict, np.ndarray]:
    """An aligned DFL face's (bytes, metadata, image float32 BGR in [0, 1]); NoFaceData (one line) if it is none."""
    data = path.read_bytes()
    meta = read_metadata(data, str(path))
    if meta is None:
        raise NoFaceData("not an aligned DeepFaceLab face (no metadata)")
    try:  # (a decompression bomb refused from its header: found by review)
        image = imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR, str(path))
    except TooLarge as e:
        raise NoFaceData(str(e)) from None
    if image is None:
        raise NoFaceData("it does not decode as an image")
    return data, meta, image.astype(np.float32) / 255


def face_files(folder: Path) -> list[Path]:
    """The aligned faces (.jpg) in `folder`, in natural order; one line if it is no folder or holds none."""
    if not folder.is_dir():
        raise BigbatchError(f"{folder} is not a folder of aligned faces (bigbatch extract's or DFL's)")
    faces = sorted(
        (p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file()), key=natural_key
    )
    if not faces:  # (found by review: "Applied XSeg to 0 faces", exit 0)
        raise BigbatchError(f"{folder} holds no aligned faces (.jpg): give the folder bigbatch extract or DFL wrote")
    return faces


def _mask_png(mask: np.ndarray) -> np.ndarray:
    """A 0/1 mask as DFL's set_xseg_mask stores it: PNG, or the best JPEG under MAX_BYTES."""
    img = np.clip(mask * 255, 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".png", img)
    if not ok or len(buf) > MAX_BYTES:
        for quality in range(100, -1, -1):
            ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if ok and len(buf) <= MAX_BYTES:
                break
    return buf


def _to_model(image: np.ndarray, meta: dict, kind: align.FaceType | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The face (float BGR) as the model reads it (256 px, cut to its face type), and the matrix of that cut."""
    w = image.shape[1]
    own = align.face_type(extracted_type(meta))
    mat = None
    if kind is not None and kind != own:
        points = np.asarray(meta.get("source_landmarks", ()), np.float64)
        if points.shape != (68, 2):
            raise NoFaceData("its metadata has no source landmarks, which cutting it to the model's face type needs")
        corners = np.float32([(0, 0), (w, 0), (0, w)])
        there = align.transform_points(corners, align.transform_mat(points, w, kind), invert=True)
        here = align.transform_points(there, align.transform_mat(points, w, own))
        mat = cv2.getAffineTransform(here.astype(np.float32), corners)
        image = cv2.warpAffine(image, mat, (w, w))  # (bilinear: see the module)
    if image.shape[:2] != (RESOLUTION, RESOLUTION):
        image = cv2.resize(image, (RESOLUTION, RESOLUTION), interpolation=cv2.INTER_LANCZOS4)
    return image, mat


def _from_model(mask: np.ndarray, mat: np.ndarray | None, w: int) -> np.ndarray:
    """The model's mask (256 px) back on the face as it is, cut at 0.5 (DFL's)."""
    if mat is not None:
        mask = cv2.resize(mask, (w, w), interpolation=cv2.INTER_LANCZOS4)
        mask = cv2.warpAffine(mask, mat, (w, w), flags=cv2.WARP_INVERSE_MAP | cv2.INTER_LANCZOS4)
        mask = cv2.resize(mask, (RESOLUTION, RESOLUTION), interpolation=cv2.INTER_LANCZOS4)
    return (mask >= 0.5).astype(np.float32)


def apply_xseg(
    model_path: str | Path, folder: str | Path, face_type: str | None = None, device: str = "cpu", batch: int = 8
) -> tuple[int, list[tuple[str, str]]]:
    """Mask every aligned face in `folder` with the XSeg model in `model_path` (see the module); `face_type`:
    the model's, where its files do not say ("same": the faces' own). Returns (faces masked, [(file, why
    skipped)])."""
    model, said = load_xseg(model_path)
    given = None if face_type in (None, "same") else face_type
    if said and given and align.face_type(given) != align.face_type(said):  # (found by review: the flag won)
        warn(f"--face-type {given} left aside: the model says it was trained on {said} faces")
    kind = align.face_type(said or given) if (said or given) else None
    if batch < 1:
        raise BigbatchError(f"--batch must be at least 1, got {batch}")
    from tqdm import tqdm

    model = model.to(device)
    files, done, skipped = face_files(Path(folder)), 0, []
    # (found from outside: silent until its end, an hour for a large set; as extract's, on a terminal)
    with tqdm(total=len(files), unit="face", disable=not sys.stderr.isatty(), dynamic_ncols=True, leave=False) as bar:
        for start in range(0, len(files), batch):
            bar.update(len(files[start : start + batch]))  # (the chunk under way)
            chunk = []
            for path in files[start : start + batch]:
                try:
                    data, meta, image = read_face(path)
                    face, mat = _to_model(image, meta, kind)
                except (NoFaceData, BigbatchError) as e:
                    skipped.append((path.name, str(e)))
                    continue
                chunk.append((path, data, meta, face, mat, image.shape[1]))
            if not chunk:
                continue
            x = torch.from_numpy(np.stack([c[3] for c in chunk])).permute(0, 3, 1, 2).to(device)
            with torch.no_grad():
                masks = torch.sigmoid(model(x)).clamp(0, 1)[:, 0].cpu().numpy()
            masks[masks < 0.1] = 0  # (DFL's XSegNet.extract: its noise)
            for (path, data, meta, _, mat, w), mask in zip(chunk, masks):
                meta["xseg_mask"] = _mask_png(_from_model(mask, mat, w))
                try:
                    written = write_metadata(data, meta)
                except ValueError as e:  # (found by review: a face's metadata and its mask past one JPEG segment)
                    skipped.append((path.name, str(e)))
                    continue
                atomic_write(path, written, through_link=True)  # (DFL's save writes through a linked face)
                done += 1
    return done, skipped


def remove_xseg(folder: str | Path) -> int:
    """Take the applied XSeg masks out of the aligned faces in `folder` (DFL's remove_xseg); how many had one."""
    removed = faces = 0
    for path in face_files(Path(folder)):
        data = path.read_bytes()
        try:
            meta = read_metadata(data, str(path))
        except (NoFaceData, BigbatchError):  # (not a face: nothing to remove)
            continue
        faces += meta is not None
        if meta is not None and meta.get("xseg_mask") is not None:
            del meta["xseg_mask"]
            atomic_write(path, write_metadata(data, meta), through_link=True)
            removed += 1
    if not faces:  # (found from outside: "removed the masks of 0 faces", exit 0, where apply refuses the folder)
        raise BigbatchError(
            f"no file in {folder} is an aligned face (DFL's metadata): give bigbatch extract's or DFL's"
        )
    return removed


def said_skipped(skipped: list[tuple[str, str]]) -> str:
    """One line on the files apply left as they were: the first with its reason, then the next few by name (found
    from outside: the others were counted, never named)."""
    first, why = skipped[0]
    also = f"; also {named_few([name for name, _ in skipped[1:]])}" if len(skipped) > 1 else ""
    it = "it was" if len(skipped) == 1 else "they were"  # (found from outside: "1 file left as they were")
    return f"{counted(len(skipped), 'file')} left as {it} ({first}: {why}{also})"


def merge_masks(
    model: XSeg, swapped: list[np.ndarray], dst: list[np.ndarray], res: int, need: tuple[bool, bool] = (True, True)
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The merger's XSeg masks (DFL's MergeMasked): of each swapped face (RGB (res, res, 3) in [0, 1], resized to
    256 bicubic) and of each dst face (RGB, the face type's square of the frame at 256, bicubic), each XSeg's
    (clipped, 0 under 0.1) and resized to `res` bicubic; [(of the swap, of the dst face)]. `need`: which of the
    two the mask mode reads (the other is not computed: zeros; DFL's runs only those too)."""
    if not swapped:
        return []
    device = next(model.parameters()).device
    faces = [cv2.resize(f, (RESOLUTION, RESOLUTION), interpolation=cv2.INTER_CUBIC) for f in swapped] if need[0] else []
    faces += list(dst) if need[1] else []
    found = []
    if faces:
        x = torch.from_numpy(np.stack(faces)[..., ::-1].copy()).permute(0, 3, 1, 2).float()  # (BGR, as DFL's)
        with torch.inference_mode():
            for at in range(0, len(x), 8):
                found.append(torch.sigmoid(model(x[at : at + 8].to(device))).clamp(0, 1)[:, 0].cpu().numpy())
        masks = np.concatenate(found)
        masks[masks < 0.1] = 0
        found = [cv2.resize(m, (res, res), interpolation=cv2.INTER_CUBIC) for m in masks]
    none = [np.zeros((res, res), np.float32)] * len(swapped)
    of_swap = found[: len(swapped)] if need[0] else none
    of_dst = found[len(swapped) if need[0] else 0 :] if need[1] else none
    return list(zip(of_swap, of_dst))
