"""`bigbatch …`: thin front-ends over the Python API. Usage errors print one line and exit with status 2."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path

import bigbatch
from bigbatch import cli_errors, cli_tools, signals, user_modules
from bigbatch.cli_checks import build_on_meta, check_data, check_launch_counts, check_launched, dry_resume
from bigbatch.cli_errors import one_line_warnings, os_error_line, refuse_url_paths, runtime_error_line, say_error
from bigbatch.cli_eval import DEFAULT_METRICS, EVAL_A, EVAL_B, add_scoring_options, run_eval, values
from bigbatch.cli_faces import add_face_commands
from bigbatch.cli_sample import add_sample_command, seed
from bigbatch.cli_swap import add_swap_commands
from bigbatch.cli_tools import add_tool_commands, out_named, run_info, run_stats
from bigbatch.errors import STOPPED, BigbatchError, say, silence, warn
from bigbatch.urls import endpoint_options, is_url


def _train(args: argparse.Namespace) -> None:
    # (a SIGTERM while it starts is kept for the loop, which saves at step 0: main's signals.take_sigterm)
    signals.EXITING_AFTER[0] = threading.current_thread() is threading.main_thread()  # (see restore_sigterm)
    with signals.interrupt_at_once():
        from bigbatch.batching import compiles, describe_compile, describe_plan
        from bigbatch.config import parse_override
        from bigbatch.engine import dist
        from bigbatch.engine import precision as prec
        from bigbatch.loop import train
        from bigbatch.presets import base_config, check_task_of_default
        from bigbatch.rundir import check_resume

    overrides = dict(parse_override(o) for o in args.overrides)
    resume: bool | str = {"": False, "yes": True, "auto": "auto"}[args.resume or ""]
    saved = Path(args.run_dir) / "config.toml" if args.run_dir else None
    if resume and not args.run_dir:
        raise BigbatchError(f"--resume{'=auto' if resume == 'auto' else ''} needs --run-dir naming the run")
    if resume is True and not saved.exists() and not (saved.parent / "checkpoints").exists():
        if saved.parent.is_file():  # (found from outside: "drop --resume", which then refused the file)
            raise BigbatchError(f"--run-dir {args.run_dir} is a file: give the folder of the run to resume")
        check_resume(saved.parent, True)  # (no run to resume there, or another's metrics.jsonl: said which)
    if resume and not (args.preset or args.config) and (saved.exists() or (saved.parent / "checkpoints").is_dir()):
        from bigbatch.run_data import resume_base  # (the same command with --preset/--config is checked)

        cfg = resume_base(saved.parent)
    else:
        if not (args.preset or args.config) and "task" in overrides:
            check_task_of_default(overrides, "digits")
        cfg = base_config(args.preset, args.config, "digits")
    if args.init_from:
        overrides["train.init_from"] = args.init_from
    cfg = cfg.override(overrides, warn_dropped=True)
    if args.dry_run:
        data = check_data(cfg, new_run=not resume).get(cfg.data.path)  # a missing or broken data file, as
        floor = build_on_meta(cfg, not resume, data)  # training refuses it; what only the constructors check
        if args.run_dir:  # (found from outside: passed a --run-dir holding a run, without --resume)
            check_resume(Path(args.run_dir), resume)
        uses = {"train.init_from": cfg.train.init_from, "eval.weights": cfg.eval.weights if cfg.eval.every_kimg else ""}
        for key, given in uses.items():  # (found from outside: unsaid; said as the data file is)
            if given and not is_url(given) and not Path(given).exists():
                warn(f"{key} {given} does not exist: training refuses it until it does")
        plan = describe_plan(cfg, floor=floor)  # (a plan that cannot be is one line, without the config above it)
        resumed = dry_resume(cfg, Path(args.run_dir), resume) if resume and args.run_dir else ""
        ctx = dist.context(cfg.train.device)
        prec.check(cfg.train.precision, ctx.device)  # (found from outside: fp16 on a CPU said by the run alone)
        if cfg.data.decode != "cpu":  # (found from outside: passed here, refused by the run)
            from bigbatch.data.device_decode import check_device

            check_device(ctx.device, cfg.data.decode)
        on = "on" if compiles(cfg, ctx.device) else "off"
        if ctx.rank == 0:  # (under torchrun, once: found from outside, a config and plan a process)
            print(f"{cfg.dumps()}\n# plan: {plan}{resumed}\n# {describe_compile(cfg)}: {on} (device {ctx.device.type})")
        return
    with contextlib.suppress(signals.Stopped):  # (saved, and said how to go on: exit 0)
        train(cfg, run_dir=args.run_dir, resume=resume, quiet=args.quiet)


def _convert(args: argparse.Namespace) -> None:
    from bigbatch.config import parse_override
    from bigbatch.presets import base_config
    from bigbatch.tasks.gan.convert import convert_reference
    from bigbatch.tasks.swap import files

    if files.dfl_model(args.src) is not None:  # (a DFL model folder, or one model's _data.dat)
        ckpt = files.convert_dfl(args.src, args.out, overrides := dict(parse_override(o) for o in args.overrides))
        out, given = shlex.quote(args.out), {"data.path", "data.dst_path"} <= set(overrides)  # (found from outside:
        data = "" if given else " data.path=SRC.h5 data.dst_path=DST.h5"  # asked for again when given)
        print(
            f"Wrote {ckpt}. Swap with: bigbatch swap {out} IN_DIR OUT_DIR; train on from it, as DFL goes on with a "
            f"model, with: bigbatch train --run-dir {out} --resume{data}"
        )
        return
    if re.search(r"_SAEHD_\w+\.(npy|dat)$", args.src):  # (it was read as a GAN's torch.save file)
        if not os.path.exists(args.src):  # (found from outside: a missing file was "one file of a model")
            raise BigbatchError(f"{args.src} does not exist: give a DeepFaceLab model folder or its _data.dat")
        raise BigbatchError(
            f"{args.src} is one file of a DeepFaceLab model: give its folder (or its <name>_SAEHD_data.dat)"
        )
    cfg = base_config(args.preset, args.config, "biggan128_bs2048")
    cfg = cfg.override(dict(parse_override(o) for o in args.overrides))
    ckpt, out = convert_reference(args.src, args.out, cfg, args.classes), shlex.quote(args.out)
    tune = f"bigbatch train --config {out}/config.toml --init-from {out} data.path=DATA.h5"  # (found from outside: not
    print(f"Wrote {ckpt}. Sample with: bigbatch sample {out}; fine-tune with: {tune}")  # a command; --preset refused)


def _prepare(args: argparse.Namespace) -> None:
    from bigbatch.data.prepare import prepare

    options = endpoint_options(args.endpoint_url)
    report = prepare(
        args.src,
        args.out,
        resolution=args.resolution,
        workers=args.workers,
        limit=args.limit,
        strict=args.strict,
        storage_options=options,
        buckets=args.buckets,
        masks=args.masks,
        eyes_mouth=args.eyes_mouth,
        face_type=args.face_type,
        codec=args.codec,
        quality=args.quality,
        crop=args.crop,
        labels=args.labels,
        classes=args.classes,
        overwrite=args.overwrite,
        progress=True,  # (a bar on a terminal, else a line every 30 s: found from outside, a log got none)
    )
    print(report.summary())
    from bigbatch.cli_tools import next_steps

    next_steps(args, report)


def _sweep(args: argparse.Namespace) -> None:
    from bigbatch.sweeps import run_file

    if args.file is None:
        raise BigbatchError(
            "bigbatch sweep needs FILE.py, the Python file that calls bigbatch.sweep (its ARGS after it)"
        )
    run_file(args.file, args.args)


def _stop(args: argparse.Namespace) -> None:
    from bigbatch.run_stop import stop_run, stopped_said

    if args.wait < 0:
        raise BigbatchError(f"--wait must be a number of seconds >= 0, got {args.wait:g}")
    pid = stop_run(Path(args.run), args.wait)
    if not args.wait:
        print(f"Asked process {pid} to save a checkpoint and stop")
        return
    print(stopped_said(Path(args.run), pid))


def _plot(args: argparse.Namespace) -> None:
    from bigbatch.plot import plot_runs

    print(plot_runs(args.run, args.out))


def _launch(args: argparse.Namespace) -> int:
    from bigbatch.launch import APART, absolute_run_dir, apart, bind_apart, report, with_restarts

    command = absolute_run_dir(args.launched[1:] if args.launched[:1] == ["--"] else args.launched)
    check_launch_counts(args)
    known = next(a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    check_launched(command, list(known), parse_args, args.local > 0)  # (said here, before a cluster starts it)
    if args.restarts and "--resume=auto" not in command:
        raise BigbatchError("--restarts reruns the command: give it --resume=auto, so that a rerun resumes the run")
    if args.local > 0 and command and APART not in os.environ and threading.current_thread() is threading.main_thread():
        return apart(args.argv)  # the local cluster in a session of its own, out of reach of group signals
    bind_apart()
    if args.engine == "ray":
        from bigbatch.launch.ray import launch_ray

        def session() -> list:
            gpus, nprocs = args.gpus_per_rank, args.nprocs
            return launch_ray(
                command, address=args.address, local=args.local, nprocs=nprocs, gpus_per_rank=gpus, grace=args.grace
            )
    else:
        from bigbatch.launch.dask import launch_dask

        def session() -> list:
            local, nprocs = args.local, args.nprocs
            return launch_dask(command, scheduler=args.scheduler, local=local, nprocs=nprocs, grace=args.grace)

    _, _, results = with_restarts(session, args.restarts, say)
    return report(results)


def _presets(args: argparse.Namespace) -> None:
    from bigbatch.presets import list_presets, preset, preset_notes

    if args.name:  # (found from outside: a recipe's notes and its config were in the source alone)
        print(f"{preset_notes(args.name)}\n\n{preset(args.name).dumps()}", end="")
        return
    items = list_presets()
    width = max(map(len, items))
    for name, doc in items.items():
        print(f"{name:<{width}}  {doc}")


def build_parser() -> argparse.ArgumentParser:
    p = cli_errors.Parser(
        prog="bigbatch", description="Train image models (GANs, classifiers) at large batches on the hardware you have."
    )
    p.add_argument("--version", action="version", version=f"bigbatch {bigbatch.__version__}")  # (found from outside)
    sub = p.add_subparsers(dest="command", required=True, parser_class=cli_errors.Parser)

    t = sub.add_parser("train", help="train a recipe (default: the digits preset)")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. train.batch=256")
    t.add_argument("--preset", help="named recipe (see 'bigbatch presets')")
    t.add_argument("--config", help="TOML config file, e.g. a run's config.toml")
    t.add_argument("--run-dir", help="run directory (default: runs/<name>-NNNNN)")
    t.add_argument(
        "--resume",
        nargs="?",
        const="yes",
        choices=("yes", "auto"),
        help="continue the run in --run-dir from its latest checkpoint; --resume=auto: or start it if there is none "
        "(a job script's one command). With --preset/--config the config must be the run's (length and output "
        "cadence may differ)",
    )
    t.add_argument("--dry-run", action="store_true", help="print the resolved config and batch plan, then exit")
    t.add_argument("--quiet", action="store_true", help="no progress rows (the lines that start and end the run stay)")
    t.add_argument(
        "--init-from",
        metavar="RUN_OR_CKPT",
        help="fine-tune: start from this run's or checkpoint's weights (a GAN's G, D and G_ema; a classifier's, its "
        "head kept for the same classes, else made anew; an autoencoder's) with fresh optimizers (train.init_from)",
    )
    t.set_defaults(func=_train)

    c = sub.add_parser(
        "convert",
        help="turn BigGAN-PyTorch weights, StyleGAN2-ADA state dicts or a DeepFaceLab SAEHD model folder into a "
        "bigbatch run",
    )
    c.add_argument(
        "src",
        metavar="SRC",
        help="BigGAN-PyTorch's weights folder or generator .pth, StyleGAN2-ADA's (G.pth, G_ema.pth, D.pth: its "
        "snapshot's state dicts, with --preset stylegan2_256 or another stylegan2 one), or a DFL SAEHD model folder",
    )
    c.add_argument("out", metavar="OUT_RUN", help="new run directory to write")
    c.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. model.ch=64")
    c.add_argument("--preset", help="recipe describing the model (default: biggan128_bs2048)")
    c.add_argument("--config", help="TOML config file describing the model")
    c.add_argument("--classes", type=int, help="number of classes (default: read from the weights)")
    c.set_defaults(func=_convert)

    add_swap_commands(sub)
    add_face_commands(sub)
    add_tool_commands(sub)

    add_sample_command(sub)

    pr = sub.add_parser(
        "prepare",
        help="turn a folder, zip, tar or WebDataset shards, s3:// prefix or builtin:NAME into one HDF5 data file",
    )
    pr.add_argument("src", metavar="SRC")
    pr.add_argument("out", metavar="OUT.h5")
    pr.add_argument("--resolution", type=int, help="center-crop and resize (Pillow LANCZOS) to N x N")
    pr.add_argument("--workers", type=int, help="parallel decoding processes (default: all cores)")
    pr.add_argument("--limit", type=int, help="take at most N images, spread over the classes")
    pr.add_argument("--strict", action="store_true", help="an unreadable or non-image file is an error, not skipped")
    pr.add_argument("--overwrite", action="store_true", help="replace OUT.h5 if it exists (else refused)")
    pr.add_argument("--buckets", action="store_true", help="keep aspect ratios: store images in aspect-ratio buckets")
    pr.add_argument("--labels", metavar="FILE.csv", help="file,label rows labelling a flat folder (ImageNet's val)")
    pr.add_argument(
        "--classes",
        metavar="TRAIN.h5",
        help="class indices in this data file's order: of --labels, or of the class folders (a validation set that "
        "lacks a class); names for WebDataset's .cls indices; or a .txt file, a class name a line",
    )
    pr.add_argument("--codec", choices=("raw", "jpeg", "png", "webp"), default="raw", help="how images are stored: raw "
        "pixels (default; fastest to read), or encoded (jpeg: photos of 256 px and more in about a tenth of the bytes, "
        "small or grey images in a half to a fifth; decoded in the loader's workers, at a reduced size for small "
        "phases)")  # fmt: skip
    pr.add_argument("--quality", type=int, help="jpeg/webp quality, 1..100 (default 90)")
    pr.add_argument(
        "--crop",
        choices=("center", "none"),
        default="center",
        help="center: square crops (default); none: whole images, short side scaled down to --resolution "
        "(random-resized crops of the whole image in training; needs an encoded --codec)",
    )
    pr.add_argument(
        "--masks",
        metavar="alpha|dfl|labels|xseg-applied|DIR",
        help="swap task: keep a face mask: the alpha channel, the mask in DeepFaceLab's aligned faces "
        "(XSeg's, else the landmarks' hull) or a folder of masks; xseg task: labels, the masks drawn in DFL's "
        "XSeg editor, or xseg-applied, their applied XSeg masks (faces without are skipped); both at 256 px, XSeg's, "
        "unless --resolution",
    )
    pr.add_argument(
        "--face-type",
        metavar="h|mf|f|wf|head",
        help="DFL's aligned faces of another type cut to this one by their landmarks (with their masks), as DFL's "
        "trainers cut them: an XSeg or SAEHD model of this type from faces of several",
    )
    pr.add_argument(
        "--eyes-mouth",
        metavar="dfl|DIR",
        help="swap task: the eyes-and-mouth region, from DFL's landmarks or a folder of masks (with --masks)",
    )
    pr.set_defaults(func=_prepare)

    st = sub.add_parser("stats", help="reference feature statistics of a data set for FID/KID (cached)")
    st.add_argument(
        "data",
        metavar="DATA",
        help="DATA.h5, builtin:NAME, a folder, .zip, .tar, .npz or .npy of images, tar shards' pattern, or their URL",
    )
    st.add_argument(
        "--extractor",
        default="auto",
        help="auto, inception, inception-torchscript, classifier or classifier:RUN (a classify run)",
    )
    st.add_argument("--weights", help="Inception weights file (default: found in $BIGBATCH_CACHE/weights)")
    st.add_argument("--npz", metavar="OUT.npz", help="also write mu and sigma as pytorch-fid's and clean-fid's .npz")
    st.add_argument("--n", type=int, help="images to use (default, or 0: all)")
    st.add_argument("--resolution", type=int, help="builtin data sets: the side to make them at (default 32)")
    st.add_argument("--kid", action="store_true", help="also keep every image's features, which KID, pr and dc need")
    st.set_defaults(func=run_stats)

    ev = sub.add_parser(
        "eval",
        help="score a classify run on DATA (top-1/5, per class, confusion), a swap run's reconstructions (SSIM), "
        "a GAN run's EMA generator or any images against a data set, images or statistics: FID, IS, KID",
    )
    ev.add_argument("path", metavar="A", help=f"what to score: {EVAL_A}")
    ev.add_argument(
        "reference",
        metavar="B",
        nargs="?",
        help=f"what to compare with (default for a run: its data set; IS needs none): {EVAL_B}",
    )
    ev.add_argument(
        "--checkpoint", help="a run's checkpoint to score: latest (default), best, or a checkpoints/ folder name"
    )
    ev.add_argument("--dst", metavar="DATA", help="a swap run: dst faces to score (B: src faces)")
    ev.add_argument(
        "--tta",
        action=argparse.BooleanOptionalAction,
        help="a classify run: each image's prediction averaged with its mirror image's (default: the run's eval.tta)",
    )
    ev.add_argument(
        "--metrics",
        help=f"comma-separated (default {DEFAULT_METRICS}); also pr (precision and recall, k=3) and dc (density and "
        "coverage, k=5) against as many reference images as samples",
    )
    ev.add_argument(
        "--n", type=int, help="images of A: a run's samples (default 50000); of images, a subset (default: all)"
    )
    ev.add_argument(
        "--reference-n",
        type=int,
        help="images of B for its statistics, a seeded subset (0 or unset: all; a run: eval.reference_n)",
    )
    ev.add_argument(
        "--extractor",
        help="auto, inception, inception-torchscript, classifier or classifier:RUN (a classify run's classifier; "
        "default: the run's eval.extractor, else auto)",
    )
    ev.add_argument(
        "--weights", help="Inception weights file (default: found in $BIGBATCH_CACHE/weights; a run: eval.weights)"
    )
    ev.add_argument("--batch-size", type=int, help="images scored at once (default: a run's eval.batch_size, else 64)")
    ev.add_argument("--resolution", type=int, help="builtin:NAME: the side to make it at; classify run: to score at")
    ev.add_argument(
        "--seed",
        type=seed,
        help="seed of the samples, or of the subset --n takes (default: the run's eval.seed, else 0)",
    )
    ev.add_argument("--truncation", type=values, help="z truncation threshold, or several to sweep (default: eval's)")
    ev.add_argument("--psi", type=values, help="StyleGAN2: w toward its average (1: off, 0.7 typical), or several")
    add_scoring_options(ev)
    ev.set_defaults(func=run_eval)

    pl = sub.add_parser("plot", help="training curves and evaluation scores of runs (drawn together), as one PNG")
    pl.add_argument("run", metavar="RUN_DIR", nargs="+", help="runs, or folders of runs (a sweep's)")
    pl.add_argument(
        "--out", type=out_named, help="PNG to write (default RUN_DIR/plots.png; several: in the folder that holds them)"
    )
    pl.set_defaults(func=_plot)

    la = sub.add_parser(
        "launch",
        help="run bigbatch train (or eval) on every worker of a cluster (Dask or Ray), ranks set as torchrun would",
    )
    engines = la.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    dk = engines.add_parser("dask", help="one rank per Dask worker: bigbatch launch dask --scheduler ADDR -- train ...")
    dk.add_argument("--scheduler", help="the Dask scheduler's address, e.g. tcp://10.0.0.1:8786")
    dk.add_argument("--local", type=int, default=0, help="instead: start a local cluster of N worker processes")
    dk.add_argument("--nprocs", type=int, help="use the first N workers (default: all)")
    ry = engines.add_parser("ray", help="one rank per Ray actor: bigbatch launch ray --address auto -- train ...")
    ry.add_argument("--address", help="the Ray cluster: auto (this node's), or ray://HEAD:10001")
    ry.add_argument("--local", type=int, default=0, help="instead: start a local Ray instance with N CPU ranks")
    ry.add_argument("--nprocs", type=int, help="ranks (default: one per GPU of the cluster, or --local N)")
    ry.add_argument(
        "--gpus-per-rank",
        type=float,
        help="GPUs each rank holds: 1, or 0 for CPU ranks (default: 1 if the cluster has GPUs)",
    )
    for engine in (dk, ry):
        engine.add_argument(
            "--grace", type=float, default=60.0, help="seconds a stopped rank may take to save (then SIGKILL)"
        )
        engine.add_argument(
            "--restarts",
            type=int,
            default=0,
            help="after a rank fails or a worker is lost, start every rank again, up to this many times "
            "(the command carries --resume=auto, so the run resumes from its latest checkpoint)",
        )
        engine.add_argument(
            "launched",
            nargs=argparse.REMAINDER,
            metavar="-- COMMAND",
            help="the bigbatch command, e.g. -- train --preset digits",
        )
        engine.set_defaults(func=_launch)

    sw = sub.add_parser(
        "sweep",
        help="run a sweep file: plain Python that calls bigbatch.sweep(base, grid, runs_dir)",
        usage="bigbatch sweep [-h] FILE.py [ARGS ...]",
    )
    sw.add_argument("file", metavar="FILE.py", nargs="?")  # (said by _sweep: argparse named ARGS required too)
    sw.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the file's arguments (sys.argv[1:])")
    sw.set_defaults(func=_sweep)

    so = sub.add_parser("stop", help="ask the process training a run (a sweep: RUNS_DIR) to save a checkpoint and exit")
    so.add_argument("run", metavar="RUN_DIR")
    so.add_argument(
        "--wait", type=float, default=300.0, help="seconds to wait for it to finish saving (default 300; 0: no wait)"
    )
    so.set_defaults(func=_stop)

    i = sub.add_parser("info", help="say what a run, checkpoint, data file (.h5) or export holds")
    i.add_argument("path", metavar="PATH")
    i.add_argument("--verify", action="store_true", help="read everything back: a data file's content hash, runs'")
    i.add_argument("--skipped", action="store_true", help="a data file's: every file prepare skipped, tab, why")
    i.set_defaults(func=run_info)
    for reads in (pr, st, ev, i):  # the commands that read data at a URL (found from outside: only prepare's took one)
        reads.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL, a run's storage_options)")

    ps = sub.add_parser("presets", help="list the named recipes, or show one's notes and config")
    ps.add_argument("name", nargs="?", help="a preset: its docstring (source, settings) and its config as TOML")
    ps.set_defaults(func=_presets)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; `key=value` overrides of train and convert may stand anywhere among the options."""
    parser = build_parser()
    given, argv = list(sys.argv[1:] if argv is None else argv), []
    ours = given[:1] != ["sweep"]  # --resume: no override its value; --resume auto: =auto (a sweep file's: as given)
    for a in given:
        if ours and a in ("auto", "yes") and argv[-1:] == ["--resume=yes"]:
            argv[-1] = f"--resume={a}"
        else:
            argv.append("--resume=yes" if ours and a == "--resume" else a)
    # argparse fills a positional list from one run of arguments only: overrides after an option come back unparsed
    args, extras = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        args.overrides += [a for a in extras if not a.startswith("-")]  # parse_override names a malformed one
        extras = [a for a in extras if a.startswith("-")]
    elif extras and _may_intermix(parser, args.command, argv, extras):
        # A positional after an option (eval RUN --checkpoint best DATA): the command's own parser gathers them.
        command = _subparser(parser, args.command)
        args = command.parse_intermixed_args(argv[argv.index(args.command) + 1 :], argparse.Namespace(**vars(args)))
        extras = []
    if extras:  # (the command's --help: found from outside, train's pointed to bigbatch's)
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extras)}")
    refuse_url_paths(args, argv)
    cli_tools.checkpoint_named(args)
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _may_intermix(parser: argparse.ArgumentParser, name: str, argv: list[str], extras: list[str]) -> bool:
    """Whether the command's own parser may gather positionals left after its options: none of the extras stands
    before the command (an unknown option there is an error), and the command has no subcommands and no
    argparse.REMAINDER (which parse_intermixed_args refuses: launch, sweep)."""
    if name not in argv or any(a in argv[: argv.index(name)] for a in extras):
        return False
    actions = _subparser(parser, name)._actions
    return not any(isinstance(a, argparse._SubParsersAction) or a.nargs == argparse.REMAINDER for a in actions)


_MAIN_PID = os.getpid()


def _terminate(signum: int, frame: object) -> None:
    if os.getpid() != _MAIN_PID:  # a forked worker (prepare's decoders) that inherited this handler
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise signals.Terminated


def _kept(args: argparse.Namespace | None) -> None:
    """What a prepare (or a command that goes on where it stopped) stopped by a signal kept, said before its last
    line (found from outside: unsaid)."""
    if args is not None and getattr(args, "func", None) is _prepare:
        importlib.import_module("bigbatch.data.prepare_pool").said_kept(args.out)
    elif getattr(args, "goes_on", False):  # (extract, merge, enhance, video frames: found from outside, unsaid)
        wrote = not isinstance(getattr(args, "out", None), str) or os.path.exists(args.out)  # (stopped as it began:
        said = "what it wrote is kept: the same command goes on from there" if wrote else "it had written nothing"
        print(f"bigbatch: {said}", file=sys.stderr)  # nothing written, found from outside said to be kept)


def main(argv: list[str] | None = None) -> int:
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is printed as its bytes, not a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    in_main = threading.current_thread() is threading.main_thread()
    given = list(sys.argv[1:] if argv is None else argv)
    old = signals.take_sigterm(given, _terminate) if in_main else None
    old_int = signals.hear_sigint()  # (every command stops on a Ctrl-C, a background job's too)
    one_line_warnings()
    args = None
    try:
        if in_main and sys.platform == "linux" and os.environ.get("BIGBATCH_LAUNCH_PARENT"):  # (a launched rank's
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # SIGTERM, held since its fork: taken now)
        user_modules.import_user_modules()  # (BIGBATCH_IMPORT: a user's own model families, before a config is read)
        args = parse_args(argv)
        args.argv = given
        status = args.func(args)  # None, or the exit status of what ran elsewhere (bigbatch launch)
    except signals.Terminated:
        _kept(args)
        if not cli_errors.another_rank_said():  # (torchrun's stop of the others: that rank's line says why)
            say(STOPPED)  # (one write: every rank says it at once on a SIGTERM to all)
        return 128 + signal.SIGTERM
    except BigbatchError as e:
        say_error(str(e))
        return 2
    except BrokenPipeError:  # the reader of stdout went away (`bigbatch info RUN | head -1`): quietly, as `ls`
        silence(sys.stdout.fileno())  # (no second error at exit)
        return 128 + signal.SIGPIPE
    except OSError as e:  # a path that cannot be written (disk full, read-only) or read
        say_error(os_error_line(e, resumes=getattr(args, "func", None) is _train))
        return 2
    except KeyboardInterrupt as e:
        sweeps = sys.modules.get("bigbatch.sweeps")  # (a sweep's Stopped has said where, in its one line)
        if not isinstance(e, signals.Stopped) and not (sweeps and isinstance(e, sweeps.Stopped)):  # (said)
            _kept(args)
            say("bigbatch: interrupted")
        return 130
    except RuntimeError as e:  # (a few of torch's are a user's to mend: one line each, as BigbatchError's)
        said = runtime_error_line(e, getattr(args, "command", "train"))
        if said is None:
            raise
        say_error(said[0])
        return said[1]
    finally:
        if in_main:
            signals.restore_sigterm(old, exits=argv is None)
            signal.signal(signal.SIGINT, old_int)
            signals.ignore_late_sigterm()  # (a launched rank that has ended)
        # The command's process, which ends next: its objects left out of Python's last collection (found from
        # outside: 1-3 s from a stop's save to its exit, SIGKILLed); not a sweep file's (a user's objects may need
        # their finalizers) nor a launch's (its Dask client's). Its own files are closed as they are written.
        if argv is None and getattr(args, "func", None) not in (_sweep, _launch):
            gc.freeze()
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
