"""Face data for the swap task: `prepare` keeps masks (alpha, a folder) and the eyes-and-mouth region as
channels, lined up with the faces, the faces' own colours kept."""

import numpy as np
import pytest
import torch
from PIL import Image
from test_swap import _task, swap_config

import bigbatch
from bigbatch.data.prepare import prepare
from bigbatch.errors import BigbatchError


def test_prepare_keeps_masks_as_channels(faces, tmp_path):
    src = bigbatch.data.load_data(str(faces[0]), 64)
    images, _ = src.get(torch.arange(2))
    assert src.channels == 5 and images.shape == (2, 64, 64, 5)
    mask, em = images[0, ..., 3].float() / 255, images[0, ..., 4].float() / 255
    assert 0.3 < mask.mean() < 0.5 and em.sum() > 0 and (em * (1 - mask)).sum() < em.sum() * 0.01
    with pytest.raises(BigbatchError, match="--eyes-mouth is channel 5"):
        prepare(str(tmp_path / "src" / "img"), str(tmp_path / "x.h5"), 64, eyes_mouth=str(tmp_path / "src" / "em"))
    (tmp_path / "src" / "em" / "03.png").unlink()
    report = prepare(
        str(tmp_path / "src" / "img"),
        str(tmp_path / "y.h5"),
        64,
        workers=0,
        masks="alpha",
        eyes_mouth=str(tmp_path / "src" / "em"),
    )
    assert report.count == 11 and "no mask 03.png" in report.skipped[0][1]


def test_prepared_masks_keep_the_faces_own_colours_and_line_up_with_them(tmp_path):
    # A face's background is part of the training data (masked_training off, bg_style_power): --masks alpha
    # keeps the colours under the transparency; a mask of another shape than its image would be cropped apart
    # from it, and an image without transparency has no mask to give: both are skipped and listed.
    rng = np.random.default_rng(0)
    faces, masks = tmp_path / "faces", tmp_path / "masks"
    faces.mkdir()
    masks.mkdir()
    rgba = rng.integers(0, 256, (4, 80, 60, 4), dtype=np.uint8)
    rgba[..., 3] = 0
    rgba[:, 20:60, 15:45, 3] = 255
    for i, a in enumerate(rgba):
        Image.fromarray(a, "RGBA").save(faces / f"{i}.png")
    Image.fromarray(rgba[0, ..., :3]).save(faces / "9_no_alpha.jpg")
    report = prepare(str(faces), str(tmp_path / "alpha.h5"), 32, workers=0, masks="alpha")
    assert report.count == 4 and report.skipped == [("9_no_alpha.jpg", report.skipped[0][1])]
    assert "has no transparency" in report.skipped[0][1]
    images, _ = bigbatch.data.load_data(str(tmp_path / "alpha.h5"), 32).get(torch.arange(4))

    def fitted(a: np.ndarray) -> np.ndarray:  # center square, then LANCZOS, as prepare documents
        return np.asarray(Image.fromarray(a[10:70]).resize((32, 32), Image.Resampling.LANCZOS))

    for i in range(4):
        assert np.array_equal(images[i, ..., :3].numpy(), fitted(rgba[i, ..., :3]))
        assert np.array_equal(images[i, ..., 3].numpy(), fitted(rgba[i, ..., 3]))

    rgb = tmp_path / "rgb"  # masks as files: the same masks at half size line up; another shape does not
    rgb.mkdir()
    for i in range(4):
        Image.fromarray(rgba[i, ..., :3]).save(rgb / f"{i}.png")
        mask = Image.fromarray(rgba[i, ..., 3])
        (mask.resize((30, 40), Image.Resampling.LANCZOS) if i < 3 else mask.resize((60, 60))).save(masks / f"{i}.png")
    report = prepare(str(rgb), str(tmp_path / "folder.h5"), 32, workers=0, masks=str(masks))
    assert report.count == 3 and [name for name, _ in report.skipped] == ["3.png"]
    assert "is 60x60, its image 60x80: a mask must have its image's shape" in report.skipped[0][1]
    images, _ = bigbatch.data.load_data(str(tmp_path / "folder.h5"), 32).get(torch.arange(3))
    for i in range(3):
        assert np.array_equal(images[i, ..., :3].numpy(), fitted(rgba[i, ..., :3]))
        assert np.abs(images[i, ..., 3].numpy().astype(int) - fitted(rgba[i, ..., 3])).mean() < 8


def test_a_face_set_is_refused_by_the_gan_and_the_classifier_and_prepare_says_how_to_swap(faces, tmp_path, capsys):
    # A GAN trained on a face set's five channels crashed at its first preview, losing the training.
    from bigbatch.cli import main

    for preset, task in (("digits", "the GAN task"), ("fashion_resnet", 'task = "classify"')):
        code = main(["train", "--preset", preset, f"data.path={faces[0]}", "data.resolution=64", "--run-dir", "r"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "holds 5 channels an image (a face set" in err[0] and task in err[0]
    main(["prepare", str(tmp_path / "src" / "img"), str(tmp_path / "s.h5"), "--resolution", "64", "--masks", "alpha"])
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    assert hint == (
        f"train a face swap on it with: bigbatch train --preset saehd128 data.path={tmp_path / 's.h5'} "
        "data.dst_path=DST.h5 data.resolution=64 (as the dst faces: data.path=SRC.h5 "
        f"data.dst_path={tmp_path / 's.h5'})"
    )
    assert main(["info", str(tmp_path / "s.h5")]) in (0, None)
    assert "masks       face mask; face type unknown (not from DFL faces)" in capsys.readouterr().out
    # A side SAEHD cannot train: the side it can, not a command it refuses (found from outside).
    for side in ("72", "80"):  # (80: a multiple of 16, which the presets' -ud archis refuse: found by review)
        argv = ["prepare", str(tmp_path / "src" / "img"), str(tmp_path / f"s{side}.h5"), "--resolution", side]
        main([*argv, "--masks", "alpha"])
        assert capsys.readouterr().out.strip().splitlines()[-1] == (
            "saehd128's archi (liae-ud) trains faces of a multiple of 32 px in 64..640: --resolution 64"
        )


def test_masked_training_needs_masks_on_both_sides(faces, tmp_path, capsys):
    # Found from outside: with masks on one side only, masked training was dropped in silence (src's masks
    # still taught the mask decoder; dst's were taken as all face) and `info` said masked_training.
    from bigbatch.data.prepare import prepare

    src, _ = faces
    prepare(str(tmp_path / "dst" / "img"), str(tmp_path / "plain.h5"), 64, workers=0)
    cfg = swap_config(src, tmp_path / "plain.h5").override({"swap.eyes_mouth_prio": False})
    with pytest.raises(BigbatchError, match="masked_training' needs face masks in both data sets, and only src's"):
        _task(cfg)
    # Neither side with masks: trained unmasked, as DFL does, and said so.
    from bigbatch.info import describe_run

    capsys.readouterr()
    over = {"data.path": str(tmp_path / "plain.h5"), "train.kimg": 0.004, "swap.ct_mode": "rct"}
    run = bigbatch.train(cfg.override({**over, "swap.face_style_power": 0.5, "swap.dst_flip": True}), quiet=True)
    said = describe_run(run)  # (found from outside: DFL's summary says every option; half were unsaid)
    assert "masked_training (no masks in the data: unmasked)" in said and "face type unknown" in said
    assert "dst_flip" in said and "face_style_power 0.5" in said and "ct_mode rct" in said, said
    # ... and said as it starts (found from outside: by `info` only, where a DFL user forgot --masks dfl)
    assert "neither data set has face masks, so this run trains unmasked" in capsys.readouterr().err
