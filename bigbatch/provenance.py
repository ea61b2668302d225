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
    """This bigbatch: "VERSION+DIGEST", 12 hex digits of a sha256 over its Python files (paths and bytes)."""
    from bigbatch import __version__

    root, h = Path(__file__).parent, hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root).as_posix()}\0".encode() + f.read_bytes())
    return f"{__version__}+{h.hexdigest()[:12]}"
