"""What a model draws from torch's global generator in training (a user's nn.Dropout, the ResNets' drop_rate and
drop_path_rate, timm's) is decided by train.seed: the same weights on a rerun and after a resume (found from outside:
a family with dropout trained other weights on every run, and its resume was not bit-exact)."""

import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_classify import tiny
from torch import nn

import bigbatch
from bigbatch.models import create_classifier
from bigbatch.models.resnet import drop_path


class _Dropped(nn.Module):
    def __init__(self, n_classes, img_channels):
        super().__init__()
        self.n_classes, self.img_channels, self.feature_dim = n_classes, img_channels, 16
        self.body = nn.Sequential(nn.Conv2d(img_channels, 16, 3, stride=2), nn.ReLU(), nn.Dropout(0.5))
        self.head = nn.Linear(16, n_classes)

    def features(self, x):
        return self.body(x).mean((2, 3))

    def forward(self, x):
        if self.training:  # (the seed the global generator was last given: the micro-batch's; NumPy's, Python's draws)
            SEEDS.append((torch.initial_seed(), np.random.random(), random.random()))
        return self.head(self.features(x))


SEEDS: list[tuple[int, float, float]] = []


def dropped(*, n_classes: int, ch: int = 8, img_channels: int = 3):
    return _Dropped(n_classes, img_channels)


@pytest.fixture
def family(monkeypatch):
    from bigbatch.models import registry

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    registry.register(init="kaiming", task="classify")(dropped)


def weights(run, kimg="000000.256"):
    return load_file(run / "checkpoints" / kimg / "model.safetensors")


def test_a_familys_dropout_trains_the_same_weights_again_and_after_a_resume(tmp_path, family):
    cfg = tiny(**{"model.name": "dropped", "model.options": {}, "train.kimg": 0.256, "eval.every_kimg": 0})
    cfg = cfg.override({"checkpoint.every_kimg": 0.128, "train.micro_batch": 16})
    torch.manual_seed(7)
    caller = torch.get_rng_state()
    SEEDS.clear()
    one = weights(bigbatch.train(cfg, run_dir=tmp_path / "one", quiet=True))
    assert torch.equal(torch.get_rng_state(), caller)  # the caller's generator as it was
    # Each micro-batch of each step seeded anew (4 steps of 4 micro-batches: batch 64, micro-batch 16), ...
    seeds, SEEDS[:] = list(SEEDS), []
    assert len(seeds) == 16 and len(set(seeds)) == 16
    np.random.seed(1), random.seed(1)  # (a process of other draws before: none of it reaches the run)
    again = weights(bigbatch.train(cfg, run_dir=tmp_path / "again", quiet=True))
    assert SEEDS == seeds  # ... and alike on a rerun (NumPy's and Python's too: found from outside, left unseeded)
    SEEDS.clear()
    bigbatch.train(cfg.override({"train.kimg": 0.128}), run_dir=tmp_path / "resumed", quiet=True)
    resumed = weights(bigbatch.train(cfg, run_dir=tmp_path / "resumed", resume=True, quiet=True))
    assert SEEDS == seeds  # and after a resume
    other = weights(bigbatch.train(cfg.override({"train.seed": 1}), run_dir=tmp_path / "other", quiet=True))
    for k in one:
        assert torch.equal(one[k], again[k]) and torch.equal(one[k], resumed[k]), k
    assert not torch.equal(one["head.weight"], other["head.weight"])  # (the seed decides: the same init, not masks)


def test_drop_path_and_drop_rate_follow_timms_rules():
    torch.manual_seed(0)
    net = create_classifier("resnet50", 10, ch=8, drop_rate=0.25, drop_path_rate=0.3)
    plain = create_classifier("resnet50", 10, ch=8)
    plain.load_state_dict(net.state_dict())  # (no weights of their own: the state dicts are torchvision's)
    rates = [block.drop_path for block in net.blocks()]  # from 0 at the first block to the rate at the last
    assert rates[0] == 0 and rates[-1] == pytest.approx(0.3) and rates == sorted(rates) and len(rates) == 16
    x = torch.randn(64, 3, 32, 32)
    net.eval(), plain.eval()
    assert torch.equal(net(x), plain(x))  # nothing dropped where it is scored
    # In training, each image's branch is kept or zeroed whole, the kept ones scaled by 1 / (1 - p) ...
    scale = drop_path(torch.ones(4000, 3, 2, 2, dtype=torch.float64), 0.3, True).flatten(1)
    assert torch.equal(scale, scale[:, :1].expand_as(scale))  # (one draw an image)
    assert set(scale[:, 0].tolist()) == {0.0, 1 / 0.7}
    assert (scale[:, 0] == 0).double().mean() == pytest.approx(0.3, abs=0.03)
    # ... as each block does to its residual branch: one that drops everything is its shortcut.
    block = net.blocks()[-1].train()
    block.drop_path = 1 - 1e-9
    h = torch.randn(2, block.conv1.in_channels, 2, 2)
    assert torch.equal(block(h), torch.relu(h))
    net.train()
    assert not torch.equal(net(x), net(x))  # dropout before the head, drawn again each forward
    with pytest.raises(bigbatch.BigbatchError, match=r"model option drop_path_rate must be a probability in \[0, 1\)"):
        create_classifier("resnet_cifar", 10, ch=8, depth=8, drop_path_rate=1.0)
