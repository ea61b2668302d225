"""The user's cache folder: what bigbatch makes once and keeps for later runs (Inception weights, reference
statistics, trained feature classifiers, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$BIGBATCH_CACHE, else ~/.cache/bigbatch."""
    return Path(os.environ.get("BIGBATCH_CACHE") or Path.home() / ".cache" / "bigbatch")
