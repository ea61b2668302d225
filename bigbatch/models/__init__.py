"""Model families: plain nn.Module (G, D) pairs, built by name."""

from bigbatch.models import biggan, biggan_deep, dcgan, sngan  # noqa: F401  (registers the families)
from bigbatch.models.registry import create, list_models, register

__all__ = ["create", "list_models", "register"]
