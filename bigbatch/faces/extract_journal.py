"""bigbatch extract's journal, OUT/.extract.jsonl: the settings and source of the extract into OUT, then a line a
frame as it is done, so that a killed extract goes on where it stopped, and `merge` knows the faces' frames."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bigbatch.data.dfl_faces import read_metadata
from bigbatch.errors import BigbatchError, counted_names
from bigbatch.faces.video import IMAGE_SUFFIXES
from bigbatch.files import atomic_write, json_loads

JOURNAL = ".extract.jsonl"


def journal_head(aligned: Path) -> dict:
    """The first line of ALIGNED's journal: the extract's settings and source ({} where there is none to read)."""
    try:
        first = json_loads((aligned / JOURNAL).read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return first if isinstance(first, dict) else {}


def read_otherwise(aligned: Path, source: Any) -> str | None:
    """How `source` (an extract FrameSource, a video) is read now where the faces in `aligned` were extracted from it
    by an older bigbatch that read it otherwise (sideways, or retimed: see Video.reading), as its journal says; else
    None."""
    if not (first := journal_head(aligned)):
        return None
    return _reading_changed(first.get("source") or {}, source.identity())


def _reading_changed(was: dict, now: dict) -> str | None:
    """How the frames of the video a journal's source `was` names are read now where an older bigbatch read them
    otherwise (the source as `identity` gives it `now`), else None."""
    return now["frames"] if "frames" in now and "frames" not in was and was.get("path") == now["path"] else None


def same_source(was: dict, now: dict) -> bool:
    """Whether the source a journal or record names (`was`) is the one given now (`now`, FrameSource.identity's):
    a video by its bytes and how they are read, wherever it is and whatever its time (found from outside: a video
    touched, or a workspace copied, refused its own faces); an older record's without a checksum by path, size and
    time; frames' folders and globs by path."""
    if "checksum" in was:
        return all(was.get(k) == now.get(k) for k in ("checksum", "size", "frames"))
    return was == {k: v for k, v in now.items() if k != "checksum"}


def read_journal(out: Path, settings: dict, source: Any) -> dict[str, int | None]:
    """The frames a killed extract into `out` finished ({name: faces}), after checking it used `settings` (as a
    dict) and `source`. A frame whose image changed since (its size or time) is not done: its faces written before are
    removed, and it runs again. Faces deleted by hand (DFL's cleanup of bad ones) stay deleted."""
    path = out / JOURNAL
    images = (p.name for p in out.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not path.exists():
        # (found from outside: DFL's aligned folder or hand-fixed faces, without a journal, were replaced unsaid)
        if others := sorted(images):
            raise BigbatchError(
                f"OUT {out} holds {counted_names(others, 'image')} no extract recorded: give an empty or new folder"
            )
        atomic_write(path, json.dumps({"settings": settings, "source": source.identity()}) + "\n")
        return {}
    lines = path.read_text().splitlines()
    first = json_loads(lines[0]) if lines else {}
    rows: dict[str, dict] = {}
    for line in lines[1:]:
        try:
            row = json_loads(line)
        except json.JSONDecodeError:  # the line a kill cut short: that frame runs again
            continue
        rows[row["frame"]] = row
    changed = first.get("settings") != settings or not same_source(first.get("source") or {}, source.identity())
    if changed and not any(images) and not any(row.get("faces") for row in rows.values()):
        # An extract that wrote no face (it failed, or found none) into a folder that holds none: this one starts
        # it afresh (found from outside: its journal refused every other source or setting, "holding faces"; one
        # that wrote faces since deleted by hand keeps its refusal, and the faces stay deleted).
        path.unlink()
        return read_journal(out, settings, source)
    if first.get("settings") != settings:
        was = first.get("settings", {})
        raise BigbatchError(
            f"{out} holds faces extracted with other settings ({', '.join(f'{k} {v}' for k, v in was.items())}): "
            "give the same ones to continue, or another OUT"
        )
    was, now = first.get("source"), source.identity()
    if was is None or (was != now and same_source(was, now)):  # (an older journal without a source: taken to be
        lines[0] = json.dumps({**first, "source": now})  # this one's; the same video moved or touched: now's)
        atomic_write(path, "".join(f"{line}\n" for line in lines))
        was = now
    if _reading_changed(was, now):
        raise BigbatchError(  # (found by review: an older bigbatch read a phone's video sideways, or retimed)
            f"{out} holds faces an older bigbatch extracted from {now['path']}, reading its frames otherwise than "
            f"now ({now['frames']}: their places would not be these frames'): extract into another OUT"
        )
    if was != now and was.get("path") == now["path"]:
        raise BigbatchError(
            f"{out} holds faces extracted from an earlier version of {now['path']} "
            f"({'its bytes differ' if 'checksum' in was else 'its size or time differs'}): give another OUT (or empty "
            f"{out}, {path.name} too, to extract every frame again)"
        )
    if was != now:
        raise BigbatchError(
            f"{out} holds faces extracted from {was.get('path')}: give that source to continue, or another OUT"
        )
    names = set(source.names() or ())
    done, again = {}, set()
    for name, row in rows.items():
        if name not in names and names:
            continue  # (a frame SRC no longer holds: not counted)
        if "file" not in row or (source.stat(name) if name in names else None) == row["file"]:  # (older rows: trusted)
            done[name] = row["faces"]
        elif row["faces"]:
            again.add(name)
    for face in faces_from(out, again):  # (a frame with fewer faces now would leave its last ones behind)
        face.unlink(missing_ok=True)
    return done


def faces_from(out: Path, frames: set[str]) -> list[Path]:
    """The aligned faces in `out` extracted from `frames`, known by their metadata's frame name, not by their file
    names (found by review: those `bigbatch sort` had renamed stayed beside the frame's new faces)."""
    if not frames:
        return []
    found = []
    for path in out.glob("*.jpg"):
        try:
            meta = read_metadata(path.read_bytes(), str(path))
        except (BigbatchError, ValueError, OSError):  # (not a face extract wrote: left as it is)
            continue
        if meta is not None and meta.get("source_filename") in frames:
            found.append(path)
    return found
