"""StyleGAN2 weights in StyleGAN2-ADA's layout (the state dicts of its G, D and G_ema) to bigbatch's, and back.

ADA's snapshots are pickles, which hold code and are never unpickled here: save the state dicts in ADA's
own environment (`torch.save(snapshot[k].state_dict(), f"{k}.pth") for k in ("G", "D", "G_ema")`) and
`bigbatch convert` that folder. The name mapping (ours -> ADA's):
  G: mapping.fc.{i}.*        -> mapping.fc{i}.*          (mapping.embed.* as it is)
     w_avg                   -> mapping.w_avg
     blocks.{k}.*            -> synthesis.b{4 * 2^k}.*   (const, conv0, conv1, torgb and their noise images)
  D: fromrgb.*               -> b{resolution}.fromrgb.*
     blocks.{k}.*            -> b{resolution / 2^k}.*    (conv0, conv1, skip)
     conv.*, fc.*, out.*     -> b4.conv.*, b4.fc.*, b4.out.*
     mapping.fc.{i}.*        -> mapping.fc{i}.*
ADA's resample_filter buffers are the [1, 3, 3, 1] filter both sides use: checked on import, written on
export. With the weights copied, the two compute the same images (1.3e-5 apart on values up to 4.9) and logits:
`python bench/vs_stylegan2.py --ada PATH --check`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.models.stylegan2 import StyleGAN2Discriminator, StyleGAN2Generator, fir

KINDS = (StyleGAN2Generator, StyleGAN2Discriminator)


def is_stylegan2(net: nn.Module) -> bool:
    return isinstance(net, KINDS)


def ada_name(net: nn.Module, key: str) -> str:
    """ADA's name of our state-dict entry `key` of a StyleGAN2 G or D."""
    parts = key.split(".")
    if parts[0] == "mapping" and parts[1] == "fc":
        return ".".join(["mapping", f"fc{parts[2]}", *parts[3:]])
    if isinstance(net, StyleGAN2Generator):
        if key == "w_avg":
            return "mapping.w_avg"
        if parts[0] == "blocks":
            return ".".join(["synthesis", f"b{4 * 2 ** int(parts[1])}", *parts[2:]])
        return key
    if parts[0] == "fromrgb":
        return f"b{net.resolution}.{key}"
    if parts[0] == "blocks":
        return ".".join([f"b{net.resolution // 2 ** int(parts[1])}", *parts[2:]])
    if parts[0] in ("conv", "fc", "out"):
        return f"b4.{key}"
    return key


def _filters(net: nn.Module) -> list[str]:
    """ADA's names of the resample_filter buffers its version of `net` holds."""
    if isinstance(net, StyleGAN2Generator):
        out = []
        for k, block in enumerate(net.blocks):
            b = f"synthesis.b{4 * 2**k}"
            out += [f"{b}.resample_filter"] + ([] if block.first else [f"{b}.conv0.resample_filter"])
            out += [f"{b}.conv1.resample_filter"]
        return out
    out = []
    for k, block in enumerate(net.blocks):
        b = f"b{net.resolution // 2**k}"
        out += [f"{b}.resample_filter", f"{b}.conv0.resample_filter", f"{b}.conv1.resample_filter"]
        out += [f"{b}.skip.resample_filter"] if block.skip is not None else []
        out += [f"{b}.fromrgb.resample_filter"] if k == 0 else []
    return out + ["b4.conv.resample_filter"]


def take_entries(
    ours: dict[str, torch.Tensor],
    ref: dict[str, torch.Tensor],
    name_of: Callable[[str], str | None],
    adapt: Callable[[str, torch.Tensor], torch.Tensor] = lambda key, value: value,
) -> tuple[dict[str, torch.Tensor], set[str], list[str]]:
    """For each of our keys that `name_of` names in a reference layout, its entry of `ref` (`adapt`ed, in
    our dtype): (what was taken, the reference names used, the problems: missing or misshapen entries).
    Shared by the BigGAN-PyTorch and StyleGAN2-ADA conversions."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    problems: list[str] = []
    for key, mine in ours.items():
        name = name_of(key)
        if name is None:
            continue
        if name not in ref:
            problems.append(f"missing {name}")
            continue
        used.add(name)
        value = adapt(key, ref[name])
        if value.shape != mine.shape:
            problems.append(f"{name} has shape {tuple(value.shape)}, the model needs {tuple(mine.shape)}")
            continue
        out[key] = value.to(mine.dtype)
    return out, used, problems


def from_ada(net: nn.Module, ada: dict[str, torch.Tensor], what: str = "the weights") -> dict[str, torch.Tensor]:
    """Our state dict for a StyleGAN2 `net` from one in ADA's layout; BigbatchError naming the first missing,
    unexpected or misshapen entries."""
    out, used, problems = take_entries(net.state_dict(), ada, lambda key: ada_name(net, key))
    resample = fir()
    for name in ada:
        if name.endswith("resample_filter"):
            used.add(name)
            if ada[name].shape != resample.shape or not torch.allclose(ada[name].float(), resample):
                problems.append(f"{name} is not the [1, 3, 3, 1] filter this StyleGAN2 resamples with")
    problems += [f"unexpected {k}" for k in ada if k not in used]
    if problems:
        raise BigbatchError(
            f"{what} are not StyleGAN2-ADA weights of this model ({len(problems)} problem{'s' * (len(problems) > 1)}: "
            f"{'; '.join(problems[:3])}); check model.ch, model.dim_z, data.resolution and model.options "
            "(ch_max, w_dim, map_layers, d_map_layers, d_resnet)"
        )
    return out


def to_ada(net: nn.Module) -> dict[str, torch.Tensor]:
    """A StyleGAN2 `net`'s weights in ADA's layout, its resample_filter buffers included."""
    # (a channels-last model's in the standard layout: safetensors refuses other strides, found from outside)
    standard = torch.contiguous_format
    out = {ada_name(net, k): v.detach().clone(memory_format=standard) for k, v in net.state_dict().items()}
    return out | {name: fir() for name in _filters(net)}


def classes_of(ada: dict[str, torch.Tensor]) -> int:
    """The number of classes of an ADA G or D state dict: the width of its class embedding's input."""
    embed = ada.get("mapping.embed.weight")
    return 0 if embed is None else int(embed.shape[1])


def channels_of(ada: dict[str, torch.Tensor]) -> int:
    """The image channels of an ADA G or D state dict (its toRGB layers' outputs, its fromRGB's inputs; 1 for a
    grayscale data set's, found from outside: 3 was assumed)."""
    for k, w in ada.items():
        if k.endswith((".torgb.weight", ".fromrgb.weight")):
            return int(w.shape[0] if k.endswith(".torgb.weight") else w.shape[1])
    return 3


def architecture_of(ada: dict[str, torch.Tensor]) -> str:
    """ADA's architecture of a G or D state dict: "skip" (a G's default: an RGB output a block), "resnet" (a D's
    default: a residual skip a block) or "orig" (neither)."""
    if any(k.startswith("synthesis.") for k in ada):  # G
        blocks = {k.split(".")[1] for k in ada if k.startswith("synthesis.b")}
        rgb = {k.split(".")[1] for k in ada if k.startswith("synthesis.b") and ".torgb." in k}
        return "resnet" if any(".skip." in k for k in ada) else "skip" if rgb == blocks else "orig"
    rgb = {k.split(".")[0] for k in ada if ".fromrgb." in k}  # D: fromrgb in every block of skip's, the first else
    return "skip" if len(rgb) > 1 else "resnet" if any(".skip." in k for k in ada) else "orig"


def check_architectures(ada: dict[str, dict[str, torch.Tensor]], files: dict, d_resnet: bool) -> None:
    """One line where ADA's networks `ada` (by net name, read from `files`) are of an architecture this StyleGAN2 does
    not build: G "skip" (ADA's default), D "resnet" (its default; model.options.d_resnet) or "orig" (found from
    outside: refused naming options, ch_max and map_layers among them, that could not help)."""
    for net, sd in ada.items():
        arch, want = architecture_of(sd), ("resnet" if d_resnet else "orig") if net == "D" else "skip"
        if arch == want:
            continue
        if net == "D" and arch != "skip":
            fix = f": give model.options.d_resnet={str(arch == 'resnet').lower()}"
        else:
            built = "D as 'resnet' or 'orig'" if net == "D" else "G as ADA's default, architecture 'skip'"
            fix = f"; this StyleGAN2 builds {built} only (ADA's --cfg paper*, cifar and auto use those)"
        raise BigbatchError(f"{files[net]} holds ADA's {net} of architecture '{arch}'{fix}")


def resolution_of(ada: dict[str, torch.Tensor]) -> int:
    """The resolution of an ADA G state dict: its last synthesis block's."""
    sizes = [int(k.split(".")[1][1:]) for k in ada if k.startswith("synthesis.b")]
    return max(sizes) if sizes else 0
