"""train.lr_decay = "plateau" (timm's --sched plateau, found missing from outside by a timm user): the rate falls as
PyTorch's ReduceLROnPlateau lowers it, after the warm-up, from the held-out scores every rank takes alike, and a
resumed run keeps where it had come to."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_classify import tiny

import bigbatch
from bigbatch.tasks.classify.scorer import Plateau


@pytest.mark.parametrize("metric", ["val_top1", "val_loss"])
def test_the_factor_falls_where_pytorchs_reduce_lr_on_plateau_lowers_the_rate(metric):
    over = {"train.lr_decay": "plateau", "train.plateau_patience": 2, "train.lr_gamma": 0.5, "train.lr": 0.4}
    plateau = Plateau(tiny(**over, **{"train.lr_min": 0.4 * 0.5**3, "eval.best": metric}))
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.4)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="max" if metric == "val_top1" else "min", factor=0.5, patience=2, threshold=1e-4, min_lr=0.4 * 0.5**3
    )
    scores = [50, 60, 60.001, 59, 58, 61, 61, 61, 61, 70, 69, 69, 69, 69, 69, 69, 69, 69, 69, 69, 69, 69]
    rate = plateau.rates(lambda nimg: 0.4)
    for value in scores:
        plateau.observe({metric: value}, nimg=0)
        theirs.step(value)
        assert rate(0) == pytest.approx(opt.param_groups[0]["lr"]), (value, rate(0))
    assert rate(0) == pytest.approx(0.05)  # (down to train.lr_min, three halvings, and no lower)
    # After a warm-up, the scores after it alone, as timm's (its epoch <= warmup_t passed over); one not finite is
    # never the best.
    warm = Plateau(tiny(**{**over, "train.warmup_kimg": 0.5, "train.plateau_patience": 0}))
    for nimg, value in ((100, 90.0), (500, 80.0), (600, float("nan")), (700, 70.0)):
        warm.observe({"val_top1": value}, nimg)
    assert (warm.best, warm.factor) == (70.0, 0.5)  # (nan: one bad evaluation, patience 0: halved)


def test_a_run_follows_its_scores_and_resumes_where_it_had_come_to(tmp_path):
    over = {"train.lr_decay": "plateau", "train.plateau_patience": 0, "train.lr_gamma": 0.5, "train.kimg": 0.768}
    over |= {"eval.every_kimg": 0.128, "checkpoint.every_kimg": 0.384, "train.log_every_kimg": 0.064}
    straight = bigbatch.train(tiny(**over), run_dir=tmp_path / "straight", quiet=True)
    bigbatch.train(tiny(**{**over, "train.kimg": 0.384}), run_dir=tmp_path / "resumed", quiet=True)
    resumed = bigbatch.train(tiny(**over), run_dir=tmp_path / "resumed", resume=True, quiet=True)

    def rows(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    rates = [r["lr"] for r in rows(straight) if "lr" in r]
    scored = [r["val_top1"] for r in rows(straight) if "val_top1" in r]
    assert min(rates) < max(rates) == 0.2  # (train.lr 0.2 at its batch: a score that did not improve halved it)
    worse = sum(b <= a for a, b in zip(scored, scored[1:]))  # (each evaluation not better than the best so far)
    assert rates[-1] <= 0.2 * 0.5 ** min(worse, 1)
    assert [r.get("lr") for r in rows(resumed)] == [r.get("lr") for r in rows(straight)]
    a, b = (load_file(r / "checkpoints" / "000000.768" / "model.safetensors") for r in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "over, said",
    [
        (
            {"train.lr_decay": "plateau", "eval.every_kimg": 0},
            "config key 'train.lr_decay' \"plateau\" follows the held",
        ),
        ({"train.plateau_patience": 3}, "config key 'train.plateau_patience' is read by train.lr_decay \"plateau\""),
    ],
)
def test_what_it_cannot_follow_is_one_line(over, said):
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.train(tiny(**over), quiet=True)
    assert said in str(e.value), e.value
