"""DeepFaceLab's own detector and landmarker, for users who have DFL's weight files (facelib/S3FD.npy and
facelib/2DFAN.npy of any DFL install; they are not on any package index): `bigbatch extract --weights
DFL/facelib` then finds and landmarks faces exactly as DFL's extractor does.

- S3FD (Zhang et al. 2017, "S3FD: Single Shot Scale-invariant Face Detector"): a VGG-16 trunk, L2-normalised
  features at strides 4, 8, 16 and six score/box heads at strides 4 to 128; DFL's input sizing, decoding
  (anchors of 4x the stride, variances 0.1 and 0.2), NMS at 0.3, score 0.5, 40-px minimum and 10% longer box.
- 2DFAN-4 (Bulat and Tzimiropoulos 2017, "How far are we from solving the 2D & 3D face alignment problem?"):
  four stacked hourglasses giving 68 heatmaps of 64x64 for a 256x256 crop around the box; DFL's crop, and its
  decoding (argmax, a quarter pixel towards the larger neighbour, half a pixel, back to the frame).

The networks are written here from the papers and DFL's published layer list (leras layers: explicit symmetric
padding, BatchNorm at inference with eps 1e-5); the weight files are pickled dicts of arrays, read by the
restricted unpickler (bigbatch.safe_pickle: anything but arrays is refused). tests/test_faces_dfl_nets.py
checks both against DFL's own code run on seeded weights (tests/data/dfl_detect_golden.npz)."""

from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch import safe_pickle
from bigbatch.errors import BigbatchError
from bigbatch.faces.detect import Detection

S3FD_FILE, FAN_FILE = "S3FD.npy", "2DFAN.npy"


def _conv(cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None, bias: bool = True) -> nn.Conv2d:
    """leras's Conv2D: 'SAME' is symmetric padding of (k - 1) // 2 (not TensorFlow's), 'VALID' none."""
    return nn.Conv2d(cin, cout, k, stride, (k - 1) // 2 if pad is None else pad, bias=bias)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=1e-5)


class _L2Norm(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.pow(2).sum(1, keepdim=True).sqrt() + 1e-10) * self.weight


class S3FD(nn.Module):
    """The S3FD network as DFL builds it. Takes RGB float (N, 3, H, W) in 0..255; gives, per level, (scores
    (N, 2, h, w) after softmax, the face channel second; box offsets (N, 4, h, w))."""

    def __init__(self) -> None:
        super().__init__()
        vgg = [("1", 3, 64, 2), ("2", 64, 128, 2), ("3", 128, 256, 3), ("4", 256, 512, 3), ("5", 512, 512, 3)]
        for stage, cin, cout, n in vgg:
            for i in range(1, n + 1):
                setattr(self, f"conv{stage}_{i}", _conv(cin if i == 1 else cout, cout, 3))
        self.fc6 = _conv(512, 1024, 3, pad=3)  # (DFL's, as the S3FD PyTorch port: padding 3 without dilation)
        self.fc7 = _conv(1024, 1024, 1)
        self.conv6_1, self.conv6_2 = _conv(1024, 256, 1), _conv(256, 512, 3, stride=2)
        self.conv7_1, self.conv7_2 = _conv(512, 128, 1), _conv(128, 256, 3, stride=2)
        self.conv3_3_norm, self.conv4_3_norm, self.conv5_3_norm = _L2Norm(256), _L2Norm(512), _L2Norm(512)
        heads = [("conv3_3_norm", 256, 4), ("conv4_3_norm", 512, 2), ("conv5_3_norm", 512, 2), ("fc7", 1024, 2),
                 ("conv6_2", 512, 2), ("conv7_2", 256, 2)]  # fmt: skip
        for name, cin, classes in heads:
            setattr(self, f"{name}_mbox_conf", _conv(cin, classes, 3))
            setattr(self, f"{name}_mbox_loc", _conv(cin, 4, 3))
        self.register_buffer("mean", torch.tensor([104.0, 117.0, 123.0]).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x = x - self.mean
        feats = {}
        for stage, n in (("1", 2), ("2", 2), ("3", 3), ("4", 3), ("5", 3)):
            for i in range(1, n + 1):
                x = F.relu(getattr(self, f"conv{stage}_{i}")(x))
            if stage in ("3", "4", "5"):
                feats[stage] = x
            x = F.max_pool2d(x, 2, 2)
        x = F.relu(self.fc7(F.relu(self.fc6(x))))
        fc7 = x
        f6 = F.relu(self.conv6_2(F.relu(self.conv6_1(x))))
        f7 = F.relu(self.conv7_2(F.relu(self.conv7_1(f6))))
        levels = [
            ("conv3_3_norm", self.conv3_3_norm(feats["3"])),
            ("conv4_3_norm", self.conv4_3_norm(feats["4"])),
            ("conv5_3_norm", self.conv5_3_norm(feats["5"])),
            ("fc7", fc7),
            ("conv6_2", f6),
            ("conv7_2", f7),
        ]
        out = []
        for i, (name, f) in enumerate(levels):
            conf, loc = getattr(self, f"{name}_mbox_conf")(f), getattr(self, f"{name}_mbox_loc")(f)
            if i == 0:  # max-out background: three background logits, the largest against the face's
                conf = torch.cat([conf[:, :3].amax(1, keepdim=True), conf[:, 3:4]], 1)
            out.append((F.softmax(conf, dim=1), loc))
        return out


class _ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = _bn(cin), _conv(cin, cout // 2, 3, bias=False)
        self.bn2, self.conv2 = _bn(cout // 2), _conv(cout // 2, cout // 4, 3, bias=False)
        self.bn3, self.conv3 = _bn(cout // 4), _conv(cout // 4, cout // 4, 3, bias=False)
        self.down = cin != cout
        if self.down:
            self.down_bn1, self.down_conv1 = _bn(cin), _conv(cin, cout, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out1 = self.conv1(F.relu(self.bn1(x)))
        out2 = self.conv2(F.relu(self.bn2(out1)))
        out3 = self.conv3(F.relu(self.bn3(out2)))
        skip = self.down_conv1(F.relu(self.down_bn1(x))) if self.down else x
        return torch.cat([out1, out2, out3], 1) + skip


class _HourGlass(nn.Module):
    def __init__(self, cin: int, depth: int) -> None:
        super().__init__()
        self.b1, self.b2 = _ConvBlock(cin, 256), _ConvBlock(cin, 256)
        self.b2_plus = _HourGlass(256, depth - 1) if depth > 1 else _ConvBlock(256, 256)
        self.b3 = _ConvBlock(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.b3(self.b2_plus(self.b2(F.avg_pool2d(x, 2, 2))))
        return self.b1(x) + F.interpolate(low, scale_factor=2, mode="nearest")


class FAN(nn.Module):
    """2DFAN-4 as DFL builds it: RGB float (N, 3, 256, 256) in [0, 1] -> the last stack's 68 heatmaps (N, 68,
    64, 64)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(3, 64, 7, stride=2), _bn(64)
        self.conv2, self.conv3, self.conv4 = _ConvBlock(64, 128), _ConvBlock(128, 128), _ConvBlock(128, 256)
        self.m = nn.ModuleList(_HourGlass(256, 4) for _ in range(4))
        self.top_m = nn.ModuleList(_ConvBlock(256, 256) for _ in range(4))
        self.conv_last = nn.ModuleList(_conv(256, 256, 1, pad=0) for _ in range(4))
        self.bn_end = nn.ModuleList(_bn(256) for _ in range(4))
        self.l = nn.ModuleList(_conv(256, 68, 1, pad=0) for _ in range(4))  # noqa: E741 - DFL's name
        self.bl = nn.ModuleList(_conv(256, 256, 1, pad=0) for _ in range(3))
        self.al = nn.ModuleList(_conv(68, 256, 1, pad=0) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.conv4(self.conv3(F.avg_pool2d(self.conv2(x), 2, 2)))
        previous = x
        for i in range(4):
            ll = F.relu(self.bn_end[i](self.conv_last[i](self.top_m[i](self.m[i](previous)))))
            out = self.l[i](ll)
            if i < 3:
                previous = previous + self.bl[i](ll) + self.al[i](out)
        return out


def dfl_key(name: str) -> str:
    """The key DFL's save_weights gives a torch parameter: list items `m.0` as `m_0`, dots as scopes, and
    TensorFlow's `:0` (`m.0.b1.bn1.weight` -> `m_0/b1/bn1/weight:0`)."""
    return re.sub(r"\.(\d+)(?=\.)", r"_\1", name).replace(".", "/") + ":0"


def load_dfl_weights(net: nn.Module, path: Path) -> nn.Module:
    """`net` with the weights of DFL's file `path` (a pickled {key: array} dict, read restricted): kernels
    HWIO -> OIHW, L2Norm's (1, 1, 1, C) -> (1, C, 1, 1). One line naming a missing or misshapen weight."""
    if not path.is_file():
        raise BigbatchError(f"{path}: no such file (DFL keeps it in its facelib/ folder)")
    found = safe_pickle.loads(path.read_bytes(), str(path), "DeepFaceLab weight file")
    if not isinstance(found, dict):
        raise BigbatchError(f"{path} does not hold DeepFaceLab's weights (a dict of arrays)")
    state = {}
    for name, tensor in net.state_dict().items():
        if name.endswith("num_batches_tracked"):
            state[name] = tensor
            continue
        key = dfl_key(name)
        if key not in found:
            raise BigbatchError(f"{path} lacks {key}: not DFL's {type(net).__name__} weights")
        value = np.asarray(found[key], np.float32)
        if value.ndim == 4 and value.shape[:3] == (1, 1, 1) and tensor.dim() == 4 and tensor.shape[1] > 1:
            value = value.reshape(tensor.shape)  # L2Norm's scale, NHWC-shaped
        elif value.ndim == 4:
            value = value.transpose(3, 2, 0, 1)  # a kernel: HWIO -> OIHW
        if tuple(value.shape) != tuple(tensor.shape):
            raise BigbatchError(f"{path}: {key} is {value.shape}, DFL's {type(net).__name__} has {tuple(tensor.shape)}")
        state[name] = torch.from_numpy(np.ascontiguousarray(value))
    net.load_state_dict(state)
    return net.eval().requires_grad_(False)


def _nms(boxes: np.ndarray, threshold: float) -> list[int]:
    """DFL's refine_nms: greedy by score, inclusive pixel areas, overlap over the union."""
    x1, y1, x2, y2, scores = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]) + 1)
        overlap = w * h / (areas[i] + areas[order[1:]] - w * h)
        order = order[np.where(overlap <= threshold)[0] + 1]
    return keep


def decode(levels: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """DFL's S3FD refine: each level's scores (2, h, w) and offsets (4, h, w) -> integer boxes (l, t, r, b) of
    the faces scoring 0.5 or more after NMS at 0.3, in the network input's pixels."""
    found = []
    for i, (scores, offsets) in enumerate(levels):
        stride = 2 ** (i + 2)
        for y, x in zip(*np.where(scores[1] > 0.05)):
            size = stride * 4
            loc = offsets[:, y, x]
            centre = np.array([x * stride + stride / 2, y * stride + stride / 2]) + loc[:2] * 0.1 * size
            wh = size * np.exp(loc[2:] * 0.2)
            found.append([*(centre - wh / 2), *(centre + wh / 2), scores[1, y, x]])
    boxes = np.array(found) if found else np.zeros((1, 5))
    boxes = boxes[_nms(boxes, 0.3)]
    return [b[:4].astype(np.int64) for b in boxes if b[4] >= 0.5]


class S3FDDetector:
    """DFL's S3FDExtractor.extract as a detector: faces (largest first) with DFL's box (its bottom 10% lower)."""

    def __init__(self, folder: Path, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.net = load_dfl_weights(S3FD(), Path(folder) / S3FD_FILE).to(self.device)

    @torch.inference_mode()
    def __call__(self, image: np.ndarray, min_face: int | None = None) -> list[Detection]:
        h, w = image.shape[:2]
        if min(h, w) < 128:  # DFL: too small to look in
            return []
        d = max(w, h)
        scale = d / max(64, 640 if d >= 1280 else d / 2)
        small = cv2.resize(image, (int(w / scale), int(h / scale)), interpolation=cv2.INTER_LINEAR)
        x = torch.from_numpy(small.astype(np.float32)).permute(2, 0, 1)[None].to(self.device)
        levels = [(c[0].cpu().numpy(), r[0].cpu().numpy()) for c, r in self.net(x)]
        faces = []
        for box in decode(levels):
            x0, y0, x1, y1 = (v * scale for v in box)
            if min(x1 - x0, y1 - y0) < 40:  # (DFL's floor, whatever min_face says)
                continue
            y1 += (y1 - y0) * 0.1  # DFL: FAN needs the chin
            box = np.array([int(v) for v in (x0, y0, x1, y1)], np.float64)
            faces.append(Detection(box, 1.0, np.zeros((5, 2))))
        return sorted(faces, key=lambda f: -f.area)


def _from_crop(points: np.ndarray, centre: np.ndarray, scale: float, resolution: float) -> np.ndarray:
    """FAN's crop coordinates (of a `resolution` square) back to the frame (DFL's transform, inverted)."""
    h = 200.0 * scale
    return (points / (resolution / h)) - resolution * (-centre / h + 0.5) / (resolution / h)


def fan_crop(image: np.ndarray, centre: np.ndarray, scale: float) -> np.ndarray:
    """DFL's FAN crop: the square of side 200 x scale about `centre`, black outside the image, resized to 256
    (bilinear)."""
    ul = _from_crop(np.array([1.0, 1.0]), centre, scale, 256.0).astype(np.int64)
    br = _from_crop(np.array([256.0, 256.0]), centre, scale, 256.0).astype(np.int64)
    out = np.zeros((br[1] - ul[1], br[0] - ul[0], image.shape[2]), np.uint8)
    ht, wd = image.shape[:2]
    new_x = (max(1, -ul[0] + 1), min(br[0], wd) - ul[0])
    new_y = (max(1, -ul[1] + 1), min(br[1], ht) - ul[1])
    old_x = (max(1, ul[0] + 1), min(br[0], wd))
    old_y = (max(1, ul[1] + 1), min(br[1], ht))
    out[new_y[0] - 1 : new_y[1], new_x[0] - 1 : new_x[1]] = image[old_y[0] - 1 : old_y[1], old_x[0] - 1 : old_x[1]]
    return cv2.resize(out, (256, 256), interpolation=cv2.INTER_LINEAR)


def heatmap_points(maps: np.ndarray, centre: np.ndarray, scale: float) -> np.ndarray:
    """DFL's get_pts_from_predict: each heatmap's argmax, a quarter pixel towards its larger neighbours (inside
    the border), plus half a pixel, mapped from the 64-pixel map back to the frame."""
    n, mh, mw = maps.shape
    flat = maps.reshape(n, -1).argmax(1)
    pts = np.stack([flat % mw, flat // mw], 1).astype(np.float64)
    for i in range(n):
        px, py = int(pts[i, 0]), int(pts[i, 1])
        if 0 < px < 63 and 0 < py < 63:
            diff = np.array([maps[i, py, px + 1] - maps[i, py, px - 1], maps[i, py + 1, px] - maps[i, py - 1, px]])
            pts[i] += np.sign(diff) * 0.25
    pts += 0.5
    return _from_crop(pts, centre, scale, float(mw))


class FANLandmarks:
    """DFL's FANExtractor as a landmarker: 68 points for a box, from one crop or (`samples`) the mean of five
    (the centre and a pixel off diagonally each way), as DFL's second pass takes them."""

    def __init__(self, folder: Path, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.net = load_dfl_weights(FAN(), Path(folder) / FAN_FILE).to(self.device)

    @torch.inference_mode()
    def __call__(self, image: np.ndarray, box: np.ndarray, samples: bool = False) -> np.ndarray:
        x0, y0, x1, y1 = (float(v) for v in box[:4])
        scale = (x1 - x0 + y1 - y0) / 195.0
        centre = np.array([(x0 + x1) / 2.0, (y0 + y1) / 2.0])
        centres = [centre] + ([centre + d for d in ([-1, -1], [1, -1], [1, 1], [-1, 1])] if samples else [])
        crops = np.stack([fan_crop(image, c, scale) for c in centres]).astype(np.float32) / 255.0
        maps = self.net(torch.from_numpy(crops).permute(0, 3, 1, 2).to(self.device)).float().cpu().numpy()
        return np.mean([heatmap_points(m, c, scale) for m, c in zip(maps, centres)], axis=0).astype(np.float32)
