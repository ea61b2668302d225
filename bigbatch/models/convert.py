"""Weights in BigGAN-PyTorch's layout (its G.pth, G_ema.pth, D.pth) to bigbatch's, and back.

The name mapping, per module (ours -> BigGAN-PyTorch):
  blocks.{i}                -> blocks.{i}.0                (biggan, sagan; biggan_deep's G)
  blocks.{k}                -> blocks.{k // depth}.{k % depth}   (biggan_deep's D: `depth` blocks per stage)
  attention                 -> the block list it follows, next slot (e.g. blocks.3.1; deep D: blocks.0.2)
  out_bn, out_conv          -> output_layer.0, output_layer.2
  <bn>.bn.running_mean/var  -> <bn>.stored_mean / stored_var   (conditional BN)
  out_bn.weight/bias/running_* -> output_layer.0.gain / bias / stored_*
  <sn layer>.sn_u           -> <sn layer>.u0        (sv0 and our sn_v are derived, see below)
Everything else keeps its name (shared, linear, embed, input_conv, conv1..4, conv_sc, theta, phi, g, o, gamma,
gain, bias). BigGAN-deep's G joins its conditioning as [shared(y), z] (BigGANdeep.py's forward), ours as [z,
shared(y)]: the columns of the weights that read it (its first linear, every conditional BN's) change places
(found from outside: with dim_z = shared_dim, 128 each, the weights loaded and gave other images). BigGAN-PyTorch
runs one power iteration from its stored u0 at every forward, even in eval mode, and divides by the resulting
sigma; the import runs that same iteration once and stores its u and v, so the imported model computes exactly the
reference's sigma.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError, first_line, named_few, warn
from bigbatch.models import biggan, biggan_deep, convert_ada
from bigbatch.models.layers import SpectralNorm
from bigbatch.safe_pickle import torch_weights

FAMILIES = ("biggan", "sagan", "biggan_deep", "stylegan2")  # stylegan2: StyleGAN2-ADA's layout (convert_ada)
IGNORED = ("sv0", "accumulation_counter")  # derived or bookkeeping entries of the reference layout


def _head(net: nn.Module, parts: list[str]) -> tuple[str, list[str]]:
    """The reference name of the module a key starts with, and the rest of the key."""
    first = parts[0]
    deep_d = isinstance(net, biggan_deep.BigGANDeepDiscriminator)
    if first == "blocks":
        k = int(parts[1])
        head = f"blocks.{k // net.depth}.{k % net.depth}" if deep_d else f"blocks.{k}.0"
        return head, parts[2:]
    if first == "attention":
        k = net.attn_after
        head = f"blocks.{k // net.depth}.{net.depth}" if deep_d else f"blocks.{k}.1"
        return head, parts[1:]
    if first in ("out_bn", "out_conv"):
        return {"out_bn": "output_layer.0", "out_conv": "output_layer.2"}[first], parts[1:]
    return first, parts[1:]


_BN = {"running_mean": "stored_mean", "running_var": "stored_var", "weight": "gain", "bias": "bias"}


def reference_name(net: nn.Module, key: str) -> str | None:
    """BigGAN-PyTorch's name of our state-dict entry `key`, or None for entries it derives or lacks."""
    head, rest = _head(net, key.split("."))
    if rest[-1] in ("sn_v", "num_batches_tracked"):
        return None
    if rest[-1] == "sn_u":
        rest = rest[:-1] + ["u0"]
    elif head == "output_layer.0" and rest[-1] in _BN:
        rest = [_BN[rest[-1]]]
    elif len(rest) >= 2 and rest[-2] == "bn" and rest[-1] in _BN:  # conditional BN: its statistics sit on it
        rest = rest[:-2] + [_BN[rest[-1]]]
    return ".".join([head, *rest])


def _check_family(net: nn.Module) -> None:
    kinds = (
        biggan.BigGANGenerator,
        biggan.BigGANDiscriminator,
        biggan_deep.BigGANDeepGenerator,
        biggan_deep.BigGANDeepDiscriminator,
    )
    if not isinstance(net, kinds) or getattr(net, "reference_family", None) == "sngan":  # (found from outside: an
        raise BigbatchError(  # sngan, built of BigGAN's classes, was given a layout nothing of BigGAN-PyTorch's loads)
            f"BigGAN-PyTorch weights convert only into the families {', '.join(FAMILIES)}; got "
            f"{getattr(net, 'reference_family', None) or type(net).__name__}"
        )
    if getattr(net, "classify", None) is not None:  # (model.options.d_cond "AC": found by review)
        raise BigbatchError(
            'a D with an auxiliary classifier (d_cond "AC" or "ADC") has no BigGAN-PyTorch layout: its Ds project'
        )


def _joined(net: nn.Module) -> list[str]:
    """The entries of a BigGAN-deep G that read its conditioning (their columns in the other order than the
    reference's, see the module's docstring)."""
    if not isinstance(net, biggan_deep.BigGANDeepGenerator) or net.shared is None:
        return []
    keys = net.state_dict()
    return [k for k in keys if k == "linear.weight" or re.fullmatch(r"blocks\.\d+\.bn\d+\.(gain|bias)\.weight", k)]


def _first_last(w: torch.Tensor, first: int) -> torch.Tensor:
    """`w` with its first `first` columns moved after the others."""
    return torch.cat([w[:, first:], w[:, :first]], dim=1)


def _sn_layers(net: nn.Module) -> dict[str, SpectralNorm]:
    return {name: m for name, m in net.named_modules() if isinstance(m, SpectralNorm)}


def from_reference(net: nn.Module, ref: dict[str, torch.Tensor], what: str = "the weights") -> dict[str, torch.Tensor]:
    """Our state dict for `net` from a state dict in BigGAN-PyTorch's layout (a StyleGAN2's: in StyleGAN2-ADA's);
    raises BigbatchError naming the first missing, unexpected or misshapen entries."""
    if convert_ada.is_stylegan2(net):
        return convert_ada.from_ada(net, ref, what)
    _check_family(net)
    ours = net.state_dict()

    def adapt(key: str, value: torch.Tensor) -> torch.Tensor:
        return value.reshape(1, -1) if key.endswith("sn_u") else value

    out, used, problems = convert_ada.take_entries(ours, ref, lambda key: reference_name(net, key), adapt)
    unexpected = [k for k in ref if k not in used and k.rsplit(".", 1)[-1] not in IGNORED]
    problems += [f"unexpected {k}" for k in unexpected]
    if problems:
        raise BigbatchError(
            f"{what} are not BigGAN-PyTorch weights of this model ({len(problems)} problem{'s' * (len(problems) > 1)}: "
            f"{'; '.join(problems[:3])}); check model.name, ch, dim_z, data.resolution and the options"
        )
    for key in _joined(net):  # [shared(y), z] -> [z, shared(y)]
        out[key] = _first_last(out[key], out[key].shape[1] - net.dim_z)
    for name, layer in _sn_layers(net).items():
        prefix = f"{name}." if name else ""
        w = out[prefix + "weight"].float().flatten(1)
        with torch.no_grad():
            v = F.normalize(out[prefix + "sn_u"].float() @ w, dim=1, eps=layer.sn_eps)
            u = F.normalize(v @ w.t(), dim=1, eps=layer.sn_eps)
        out[prefix + "sn_u"], out[prefix + "sn_v"] = u, v
    for key in ours:
        if key.endswith("num_batches_tracked"):
            out[key] = torch.zeros((), dtype=torch.long)
    return out


def to_reference(net: nn.Module) -> dict[str, torch.Tensor]:
    """`net`'s weights in BigGAN-PyTorch's layout (sv0 our estimate); a StyleGAN2's in ADA's.

    BigGAN-PyTorch's spectral norm runs a power iteration from u0 in every forward, in eval mode too, and divides
    by v W^T u of that iteration's v = normalize(u0 W) and u: |W v|. Ours divides by u W v^T of the vectors our
    last iteration left, which is |W v| as well (u is normalize(v W^T)). So u0 is the u whose u0 W points along
    our v (least squares, in float64): its one iteration then gives our v, and its forward our sigma (found from
    outside: u0 = our u, one iteration further, gave other images, 0.05 apart on outputs of 0.4)."""
    if convert_ada.is_stylegan2(net):
        return convert_ada.to_ada(net)
    _check_family(net)
    ours = net.state_dict()
    out, inexact = {}, []
    for key, value in ours.items():
        name = reference_name(net, key)
        if name is not None:
            out[name] = value.detach().clone(memory_format=torch.contiguous_format)  # (channels-last: unsaveable)
    for name, layer in _sn_layers(net).items():
        prefix = f"{name}." if name else ""
        with torch.no_grad():
            w = layer.weight.flatten(1)
            sigma = layer.sn_u @ w @ layer.sn_v.t()
            if w.is_meta:  # (names alone, of a model not allocated)
                u0 = layer.sn_u
            else:
                # (on the CPU, whose driver takes a rank-deficient W: CUDA's assumes full rank)
                w64, v = w.double().cpu(), layer.sn_v.double().cpu()
                sigma64 = float(layer.sn_u.double().cpu() @ w64 @ v.t())  # (float32's rounding: no false warning)
                v, exact = _of_norm(w64, v, sigma64)
                inexact += [] if exact else [name]
                u0 = torch.linalg.lstsq(w64.t(), v.t()).solution.t()
                u0 = F.normalize(u0, dim=1).to(layer.sn_u.dtype).to(layer.sn_u.device)
        u_name = reference_name(net, prefix + "sn_u")
        out[u_name] = u0.contiguous()
        out[u_name[: -len("u0")] + "sv0"] = sigma.reshape(1).detach().clone()
    for key in _joined(net):  # [z, shared(y)] -> [shared(y), z] (u0 reads the rows: the same either way)
        out[reference_name(net, key)] = _first_last(out[reference_name(net, key)], net.dim_z)
    if inexact:
        warn(
            f"{named_few(inexact, 3)}: no u0 gives BigGAN-PyTorch's forward this model's spectral norm (an average of "
            "G's weights keeps G's vectors; BigGAN-PyTorch's averages and iterates on its own): the "
            "nearest is written, and its images differ a little from these"
        )
    return out


def _of_norm(w: torch.Tensor, v: torch.Tensor, sigma: float) -> tuple[torch.Tensor, bool]:
    """A unit row `v`, or, where |W v| is not `sigma` (an averaged model's: G_ema's W is averaged, its vectors are
    G's, found from outside: its images 0.21 apart once back in BigGAN-PyTorch), the unit vector of W's row space
    nearest it whose image's norm is `sigma`: BigGAN-PyTorch's forward divides by |W normalize(u0 W)|, which no u0
    makes other than such a vector's. Turned from `v` toward the right singular vector of W's least nonzero singular
    value (whose image is the shortest of the row space), by bisection along the arc between them; the nearer end
    where none between has that norm, and False (vectors far from W's top singular pair, a model's never trained,
    are taken as they are)."""
    if abs(float(torch.linalg.vector_norm(v @ w.t())) - sigma) <= 1e-6 * sigma:  # (float32 vectors' rounding)
        return v, True
    _, s, vh = torch.linalg.svd(w, full_matrices=False)
    if not sigma >= float(s[0]) / 2:  # (vectors that hold no estimate of it yet, a model never trained: as they are)
        return v, True
    rows = vh[s > s[0] * 1e-10]  # the row space's orthonormal basis
    near = F.normalize((v @ rows.t()) @ rows, dim=1)
    low = rows[-1:] * (1.0 if float(near @ rows[-1]) >= 0 else -1.0)

    def image(t: float) -> tuple[torch.Tensor, float]:
        x = F.normalize(math.cos(t) * near + math.sin(t) * low, dim=1)
        return x, float(torch.linalg.vector_norm(x @ w.t()))

    lo, hi = 0.0, math.pi / 2
    (start, top), (end, bottom) = image(lo), image(hi)
    if top <= sigma or bottom >= sigma:  # (no vector between: the nearer end)
        x, norm = (start, top) if top <= sigma else (end, bottom)
        return x, abs(norm - sigma) <= 1e-6 * sigma
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if image(mid)[1] > sigma else (lo, mid)
    return image((lo + hi) / 2)[0], True


def load_reference_file(path: str) -> dict[str, torch.Tensor]:
    """A BigGAN-PyTorch .pth state dict (or StyleGAN2-ADA's), read without unpickling anything but tensors, or a
    .safetensors file of one. A state dict nested under "state_dict" (StudioGAN's and Lightning's files) is taken
    out of it, a DataParallel's "module." prefix dropped, and the statistics of BigGAN-PyTorch's --mybn and
    --cross_replica batch norms (<bn>.bn.stored_* or running_*) named as its default's (<bn>.stored_*)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise BigbatchError(f"{path} does not exist") from None
    except OSError as e:
        raise BigbatchError(f"cannot read {path}: {e.strerror or e}") from None
    if str(path).endswith(".safetensors"):  # (found from outside: refused, advising a .safetensors file)
        from safetensors.torch import load

        try:
            sd = load(data)
        except Exception as e:  # noqa: BLE001 -- safetensors raises several types on bad files
            raise BigbatchError(f"{path} is not a readable safetensors file ({first_line(e)})") from None
    else:
        sd = torch_weights(data, str(path))
    nested = sd.get("state_dict") if isinstance(sd, dict) else None
    if isinstance(nested, dict) and all(isinstance(v, torch.Tensor) for v in nested.values()):
        sd = nested  # (found from outside: StudioGAN's {"state_dict": ..., "optimizer": ...} was "no state dict")
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise BigbatchError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    if all(k.startswith("module.") for k in sd):
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
    return {_MYBN.sub(r".stored_\1", k): v for k, v in sd.items() if not _MYBN_COUNT.search(k)}


# BigGAN-PyTorch's ccbn and bn under --mybn (myBN: stored_mean, stored_var, accumulation_counter) or --cross_replica
# (SyncBN2d: running_mean, running_var, num_batches_tracked) keep their statistics one module down, on `.bn`.
_MYBN = re.compile(r"\.bn\.(?:stored|running)_(mean|var)$")
_MYBN_COUNT = re.compile(r"\.bn\.(?:accumulation_counter|num_batches_tracked)$")
