"""The data set digest that keys what metrics compute once and keep in the user's cache (reference
statistics, trained classifiers: bigbatch.user_cache)."""

from __future__ import annotations

import hashlib

import torch

_HASH_CHUNK = 1024  # images per read while hashing a data set without a content hash


def data_digest(data: object) -> str:
    """The data set's `content_hash` if it has one, else SHA-256 over its images (shape and bytes)."""
    known = getattr(data, "content_hash", None)
    if known:
        return str(known)
    h = hashlib.sha256(f"images:{len(data)}".encode())
    for start in range(0, len(data), _HASH_CHUNK):
        images, _ = data.get(torch.arange(start, min(start + _HASH_CHUNK, len(data))))
        h.update(str(tuple(images.shape[1:])).encode() + str(images.dtype).encode())
        h.update(images.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
