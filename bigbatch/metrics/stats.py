"""Reference statistics of a data set or image set (feature mean, covariance and the features themselves,
for KID), computed once and cached under BIGBATCH_CACHE/stats/, keyed by a hash of the data, the
extractor (weights and input pipeline) and the options; and statistics files given by the user."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch

from bigbatch.engine import dist
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write, json_loads, lock_folder, unlock_folder
from bigbatch.metrics.cache import data_digest
from bigbatch.metrics.features import Extractor, drop_kept, extract_sharded, kept_file, moments_sharded
from bigbatch.metrics.fid import covariance_fault, feature_stats
from bigbatch.metrics.image_sets import any_size, read_images
from bigbatch.signals import check_stop
from bigbatch.user_cache import cache_dir

STATS_VERSION = "1"


@dataclass
class ReferenceStats:
    """A data set's features under one extractor: mu (D,) and sigma (D, D) in float64, and the (N, D)
    float32 features themselves (what KID compares against)."""

    mu: np.ndarray
    sigma: np.ndarray
    features: np.ndarray
    key: str
    meta: dict

    @property
    def n(self) -> int:
        """Images the statistics were computed from."""
        return int(self.meta.get("n", self.features.shape[0]))

    @property
    def has_features(self) -> bool:
        """False for FID-only statistics (mu and sigma, no per-image features for KID)."""
        return self.features.shape[0] > 0


def stats_file(key: str, folder: str | Path | None = None) -> Path:
    """Where reference statistics of `key` are cached: $BIGBATCH_CACHE/stats/<key>.safetensors (or in `folder`)."""
    return (Path(folder) if folder is not None else cache_dir() / "stats") / f"{key}.safetensors"


def stats_key(data_hash: str, extractor: Extractor, n: int, subset_seed: int | None, features: bool = True) -> str:
    """The cache key: what decides the statistics, and nothing else (not the batch size: results do not
    depend on it)."""
    parts = {"version": STATS_VERSION, "data": data_hash, "extractor": extractor.digest, "n": n, "seed": subset_seed}
    if not features:
        parts["features"] = False  # FID-only statistics, computed by streaming sums
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def subset_indices(size: int, n: int | None, seed: int) -> torch.Tensor:
    """All images in order, or a seeded random subset of n of them (sorted, for sequential reads)."""
    if n is None or n >= size:
        return torch.arange(size)
    if n < 2:
        raise BigbatchError(f"reference statistics need at least 2 images, got n={n}")
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=g)[:n].sort().values


def compute_stats(
    data: object, extractor: Extractor, index: torch.Tensor, batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mu, sigma and features of data[index], extraction split across ranks."""
    feats = extract_sharded(any_size(extractor), len(index), _reader(data, index), batch_size)["pool"]
    mu, sigma = feature_stats(feats)
    return mu, sigma, feats.numpy().astype(np.float32)


def _reader(data: object, index: torch.Tensor):
    """images_at(start, count) of data[index] (images of several sizes come as a list)."""
    return lambda start, count: read_images(data, index[start : start + count])


def _checked_against(data: object, cached: Path) -> Path:
    """`cached`, the statistics of `data`'s content hash, once the data file is known to still hold that content:
    a file edited in place keeps the hash prepare wrote, so one changed since the statistics were last checked
    against it has its content hash recomputed first (a BigbatchError if it differs), and the check is noted."""
    where = getattr(data, "location", None)
    if where is None or where.url or not hasattr(data, "verify"):
        return cached
    if where.path.stat().st_mtime_ns > cached.stat().st_mtime_ns:
        data.verify()
        with contextlib.suppress(OSError):  # (a cache this user may read, not write: checked again next time)
            os.utime(cached)
    return cached


def reference_stats(
    data: object,
    extractor: Extractor,
    n: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    cache: bool = True,
    folder: str | Path | None = None,
    features: bool = True,
) -> ReferenceStats:
    """The reference statistics of `data` (all images, or a seeded subset of n) under `extractor`,
    from the cache when computed before. `folder` overrides the cache folder. A process (of a run in one process)
    after statistics that another is computing into the cache (a sweep's trials, runs started together) waits for
    them, then reads them.

    features=False (enough for FID) keeps no per-image features: mu and sigma come from sums
    reduced across ranks, so a million-image data set costs a D x D matrix, not an (N, D) one; cached
    statistics with features are used (and their features dropped) when present."""
    if len(data) < 2:
        raise BigbatchError(f"reference statistics need at least 2 images; the data set has {len(data)}")
    index = subset_indices(len(data), n, seed)
    subset_seed = seed if len(index) < len(data) else None
    digest = data_digest(data)
    full = stats_file(stats_key(digest, extractor, len(index), subset_seed), folder)
    key = stats_key(digest, extractor, len(index), subset_seed, features)
    path = stats_file(key, folder)
    if not cache:
        return _computed(data, extractor, index, subset_seed, batch_size, features, key, None)
    found = _cached(data, full, path, features)
    if found is not None:
        return found
    # One process: the lock, waited for while another computes them. Several ranks compute as they did: the others
    # would wait in a collective meanwhile, which times out (NCCL's watchdog: 10 minutes) before Inception is done.
    lock = _computing_alone(path) if not dist.active() else None
    try:
        found = _cached(data, full, path, features)  # (made meanwhile by the process waited for)
        if found is not None:
            return found
        return _computed(data, extractor, index, subset_seed, batch_size, features, key, path)
    finally:
        unlock_folder(lock, remove=True)


def _cached(data: object, full: Path, path: Path, features: bool) -> ReferenceStats | None:
    """The statistics in the cache (`full`: with features, used for either; `path`: those asked for), or None.
    Every rank must take the same branch: computing is collective (extraction is split across ranks)."""
    if dist.agree(full.is_file()):
        return load_stats(_checked_against(data, full), features)
    if not features and dist.agree(path.is_file()):
        if not dist.active() or dist.context().is_main:  # (sums another process kept when it was stopped after these
            drop_kept(path)  # were saved: found from outside, left in the cache for good, 33 MB each)
        return load_stats(_checked_against(data, path))
    return None


def _computing_alone(path: Path) -> IO | None:
    """The lock on computing the statistics `path` caches, once another process computing them has let it go
    (said once while waited for; a stop asked for meanwhile ends the wait as it ends the statistics)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    said: list[str] = []

    def waiting(holder: str) -> None:
        if not said:
            said.append(holder)
            print(f"waiting for {holder}, which computes the same reference statistics", file=sys.stderr, flush=True)
        check_stop()

    try:
        return lock_folder(path.parent, f".{path.stem}.lock", lambda *_: "", waiting)
    except BigbatchError:  # (another user's lock file in a shared cache, found by review: computed as before)
        return None


def _computed(
    data: object,
    extractor: Extractor,
    index: torch.Tensor,
    subset_seed: int | None,
    batch_size: int,
    features: bool,
    key: str,
    path: Path | None,
) -> ReferenceStats:
    """The statistics computed, and saved at `path` (None: not cached)."""
    if not dist.active() or dist.context().is_main:  # (minutes for Inception on a CPU: say what it does)
        where = f"; cached in {path.parent}" if path is not None else ""
        source = getattr(data, "source", "") or "the reference images"
        print(
            f"computing reference statistics of {len(index)} images of {source} with {extractor.name} (once{where})",
            file=sys.stderr,
            flush=True,
        )
    if features:
        mu, sigma, feats = compute_stats(data, extractor, index, batch_size)
    else:
        # (the sums under way kept beside it: a stopped start goes on from there)
        mu, sigma = moments_sharded(any_size(extractor), len(index), _reader(data, index), batch_size, path)
        feats = np.zeros((0, mu.shape[0]), np.float32)
    meta = {
        "source": str(getattr(data, "source", "")),
        "resolution": int(getattr(data, "resolution", 0) or 0),  # (what images were: an eval of others is warned of)
        "extractor": extractor.name,
        "family": extractor.family,
        "extractor_digest": extractor.digest,
        "n": len(index),
        "subset_seed": subset_seed,
        "version": STATS_VERSION,
    }
    stats = ReferenceStats(mu, sigma, feats, key, meta)
    if path is not None and (not dist.active() or dist.context().is_main):
        save_stats(stats, path)
    if path is not None and not features:
        kept_file(path).unlink(missing_ok=True)  # (each rank its own, once the statistics are saved)
        if not dist.active() or dist.context().is_main:
            drop_kept(path)  # (and those of another world size)
    return stats


def save_stats(stats: ReferenceStats, path: str | Path) -> Path:
    """Write statistics as safetensors (no pickle), atomically."""
    from safetensors.torch import save

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "mu": torch.from_numpy(np.ascontiguousarray(stats.mu, np.float64)),
        "sigma": torch.from_numpy(np.ascontiguousarray(stats.sigma, np.float64)),
        "features": torch.from_numpy(np.ascontiguousarray(stats.features, np.float32)),
    }
    atomic_write(path, save(tensors, metadata={"key": stats.key, "meta": json.dumps(stats.meta)}))
    return path


def load_stats(path: str | Path, features: bool = True) -> ReferenceStats:
    """Read statistics saved by `save_stats`; features=False reads only mu and sigma (a file with
    features of a million images is read in a fraction of the time and memory)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in ("mu", "sigma")}
            t["features"] = f.get_tensor("features") if features else torch.zeros(0, t["mu"].shape[0])
        info = json_loads(meta["meta"])
        if not (torch.isfinite(t["mu"]).all() and torch.isfinite(t["sigma"]).all()):  # (found by review: read as
            raise ValueError("it holds NaN or infinity in its mu or sigma")  # numbers, and blamed on the images)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
        cached = path.resolve().parent == (cache_dir() / "stats").resolve()  # (a user's own file is not deleted)
        fix = "delete it to recompute" if cached else "compute it again with `bigbatch stats`"
        raise BigbatchError(f"cannot read reference statistics {path} ({e}); {fix}") from None
    return ReferenceStats(t["mu"].numpy(), t["sigma"].numpy(), t["features"].numpy(), meta.get("key", ""), info)


def holds_stats(path: str | Path) -> bool:
    """True for a file `read_stats` reads: a .safetensors, or an .npz with a "mu" or "sigma" array."""
    path = Path(path)
    if path.suffix.lower() == ".safetensors":  # (not a model's weights: those hold no mu)
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return "mu" in f.keys()
        except Exception:  # noqa: BLE001 - not a readable .safetensors: not statistics
            return False
    if path.suffix.lower() != ".npz" or not path.is_file():
        return False
    try:
        with np.load(path, allow_pickle=False) as z:
            return bool({"mu", "sigma"} & set(z.files))
    except Exception:  # noqa: BLE001 - not a readable .npz: not statistics (reading it as images says why)
        return False


def read_stats(path: str | Path) -> ReferenceStats:
    """Statistics from a file the user names: bigbatch's own (.safetensors, as `bigbatch stats` caches
    them, with every image's features when made for KID) or an .npz holding "mu" and "sigma" (pytorch-fid's
    --save-stats, clean-fid's, BigGAN-PyTorch's inception moments), which has no features. Never unpickles."""
    path = Path(path)
    if not path.is_file():
        raise BigbatchError(f"statistics file {path} does not exist")
    if path.suffix.lower() == ".safetensors":
        stats = load_stats(path)
    else:
        try:
            with np.load(path, allow_pickle=False) as z:
                missing = [k for k in ("mu", "sigma") if k not in z]
                if missing:
                    found = ", ".join(z.files) or "nothing"
                    raise BigbatchError(
                        f"statistics file {path} has no {' or '.join(missing)} (found {found}); "
                        "FID statistics need both the mean 'mu' (D,) and the covariance 'sigma' (D, D): "
                        "np.savez(path, mu=mu, sigma=sigma)"
                    )
                mu, sigma = z["mu"], z["sigma"]
                if not (mu.dtype.kind == sigma.dtype.kind == "f"):  # (found from outside: integers were rounded ones)
                    raise BigbatchError(
                        f"statistics file {path} holds mu of {mu.dtype} and sigma of {sigma.dtype}; FID statistics are "
                        "floating point (float32 or float64): write them as computed"
                    )
                mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
        except BigbatchError:
            raise
        except Exception as e:  # noqa: BLE001 - numpy raises many types for a bad file; all mean the same
            raise BigbatchError(f"cannot read statistics file {path} ({type(e).__name__}: {e})") from None
        if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
            raise BigbatchError(
                f"statistics file {path} holds mu {mu.shape} and sigma {sigma.shape}; need mu (D,) and sigma (D, D)"
            )
        if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):  # (found from outside: blamed on the images)
            raise BigbatchError(f"statistics file {path} holds NaN or infinity in its mu or sigma; compute it again")
        stats = ReferenceStats(mu, sigma, np.zeros((0, mu.shape[0]), np.float32), "", {"source": str(path)})
    fault = covariance_fault(np.asarray(stats.sigma, np.float64))  # (found from outside: -I scored a negative FID)
    if fault:
        raise BigbatchError(f"statistics file {path}: {fault}, as no covariance is; compute it again")
    stats.meta["file"] = str(path)
    return stats
