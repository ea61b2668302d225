"""bigbatch: large-batch training of image models (GANs, classifiers) on the hardware people have.

The public names below are imported on first use, so that `import bigbatch.cli` (the `bigbatch`
command) is quick and installs its signal handlers before torch loads."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# CUDA's caching allocator grows its segments in place rather than keeping fixed ones that fragment. On an
# H200, SAEHD 512's probe at batch 8 (bf16, checkpointing) held 4.90 GiB for 3.57 GiB allocated by default,
# 3.90 GiB so; only so does that batch train in one pass in 6 GiB. Read when CUDA first allocates, so this
# holds in a process that imports bigbatch before using CUDA; a setting of the user's own (either name,
# even empty) is left alone.
if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

# Public name -> the module that defines it ("data", "models", "launch" and "sampling" are the modules themselves).
_EXPORTS = {
    "BigbatchError": "bigbatch.errors",
    "Config": "bigbatch.config",
    "data": "bigbatch.data",
    "EMA": "bigbatch.engine.ema",
    "InputContext": "bigbatch.engine.context",
    "launch": "bigbatch.launch",
    "Replicator": "bigbatch.engine.replicator",
    "list_presets": "bigbatch.presets",
    "load_classifier": "bigbatch.metrics.classifier",
    "load_generator": "bigbatch.tasks.gan.load",
    "models": "bigbatch.models",
    "preset": "bigbatch.presets",
    "sample": "bigbatch.sampling",
    "sampling": "bigbatch.sampling",  # (bigbatch.sampling.draw_latents, as README has it: found from outside)
    "standing_stats": "bigbatch.sampling",
    "Stopped": "bigbatch.signals",
    "sweep": "bigbatch.sweeps",
    "train": "bigbatch.loop",
}
__all__ = [
    "BigbatchError",
    "Config",
    "data",
    "EMA",
    "InputContext",
    "Replicator",
    "launch",
    "list_presets",
    "load_classifier",
    "load_generator",
    "models",
    "preset",
    "sample",
    "sampling",
    "standing_stats",
    "Stopped",
    "sweep",
    "train",
]

if TYPE_CHECKING:
    from bigbatch import data, launch, models, sampling
    from bigbatch.config import Config
    from bigbatch.engine.context import InputContext
    from bigbatch.engine.ema import EMA
    from bigbatch.engine.replicator import Replicator
    from bigbatch.errors import BigbatchError
    from bigbatch.loop import train
    from bigbatch.metrics.classifier import load_classifier
    from bigbatch.presets import list_presets, preset
    from bigbatch.sampling import sample, standing_stats
    from bigbatch.signals import Stopped
    from bigbatch.sweeps import sweep
    from bigbatch.tasks.gan.load import load_generator


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bigbatch' has no attribute '{name}'")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name in ("data", "models", "launch", "sampling") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
