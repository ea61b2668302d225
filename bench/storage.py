"""What each storage codec costs: bytes per image and decode time per image at 64, 128 and 256 px; one
process's images/s reading a 128-px phase from a 256-px store (raw, JPEG with the reduced-size decode)
against Pillow on the source JPEGs (open, center crop, resize); and a classifier's read, random-resized
crops at 224 and 128 px through bigbatch's Loader against the Pillow pipeline users write first.

    python bench/storage.py                  # 400 photos, one thread
    python bench/storage.py --n 2000 --out /tmp/codecs
    python bench/storage.py --prepare-n 100000 --workers 2   # prepare's rate and peak memory at 100k files
    python bench/storage.py --whole-side 352                  # crops from ImageNet's store (short side 352)

The photos are ImageNet-sized JPEGs (q90) cut from seven colour camera photographs that scikit-image
and scikit-learn ship (SOURCES: a portrait, a cat, a cup of coffee, a rocket on its pad, a
motorcycle, a palace roof, a flower), one class folder each: aspect ratio 3:4 (portrait) to 16:9,
short side 240-500 px (mean about 445x385; ImageNet's about 400x350), each cut at its own scale and
shrunk 1-2x, so that detail per pixel varies as in photos shrunk from a camera's, never enlarged
beyond 1.25x (enlarged photos compress unrealistically well). They take about 0.27 bytes a pixel
(46 KiB an image); ImageNet's files about 0.8 (110 KiB at about 400x350), as their authors saved
them: these scenes are cleaner than its average photo. Its decodes spend more of their time
entropy-decoding, which a reduced-size decode does not shorten (the Loader's advantage there is
smaller), while Pillow on its original files also decodes more bytes than a q90 store holds. Times
are process CPU seconds, so that other load on the machine does not count; one thread (torch and
OpenCV); the random-resized crops' readers take turns batch by batch, each batch's fastest of five
rounds counted."""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _args import at_least, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402

from bigbatch.data import H5Data, prepare, read_meta  # noqa: E402
from bigbatch.data.schedule import resize_stored  # noqa: E402 (the loader's resize of a store read below its size)

CODECS = [("raw", None), ("jpeg", 90), ("jpeg", 95), ("png", None), ("webp", 90)]


# The source photographs: scikit-image's (Eileen Collins, Chelsea the cat, a cup of coffee, a SpaceX
# rocket on its pad, the left view of Middlebury's stereo motorcycle) and scikit-learn's two (a roof of
# the Summer Palace, a dahlia). Each is a class folder of its own.
SOURCES = ("astronaut", "chelsea", "china", "coffee", "flower", "motorcycle", "rocket")


def source_photos() -> dict[str, Image.Image]:
    """The source photographs by name, RGB (640x427 and 741x500 at most: the sizes they ship at)."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    sample = dict(zip(("china", "flower"), load_sample_images().images))
    photos = {"astronaut": data.astronaut(), "chelsea": data.chelsea(), "coffee": data.coffee()}
    photos |= {"rocket": data.rocket(), "motorcycle": data.stereo_motorcycle()[0], **sample}
    return {name: Image.fromarray(photos[name]) for name in SOURCES}


def make_photos(root: Path, n: int, seed: int = 0) -> list[Path]:
    """`n` JPEGs (q90) of ImageNet's sizes cut from the source photographs, in turn, into a class folder
    per source; returned in the order `prepare` lists them. Aspect ratio log-uniform in 3:4..16:9 (a
    third of them portrait), short side uniform in 240..500 px, each a crop of its source shrunk by a
    factor log-uniform in 1..2 (LANCZOS); where the source is too small for that, the largest crop that
    fits, enlarged at most 1.25x (or a smaller short side). Mirrored at random."""
    rng = np.random.default_rng(seed)
    sources = source_photos()
    files = []
    for i in range(n):
        name = SOURCES[i % len(SOURCES)]
        src = sources[name]
        ratio = float(np.exp(rng.uniform(np.log(3 / 4), np.log(16 / 9))))  # width / height
        short, shrink = float(rng.uniform(240, 500)), float(np.exp(rng.uniform(0, np.log(2))))
        fits = min(src.width / ratio, src.height) if ratio >= 1 else min(src.width, src.height * ratio)
        shrink = max(min(shrink, fits / short), 1 / 1.25)  # the crop's short side is at most `fits`
        short = min(short, fits / shrink)
        out_w, out_h = (round(short * ratio), round(short)) if ratio >= 1 else (round(short), round(short / ratio))
        w, h = min(src.width, out_w * shrink), min(src.height, out_h * shrink)
        x, y = rng.uniform(0, src.width - w), rng.uniform(0, src.height - h)
        img = src.resize((out_w, out_h), Image.Resampling.LANCZOS, box=(x, y, x + w, y + h))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        files.append(folder / f"{i:05d}.jpg")
        img.save(files[-1], quality=90)
    return sorted(files)


def cpu_time(fn, repeat: int = 3) -> float:
    """Best of `repeat` process-CPU-time runs of fn()."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=positive_int, default=400, help="photos")
    parser.add_argument("--out", help="folder for the photos and data files (default: a temporary one)")
    parser.add_argument(
        "--prepare-n", type=at_least(0), default=0, help="instead: prepare's rate and memory on N small files"
    )
    parser.add_argument("--workers", type=at_least(0), default=2, help="prepare workers for --prepare-n")
    parser.add_argument(
        "--whole-side", type=positive_int, default=256, help="short side of the whole-image store for crops"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import cv2

    cv2.setNumThreads(0)  # one thread a side: OpenCV runs its resizes in the calling thread
    print(measured_on())
    if args.out:
        return measure(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="bench-codecs-") as tmp:  # (found from outside: 227 MB left in /tmp)
        return measure(args, Path(tmp))


def measure(args: argparse.Namespace, root: Path) -> None:
    """The tables, of files made under `root`."""
    if args.prepare_n:  # on its own, in a fresh process, so that its peak memory is prepare's
        print("| files | workers | prepare img/s | per worker | peak RSS (process or a worker) |")
        print("|---|---|---|---|---|")
        prepare_at_scale(root, args.prepare_n, args.workers)
        return
    # A folder of an earlier run's, --out, made of another --n: its photos and stores made again (found from outside:
    # the stores of 60 photos were measured under a header of 10, and the crops' check failed)
    made = root / "photos.n"
    if made.exists() and made.read_text().strip() != str(args.n):
        for stale in (root / "photos", *root.glob("*.h5")):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    files = make_photos(root / "photos", args.n)
    made.write_text(f"{args.n}\n")
    source_bytes = np.array([f.stat().st_size for f in files])
    sizes = np.array([Image.open(f).size for f in files])
    short, pixels = sizes.min(1), sizes.prod(1)
    print(
        f"{args.n} photos of {len(SOURCES)} sources, mean {sizes[:, 0].mean():.0f}x{sizes[:, 1].mean():.0f} (short "
        f"side {short.min()}-{short.max()}, mean {short.mean():.0f}; {(sizes[:, 0] < sizes[:, 1]).mean():.0%} "
        f"portrait), JPEG q90: {source_bytes.mean() / 1024:.1f} KiB an image, "
        f"{source_bytes.sum() / pixels.sum():.2f} bytes a pixel (ImageNet's: about 110 KiB at about 400x350, 0.8)"
    )

    rows = []
    batch = torch.from_numpy(np.linspace(0, args.n - 1, min(64, args.n)).round().astype(np.int64))  # every source
    for res in (64, 128, 256):
        for codec, quality in CODECS:
            out = root / f"{codec}{quality or ''}-{res}.h5"
            if not out.exists():
                prepare(str(root / "photos"), str(out), res, workers=0, codec=codec, quality=quality)
            meta = read_meta(out)
            per_image = meta.get("encoded_bytes", res * res * 3 * meta["count"]) / meta["count"]
            data = H5Data(out, in_ram=True)  # decode cost alone, not the disk
            ms = cpu_time(lambda d=data: d.get(batch)) / len(batch) * 1e3
            half = cpu_time(lambda d=data, r=res: resize_stored(d.get(batch, r // 2)[0], r // 2)) / len(batch) * 1e3
            name = codec + (f" q{quality}" if quality else "")
            rows.append((res, name, per_image, per_image / (res * res * 3), ms, half))

    print("\n| stored px | codec | KiB an image | of raw | decode ms/image | read at half size ms/image |")
    print("|---|---|---|---|---|---|")
    for res, name, b, frac, ms, half in rows:
        print(f"| {res} | {name} | {b / 1024:.1f} | {frac:.3f} | {ms:.3f} | {half:.3f} |")

    # A 128-px phase from a 256-px store, one process, images/s (CPU time): the store read and decoded
    # (reduced for JPEG) and resized, against Pillow on the source JPEGs.
    def pillow_folder() -> None:
        for f in (files[i] for i in batch.tolist()):
            with Image.open(f) as img:
                s = min(img.size)
                left, top = (img.width - s) // 2, (img.height - s) // 2
                img = img.convert("RGB").crop((left, top, left + s, top + s))
                np.asarray(img.resize((128, 128), Image.Resampling.BILINEAR))

    speeds = {"Pillow on the source JPEGs (crop, resize)": len(batch) / cpu_time(pillow_folder)}
    for codec, quality in (("raw", None), ("jpeg", 90)):
        data = H5Data(root / f"{codec}{quality or ''}-256.h5")
        speeds[f"bigbatch {codec}{f' q{quality}' if quality else ''} store at 256"] = len(batch) / cpu_time(
            lambda d=data: resize_stored(d.get(batch, 128)[0], 128)
        )
    base = speeds["Pillow on the source JPEGs (crop, resize)"]
    print("\n| reading a 128-px phase, one process | img/s (CPU) | vs Pillow |")
    print("|---|---|---|")
    for name, v in speeds.items():
        print(f"| {name} | {v:.0f} | {v / base:.2f}x |")
    random_resized_crops(root, files, args.whole_side)


def prepare_at_scale(root: Path, n: int, workers: int) -> None:
    """`prepare`'s rate (images/s, and per worker) and peak memory (this process and its workers) on `n`
    small synthetic JPEGs (64x48): memory must stay flat however many there are."""
    import resource

    folder = root / f"many-{n}"
    if not folder.exists():
        rng = np.random.default_rng(0)
        base = [Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)) for _ in range(16)]
        for i in range(n):
            sub = folder / f"c{i % 10}"
            sub.mkdir(parents=True, exist_ok=True)
            base[i % 16].save(sub / f"{i:07d}.jpg", quality=90)
    for w in sorted({0, workers}):
        out = root / f"many-{n}-{w}.h5"
        out.unlink(missing_ok=True)
        t = time.perf_counter()
        report = prepare(str(folder), str(out), 32, workers=w, codec="jpeg")
        seconds = time.perf_counter() - t
        peak = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        )
        rate = report.count / seconds
        print(f"| {n} | {w} | {rate:.0f} | {rate / max(1, w):.0f} | {peak / 1024:.0f} MiB |")


def random_resized_crops(root: Path, files: list[Path], side: int = 256, batch: int = 64, rounds: int = 5) -> None:
    """A classifier's training read in one process: random-resized crops (torchvision's: area 0.08..1,
    ratio 3/4..4/3) resized to 224 and 128 px, half of them mirrored, as batches of uint8 tensors, the
    same images, boxes (drawn for each image's own size) and flips on every side. bigbatch's Loader on
    a JPEG store of whole images (short side `side`, `--crop none`: each crop cut to its MCUs before
    decoding, at a reduced DCT scale where it allows, resized bicubic with antialiasing) against the
    Pillow pipeline users write first on the source JPEGs: torchvision's RandomResizedCrop,
    RandomHorizontalFlip and PILToTensor as Pillow calls run them (open, convert, crop, resize:
    bilinear, its default; and bicubic, the Loader's filter), batched; bigbatch's raw 256-px squares, cropped
    and resized by Pillow (bicubic); and its JPEG 256-px squares through the Loader (each crop's MCUs decoded) and
    decoded whole, then cut (as the Loader read them before 2026-12-03)."""
    from bigbatch.data import Loader, RankSampler, Schedule
    from bigbatch.data.crops import rrc_box, rrc_draws
    from bigbatch.data.loader import mirrored, square_crops
    from bigbatch.data.streams import FLIP, GlobalOrder, generator

    whole = root / f"whole-jpeg90-{side}.h5"
    if not whole.exists():
        prepare(str(root / "photos"), str(whole), side, workers=0, codec="jpeg", crop="none")
    raw = H5Data(root / "raw-256.h5", in_ram=True)
    batch = min(batch, len(files))  # (fewer photos than a batch: one batch of them all)
    steps = len(files) // batch
    requests = []  # per step: its images, their crops' draws and their flips, as the Loader (seed 0) reads them
    for step, _ in zip(RankSampler(GlobalOrder(len(files), 0), Schedule.constant(0, batch)), range(steps)):
        flips = torch.rand(batch, generator=generator(0, FLIP, step.nimg)) < 0.5
        requests.append((step.indices.tolist(), rrc_draws(0, step.nimg, batch), flips.tolist()))

    def loader(size: int, path: Path = whole) -> Any:
        batches = iter(Loader(str(path), batch, size, augment="rrc", xflip=True, steps=steps))
        return lambda s: next(batches)[0]

    squares = H5Data(root / "jpeg90-256.h5")  # (main's store of 256-px squares)

    def squares_whole(size: int) -> Any:
        def read(s: int) -> torch.Tensor:
            indices, draws, flips = requests[s]
            images = square_crops(squares.get(torch.tensor(indices))[0], draws, 0.08, size)
            return mirrored(images, torch.tensor(flips))

        return read

    def pillow(resample: Image.Resampling) -> Any:
        def start(size: int) -> Any:
            def read(s: int) -> torch.Tensor:
                out = []
                for i, d, flip in zip(*requests[s]):
                    with Image.open(files[i]) as img:
                        x, y, w, h = rrc_box(img.width, img.height, d, 0.08)
                        img = img.convert("RGB").crop((x, y, x + w, y + h)).resize((size, size), resample)
                        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img
                        out.append(torch.from_numpy(np.array(img)))
                return torch.stack(out)

            return read

        return start

    def raw_squares(size: int) -> Any:
        def read(s: int) -> torch.Tensor:
            indices, draws, flips = requests[s]
            out = []
            for image, d, flip in zip(raw.get(torch.tensor(indices))[0].numpy(), draws, flips):
                x, y, w, h = rrc_box(256, 256, d, 0.08)
                img = Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + w, y + h))
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img
                out.append(torch.from_numpy(np.array(img)))
            return torch.stack(out)

        return read

    bilinear = "Pillow + torchvision's RandomResizedCrop (bilinear) on the source JPEGs"
    readers = {
        f"bigbatch Loader, jpeg q90 whole images (short side {side})": loader,
        bilinear: pillow(Image.Resampling.BILINEAR),
        "the same, bicubic": pillow(Image.Resampling.BICUBIC),
        "bigbatch raw 256-px squares (Pillow crop, resize)": raw_squares,
        "bigbatch Loader, jpeg q90 256-px squares (each crop's MCUs)": lambda z: loader(z, root / "jpeg90-256.h5"),
        "the same squares decoded whole, then cut": squares_whole,
        **webdataset_readers(root, files, side, requests),
    }
    # The same images, boxes and flips on both sides (else they would differ by tens of levels): they differ by
    # the store's re-encoding only, and the filter's rounding.
    ours, theirs = (readers[name](128)(0).float() for name in (next(iter(readers)), "the same, bicubic"))
    apart = (ours - theirs).abs().mean().item()
    assert apart < 8, f"the Loader's crops are not the Pillow rows' ({apart:.1f} levels apart): update `requests`"
    rates: dict[str, list[float]] = {name: [] for name in readers}
    for size in (224, 128):
        for name, seconds in batch_seconds({k: lambda f=f, z=size: f(z) for k, f in readers.items()}, steps, rounds):
            rates[name].append(steps * batch / seconds)
    print("\n| random-resized crop + flip, one process | 224 px img/s | vs Pillow | 128 px img/s | vs Pillow |")
    print("|---|---|---|---|---|")
    base, bicubic = rates[bilinear], rates["the same, bicubic"]
    for name, (r224, r128) in rates.items():
        print(f"| {name} | {r224:.0f} | {r224 / base[0]:.2f}x | {r128:.0f} | {r128 / base[1]:.2f}x |")
    ours = rates[next(iter(rates))]
    print(
        f"\nThe Loader against the bicubic row: {ours[0] / bicubic[0]:.2f}x at 224 px, {ours[1] / bicubic[1]:.2f}x "
        f"at 128 px. Its crops against that row's, the first batch at 128 px: {apart:.2f} levels apart on average."
    )
    kib = read_meta(whole)["encoded_bytes"] / len(files) / 1024
    print(f"\nwhole-image JPEG store: {kib:.1f} KiB an image")


def batch_seconds(readers: dict[str, Any], steps: int, rounds: int) -> list[tuple[str, float]]:
    """Process CPU seconds each reader takes for `steps` batches (`readers`: name -> a function that starts
    a round and returns `read(step)`). The readers take turns batch by batch, and each batch counts its
    fastest of `rounds` rounds: load from other work on a shared machine falls on all of them alike, and
    its bursts drop out."""
    best = {name: [float("inf")] * steps for name in readers}
    for _ in range(rounds):
        started = {name: start() for name, start in readers.items()}
        for s in range(steps):
            for name, read in started.items():
                t = time.process_time()
                read(s)
                best[name][s] = min(best[name][s], time.process_time() - t)
    return [(name, sum(times)) for name, times in best.items()]


def webdataset_readers(root: Path, files: list[Path], side: int, requests: list) -> dict[str, Any]:
    """WebDataset (`pip install webdataset`) read as its ImageNet examples read it: a tar shard of JPEGs,
    decoded by its "pil" decoder, then the same crop, resize (bilinear) and flip as the Pillow row. Two
    shards, each holding the images of `requests` in their order (a shard is read in turn): the source
    JPEGs, and JPEGs re-encoded at short side `side` (q90, as the whole-image store)."""
    try:
        import webdataset as wds
    except ImportError:
        print("(webdataset is not installed: pip install webdataset for its rows)")
        return {}
    from bigbatch.data.crops import rrc_box

    shards = {"source JPEGs": root / "wds-source.tar", f"JPEGs at short side {side}, q90": root / f"wds-{side}.tar"}
    for tar in shards.values():
        if tar.exists():
            continue
        with wds.TarWriter(str(tar)) as writer:
            for k, i in enumerate(i for indices, _, _ in requests for i in indices):
                data = files[i].read_bytes()
                if tar.name != "wds-source.tar":
                    with Image.open(files[i]) as img:
                        scale = min(1.0, side / min(img.size))
                        small = img.convert("RGB").resize(
                            (round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS
                        )
                        buffer = io.BytesIO()
                        small.save(buffer, format="JPEG", quality=90)
                        data = buffer.getvalue()
                writer.write({"__key__": f"{k:06d}", "jpg": data, "cls": 0})

    def reader(tar: Path) -> Any:
        def start(size: int) -> Any:
            samples = iter(wds.WebDataset(str(tar), shardshuffle=False).decode("pil"))

            def read(s: int) -> torch.Tensor:
                out = []
                for d, flip, sample in zip(*requests[s][1:], samples):  # (samples last: none read ahead)
                    img = sample["jpg"]
                    x, y, w, h = rrc_box(img.width, img.height, d, 0.08)
                    img = img.crop((x, y, x + w, y + h)).resize((size, size), Image.Resampling.BILINEAR)
                    img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img
                    out.append(torch.from_numpy(np.array(img)))
                return torch.stack(out)

            return read

        return start

    return {f"WebDataset tar of the {name} (PIL decode, same RRC)": reader(tar) for name, tar in shards.items()}


if __name__ == "__main__":
    main()
