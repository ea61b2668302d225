"""Float images (mode F: TIFFs from ImageJ, tifffile, scientific cameras) read at their levels, whichever range they
are written in (found from outside: one of 0..255, as Pillow reads them, was scaled by 255 and made near white)."""

import numpy as np
import torch
from PIL import Image

from bigbatch.data import load_data, prepare


def test_a_float_image_of_0_to_1_or_of_0_to_255_reads_at_its_levels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    ramp = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    Image.fromarray(ramp).save(src / "a_unit.tif")  # 0..1
    Image.fromarray(ramp * 255).save(src / "b_levels.tif")  # 0..255
    odd = ramp * 255
    odd[0, 0], odd[0, 1] = np.nan, np.inf
    Image.fromarray(odd).save(src / "c_nan.tif")  # not a number is black, infinity white
    unit = ramp.copy()
    unit[0, 0], unit[0, 1] = np.nan, np.inf
    Image.fromarray(unit).save(src / "d_unit_nan.tif")  # (of 0..1 still, whatever infinity)
    report = prepare(str(src), str(tmp_path / "f.h5"), workers=0)
    assert report.count == 4 and not report.skipped
    data = load_data(str(tmp_path / "f.h5"), 4)
    images = data.get(torch.arange(4))[0].numpy()
    want = np.round(ramp * 255).astype(np.uint8)
    assert (images[0] == want[..., None]).all() and (images[1] == want[..., None]).all()
    assert images[2][0, 0].tolist() == [0] * 3 and images[2][0, 1].tolist() == [255] * 3
    assert (images[2][1:] == want[1:, :, None]).all() and (images[3] == images[2]).all()
