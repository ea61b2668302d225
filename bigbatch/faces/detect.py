"""Face boxes: MTCNN (Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded
Convolutional Networks"), with the P/R/O-net weights facenet-pytorch ships (MIT; `pip install --no-deps
facenet-pytorch`). The cascade is written here because facenet-pytorch's own imports torchvision's compiled NMS,
which bigbatch keeps out of its core; its weight files are read as state dicts (weights_only), nothing of its
code runs. A proposal net slides over an image pyramid, a refine net and an output net re-score and regress
the boxes; crops that leave the image are padded with black, as the paper's reference code pads them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch import safe_pickle
from bigbatch.errors import BigbatchError


@dataclass
class Detection:
    """One face: its box (left, top, right, bottom, in pixels), the output net's score, and MTCNN's five points
    (eyes, nose, mouth corners; (5, 2))."""

    box: np.ndarray
    score: float
    points: np.ndarray

    @property
    def area(self) -> float:
        return float((self.box[2] - self.box[0]) * (self.box[3] - self.box[1]))


class _PNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1, self.conv4_2 = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 2, 2, ceil_mode=True)
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), F.softmax(self.conv4_1(x), dim=1)


def _flatten_transposed(x: torch.Tensor) -> torch.Tensor:
    """The dense layers were trained on (w, h, c)-ordered features (the original Caffe nets saw transposed
    images), so the feature map is flattened in that order."""
    return x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)


class _RNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1, self.dense5_2 = nn.Linear(128, 2), nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = self.prelu4(self.dense4(_flatten_transposed(self.prelu3(self.conv3(x)))))
        return self.dense5_2(x), F.softmax(self.dense5_1(x), dim=1)


class _ONet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1, self.dense6_2, self.dense6_3 = nn.Linear(256, 2), nn.Linear(256, 4), nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu3(self.conv3(x)), 2, 2, ceil_mode=True)
        x = self.prelu5(self.dense5(_flatten_transposed(self.prelu4(self.conv4(x)))))
        return self.dense6_2(x), self.dense6_3(x), F.softmax(self.dense6_1(x), dim=1)


def mtcnn_weights() -> Path:
    """The folder holding pnet.pt, rnet.pt and onet.pt: facenet-pytorch's data folder, found without
    importing the package (its import needs torchvision's compiled ops)."""
    spec = importlib.util.find_spec("facenet_pytorch")
    places = spec.submodule_search_locations if spec else None
    folder = Path(next(iter(places))) / "data" if places else None
    if folder is None or not (folder / "onet.pt").is_file():
        raise BigbatchError(
            "face detection needs MTCNN's weights from facenet-pytorch: pip install --no-deps facenet-pytorch==2.6.0 "
            "(--no-deps: it pins an old torch)"
        )
    return folder


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, by_min: bool = False) -> np.ndarray:
    """Greedy non-maximum suppression, the indices kept, best first. Overlap is intersection over union, or
    over the smaller box (`by_min`, the output stage's, which drops a box inside another). Areas count
    pixels inclusively, as MTCNN's reference code does."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        inter = w * h
        overlap = inter / (np.minimum(area[i], area[rest]) if by_min else area[i] + area[rest] - inter)
        order = rest[overlap <= threshold]
    return np.array(keep, dtype=np.int64)


def _regress(boxes: np.ndarray, reg: np.ndarray, inclusive: bool) -> np.ndarray:
    w = boxes[:, 2] - boxes[:, 0] + inclusive
    h = boxes[:, 3] - boxes[:, 1] + inclusive
    out = boxes.copy()
    out[:, :4] = boxes[:, :4] + reg * np.stack([w, h, w, h], 1)
    return out


def _square(boxes: np.ndarray) -> np.ndarray:
    out = boxes.copy()
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    out[:, 0] = boxes[:, 0] + w * 0.5 - side * 0.5
    out[:, 1] = boxes[:, 1] + h * 0.5 - side * 0.5
    out[:, 2:4] = out[:, 0:2] + side[:, None]
    return out


def _crops(image: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    """Each box's pixels (inclusive integer bounds, black where it leaves the image) resized to size²."""
    h, w = image.shape[:2]
    out = np.empty((len(boxes), size, size, 3), np.float32)
    for i, (x1, y1, x2, y2) in enumerate(np.trunc(boxes[:, :4]).astype(np.int64)):
        bw, bh = x2 - x1 + 1, y2 - y1 + 1
        patch = np.zeros((max(bh, 1), max(bw, 1), 3), np.uint8)
        sx, sy, ex, ey = max(x1, 0), max(y1, 0), min(x2 + 1, w), min(y2 + 1, h)
        if ex > sx and ey > sy:
            patch[sy - y1 : ey - y1, sx - x1 : ex - x1] = image[sy:ey, sx:ex]
        out[i] = cv2.resize(patch, (size, size), interpolation=cv2.INTER_AREA)
    return out


class MTCNN:
    """Faces in an RGB uint8 image, largest first. `min_face`: the smallest face side searched for, in
    pixels; `thresholds`: the three stages' scores (the paper's 0.6, 0.7, 0.7)."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        min_face: int = 40,
        thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
        factor: float = 0.709,
        weights: Path | None = None,
    ) -> None:
        folder = Path(weights) if weights is not None else mtcnn_weights()
        self.device = torch.device(device)
        self.nets = []
        for name, net in (("pnet", _PNet()), ("rnet", _RNet()), ("onet", _ONet())):
            state = safe_pickle.torch_weights((folder / f"{name}.pt").read_bytes(), str(folder / f"{name}.pt"))
            net.load_state_dict(state)
            self.nets.append(net.eval().requires_grad_(False).to(self.device))
        self.min_face, self.thresholds, self.factor = min_face, thresholds, factor

    def _tensor(self, images: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).to(self.device)
        return (x.permute(0, 3, 1, 2) - 127.5) * 0.0078125

    @torch.inference_mode()
    def __call__(self, image: np.ndarray, min_face: int | None = None) -> list[Detection]:
        """The faces of an RGB uint8 image (h, w, 3), largest first; `min_face` overrides the smallest side
        searched for."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"MTCNN takes an RGB uint8 image (h, w, 3), got {image.dtype} {image.shape}")
        pnet, rnet, onet = self.nets
        h, w = image.shape[:2]
        t1, t2, t3 = self.thresholds

        # Proposals: the 12-pixel net over a pyramid whose largest level makes a min_face face 12 pixels.
        scale, found = 12.0 / (min_face or self.min_face), []
        on_cpu = self.device.type == "cpu"  # (OpenCV's area resize is 5x torch's there; on a GPU, torch's)
        full = image.astype(np.float32) if on_cpu else self._tensor(image[None])
        while min(h, w) * scale >= 12:
            size = (int(h * scale + 1), int(w * scale + 1))
            if on_cpu:
                level = self._tensor(cv2.resize(full, size[::-1], interpolation=cv2.INTER_AREA)[None])
            else:
                level = F.interpolate(full, size=size, mode="area")
            reg, prob = pnet(level)
            prob, reg = prob[0, 1].cpu().numpy(), reg[0].cpu().numpy()
            ys, xs = np.nonzero(prob >= t1)
            if len(ys):
                at = np.stack([xs, ys], 1).astype(np.float64)
                boxes = np.concatenate(
                    [np.floor((2 * at + 1) / scale), np.floor((2 * at + 12) / scale), prob[ys, xs, None],
                     reg[:, ys, xs].T], 1,
                )  # fmt: skip
                found.append(boxes[_nms(boxes[:, :4], boxes[:, 4], 0.5)])
            scale *= self.factor
        if not found:
            return []
        boxes = np.concatenate(found)
        boxes = boxes[_nms(boxes[:, :4], boxes[:, 4], 0.7)]
        boxes = _square(_regress(boxes[:, :5], boxes[:, 5:9], inclusive=False))

        # Refine: re-score 24-pixel crops of the proposals.
        reg, prob = (t.cpu().numpy() for t in rnet(self._tensor(_crops(image, boxes, 24))))
        keep = prob[:, 1] > t2
        boxes, reg = np.concatenate([boxes[keep, :4], prob[keep, 1:2]], 1), reg[keep]
        if not len(boxes):
            return []
        pick = _nms(boxes[:, :4], boxes[:, 4], 0.7)
        boxes = _square(_regress(boxes[pick], reg[pick], inclusive=True))

        # Output: 48-pixel crops give the final score, box and five points.
        reg, points, prob = (t.cpu().numpy() for t in onet(self._tensor(_crops(image, boxes, 48))))
        keep = prob[:, 1] > t3
        boxes, reg, points = np.concatenate([boxes[keep, :4], prob[keep, 1:2]], 1), reg[keep], points[keep]
        if not len(boxes):
            return []
        bw, bh = boxes[:, 2:3] - boxes[:, 0:1] + 1, boxes[:, 3:4] - boxes[:, 1:2] + 1
        points = np.stack([bw * points[:, :5] + boxes[:, 0:1] - 1, bh * points[:, 5:] + boxes[:, 1:2] - 1], -1)
        boxes = _regress(boxes, reg, inclusive=True)
        pick = _nms(boxes[:, :4], boxes[:, 4], 0.7, by_min=True)
        # The regression can shrink a box below the pyramid's floor: drop those, as DFL drops any box with a
        # side under its 40 px.
        side = np.minimum(boxes[pick, 2] - boxes[pick, 0], boxes[pick, 3] - boxes[pick, 1])
        pick = pick[side >= (min_face or self.min_face)]
        faces = [Detection(boxes[i, :4].copy(), float(boxes[i, 4]), points[i]) for i in pick]
        return sorted(faces, key=lambda f: -f.area)
