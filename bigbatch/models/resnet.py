"""ResNet image classifiers (He et al. 2016, "Deep Residual Learning for Image Recognition"): the
ImageNet ResNet-18 and ResNet-50, and the small CIFAR ResNet of the paper's §4.2 (ResNet-20/32/56...).

The ImageNet networks follow torchvision's `torchvision/models/resnet.py` layout ("ResNet v1.5": a
bottleneck's stride is on its 3x3 conv, not its first 1x1), with its module names (conv1, bn1,
layer1.0.conv1, layer1.0.downsample.0, ..., fc), so torchvision's weights load by name and parameter
counts equal torchvision's. torchvision is not a dependency: the architecture is written here.

bigbatch feeds a classifier `uint8 / 127.5 - 1`; torchvision's and timm's ImageNet weights were trained on
`(uint8 / 255 - mean) / std` with ImageNet's statistics. The option `input_stats = "imagenet"` turns the first into
the second inside the network (two constants, not saved: the state dict stays torchvision's), exactly, the stem's
zero padding included, so that such weights see what they were trained on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models.registry import check_classifier, register

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # torchvision's and timm's normalization
INPUT_STATS = ("", "imagenet")


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth (Huang et al. 2016) as timm's drop_path: each image's residual branch zeroed with probability
    `p` in training, kept ones scaled by 1 / (1 - p); drawn from torch's global generator on x's device, which the
    training loop seeds before each micro-batch (the same masks on a rerun, a resume, any split over processes)."""
    if not (p and training):
        return x
    keep = 1.0 - p
    return x * x.new_empty((len(x),) + (1,) * (x.dim() - 1)).bernoulli_(keep).div_(keep)


class BlurConv2d(nn.Conv2d):
    """A strided conv that sees its input low-passed first (anti-aliased downsampling, Zhang 2019, "Making
    Convolutional Networks Shift-Invariant Again"; FFCV's ResNet recipes' `use_blurpool`): each channel blurred by
    the binomial 3x3 filter [1, 2, 1] x [1, 2, 1] / 16, stride 1, zero padding 1, then the conv as it was. A Conv2d
    still, of the same weights and names (the filter is a constant, not saved): a state dict loads either way."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._add_blur()

    def _add_blur(self) -> None:
        taps = torch.tensor([1.0, 2.0, 1.0], device=self.weight.device)
        blur = (taps[:, None] * taps[None, :] / 16).expand(self.in_channels, 1, 3, 3).contiguous()
        self.register_buffer("blur", blur, persistent=False)

    @classmethod
    def of(cls, conv: nn.Conv2d) -> BlurConv2d:
        """`conv` itself made a BlurConv2d: its weights as they are, no new ones drawn (the same seed then builds the
        same weights with blurpool as without: found by review, each conv made again drew from the global RNG)."""
        conv.__class__ = cls
        conv._add_blur()
        return conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blur = self.blur.to(x.dtype)  # (under autocast the input may be of another precision than the buffer)
        return super().forward(F.conv2d(x, blur, padding=1, groups=self.in_channels))


BLUR_FROM = 16  # channels a strided conv's input has at least to be blurred (FFCV's rule: not the RGB stem)


def blur_strided_convs(net: nn.Module) -> None:
    """Every strided conv of `net` whose input has BLUR_FROM channels or more made a BlurConv2d."""
    for conv in list(net.modules()):
        if type(conv) is nn.Conv2d and max(conv.stride) > 1 and conv.in_channels >= BLUR_FROM:
            BlurConv2d.of(conv)


def conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)). The shortcut
    is the identity, or `downsample` (1x1 conv + BN, He et al.'s option B) where the shape changes."""

    expansion = 1

    def __init__(
        self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None, drop_path: float = 0.0
    ):
        super().__init__()
        self.drop_path = drop_path  # (its residual branch's, `drop_path`)
        self.conv1 = conv3x3(in_ch, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        """The BN that ends the residual branch: with its gain zero the block starts as its shortcut."""
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = drop_path(self.bn2(self.conv2(out)), self.drop_path, self.training)
        return self.relu(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 conv to `width`, 3x3 conv (with the block's stride, as torchvision v1.5), 1x1 conv to
    4·width, then the shortcut added as in BasicBlock."""

    expansion = 4

    def __init__(
        self, in_ch: int, width: int, stride: int = 1, downsample: nn.Module | None = None, drop_path: float = 0.0
    ):
        super().__init__()
        self.drop_path = drop_path  # (its residual branch's, `drop_path`)
        self.conv1 = conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        """The BN that ends the residual branch: with its gain zero the block starts as its shortcut."""
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = drop_path(self.bn3(self.conv3(out)), self.drop_path, self.training)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """Stem, stages of residual blocks (widths ch, 2ch, 4ch, ...; every stage after the first halves
    the resolution in its first block), global average pooling and a linear head.

    `cifar_stem`: one 3x3 conv at full resolution (He et al. 2016 §4.2), instead of ImageNet's 7x7
    conv with stride 2 and 3x3 max pooling with stride 2. Global pooling makes one network take any
    input size; the ImageNet stem and stages downsample it 32 times, the CIFAR ones 4 times.

    timm's regularizers, in training only: `drop_rate`, dropout of the pooled features before the head;
    `drop_path_rate`, stochastic depth rising linearly over the blocks from 0 at the first to it at the last (timm's
    ResNet's rule). `blurpool`: each strided conv of 16 input channels or more low-passes its input first
    (BlurConv2d, FFCV's ResNet recipes'; the weights and their names the same).
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        depths: list[int],
        *,
        n_classes: int,
        ch: int,
        img_channels: int,
        cifar_stem: bool,
        zero_init_residual: bool,
        input_stats: str = "",
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        blurpool: bool = False,
    ):
        super().__init__()
        for name, p in (("drop_rate", drop_rate), ("drop_path_rate", drop_path_rate)):
            if not 0.0 <= p < 1.0:  # (NaN too)
                raise BigbatchError(f"model option {name} must be a probability in [0, 1), got {p}")
        self.n_classes, self.img_channels, self.drop_rate = n_classes, img_channels, drop_rate
        self.zero_init_residual = zero_init_residual
        if input_stats not in INPUT_STATS or (input_stats and img_channels != 3):
            raise BigbatchError(
                f'model option input_stats must be "" or "imagenet" (of RGB images, img_channels 3), got '
                f"{input_stats!r} with img_channels {img_channels}"
            )
        self.input_stats = input_stats
        if input_stats:  # [-1, 1] -> ((x + 1) / 2 - mean) / std, channel by channel
            mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
            self.register_buffer("input_scale", 0.5 / std, persistent=False)
            self.register_buffer("input_shift", (0.5 - mean) / std, persistent=False)
        if cifar_stem:
            self.conv1 = conv3x3(img_channels, ch)
        else:
            self.conv1 = nn.Conv2d(img_channels, ch, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = None if cifar_stem else nn.MaxPool2d(3, stride=2, padding=1)
        in_ch, total, index = ch, sum(depths), 0
        self.checkpoint_blocks: list[str] = []
        for i, depth in enumerate(depths):
            width, stride = ch * 2**i, 1 if i == 0 else 2
            blocks = []
            for j in range(depth):
                downsample = None
                if j == 0 and (stride != 1 or in_ch != width * block.expansion):
                    downsample = nn.Sequential(
                        conv1x1(in_ch, width * block.expansion, stride), nn.BatchNorm2d(width * block.expansion)
                    )
                rate = drop_path_rate * index / max(total - 1, 1)
                blocks.append(block(in_ch, width, stride if j == 0 else 1, downsample, rate))
                in_ch, index = width * block.expansion, index + 1
                self.checkpoint_blocks.append(f"layer{i + 1}.{j}")
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.n_stages = len(depths)
        self.feature_dim = in_ch
        self.fc = nn.Linear(in_ch, n_classes)
        if blurpool:
            blur_strided_convs(self)

    def blocks(self) -> list[BasicBlock | Bottleneck]:
        """The residual blocks, in order (those `checkpoint_blocks` names)."""
        return [self.get_submodule(name) for name in self.checkpoint_blocks]

    def after_init(self) -> None:
        """Called by the registry after the init scheme: with zero_init_residual, zero the gain of the
        last BN of every residual block, so each block starts as its shortcut and the network as a
        shallow one (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour";
        torchvision's zero_init_residual; the `bn0` of fast.ai's imagenet18)."""
        if self.zero_init_residual:
            for block in self.blocks():
                nn.init.zeros_(block.last_bn.weight)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, img_channels, H, W) -> the pooled penultimate features (N, feature_dim)."""
        if self.input_stats:
            x = x * self.input_scale + self.input_shift
        x = self.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.n_stages):
            x = self.get_submodule(f"layer{i + 1}")(x)
        # The global average as a mean: AdaptiveAvgPool2d's CUDA backward has no deterministic kernel, which
        # train.deterministic would refuse.
        return x.mean((2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (N, img_channels, H, W) -> logits (N, n_classes)."""
        return self.fc(F.dropout(self.features(x), self.drop_rate, self.training))


def _imagenet(family: str, block: type[BasicBlock] | type[Bottleneck], depths: list[int], **options: Any) -> nn.Module:
    """An ImageNet ResNet of `block`s, `depths` a stage, with a family's `options` (n_classes, ch, ...)."""
    check_classifier(family, options["n_classes"], options["ch"], options["img_channels"])
    return ResNet(block, depths, cifar_stem=False, **options)


@register(init="kaiming", task="classify")
def resnet18(
    *,
    n_classes: int,
    ch: int = 64,
    img_channels: int = 3,
    zero_init_residual: bool = False,
    input_stats: str = "",
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    blurpool: bool = False,
) -> nn.Module:
    """ResNet-18: BasicBlocks [2, 2, 2, 2]; 11,689,512 parameters with 1000 classes at ch 64."""
    return _imagenet("resnet18", BasicBlock, [2, 2, 2, 2], **locals())  # (its options: the registry reads them here)


@register(init="kaiming", task="classify")
def resnet50(
    *,
    n_classes: int,
    ch: int = 64,
    img_channels: int = 3,
    zero_init_residual: bool = False,
    input_stats: str = "",
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    blurpool: bool = False,
) -> nn.Module:
    """ResNet-50 (v1.5): Bottlenecks [3, 4, 6, 3]; 25,557,032 parameters with 1000 classes at ch 64."""
    return _imagenet("resnet50", Bottleneck, [3, 4, 6, 3], **locals())  # (its options: the registry reads them here)


@register(init="kaiming", task="classify")
def resnet_cifar(
    *,
    n_classes: int,
    ch: int = 16,
    img_channels: int = 3,
    depth: int = 20,
    zero_init_residual: bool = False,
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    blurpool: bool = False,
) -> nn.Module:
    """The CIFAR ResNet of He et al. 2016 §4.2 for 28-32 px images: depth 6n+2 (20, 32, 44, 56, 110),
    three stages of n BasicBlocks at widths ch, 2ch, 4ch; projection shortcuts (option B) where the
    shape changes, where the paper's CIFAR nets pad with zeros (option A)."""
    check_classifier("resnet_cifar", n_classes, ch, img_channels)
    if depth < 8 or (depth - 2) % 6:
        raise BigbatchError(f"resnet_cifar option depth must be 6n+2 with n >= 1 (20, 32, 44, 56, 110), got {depth}")
    n = (depth - 2) // 6
    return ResNet(
        BasicBlock,
        [n, n, n],
        n_classes=n_classes,
        ch=ch,
        img_channels=img_channels,
        cifar_stem=True,
        zero_init_residual=zero_init_residual,
        drop_rate=drop_rate,
        drop_path_rate=drop_path_rate,
        blurpool=blurpool,
    )
