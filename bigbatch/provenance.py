"""Which bigbatch wrote a checkpoint: its version and a digest of its sources (the version alone names no change
made between releases), recorded in each checkpoint's meta.json and said where a run resumes under other code (found
from outside: a run resumed after an upgrade that changed SAEHD's warp trained on unsaid, where the README promises
the bits of the run left alone)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """This bigbatch: "VERSION+DIGEST", the digest of its package's sources."""
    from bigbatch import __version__

    return f"{__version__}+{sources_digest(Path(__file__).parent)}"


def sources_digest(root: Path) -> str:
    """12 hex digits of a sha256 over the Python files under `root` (their paths and bytes)."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root).as_posix()}\0".encode() + f.read_bytes())
    return h.hexdigest()[:12]
