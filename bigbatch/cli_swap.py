"""The swap task's own commands: `bigbatch export-dfl` (a run's model as a DeepFaceLab model folder)
and `bigbatch swap` (aligned dst faces swapped to src). `bigbatch convert` reads DFL folders too; it
lives in cli.py with the GAN's converter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bigbatch.cli_tools import device_named
from bigbatch.errors import BigbatchError


def _export_dfl(args: argparse.Namespace) -> None:
    from bigbatch.checkpoint_find import find_checkpoint
    from bigbatch.config import Config
    from bigbatch.faces import xseg
    from bigbatch.tasks.swap.files import export_dfl

    ckpt = find_checkpoint(args.run) if xseg.is_run(args.run) else None
    if ckpt is not None and (ckpt / "config.toml").is_file() and Config.load(ckpt / "config.toml").task == "xseg":
        if args.name is not None:
            raise BigbatchError("DFL's XSeg model has no name (its files: XSeg_256.npy, XSeg_data.dat): drop --name")
        out = xseg.export_dfl(ckpt, args.out, args.overwrite, args.face_type)
        print(f"Wrote DeepFaceLab XSeg model to {out}: DFL's XSeg trainer, apply and merger read it from there")
        return
    name = "new" if args.name is None else args.name
    out = export_dfl(args.run, args.out, name, args.face_type, args.overwrite)
    print(f"Wrote DeepFaceLab model {name}_SAEHD to {out}: put it in DFL's model folder and merge with it")


def _swap(args: argparse.Namespace) -> None:
    from bigbatch.tasks.swap.files import swap_folder

    device = device_named(args.device)
    n = swap_folder(args.run, args.in_dir, args.out_dir, device, args.batch, args.color_transfer)
    print(f"Swapped {n} faces into {args.out_dir} (masks in {Path(args.out_dir) / 'masks'})")


def add_swap_commands(sub: Any) -> None:
    """Add export-dfl and swap to the CLI's subcommands."""
    ex = sub.add_parser(
        "export-dfl", help="write a swap run's model as a DeepFaceLab SAEHD model folder (an xseg run's: XSeg's)"
    )
    ex.add_argument("run", metavar="RUN", help="swap or xseg run directory, or checkpoint folder")
    ex.add_argument(
        "out", metavar="OUT_DIR", help="folder to write <name>_SAEHD_*.npy and _data.dat into (XSeg_256.npy and its)"
    )
    ex.add_argument("--name", help="DFL's model name (default: new; an XSeg model has none)")
    ex.add_argument(
        "--face-type",
        choices=("h", "mf", "f", "wf", "head"),
        help="DFL's face type of the faces, where the run does not know it (DFL's merger crops by it)",
    )
    ex.add_argument("--overwrite", action="store_true", help="replace a model of the same name in OUT_DIR")
    ex.set_defaults(func=_export_dfl)

    sw = sub.add_parser("swap", help="swap a folder of aligned dst faces to src with a trained swap model")
    sw.add_argument("run", metavar="RUN", help="swap run directory, checkpoint folder or DFL SAEHD model folder")
    sw.add_argument("in_dir", metavar="IN_DIR", help="aligned face images (face detection and alignment: DFL's)")
    sw.add_argument("out_dir", metavar="OUT_DIR", help="where the swapped faces and their masks go")
    sw.add_argument("--batch", type=int, default=8, help="faces per forward")
    sw.add_argument("--device", default="auto", help="auto (CUDA if there is one), cpu or cuda")
    sw.add_argument(
        "--color-transfer",
        metavar="MODE",
        help="recolour each swap like its dst face, as DFL's merger: rct, lct, mkl, mkl-m, idt, idt-m, sot-m or none",
    )
    sw.set_defaults(func=_swap)
