"""Classifier feature extractors: the penultimate features of an image classifier, for when no
Inception weights are present or the domain is far from ImageNet (digits, say).

- "classifier": a small network (the `convnet` family, no normalization layers) trained on the data set
  itself by the classify task (bigbatch.tasks.classify.features.classifier_extractor, which sits above
  the metrics and hands them the finished extractor), cached under BIGBATCH_CACHE/classifiers/ by the
  data's hash and the options; the metrics only load it from there. It learns the data's labels when
  there are at least two classes, otherwise which of four rotations an image was given.
- "classifier:RUN": the classifier of a classify run (its checkpoints/best/, else its latest
  checkpoint), e.g. a ResNet trained with `bigbatch train --preset fashion_resnet_fast`.

Their Fréchet distance is reported as `fcd` (Fréchet classifier distance), never as FID: the numbers
are comparable only between runs scored by the same classifier (its digest keys the statistics cache).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigbatch import checkpoint_find, checkpoints, models
from bigbatch.config import Config
from bigbatch.data.schedule import resize_batch, resolution_scored
from bigbatch.engine import dist
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.metrics.cache import data_digest
from bigbatch.metrics.features import Extractor, resolve_device, to_nchw
from bigbatch.sampling import from_uint8
from bigbatch.user_cache import cache_dir

CLASSIFIER_VERSION = "2"  # 2: the convnet family trained by the classify task
FEATURE_NET = "convnet"


@dataclass(frozen=True)
class ClassifierOptions:
    """What decides the data set's own classifier (all of it keys its cache file, with the data's hash)."""

    resolution: int = 32
    """Images are resized to this (bicubic, antialiased, as the training loader does) before the network."""
    width: int = 16
    """Channels of the first stage; the features have 4 x width dimensions."""
    steps: int = 500
    """Optimizer steps of training."""
    batch: int = 64
    """Images per optimizer step, over all ranks."""
    lr: float = 2e-3
    """Peak learning rate of AdamW: warm-up over 15% of the steps, then cosine decay."""
    seed: int = 0
    """Initialization and data order."""


def uses_rotation(data: object) -> bool:
    """Whether the data set's classifier learns rotations (fewer than two classes) rather than labels."""
    return len(getattr(data, "class_names", None) or []) < 2


class ClassifierExtractor(Extractor):
    """Features of a classifier with `features(x)` and an `fc` head: images resized to `resolution`
    (bicubic, antialiased, uint8, as the classify task's loader), scaled to [-1, 1]; the features
    divided by `scale` (the data's feature RMS for the data set's own classifier, so that fcd and kcd
    do not scale with whatever magnitude training gave the features)."""

    def __init__(
        self, net: nn.Module, resolution: int, scale: float = 1.0, device: torch.device | str = "cpu", key: str = ""
    ):
        self.name = self.family = "classifier"
        self.device = torch.device(device)
        self.net = net.to(self.device).eval().requires_grad_(False)
        self.resolution, self.scale, self.key = resolution, float(scale), key
        self.dims, self.has_logits = int(net.feature_dim), True
        h = hashlib.sha256(f"classifier/{CLASSIFIER_VERSION}/{resolution}/{self.scale!r}".encode())
        for k, v in sorted(net.state_dict().items()):
            h.update(k.encode() + v.detach().cpu().contiguous().numpy().tobytes())
        self.digest = h.hexdigest()

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        nhwc = to_nchw(images).permute(0, 2, 3, 1)
        x = from_uint8(resize_batch(nhwc, self.resolution).to(self.device))
        return x[:, : self.net.img_channels]

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        pool = self.net.features(self.inputs(images))
        return {"pool": pool / self.scale, "logits": self.net.fc(pool)}


def classifier_key(data_hash: str, options: ClassifierOptions) -> str:
    parts = {"version": CLASSIFIER_VERSION, "data": data_hash, **asdict(options)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def feature_scale(net: nn.Module, data: Any, resolution: int) -> float:
    """The RMS of the features over the data's first 1024 images (the same images on every rank)."""
    probe = ClassifierExtractor(net, resolution)
    images, _ = data.get(torch.arange(min(len(data), 1024)))
    with torch.no_grad():
        pool = probe.net.features(probe.inputs(images))
    return float(pool.pow(2).mean().sqrt().clamp_min(1e-12))


def classifier_file(data: object, options: ClassifierOptions, folder: str | Path | None = None) -> Path:
    """Where the data set's own classifier trained with `options` is cached: BIGBATCH_CACHE/classifiers/
    (or `folder`), named by the key of the data's hash and the options."""
    key = classifier_key(data_digest(data), options)
    return (Path(folder) if folder is not None else cache_dir() / "classifiers") / f"{key}.safetensors"


def read_classifier(
    file: Path, data: object, options: ClassifierOptions, device: torch.device | str = "auto"
) -> ClassifierExtractor | None:
    """The data set's own classifier from its cache `file` (see `classifier_file`), or None when no rank
    has it there."""
    from safetensors.torch import load_file

    if not dist.agree(file.is_file()):
        return None
    n_classes = 4 if uses_rotation(data) else data.n_classes  # type: ignore[attr-defined]
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        net = models.create_classifier(FEATURE_NET, n_classes, ch=options.width, img_channels=data.channels)  # type: ignore[attr-defined]
    try:
        state = load_file(file)
        scale = float(state.pop("feature_scale"))
        net.load_state_dict(state)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
        raise BigbatchError(
            f"cannot load the cached classifier {file} ({type(e).__name__}); delete it to retrain"
        ) from None
    return ClassifierExtractor(net, options.resolution, scale, resolve_device(device), file.stem)


def trained_classifier(
    net: nn.Module,
    file: Path,
    data: object,
    options: ClassifierOptions,
    device: torch.device | str = "auto",
    save: bool = True,
) -> ClassifierExtractor:
    """The extractor of `net`, the data set's own classifier just trained on `data` with `options`: its
    features scaled by their RMS over the data, and saved to its cache `file` by the main process when
    `save` (the classify task trains it: bigbatch.tasks.classify.features.classifier_extractor)."""
    from safetensors.torch import save as to_bytes

    scale = feature_scale(net, data, options.resolution)
    if save and dist.context().is_main:
        file.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
        state["feature_scale"] = torch.tensor(scale)
        atomic_write(file, to_bytes(state, metadata={"options": json.dumps(asdict(options))}))
    return ClassifierExtractor(net, options.resolution, scale, resolve_device(device), file.stem)


def cached_classifier_extractor(
    data: object,
    device: torch.device | str = "auto",
    options: ClassifierOptions | None = None,
    folder: str | Path | None = None,
) -> ClassifierExtractor:
    """The "classifier" extractor as the metrics give it: the data set's own classifier loaded from the
    cache (BIGBATCH_CACHE/classifiers/, or `folder`). The metrics never train it: when it is not there,
    a one-line error says how to have the classify task train it."""
    options = options or ClassifierOptions()
    file = classifier_file(data, options, folder)
    found = read_classifier(file, data, options, device)
    if found is None:
        raise BigbatchError(
            f"no classifier of {getattr(data, 'source', 'this data set')} with these options is cached in "
            f"{file.parent}, and the metrics do not train one: build it with "
            "bigbatch.tasks.classify.features.classifier_extractor(data, options=...) and pass that as the extractor"
        )
    return found


def run_classifier_extractor(run: str | Path, device: torch.device | str = "auto") -> ClassifierExtractor:
    """ "classifier:RUN": the classifier of a classify run (checkpoints/best/ if it has one, else its
    latest checkpoint), at the resolution it is scored at (eval.resolution, else where that checkpoint last trained:
    found by review, the last phase's), its features unscaled."""
    dev = resolve_device(device)
    net = load_classifier(run, best=True)
    cfg = Config.load(Path(net.checkpoint) / "config.toml")
    resolution = resolution_scored(cfg, int((checkpoints.read_meta(Path(net.checkpoint)) or {}).get("nimg", 0)))
    extractor = ClassifierExtractor(net, resolution, 1.0, dev, key=str(net.checkpoint))
    extractor.name = f"classifier:{run}"  # what eval's JSON names: not the data set's own classifier
    return extractor


def load_classifier(path: str | Path, device: str | torch.device = "cpu", best: bool = False) -> nn.Module:
    """The classifier of a classify run (its latest complete checkpoint, or checkpoints/best/ with
    `best` when it has one) or of a checkpoint folder, in eval mode, with `class_names` and
    `checkpoint`. It takes float NCHW images in [-1, 1] (uint8 / 127.5 - 1) of any size;
    `features(x)` gives its penultimate features, `fc` maps them to logits."""
    path = Path(path)
    ckpt = checkpoints.best_checkpoint(path) if best and path.is_dir() else None
    if ckpt is not None:
        return _load_classifier(ckpt, device)
    return checkpoint_find.read_newest(path, lambda ckpt: _load_classifier(ckpt, device))


def classifier_weights(ckpt: Path, cfg: Config | None = None) -> dict[str, torch.Tensor]:
    """The state dict of a classify checkpoint's network as it is put to use: the average of its
    weights when the run kept one (train.model_ema_kimg), else the weights it trained."""
    cfg = cfg or Config.load(Path(ckpt) / "config.toml")
    key = "model_ema" if cfg.task == "classify" and cfg.train.model_ema_kimg else "model"
    return checkpoints.load_checkpoint(ckpt, nets=(key,), state=False)[0][key]


def _load_classifier(ckpt: Path, device: str | torch.device) -> nn.Module:
    meta = checkpoints.model_info(ckpt)
    cfg = Config.load(ckpt / "config.toml")
    if cfg.task != "classify":
        raise BigbatchError(f'{ckpt} is a {cfg.task} run, not a classifier (task = "classify")')
    m = cfg.model
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten: leave the caller's RNG alone
        net = models.create_classifier(
            m.name, meta["n_classes"], ch=m.ch, img_channels=meta["img_channels"], **m.options
        )
    checkpoints.load_weights(net, classifier_weights(ckpt, cfg), f"the classifier of checkpoint {ckpt}")
    net.class_names = meta.get("class_names", [])
    net.checkpoint = str(ckpt)
    return net.to(device).eval().requires_grad_(False)
