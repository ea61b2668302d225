"""Tar shards taken alike by `stats`, as `eval` and `prepare` take them (found from outside, as a WebDataset user:
a pattern of shards was refused by stats alone; an S3 folder too: tests/test_s3.py), and a damaged shard said as the
cause where it leaves no image (it was advised to be unpacked as ImageNet's tar of tars)."""

import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from test_eval_images import STANDIN, evaluate_module, pictures, save_folder

from bigbatch.cli import main
from bigbatch.errors import BigbatchError
from bigbatch.metrics import load_stats


@pytest.fixture(autouse=True)
def standin(monkeypatch, tmp_path):
    real = evaluate_module.get_extractor
    picked = lambda name, **kw: STANDIN if name == "standin" else real(name, **kw)  # noqa: E731
    monkeypatch.setattr(evaluate_module, "get_extractor", picked)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))


def stats(capsys, source, *options):
    assert main(["stats", str(source), "--extractor", "standin", *options]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    return load_stats(said.split(" in ", 1)[1].split(" (give it")[0])


def shards(folder, out, n):
    files = sorted(folder.rglob("*.png"))
    for i in range(n):
        with tarfile.open(out / f"shard-{i}.tar", "w") as tar:
            for f in files[i::n]:
                tar.add(f, f.relative_to(folder).as_posix())


def test_stats_of_a_pattern_of_shards_are_their_images(tmp_path, capsys):
    folder = save_folder(tmp_path / "images", pictures(20, 0))
    (tmp_path / "shards").mkdir()
    shards(folder, tmp_path / "shards", 2)
    whole = stats(capsys, folder)
    for source in (tmp_path / "shards" / "shard-{0..1}.tar", tmp_path / "shards"):
        got = stats(capsys, source)
        assert got.n == 20 and np.allclose(got.mu, whole.mu, atol=1e-6), source
    assert main(["stats", str(tmp_path / "shards" / "shard-{0..5}.tar"), "--extractor", "standin"]) == 2
    assert "shard-2.tar" in (err := capsys.readouterr().err) and "give a pattern of the shards there are" in err
    assert main(["stats", str(tmp_path / "nothing"), "--extractor", "standin"]) == 2
    assert "nothing does not exist; give a DATA.h5, builtin:NAME, or a folder" in capsys.readouterr().err


def test_a_damaged_shard_is_said_as_the_cause_not_as_archives_to_unpack(tmp_path, capsys):
    folder = tmp_path / "images"
    for i in range(3):  # (noise: PNGs too large to fit before the cut)
        (folder / "c").mkdir(parents=True, exist_ok=True)
        noise = np.random.default_rng(i).integers(0, 256, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(noise).save(folder / "c" / f"{i}.png")
    shards(folder, tmp_path, 1)
    cut = tmp_path / "cut-0.tar"
    cut.write_bytes((tmp_path / "shard-0.tar").read_bytes()[:3000])
    assert main(["prepare", str(cut), str(tmp_path / "out.h5"), "--resolution", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no usable images" in err
    assert f"{cut}: a damaged tar: cut short at byte 3000" in err and "unpack" not in err


def test_shards_beside_an_image_are_said_and_info_gives_shapes_as_width_x_height(tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    save_folder(tmp_path / "images", pictures(4, 0))
    shards(tmp_path / "images", folder, 1)
    Image.fromarray(pictures(1, 1)[0]).save(folder / "stray.png")
    assert main(["prepare", str(folder), str(tmp_path / "m.h5"), "--resolution", "8"]) == 0
    err = capsys.readouterr().err
    assert "1 tar file left out (shard-0.tar): a folder is read as shards where it holds no images, and this " in err
    # (found from outside: info gave a bucket's shape as height x width, prepare's messages width x height)
    wide = tmp_path / "wide"
    save_folder(wide, [np.zeros((16, 32, 3), np.uint8)] * 3)
    assert main(["prepare", str(wide), str(tmp_path / "w.h5"), "--resolution", "16", "--buckets"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "w.h5")]) == 0
    shapes = capsys.readouterr().out.split("shapes ", 1)[1].split(" (", 1)[0]
    width, height = map(int, shapes.split("x"))
    assert width > height, shapes


def test_a_data_file_names_each_image_by_its_file_in_index_order_buckets_too(tmp_path):
    # Found from outside (WebDataset keeps each sample's __key__): an index of a data file could not be traced to
    # its file, once buckets and skips had moved the order.
    from bigbatch.data import image_names, load_data

    sizes = {"wide": (16, 32), "tall": (32, 16), "square": (24, 24)}
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i, (kind, shape) in enumerate(sizes.items()):
            Image.fromarray(pictures(1, i, size=shape)[0]).save(tmp_path / "src" / c / f"{kind}{i}.png")
    (tmp_path / "src" / "a" / "broken.png").write_bytes(b"not a png")  # (skipped: the names after it keep theirs)
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "b.h5"), "--resolution", "16", "--buckets"]) == 0
    data = load_data(str(tmp_path / "b.h5"), 16)
    names = image_names(data)
    assert sorted(names) == sorted(f"{c}/{k}{i}.png" for c in "ab" for i, k in enumerate(sizes))
    for i, name in enumerate(names):
        image, label = data.get(torch.tensor([i]))
        h, w = image.shape[1:3]
        assert data.class_names[int(label)] == name.split("/")[0]
        assert (w > h, w < h) == (name.startswith("a/wide") or name.startswith("b/wide"), "tall" in name), name
    assert image_names(load_data("builtin:digits", 8)) is None
    with pytest.raises(BigbatchError, match="not its path: image_names.bigbatch.data.load_data"):
        image_names(str(tmp_path / "b.h5"))  # (found from outside: None, read as "the file keeps no names")


def test_shards_from_a_server_that_ignores_ranges_come_whole_once_each_to_prepares_threads(tmp_path):
    # (the review found prepare's fetching threads racing: a shard asked for whole by several at once, and one
    # marked as taking ranges, every member of it then refused)
    import functools
    import http.server
    import threading

    from bigbatch.data import prepare

    asked = []

    class Plain(http.server.SimpleHTTPRequestHandler):  # python -m http.server's: every answer the whole file
        def send_head(self):
            asked.append(f"{self.command} {self.path} {self.headers.get('Range')}")
            return super().send_head()

        def log_message(self, *args):
            pass

    for c in ("a", "b"):  # 3 shards of 70 images: 3 chunks of prepare's each, fetched by its 4 threads
        for i in range(105):
            (tmp_path / "src" / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pictures(1, i, size=(8, 8))[0]).save(tmp_path / "src" / c / f"{i:03d}.png")
    (tmp_path / "shards").mkdir()
    shards(tmp_path / "src", tmp_path / "shards", 3)
    local = prepare(str(tmp_path / "shards" / "shard-{0..2}.tar"), str(tmp_path / "l.h5"), 8, workers=0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Plain, directory=tmp_path / "shards"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shard-{{0..2}}.tar"
        remote = prepare(url, str(tmp_path / "r.h5"), 8, workers=2)
    finally:
        server.shutdown()
        server.server_close()
    assert remote.count == local.count == 210 and not remote.skipped
    assert remote.content_hash == local.content_hash
    for i in range(3):  # the listing's read of it, then its first member's range, answered whole and kept
        assert sum(a.startswith(f"GET /shard-{i}.tar ") for a in asked) == 2, asked


def test_images_of_different_sizes_are_said_as_width_x_height(tmp_path):
    # (the review found one more message giving height x width where prepare's and info's give width x height)
    from bigbatch.errors import BigbatchError
    from bigbatch.metrics import open_images

    save_folder(tmp_path / "mixed", [pictures(1, 0, size=(8, 8))[0], pictures(1, 1, size=(8, 16))[0]])
    with pytest.raises(BigbatchError, match=r"holds images of different sizes \(8x8, 16x8\)"):
        open_images(str(tmp_path / "mixed")).get([0, 1])
