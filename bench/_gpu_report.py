"""bench/gpu.py's report: the table of its parts' rows, the digest of the sources it measured, and the
section appended to bench/RESULTS.md."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import bigbatch
from bigbatch.engine.memory import format_bytes
from bigbatch.files import atomic_write


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else format_bytes(value) if fmt == "bytes" else format(value, fmt)


def table(rows: dict[str, dict]) -> str:
    lines = [
        "| part | setting | micro × accumulation | img/s | s/iteration | peak memory | part s | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        note = f"**{r['error']}**" if "error" in r else r.get("note", "")
        cells = [name, r.get("setting", "-"), r.get("plan", "-"), cell(r, "img_per_s", ".1f")]
        cells += [cell(r, "s_per_iter", ".3f"), cell(r, "peak", "bytes"), cell(r, "seconds", ".0f"), note]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def source_digest() -> str:
    """12 hex digits of a sha256 over bigbatch's and bench/'s Python files (paths and bytes): it names the
    code a table measured where git cannot (a GPU machine's copy of the tree carried stale git metadata)."""
    h = hashlib.sha256()
    for root in (Path(bigbatch.__file__).parent, Path(__file__).parent):
        for f in sorted(root.rglob("*.py")):
            h.update(f"{root.name}/{f.relative_to(root).as_posix()}\0".encode() + f.read_bytes())
    return h.hexdigest()[:12]


def append_section(path: Path, text: str) -> None:
    """Append `text` to `path` (created if missing) by writing the whole through a temporary file beside it
    and a rename (bigbatch.files.atomic_write): a reader never sees half a table, and what the file holds
    now is kept, its permissions too."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write(path, old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    os.chmod(path, mode)
