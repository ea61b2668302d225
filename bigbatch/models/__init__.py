"""Model families, built by name: plain nn.Module (G, D) pairs for the GAN, single classifiers, and
face-swap autoencoders."""

from bigbatch.models import biggan, biggan_deep, convnet, dcgan, resnet, saehd, sngan, stylegan2  # noqa: F401  (registers the families)
from bigbatch.models.registry import create, create_autoencoder, create_classifier, list_models, register

__all__ = ["create", "create_autoencoder", "create_classifier", "list_models", "register"]
