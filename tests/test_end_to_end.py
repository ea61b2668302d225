"""A tiny run through the CLI and the Python API: train -> sample -> info."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.config import Config


@pytest.fixture
def run(tiny, tmp_path, capsys):
    (tmp_path / "tiny.toml").write_text(tiny.dumps())
    assert main(["train", "--config", str(tmp_path / "tiny.toml"), "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"bigbatch sample {tmp_path / 'run'}" in out  # says how to sample from the run
    return tmp_path / "run"


def test_run_directory_contents(run, tiny):
    assert Config.load(run / "config.toml") == tiny
    plan = json.loads((run / "plan.json").read_text())
    assert plan["micro_batch"] == 16 and plan["accumulation"] == 2 and plan["world_size"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256, 0.384, 0.512]
    for key in ("loss_D", "loss_G", "img_per_s", "step"):
        assert all(key in r for r in rows)
    # Each row averages the global gradient norm of the D and G steps since the last row.
    assert all(r["grad_norm_D"] > 0 and r["grad_norm_G"] > 0 for r in rows)
    assert (run / "checkpoints" / "latest").read_text().strip() == "000000.512"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000.256", "000000.512", "latest"]
    for name in ("grid-000000.256.png", "grid-000000.512.png", "classes-000000.512.png", "interp-000000.512.png"):
        assert Image.open(run / "samples" / name).size[0] > 16
    assert any((run / "tb").iterdir())


def test_refuses_to_overwrite_a_run(run, tiny):
    with pytest.raises(bigbatch.BigbatchError, match=r"already holds a run; add --resume \(in Python: resume=True\)"):
        bigbatch.train(tiny, run_dir=run, quiet=True)


def test_sample_api_is_deterministic_and_split_invariant(run, monkeypatch):
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    gpus_seeded = []  # (found from outside: torch.manual_seed reseeded every GPU, which fork_rng(devices=[]) leaves)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", gpus_seeded.append)
    G = bigbatch.load_generator(run)
    assert torch.equal(torch.get_rng_state(), rng) and gpus_seeded == []  # the caller's global RNGs left alone
    assert not G.training
    a = bigbatch.sample(G, n=10, seed=5)
    assert a.shape == (10, 16, 16, 3) and a.dtype == torch.uint8
    assert torch.equal(a, bigbatch.sample(G, n=10, seed=5, batch_size=3))
    assert torch.equal(a[:4], bigbatch.sample(G, n=4, seed=5))
    assert not torch.equal(a, bigbatch.sample(G, n=10, seed=6))
    b = bigbatch.sample(G, n=6, seed=5, classes=[2, 7], truncation=0.5)
    assert b.shape == (6, 16, 16, 3)
    assert torch.equal(b, bigbatch.sample(G, n=6, seed=5, classes=torch.tensor([2, 7]), truncation=0.5))
    # Found from outside: truncation 0 sampled forever; the others were raw errors from inside.
    bad = [
        ({"truncation": 0}, "truncation must be a threshold >= 0.05"),
        ({"truncation": float("nan")}, "truncation must be"),
        ({"classes": [10]}, r"classes must be a non-empty list of labels in 0\.\.9"),
        ({"classes": []}, "classes must be"),
        ({"classes": 3}, "classes must be"),
        ({"classes": ["zebra"]}, "classes must be"),
        ({"n": -3}, "n must be a whole number, 0 or more, got -3"),
        ({"batch_size": 0}, "batch_size must be a whole number, 1 or more, got 0"),
        ({"seed": "a"}, "seed must be a whole number, 0 or more, got 'a'"),  # (a TypeError, found from outside)
    ]
    for kwargs, message in bad:
        with pytest.raises(bigbatch.BigbatchError, match=message):
            bigbatch.sample(G, **{"n": 2, **kwargs})
    with pytest.raises(bigbatch.BigbatchError, match="sample takes a generator"):
        bigbatch.sample(str(run))
    # A device this machine has not, or that torch does not know, is one line (found from outside: torch's errors).
    if not torch.cuda.is_available():
        with pytest.raises(bigbatch.BigbatchError, match="device 'cuda': this machine has no CUDA GPU"):
            bigbatch.load_generator(run, device="cuda")
    with pytest.raises(bigbatch.BigbatchError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        bigbatch.load_generator(run, device="gpu")


def test_a_seeds_classes_are_the_same_at_every_truncation(run, tmp_path):
    # Found from outside: the label was drawn after z's resampling, so a truncation sheet (BigGAN's) compared
    # images of other classes at each threshold.
    labels = []
    for truncation in ("inf", "2", "0.5"):
        out = str(tmp_path / f"t{truncation}.npz")
        assert (
            main(["sample", str(run), "--n", "16", "--seed", "3", "--truncation", truncation, "--npz", "--out", out])
            == 0
        )
        labels.append(np.load(out)["y"])
    assert len(set(labels[0].tolist())) > 1 and all(np.array_equal(labels[0], y) for y in labels[1:])


def test_cli_sample_and_info(run, capsys):
    assert main(["sample", str(run), "--n", "12", "--classes", "3,4", "--out", "g.png"]) == 0
    assert Image.open("g.png").size == (8 * 18 + 2, 2 * 18 + 2)
    assert main(["sample", str(run), "--interp", "--out", "i.png"]) == 0
    for bad in (["--out", "g.jpg"], ["--npz", "--out", "s.png"]):  # not a PNG under any name
        assert main(["sample", str(run), *bad]) == 2
    assert Image.open("i.png").size[0] == 8 * 18 + 2
    # Found from outside: --interp drew the same sheet whatever --classes and --truncation said.
    for i, extra in enumerate((["--classes", "3"], ["--truncation", "0.5"])):
        assert main(["sample", str(run), "--interp", *extra, "--out", f"i{i}.png"]) == 0
    sheets = [Image.open(f).tobytes() for f in ("i.png", "i0.png", "i1.png")]
    assert len(set(sheets)) == 3
    assert main(["sample", str(run), "--interp", "--n", "4"]) == 2  # (a grid's options: refused, not ignored)
    assert "--n and --ncol are for a grid of samples" in capsys.readouterr().err
    assert main(["sample", str(run / "checkpoints" / "000000.256"), "--npz", "--n", "5", "--out", "s.npz"]) == 0
    saved = np.load("s.npz")
    arr = saved["arr_0"]
    assert arr.shape == (5, 16, 16, 3) and arr.dtype == np.uint8
    # The labels beside a conditional G's images, as BigGAN-PyTorch's samples.npz holds them (found from outside:
    # without them no per-class score): those sample() drew.
    G = bigbatch.load_generator(run / "checkpoints" / "000000.256")
    images, labels = bigbatch.sample(G, 5, 0, with_labels=True)
    assert np.array_equal(saved["y"], labels.numpy()) and np.array_equal(arr, images.numpy())
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert "000000.512" in out and "dcgan" in out and "G_ema.safetensors" in out
    assert ", G_ema half-life 2 kimg\n" in out  # (the average G: found from outside, not shown)
    # eval without --n on a CPU: the papers' 50,000 said to take hours before it starts (found from outside: unsaid)
    with pytest.MonkeyPatch.context() as stop:
        stop.setattr("bigbatch.metrics.evaluate", lambda *a, **k: (_ for _ in ()).throw(SystemExit(3)))
        with pytest.raises(SystemExit):
            main(["eval", str(run), "--metrics", "fid"])
    cpu = "scoring the papers' 50,000 samples on a CPU, where Inception takes a few to tens a second: hours; --n"
    assert (cpu in capsys.readouterr().err) is not torch.cuda.is_available()  # (eval runs on a GPU where there is one)
    assert main(["sample", str(run), "--classes", "11"]) == 2
    # The default names carry the settings that change the images (found from outside: one replaced another).
    for extra in ([], ["--classes", "3,4"], ["--truncation", "1.5"], ["--n", "8"]):
        assert main(["sample", str(run), "--n", "4", *extra]) == 0
    names = sorted(p.name for p in (run / "samples").glob("sample-000000.512-seed0*.png"))
    assert names == sorted(f"sample-000000.512-seed0{s}.png" for s in ("-n4", "-classes3,4-n4", "-trunc1.5-n4", "-n8"))
    # The device, as eval's and swap's: CUDA where there is one (bench/gpu_check.py samples on it).
    assert main(["sample", str(run), "--n", "12", "--classes", "3,4", "--device", "cpu", "--out", "c.png"]) == 0
    assert Image.open("c.png").tobytes() == Image.open("g.png").tobytes()
    capsys.readouterr()
    for device, words in (("tpu", "--device must be auto, cpu or cuda"), ("cuda", "no CUDA GPU")):
        if device == "cuda" and torch.cuda.is_available():
            continue
        assert main(["sample", str(run), "--device", device]) == 2
        assert words in capsys.readouterr().err


def test_sample_classes_are_names_before_numbers(run, tmp_path, capsys):
    # Found from outside: with class folders 1..10 (sorted '1', '10', '2', ...), --classes 1 quietly drew
    # folder "10" (number 1) and --classes 10 was refused.
    import shutil

    ckpt = tmp_path / "named"
    shutil.copytree(run / "checkpoints" / "000000.512", ckpt)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["class_names"] = sorted(str(i) for i in range(1, 11))  # '1', '10', '2', ..., '9'
    (ckpt / "meta.json").write_text(json.dumps(meta))

    def drawn(ckpt, classes):
        argv = ["sample", str(ckpt), "--npz", "--n", "2", "--classes", classes, "--out", "c.npz", "--overwrite"]
        assert main(argv) == 0
        return np.load("c.npz")["arr_0"]

    plain = run / "checkpoints" / "000000.512"
    assert np.array_equal(drawn(ckpt, "10"), drawn(plain, "1"))  # the folder named 10 is class number 1
    assert np.array_equal(drawn(ckpt, "1"), drawn(plain, "0"))
    capsys.readouterr()  # An --out that exists is kept unless --overwrite (found from outside: a FID draw replaced).
    assert main(["sample", str(plain), "--npz", "--n", "1", "--out", "c.npz"]) == 2
    assert capsys.readouterr().err.endswith(": c.npz exists: give --overwrite to replace it, or another --out\n")
    assert np.array_equal(np.load("c.npz")["arr_0"], drawn(plain, "0"))
    for bad, words in (("3,,5", "empty entry"), ("cat", "neither a class number nor a class name")):
        assert main(["sample", str(ckpt), "--classes", bad]) == 2 and words in capsys.readouterr().err
    assert main(["sample", str(ckpt), "--seed", "-1"]) == 2
    assert "--seed: must be a whole number in [0, 2**63)" in capsys.readouterr().err


def test_sample_every_kimg_0_draws_no_grids(tiny, tmp_path):
    # As eval.every_kimg = 0 means "never", sample.every_kimg = 0 means no grids (it was refused).
    run = bigbatch.train(tiny.override({"sample.every_kimg": 0}), run_dir=tmp_path / "quiet", quiet=True)
    drawn = sorted(p.name for p in (run / "samples").glob("*.png"))
    assert not [n for n in drawn if n.startswith("grid-")] and "classes-000000.512.png" in drawn, drawn


def test_train_config_toml_reproduces_the_run(run, tmp_path):
    assert main(["train", "--quiet", "--config", str(run / "config.toml"), "--run-dir", str(tmp_path / "again")]) == 0
    for net in ("G", "D", "G_ema"):
        a = (run / "checkpoints" / "000000.512" / f"{net}.safetensors").read_bytes()
        b = (tmp_path / "again" / "checkpoints" / "000000.512" / f"{net}.safetensors").read_bytes()
        assert a == b


def test_standing_statistics_average_the_generators_own_batches(run, capsys):
    G = bigbatch.load_generator(run)
    bns = [m for m in G.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    trained = [m.running_mean.clone() for m in bns]
    bigbatch.standing_stats(G, n_batches=1, batch_size=64)
    whole = [m.running_mean.clone() for m in bns]
    bigbatch.standing_stats(G, n_batches=2, batch_size=32)  # the same 64 draws, in two batches
    # The first BN sees the same inputs either way: its mean is the plain average of the batch means
    # (deeper BNs see inputs normalised with 32- or 64-image statistics, so they differ slightly).
    assert torch.allclose(whole[0], bns[0].running_mean, atol=1e-5)
    assert all(not torch.allclose(a, c) for a, c in zip(whole, trained))
    assert not G.training
    assert main(["sample", str(run), "--standing-stats", "2", "--out", "standing.png"]) == 0
    assert main(["sample", str(run), "--standing-stats", "-1"]) == 2
