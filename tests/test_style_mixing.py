"""`bigbatch sample --mix-rows --mix-cols`: StyleGAN2-ADA's style_mixing.py sheet of a run's G (its grid.png, and
with --outdir each image named row-column.png, as ADA writes them)."""

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main

SMALL = {"w_dim": 16, "map_layers": 2, "ch_max": 16, "mbstd_group": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A StyleGAN2 of 16 px (6 layers of w), unconditional, trained one step."""
    cfg = bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.conditional": False,
            "model.name": "stylegan2",
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options": SMALL,
            "train.loss": "ns",
            "train.batch": 8,
            "train.kimg": 0.008,
            "eval.every_kimg": 0,
            "sample.every_kimg": 0,
            "train.device": "cpu",
        }
    )
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("mix") / "r", quiet=True)


def seeds_drawn(run, tmp_path, seeds, *more):
    out = tmp_path / "seeds.npz"
    assert main(["sample", str(run), "--seeds", seeds, "--npz", "--out", str(out), *more]) == 0  # (const noise, ADA's)
    return np.load(out)["arr_0"]


def test_the_sheet_is_adas_rows_columns_and_each_row_with_the_columns_coarse_styles(run, tmp_path, capsys):
    out = tmp_path / "sheet"
    args = ["sample", str(run), "--mix-rows", "85,100,75", "--mix-cols", "55,821", "--noise-mode", "const"]
    assert main([*args, "--styles", "0-2", "--outdir", str(out)]) == 0
    sheet = np.asarray(Image.open(out / "grid.png"))
    assert sheet.shape == (4 * 16, 3 * 16, 3)  # a row and a column more than the seeds, no padding (as ADA's)
    assert not sheet[:16, :16].any()  # the corner is black
    grid = [[sheet[16 * r : 16 * (r + 1), 16 * c : 16 * (c + 1)] for c in range(3)] for r in range(4)]
    # The first row is the columns' own images, the first column the rows', each the image `--seeds` draws.
    own = seeds_drawn(run, tmp_path, "55,821,85,100,75")
    for i, picture in enumerate([grid[0][1], grid[0][2], grid[1][0], grid[2][0], grid[3][0]]):
        assert np.array_equal(picture, own[i])
    # Every image also on its own, named as ADA's style_mixing.py names them.
    names = ["55-55", "821-821"] + [f"{r}-{c}" for r in (85, 100, 75) for c in (r, 55, 821)]
    assert sorted(p.stem for p in out.glob("*-*.png")) == sorted(names)
    assert np.array_equal(np.asarray(Image.open(out / "100-821.png")), grid[2][2])
    # A mixed image is neither its row's nor its column's, but its column's at every layer is the column's image.
    assert not np.array_equal(grid[1][1], grid[1][0]) and not np.array_equal(grid[1][1], grid[0][1])
    assert main([*args, "--styles", "0-5", "--out", str(tmp_path / "all.png")]) == 0
    every = np.asarray(Image.open(tmp_path / "all.png"))
    assert np.array_equal(every[16:32, 16:32], grid[0][1])  # row 85 with all of column 55's w: column 55's image
    # The defaults: noise const (ADA's), and styles ADA's 0-6 of its G's 14 or more w's, this one's first half
    # (0-2 of 6); a sheet to the default place, named by its seeds.
    capsys.readouterr()
    assert main(args[:-2]) == 0
    default = capsys.readouterr().out.strip()
    assert "/samples/mixing-" in default and np.array_equal(np.asarray(Image.open(default)), sheet)
    # Noise drawn from each row's z keeps a row's own image the one `--seeds` draws with it.
    capsys.readouterr()
    assert main([*args[:-1], "random", "--out", str(tmp_path / "random.png")]) == 0
    random_noise = np.asarray(Image.open(tmp_path / "random.png"))
    out = tmp_path / "random.npz"
    assert main(["sample", str(run), "--seeds", "100", "--noise-mode", "random", "--npz", "--out", str(out)]) == 0
    assert np.array_equal(random_noise[32:48, :16], np.load(out)["arr_0"][0])


def test_the_layers_of_w_are_this_generators(run, tmp_path, capsys):
    args = ["sample", str(run), "--mix-rows", "1", "--mix-cols", "2"]
    assert main([*args, "--styles", "4-6"]) == 2
    assert "styles [6] are not layers of this G: its w are 0-5" in capsys.readouterr().err
    assert main([*args, "--styles", "a"]) == 2
    assert "must list layers and ranges a-b, comma-separated, got 'a'" in capsys.readouterr().err
    assert main(["sample", str(run), "--mix-rows", "1"]) == 2
    assert "style mixing takes both --mix-rows and --mix-cols" in capsys.readouterr().err
    assert main([*args, "--seeds", "3"]) == 2
    assert "leave out --seeds" in capsys.readouterr().err
    assert main(["sample", str(run), "--styles", "0-2"]) == 2
    assert (
        "--styles are the layers a style-mixing sheet takes from its columns: give --mix-rows and --mix-cols"
        in capsys.readouterr().err
    )


def test_a_conditional_sheet_draws_each_seed_of_one_class_wherever_it_is(tmp_path):
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.name": "stylegan2", "model.ch": 2, "model.dim_z": 16, "model.options": SMALL}
    )
    cfg = cfg.override({"train.loss": "ns", "train.batch": 8, "train.kimg": 0.008, "eval.every_kimg": 0})
    run = bigbatch.train(cfg.override({"sample.every_kimg": 0}), run_dir=tmp_path / "r", quiet=True)
    # (found from outside: classes cycled over rows and over columns apart, 100 a row of class 2 and a column of 1)
    argv = ["sample", str(run), "--mix-rows", "85,100", "--mix-cols", "100,85", "--classes", "1,2"]
    assert main([*argv, "--out", str(tmp_path / "s.png")]) == 0
    sheet = np.asarray(Image.open(tmp_path / "s.png"))
    cell = [[sheet[16 * r : 16 * (r + 1), 16 * c : 16 * (c + 1)] for c in range(3)] for r in range(3)]
    assert np.array_equal(cell[0][1], cell[2][0]) and np.array_equal(cell[0][2], cell[1][0])  # 100's and 85's


def test_a_generator_without_styles_is_refused(tmp_path, capsys):
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.batch": 8, "train.kimg": 0.008}
    )
    run = bigbatch.train(
        cfg.override({"eval.every_kimg": 0, "sample.every_kimg": 0}), run_dir=tmp_path / "r", quiet=True
    )
    assert main(["sample", str(run), "--mix-rows", "1", "--mix-cols", "2", "--classes", "3"]) == 2
    assert "style mixing needs a StyleGAN2 generator, with a w a layer; this one is dcgan" in capsys.readouterr().err
    assert main(["sample", str(run), "--mix-rows", "1", "--mix-cols", "2"]) == 2  # (said before its classes are asked)
    assert "style mixing needs a StyleGAN2 generator, with a w a layer; this one is dcgan" in capsys.readouterr().err


def test_forward_with_given_ws_is_the_mapping_s_image():
    from bigbatch import models

    G = models.create("stylegan2", 16, ch=2, dim_z=16, **SMALL)[0].eval()
    G.noise_mode = "const"
    z = torch.randn(3, 16)
    with torch.no_grad():
        images, ws = G(z, return_ws=True)
        torch.testing.assert_close(G(z, ws=ws), images, rtol=0, atol=0)
        G.truncation_psi = 0.5  # given ws are taken as they are: truncated once, where they were made
        torch.testing.assert_close(G(z, ws=ws), images, rtol=0, atol=0)
        with pytest.raises(bigbatch.BigbatchError, match=r"ws \(3, 5, 16\) for 3 images of 6 layers of w 16"):
            G(z, ws=ws[:, 1:])
