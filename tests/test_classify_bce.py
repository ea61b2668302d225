"""timm's binary cross-entropy (--bce-loss, --bce-target-thresh) and its mixing probabilities (--mixup-prob,
--mixup-switch-prob, --mixup-off-epoch), found missing from outside by a timm user of the classifier recipes."""

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from test_classify import tiny

import bigbatch
from bigbatch.cli import main
from bigbatch.tasks.classify import mixing


def test_the_targets_and_loss_are_timms():
    torch.manual_seed(0)
    logits, labels, lam = (
        torch.randn(6, 5),
        torch.tensor([0, 3, 3, 1, 4, 2]),
        torch.tensor([0.7, 0.7, 1.0, 1.0, 0.2, 0.2]),
    )
    target = mixing.targets(labels, 5, 0.1, lam)
    off, on = 0.1 / 5, 0.9 + 0.1 / 5  # timm's mixup_target: one_hot(y, on, off) * lam + one_hot(y.flip) * (1 - lam)
    one_hot = lambda y: torch.full((6, 5), off).scatter_(1, y.view(-1, 1), on)  # noqa: E731
    pairs = labels.view(3, 2).flip(1).reshape(6)
    torch.testing.assert_close(target, one_hot(labels) * lam[:, None] + one_hot(pairs) * (1 - lam[:, None]))
    # BCE with logits, the mean over images and classes: softplus(x) - x t
    torch.testing.assert_close(
        mixing.bce(logits, target, 0), (torch.nn.functional.softplus(logits) - logits * target).mean()
    )
    hard = (target > 0.2).float()
    torch.testing.assert_close(
        mixing.bce(logits, target, 0.2), (torch.nn.functional.softplus(logits) - logits * hard).mean()
    )


def test_a_pair_is_mixed_at_its_probability_and_takes_cutmix_at_the_switchs():
    rows = mixing.draw(20_000, 0.8, 1.0, seed=0, nimg=0, prob=0.6, switch=0.3)[::2]  # (a row a pair)
    kept = rows[:, 1] == 1
    assert kept.float().mean().item() == pytest.approx(0.4, abs=0.02)
    assert (rows[kept, 0] == mixing.MIXUP).all() and (rows[kept, 2:] == 0).all()  # unmixed: weight 1, no box
    cut = rows[~kept, 0] == mixing.CUTMIX
    assert cut.float().mean().item() == pytest.approx(0.3, abs=0.02)
    # Every pair mixed, as before the keys: the same draws as without them.
    assert torch.equal(mixing.draw(64, 0.8, 1.0, 0, 0, 1.0, 0.5), mixing.draw(64, 0.8, 1.0, 0, 0))


def test_bce_with_mixing_trains_the_same_weights_on_any_micro_batch(tmp_path):
    over = {"train.bce_loss": True, "train.bce_threshold": 0.2, "train.label_smoothing": 0.1, "train.mixup": 0.8}
    over |= {"train.cutmix": 1.0, "train.mixup_prob": 0.7, "train.mixup_switch_prob": 0.3, "eval.every_kimg": 0}
    over |= {"train.kimg": 0.256, "checkpoint.every_kimg": 0.256, "model.name": "convnet", "model.options": {}}
    runs = [
        bigbatch.train(tiny(**over, **{"train.micro_batch": m}), run_dir=tmp_path / str(m), quiet=True) for m in (8, 32)
    ]
    a, b = (load_file(r / "checkpoints" / "000000.256" / "model.safetensors") for r in runs)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


def test_mixing_ends_at_its_kimg_and_keys_nothing_reads_are_one_line(tmp_path, capsys):
    argv = ["show-batch", "--preset", "fashion_resnet", "data.path=builtin:digits", "data.resolution=16"]
    sheets = {}
    for kimg in ("0", "1"):
        for mixed in (True, False):
            extra = ["train.mixup=0.8", "train.mixup_off_kimg=0.5"] if mixed else []
            assert main([*argv, *extra, "--kimg", kimg, "--out", str(tmp_path / "b.png")]) == 0
            sheets[kimg, mixed] = np.asarray(Image.open(tmp_path / "b.png"))
    assert np.array_equal(sheets["1", True], sheets["1", False])  # past train.mixup_off_kimg: not mixed
    assert sheets["0", True].shape != sheets["0", False].shape or not np.array_equal(
        sheets["0", True], sheets["0", False]
    )
    for bad, said in (
        (["train.mixup_prob=0.5"], "config key 'train.mixup_prob' is read with train.mixup or train.cutmix, and both"),
        (["train.bce_threshold=0.2"], "config key 'train.bce_threshold' is the binary cross-entropy's"),
        (["train.mixup_prob=1.5"], "config key 'train.mixup_prob' is a probability, in [0, 1], got 1.5"),
        # (found from outside: mixing asked for and none done)
        (["train.mixup=0.8", "train.mixup_prob=0"], "'train.mixup_prob' is 0: no pair is mixed"),
    ):
        assert main(["train", "--dry-run", "--preset", "fashion_resnet", *bad]) == 2
        assert said in capsys.readouterr().err
    assert (
        main(["train", "--dry-run", "--preset", "fashion_resnet", "train.mixup=0.8", "train.mixup_switch_prob=0.2"])
        == 2
    )
    assert "'train.mixup_switch_prob' picks CutMix over mixup for a pair" in capsys.readouterr().err
    # A threshold outside a smoothed target's two values (digits' 10 classes at smoothing 0.1: 0.01 and 0.91) makes
    # every target 0, or 1 (found from outside: a run that learned nothing), said as the task meets the classes.
    for threshold, every in ((0.95, 0), (0.005, 1)):
        over = {"train.bce_loss": True, "train.label_smoothing": 0.1, "train.bce_threshold": threshold}
        with pytest.raises(
            bigbatch.BigbatchError, match=f"values for 10 classes, 0.01 and 0.91 .* every target is {every}"
        ):
            bigbatch.train(tiny(**over), run_dir=tmp_path / "t", quiet=True)
    assert not (tmp_path / "t").exists()
