"""Reference sums kept by one rank are taken up only by a shard that begins where theirs did."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_metrics import _Moments

from bigbatch import metrics as M


def test_kept_sums_of_a_shard_that_began_elsewhere_are_computed_anew(tmp_path, capsys):
    # Found by review: a rank's shard begins where whole batches put it, so another batch size (or the sharding of
    # before) begins it elsewhere; sums kept from there were taken as this shard's, some images summed twice.
    images = torch.randint(0, 256, (50, 4, 4, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    keep, at = tmp_path / "k.safetensors", lambda s, c: images[s : s + c]
    straight = M.moments_sharded(_Moments(), 50, at, batch_size=8)

    def killed(start, count):
        if start == 40:
            raise KeyboardInterrupt
        return at(start, count)

    with pytest.raises(KeyboardInterrupt):
        M.moments_sharded(_Moments(), 50, killed, batch_size=8, keep=keep)
    kept = M.features.kept_file(keep)
    saved = load_file(str(kept))
    assert saved["done_batch"].tolist() == [40, 8, 0]
    save_file({**saved, "done_batch": torch.tensor([40, 8, 8])}, str(kept))  # (as if begun at image 8)
    mu, sigma = M.moments_sharded(_Moments(), 50, at, batch_size=8, keep=keep)
    assert "its images begin at 8, this shard's at 0); computing them anew" in capsys.readouterr().err
    assert np.array_equal(mu, straight[0]) and np.array_equal(sigma, straight[1])
