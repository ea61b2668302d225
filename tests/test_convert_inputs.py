"""`bigbatch convert` of the files users of BigGAN-PyTorch, StudioGAN and StyleGAN2-ADA have, as they have them:
each one read as its plain state dict is, or refused in one line that names the way on (found from outside)."""

import pytest
import torch
from safetensors.torch import save_file
from test_zoo import TINY_RUN, tiny_pair, write_reference_weights

import bigbatch
from bigbatch.checkpoints import load_checkpoint
from bigbatch.cli import main
from bigbatch.models import convert

CKPT = "checkpoints/000000.000"


def converted(src, out, *overrides) -> dict:
    assert main(["convert", str(src), str(out), *TINY_RUN, *overrides]) == 0
    weights, _ = load_checkpoint(out / CKPT, nets=("G", "D", "G_ema"))
    return weights


def same(a: dict, b: dict) -> bool:
    return all(a[net].keys() == b[net].keys() and all(torch.equal(a[net][k], b[net][k]) for k in a[net]) for net in a)


def test_wrapped_renamed_and_safetensors_files_convert_as_the_plain_state_dicts(tmp_path, capsys):
    G, D = tiny_pair("biggan")
    write_reference_weights(tmp_path / "plain", G, D)
    want = converted(tmp_path / "plain", tmp_path / "want")
    assert "fine-tune with: bigbatch train --config " in capsys.readouterr().out  # (a command, with the run's model)
    g, d = convert.to_reference(G), convert.to_reference(D)

    # A DataParallel's "module." names, nested under "state_dict" as StudioGAN's and Lightning's files are.
    (tmp_path / "wrapped").mkdir()
    for net, sd in (("G", g), ("G_ema", g), ("D", d)):
        torch.save(
            {"state_dict": {f"module.{k}": v for k, v in sd.items()}, "step": 7}, tmp_path / "wrapped" / f"{net}.pth"
        )
    assert same(converted(tmp_path / "wrapped", tmp_path / "w"), want)

    # BigGAN-PyTorch's --mybn (myBN: statistics and a counter on .bn) and --cross_replica (SyncBN2d's running_*).
    for flag, (mean, var, count) in {
        "mybn": ("bn.stored_mean", "bn.stored_var", "bn.accumulation_counter"),
        "xrep": ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"),
    }.items():
        (tmp_path / flag).mkdir()
        moved = {}
        for k, v in g.items():
            stem, _, last = k.rpartition(".")
            if last in ("stored_mean", "stored_var"):
                moved[f"{stem}.{mean if last == 'stored_mean' else var}"] = v
                moved[f"{stem}.{count}"] = torch.zeros((), dtype=torch.long)
            else:
                moved[k] = v
        assert moved.keys() != g.keys()
        for net, sd in (("G", moved), ("G_ema", moved), ("D", d)):
            torch.save(sd, tmp_path / flag / f"{net}.pth")
        assert same(converted(tmp_path / flag, tmp_path / f"{flag}-run"), want)

    (tmp_path / "st").mkdir()  # (a folder of .safetensors: "no G.pth")
    for net, sd in (("G", g), ("G_ema", g), ("D", d)):
        save_file(sd, tmp_path / "st" / f"{net}.safetensors")
    assert same(converted(tmp_path / "st", tmp_path / "s"), want)
    # A generator file of another name reads the D.pth beside it (it was said to be missing), and a .safetensors.
    (tmp_path / "named").mkdir()
    save_file(g, tmp_path / "named" / "biggan32_G_ema.safetensors")
    torch.save(d, tmp_path / "named" / "D.pth")
    got = converted(tmp_path / "named" / "biggan32_G_ema.safetensors", tmp_path / "n")
    assert "freshly initialised" not in capsys.readouterr().err
    assert same({n: got[n] for n in ("G_ema", "D")}, {n: want[n] for n in ("G_ema", "D")})
    # A folder without G_ema.pth (BigGAN-PyTorch's without --ema): G_ema is G's copy, said as a missing D is (found
    # from outside: unsaid).
    (tmp_path / "noema").mkdir()
    torch.save(g, tmp_path / "noema" / "G_best1.pth")
    torch.save(d, tmp_path / "noema" / "D_best1.pth")
    got = converted(tmp_path / "noema" / "G_best1.pth", tmp_path / "ne")
    assert f"no G_ema_best1.pth in {tmp_path / 'noema'}: G_ema starts as a copy of G" in capsys.readouterr().err
    assert same({"G_ema": got["G_ema"]}, {"G_ema": got["G"]})


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b""), "G_ema.pth is empty (0 bytes), not a PyTorch file"),
        (
            lambda p: p.write_bytes((p.parent.parent / "w" / "G.pth").read_bytes()[:3000]),
            "G_ema.pth is damaged or cut short",
        ),
        (
            lambda p: torch.save({"state_dict": {"linear0.weight_orig": torch.zeros(2, 2)}}, p),  # StudioGAN's names
            "holds no weights in BigGAN-PyTorch's layout (shared.weight, blocks.0.0.*) nor in StyleGAN2-ADA's "
            "(mapping.*, synthesis.*): its names begin linear0.weight_orig (StudioGAN's layout",
        ),
    ],
)
def test_a_file_convert_cannot_read_is_one_line_naming_what_it_is(tmp_path, capsys, make, words):
    G, D = tiny_pair("biggan")
    write_reference_weights(tmp_path / "w", G, D)
    (tmp_path / "alone").mkdir()
    make(tmp_path / "alone" / "G_ema.pth")
    assert main(["convert", str(tmp_path / "alone" / "G_ema.pth"), str(tmp_path / "out"), *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_weights_of_another_resolution_are_named_so(tmp_path, capsys):
    G, D = tiny_pair("biggan")  # 32 px
    write_reference_weights(tmp_path / "w", G, D)
    assert main(["convert", str(tmp_path / "w"), str(tmp_path / "out"), *TINY_RUN, "data.resolution=128"]) == 2
    err = capsys.readouterr().err  # (no warning of dim_z first: a model of 128 px splits z in 6)
    assert err == (
        f"bigbatch: error: the weights in {tmp_path / 'w' / 'G_ema.pth'} are of a 32 px biggan, and data.resolution "
        "is 128: give data.resolution=32\n"
    )
    torch.manual_seed(0)
    G, D = bigbatch.models.create("stylegan2", 16, 0, ch=2, dim_z=16, ch_max=16, w_dim=16, map_layers=2)
    write_reference_weights(tmp_path / "ada", G, D)
    ada = ["model.name=stylegan2", "model.ch=2", "model.dim_z=16", "model.options={ch_max=16, w_dim=16, map_layers=2}"]
    assert main(["convert", str(tmp_path / "ada"), str(tmp_path / "o2"), "--preset", "digits", *ada]) == 2
    assert "are of a 16 px stylegan2, and data.resolution is 32: give data.resolution=16" in capsys.readouterr().err


def test_a_run_a_pickle_or_a_weights_file_given_where_the_other_belongs_says_the_way_on(tmp_path, capsys):
    G, D = tiny_pair("biggan")
    write_reference_weights(tmp_path / "w", G, D)
    converted(tmp_path / "w", tmp_path / "run")
    for src in (tmp_path / "run", tmp_path / "run" / CKPT / "G_ema.safetensors"):
        assert main(["convert", str(src), str(tmp_path / "again"), *TINY_RUN]) == 2
        assert f"{src} is a bigbatch run's already: sample, eval, export or fine-tune it" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "run" / CKPT / "G_ema.safetensors")]) == 2  # (sent to convert, which
    assert f"is a file of the checkpoint {tmp_path / 'run' / CKPT}: give that folder" in capsys.readouterr().err  # sent
    (tmp_path / "network-snapshot-000000.pkl").write_bytes(b"\x80\x04 a pickle")  # it back: found by review)
    assert main(["sample", str(tmp_path / "network-snapshot-000000.pkl")]) == 2
    err = capsys.readouterr().err
    assert "is a network pickle (StyleGAN2-ADA's snapshot), which is code and never unpickled here" in err
    tune = ["train", "--preset", "biggan128_bs2048", *TINY_RUN, "data.path=builtin:digits"]
    assert main([*tune, "--init-from", str(tmp_path / "w" / "G.pth")]) == 2
    err = capsys.readouterr().err
    assert "G.pth is a weights file, not a run: `bigbatch convert` makes a run of BigGAN-PyTorch's" in err
    assert main([*tune, "--init-from", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "holds weight files (D.pth, G.pth, G_ema.pth), not a bigbatch run: `bigbatch convert" in err


def test_a_channels_last_models_weights_in_the_reference_layouts_save_as_safetensors(tmp_path):
    for key, args in (("biggan", (32, 5)), ("stylegan2", (16, 0))):
        G, _ = bigbatch.models.create(key, *args, ch=8, dim_z=16)
        G = G.to(memory_format=torch.channels_last)
        save_file(convert.to_reference(G), tmp_path / f"{key}.safetensors")  # (refused other strides)
