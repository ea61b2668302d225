"""A data file's metadata as text (describe_data: `bigbatch info DATA.h5`)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from bigbatch.data.hdf5 import H5Data, open_h5, read_meta, read_skipped, readable
from bigbatch.data.listing import per_class, said_left_out
from bigbatch.data.prepare_output import by_reason
from bigbatch.errors import BigbatchError, counted, printable
from bigbatch.urls import Location


def describe_data(path: str | Path | Location, storage_options: dict[str, Any] | None = None) -> str:
    """A data file's metadata as a few lines of text."""
    path = Location.of(path)
    m = read_meta(path, storage_options)
    names = m["class_names"]
    shapes = "shapes " + ", ".join(f"{g['width']}x{g['height']} ({g['count']})" for g in m["groups"])  # (W x H, as PIL)
    codec = m.get("codec", "raw")
    if m.get("crop") == "none":
        shapes = f"whole images, short side {'at most ' + str(m['resolution']) if m['resolution'] else 'as found'}"
    stored = "uint8 NHWC" if codec == "raw" else f"{codec}" + (f" q{m['quality']}" if m.get("quality") else "")
    if codec != "raw" and m.get("encoded_bytes") is not None:
        stored += f" ({m['encoded_bytes'] / max(1, m['count']) / 1024:.1f} KiB an image)"
    if codec == "jpeg" and m["count"]:
        stored += (
            "; a crop decodes only its own MCUs"
            if H5Data(path, storage_options=storage_options).crops_decode_partially()
            else "; crops decode whole images (no restart markers: prepare again to decode a crop's MCUs only)"
        )
    lines = [
        f"data        {path.name}",
        f"images      {m['count']} {stored}, {m['channels']} channels, "
        + (f"{m['resolution']}px" if m["resolution"] and m.get("crop") != "none" else shapes),
        "classes     "
        + (
            f"{len(names)}: {', '.join(map(_shown, names[:10]))}{', ...' if len(names) > 10 else ''}"
            if names
            else "none"
        ),
        *([f"per class   {per_class(names, counts)}"] if _counts(counts := m.get("class_counts"), names) else []),
        f"source      {m.get('source', '?')}",
        f"resize      {m.get('resize', '?')}",
        *([f"left out    {said_left_out(m['left_out'])}"] if m.get("left_out") else []),
        f"skipped     {counted(m.get('skipped', 0), 'file')}"
        + "".join(f"\n              {printable(name)}: {printable(why)}" for name, why in m.get("skipped_examples", []))
        + _every_skipped(path, m, storage_options),
        *(
            [f"enlarged    {counted(m['enlarged'], 'image')} smaller than the resolution, scaled up to it"]
            if m.get("enlarged")
            else []
        ),
        *(
            [f"smaller     {counted(m['below_short_side'], 'image')} below the short side, kept at their own size"]
            if m.get("below_short_side")
            else []
        ),
        f"written     {m.get('created', '?')} by bigbatch {m.get('bigbatch_version', '?')}",
        f"content     {m['content_hash']}",
    ]
    if m["channels"] > 3:  # a face set: what channels 4 and 5 hold, and DFL's face type of the faces
        xseg = {"labels": "XSeg labels (drawn in DFL's XSeg editor)", "xseg-applied": "XSeg masks applied, cut at 0.5"}
        masks = xseg.get(m.get("masks"), "face mask" + (", eyes and mouth" if m["channels"] > 4 else ""))
        lines.insert(2, f"masks       {masks}; face type {m.get('face_type') or 'unknown (not from DFL faces)'}")
    if m.get("face_yaws"):  # aligned DFL faces: their yaws, for swap.uniform_yaw
        lines.insert(2, "yaws        each face's, from its landmarks (swap.uniform_yaw)")
    return "\n".join(lines)


def _shown(name: str) -> str:
    """A class name in a comma-separated list: quoted where it holds a comma or spaces at its ends."""
    return repr(name) if "," in name or name != name.strip() or not name.isprintable() else name


def _counts(counts: Any, names: list[str]) -> bool:
    """Whether `counts` are images per class of `names` (a file written before prepare kept them has none)."""
    return isinstance(counts, list) and len(counts) == len(names) > 0 and all(type(n) is int for n in counts)


def _every_skipped(path: Location, meta: dict[str, Any], storage_options: dict[str, Any] | None) -> str:
    """Where more files were skipped than the five named: how many for each reason, and the command that lists every
    one (a file written before prepare kept them all: nothing)."""
    if meta.get("skipped", 0) <= 5 or not meta.get("skipped_listed"):
        return ""
    rows = read_skipped(path, storage_options) or []
    command = f"bigbatch info {shlex.quote(path.text)} --skipped"
    return f"\n              by reason: {by_reason(rows)}\n              every one: {command}"


def image_names(data: Any) -> list[str] | None:
    """Each image's name in the source it was prepared from (its file, a shard's member with its shard), in index
    order; None where its file keeps none (builtin data; a file prepared before names were kept). A split or a
    subset's: its own images'."""
    if isinstance(data, (str, os.PathLike, Location)):  # (found from outside: a file's path answered None, "no names")
        given = f"bigbatch.data.load_data({str(data)!r}, RESOLUTION)"
        raise BigbatchError(f"image_names takes a data set, not its path: image_names({given})")
    base, places = getattr(data, "data", None), getattr(data, "indices", None)
    if base is not None and places is not None:  # (a held-out split, bigbatch.data.split.Subset)
        names = image_names(base)
        return None if names is None else [names[int(i)] for i in places]
    if not isinstance(data, H5Data):
        return None
    with open_h5(data.location, data.storage_options) as f, readable(data.location):
        if "name_ends" not in f or f["name_ends"].shape != (len(data),):
            return None
        blob, ends = f["names"][()].tobytes(), f["name_ends"][()].tolist()
    starts = [0, *ends[:-1]]
    return [blob[a:b].decode(errors="replace") for a, b in zip(starts, ends)]  # (a name not UTF-8 on disk: shown)
