"""Model families, built by name: plain nn.Module (G, D) pairs for the GAN, single classifiers, and
face-swap autoencoders and face segmenters."""

from bigbatch.models import biggan, biggan_deep, convnet, dcgan, resnet, saehd, sngan, stylegan2, xseg  # noqa: F401  (registers the families)
from bigbatch.models.registry import (
    create,
    create_autoencoder,
    create_classifier,
    create_segmenter,
    list_models,
    register,
)

__all__ = ["create", "create_autoencoder", "create_classifier", "create_segmenter", "list_models", "register"]
