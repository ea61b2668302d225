"""The offline feature extractor: a small classifier trained on the data set itself with bigbatch's
engine, for when no Inception weights are present or the domain is far from ImageNet (digits, say).

Its Fréchet distance is reported as `fcd` (Fréchet classifier distance), never as FID: the numbers are
comparable only between runs scored by the same classifier (same data, options and seed, which key
its cache file). It learns the data set's labels when there are at least two classes, otherwise which
of four rotations an image was given (a label-free task that still needs the image's content).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.data.streams import GlobalOrder
from bigbatch.engine import dist
from bigbatch.engine.replicator import InputContext, Replicator
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write
from bigbatch.metrics.cache import cache_dir, data_digest
from bigbatch.metrics.features import Extractor, resolve_device, to_nchw

CLASSIFIER_VERSION = "1"


@dataclass(frozen=True)
class ClassifierOptions:
    """What decides the classifier (all of it keys its cache file, with the data's hash)."""

    resolution: int = 32
    """Images are resized to this (bilinear, antialiased) before the network."""
    width: int = 16
    """Channels of the first stage; the features have 4 x width dimensions."""
    steps: int = 500
    """Optimizer steps of training."""
    batch: int = 64
    """Images per optimizer step, over all ranks."""
    lr: float = 2e-3
    """Peak learning rate of Adam under a one-cycle schedule."""
    seed: int = 0
    """Initialization and data order."""


class Classifier(nn.Module):
    """Three stages of two 3x3 convolutions (the second strided), global average pool, linear head.
    No BatchNorm, so features do not depend on the batch and accumulation is exact."""

    def __init__(self, n_classes: int, width: int = 16, resolution: int = 32):
        super().__init__()
        self.n_classes, self.width, self.resolution = n_classes, width, resolution
        layers: list[nn.Module] = []
        cin = 3
        for cout in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, 2, 1), nn.ReLU()]
            cin = cout
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, n_classes)
        # Set after training to the features' RMS on the data, so that fcd and kcd do not scale with
        # whatever magnitude training happened to give the features (the polynomial kernel of KID
        # assumes features of order one).
        self.register_buffer("feature_scale", torch.ones(()))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        pool = self.body(x).mean((2, 3))
        return {"pool": pool / self.feature_scale, "logits": self.head(pool)}


def prepare(images: torch.Tensor, resolution: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 images -> float (N, 3, resolution, resolution) in [-1, 1]."""
    x = to_nchw(images).to(device).float() / 127.5 - 1
    if x.shape[-1] != resolution or x.shape[-2] != resolution:
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=True)
    return x


class ClassifierExtractor(Extractor):
    def __init__(self, model: Classifier, device: torch.device | str = "cpu", key: str = ""):
        self.name = self.family = "classifier"
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.dims, self.has_logits = 4 * model.width, True
        h = hashlib.sha256(f"classifier/{CLASSIFIER_VERSION}/{model.resolution}".encode())
        for k, v in sorted(model.state_dict().items()):
            h.update(k.encode() + v.detach().cpu().contiguous().numpy().tobytes())
        self.digest = h.hexdigest()
        self.key = key

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model(prepare(images, self.model.resolution, self.device))


def _task(data: object) -> tuple[str, int]:
    n = len(getattr(data, "class_names", None) or [])
    return ("labels", n) if n >= 2 else ("rotation", 4)


def train_classifier(
    data: object, options: ClassifierOptions = ClassifierOptions(), device: torch.device | str = "auto"
) -> Classifier:
    """Train the classifier on `data` with bigbatch.Replicator (one process or all ranks of torchrun).

    Step s reads the images at global positions s*batch .. (s+1)*batch-1 of a seeded endless order,
    each rank its share, so the weights do not depend on the number of ranks.
    """
    task, n_classes = _task(data)
    if len(data) < 2:
        raise BigbatchError(f"cannot train the feature classifier on {len(data)} images")
    torch.manual_seed(options.seed)
    model = Classifier(n_classes, options.width, options.resolution)
    ctx = dist.context(str(device) if str(device) in ("auto", "cpu", "cuda") else torch.device(device).type)
    batch = max(options.batch // ctx.world_size, 1) * ctx.world_size
    order = GlobalOrder(len(data), options.seed)
    with Replicator(batch=batch, micro_batch=batch // ctx.world_size, device=ctx.device.type) as rep:
        net = rep.prepare(model)
        opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=options.lr), "classifier")
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, options.lr, total_steps=options.steps, pct_start=0.15)

        def input_fn(c: InputContext):
            for step in range(options.steps):
                start = step * c.batch + c.rank * c.share  # this rank's share of the step's global positions
                images, labels = data.get(order.indices(start, c.share))
                x = prepare(images, options.resolution)
                if task == "rotation":
                    # The rotation of each image is a function of its global position, not of the rank.
                    labels = torch.arange(start, start + c.share) % 4
                    x = torch.stack([torch.rot90(xi, int(k), (1, 2)) for xi, k in zip(x, labels)])
                yield x, labels.long()

        def step_fn(micro):
            x, y = micro
            return F.cross_entropy(net(x)["logits"], y)

        for batch_data in rep.batches(input_fn):
            rep.step(step_fn, batch_data, opt)
            sched.step()
    model.eval()
    with torch.no_grad():
        # The same images on every rank, so every rank gets the same scale.
        images, _ = data.get(torch.arange(min(len(data), 1024)))
        pool = model.to("cpu")(prepare(images, options.resolution))["pool"]
        model.feature_scale.fill_(float(pool.pow(2).mean().sqrt().clamp_min(1e-12)))
    return model


def classifier_key(data_hash: str, options: ClassifierOptions) -> str:
    parts = {"version": CLASSIFIER_VERSION, "data": data_hash, **asdict(options)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def classifier_extractor(
    data: object,
    device: torch.device | str = "auto",
    options: ClassifierOptions | None = None,
    cache: bool = True,
    folder: str | Path | None = None,
) -> ClassifierExtractor:
    """The classifier for `data`: loaded from the cache (BIGBATCH_CACHE/classifiers/, or `folder`), or
    trained and saved there (safetensors) first."""
    from safetensors.torch import load_file, save

    options = options or ClassifierOptions()
    dev = resolve_device(device)
    key = classifier_key(data_digest(data), options)
    path = (Path(folder) if folder is not None else cache_dir() / "classifiers") / f"{key}.safetensors"
    _, n_classes = _task(data)
    if cache and dist.agree(path.is_file()):
        model = Classifier(n_classes, options.width, options.resolution)
        try:
            model.load_state_dict(load_file(path))
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
            raise BigbatchError(
                f"cannot load the cached classifier {path} ({type(e).__name__}); delete it to retrain"
            ) from None
        return ClassifierExtractor(model.eval(), dev, key)
    model = train_classifier(data, options, dev)
    if cache and dist.context().is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        atomic_write(path, save(state, metadata={"options": json.dumps(asdict(options))}))
    return ClassifierExtractor(model, dev, key)
