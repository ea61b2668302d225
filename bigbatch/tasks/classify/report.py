"""`bigbatch eval RUN [DATA]` for a classify run: its classifier scored on DATA (default: the run's
held-out split) at the resolution it last trained at, with the run's validation crops: top-1, top-5
and loss, per-class accuracy, the confusion matrix (CSV and PNG) and a sheet of the images it got
most wrong, under RUN/eval/<data>-<checkpoint>/."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from bigbatch import checkpoints
from bigbatch.checkpoint_find import holds_checkpoints, read_picked
from bigbatch.config import Config
from bigbatch.data.h5describe import image_names
from bigbatch.data.load import load_data, stored_images, stored_side, validation_data
from bigbatch.data.schedule import resolution_scored
from bigbatch.data.split import holdout
from bigbatch.data.tars import is_tar_name, shards_named
from bigbatch.errors import BigbatchError, counted, warn
from bigbatch.files import atomic_write, save_figure
from bigbatch.metrics.classifier import load_classifier
from bigbatch.run_data import eval_folder, run_config
from bigbatch.sampling import BLACK, GREEN, RED, captioned_sheet, save_png
from bigbatch.tasks.classify.inference import check_tta
from bigbatch.tasks.classify.validation import Predictions, Validation, check_classes, scores_top5
from bigbatch.urls import Location, public_name

TOP_LOSSES = 16
MOST_CONFUSED = 20  # pairs of classes metrics.json lists (eval prints the first 3)


def evaluate_classifier(
    run: str | Path,
    data_path: str | None = None,
    which: str = "latest",
    device: str | torch.device = "cpu",
    tta: bool | None = None,
    resolution: int | None = None,
    endpoint_url: str | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """Score a classify run's classifier; write RUN/eval/<data>-<checkpoint>/ (metrics.json, per_class.csv,
    confusion.csv, confusion.png, top_losses.png; `tta`: each image's prediction averaged with its mirror
    image's, in <data>-tta-<checkpoint>/ (None: as the run's eval.tta scored it); `resolution`: scored at that side
    instead of eval.resolution's or where it last trained, in <data>-<side>px-<checkpoint>/) and return the metrics.
    `endpoint_url`: the S3 endpoint to read the data from, in place of the run's data.storage_options' (their other
    options kept). `batch_size`: images scored at once (default the run's eval.batch_size), as timm's validate.py
    -b."""

    def read(ckpt: Path) -> tuple[Path, Config, Any]:
        cfg = run_config(ckpt, endpoint_url)
        if cfg.task != "classify":
            raise BigbatchError(f"{ckpt} is a {cfg.task} run, not a classifier")
        if cfg.train.labels == "rotation":
            raise BigbatchError(f'{run} learned rotations (train.labels = "rotation"): eval scores class labels only')
        return ckpt, cfg, load_classifier(ckpt, device)

    ckpt, cfg, net = read_picked(run, which, read)  # (a run's latest pruned meanwhile: its newest)
    tta = cfg.eval.tta if tta is None else tta  # (found from outside: a run scored with TTA was evaluated without)
    if tta:
        check_tta(cfg, run)
    d = cfg.data
    if data_path is None:
        data = validation_data(cfg)
        if data is None:
            raise BigbatchError(
                f"{run} has no held-out split (data.val_path, data.val_fraction): give DATA to score on"
            )
        _check_held_out(cfg, ckpt, data)
        name, trained_on = "heldout", 0
    else:
        # A folder of class folders, a tar or shards of images (found from outside: "cannot open data set").
        source = Location.of(data_path)
        zipped = source.text.lower().endswith(".zip")  # (found from outside: a zip had the generic refusal)
        if holds_checkpoints(Path(data_path)):  # (found from outside: a GAN run, its samples, "holds images")
            raise BigbatchError(
                f"{data_path} is a run, not data: `bigbatch eval RUN DATA` scores the classifier RUN on DATA, a "
                "prepared data set (.h5) or builtin:NAME"
            )
        if Path(data_path).is_dir() and not any(Path(data_path).iterdir()):  # (found from outside: "holds images")
            raise BigbatchError(f"{data_path} is an empty folder: give a data set prepared of the images to score")
        if Path(data_path).is_dir() or is_tar_name(source.text) or zipped or shards_named(source) is not None:
            # (--classes: the run's class order; --codec png: lossless, found from outside; class names no folder
            # can carry: --labels; predict's probabilities of the files differ a little, said: found from outside)
            slash = [c for c in net.class_names if "/" in c]
            labels = (
                f" (class names such as {slash[0]!r} cannot be folders: put the images in one folder and name their "
                "classes with --labels FILE.csv, rows of file,label)"
                if slash
                else ""
            )
            raise BigbatchError(
                f"{data_path} holds images: a classifier scores a prepared data set; write one with: bigbatch prepare "
                f"{shlex.quote(data_path)} scored.h5 --classes {shlex.quote(d.path)} --codec png --crop none "
                f"--resolution {d.resolution}, then eval it{labels} (its loss is close to, not equal to, predict's "
                "on the files: prepare stores them resized to the run's resolution, predict resizes each file "
                "straight to the network's input)"
            )
        data = load_data(data_path, d.resolution, storage_options=d.storage_options or None)
        trained_on = _say_trained_on(cfg, ckpt, data, data_path, run)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(data_path.removeprefix("builtin:")).stem) or "data"
    # (found from outside: the fix unsaid for a test set that lacks some of the run's classes; and said for one of
    # none of them, where numbering its classes as the run's would label digits as Fashion-MNIST's)
    fix = (
        f"prepare it again with --classes {shlex.quote(d.path)} (the run's training data, or a text file of its "
        "class names), which numbers its classes as the run's, or score data of the run's classes"
        if set(data.class_names) & set(net.class_names)
        else "none of its classes is one of the run's: give images of the run's classes"
    )
    check_classes(data, net.class_names, "the run", fix)
    given = resolution
    resolution = given or resolution_scored(cfg, int((checkpoints.read_meta(ckpt) or {}).get("nimg", 0)))
    stored = stored_side(data)
    if stored and stored < resolution:  # (whole images' short side too: found from outside)
        where = "" if given or cfg.eval.resolution else ", where it last trained"
        warn(
            f"data set {public_name(data_path or d.val_path or d.path)} holds {stored_images(data, stored)}, and the "
            f"run scores at {resolution}px{where}: they are upscaled, no sharper than at their own size"
        )
    device = next(net.parameters()).device
    validation = Validation(
        data, lambda: resolution, batch_size or cfg.eval.batch_size, d.val_crop, d.val_rect, "fp32", device
    )
    predicted = validation.predictions(net, tta)
    name += (f"-{given}px" if given else "") + ("-tta" if tta else "")
    report = classification_report(predicted, list(net.class_names))
    source = public_name(data_path) if data_path else f"{public_name(d.val_path or d.path)} (held out)"
    data_hash = getattr(data, "content_hash", None) if data_path else None  # (the held-out split's name is the run's)
    out = eval_folder(run, ckpt, name, source, data_hash)
    report.update(
        data=source,
        data_hash=data_hash,
        checkpoint=str(ckpt),
        resolution=resolution,
        crop=d.val_crop,
        rect=d.val_rect,
        tta=tta,
        trained_on=trained_on,  # (found from outside: said on stderr alone, a script could not tell)
        folder=str(out),
    )
    _write(out, report, predicted, validation, resolution, list(net.class_names))
    return report


def _say_trained_on(cfg: Config, ckpt: Path, data: Any, data_path: str, run: str | Path) -> int:
    """Warn where DATA holds images the run trained on: its score is then no held-out one (found from outside: the
    run's own training file, given as DATA, scored 91.8% without a word; fastai's validate scores what it is given,
    as this does). Returns how many it trained on (0: none of them, as far as the run recorded)."""
    meta = checkpoints.read_meta(ckpt) or {}
    trained, given = str((meta.get("data") or {}).get("content_hash", "")), str(data.content_hash)
    if trained == given:
        part = len(data)
    elif trained.startswith(f"{given}[train:"):  # (the file the run cut its held-out split from)
        part = len(holdout(data, cfg.data.val_fraction, val_path=True)[0])
    else:
        return 0
    # (found from outside: a run that had seen 5% of them was said to have trained on all; an epoch is a permutation)
    trained_on = part = min(part, int(meta.get("nimg", part)))
    part = f"all {part} of its images" if part == len(data) else f"{part} of its {len(data)} images"
    held = (
        f"; `bigbatch eval {run}` scores the images held out in training"
        if cfg.data.val_path or cfg.data.val_fraction
        else ""
    )
    warn(
        f"{public_name(data_path)} is the data the run trained on: {part} were trained on, so this score is not a "
        f"held-out one{held}"
    )
    return trained_on


def _check_held_out(cfg: Config, ckpt: Path, held_out: Any) -> None:
    """Refuse a held-out split of data.val_fraction cut from other images than the run trained on: it would
    hold images the run trained on (a data.val_path file is apart from the training data either way)."""
    if cfg.data.val_path:
        return
    trained = (checkpoints.read_meta(ckpt) or {}).get("data")
    parent = getattr(held_out, "data", None)
    if not isinstance(trained, dict) or parent is None:
        return  # a checkpoint from before data identities were recorded
    now = str(holdout(parent, cfg.data.val_fraction, val_path=True)[0].content_hash)  # the training split, as recorded
    if trained.get("content_hash") != now:
        raise BigbatchError(
            f"data {public_name(cfg.data.path)} holds other images than the run was trained on (content hash "
            f"{now[:16]}…, the checkpoint recorded {str(trained.get('content_hash'))[:16]}…): "
            "its held-out split is not the one held out in training; give the data to score as DATA "
            "(bigbatch eval RUN DATA)"
        )


def classification_report(predicted: Predictions, class_names: list[str]) -> dict[str, Any]:
    """metrics.json's scores of `predicted`: top-1/5, loss, and per class accuracy, precision and F1, their macro
    mean (sklearn's classification_report: over the classes with images or predicted), the confusion matrix."""
    labels, top = predicted.labels, predicted.top.long()
    n, k = len(labels), len(class_names)
    hits = top == labels[:, None]
    confusion = torch.bincount(labels * k + top[:, 0], minlength=k * k).view(k, k)
    counts, called = confusion.sum(1), confusion.sum(0)  # (images of each class; images predicted as each)
    right = confusion.diagonal().double()
    per_class, precision = right / counts.clamp(min=1), right / called.clamp(min=1)
    # (sklearn's classification_report, fastai's print_classification_report: F1 0 where nothing is right, and for
    # a class of no image that is predicted; found from outside: such a class was left out of the mean, raising it)
    f1 = [_f1(per_class[i].item(), precision[i].item()) if counts[i] or called[i] else None for i in range(k)]
    scored = [v for v in f1 if v is not None]
    return {
        "n": n,
        "top1": round(100 * hits[:, 0].double().mean().item(), 4) if n else float("nan"),
        # (of 5 classes or fewer always 100: left out, as training's scores leave it; found from outside, written)
        **(
            {"top5": round(100 * hits.any(1).double().mean().item(), 4) if n else float("nan")}
            if scores_top5(k)
            else {}
        ),
        "loss": round(predicted.loss.double().mean().item(), 6) if n else float("nan"),
        # A class the data holds no image of has no accuracy (null; an empty cell in per_class.csv).
        "per_class": {c: round(100 * per_class[i].item(), 4) if counts[i] else None for i, c in enumerate(class_names)},
        # (a fastai user's classification report, found missing from outside: precision, where any image was called
        # the class, and F1; their mean, macro_f1)
        "precision": {c: round(100 * precision[i].item(), 4) if called[i] else None for i, c in enumerate(class_names)},
        "f1": dict(zip(class_names, f1)),
        "macro_f1": round(sum(scored) / len(scored), 4) if scored else float("nan"),
        "most_confused": _most_confused(confusion, class_names),
        "confusion": confusion.tolist(),
    }


def _f1(recall: float, precision: float) -> float:
    """F1 in percent of a recall and a precision in [0, 1]: their harmonic mean, 0 where either is."""
    return round(200 * recall * precision / (recall + precision), 4) if recall * precision else 0.0


def _most_confused(confusion: torch.Tensor, class_names: list[str], shown: int = MOST_CONFUSED) -> list[list[Any]]:
    """fastai's interp.most_confused(): [true class, predicted class, images], the largest off the diagonal first
    (ties in class order), those of at least one image, at most `shown`."""
    off = confusion.clone()
    off.fill_diagonal_(0)
    k = len(class_names)
    cells = sorted((-int(n), i) for i, n in enumerate(off.flatten().tolist()) if n)[:shown]
    return [[class_names[i // k], class_names[i % k], -n] for n, i in cells]


def _write(
    out: Path,
    report: dict[str, Any],
    predicted: Predictions,
    validation: Validation,
    resolution: int,
    class_names: list[str],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    confusion = report["confusion"]
    atomic_write(
        out / "metrics.json", json.dumps({k: v for k, v in report.items() if k != "confusion"}, indent=1) + "\n"
    )
    columns = ("per_class", "precision", "f1")  # (a class without images: empty cells)
    atomic_write(out / "per_class.csv", _csv([["class", "images", "accuracy", "precision", "f1"]] + [
        [c, sum(confusion[i]), *("" if report[key][c] is None else report[key][c] for key in columns)]
        for i, c in enumerate(class_names)
    ]))  # fmt: skip
    atomic_write(out / "confusion.csv", _csv([["true \\ predicted", *class_names]] + [
        [c, *confusion[i]] for i, c in enumerate(class_names)
    ]))  # fmt: skip
    save_figure(_confusion_figure(confusion, class_names), out / "confusion.png")
    order = predicted.loss.argsort(descending=True, stable=True)
    # Every image's prediction, the largest loss first (fastai's top_losses, with its indices; found from outside:
    # the worst images were a picture alone, and nothing named an image of an .h5 to look at or clean).
    places = getattr(validation.data, "indices", None)  # (a held-out split: its images' places in the file)
    index = predicted.index if places is None else places[predicted.index]
    names = image_names(validation.data) or [""] * len(validation.data)  # (a file prepared before names were kept)
    p_true = (-predicted.loss).exp()
    head = ["index", "file", "class", "predicted", "p_predicted", "p_class", "loss"]
    atomic_write(out / "predictions.csv", _csv([head] + [
        [int(index[j]), names[int(predicted.index[j])], class_names[int(predicted.labels[j])],
         class_names[int(predicted.top[j, 0])], f"{float(predicted.p_top[j]):.6g}", f"{float(p_true[j]):.6g}",
         f"{float(predicted.loss[j]):.6g}"]
        for j in order.tolist()
    ]))  # fmt: skip
    rows = []
    for j in order[:TOP_LOSSES].tolist():
        image, _ = validation.seen(int(predicted.index[j]), resolution)  # as the network saw it: crop, aspect
        label, pred, loss = int(predicted.labels[j]), int(predicted.top[j, 0]), float(predicted.loss[j])
        rows.append((image, label, pred, float(predicted.p_top[j]), math.exp(-loss), loss))
    save_png(top_losses_sheet(rows, class_names), out / "top_losses.png")


def _csv(rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows([[spreadsheet_cell(v) for v in row] for row in rows])
    return buffer.getvalue()


def spreadsheet_cell(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (= + - @, tab, CR first; OWASP's CSV injection) quoted by a
    leading ' (found from outside: class folders named "=HYPERLINK(...)" were written as they are); numbers kept."""
    if not isinstance(value, str) or not value.startswith(("=", "+", "-", "@", "\t", "\r")):
        return value
    return value if _NUMBER.fullmatch(value) else "'" + value


# A number as a spreadsheet reads one (found from outside: float() took "-inf", "+nan" and "-1_0", which a spreadsheet
# takes for formulas).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _confusion_figure(confusion: list[list[int]], class_names: list[str]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    k = len(class_names)
    size = min(24, 2 + 0.35 * k)
    fig, ax = plt.subplots(figsize=(size, size))
    rows = torch.tensor(confusion, dtype=torch.float64)
    shares = rows / rows.sum(1, keepdim=True).clamp(min=1)
    ax.imshow(shares.numpy(), cmap="Blues", vmin=0, vmax=1)
    if k <= 40:
        ax.set_xticks(range(k), class_names, rotation=90)
        ax.set_yticks(range(k), class_names)
        for i in range(k):
            for j in range(k):
                if confusion[i][j]:
                    ax.text(j, i, str(confusion[i][j]), ha="center", va="center", fontsize=7,
                            color="white" if shares[i, j] > 0.5 else "black")  # fmt: skip
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.tight_layout()
    return fig


def top_losses_sheet(
    rows: list[tuple[torch.Tensor, int, int, float, float, float]], class_names: list[str]
) -> Image.Image:
    """The images a classifier got most wrong, 4 a row, each over three lines: its true class (and the
    probability given to it), the prediction (and its probability): red where wrong, green where right (a right
    one given a low probability is among the top losses too), and its loss (as fastai's plot_top_losses)."""
    cells = [
        (
            img,
            [
                (f"true {p_true:.2f} {class_names[true]}", BLACK),
                (f"pred {p_pred:.2f} {class_names[pred]}", RED if pred != true else GREEN),
                (f"loss {loss:.2f}", BLACK),
            ],
        )
        for img, true, pred, p_pred, p_true, loss in rows
    ]
    return captioned_sheet(cells, ncol=4, min_cell=96)  # the probabilities first: a long name is what gets cut


def describe(report: dict[str, Any]) -> str:
    """The few lines `bigbatch eval` prints."""
    per_class = sorted(((c, a) for c, a in report["per_class"].items() if a is not None), key=lambda kv: kv[1])
    # (found from outside: classes every image of which was right were listed as "hardest")
    worst = ", ".join(f"{c} {a:.1f}%" for c, a in per_class[:3] if a < 100) or "none: every image right"
    absent = [c for c, a in report["per_class"].items() if a is None]
    if absent:
        worst += f"; no images of {counted(len(absent), 'class')} ({', '.join(absent[:5])}"
        worst += ", ...)" if len(absent) > 5 else ")"
    return "\n".join(
        [
            f"{report['data']}: {report['n']} images at {report['resolution']} px, checkpoint {report['checkpoint']}",
            f"top-1 {report['top1']:.2f}%  "
            + (f"top-5 {report['top5']:.2f}%  " if scores_top5(len(report["per_class"])) else "")
            + f"loss {report['loss']:.4f}",
            f"hardest classes: {worst}",
            "most confused: " + (", ".join(f"{t} as {p} ({n})" for t, p, n in report["most_confused"][:3]) or "none"),
            f"wrote {report['folder']}/: metrics.json (most_confused: fastai's), per_class.csv, confusion.csv, "
            "confusion.png, top_losses.png, predictions.csv (each image's, the largest loss first)",
        ]
    )
