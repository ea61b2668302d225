"""Model families, built by name: plain nn.Module (G, D) pairs for the GAN, single classifiers, and
face-swap autoencoders and face segmenters."""

# The families register themselves; convert is bigbatch.models.convert (to_reference, as README has it).
from bigbatch.models import (  # noqa: F401
    biggan,
    biggan_deep,
    convert,
    convnet,
    dcgan,
    resnet,
    saehd,
    sngan,
    stylegan2,
    xseg,
)
from bigbatch.models.registry import (
    create,
    create_autoencoder,
    create_classifier,
    create_segmenter,
    list_models,
    register,
)

__all__ = ["create", "create_autoencoder", "create_classifier", "create_segmenter", "list_models", "register"]
