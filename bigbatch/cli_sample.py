"""`bigbatch sample`: images of a GAN run's EMA generator, as a grid, an interpolation sheet or an .npz."""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any

from bigbatch.cli_tools import device_named, out_named
from bigbatch.config_types import MAX_STANDING
from bigbatch.errors import BigbatchError, warn


def _parse_classes(text: str | None, names: list[str]) -> list[int] | None:
    if text is None:
        return None
    out = []
    items = [s.strip() for s in text.split(",")]
    if "" in items:
        raise BigbatchError(f"--classes has an empty entry in '{text}': give class names or numbers, comma-separated")
    for item in items:
        if item in names:  # a name first: folders 1..10 are sorted '1', '10', '2', ..., so '1' is not number 1
            out.append(names.index(item))
        elif item.isascii() and item.isdigit():
            out.append(int(item))
            if any(n.isdigit() for n in names) and int(item) < len(names):  # (found from outside: unsaid)
                warn(f"--classes: no class is named '{item}': taken as the class of index {item}, '{names[int(item)]}'")
        else:
            raise BigbatchError(f"--classes: '{item}' is neither a class number nor a class name ({', '.join(names)})")
    bad = [c for c in out if not c < len(names)]
    if bad or not out:
        raise BigbatchError(f"--classes must list classes in 0..{len(names) - 1}, got '{text}'")
    return out


def _sample(args: argparse.Namespace) -> None:
    import numpy as np

    from bigbatch.config import MIN_TRUNCATION
    from bigbatch.files import atomic_write
    from bigbatch.sampling import (
        check_styled,
        generate,
        grid,
        interpolation_sheet,
        restyle,
        sample,
        save_png,
        standing_stats,
    )
    from bigbatch.tasks.gan.load import load_generator

    if args.interp and args.npz:
        raise BigbatchError("--interp writes a PNG sheet and --npz an array of samples: give one of them")
    if args.outdir is not None and (given := [o for o, on in (("--out", args.out), ("--npz", args.npz),
                                                              ("--interp", args.interp), ("--ncol", args.ncol))
                                              if on]):  # fmt: skip
        raise BigbatchError(f"--outdir writes a PNG an image: leave out {', '.join(given)}")
    if args.overwrite and args.outdir is None and args.out is None:
        raise BigbatchError("--overwrite replaces --out's file or an earlier draw's PNGs in --outdir: give one")
    stale = earlier_draw(args.outdir, args.overwrite)  # (refused before anything is drawn)
    mixing = args.mix_rows is not None or args.mix_cols is not None
    if mixing:
        given = [o for o, on in (("--n", args.n is not None), ("--seed", args.seed), ("--seeds", args.seeds),
                                 ("--interp", args.interp), ("--npz", args.npz), ("--ncol", args.ncol),
                                 ("--truncation", args.truncation != float("inf")),
                                 ("--standing-stats", args.standing_stats)) if on]  # fmt: skip
        if given:
            raise BigbatchError(
                f"--mix-rows and --mix-cols draw ADA's style-mixing sheet: leave out {', '.join(given)}"
            )
        if args.mix_rows is None or args.mix_cols is None:
            raise BigbatchError("style mixing takes both --mix-rows and --mix-cols (seeds, e.g. 85,100,75 and 55,821)")
        args.n = (len(args.mix_rows) + 1) * (len(args.mix_cols) + 1)  # (the sheet's images, held at once)
    if not mixing and args.styles is not None:
        raise BigbatchError(
            "--styles are the layers a style-mixing sheet takes from its columns: give --mix-rows and --mix-cols"
        )
    if args.seeds is not None:  # (found from outside: a converted ADA network could not redraw its seed 85)
        given = [o for o, on in (("--n", args.n is not None), ("--seed", args.seed), ("--interp", args.interp),
                                 ("--truncation", args.truncation != float("inf"))) if on]  # fmt: skip
        if given:
            raise BigbatchError(f"--seeds draws an image a seed, as ADA's generate.py: leave out {', '.join(given)}")
        args.n = len(args.seeds)
    if args.interp and (args.n is not None or args.ncol is not None):
        raise BigbatchError(
            "--interp draws a sheet of 4 rows of 8 steps (then 4 of classes, for a conditional G): --n and --ncol "
            "are for a grid of samples; leave them out"
        )
    args.n, args.ncol = 64 if args.n is None else args.n, 8 if args.ncol is None else args.ncol
    if args.n < 1:
        raise BigbatchError(f"--n must be at least 1, got {args.n}")
    if not args.truncation >= MIN_TRUNCATION:
        raise BigbatchError(f"--truncation must be a threshold >= {MIN_TRUNCATION}, got {args.truncation}")
    if args.ncol < 1:
        raise BigbatchError(f"--ncol must be at least 1, got {args.ncol}")
    args.ncol = min(args.ncol, args.n)  # (a row wider than the samples: found from outside, 342 GiB asked for)
    if args.out is not None:
        out_named(args.out, ".npz" if args.npz else ".png")
        if os.path.lexists(args.out) and not args.overwrite:  # (found from outside: a 50,000-image .npz replaced)
            raise BigbatchError(f"{args.out} exists: give --overwrite to replace it, or another --out")
    if not 0 <= args.standing_stats <= MAX_STANDING:
        raise BigbatchError(
            f"--standing-stats must be a number of batches, 0 to {MAX_STANDING:,}, got {args.standing_stats}"
        )
    if not math.isfinite(args.psi):
        raise BigbatchError(f"--psi must be a number (1 = off, 0.7 typical), got {args.psi}")
    device = device_named(args.device)
    G = load_generator(args.path, device)  # a run's newest checkpoint, even if the run prunes it meanwhile
    ckpt = G.checkpoint
    styled = hasattr(G, "num_ws")  # (a StyleGAN2's: its seeds and sheets draw ADA's generate.py's and
    # style_mixing.py's const noise; found from outside: --seeds drew other images than ADA's for its seeds)
    adas = mixing or args.seeds is not None
    args.noise_mode = args.noise_mode or ("const" if adas and styled else "random")
    restyle(G, args.psi, args.noise_mode, options=True)
    if not args.interp:
        _check_fits(args.n, G.config.data.resolution, mixing)
    if args.standing_stats:
        from bigbatch.engine.running_stats import has_batchnorm

        if not has_batchnorm([G]):  # (found from outside: taken silently for StyleGAN2)
            raise BigbatchError(
                f"--standing-stats re-estimates BatchNorm statistics, and {G.config.model.name}'s G has none"
            )
        standing_stats(G, args.standing_stats, seed=args.seed, truncation=args.truncation)
    if args.classes is not None and not G.n_classes:
        raise BigbatchError("--classes: this generator is unconditional")
    classes = _parse_classes(args.classes, G.class_names)
    if mixing:  # (before its classes are asked for: found from outside)
        check_styled(G)
    if (args.seeds is not None or mixing) and G.n_classes and classes is None:
        given = "--mix-rows and --mix-cols" if mixing else "--seeds"
        raise BigbatchError(f"{given} of a conditional G takes its classes from --classes (ADA's generate.py --class)")
    default_dir = ckpt.parent.parent / "samples" if ckpt.parent.name == "checkpoints" else ckpt
    # The settings that change the images, in the default name (found from outside: one sample replaced another)
    listed = hashlib.sha1(",".join(map(str, args.seeds or [])).encode()).hexdigest()[:8]  # (1,5,3 is not 1,2,3)
    seeds = f"seeds{args.seeds[0]}-{args.seeds[-1]}x{len(args.seeds)}-{listed}" if args.seeds else f"seed{args.seed}"
    if mixing:
        rows_cols = f"{args.mix_rows}/{args.mix_cols}/{args.styles}"
        seeds = f"mix{len(args.mix_rows)}x{len(args.mix_cols)}-{hashlib.sha1(rows_cols.encode()).hexdigest()[:8]}"
    named = f"{ckpt.name}-{seeds}" + "".join(
        f"-{key}{value}"
        for key, value, used in (
            ("trunc", f"{args.truncation:g}", args.truncation != float("inf")),
            ("psi", f"{args.psi:g}", args.psi != 1),
            ("noise", args.noise_mode, args.noise_mode != "random"),
            ("classes", re.sub(r"[^\w.,-]+", "_", str(args.classes)), args.classes is not None),
            ("standing", args.standing_stats, args.standing_stats),
            ("n", args.n, not (args.interp or args.npz or mixing) and args.n != 64),  # (npz names carry n anyway)
            ("ncol", args.ncol, not (args.interp or args.npz or mixing) and args.ncol != min(8, args.n)),
        )
        if used
    )

    def drawn() -> tuple[Any, Any]:
        """The images of --seeds, ADA's z, and their labels (--classes cycled)."""
        z, y = ada_latents(args.seeds)
        return generate(G, z, y), y

    def ada_latents(seeds: list[int]) -> tuple[Any, Any]:
        """ADA's z of each seed, and its label (--classes cycled; over a sheet's seeds, each its own: found from
        outside, a seed both a row and a column was drawn of two classes)."""
        import torch

        z = torch.from_numpy(np.stack([np.random.RandomState(s).randn(G.dim_z) for s in seeds])).float()
        if not G.n_classes:
            return z, None
        if not mixing:
            return z, torch.tensor([classes[i % len(classes)] for i in range(len(z))])
        place = {seed: i for i, seed in enumerate(dict.fromkeys([*args.mix_rows, *args.mix_cols]))}
        return z, torch.tensor([classes[place[s] % len(classes)] for s in seeds])

    if mixing:  # (ADA's style_mixing.py: its grid.png, and with --outdir each image, named row-column.png)
        from bigbatch.sampling import style_mixing

        (rows, row_y), (cols, col_y) = ada_latents(args.mix_rows), ada_latents(args.mix_cols)
        # ADA's 0-6, the coarse styles of its G's 14 to 18 w's; of one of fewer, its first half (found from outside:
        # 0-6 of a 16 px G's 6 were all of them, and its sheet mixed nothing)
        styles = args.styles if args.styles is not None else range(min(7, G.num_ws // 2))
        sheet = style_mixing(G, rows, cols, styles, row_y, col_y)
        out = Path(args.out or default_dir / f"mixing-{named}.png") if args.outdir is None else Path(args.outdir)
        columns = len(args.mix_cols) + 1
        for path in stale:
            path.unlink(missing_ok=True)
        save_png(grid(sheet, ncol=columns, pad=0), out if args.outdir is None else out / "grid.png")
        if args.outdir is not None:
            keys = [(c, c) for c in args.mix_cols] + [(r, c) for r in args.mix_rows for c in [r, *args.mix_cols]]
            for key, image in zip(keys, sheet[1:]):
                save_png(grid(image[None], ncol=1, pad=0), out / "{}-{}.png".format(*key))
    elif args.interp:
        out = Path(args.out or default_dir / f"interp-{named}.png")
        save_png(interpolation_sheet(G, args.seed, truncation=args.truncation, classes=classes), out)
    elif args.npz:
        images, y = drawn() if args.seeds else sample(G, args.n, args.seed, classes, args.truncation, with_labels=True)
        out = Path(args.out or default_dir / f"samples-{named}-n{args.n}.npz")
        out.parent.mkdir(parents=True, exist_ok=True)
        import io

        buf = io.BytesIO()
        # arr_0: uint8 NHWC, the layout external scorers read; y: a conditional G's labels (BigGAN-PyTorch's key)
        np.savez(buf, arr_0=images.numpy(), **({} if y is None else {"y": y.numpy()}))
        atomic_write(out, buf.getvalue())
    else:
        images, y = drawn() if args.seeds else sample(G, args.n, args.seed, classes, args.truncation, with_labels=True)
        if args.outdir is None:
            out = Path(args.out or default_dir / f"sample-{named}.png")
            save_png(grid(images, ncol=args.ncol), out)
        else:  # (ADA's generate.py --outdir: found from outside, a grid or an .npz alone)
            out = Path(args.outdir)
            # A conditional G's in a folder of each class, as StudioGAN saves them, which prepare reads as the
            # classes (found from outside: a classifier trained on them, CAS, had no way to its labels); --seeds'
            # named as ADA's generate.py names them, in the folder itself.
            folders = class_folders(G.class_names, G.n_classes) if y is not None and not args.seeds else None
            for path in stale:  # (--overwrite: the earlier draw's, once this one is made)
                path.unlink(missing_ok=True)
            for i, image in enumerate(images):
                name = f"seed{args.seeds[i]:04d}.png" if args.seeds else f"{i:05d}.png"
                folder = out if folders is None else out / folders[y[i]]
                save_png(grid(image[None], ncol=1, pad=0), folder / name)
    print(out)


# The names --outdir gives its images: in the folder (a sample's, a seed's, a mixing sheet's), in a class's folder.
DRAWN, DRAWN_IN_CLASS = re.compile(r"\d{5}\.png|seed\d{4,}\.png|grid\.png|\d+-\d+\.png"), re.compile(r"\d{5}\.png")


def earlier_draw(outdir: str | None, overwrite: bool) -> list[Path]:
    """The PNGs in --outdir (and in its class folders) of an earlier draw, which a new one would mix with (found from
    outside: a draw of 20 into a folder of 1,000 left 1,000 files, prepare reading both): refused, or with `overwrite`
    returned to be removed; PNGs of other names (a user's own) refused either way, never removed."""
    folder = Path(outdir) if outdir is not None else None
    if folder is None or not folder.is_dir():
        return []
    inside = [f for f in folder.iterdir() if f.is_dir() and not f.is_symlink()]
    pngs = sorted([*folder.glob("*.png"), *(p for f in inside for p in f.glob("*.png"))])
    theirs = [p for p in pngs if not (DRAWN if p.parent == folder else DRAWN_IN_CLASS).fullmatch(p.name)]
    if theirs:
        raise BigbatchError(
            f"--outdir {outdir} holds {len(theirs):,} PNGs of other names than a draw's ({theirs[0]}, ...), which this "
            "one would mix with: give an empty or new folder"
        )
    if pngs and not overwrite:
        raise BigbatchError(
            f"--outdir {outdir} holds {len(pngs):,} PNGs of an earlier draw, which this one would mix with: give an "
            "empty or new folder, or --overwrite to replace them"
        )
    return pngs


def class_folders(names: list[str] | None, n_classes: int) -> list[str]:
    """Each class's folder: its name (a path's separators replaced, and a leading dot, which prepare would pass over
    as hidden), else its index; two classes in one folder refused."""
    names = names or [str(c) for c in range(n_classes)]
    folders = [re.sub(r"^\.|[/\\\x00]", "_", name) or str(c) for c, name in enumerate(names)]
    if len(set(folders)) < len(folders):
        twice = next(f for f in folders if folders.count(f) > 1)
        raise BigbatchError(
            f"--outdir: two classes would share the folder {twice!r} (their names differ only in characters a folder "
            "name cannot hold): use --npz, which keeps each image's class"
        )
    return folders


def _check_fits(n: int, resolution: int, mixing: bool = False) -> None:
    """Refuse a sample count whose images (uint8 RGB, held at once) could not fit in half this machine's RAM."""
    import os

    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    per_image = 3 * resolution * resolution
    if n * per_image > ram // 2:
        most = ram // 2 // per_image
        fix = "fewer --mix-rows or --mix-cols" if mixing else "or several runs with --seed"
        raise BigbatchError(
            f"{'the sheet' if mixing else '--n'} {n} images of {resolution}px need {n * per_image / 2**30:.1f} GiB "
            f"at once, more than half of this machine's {ram / 2**30:.0f} GiB; ask for at most {most} ({fix})"
        )


def seed_list(text: str, what: str = "seeds") -> list[int]:
    """An argparse type: ADA's num_range, comma-separated seeds and ranges a-b (both ends in), seeds of 32 bits
    (what np.random.RandomState takes); `what` they are, in its messages."""
    out = []
    for item in text.split(","):
        if m := re.fullmatch(r"(\d+)-(\d+)", item.strip()):
            first, last = int(m.group(1)), int(m.group(2))
            if last < first or last - first >= 1 << 20:
                raise argparse.ArgumentTypeError(f"range {item!r} must run up, over at most 2**20 {what}")
            out += range(first, last + 1)
        elif item.strip().isascii() and item.strip().isdigit():
            out.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"must list {what} and ranges a-b, comma-separated, got {item!r}")
    if any(s >= 2**32 for s in out):
        raise argparse.ArgumentTypeError(f"{what} must be below 2**32 (np.random.RandomState's seeds)")
    return out


def seed(text: str) -> int:
    """An argparse type: a seed, a whole number >= 0 (a negative one would alias a large one) of 63 bits."""
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"must be a whole number in [0, 2**63), got {text!r}")
    return int(text)


def add_sample_command(sub: Any) -> None:
    """Add `sample` to the CLI's subcommands."""
    s = sub.add_parser("sample", help="write samples of a run's EMA generator")
    s.add_argument("path", metavar="RUN_OR_CKPT")
    s.add_argument("--n", type=int, help="number of images (default 64)")
    s.add_argument(
        "--seed", type=seed, default=0, help="the draw of z and classes (default 0): the same seed, the same images"
    )
    s.add_argument(
        "--seeds",
        type=seed_list,
        help="StyleGAN2-ADA's generate.py --seeds (e.g. 85,265,297-300): an image a seed, its z ADA's draw, "
        "np.random.RandomState(seed).randn(dim_z), and its noise ADA's (--noise-mode const), so a converted ADA "
        "network redraws its published images",
    )
    s.add_argument(
        "--classes",
        help="comma-separated classes to cycle through: names (the data's, as prepare named them) or numbers (their "
        "index in that order); a name first: of folders 10, 2 and 3, '2' is the folder named 2, of index 1 (Python's "
        "bigbatch.sample takes indices)",
    )
    s.add_argument(
        "--truncation",
        type=float,
        default=float("inf"),
        help="resample z entries beyond this magnitude (BigGAN truncation; default: off)",
    )
    s.add_argument(
        "--psi",
        type=float,
        default=1.0,
        help="StyleGAN2's truncation: each w pulled toward the average w, to this fraction of its distance "
        "(default 1: off; 0.5-0.7 typical)",
    )
    s.add_argument(
        "--noise-mode",
        choices=("random", "const", "none"),
        help="StyleGAN2's noise inputs: each image's own, drawn from its z (default), each layer's fixed noise image "
        "(ADA's generate.py and style_mixing.py default, so the default of --seeds and of a style-mixing sheet; what "
        "an exported G computes), or none",
    )
    s.add_argument(
        "--standing-stats",
        type=int,
        default=0,
        metavar="N",
        help="re-estimate G's BatchNorm statistics over N batches of 64 of its own samples first (default: "
        "use the running statistics of training)",
    )
    s.add_argument("--ncol", type=int, help="images per row of the grid (default 8)")
    s.add_argument(
        "--interp",
        action="store_true",
        help="write an interpolation sheet (z, then class), of --truncation's z and --classes' classes",
    )
    s.add_argument("--npz", action="store_true", help="write the images as arr_0 (uint8 NHWC), labels as y, of an .npz")
    s.add_argument("--out", help="output file (default: in the run's samples/, named by the settings)")
    s.add_argument(
        "--outdir",
        help="a PNG an image in this folder, as ADA's generate.py --outdir: seed0085.png of --seeds, else 00000.png; "
        "a conditional G's in a folder of each class (StudioGAN's layout, which `bigbatch prepare` reads as classes)",
    )
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out's file, or the PNGs an earlier draw left in --outdir (else refused)",
    )
    s.add_argument(
        "--mix-rows",
        type=seed_list,
        metavar="SEEDS",
        help="StyleGAN2-ADA's style_mixing.py --rows: seeds of the sheet's rows (with --mix-cols), each row's image "
        "then it with each column's w at --styles",
    )
    s.add_argument("--mix-cols", type=seed_list, metavar="SEEDS", help="style_mixing.py --cols: the columns' seeds")
    s.add_argument(
        "--styles",
        type=functools.partial(seed_list, what="layers"),
        help="style_mixing.py --styles: the layers whose w a row takes from each column (default ADA's 0-6, the "
        "coarse; of a G of fewer than 14 w's, its first half)",
    )
    s.add_argument("--device", default="auto", help="auto (CUDA if there is one, as eval's), cpu or cuda")
    s.set_defaults(func=_sample)
