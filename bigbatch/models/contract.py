"""The contract a user's own model family keeps (the registry's docstring), checked on two inputs as a task builds
it, so that a family that breaks it stops the run in one line naming the rule, before anything trains (found from
outside: a G that took class labels alone died at its first checkpoint's previews, and every resume with it; a D's
logits of another shape were a torch error inside the task, or advice about learning rates; a classifier's, an
IndexError). bigbatch's own families are not checked: their tests are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError, first_line

N = 2  # inputs a check takes


@contextmanager
def _evaluating(*nets: nn.Module) -> Iterator[None]:
    """The nets in eval mode (no statistics updated, no power iteration stored), no gradients, the RNG as it was."""
    modes = [(m, m.training) for net in nets for m in net.modules()]  # (each its own: a frozen part kept in eval)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # (the CPU's: the check runs there)
            for net in nets:
                net.eval()
            yield
    finally:
        for m, mode in modes:
            m.training = mode


def _shape(name: str, what: str, got: object, want: tuple[int, ...], rule: str) -> None:
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    if shape != want:
        raise BigbatchError(f"{name}'s {what} returned {shape} for {N} inputs, not {want}: {rule}")


def check_gan(name: str, G: nn.Module, D: nn.Module, n_classes: int, img_channels: int, resolution: int) -> None:
    """G(z, y) -> (N, img_channels, R, R) for y None (unconditional), labels (N,) and class weights (N, n_classes)
    alike (the previews blend classes), and D(x, y) -> (N,) logits; G's attributes."""
    missing = [a for a in ("resolution", "n_classes", "dim_z", "img_channels") if not hasattr(G, a)]
    if missing:
        raise BigbatchError(f"{name}'s G lacks the attributes {', '.join(missing)}, which the GAN task reads")
    labels = torch.arange(N) % n_classes if n_classes else None
    inputs = [("y = None", None)] if not n_classes else [("labels (N,)", labels)]
    inputs += [("class weights (N, n_classes)", F.one_hot(labels, n_classes).float())] if n_classes else []
    with _evaluating(G, D):
        z = torch.randn(N, G.dim_z)
        for said, y in inputs:
            try:
                x = G(z, y)
            except Exception as e:  # noqa: BLE001 -- the user's forward: its own error, first line, and the rule
                if y is None or y.dim() == 1:
                    raise  # (its own bug: the user's traceback)
                raise BigbatchError(
                    f"{name}'s G(z, y) failed on {said} ({type(e).__name__}: {first_line(e)}): a conditional G takes "
                    "class labels (N,) and class weights (N, n_classes) alike (the previews blend classes), e.g. "
                    "an embedding's weight matrix multiplied by y where y is 2-D"
                ) from None
            want = (N, img_channels, resolution, resolution)
            _shape(name, f"G(z, y) on {said}", x, want, "G returns images NCHW at data.resolution")
            if x.dtype != z.dtype:  # (found from outside: float64 images, torch's error out of the user's D)
                raise BigbatchError(
                    f"{name}'s G(z, y) returned {str(x.dtype).removeprefix('torch.')} images for float32 z: G returns "
                    "images in z's dtype (autocast picks the compute dtype under bf16 and fp16)"
                )
        logits = D(x, labels)  # ((N, 1) and a patch D's (N, h, w) too: the losses take their means)
        # (found from outside: a head of (N, 3), its classes', trained on their mean without a word)
        wide = isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.shape[1] != 1
        if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or len(logits) != N or wide:
            rule = "D returns one logit an image, (N,) or (N, 1) (or a patch D's (N, h, w))"
            _shape(name, "D(x, y)", logits, (N,), rule)


def check_classifier(name: str, net: nn.Module, n_classes: int, img_channels: int, resolution: int) -> None:
    """net(x) -> (N, n_classes) logits, and its `feature_dim`."""
    if not hasattr(net, "feature_dim"):
        raise BigbatchError(f"{name} lacks the attribute feature_dim (the width of features(x)), which eval reads")
    with _evaluating(net):
        x = torch.randn(N, img_channels, resolution, resolution)
        _shape(name, "forward(x)", net(x), (N, n_classes), "a classifier returns logits (N, n_classes)")
