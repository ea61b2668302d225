"""StyleGAN2-ADA's networks of an architecture this StyleGAN2 does not build (a G "orig" or "resnet", a D "skip"),
or a D's other than model.options.d_resnet says, are named as such by `bigbatch convert` in one line (they were
refused naming options, ch_max and map_layers among them, that could not help)."""

import pytest
import torch

from bigbatch import models
from bigbatch.cli import main
from bigbatch.models import convert

SIZES = ["data.resolution=16", "model.name=stylegan2", "model.ch=2", "model.dim_z=16"]
SIZES += ["model.options={ch_max=16, w_dim=16, map_layers=2}"]


def written(folder, edit=None):
    """ADA's G, D and G_ema of a 16 px StyleGAN2 as .pth files in `folder`, `edit(net, state dict)` applied."""
    torch.manual_seed(0)
    G, D = models.create("stylegan2", 16, 10, ch=2, dim_z=16, ch_max=16, w_dim=16, map_layers=2)
    folder.mkdir()
    for net, model in (("G", G), ("D", D), ("G_ema", G)):
        sd = convert.to_reference(model)
        if edit is not None:
            edit(net, sd)
        torch.save(sd, folder / f"{net}.pth")
    return folder


def g_resnet(net, sd):  # a residual skip in each synthesis block but the first (ADA's architecture="resnet")
    if net != "D":
        sd["synthesis.b8.skip.weight"] = torch.zeros(16, 16, 1, 1)


def g_orig(net, sd):  # an RGB output in the last block alone
    for k in [k for k in sd if k.startswith("synthesis.b8.torgb.")] if net != "D" else []:
        del sd[k]


def d_skip(net, sd):  # an RGB input in every block
    if net == "D":
        sd["b8.fromrgb.weight"], sd["b8.fromrgb.bias"] = torch.zeros(16, 3, 1, 1), torch.zeros(16)


def d_orig(net, sd):  # no residual skips
    for k in [k for k in sd if ".skip." in k] if net == "D" else []:
        del sd[k]


@pytest.mark.parametrize(
    "edit, said",
    [
        (g_resnet, "holds ADA's G of architecture 'resnet'; this StyleGAN2 builds G as ADA's default, architecture"),
        (g_orig, "holds ADA's G of architecture 'orig'; this StyleGAN2 builds G as ADA's default, architecture 'skip'"),
        (d_skip, "holds ADA's D of architecture 'skip'; this StyleGAN2 builds D as 'resnet' or 'orig' only"),
        (d_orig, "holds ADA's D of architecture 'orig': give model.options.d_resnet=false"),
    ],
)
def test_an_architecture_not_built_here_is_named(tmp_path, capsys, edit, said):
    ada = written(tmp_path / "ada", edit)
    assert main(["convert", str(ada), str(tmp_path / "out"), "--preset", "digits", *SIZES]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_d_without_residual_skips_converts_with_d_resnet_off(tmp_path, capsys):
    ada = written(tmp_path / "ada", d_orig)
    off = "model.options={ch_max=16, w_dim=16, map_layers=2, d_resnet=false}"
    assert main(["convert", str(ada), str(tmp_path / "out"), "--preset", "digits", *SIZES[:-1], off]) == 0
    plain = written(tmp_path / "plain")  # (ADA's defaults: as before)
    assert main(["convert", str(plain), str(tmp_path / "out2"), "--preset", "digits", *SIZES]) == 0
