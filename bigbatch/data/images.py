"""Images held in RAM: uint8 NHWC with int64 labels and class names (built-in data sets, data.in_ram)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageData:
    """Images (N, H, W, C) uint8 and labels (N,) int64 in RAM, with the class names."""

    images: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]
    source: str

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def resolution(self) -> int:
        return self.images.shape[1]

    @property
    def channels(self) -> int:
        return self.images.shape[3]

    @property
    def content_hash(self) -> str:
        """The hash `bigbatch prepare` writes for these images and labels (equal for equal content)."""
        from bigbatch.data.h5write import hash_arrays

        return hash_arrays(self.class_names, self.images.numpy(), self.labels.numpy())

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]
