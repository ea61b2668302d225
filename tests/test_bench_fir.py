"""bench/fir.py: StyleGAN2's FIR filter computed four other ways is the model's filter, and its table times
each way in the layers that use it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
import fir  # noqa: E402

from bigbatch.models import fused, stylegan2  # noqa: E402


@pytest.mark.parametrize("pad, gain", [(1, 4.0), (2, 1.0)])  # G's upsampling layer's, D's downsampling conv's
def test_each_way_of_filtering_is_the_models_filter(pad, gain):
    x = torch.randn(2, 5, 9, 7, dtype=torch.float64)
    want = stylegan2.blur(x, pad, gain)
    # The gradient a layer's backward takes through it, too (the filter of the gradient, the same way).
    weights = torch.arange(want.numel(), dtype=x.dtype).reshape(want.shape)
    grads = {}
    for name in fir.WAYS:
        with fir.using(name):
            assert stylegan2._filtered is fir.WAYS[name]
            torch.testing.assert_close(stylegan2.blur(x, pad, gain), want, rtol=1e-12, atol=1e-12, msg=name)
            x.grad = None
            (stylegan2.blur(x.requires_grad_(), pad, gain) * weights).sum().backward()
            grads[name] = x.grad
        x = x.detach()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads["grouped"], rtol=1e-12, atol=1e-12, msg=name)


def test_the_table_times_every_way_in_both_layers_and_leaves_the_model_as_it_was():
    argv = [sys.executable, str(fir.__file__), "--largest", "8", "--repeats", "1", "--precisions", "fp32"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if re.match(r"\| fp32 \| [DG] \| 8 \| 512 \|", line)]
    assert len(rows) == 2
    for row in rows:  # ms (error against grouped's output), the errors of fp32 rounding
        cells = re.findall(r"([\d.]+) \(([\d.e+-]+)\)", row)
        assert len(cells) == len(fir.TIMED) and all(float(ms) > 0 and float(e) < 1e-5 for ms, e in cells), row
    filtered, on = stylegan2._filtered, fused.ON
    fir.cell("D", 1, 4, 8, "fp32", 1, torch.device("cpu"))
    assert stylegan2._filtered is filtered and fused.ON == on  # the module's own filter and devices put back
