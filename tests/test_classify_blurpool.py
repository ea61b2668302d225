"""BlurPool (FFCV's ResNet recipes' use_blurpool, found missing from outside): each strided conv of 16 input channels
or more low-passes its input with the binomial filter first; the weights and their names stay torchvision's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import bigbatch
from bigbatch.cli import main
from bigbatch.models.resnet import BlurConv2d


def test_blurpool_blurs_the_strided_convs_of_16_channels_or_more_and_keeps_the_weights_names():
    torch.manual_seed(0)
    plain = bigbatch.models.create_classifier("resnet50", 10, ch=16)
    torch.manual_seed(0)
    blurred = bigbatch.models.create_classifier("resnet50", 10, ch=16, blurpool=True)
    # The same weights and names, drawn alike from one seed (an A/B of BlurPool alone: found by review).
    assert all(torch.equal(v, blurred.state_dict()[k]) for k, v in plain.state_dict().items())
    assert plain.state_dict().keys() == blurred.state_dict().keys()
    convs = {name for name, m in blurred.named_modules() if isinstance(m, BlurConv2d)}
    # Each stage after the first: its first block's 3x3 conv and its shortcut's 1x1; the RGB stem is not.
    assert convs == {f"layer{i}.0.{c}" for i in (2, 3, 4) for c in ("conv2", "downsample.0")}, convs
    conv = blurred.get_submodule("layer2.0.conv2")
    x = torch.randn(2, conv.in_channels, 9, 9)
    taps = torch.tensor([1.0, 2.0, 1.0])
    low = F.conv2d(x, (taps[:, None] * taps / 16).expand(conv.in_channels, 1, 3, 3), padding=1, groups=x.shape[1])
    torch.testing.assert_close(conv(x), F.conv2d(low, conv.weight, stride=2, padding=1))
    shifted = torch.randn(1, 3, 64, 64)
    assert not torch.allclose(plain.eval()(shifted), blurred.eval()(shifted))


def test_a_blurpool_classifier_trains_from_the_command_line(tmp_path, capsys):
    args = ["train", "--preset", "fashion_resnet", "--run-dir", str(tmp_path / "r"), "data.path=builtin:digits"]
    args += ["data.val_path=", "data.val_fraction=0.2", "data.resolution=16", "data.schedule=0:16:32"]
    args += ["model.ch=16", "model.options={depth=8, blurpool=true}", "train.kimg=0.064", "train.batch=32"]
    args += ["train.micro_batch=32", "train.lr_batch=32", "eval.every_kimg=0", "--quiet"]
    assert main(args) == 0
    net = bigbatch.load_classifier(str(tmp_path / "r"))
    assert any(isinstance(m, BlurConv2d) for m in net.modules())  # (found by review: an option ignored would pass)
    capsys.readouterr()
    assert main([*args[:3], "--dry-run", "model.name=resnet_cifar", "model.options={blurpool=1}"]) == 2
    assert "option 'blurpool' of 'resnet_cifar' must be bool, got 1" in capsys.readouterr().err
