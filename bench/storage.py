"""What each storage codec costs: bytes per image and decode time per image at 64, 128 and 256 px, and
one process's images/s reading a 128-px phase from a 256-px store (raw, JPEG with the reduced-size
decode) against Pillow on the source JPEGs (open, center crop, resize: what users write first).

    python bench/storage.py                  # 400 photos, one thread
    python bench/storage.py --n 2000 --out /tmp/codecs
    python bench/storage.py --prepare-n 100000 --workers 2   # prepare's rate and peak memory at 100k files
    python bench/storage.py --whole-side 352                  # crops from ImageNet's store (short side 352)

The photos are crops of the two photographs scikit-learn ships (china.jpg, flower.jpg, 640x427),
at ImageNet's typical size (about 400x330, random position, scale and aspect ratio, mirrored at
random), saved as JPEG q90: real camera content, so the bytes compare with ImageNet's (110 KiB an
image there at full size). Times are process CPU seconds, so that other load on the machine does
not count; one thread (torch and Pillow)."""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from bigbatch.data import H5Data, prepare, read_meta  # noqa: E402
from bigbatch.data.schedule import resize_batch  # noqa: E402

CODECS = [("raw", None), ("jpeg", 90), ("jpeg", 95), ("png", None), ("webp", 90)]


def make_photos(root: Path, n: int, seed: int = 0) -> list[Path]:
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    sources = [Image.fromarray(a) for a in load_sample_images().images]
    files = []
    for i in range(n):
        src = sources[i % len(sources)]
        scale, ratio = rng.uniform(0.45, 1.0), np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        w = min(src.width, int(src.height * scale * ratio))
        h = min(src.height, int(src.height * scale))
        x, y = int(rng.integers(0, src.width - w + 1)), int(rng.integers(0, src.height - h + 1))
        out_w = int(rng.integers(360, 500))
        img = src.crop((x, y, x + w, y + h)).resize((out_w, max(1, round(out_w * h / w))), Image.Resampling.LANCZOS)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        folder = root / ("china" if i % 2 == 0 else "flower")
        folder.mkdir(parents=True, exist_ok=True)
        files.append(folder / f"{i:05d}.jpg")
        img.save(files[-1], quality=90)
    return files


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
    parser.add_argument("--n", type=int, default=400, help="photos")
    parser.add_argument("--out", help="folder for the photos and data files (default: a temporary one)")
    parser.add_argument("--prepare-n", type=int, default=0, help="instead: prepare's rate and memory on N small files")
    parser.add_argument("--workers", type=int, default=2, help="prepare workers for --prepare-n")
    parser.add_argument("--whole-side", type=int, default=256, help="short side of the whole-image store for crops")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import cv2

    cv2.setNumThreads(0)  # one thread a side: OpenCV runs its resizes in the calling thread
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-codecs-"))
    if args.prepare_n:  # on its own, in a fresh process, so that its peak memory is prepare's
        print("| files | workers | prepare img/s | per worker | peak RSS (process or a worker) |")
        print("|---|---|---|---|---|")
        prepare_at_scale(root, args.prepare_n, args.workers)
        return
    files = make_photos(root / "photos", args.n)
    source_bytes = sum(f.stat().st_size for f in files) / len(files)
    sizes = np.array([Image.open(f).size for f in files])
    mean = f"{sizes[:, 0].mean():.0f}x{sizes[:, 1].mean():.0f}"
    print(f"{args.n} photos, mean {mean}, JPEG q90: {source_bytes / 1024:.1f} KiB an image")

    rows = []
    batch = torch.arange(min(64, args.n))
    for res in (64, 128, 256):
        for codec, quality in CODECS:
            out = root / f"{codec}{quality or ''}-{res}.h5"
            if not out.exists():
                prepare(str(root / "photos"), str(out), res, workers=0, codec=codec, quality=quality)
            meta = read_meta(out)
            per_image = meta.get("encoded_bytes", res * res * 3 * meta["count"]) / meta["count"]
            data = H5Data(out, in_ram=True)  # decode cost alone, not the disk
            ms = cpu_time(lambda d=data: d.get(batch)) / len(batch) * 1e3
            half = cpu_time(lambda d=data, r=res: resize_batch(d.get(batch, r // 2)[0], r // 2)) / len(batch) * 1e3
            name = codec + (f" q{quality}" if quality else "")
            rows.append((res, name, per_image, per_image / (res * res * 3), ms, half))

    print("\n| stored px | codec | KiB an image | of raw | decode ms/image | read at half size ms/image |")
    print("|---|---|---|---|---|---|")
    for res, name, b, frac, ms, half in rows:
        print(f"| {res} | {name} | {b / 1024:.1f} | {frac:.3f} | {ms:.3f} | {half:.3f} |")

    # A 128-px phase from a 256-px store, one process, images/s (CPU time): the store read and decoded
    # (reduced for JPEG) and resized, against Pillow on the source JPEGs.
    def pillow_folder() -> None:
        for f in files[: len(batch)]:
            with Image.open(f) as img:
                s = min(img.size)
                left, top = (img.width - s) // 2, (img.height - s) // 2
                img = img.convert("RGB").crop((left, top, left + s, top + s))
                np.asarray(img.resize((128, 128), Image.Resampling.BILINEAR))

    speeds = {"Pillow on the source JPEGs (crop, resize)": len(batch) / cpu_time(pillow_folder)}
    for codec, quality in (("raw", None), ("jpeg", 90)):
        data = H5Data(root / f"{codec}{quality or ''}-256.h5")
        speeds[f"bigbatch {codec}{f' q{quality}' if quality else ''} store at 256"] = len(batch) / cpu_time(
            lambda d=data: resize_batch(d.get(batch, 128)[0], 128)
        )
    base = speeds["Pillow on the source JPEGs (crop, resize)"]
    print("\n| reading a 128-px phase, one process | img/s (CPU) | vs Pillow |")
    print("|---|---|---|")
    for name, v in speeds.items():
        print(f"| {name} | {v:.0f} | {v / base:.2f}x |")
    random_resized_crops(root, files, len(batch), args.whole_side)


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


def random_resized_crops(root: Path, files: list[Path], n: int, side: int = 256) -> None:
    """A classifier's training read: a random-resized crop (the same boxes, drawn by bigbatch.data.crops
    for each image's own size) resized to 224 and 128 px and mirrored, on every side: Pillow + the
    torchvision-style pipeline on the source JPEGs (open, convert, crop, resize), bigbatch's raw
    256-px square store (the crop from the square), and bigbatch's JPEG store of whole images (short
    side 256, `--crop none`; the crop cut before decoding, at a reduced DCT scale where it allows)."""
    from bigbatch.data.crops import rrc_box, rrc_draws

    whole = root / f"whole-jpeg90-{side}.h5"
    if not whole.exists():
        prepare(str(root / "photos"), str(whole), side, workers=0, codec="jpeg", crop="none")
    data, raw = H5Data(whole, in_ram=True), H5Data(root / "raw-256.h5", in_ram=True)
    index = torch.arange(n)
    draws = rrc_draws(0, 0, n)

    def pillow(size: int) -> None:
        for f, d in zip(files[:n], draws):
            with Image.open(f) as img:
                x, y, w, h = rrc_box(img.width, img.height, d, 0.08)
                out = img.convert("RGB").resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + w, y + h))
                np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT))

    def raw_store(size: int) -> None:
        for image, d in zip(raw.get(index)[0].numpy(), draws):
            x, y, w, h = rrc_box(256, 256, d, 0.08)
            out = Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + w, y + h))
            np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT))

    def jpeg_store(size: int) -> None:
        data.get_crops(index, size, draws, 0.08)[0].flip(2)

    readers = [
        ("Pillow + torchvision-style RRC on the source JPEGs", pillow),
        ("bigbatch raw 256-px squares", raw_store),
        (f"bigbatch jpeg q90 whole images (short side {side})", jpeg_store),
        *webdataset_readers(root, files[:n], side, draws),
    ]
    print("\n| random-resized crop + flip, one process | 224 px img/s | vs Pillow | 128 px img/s | vs Pillow |")
    print("|---|---|---|---|---|")
    rates = {name: [n / cpu_time(lambda s=size, f=fn: f(s)) for size in (224, 128)] for name, fn in readers}
    base = rates["Pillow + torchvision-style RRC on the source JPEGs"]
    for name, (r224, r128) in rates.items():
        print(f"| {name} | {r224:.0f} | {r224 / base[0]:.2f}x | {r128:.0f} | {r128 / base[1]:.2f}x |")
    kib = read_meta(whole)["encoded_bytes"] / len(data) / 1024
    print(f"\nwhole-image JPEG store: {kib:.1f} KiB an image")


def webdataset_readers(root: Path, files: list[Path], side: int, draws: torch.Tensor) -> list[tuple[str, Any]]:
    """WebDataset (`pip install webdataset`) read as its ImageNet examples read it: a tar shard of JPEGs,
    decoded by its "pil" decoder, then the same crop, resize and flip as the Pillow row. Two shards: the
    source JPEGs, and JPEGs re-encoded at short side `side` (q90, as the whole-image store)."""
    try:
        import webdataset as wds
    except ImportError:
        print("(webdataset is not installed: pip install webdataset for its rows)")
        return []
    from bigbatch.data.crops import rrc_box

    shards = {"source JPEGs": root / "wds-source.tar", f"JPEGs at short side {side}, q90": root / f"wds-{side}.tar"}
    for tar in shards.values():
        if tar.exists():
            continue
        with wds.TarWriter(str(tar)) as writer:
            for i, f in enumerate(files):
                data = f.read_bytes()
                if tar.name != "wds-source.tar":
                    with Image.open(f) as img:
                        scale = min(1.0, side / min(img.size))
                        small = img.convert("RGB").resize(
                            (round(img.width * scale), round(img.height * scale)), Image.Resampling.LANCZOS
                        )
                        buffer = io.BytesIO()
                        small.save(buffer, format="JPEG", quality=90)
                        data = buffer.getvalue()
                writer.write({"__key__": f"{i:06d}", "jpg": data, "cls": 0})

    def reader(tar: Path) -> Any:
        def read(size: int) -> None:
            for sample, d in zip(wds.WebDataset(str(tar), shardshuffle=False).decode("pil"), draws):
                img = sample["jpg"]
                x, y, w, h = rrc_box(img.width, img.height, d, 0.08)
                out = img.resize((size, size), Image.Resampling.BICUBIC, box=(x, y, x + w, y + h))
                np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT))

        return read

    return [(f"WebDataset tar of the {name} (PIL decode, same RRC)", reader(tar)) for name, tar in shards.items()]


if __name__ == "__main__":
    main()
