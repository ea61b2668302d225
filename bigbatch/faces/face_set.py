"""`bigbatch info FOLDER` of a folder of DeepFaceLab's aligned faces: how many, of which face types and sizes, with
XSeg's labels or masks, and where extract took them from (found from outside: "neither a run directory nor a
checkpoint folder", where a DFL user looks for what the set holds)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from pathlib import Path

from PIL import Image

from bigbatch.data.dfl_faces import FACE_TYPES, NoFaceData, extracted_type, label_mask, read_metadata
from bigbatch.errors import BigbatchError, counted, named_few
from bigbatch.faces.extract_journal import journal_head
from bigbatch.faces.video import natural_key

SUFFIXES = (".jpg", ".jpeg")
LOOKED_AT = 20  # JPEGs without DFL's metadata read before a folder is taken for photos, not faces (read no further)


def describe_faces(folder: Path) -> str | None:
    """What the aligned faces in `folder` are, as a few lines; None where none of its JPEGs carries DFL's metadata."""
    files = sorted((p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file()), key=natural_key)
    kinds: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    labelled = applied = 0
    bare: list[str] = []
    for path in files:
        if len(bare) >= LOOKED_AT and not kinds:  # (a folder of a million photos: not read whole)
            return None
        try:
            meta = read_metadata(data := path.read_bytes(), str(path))
            with Image.open(io.BytesIO(data)) as image:  # (its header: the file read once)
                side = (image.height, image.width)
        except (BigbatchError, OSError, ValueError):
            meta = None
        if meta is None:
            bare.append(path.name)
            continue
        kind = extracted_type(meta)
        kinds[f"{kind} ({FACE_TYPES[kind]})" if kind in FACE_TYPES else kind] += 1
        sizes[f"{side[1]}px" if side[0] == side[1] else f"{side[1]}x{side[0]}px"] += 1
        try:
            label_mask(meta, side)  # (as prepare --masks labels and DFL's XSeg trainer take a face's labels)
            labelled += 1
        except NoFaceData:
            pass
        applied += meta.get("xseg_mask") is not None
    if not kinds:
        return None
    faces = sum(kinds.values())
    lines = [f"faces       {counted(faces, 'aligned face')} (DeepFaceLab's) in {folder}"]
    if bare:
        lines[0] += f"; {len(bare)} JPEG{'s' if len(bare) > 1 else ''} without its metadata ({named_few(bare, 3)})"
    lines.append(f"face type   {', '.join(f'{k} {n}' for k, n in kinds.most_common())}")
    lines.append(f"size        {', '.join(f'{k} {n}' for k, n in sizes.most_common())}")
    lines.append(f"xseg        {labelled} with labels (polygons), {applied} with an applied mask")
    first = journal_head(folder)
    with contextlib.suppress(KeyError, TypeError, AttributeError):  # (a journal of before it named its source)
        source = f"extracted from {first['source']['path']} by bigbatch extract"
        lines.append(f"source      {source} ({', '.join(f'{k} {v}' for k, v in first['settings'].items())})")
    return "\n".join(lines)
