"""bigbatch.data.Loader(order="sequential"): every image once, in the file's order, the last batch what is left, as
an evaluation reads a file (FFCV's OrderOption.SEQUENTIAL; found from outside: a pass was not an epoch, and no
way to read a file once was there)."""

import pytest
import torch

from bigbatch.data import Loader, load_data, prepare
from bigbatch.errors import BigbatchError


def test_a_sequential_pass_reads_every_image_once_in_order_on_any_number_of_ranks(tmp_path, capsys):
    prepare("builtin:digits", str(tmp_path / "d.h5"), 8, limit=50, workers=0)
    data = load_data(str(tmp_path / "d.h5"), 8)
    images, labels = data.get(torch.arange(50))
    loader = Loader(str(tmp_path / "d.h5"), batch=16, resolution=8, order="sequential")
    assert len(loader) == 4
    for _ in range(2):  # a pass, then the next from the first image again
        got = list(loader)
        assert [len(y) for _, y in got] == [16, 16, 16, 2] and loader.start == 0
        assert torch.equal(torch.cat([x for x, _ in got]), images) and torch.equal(
            torch.cat([y for _, y in got]), labels
        )
    # Three ranks (and a worker): each batch's parts in rank order are the one-process batch, flips too; where fewer
    # images than ranks are left, a rank's part is empty, so that every rank reads as many batches.
    one = list(Loader(str(tmp_path / "d.h5"), batch=16, resolution=8, order="sequential", xflip=True))
    parts = [
        list(Loader(str(tmp_path / "d.h5"), 16, 8, order="sequential", xflip=True, rank=r, world_size=3, workers=w))
        for r, w in ((0, 0), (1, 1), (2, 0))
    ]
    assert [len(p) for p in parts] == [4, 4, 4] and [len(y) for _, y in parts[2]] == [5, 5, 5, 0]
    for i, (x, y) in enumerate(one):
        assert torch.equal(torch.cat([p[i][0] for p in parts]), x) and torch.equal(
            torch.cat([p[i][1] for p in parts]), y
        )
    assert not torch.equal(torch.cat([x for x, _ in one]), images)  # (mirrored: some of them)
    resumed = Loader(str(tmp_path / "d.h5"), batch=16, resolution=8, order="sequential", start=32)
    assert [len(y) for _, y in resumed] == [16, 2]
    # Read above the side stored: said, as train says it (found from outside: enlarged without a word)
    Loader(str(tmp_path / "d.h5"), batch=16, resolution=16, order="sequential")
    assert "d.h5 holds 8px images, read at 16px: upscaled, no sharper" in capsys.readouterr().err
    for bad, words in (({"order": "shuffled"}, "order must be 'random' or 'sequential'"), ({"start": 64}, "past the")):
        with pytest.raises(BigbatchError, match=words):
            Loader(str(tmp_path / "d.h5"), batch=16, resolution=8, **{"order": "sequential", **bad})
