"""`bigbatch info FOLDER` of a folder of DeepFaceLab's aligned faces: how many, of which face types and sizes, with
XSeg's labels or masks, and where extract took them from (found from outside: "neither a run directory nor a
checkpoint folder", where a DFL user looks for what the set holds)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from PIL import Image

from bigbatch.data.dfl_faces import read_metadata
from bigbatch.errors import BigbatchError, counted, named_few
from bigbatch.faces.extract_journal import JOURNAL
from bigbatch.faces.video import natural_key

SUFFIXES = (".jpg", ".jpeg")


def describe_faces(folder: Path) -> str | None:
    """What the aligned faces in `folder` are, as a few lines; None where none of its JPEGs carries DFL's metadata."""
    files = sorted((p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file()), key=natural_key)
    kinds: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    labelled = applied = 0
    bare: list[str] = []
    for path in files:
        try:
            meta = read_metadata(path.read_bytes(), str(path))
            with Image.open(path) as image:
                size = f"{image.width}px" if image.width == image.height else f"{image.width}x{image.height}px"
        except (BigbatchError, OSError, ValueError):
            meta = None
        if meta is None:
            bare.append(path.name)
            continue
        kinds[str(meta.get("face_type", "full_face"))] += 1  # (DFLJPG.get_face_type's default)
        sizes[size] += 1
        labelled += bool(meta.get("seg_ie_polys"))
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
    try:
        first = json.loads((folder / JOURNAL).read_text().splitlines()[0])
        source = f"extracted from {first['source']['path']} by bigbatch extract"
        lines.append(f"source      {source} ({', '.join(f'{k} {v}' for k, v in first['settings'].items())})")
    except (OSError, ValueError, IndexError, KeyError, TypeError, AttributeError):
        pass
    return "\n".join(lines)
