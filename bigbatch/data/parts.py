"""What makes `prepare` resumable: the decoded (and encoded) images of each run of PART source files,
kept beside the output in `.OUT.h5.parts/` as one NumPy file each (written to a temporary name,
synced and renamed, so a killed prepare leaves only whole parts). Run again with the same command,
prepare reads the parts it has and decodes the rest; the file it writes, and its content hash, are
those of an uninterrupted run. The folder goes once the data file is in place. Parts are plain
arrays, read with allow_pickle=False."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from bigbatch.data.codecs import Encoded
from bigbatch.errors import BigbatchError, counted, warn
from bigbatch.files import atomic_write, foreign, json_loads

PART = 256  # source files per part: 5,000 files for ImageNet, a few seconds lost to a kill, bounded memory
# (bucket, image or Encoded, face type, the source image's (height, width), an aligned face's yaw; None in parts
# from before they were kept), or why the file was skipped
Result = tuple[int, Any, str | None, tuple[int, int] | None, float | None] | str


class DamagedPart(BigbatchError):
    """A kept part that does not read back: removed, the others kept for the rerun."""


PARTS_HOLD = ("skipped", "buckets", "shapes", "encoded", "face_types", "data", "lengths")  # (sizes, yaws: later)


def _discarded(kept: int, folder: Path, was: Any, now: dict[str, Any]) -> str:
    """The line said where an earlier prepare's kept parts are deleted as another command's (found from outside:
    a changed --codec or --quality threw away hours of decoding unsaid)."""
    if isinstance(was, dict):
        named = {"files": "source files", "archive": "source files"}
        if was.get("codec") and now.get("codec") and was["codec"][0] == now["codec"][0]:  # (found from outside: the
            named["codec"] = "--quality"  # codec said to differ where only the quality did)
        other = {named.get(k, k) for k in now if was.get(k) != now[k]}
        if "limit" in other:  # (found from outside: "other source files" said of another --limit, the same files)
            other = {"--limit (so other files taken)" if k == "limit" else k for k in other - {"source files"}}
        other = sorted(other)
        why = f"with other {', '.join(other)}" if other else "otherwise"
    else:
        why = "with other settings or source files"
    return (
        f"the {counted(kept, 'part')} kept in {folder} by an earlier prepare {'was' if kept == 1 else 'were'} made "
        f"{why}: deleted, decoding again"
    )


class Parts:
    """The parts folder of one prepare command (`key` names everything that decides its results)."""

    def __init__(self, folder: Path, key: dict[str, Any]):
        self.folder = folder
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        manifest = folder / "manifest.json"
        if os.path.lexists(folder) and foreign(folder):  # (found by review)
            raise BigbatchError(
                f"{folder} is in the way of prepare's parts (a link, or not this user's): remove it, or write elsewhere"
            )
        try:
            was = json_loads(manifest.read_text())
            same = was.get("key") == digest
        except (OSError, ValueError, AttributeError):
            was, same = {}, False
        if not same:  # another command's parts, or none: start afresh
            if kept := sum(1 for _ in folder.glob("part-*.npz")) if folder.is_dir() else 0:
                warn(_discarded(kept, folder, was.get("settings"), json.loads(json.dumps(key, default=str))))
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            atomic_write(manifest, json.dumps({"key": digest, "settings": key}, default=str))
        for stale in folder.glob(".*.tmp*"):  # a part a killed prepare was writing (atomic_write's names)
            stale.unlink(missing_ok=True)
        self.resumed = 0  # files read back from parts rather than decoded

    def path(self, k: int) -> Path:
        return self.folder / f"part-{k:07d}.npz"

    def done(self, k: int) -> bool:
        """Whether part `k` was kept; one whose zip directory is damaged (a disk fault, a bad copy: found from
        outside, every rerun then stopped on it) is removed, said, and decoded again."""
        path = self.path(k)
        if not path.is_file():
            return False
        try:  # (its directory, not every byte: a rerun would read the parts twice; load checks the rest)
            with zipfile.ZipFile(path) as z:
                whole = {f"{name}.npy" for name in PARTS_HOLD} <= set(z.namelist())
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            whole = False
        if not whole:
            warn(f"{path} is damaged: its images are decoded again")
            path.unlink(missing_ok=True)
        return whole

    def save(self, k: int, results: list[Result]) -> None:
        ok = [r for r in results if not isinstance(r, str)]
        payloads = [r[1].data if isinstance(r[1], Encoded) else np.ascontiguousarray(r[1]).tobytes() for r in ok]
        arrays = {
            "skipped": np.array([json.dumps(r if isinstance(r, str) else None) for r in results]),
            "buckets": np.array([r[0] for r in ok], np.int64),
            "shapes": np.array([tuple(r[1].shape) for r in ok], np.int64).reshape(-1, 3),
            "encoded": np.array([isinstance(r[1], Encoded) for r in ok], bool),
            "face_types": np.array([json.dumps(r[2]) for r in ok]),
            "sizes": np.array([r[3] for r in ok], np.int64).reshape(-1, 2),
            "yaws": np.array([np.nan if r[4] is None else r[4] for r in ok], np.float64),
            "lengths": np.array([len(p) for p in payloads], np.int64),
            "data": np.frombuffer(b"".join(payloads), np.uint8),
        }
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write(self.path(k), buffer.getvalue())

    def load(self, k: int) -> list[Result]:
        try:
            return self._load(k)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as e:  # (damaged past its directory)
            self.path(k).unlink(missing_ok=True)
            raise DamagedPart(
                f"{self.path(k)} was damaged ({e}) and is removed: run the same prepare again, which decodes its "
                "images anew and keeps the other parts"
            ) from None

    def _load(self, k: int) -> list[Result]:
        with np.load(self.path(k), allow_pickle=False) as z:
            skipped = [json_loads(s) for s in z["skipped"].tolist()]
            buckets, shapes, encoded = z["buckets"], z["shapes"], z["encoded"]
            face_types = [json_loads(s) for s in z["face_types"].tolist()]
            sizes = [tuple(int(v) for v in hw) for hw in z["sizes"]] if "sizes" in z.files else [None] * len(buckets)
            kept = z["yaws"] if "yaws" in z.files else np.full(len(buckets), np.nan)
            yaws = [None if np.isnan(v) else float(v) for v in kept]
            data, ends = z["data"], np.cumsum(z["lengths"])
        starts = ends - np.diff(ends, prepend=0)
        out: list[Result] = []
        j = 0
        for reason in skipped:
            if reason is not None:
                out.append(reason)
                continue
            payload = data[starts[j] : ends[j]]
            shape = tuple(int(v) for v in shapes[j])
            image = Encoded(payload.tobytes(), shape) if encoded[j] else payload.reshape(shape)  # type: ignore[arg-type]
            out.append((int(buckets[j]), image, face_types[j], sizes[j], yaws[j]))
            j += 1
        self.resumed += len(out)
        return out

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
