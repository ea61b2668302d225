"""What checkpoint checksums cost: seconds per GB for the hash bigbatch records (xxh3_128) next to the
usual alternatives, and for one BigGAN-128 (ch 96) checkpoint as bigbatch writes it. One table.

    python bench/checksum.py            # 1 GiB of random bytes, best of 3 per hash
    python bench/checksum.py --gib 4

Every checkpoint file is hashed once when it is written and once when it is read (resume, sample,
eval, --init-from); the figure per GB is that cost, per pass, on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import zlib
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))
from _args import positive_float  # noqa: E402
from _env import measured_on  # noqa: E402

from bigbatch.checkpoints import CHECKSUM  # noqa: E402

HASHES = {
    "xxh3_128": lambda b: xxhash.xxh3_128(b).hexdigest(),
    "crc32 (zlib)": lambda b: zlib.crc32(b),
    "sha256": lambda b: hashlib.sha256(b).hexdigest(),
    "blake2b": lambda b: hashlib.blake2b(b).hexdigest(),
}


def biggan128_checkpoint_bytes() -> int:
    """Bytes of a BigGAN-128 ch 96 checkpoint: G, D and G_ema weights plus Adam's two moments of G and D."""
    from bigbatch import models

    G, D = models.create("biggan", resolution=128, n_classes=1000, ch=96, dim_z=120)
    g, d = (sum(t.numel() for t in net.state_dict().values()) * 4 for net in (G, D))
    return 2 * g + d + 2 * (g + d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=positive_float, default=1.0, help="GiB of data to hash per run")
    args = parser.parse_args()
    print(measured_on())
    if int(args.gib * 2**30) < 1:
        parser.error(f"--gib {args.gib:g} is less than a byte: give more")
    data = os.urandom(int(args.gib * 2**30))
    ckpt = biggan128_checkpoint_bytes()
    print(f"\nChecksums, {args.gib:g} GiB in RAM, one core, best of 3 ({time.strftime('%Y-%m-%d')})\n")
    print(f"| hash | s / GB | BigGAN-128 ch96 checkpoint ({ckpt / 1e9:.2f} GB), s |")
    print("|---|---|---|")
    for name, fn in HASHES.items():
        best = min(_timed(fn, data) for _ in range(3))
        per_gb = best / (len(data) / 1e9)
        mark = " (bigbatch)" if name == CHECKSUM else ""
        print(f"| {name}{mark} | {per_gb:.3f} | {per_gb * ckpt / 1e9:.2f} |")


def _timed(fn, data: bytes) -> float:
    began = time.perf_counter()
    fn(data)
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
