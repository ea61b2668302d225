"""Commands around training: `bigbatch predict RUN IMAGES...` (a classifier's class names and
probabilities per image), `bigbatch export RUN OUT` (one file to deploy: a classifier with its
preprocessing and class names, a GAN's generator, a face swap), `bigbatch lr-find --preset P [k=v ...]`
(the learning-rate range test), `bigbatch show-batch --preset P [k=v ...]` (what the models are fed), and
`bigbatch stats DATA` and `bigbatch info PATH`."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import Location, endpoint_options, is_url, local_path


def _predict(args: argparse.Namespace) -> None:
    from bigbatch.config import Config
    from bigbatch.engine import dist
    from bigbatch.tasks.classify.inference import check_tta, each_image, inference_of, predict_each

    if args.topk < 1:
        raise BigbatchError(f"--topk must be at least 1, got {args.topk}")
    if args.out and not args.out.lower().endswith((".csv", ".json")):
        raise BigbatchError(f"--out {args.out!r}: give a .csv or a .json file for the predictions")
    module = inference_of(args.run, args.checkpoint, dist.context("auto").device)
    cfg = Config.load(Path(str(module.checkpoint)) / "config.toml")
    tta = cfg.eval.tta if args.tta is None else args.tta  # (found by review: a run scored with TTA, predicted
    if tta:  # without: not the probabilities its scores were of)
        check_tta(cfg, args.run)
    if args.out:  # where the predictions go, made and checked before the images (found from outside: a missing
        # folder failed once every image was predicted, as export and lr-find make theirs)
        from bigbatch.files import check_writable

        folder = Path(args.out).parent
        folder.mkdir(parents=True, exist_ok=True)
        check_writable(folder)
    skipped: list[tuple[str, str]] = []  # (said once an image is predicted; with none, the first says why)

    def images() -> Iterator[tuple[str, Any]]:
        for name, got in each_image(args.images):
            if isinstance(got, str):
                skipped.append((name, got))
            else:
                yield name, got

    def say_skipped() -> None:
        for name, why in skipped:
            print(f"bigbatch: skipped {name}: {why}", file=sys.stderr)
            if args.json or args.out:  # (found from outside: a script reading the JSON could not tell a file skipped)
                rows.append({"file": name, "error": why})
        skipped.clear()

    rows, count = [], 0
    for row in predict_each(module, images(), args.topk, tta):  # (each image as it is read: a folder of
        count += 1  # photos is not held decoded at once)
        say_skipped()
        if args.json or args.out:
            rows.append(row)
        if not args.json:
            print(f"{row['file']}: " + ", ".join(f"{t['class']} {t['p']:.3f}" for t in row["top"]), flush=True)
    if not count:  # (one line: the first file skipped says why)
        more = f" (and {len(skipped) - 1} more skipped)" if len(skipped) > 1 else ""
        raise BigbatchError(
            "no image to predict: " + (f"{skipped[0][0]}: {skipped[0][1]}{more}" if skipped else "none given")
        )
    say_skipped()
    if args.json:
        print(json.dumps(rows))
    if args.out:
        _write_predictions(args.out, rows, args.topk)


def _write_predictions(out: str, rows: list[dict], k: int) -> None:
    """--out: the rows --json prints, as that JSON or as a CSV of file, the top classes with their probabilities
    and why a file was skipped (found from outside: timm's inference.py writes its results to a file, predict only
    printed them), written whole."""
    from bigbatch.files import atomic_write
    from bigbatch.tasks.classify.report import spreadsheet_cell

    if out.lower().endswith(".json"):
        atomic_write(out, json.dumps(rows, indent=1) + "\n")
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["file", *(f"{what}_{i + 1}" for i in range(k) for what in ("class", "p")), "error"])
    for row in rows:
        top = [v for t in row.get("top", []) for v in (t["class"], f"{t['p']:.6f}")]
        cells = [row["file"], *top, *[""] * (2 * k - len(top)), row.get("error", "")]
        writer.writerow([spreadsheet_cell(c) for c in cells])  # (a class or file named =... is no formula there)
    atomic_write(out, buffer.getvalue())


def _export(args: argparse.Namespace) -> None:
    from bigbatch.checkpoint_find import holds_checkpoints
    from bigbatch.export import FORMATS, export

    # The format the file's name says (model.onnx, model.pt2), else --format's (found from outside: an ONNX file named
    # .dfm, which DeepFaceLive then fails on, and TorchScript named .safetensors).
    name = os.path.basename(args.out)
    if not name or name in (".", ".."):  # (found from outside: OUT/ was written as a file named OUT)
        folder = args.out.rstrip("/" + os.sep) or args.out
        raise BigbatchError(f"{args.out} names a folder; export writes one file: name it, e.g. {folder}/model.pt")
    if name.startswith(".") and "." not in name[1:]:  # (found from outside: .onnx, no suffix to os.path, TorchScript)
        raise BigbatchError(f"{args.out}: give the file a name before its suffix, e.g. model{name}")
    ext = os.path.splitext(args.out)[1].lower()
    if ext == ".safetensors":
        raise BigbatchError(
            f"{args.out}: export writes a model to run (.pt, .pt2, .onnx, .dfm); a run's weights are safetensors "
            "already, in RUN/checkpoints/KIMG/"
        )
    named = {".onnx": "onnx", ".pt2": "pt2", ".dfm": "dfm", ".pt": "torchscript", ".pth": "torchscript"}.get(ext)
    if ext and not named and args.format is None:  # (found from outside: model.omnx was written as TorchScript)
        raise BigbatchError(
            f"{args.out}: {ext} names no format export writes: name it .pt (TorchScript), .pt2, .onnx or .dfm, or "
            "give --format"
        )
    fmt = args.format or named or "torchscript"
    if fmt not in FORMATS:
        raise BigbatchError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if named and fmt != named and (fmt, named) != ("dfm", "onnx"):  # (a .dfm is an ONNX model: it may be named so)
        raise BigbatchError(
            f"--format {fmt} writes no {ext} file: name OUT for its format ({ext} is {named}'s), or leave --format out"
        )
    if os.path.isdir(args.out):  # (found from outside: --overwrite, which the line below suggests, then failed)
        raise BigbatchError(f"{args.out} is a folder; export writes one file: name it, e.g. {args.out}/model.pt")
    where = Path(args.out).resolve().parent
    if any(
        p.name == "checkpoints" and (p / "latest").exists() and holds_checkpoints(p.parent)
        for p in (where, *where.parents)
    ):
        # (found from outside: --overwrite replaced the run's checkpoints/latest with the export)
        raise BigbatchError(f"{args.out} is inside a run's checkpoints folder: write the export elsewhere")
    if os.path.lexists(args.out) and not args.overwrite:  # (as prepare and export-dfl refuse theirs)
        raise BigbatchError(f"{args.out} exists: give --overwrite to replace it, or another name")
    out, usage = export(args.run, args.out, args.checkpoint, fmt, args.psi, overwrite=args.overwrite)
    if fmt == "dfm":
        print(f"Wrote {out}: {usage}")
        return
    load = {"onnx": "session = onnxruntime.InferenceSession(it)", "pt2": "torch.export.load(it).module()"}.get(
        fmt, "torch.jit.load it"
    )
    settings = {  # (the class names among them: found from outside, the usage named a pt2's that it has not)
        "onnx": "the model's metadata property 'bigbatch'",
        "pt2": "torch.export.load(it, extra_files={'bigbatch.json': ''}) fills it in",
    }.get(fmt, "torch.jit.load(it, _extra_files={'bigbatch.json': ''}) fills it in")
    classes = ", its classes, ..." if "class" in usage else ", ..."
    if fmt == "torchscript" and "class probabilities" in usage:
        settings += " (a classifier's: model.class_names)"
    print(f"Wrote {out}: {load}; {usage}; its settings (the run's{classes}) as JSON: {settings}")


def config_of(args: argparse.Namespace, default: str, then: dict[str, Any] | None = None) -> Any:
    """The config of --preset or --config with the overrides given, and `then` on top (checked once, together)."""
    from bigbatch.config import parse_override
    from bigbatch.presets import base_config

    given = dict(parse_override(o) for o in args.overrides)
    return base_config(args.preset, args.config, default).override({**given, **(then or {})})


def device_named(name: str) -> str:
    """--device of the commands that run a model outside training: auto (CUDA when torch has a GPU), cpu or cuda;
    the device to use, or one line."""
    if name not in ("auto", "cpu", "cuda"):
        raise BigbatchError(f"--device must be auto, cpu or cuda, got {name!r}")
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise BigbatchError("--device cuda: this machine has no CUDA GPU that torch can use; give --device cpu")
    return "cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu"


def out_named(value: str, suffix: str = ".png") -> str:
    """An --out whose name says what the command writes into it (a PNG, by default), else one line."""
    if not value.lower().endswith(suffix):
        what = "a PNG image" if suffix == ".png" else f"a {suffix} file"
        raise BigbatchError(f"--out {value!r} would hold {what}: give a name ending in {suffix}")
    return value


def _show_batch(args: argparse.Namespace) -> None:
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.data.schedule import schedule_of
    from bigbatch.sampling import save_png
    from bigbatch.tasks import build_task

    if not 0 <= args.kimg <= 1e12:  # (beyond: more images than an int64 counts; found from outside)
        raise BigbatchError(f"--kimg must be a number of kimg, 0 to 1e12, got {args.kimg:g}")
    # The images fed depend on no evaluation (found from outside: a classifier with no held-out split was refused)
    cfg = config_of(args, "digits", {"eval.every_kimg": 0.0})
    if cfg.train.init_from:  # (the images fed do not depend on the weights a run starts from, which need not be here)
        cfg = cfg.override({"train.init_from": "", "train.freeze_kimg": 0.0})  # (nothing frozen: nothing loaded)
    schedule = schedule_of(cfg)
    nimg = schedule.align(round(args.kimg * 1000))
    if nimg >= cfg.train.images:  # (found from outside: said nothing)
        warn(  # (found from outside: said, then drawn without a word of what)
            f"--kimg {args.kimg:g} is at or past the run's end (train.kimg {cfg.train.kimg:g}): no step is there; "
            "drawn is the step there were the run longer"
        )
    aug, logged = cfg.augment, None
    p_given = any(o.partition("=")[0].strip() == "augment.p" for o in args.overrides)
    if cfg.task == "gan" and aug.transforms and aug.target and args.config and not p_given:
        if logged := _logged_augment_p(args.config, nimg):  # (found from outside: a run's showed p 0)
            cfg = cfg.override({"augment.p": logged[0]})
    rep = replicator_for(cfg)
    try:
        task = build_task(cfg, rep, training_data(cfg))
        out = save_png(task.batch_sheet(nimg), args.out)
    finally:
        rep.close()
    phase = schedule.phase_at(nimg)
    size = f"{phase.resolution or cfg.data.resolution} px, "
    if logged:
        size += f"[augment] at p {logged[0]:g} (the run's at kimg {logged[1]:g}, its metrics.jsonl's augment_p), "
    elif cfg.task == "gan" and aug.transforms:  # ADA's p is the run's, known from its log: say which this is
        started = "; a run's own is its metrics.jsonl's augment_p, give augment.p to see it" if aug.target else ""
        size += f"[augment] at p {aug.start_p:g}{' (where ADA starts' + started + ')' if aug.target else ''}, "
    print(f"Wrote {out}: the first images of the step at kimg {nimg / 1000:g} ({size}batch {phase.batch}) as fed")


def _logged_augment_p(config: str, nimg: int) -> tuple[float, float] | None:
    """ADA's p as the run whose config `config` is (its folder or its config.toml) logged it last at or before `nimg`,
    and that row's kimg; None where `config` is no run's or the run logged none there."""
    from bigbatch.metrics_file import read_metrics

    path = Path(config)
    folder = path if path.is_dir() else path.parent
    if path.name != "config.toml" and not path.is_dir():  # (a TOML of the user's own beside no run's log)
        return None
    rows = [r for r in read_metrics(folder / "metrics.jsonl") if "augment_p" in r and r["kimg"] * 1000 <= nimg]
    return (float(rows[-1]["augment_p"]), float(rows[-1]["kimg"])) if rows else None


def _lr_find(args: argparse.Namespace) -> None:
    from bigbatch.files import atomic_write
    from bigbatch.lr_find import lr_find, plot

    # (it validates nothing: a config without a held-out split is fine; found from outside, it was refused)
    cfg = config_of(args, "fashion_resnet_fast", {"eval.every_kimg": 0})
    result = lr_find(cfg, args.start_lr, args.end_lr, args.steps)
    out = plot(result, args.out)
    # The curve's numbers beside it, to plot again or compare (fastai's recorder.lrs and losses; found from outside:
    # the picture alone was kept).
    atomic_write(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    per = f" per {result['lr_batch']} images" if result["lr_batch"] else ""
    print(f"{len(result['lr'])} steps at batch {result['batch']}, rates {result['lr'][0]:.1e}..{result['lr'][-1]:.1e}")
    print(
        f"suggested {result['key']}{per}: valley {result['valley']:.2e}, steepest {result['steepest']:.2e}, "
        f"minimum/10 {result['minimum']:.2e}; the curve is in {out} (its numbers in {out.with_suffix('.json')})"
    )


def add_tool_commands(sub: Any) -> None:
    """Add predict, export, lr-find and show-batch to the CLI's subcommands."""
    pr = sub.add_parser("predict", help="a classify run's classes and probabilities for image files, folders or zips")
    pr.add_argument("run", metavar="RUN", help="classify run directory or checkpoint folder")
    pr.add_argument("images", metavar="IMAGE", nargs="+", help="image files, folders of images, .zip or .tar files")
    pr.add_argument("--topk", type=int, default=5, help="classes per image (default 5)")
    pr.add_argument(
        "--tta",
        action=argparse.BooleanOptionalAction,
        help="average each image's prediction with its mirror image's (default: the run's eval.tta)",
    )
    pr.add_argument("--json", action="store_true", help="one JSON list: file, top classes with probabilities")
    pr.add_argument("--checkpoint", help="latest (default), best, or a checkpoints/ folder name")
    pr.add_argument(
        "--out", metavar="FILE", help="also write the predictions to FILE once all are made: .json (as --json) or .csv "
        "(file, class_1, p_1, ... and why a file was skipped)",
    )  # fmt: skip
    pr.set_defaults(func=_predict)

    ex = sub.add_parser(
        "export", help="a run as one file to deploy (TorchScript, torch.export's pt2 or ONNX): a classifier with its "
        "preprocessing, "
        "a GAN's EMA generator, a face swap (also as DeepFaceLive's .dfm)",
    )  # fmt: skip
    ex.add_argument(
        "run", metavar="RUN", help="run directory or checkpoint folder (classify, gan or swap; for .dfm, also a "
        "DeepFaceLab SAEHD model folder)",
    )  # fmt: skip
    ex.add_argument("out", metavar="OUT", help="the file to write (e.g. model.pt, model.onnx)")
    ex.add_argument(
        "--format",
        type=str.lower,
        help="torchscript, onnx, pt2 (torch.export) or dfm (DeepFaceLive's model of a swap); default: as OUT's name "
        "says (.onnx, .pt2, .dfm), else torchscript",
    )
    ex.add_argument("--checkpoint", help="latest (default), best, or a checkpoints/ folder name")
    ex.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    ex.add_argument(
        "--psi", type=float, help="a StyleGAN2: its truncation of w toward the average w, built into the file (1 = "
        "off, 0.7 typical; as `sample --psi`)",
    )  # fmt: skip
    ex.set_defaults(func=_export)

    lf = sub.add_parser(
        "lr-find", help="learning-rate range test of a classify or swap config; writes lr_find.png and .json"
    )
    lf.add_argument("--preset", help="a named recipe (bigbatch presets; default fashion_resnet_fast)")
    lf.add_argument("--config", help="a config.toml")
    lf.add_argument("--steps", type=int, default=100, help="steps with the rate rising exponentially (default 100)")
    lf.add_argument("--start-lr", type=float, default=1e-7, help="first rate (default 1e-7)")
    lf.add_argument("--end-lr", type=float, default=10.0, help="last rate (default 10); train.lr's or swap.lr's units")
    lf.add_argument("--out", type=out_named, default="lr_find.png", help="where the curve goes (default lr_find.png)")
    lf.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    lf.set_defaults(func=_lr_find)

    sb = sub.add_parser("show-batch", help="draw a config's first training batch as the model receives it")
    sb.add_argument("--preset", help="a named recipe (bigbatch presets; default digits)")
    sb.add_argument("--config", help="a config.toml")
    sb.add_argument("--kimg", type=float, default=0.0, help="the step at (or next after) this many kimg (default 0)")
    sb.add_argument("--out", type=out_named, default="batch.png", help="where the sheet goes (default batch.png)")
    sb.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    sb.set_defaults(func=_show_batch)


def run_stats(args: argparse.Namespace) -> None:
    from bigbatch.data import load_data
    from bigbatch.data.hdf5 import read_meta
    from bigbatch.metrics import reference_stats
    from bigbatch.tasks.classify.features import feature_extractor

    if args.resolution is not None and args.resolution < 1:
        raise BigbatchError(f"--resolution must be at least 1, got {args.resolution}")
    options = endpoint_options(args.endpoint_url)
    if args.npz:
        from bigbatch.metrics.extractors import falls_back

        args.npz = local_path(args.npz, "--npz", "stats")
        _check_stats_out(args.npz)
        # (before it trains: a classifier's, named or "auto"'s without Inception weights, are not what those tools read)
        if args.extractor.startswith("classifier") or falls_back(args.extractor, args.weights):
            raise BigbatchError("--npz writes Inception statistics for other tools: give --extractor inception")
    data = _images(args.data, args.resolution, options)
    if data is None:  # a data file, or builtin:NAME
        stored = None if args.data.startswith("builtin:") else read_meta(args.data, options)["resolution"]
        if stored is not None and args.resolution not in (None, stored):
            raise BigbatchError(
                f"--resolution is for builtin data sets; {args.data} holds images of {stored} px: leave it out"
            )
        data = load_data(args.data, stored or args.resolution or 32, storage_options=options)
    args.n = args.n or None  # 0: all, as eval --reference-n 0 (found from outside: refused)
    if args.n is not None and args.n > len(data):
        warn(f"{args.data} holds {len(data)} images, fewer than --n {args.n}: using all of them")
    ext = feature_extractor(args.extractor, data, args.weights)  # (a data set's own classifier trained and cached here;
    # --weights: found from outside, weights kept elsewhere could not be given)
    from bigbatch.metrics.features import progress

    with progress("stats"):
        stats = reference_stats(data, ext, n=args.n, features=args.kid)
    from safetensors import safe_open

    from bigbatch.metrics.stats import stats_file

    file = stats_file(stats.key)
    # (what the file holds, said: found from outside, a file of KID's features too said to hold FID's alone)
    if not args.kid and file.is_file():
        with safe_open(file, "pt") as f:
            # (an empty features tensor where none were kept: found from outside, said to hold them)
            args.kid = "features" in f.keys() and f.get_slice("features").get_shape()[0] > 0  # noqa: SIM118
    kept = "mean, covariance and every image's features (for KID)" if args.kid else "mean and covariance (for FID)"
    # (the classifier's are of the data's own classifier: B to the eval of a run, whose data it is, not to the
    # eval of images, whose classifier trains on B's images: found from outside, said and then refused)
    use = "give it as B to bigbatch eval" + ("" if ext.family == "inception" else f" of a run on {args.data}")
    where = f"in {file} ({use})" if file.is_file() else f"key {stats.key}"
    print(f"reference statistics of {args.data} with {ext.name}: {stats.n} images, {kept}; {where}")
    if args.npz:  # (found from outside: statistics to share with TTUR's, pytorch-fid's or clean-fid's users)
        import io

        import numpy as np

        from bigbatch.files import atomic_write

        buf = io.BytesIO()
        np.savez(buf, mu=stats.mu, sigma=stats.sigma)
        atomic_write(args.npz, buf.getvalue())
        print(f"wrote {args.npz}: mu and sigma, as pytorch-fid's --save-stats writes them (TF1's resize: clean-fid's "
              "legacy_tensorflow mode)")  # fmt: skip


def _check_stats_out(path: str) -> None:
    """stats --npz writes a .npz of mu and sigma, replacing only such a file (found from outside: it replaced the
    data set it read, and an .npz of images)."""
    import numpy as np

    if not path.lower().endswith(".npz"):
        raise BigbatchError(f"--npz {path!r} would hold mu and sigma as an .npz: give a name ending in .npz")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # (found from outside: said once the statistics were computed, their time lost)
        raise BigbatchError(f"--npz {path!r}: its folder {folder} does not exist (make it, or give another path)")
    if not os.path.lexists(path):
        return
    try:
        with np.load(path) as held:
            keys = set(held.files)
    except (OSError, ValueError):  # (not an .npz)
        keys = set()
    if keys != {"mu", "sigma"}:
        raise BigbatchError(f"--npz {path} exists and holds other than mu and sigma: give another name")


def _images(path: str, resolution: int | None, options: dict) -> object:
    """stats of images as eval reads them as B: a folder, .zip, .tar, .npz or .npy, a URL prefix, a pattern of tar
    shards (pytorch-fid's --save-stats DIR, clean-fid's make_custom_stats: found from outside, refused; then shards'
    patterns and URL folders, which eval took), or None where `path` names a data file (DATA.h5, builtin:NAME)."""
    from bigbatch.data.tars import read_by_listing
    from bigbatch.metrics import holds_stats, open_images

    if path.startswith("builtin:") or _names_data_file(path):
        return None
    where = Location.of(path)
    if not (read_by_listing(where) or where.path.exists()):
        raise BigbatchError(
            f"{path} does not exist; give a DATA.h5, builtin:NAME, or a folder, .zip, .tar, .npz or .npy of images "
            "(or their URL, or a pattern of tar shards)"
        )
    if not where.url and where.path.is_file() and holds_stats(where.path):
        raise BigbatchError(f"{path} holds feature statistics already; give the images they are of")
    if resolution is not None:
        raise BigbatchError(
            f"--resolution is for builtin data sets; {path}'s images are read at their own sizes: leave it out"
        )
    return open_images(where, options)


def _names_data_file(path: str) -> bool:
    """Whether `path` (a URL's without its query) names an HDF5 data file by its ending."""
    return path.split("?", 1)[0].lower().endswith((".h5", ".hdf5"))


def _is_data_file(path: str) -> bool:
    """What `info` reads as a data file: one named so, or any URL (info describes no other remote thing)."""
    return _names_data_file(path) or "://" in path


def run_info(args: argparse.Namespace) -> None:
    if args.skipped and not _is_data_file(args.path):
        raise BigbatchError(f"--skipped lists the files a data file's prepare skipped; give a DATA.h5, not {args.path}")
    if _is_data_file(args.path):
        from bigbatch.data.h5describe import describe_data
        from bigbatch.data.hdf5 import read_skipped, verify_data

        options = endpoint_options(args.endpoint_url)
        if args.skipped:  # (each line the file's name, a tab, the reason: for grep, cut and sort)
            rows = read_skipped(args.path, options)
            if rows is None:
                raise BigbatchError(
                    f"{args.path} keeps the first five files its prepare skipped, not every one (it was written by an "
                    "older bigbatch): `bigbatch info` names them; prepare it again for the whole list"
                )
            print("".join(f"{name}\t{why}\n" for name, why in rows), end="")  # (written with their escapes)
            return
        print(describe_data(args.path, options))
        if args.verify:
            print(f"content hash verified: {verify_data(args.path, options)}")
        return
    from bigbatch.info import describe_run

    if args.path.startswith("builtin:") or not Path(args.path).exists():
        what = "is a data set made when read, not a file" if args.path.startswith("builtin:") else "does not exist"
        raise BigbatchError(
            f"{args.path} {what}; give a run directory, one of its checkpoints/<kimg> folders, a DATA.h5 file, or "
            "a file bigbatch export wrote (.onnx, .pt, .pt2, .dfm)"
        )
    from bigbatch.checkpoint_find import find_checkpoint, holds_checkpoints, run_named

    if Path(args.path).is_file() and not holds_checkpoints(Path(args.path)):
        return _export_info(Path(args.path), args.verify)
    if holds_checkpoints(Path(args.path)):  # (RUN/checkpoints/latest names RUN: found by review, --verify called it
        args.path = str(run_named(args.path))  # damaged)
    elif Path(args.path).is_dir():  # a folder of DFL's aligned faces
        from bigbatch.faces.face_set import describe_faces

        if (faces := describe_faces(Path(args.path))) is not None:
            print(faces)
            return
    if not args.verify:
        print(describe_run(args.path))
        return
    from bigbatch.info import verify_run

    if not holds_checkpoints(Path(args.path)):  # (found from outside: an empty folder was a damaged checkpoint)
        find_checkpoint(args.path)  # (raises, saying what it is: a sweep's folder, a DFL model, neither)
    try:
        print(describe_run(args.path))
    except BigbatchError:  # (a run with no intact checkpoint to describe): verify names every damaged one
        pass
    print(verify_run(args.path))


def _export_info(path: Path, verify: bool) -> None:
    """`info` of a file bigbatch export wrote: its settings (found from outside: \"neither a run directory nor a
    checkpoint folder\", with no word of what info reads)."""
    from bigbatch.export import read_settings

    settings = read_settings(path)
    if settings is None and path.suffix.lower() in (".onnx", ".dfm", ".pt", ".pt2"):  # (found from outside: a file
        # cut short was "none of what info reads")
        raise BigbatchError(
            f"{path} holds no settings of a bigbatch export (cut short or damaged, or not written by bigbatch "
            "export); info reads a run directory, one of its checkpoints/<kimg> folders, a DATA.h5 file or an export"
        )
    if settings is None:
        raise BigbatchError(
            f"{path} is none of what info reads: a run directory, one of its checkpoints/<kimg> folders, a DATA.h5 "
            "file or a file bigbatch export wrote"
        )
    if verify:
        raise BigbatchError(f"--verify checks a run's checkpoints or a data file's images; {path} is an export")
    print(f"export      {path}")
    for key, value in settings.items():
        if isinstance(value, list):
            value = ", ".join(map(str, value[:10])) + (f", ... ({len(value)})" if len(value) > 10 else "")
        print(f"{key:<11} {'-' if value is None else value}")  # (found from outside: "face_type   None")


def next_steps(args: argparse.Namespace, report: Any) -> None:
    """What `bigbatch prepare` says to do with the data file it wrote (the command that trains on it)."""
    import shlex

    from bigbatch.data.labels import is_class_list

    out = shlex.quote(args.out)
    if args.endpoint_url and is_url(args.out):  # (found from outside: the hint's command missed the endpoint)
        out += " " + shlex.quote(f"data.storage_options={{endpoint_url={json.dumps(args.endpoint_url)}}}")
    side = report.shape[0] if report.shape else None  # the preset's resolution, or the one to give

    def at(default: int) -> str:
        return f" data.resolution={side}" if side and side != default else ""

    def classifier(size: str) -> str:  # (held out of the data itself: the preset's own validation set is another's)
        held_out = "'data.val_path=\"\"' data.val_fraction=0.1"
        return f"bigbatch train --preset fashion_resnet data.path={out}{size} {held_out}"

    whole = args.crop == "none" or args.buckets  # (images of their own shapes: a classifier's)
    if args.masks in ("labels", "xseg-applied"):  # XSeg's labels (at 256 px: found from outside, a hint refused)
        print(
            f"train XSeg on it with: bigbatch train --preset xseg data.path={out}"
            if side == 256
            else f"XSeg trains on 256 px faces: prepare them again with --resolution 256 (these are {side} px)"
        )
    elif args.masks and side and (side % 32 or not 64 <= side <= 640):  # (found from outside: a hint refused)
        fit = min(max(side // 32 * 32, 64), 640)  # (the presets' archis, -ud, take multiples of 32)
        print(f"saehd128's archi (liae-ud) trains faces of a multiple of 32 px in 64..640: --resolution {fit}")
    elif args.masks:  # face masks: a face set, one side of a swap
        swap = f"bigbatch train --preset saehd128 data.path={out} data.dst_path=DST.h5{at(128)}"
        # (found from outside: the dst faces were named as src, the only way the hint gave)
        print(f"train a face swap on it with: {swap} (as the dst faces: data.path=SRC.h5 data.dst_path={out})")
    # (the classes of a training file's, or rectangles: a held-out split; a .txt of names, as ImageNet's synset
    # mapping names training shards' .cls indices, is no sign of one: found from outside, called a validation set)
    elif args.buckets or (args.classes and not is_class_list(args.classes)):
        print(f"score a classifier on it with: data.val_path={out}{' data.val_rect=true' if args.buckets else ''}")
    elif whole or (side and side & (side - 1)):  # (a GAN is built for a power of two: a classifier takes any size)
        if len(report.class_names) >= 2:
            size = f" data.resolution={min(trained_side(args, report), 224)}" if whole and args.resolution else at(0)
            print(f"train a classifier on it with: {classifier(size)}")
            if args.labels:  # (found from outside: ImageNet's val, labelled by its CSV, was given the training hint)
                print(f"or, held-out images, score a classifier on it with: data.val_path={out}")
        if side:
            power = 1 << side.bit_length() - 1
            print(f"a GAN needs a side that is a power of two: prepare again with --resolution {power}")
    else:
        print(f"train on it with: bigbatch train data.path={out}{at(32)}")
        if len(report.class_names) >= 2:  # (found from outside: class folders were given the GAN's hint alone)
            print(f"or a classifier: {classifier(at(0))}")


def trained_side(args: argparse.Namespace, report: Any) -> int:
    """The side a classifier trains the whole images prepare wrote at: the one asked, or where some were kept below
    it, training's own rule (load.stored_side: found from outside, the hint's side warned of at the run's start)."""
    if not report.below:
        return args.resolution
    from bigbatch.data.load import load_data, stored_side

    return stored_side(load_data(args.out, args.resolution, storage_options=endpoint_options(args.endpoint_url)))


def checkpoint_named(args: argparse.Namespace) -> None:
    """--checkpoint (eval, predict, export): "latest" unless given; given, it names one of a run directory (found
    from outside: `--checkpoint latest` of a checkpoint folder scored that folder, without a word)."""
    if "checkpoint" not in args:
        return
    where = getattr(args, "run", None) or getattr(args, "path", None)
    if args.checkpoint is not None and where and (Path(where) / "meta.json").is_file():
        raise BigbatchError(
            f"{where} is a checkpoint already: --checkpoint {args.checkpoint} names one of a run directory"
        )
    args.checkpoint_given = args.checkpoint is not None  # (eval of images refuses even "latest": found from outside)
    args.checkpoint = args.checkpoint or "latest"
