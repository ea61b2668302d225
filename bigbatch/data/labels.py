"""Labels from a file for a flat folder of images (ImageNet's validation set as it comes): `prepare
--labels FILE.csv [--classes TRAIN.h5]`. Each row names a file (its path under the source, or a longer one
ending in it, its name, or its name without extension) and its class (the second column, spaces included; the
first word of it under ImageNet's header `ImageId,PredictionString`, so LOC_val_solution.csv reads as it is);
class indices follow the training file's class names."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import unicodedata
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import numpy as np
from PIL import Image

from bigbatch.data.listing import IMAGE_ENDINGS, by_ending
from bigbatch.data.sources import Listing, list_source
from bigbatch.errors import BigbatchError
from bigbatch.urls import Location, is_url, public_name


def read_labels(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, str]:
    """{file name as written: class name} from a CSV of `file,label` rows (a header row is skipped: one whose
    label column reads `label`, `class`, `synset`, or ImageNet's `PredictionString`, after which a label is
    the first word of its column: the synset before the boxes)."""
    import fsspec

    try:
        with fsspec.open(path, "rb", **(storage_options or {})) as f:
            text = f.read().decode("utf-8-sig")
    except FileNotFoundError:
        raise BigbatchError(f"labels file {public_name(path)} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BigbatchError(f"cannot read labels file {public_name(path)}: {e}") from None
    except Exception as e:  # noqa: BLE001 -- s3fs/botocore errors have no common base (found from outside: tracebacks)
        raise BigbatchError(
            f"cannot read labels file {public_name(path)}: {type(e).__name__}: {e} (check the URL, the credentials and "
            "the endpoint)"
        ) from None
    out: dict[str, str] = {}
    first_word = False
    try:  # (newline="": a file of old Mac line ends, or one edited across systems, found from outside a traceback)
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise BigbatchError(f"labels file {public_name(path)} is not CSV Python reads ({e}): save it as CSV") from None
    for i, row in enumerate(rows):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 2 or not row[1].split():
            raise BigbatchError(
                f"labels file {public_name(path)}, line {i + 1}: expected `file,label`, got {','.join(row)!r}"
            )
        name, label = row[0].strip(), row[1].strip()
        if i == 0 and label.lower() in ("label", "class", "predictionstring", "synset"):
            first_word = label.lower() == "predictionstring"
            continue
        if first_word:
            label = label.split()[0]
        if name in out and out[name] != label:
            raise BigbatchError(
                f"labels file {public_name(path)} gives {name} two labels ({out[name]} and {label}); keep one"
            )
        out[name] = label
    if not out:
        raise BigbatchError(f"labels file {public_name(path)} holds no `file,label` rows")
    return out


def labelled_by(
    listing: Listing, table: dict[str, str], names: list[str] | None, what: str
) -> tuple[Listing, list[tuple[str, str]]]:
    """The listing labelled by `table` (`relabel`; `what` names it), and the files to skip with why: those it does
    not label, and the labels of no file."""
    labelled, unlabelled, missing = relabel(listing, table, names, what)
    left_out = set(listing.left_out)
    for name in missing:  # (found from outside: a labelled file left out by its ending was "not in the source")
        why = f"in the source, but no image by its ending ({IMAGE_ENDINGS}): rename it" if name in left_out else ""
        unlabelled.append((f"{name} (in {what})", why or "labelled, but not in the source"))
    return labelled, unlabelled


def label_order(names: set[str]) -> list[str]:
    """Class names as their indices follow them without a training file: sorted, as numbers where all are whole
    numbers (found from outside: `file,10` before `file,2` as text, unlike WebDataset's .cls and what a user
    numbering classes meant)."""
    numbers = all(n.isascii() and n.isdigit() and str(int(n)) == n for n in names)
    return sorted(names, key=int) if numbers else sorted(names)


def relabel(
    listing: Listing, labels: dict[str, str], class_names: list[str] | None, what: str
) -> tuple[Listing, list[tuple[str, str]], list[str]]:
    """`listing` with the labels of `labels` (class indices in `class_names`' order, or the sorted label
    names; a class named as class_index takes it): (the labelled files, the files without a label with a reason
    each, the labelled names no file matches)."""
    names = label_order(set(labels.values())) if class_names is None else list(class_names)
    index = class_index(names)
    unknown = sorted(v for v in set(labels.values()) if nfc(v) not in index)
    if unknown:
        raise BigbatchError(
            f"{what} names classes the training data has not ({_few(unknown)}): fix the labels, or give with "
            "--classes the training file whose classes they are"
        )
    tails: dict[str, str] = {}  # (a row naming its file by a longer path, absolute or from the working folder: found
    for k in labels:  # from outside, "no label" for every file)
        parts = PurePosixPath(k.replace("\\", "/")).parts
        for n in range(1, len(parts)):
            tail = "/".join(parts[-n:])
            tails[tail] = k if tails.get(tail, k) == k else ""  # ("": rows of two paths end so; review)
    keys = [next((k for k in (rel, PurePosixPath(rel).name, PurePosixPath(rel).stem) if k in labels), tails.get(rel))
            for rel in listing.names]  # fmt: skip
    if (rel := next((r for r, k in zip(listing.names, keys) if k == ""), None)) is not None:
        rows = [k for k in labels if k.replace("\\", "/").endswith("/" + rel)]
        raise BigbatchError(f"{what} names {rel} by two paths ({_few(rows)}): keep the row of the source's file")
    files: dict[str, list[str]] = {}
    images = {e.lower() for e in Image.registered_extensions()}  # (an image's .xml or .txt beside it is not one)
    for rel, key in zip(listing.names, keys):
        if key is not None and PurePosixPath(rel).suffix.lower() in images:
            files.setdefault(key, []).append(rel)
    shared = next(((k, rels) for k, rels in files.items() if len(rels) > 1), None)
    if shared:  # (one row would label several files, whatever they show)
        key, rels = shared
        raise BigbatchError(
            f"{what} names {key}, which matches {len(rels)} files ({_few(rels)}): "
            "give each file's path under the source in its row"
        )
    keep, found, unlabelled, used = [], [], [], set()
    for i, rel in enumerate(listing.names):
        key = keys[i]
        if key is None:
            unlabelled.append((rel, f"no label in {what}"))
            continue
        keep.append(i)
        found.append(index[nfc(labels[key])])
        used.add(key)
    missing = sorted(set(labels) - used)
    out = replace(
        listing,
        keys=[listing.keys[i] for i in keep],
        names=[listing.names[i] for i in keep],
        labels=np.asarray(found, np.int64),
        class_names=names,
        outside=[],
    )
    return out, unlabelled, missing


def nfc(name: str) -> str:
    """A class name in Unicode's composed form (NFC), as names are matched: the same text, as macOS's file names
    (decomposed) and others write it, is one class."""
    return unicodedata.normalize("NFC", name)


def class_index(names: list[str]) -> dict[str, int]:
    """{name: index} of class names, each also by its first word where those are unique: the synset of a line of
    ImageNet's LOC_synset_mapping.txt ("n01440764 tench, Tinca tinca") names its class folder and its labels, from
    the text file or from a training file prepared with it (found from outside: the second was refused)."""
    names = [nfc(n) for n in names]  # (found from outside: macOS's decomposed é did not match the training file's)
    index = {n: i for i, n in enumerate(names)}
    firsts = [n.split(maxsplit=1)[0] if n.strip() else n for n in names]
    if len(set(firsts)) == len(firsts):
        for i, first in enumerate(firsts):
            index.setdefault(first, i)
    return index


def renumber(listing: Listing, class_names: list[str], what: str) -> Listing:
    """`listing`'s class folders numbered by their place in `class_names` (a training file's classes, named as
    class_index takes them), so that a validation set lacking a class keeps the indices of the others."""
    index = class_index(class_names)
    unknown = [n for n in listing.class_names if nfc(n) not in index]
    if unknown:
        raise BigbatchError(
            f"class folder{'s' * (len(unknown) > 1)} {_few(unknown)} "
            f"of the source {'are not classes' if len(unknown) > 1 else 'is not a class'} of {what}: rename "
            f"{'them' if len(unknown) > 1 else 'it'} as the training set's class, or leave out --classes"
        )
    mapping = np.asarray([index[nfc(n)] for n in listing.class_names], np.int64)
    return replace(listing, labels=mapping[listing.labels], class_names=list(class_names))


def _few(names: list[str]) -> str:
    """The first three of `names` for a message, and "..." when there are more."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def name_indices(listing: Listing, names: list[str], classes: str) -> Listing:
    """Class indices as the source gave them (WebDataset's .cls), named by the training file's classes."""
    top = int(listing.labels.max(initial=-1))
    if top >= len(names):
        raise BigbatchError(
            f"the source's class indices (.cls, ADA's dataset.json) run to {top}, and --classes "
            f"{public_name(classes)} has {len(names)} classes (0 to {len(names) - 1}): give the training file these "
            "images' classes come from"
        )
    return dataclasses.replace(listing, class_names=list(names))


def training_classes(classes: str, storage_options: dict[str, Any] | None) -> list[str]:
    """The class names of the training data file `classes`, in its order (or of a text file, a class a line)."""
    from bigbatch.data.hdf5 import read_meta

    if is_class_list(classes):
        return class_list(classes, storage_options)
    if classes.startswith("builtin:"):  # (a run trained on one: its held-out or other images, prepared in its order)
        from bigbatch.data.load import load_data

        return list(load_data(classes, 8).class_names)
    if not classes.lower().endswith((".h5", ".hdf5")) and not is_url(classes):  # (found from outside: a CSV was
        raise BigbatchError(  # "not an HDF5 file", the text list unnamed)
            f"--classes {public_name(classes)} is neither a data file (DATA.h5) nor a text file of class names "
            "(.txt, a name a line as ImageNet's LOC_synset_mapping.txt): give the training data or such a list"
        )
    names = read_meta(classes, storage_options)["class_names"]
    if not names:
        raise BigbatchError(f"--classes {public_name(classes)} has no classes (it was prepared unconditional)")
    return names


def is_class_list(classes: str) -> bool:
    """Whether --classes names a text file of class names (not a data file's)."""
    return classes.lower().endswith(".txt")


def class_list(path: str, storage_options: dict[str, Any] | None) -> list[str]:
    """Class names a line each (blank lines left out; ImageNet's LOC_synset_mapping.txt as it comes)."""
    import fsspec

    try:
        with fsspec.open(path, "rb", **(storage_options or {})) as f:
            lines = f.read().decode("utf-8-sig").splitlines()
    except FileNotFoundError:
        raise BigbatchError(f"--classes {public_name(path)} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BigbatchError(f"cannot read --classes {public_name(path)}: {e}") from None
    names = [line.strip() for line in lines if line.strip()]
    seen: set[str] = set()
    twice = next((n for n in names if n in seen or seen.add(n)), None)
    if not names or twice is not None:
        why = f"names {twice!r} twice" if twice is not None else "holds no class names"
        raise BigbatchError(f"--classes {public_name(path)} {why}: give one class name a line, each once")
    return names


ADA_LABELS = "dataset.json"  # StyleGAN2-ADA's dataset_tool.py: its labels, beside shard folders of 1,000 images


def ada_dataset(
    listing: Listing, source: Location, storage_options: dict[str, Any] | None
) -> tuple[Listing, dict[str, str] | None, list[str]] | None:
    """A StyleGAN2-ADA data set (a zip or folder dataset_tool.py wrote: `dataset.json` at the top holding a "labels"
    key, left out of `listing` by its ending; the images in folders of 1,000, which are no classes): its images,
    listed again whole, the labels `dataset.json` gives them (`{"labels": [[name, class index], ...]}`) as a table
    for `relabel`, and its classes, named by their indices, "0" to the largest, as ADA counts them; None for the
    table where it gives none (`null`: unconditional). None for any other source, a `dataset.json` of another
    tool's among them (found from outside: an ADA set's shard folders were classes, its labels dropped)."""
    if listing.indexed or ADA_LABELS not in listing.left_out:
        return None
    flat = list_source(source, storage_options, classes=False)
    at = next((i for i, name in enumerate(flat.names) if name == ADA_LABELS), None)
    raw = flat.source.read([flat.keys[at]])[0] if at is not None else ""
    try:
        record = json.loads(raw) if isinstance(raw, bytes) else None
    except ValueError:
        record = None
    if at is None or not isinstance(record, dict) or "labels" not in record:  # (another tool's file: not ADA's set)
        return None
    keep = [i for i in range(len(flat.names)) if i != at]
    names, keys = [flat.names[i] for i in keep], [flat.keys[i] for i in keep]
    images = by_ending(replace(flat, keys=keys, names=names, labels=flat.labels[keep]), source.name)
    rows = record["labels"]
    if rows is None:
        return images, None, []
    if (
        not isinstance(rows, list)
        or not rows
        or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and type(r[1]) is int and r[1] >= 0
            for r in rows
        )
    ):
        raise BigbatchError(
            f'{ADA_LABELS} of the source is not StyleGAN2-ADA\'s labels ({{"labels": [[file, class index], ...]}} '
            "or null): mend it, or give --labels FILE.csv"
        )
    return images, {r[0]: str(r[1]) for r in rows}, [str(c) for c in range(max(r[1] for r in rows) + 1)]
