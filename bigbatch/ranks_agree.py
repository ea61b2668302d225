"""What every rank of a run must agree on as it starts: the config (but where each reads its data), the images,
and the run folder rank 0 writes."""

from __future__ import annotations

from pathlib import Path

from bigbatch.config import Config
from bigbatch.engine import dist
from bigbatch.errors import BigbatchError
from bigbatch.resuming import flatten

# What may differ between ranks: where each reads the data (another mount on another node), how it reads it.
PER_RANK = ("data.path", "data.dst_path", "data.val_path", "data.storage_options", "data.workers", "data.in_ram")
PER_RANK += ("train.init_from", "eval.weights")  # (files each node may hold at a path of its own)


def same_on_every_rank(cfg: Config, content_hash: str, lock: Path) -> None:
    """Every rank trains the config and the images rank 0 does (found from outside: a rank started with
    data.xflip=true trained beside rank 0 silently, and config.toml did not describe the run), and sees the run
    folder rank 0 writes, its `lock` as rank 0 wrote it (found from outside: a run folder on a disk of rank 0's
    node alone trained to its end, to be refused on resume, which reads it on every rank)."""
    if not dist.active():
        return
    mine = {k: v for k, v in flatten(cfg.to_dict()).items() if k not in PER_RANK and k != "train.device"}
    try:
        seen = lock.read_text()
    except OSError:
        seen = None
    ranks = dist.gather((mine, content_hash, seen))
    first, images, written = ranks[0]
    for rank, (theirs, their_images, their_view) in enumerate(ranks[1:], 1):
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
        if their_view != written:
            raise BigbatchError(
                f"rank {rank} does not see the run folder {lock.parent} as rank 0 writes it: put the run folder on "
                "storage every rank sees (a shared file system), which a resume reads on every rank"
            )
