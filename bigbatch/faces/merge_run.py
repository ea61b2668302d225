"""`bigbatch merge`: a swap run's model, the frames and their aligned faces -> merged frames (and a video), each
frame merged as faces/merge.py merges one (DFL's MergeMasked), the model's swap of the next frames' faces batched
beside the threads that merge them; a rerun keeps what an interrupted one wrote (merge_record)."""

from __future__ import annotations

import collections
import concurrent.futures
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from bigbatch.data import align
from bigbatch.errors import BigbatchError, counted, counted_names, warn
from bigbatch.faces.enhance import enhancer_file
from bigbatch.faces.merge import (
    BATCH,
    PRD_MASKS,
    XSEG_MASKS,
    Enhancer,
    MergeSettings,
    face_input,
    merge_frame,
    merge_threads,
)
from bigbatch.faces.merge_filters import motions
from bigbatch.faces.video import IMAGE_SUFFIXES, VideoWriter, another_size, check_one_size, natural_key
from bigbatch.files import atomic_write, json_loads


def predict_faces(model: torch.nn.Module, faces: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A SAEHD's swap of `faces` ((res, res, 3) RGB float32 in [0, 1]), BATCH at a time on the model's device:
    what a Predictor gives for each, (the swapped face, the src-path mask, the dst-path mask)."""
    device = next(model.parameters()).device
    found = []
    for at in range(0, len(faces), BATCH):
        x = torch.from_numpy(np.stack(faces[at : at + BATCH])).permute(0, 3, 1, 2).to(device)
        with torch.inference_mode():
            image, mask, dst_mask = (t.float().cpu() for t in model.swap(x))
        found += [(i.permute(1, 2, 0).numpy(), m[0].numpy(), d[0].numpy()) for i, m, d in zip(image, mask, dst_mask)]
    return found


def aligned_faces(folder: Path) -> tuple[dict[str, list[np.ndarray]], set[str]]:
    """{frame stem: [source landmarks of each face, in the faces' order]} of a folder of DFL aligned faces, and
    the face types they were extracted with."""
    from bigbatch.data.dfl_faces import NoFaceData, extracted_type, landmarks_of, read_metadata
    from bigbatch.faces.extract_journal import JOURNAL

    if not folder.exists():
        raise BigbatchError(f"{folder} does not exist; give the folder of aligned faces bigbatch extract or DFL wrote")
    if not folder.is_dir():
        raise BigbatchError(f"{folder} is not a folder of aligned faces (what bigbatch extract or DFL wrote)")
    by_frame: dict[str, list[tuple[str, np.ndarray]]] = {}
    kinds = set()
    files = [p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file()]
    for p in files:
        try:
            meta = read_metadata(p.read_bytes(), str(p))
        except NoFaceData as e:
            raise BigbatchError(f"{p}: {e}") from None
        if meta is None or "source_filename" not in meta or "source_landmarks" not in meta:
            raise BigbatchError(
                f"{p} carries no DFL face metadata with its frame's name and landmarks: give the aligned faces "
                "bigbatch extract (or DFL's extractor) wrote"
            )
        try:
            landmarks = landmarks_of(meta, "source_landmarks")
        except NoFaceData as e:
            raise BigbatchError(f"{p}: {e}") from None
        by_frame.setdefault(Path(str(meta["source_filename"])).stem, []).append((p.name, landmarks))
        kinds.add(extracted_type(meta))
    if not files and not (folder / JOURNAL).is_file():  # (with extract's journal: no face in any frame, none to merge)
        raise BigbatchError(f"{folder} holds no aligned faces (.jpg)")
    by_name = {
        stem: [lm for _, lm in sorted(faces, key=lambda f: natural_key(f[0]))] for stem, faces in by_frame.items()
    }
    return by_name, kinds


def check_source(aligned: Path, frames: str, source: Any) -> None:
    """Refuse, in one line, faces extracted from other frames than FRAMES (an extract FrameSource): they are
    matched to frames by name alone and would be pasted on other frames (found from outside: a video's faces on
    the frames taken of it at another rate, exit 0). ALIGNED's journal (bigbatch extract's) names their source;
    the same frames elsewhere (a video and the folder of all its frames, a folder moved) pass by their names, and
    DFL's aligned folders, with no journal, are taken as they are."""
    from bigbatch.faces.extract_journal import JOURNAL, same_source

    try:
        lines = (aligned / JOURNAL).read_text().splitlines()
        recorded = json_loads(lines[0])["source"]
        was = recorded["path"]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return
    now = source.identity()
    if was == now["path"]:
        return
    if "checksum" in recorded and "checksum" in now:  # a video, and a video
        if same_source(recorded, now):  # (the same one, copied or moved)
            return
        raise BigbatchError(  # (found from outside: dst's faces on src.mp4, as many frames, passed with exit 0)
            f"the faces in {aligned} were extracted from {was}, and {frames} is another video (its bytes differ): "
            f"they would be pasted on its frames by number; give {was} as FRAMES, or --any-source if {frames} is "
            "the same footage (a copy encoded again)"
        )
    stems = set()
    for line in lines[1:]:
        try:
            stems.add(Path(json_loads(line)["frame"]).stem)
        except (ValueError, KeyError, TypeError):  # (the line a killed extract cut short)
            continue
    names = source.names()
    if names is not None and stems == {Path(name).stem for name in names}:
        return
    here = f"{len(names)} here" if names is not None else "an unknown count here"
    there = counted(len(stems), "frame")
    raise BigbatchError(
        f"the faces in {aligned} were extracted from {was}, whose frames are not {frames}'s ({there} "
        f"there, {here}): by name they would be pasted on other frames; give {was} as FRAMES, or extract "
        f"{frames}'s faces (bigbatch extract {frames} NEW_ALIGNED), or --any-source if they are its frames"
    )


def outside(faces: list[np.ndarray], frame: np.ndarray, stem: str, aligned: str | Path, frames: str) -> str | None:
    """Why a face (its source landmarks) cannot be of this frame, or None: its landmarks' box misses the frame
    entirely (extracted from other frames; one at the edge, mostly outside, is DFL's too: found by review)."""
    h, w = frame.shape[:2]
    for landmarks in faces:
        (x0, y0), (x1, y1) = landmarks.min(0), landmarks.max(0)
        if x1 < 0 or y1 < 0 or x0 >= w or y0 >= h:
            return (
                f"a face in {aligned} of frame {stem} lies outside that frame of {frames} ({w}x{h}; its landmarks "
                f"from {x0:.0f},{y0:.0f} to {x1:.0f},{y1:.0f}): give the frames it was extracted from, or --any-source "
                "to merge it all the same"
            )
    return None


def enhancer_of(weights: str | Path, device: str) -> Enhancer:
    """DFL's FaceEnhancer from a DFL install's facelib folder (or its FaceEnhancer.npy), as the merger calls it:
    the swap (RGB here, BGR to the network) in and its 4x out, unconverted (models/face_enhancer.enhance)."""
    from bigbatch.faces.enhance import load_enhancer
    from bigbatch.models.face_enhancer import enhance

    model = load_enhancer(weights, device)
    return lambda face: np.ascontiguousarray(enhance(model, face[..., ::-1], is_tanh=True)[..., ::-1])


def merge_folder(
    run: str,
    frames: str,
    aligned: str | Path,
    out: str | Path,
    s: MergeSettings = MergeSettings(),  # noqa: B008 -- frozen: one default shared is safe
    device: str = "cpu",
    face_type: str | None = None,
    quiet: bool = False,
    writer: VideoWriter | None = None,
    xseg: str | None = None,
    weights: str | None = None,
    any_source: bool = False,
) -> tuple[int, int, int]:
    """`bigbatch merge`: every frame of `frames` (a folder or a video) with the faces `aligned` holds for it
    swapped by `run`'s model and merged as DFL's merger merges, written whole to OUT/{stem}.png and its mask to
    OUT/masks/{stem}.png; frames without a face pass through unchanged. A rerun with the same settings, model,
    aligned faces and frames (OUT/.merge.json, merge_record) keeps the frames already written (an interrupted
    merge continues); when any of them changed, the frames merged before are removed and every frame is merged
    again, said on stderr. Each merged frame, in order, also goes to `writer` (`bigbatch
    merge --video`; a kept frame is read back from its PNG). Frames are merged on threads while the model swaps
    the next frames' faces. `xseg`: an XSeg model (DFL's or an xseg run's; faces/xseg.py), which the XSeg masks
    need; `weights`: a DFL install's facelib folder, whose FaceEnhancer s.super_resolution runs. Faces extracted
    from other frames than `frames` (check_source) are refused unless `any_source`. Returns (frames merged, faces
    merged, frames kept from before)."""
    from tqdm import tqdm

    from bigbatch.faces import merge_record
    from bigbatch.faces.extract import FrameSource, read_image
    from bigbatch.faces.extract_journal import read_otherwise
    from bigbatch.tasks.swap.load import load_autoencoder, source_face_type

    if unread := s.unread():  # (DFL's merger does not ask them in this mode)
        warn(f"--mode {s.mode} reads no {', '.join(unread)}: merged without {'it' if len(unread) == 1 else 'them'}")
    if (alone := s.unpaired()) == "sharpen":
        warn(f"--sharpen {s.sharpen} sharpens by --blursharpen AMOUNT (1..100), which is 0: merged without it")
    elif alone == "blursharpen":
        warn(f"--blursharpen {s.blursharpen} sharpens by --sharpen box or gaussian, which is none: merged without it")
    s = s.as_read()  # (those it does not read at their defaults: changed, they merge nothing again)
    if (s.mask in XSEG_MASKS) != (xseg is not None):
        raise BigbatchError(
            f"--mask {s.mask} needs --xseg MODEL, an XSeg model (DFL's _internal/model_generic_xseg, or an xseg run)"
            if xseg is None
            else f"--xseg is the XSeg model of the XSeg masks ({', '.join(XSEG_MASKS)}); --mask {s.mask} is not one"
        )
    if s.super_resolution and weights is None:
        raise BigbatchError(
            "--super-resolution runs DFL's face enhancer: give --weights DFL/facelib (its FaceEnhancer.npy)"
        )
    if weights is not None and not s.super_resolution:  # (found from outside: power 0, DFL's "off", was refused)
        if "--super-resolution" not in unread:
            warn("--weights is the face enhancer of --super-resolution, which is 0 (off): merged without it")
        weights = None
    # (parsed before the model loads: a wrong path is said at once)
    source = FrameSource(frames, lambda stem: f"the merged frames ({Path(out) / stem}.png)")
    names = source.names()
    for given, what in ((frames, "FRAMES"), (aligned, "ALIGNED")):  # (merged PNGs would replace what is read)
        if Path(given).is_dir() and Path(out).resolve() == Path(given).resolve():
            raise BigbatchError(f"OUT {out} is the {what} folder, whose files merging would replace: give another OUT")
    if Path(out).exists() and not Path(out).is_dir():
        raise BigbatchError(f"OUT {out} is a file: give a folder for the merged frames (made if it does not exist)")
    if Path(out).is_dir():  # (found from outside: they stayed beside the merged frames, for `video make OUT` to mix
        # in, or a merge again deleted them; DFL's merger deletes them, but they are the user's)
        ours = merge_record.merged_here(Path(out), names)
        if others := sorted(
            p.name
            for p in Path(out).iterdir()
            if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file() and not (p.suffix == ".png" and ours(p.stem))
        ):
            images = counted_names(others, "image")
            raise BigbatchError(f"OUT {out} holds {images} a merge did not record: give an empty folder or remove them")
    if writer is not None and source.files:  # (found from outside: cropped or stretched into the video)
        check_one_size(source.files)
    faces, kinds = aligned_faces(Path(aligned))
    if otherwise := read_otherwise(Path(aligned), source):
        raise BigbatchError(  # (found by review: faces of a phone's video, extracted sideways, pasted upright)
            f"the faces in {aligned} were extracted by an older bigbatch, which read {frames}'s frames otherwise than "
            f"now ({otherwise}): extract them again (bigbatch extract {frames} NEW_ALIGNED)"
        )
    if s.mode == "raw-predict" and (several := sorted((k for k, v in faces.items() if len(v) > 1), key=natural_key)):
        warn(  # (found from outside: unsaid)
            f"--mode raw-predict writes the first face of a frame alone; {len(several)} of the frames have more "
            f"than one (such as {several[0]}), whose others are not written"
        )
    missing = sorted(set(faces) - {Path(name).stem for name in names}) if names is not None else []
    if missing:  # (found from outside: refused under --any-source too, where DFL's merger merges the frames given)
        which = f"{counted(len(missing), 'frame')} the aligned faces were extracted from"
        where = f"{'is' if len(missing) == 1 else 'are'} not in {frames} (such as {missing[0]})"
        if not any_source:
            raise BigbatchError(
                f"{which} {where}: give the frames (or video) they came from, or --any-source to merge the frames "
                "given alone"
            )
        warn(f"{which} {where}: their faces are left out")
    if not any_source:
        check_source(Path(aligned), frames, source)
    if not Path(run).exists():
        raise BigbatchError(f"{run} does not exist; give a swap run, a checkpoint folder or a DFL SAEHD model folder")
    model = load_autoencoder(run, device).pack_for_cpu()  # (used on a CPU only)
    enhancer = enhancer_of(weights, device) if weights is not None else None
    segmenter = None
    if xseg is not None:
        from bigbatch.faces.xseg import load_xseg, model_file

        segmenter = load_xseg(xseg)[0].to(device)
    own = source_face_type(run)
    if face_type and own and align.face_type(face_type).dfl_name != align.face_type(own).dfl_name:
        raise BigbatchError(
            f"--face-type {face_type}: {run} was trained on {own} faces, and merging crops as it was trained; "
            "drop --face-type (it is for a model whose face type is unknown)"
        )
    known = face_type or own
    if known is None:
        if len(kinds) != 1:
            raise BigbatchError("the model's face type is unknown and the faces are of several: give --face-type")
        known = next(iter(kinds))
        warn(  # (found from outside: unsaid, where export-dfl refuses the run without --face-type)
            f"{run}'s face type is unknown: merging as {align.face_type(known).dfl_name}, the aligned faces' type "
            "(give --face-type if it was trained on faces of another)"
        )
    kind = align.face_type(known)

    out = Path(out)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    record = {
        "settings": {**s.record(), "face_type": kind.dfl_name}
        | ({"xseg": merge_record.content_digest(model_file(xseg))} if xseg is not None else {})
        | ({"enhancer": merge_record.content_digest(enhancer_file(weights))} if weights is not None else {}),
        "model": merge_record.model_identity(run, model),
        "aligned": merge_record.aligned_identity(Path(aligned)),
        "frames": merge_record.frames_identity(source),
    } | merge_record.merged_stems(names)
    changed = merge_record.changed_since(out, record)
    written = {p.stem for p in out.glob("*.png")}
    done = written if changed == [] else set()
    if changed and written:
        # Removed first: an interrupted merge's rerun (the record now this one's) keeps only frames merged by it,
        # and frames FRAMES no longer has do not stay for `video make OUT` to mix with these.
        for stem in written:
            for path in (out / f"{stem}.png", out / "masks" / f"{stem}.png"):
                path.unlink(missing_ok=True)
        print(f"merging all frames again: {' and '.join(changed)} changed since {out} was merged", file=sys.stderr)
    merge_record.write(out, record)  # (unchanged too: the frames' record as of now, their video's new time or place)
    bar = tqdm(total=source.count, unit="frame", disable=quiet or not sys.stderr.isatty(), dynamic_ncols=True)
    n = merged = kept = 0
    size = None  # the frames' size, for the video (one size, as `video make` takes them)
    workers = merge_threads()
    with concurrent.futures.ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        merging = _Merging(model, faces, kind, s, out, writer, bar, pool, workers, segmenter, enhancer)
        merging.motion = _motions(s, names, faces)
        try:
            for i, (name, image) in enumerate(source.frames(skip=set())):
                stem = Path(name).stem
                if stem in done:
                    kept += 1
                    merging.merged_before(stem)
                    continue
                # PNGs at the frames' own size, faces or not, video or not (found from outside: an odd side lost its
                # last row, where a frame had a face or --video was given; `video make` refused the two sizes); the
                # video's cut to even sides (yuv420p) by its writer, as DFL's cut_odd_image
                frame = read_image(image, False) if isinstance(image, Path) else image
                if frame is None:  # into a video, refused: it would lose a frame; into PNGs, skipped as extract does
                    if writer is not None:
                        raise BigbatchError(
                            f"{image} does not decode as an image, and the video would lose its frame: remove or "
                            "replace it, or merge into PNGs alone (without --video)"
                        )
                    warn(f"{image} does not decode as an image: skipped, no merged frame for it")
                    continue
                if writer is not None and size is not None and frame.shape[:2] != size:
                    merging.flush()  # (the frames before it merged and written, for a rerun once it is mended)
                    merging.drain()
                    raise another_size(
                        image if isinstance(image, Path) else f"{frames}'s frame {name}", frame.shape, size
                    )
                size = frame.shape[:2]
                if not any_source and (why := outside(faces.get(stem, ()), frame, stem, aligned, frames)):
                    merging.flush()  # (the frames before it merged and written, for a rerun)
                    merging.drain()
                    raise BigbatchError(why)
                # (raw-predict writes a frame's first face alone; found from outside: all were counted)
                found = len(faces.get(stem, ()))
                n, merged = n + 1, merged + (min(found, 1) if s.mode == "raw-predict" else found)
                merging.with_faces += bool(found)
                merging.add(i, stem, frame)
            merging.flush()
            merging.drain()
        finally:
            merging.cancel()
            bar.close()
    if merging.maskless:  # (found from outside: every mask empty, "Merged 25 faces", the frames as they were)
        warn(
            f"{len(merging.maskless)} of the {merging.with_faces} frames with faces merged kept no pixel of their "
            f"mask (e.g. {min(merging.maskless, key=natural_key)}), so they are as they were: a smaller --erode, "
            "--blur or --scale leaves some (at this "
            f"{model.resolution} px model, their pixels are a {model.resolution * 4} px square's)"
        )
    return n, merged, kept


def _motions(s: MergeSettings, names: list[str] | None, faces: dict[str, list[np.ndarray]]) -> dict:
    """Each frame's face's motion for --motion-blur (merge_filters.motions), or none, said where it cannot be."""
    if not s.motion_blur:
        return {}
    if names is None:
        warn("--motion-blur: the video's container does not say its frame count, so no face's motion is known")
        return {}
    moved = motions([Path(name).stem for name in names], faces)
    if moved is None:
        several = min((k for k, v in faces.items() if len(v) > 1), key=natural_key)
        warn(f"--motion-blur: {several} has several faces, so no frame is motion-blurred, as DFL's merger has it")
    return moved or {}


class _Merging:
    """A merge under way: chunks of BATCH frames handed to threads of one torch thread each (torch's thread count is
    a thread's own), each thread the model's swap of its chunk's faces and then each frame's merge and PNGs (with
    the swap on every core and the frames on threads beside it, the model's threads waited on each other whenever a
    frame's thread took a core); the merged frames given, in order, to the video as their chunks finish."""

    def __init__(
        self,
        model: torch.nn.Module,
        faces: dict[str, list[np.ndarray]],
        kind: align.FaceType,
        s: MergeSettings,
        out: Path,
        writer: VideoWriter | None,
        bar: Any,
        pool: concurrent.futures.ThreadPoolExecutor,
        workers: int,
        xseg: torch.nn.Module | None = None,
        enhancer: Enhancer | None = None,
    ):
        self.xseg, self.enhancer = xseg, enhancer
        self.segmenter = None  # with super resolution, XSeg of the enhanced swap (merge_face calls it)
        if xseg is not None and s.super_resolution and s.mask in PRD_MASKS:
            from bigbatch.faces.xseg import merge_masks

            self.segmenter = lambda face: merge_masks(xseg, [face], [], face.shape[0], (True, False))[0][0]
        self.model, self.faces, self.kind, self.s, self.out = model, faces, kind, s, out
        self.writer, self.bar, self.pool, self.workers = writer, bar, pool, workers
        self.pending: collections.deque[concurrent.futures.Future] = collections.deque()  # each: a chunk's frames
        self.chunk: list[tuple[int, str, np.ndarray]] = []
        self.maskless: list[str] = []  # frames with faces whose merge mask kept no pixel (on the threads)
        self.with_faces = 0  # frames with faces handed to the threads
        self.motion: dict[str, tuple[float, float]] = {}  # each frame's face's, for s.motion_blur

    def add(self, i: int, stem: str, frame: np.ndarray) -> None:
        """Frame `i` to merge (its faces are those aligned from `stem`)."""
        self.chunk.append((i, stem, frame))
        if len(self.chunk) == BATCH:
            self.flush()

    def merged_before(self, stem: str) -> None:
        """A frame an interrupted merge wrote: read back for the video, after the frames before it."""
        if self.writer is None:
            self.bar.update(1)
            return
        self.flush()
        self.pending.append(self.pool.submit(lambda: [self._written(stem)]))

    def flush(self) -> None:
        """The frames added so far handed to a thread (a chunk a thread at most in flight)."""
        if self.chunk:
            res, kind = self.model.resolution, self.kind
            sizes = (res, 256) if self.xseg is not None else (res,)  # (XSeg reads the dst face at 256, as DFL's)
            enhanced = bool(self.s.super_resolution)  # (the model's input cut at 4x, as DFL's merger then does)
            inputs = [
                [
                    face_input(frame, lm, size, kind, enhanced and size == res)
                    for _, stem, frame in self.chunk
                    for lm in self.faces.get(stem, [])
                ]
                for size in sizes
            ]
            self.pending.append(self.pool.submit(self._merge_chunk, self.chunk, *inputs))
            self.chunk = []
            self.drain(keep=self.workers)

    def drain(self, keep: int = 0) -> None:
        """Wait for the oldest chunks until `keep` are left, and give their frames, in order, to the video."""
        while len(self.pending) > keep:
            for rgb in self.pending.popleft().result():
                if self.writer is not None:
                    self.writer.add(rgb)
                self.bar.update(1)

    def cancel(self) -> None:
        """Drop the chunks not started (a merge stopped by an error)."""
        for future in self.pending:
            future.cancel()

    def _merge_chunk(
        self, chunk: list[tuple[int, str, np.ndarray]], inputs: list[np.ndarray], dst256: list | None = None
    ) -> list[np.ndarray]:
        outputs = predict_faces(self.model, inputs)
        if self.xseg is not None:
            from bigbatch.faces.xseg import merge_masks

            mode = self.s.mask  # (only the masks the mode reads, as DFL's: found by review; with super resolution,
            # XSeg reads the swap once enhanced, in merge_face)
            need = (mode in PRD_MASKS and not self.s.super_resolution, mode in ("xseg-dst", "xseg", "learned*xseg"))
            masks = merge_masks(self.xseg, [o[0] for o in outputs], dst256 or [], self.model.resolution, need)
            outputs = [o + m for o, m in zip(outputs, masks)]
        outputs = iter(outputs)
        return [
            self._finish(i, stem, frame, [next(outputs) for _ in self.faces.get(stem, [])]) for i, stem, frame in chunk
        ]

    def _finish(self, i: int, stem: str, frame: np.ndarray, outputs: list) -> np.ndarray:
        """Frame `i` merged with the model's outputs for its faces (in order), written as OUT/{stem}.png and its
        mask as OUT/masks/{stem}.png."""
        predictions = iter(outputs)
        res = self.model.resolution
        faces = self.faces.get(stem, [])
        rgb, mask = merge_frame(
            frame, faces, lambda x: next(predictions), res, self.kind, self.s, i, self.enhancer, self.segmenter,
            self.motion.get(stem, (0.0, 0.0)),
        )  # fmt: skip
        if faces and self.s.mode not in ("original", "raw-predict") and not mask.any():
            self.maskless.append(stem)  # (a frame with faces its merge left as it was)
        for path, data in ((self.out / "masks" / f"{stem}.png", mask), (self.out / f"{stem}.png", rgb[..., ::-1])):
            ok, png = cv2.imencode(".png", data)
            atomic_write(path, png.tobytes(), sync=False)
        return rgb

    def _written(self, stem: str) -> np.ndarray:
        """A frame merged before (by an interrupted merge), for the video."""
        from bigbatch.faces.extract import read_image

        rgb = read_image(self.out / f"{stem}.png")
        if rgb is None:
            raise BigbatchError(f"{self.out / stem}.png does not decode: delete it and merge again")
        return rgb
