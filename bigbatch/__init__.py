"""bigbatch: large-batch training of image models (GANs, classifiers) on the hardware people have."""

from bigbatch import models
from bigbatch.config import Config
from bigbatch.engine.replicator import InputContext, Replicator
from bigbatch.errors import BigbatchError
from bigbatch.metrics.classifier import load_classifier
from bigbatch.presets import list_presets, preset
from bigbatch.sampling import sample, standing_stats
from bigbatch.tasks.gan.load import load_generator
from bigbatch.train import train

__version__ = "0.1.0"
__all__ = [
    "BigbatchError",
    "Config",
    "InputContext",
    "Replicator",
    "list_presets",
    "load_classifier",
    "load_generator",
    "models",
    "preset",
    "sample",
    "standing_stats",
    "train",
]
