"""The names a face set's faces had before `bigbatch sort` first renamed them (00000.jpg on), kept beside them in
FOLDER/.bigbatch-names.json: `oneface` tells the faces of two videos put together apart by them (a_00001_0.jpg,
b_00001_0.jpg), `--by restore-names` gives them back (DFL's util "recover original filename"), and what a sort
moves to the trash goes there under them.

Each entry holds a face's identity in its own metadata (its frame and its rectangle there: what a rename keeps),
the name a sort gave it and its first name. A face is found by its identity, by its name among faces of one
identity (the same frame's name and rectangle in two videos, a face copied in twice), so a sort killed between its
renames, a face renamed or moved by hand, and the record written before the renames it describes all find each
face's own. Written whole
(temporary file and rename) before a sort renames anything; entries of faces no longer in the folder are kept."""

from __future__ import annotations

import collections
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write

NAMES = ".bigbatch-names.json"
STAGED = ".sort-"  # a sort's temporary names, .sort-PID-INDEX.jpg: INDEX the 00000.jpg name it goes to
SUFFIXES = (".jpg", ".jpeg")
Entry = tuple[str, str, str]  # (identity, the name a sort gave, the first name)


def identity(meta: dict) -> str:
    """What marks a face in its own metadata, which a rename keeps: its frame and its rectangle there (as given:
    metadata of any shape, a hostile file's too)."""
    rect = meta.get("source_rect")
    return json.dumps(
        [str(meta.get("source_filename", "")), rect],
        default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v),
    )


def plain_name(name: Any) -> bool:
    """A face file's name a sort may rename a face to: a JPEG's, in the folder itself, no hidden or temporary one,
    no control characters, at most 255 bytes (found by review: a record's name was checked only once renaming)."""
    return (
        isinstance(name, str)
        and name.lower().endswith(SUFFIXES)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and name.isprintable()
        and len(name.encode("utf-8", "replace")) <= 255
    )


def numbered(name: str) -> Iterator[str]:
    """`name`, then `stem.1.suffix`, `stem.2.suffix`, ...: the names a file takes where one before it is taken."""
    path = Path(name)
    yield name
    yield from (f"{path.stem}.{n}{path.suffix}" for n in itertools.count(1))


def read_record(folder: Path) -> list[Entry]:
    """The folder's record ([] where it has none); one that is not sort's is refused before anything is renamed
    (found by review: dropped silently, every first name lost with it)."""
    path = folder / NAMES
    if not path.exists() and not path.is_symlink():
        return []
    fix = "move it away (the faces keep their names, their first names are lost) and sort again"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BigbatchError(f"{path} is not sort's record of the faces' first names ({e}): {fix}") from None
    faces = record.get("faces") if isinstance(record, dict) else None
    if not isinstance(faces, list) or not all(
        isinstance(e, list) and len(e) == 3 and all(isinstance(v, str) for v in e) for e in faces
    ):
        raise BigbatchError(f"{path} is not sort's record of the faces' first names (no list of faces): {fix}")
    return [(e[0], e[1], e[2]) for e in faces]


def first_names(record: list[Entry], faces: list[tuple[Path, dict]]) -> list[str]:
    """Each face's first name by the record (see the module), else its own."""
    by_identity: dict[str, list[tuple[str, str]]] = {}
    for key, name, first in record:
        by_identity.setdefault(key, []).append((name, first))
    keys = [identity(meta) for _, meta in faces]
    alike = collections.Counter(keys)
    firsts = []
    for (path, _), key in zip(faces, keys):
        held = by_identity.get(key, [])
        named = [first for name, first in held if name == path.name]
        # (by its identity alone where one face here and one entry hold it; else by its name too: a face copied in)
        first = named[0] if named else held[0][1] if len(held) == 1 and alike[key] == 1 else None
        firsts.append(first if plain_name(first) else path.name)
    return firsts


def write_record(folder: Path, record: list[Entry], faces: list[tuple[dict, str, str]]) -> None:
    """The record of `faces` (metadata, the name a sort gives, the first name), with `record`'s entries of faces no
    longer here, written whole."""
    here = {identity(meta) for meta, _, _ in faces}
    entries = [list(e) for e in record if e[0] not in here] + [[identity(m), n, f] for m, n, f in faces]
    atomic_write(folder / NAMES, json.dumps({"faces": entries}, indent=0))


def renamed(folder: Path, moves: list[tuple[Path, str]]) -> None:
    """Each path renamed to its name in `folder`, through temporary names (a name may be another's): STAGED, the
    index of the move, which `recover` finishes should the process be killed."""
    staged = []
    for i, (path, _) in enumerate(moves):
        tmp = folder / f"{STAGED}{os.getpid()}-{i:05d}{path.suffix.lower()}"
        os.replace(path, tmp)
        staged.append(tmp)
    for tmp, (_, name) in zip(staged, moves):
        os.replace(tmp, folder / name)


def recover(folder: Path) -> None:
    """Faces a killed sort left under their temporary names get the numbered name they were going to where it is
    free, else names of their own after the others (the record finds each face's first name either way)."""
    left = sorted(folder.glob(f"{STAGED}*"), key=lambda p: p.name)
    taken = {p.name for p in folder.iterdir()}
    n = 0
    for path in left:
        index = path.stem.rpartition("-")[2]
        to = f"{index}{path.suffix}" if index.isdecimal() and len(index) == 5 else None
        if to is None or to in taken:
            while f"sorted_{n:05d}{path.suffix}" in taken:
                n += 1
            to = f"sorted_{n:05d}{path.suffix}"
        os.replace(path, folder / to)
        taken.add(to)
