"""A small plain ConvNet classifier without normalization layers: three stages of two 3x3 convolutions
(the second strided), ReLU, global average pool, linear head. Its outputs do not depend on the other
images of a batch, so accumulation is exact and features do not depend on how they were batched: the
network of the metrics' offline "classifier" extractor (fcd), trained by the classify task."""

from __future__ import annotations

import torch
from torch import nn

from bigbatch.models.registry import check_classifier, register


class ConvNet(nn.Module):
    def __init__(self, n_classes: int, ch: int, img_channels: int):
        super().__init__()
        self.n_classes, self.img_channels = n_classes, img_channels
        layers: list[nn.Module] = []
        cin = img_channels
        for cout in (ch, 2 * ch, 4 * ch):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, 2, 1), nn.ReLU()]
            cin = cout
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, n_classes)
        self.feature_dim = cin
        self.checkpoint_blocks = ["body"]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled penultimate features (N, 4 ch)."""
        return self.body(x).mean((2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


@register(init="kaiming", task="classify")
def convnet(*, n_classes: int, ch: int = 16, img_channels: int = 3) -> nn.Module:
    """The plain ConvNet (features 4 x ch); any input of at least 8 px."""
    check_classifier("convnet", n_classes, ch, img_channels)
    return ConvNet(n_classes, ch, img_channels)
