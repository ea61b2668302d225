"""The digest that names the sources a GPU table measured (bench/_gpu_report.py's line, `python bench/gpu.py
--digest`): light to import, so that a checkout prints its own without loading torch."""

from __future__ import annotations

import hashlib
from pathlib import Path

import bigbatch
from bigbatch.provenance import sources_digest


def source_digest() -> str:
    """12 hex digits of a sha256 over bigbatch's and bench/'s Python files (paths and bytes): it names the
    code a table measured where git cannot (a GPU machine's copy of the tree carried stale git metadata)."""
    both = "".join(sources_digest(root) for root in (Path(bigbatch.__file__).parent, Path(__file__).parent))
    return hashlib.sha256(both.encode()).hexdigest()[:12]
