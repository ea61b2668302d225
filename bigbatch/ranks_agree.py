"""What every rank of a run must agree on as it starts: the code (bigbatch's and torch's), the config (but where
each reads its data), the images, and the run folder rank 0 writes."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bigbatch.config import Config
from bigbatch.engine import dist
from bigbatch.errors import BigbatchError
from bigbatch.provenance import code_version
from bigbatch.resuming import flatten

# What may differ between ranks: where each reads the data (another mount on another node), how it reads it.
PER_RANK = ("data.path", "data.dst_path", "data.val_path", "data.storage_options", "data.workers", "data.in_ram")
PER_RANK += ("train.init_from", "eval.weights")  # (files each node may hold at a path of its own)
SEEN_WITHIN, SEEN_EVERY = 90.0, 5.0  # seconds a rank is given to see the run folder rank 0 writes, and between looks


def same_on_every_rank(cfg: Config, content_hash: str, lock: Path) -> None:
    """Every rank trains the config and the images rank 0 does (found from outside: a rank started with
    data.xflip=true trained beside rank 0 silently, and config.toml did not describe the run), and sees the run
    folder rank 0 writes, its `lock` as rank 0 wrote it (found from outside: a run folder on a disk of rank 0's
    node alone trained to its end, to be refused on resume, which reads it on every rank)."""
    if not dist.active():
        return
    mine = {k: v for k, v in flatten(cfg.to_dict()).items() if k not in PER_RANK and k != "train.device"}
    code = f"bigbatch {code_version()}, torch {torch.__version__}"
    ranks = dist.gather((mine, content_hash, code))
    first, images, codes = ranks[0]
    for rank, (theirs, their_images, their_code) in enumerate(ranks[1:], 1):
        if their_code != codes:  # (found from outside: a node's other install trained beside rank 0's, unsaid)
            raise BigbatchError(
                f"rank {rank} runs {their_code}, rank 0 {codes}: install the same bigbatch and torch on every node"
            )
        differ = sorted(k for k in first.keys() | theirs.keys() if first.get(k) != theirs.get(k))
        if differ:
            k = differ[0]
            raise BigbatchError(
                f"rank {rank}'s config differs from rank 0's in {k} ({theirs.get(k)!r}, rank 0: {first.get(k)!r})"
                f"{f' and {len(differ) - 1} more' if len(differ) > 1 else ''}: start every rank with the same command"
            )
        if their_images != images:
            raise BigbatchError(
                f"rank {rank}'s data.path holds other images than rank 0's (content hash {their_images[:16]}…, rank "
                f"0: {images[:16]}…): every rank must read the same data file"
            )
    _sees_run_folder(lock)


def _sees_run_folder(lock: Path) -> None:
    """Every rank reads rank 0's `lock` as rank 0 wrote it, asked again for up to SEEN_WITHIN seconds: a network
    file system's client may show another node's new files and writes only once its caches expire (NFS: 30-60 s)."""
    waited = 0.0
    while True:
        try:
            seen = lock.read_text()
        except OSError:
            seen = None
        views = dist.gather(seen)
        blind = [rank for rank, view in enumerate(views) if view != views[0]]
        if not blind:
            return
        if waited >= SEEN_WITHIN:
            raise BigbatchError(
                f"rank {blind[0]} does not see the run folder {lock.parent} as rank 0 writes it (after {waited:.0f} "
                "s): put the run folder on storage every rank sees (a shared file system), which a resume reads on "
                "every rank"
            )
        time.sleep(SEEN_EVERY)
        waited += SEEN_EVERY
