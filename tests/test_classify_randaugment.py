"""RandAugment (train.randaugment, timm's --aa string) and random erasing (train.random_erase, timm's
--reprob) for classifiers, on the device for a whole micro-batch: each operation as PIL computes it at
timm's strength, the draws as timm makes them, keyed by the step so that a step does not depend on its
micro-batches."""

import math

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image, ImageEnhance, ImageOps
from test_classify import tiny

from bigbatch.batching import replicator_for
from bigbatch.cli import main
from bigbatch.data.load import training_data
from bigbatch.tasks import build_task
from bigbatch.tasks.classify import erasing
from bigbatch.tasks.classify import randaugment as R


def pil(op, arg, image):
    """timm's operations (timm/data/auto_augment.py) on a PIL image, with bilinear resampling."""
    im, fill, affine = Image.fromarray(image), R.FILL, Image.Transform.AFFINE
    shifts = {"TranslateXRel": (1, 0, arg * im.size[0], 0, 1, 0), "TranslateYRel": (1, 0, 0, 0, 1, arg * im.size[1])}
    shifts |= {"ShearX": (1, arg, 0, 0, 1, 0), "ShearY": (1, 0, 0, arg, 1, 0)}
    if op in shifts:
        return im.transform(im.size, affine, shifts[op], Image.Resampling.BILINEAR, fillcolor=fill)
    if op == "Rotate":
        return im.rotate(arg, resample=Image.Resampling.BILINEAR, fillcolor=fill)
    if op == "SolarizeAdd":
        return im.point([min(255, i + int(arg)) if i < 128 else i for i in range(256)] * 3)
    enhance = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast, "Brightness": ImageEnhance.Brightness}
    if op in (*enhance, "Sharpness"):
        return (enhance.get(op) or ImageEnhance.Sharpness)(im).enhance(arg)
    plain = {"AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize, "Invert": ImageOps.invert}
    if op in plain:
        return plain[op](im)
    return ImageOps.posterize(im, int(arg)) if op == "Posterize" else ImageOps.solarize(im, arg)


EXACT = {"AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "SolarizeAdd"}


@pytest.mark.parametrize("increasing", [0, 1])
def test_each_operation_is_pils_at_timms_strength(increasing):
    image = skimage.data.astronaut()[::6, ::4].copy()  # 86x128: not square
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 127.5 - 1
    for i, op in enumerate(R.OPS):
        for level, sign in ((7.0, 1.0), (4.0, -1.0)):
            row = np.array([[[i, 1, level, sign, increasing]]], np.float32)
            arg = float(R._argument(op, row[:, 0])[0])
            ours = ((R.apply(x, row)[0].permute(1, 2, 0) + 1) * 127.5).round().numpy()
            theirs = np.asarray(pil(op, arg, image)).astype(np.float64)
            diff = np.abs(ours - theirs)
            if op in EXACT:
                assert diff.max() == 0, (op, arg)
            elif op in R.GEOMETRIC:  # a level apart, but where the image meets the fill (PIL cuts, bilinear blends)
                assert diff.mean() < 1.2 and (diff.max(2) > 3).mean() < 0.03, (op, arg)
            else:  # enhancing: a level apart at most (rounding)
                assert diff.mean() < 0.6 and np.percentile(diff, 99) <= 1, (op, arg)
    # A level on Solarize's threshold is solarized, as PIL's (found from outside: 26 came back as 25.999998, kept).
    row = np.array([[[R.OPS.index("Solarize"), 1, 9.0, 1.0, 1]]], np.float32)
    level = math.ceil(float(R._argument("Solarize", row[:, 0])[0]))
    got = R.apply(torch.full((1, 3, 2, 2), level / 127.5 - 1), row)
    assert torch.equal(((got + 1) * 127.5).round(), torch.full_like(got, 255 - level))
    # An image no layer applies to passes unchanged; the others do not depend on which share its micro-batch.
    rows = R.draw(R.parse("rand-m9-mstd0.5-inc1"), 16, 0, 0)
    batch = x.repeat(16, 1, 1, 1) * torch.linspace(0.5, 1, 16).view(16, 1, 1, 1)
    out = R.apply(batch, rows)
    off = ~rows[:, :, R.APPLIED].any(1)
    assert torch.equal(out[torch.from_numpy(off)], batch[torch.from_numpy(off)])
    assert torch.equal(torch.cat([R.apply(batch[:5], rows[:5]), R.apply(batch[5:], rows[5:])]), out)


class _CUDADeterminism(torch.overrides.TorchFunctionMode):
    """CUDA's rule under torch.use_deterministic_algorithms on the CPU: a floating cumsum raises there."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.cumsum, torch.Tensor.cumsum) and args[0].is_floating_point():
            raise RuntimeError("cumsum_cuda_kernel does not have a deterministic implementation")
        return func(*args, **(kwargs or {}))


def test_every_operation_runs_under_cudas_deterministic_rules():
    """Found by review: Equalize's float cumsum stopped a run of train.deterministic on CUDA."""
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with _CUDADeterminism():
        for i, _ in enumerate(R.OPS):
            R.apply(x, np.array([[[i, 1, 7.0, 1.0, 1]]] * 2, np.float32))


def test_the_draws_are_timms():
    p = R.parse("rand-m9-mstd0.5-inc1")
    assert p == R.Policy(9.0, 2, 0.5, 10.0, True, 0.5)
    assert R.parse("rand-m7-n3-mstdinf-mmax12-p1") == R.Policy(7.0, 3, float("inf"), 12.0, False, 1.0)
    rows = R.draw(p, 20_000, 0, 1024)
    counts = np.bincount(rows[..., R.OP].astype(int).ravel(), minlength=len(R.OPS)) / rows[..., R.OP].size
    assert np.all(np.abs(counts - 1 / 15) < 0.01)  # one of the 15, uniformly
    assert rows[..., R.APPLIED].mean() == pytest.approx(0.5, abs=0.01)
    assert rows[..., R.LEVEL].mean() == pytest.approx(9, abs=0.02) and rows[..., R.LEVEL].std() == pytest.approx(
        0.5, abs=0.02
    )
    assert rows[..., R.LEVEL].max() <= 10  # clipped at mmax
    uniform = R.draw(R.parse("rand-m8-mstdinf"), 20_000, 0, 0)[..., R.LEVEL]
    assert uniform.min() >= 0 and uniform.max() <= 8 and uniform.mean() == pytest.approx(4, abs=0.1)
    # timm's own spelling of it, an mstd above 100; and its mmax0, its default 10 (found from outside: a normal
    # draw of deviation 101, all but 4% at 0 or 10; every magnitude 0)
    assert R.parse("rand-m8-mstd101") == R.parse("rand-m8-mstdinf") and R.parse("rand-m8-mmax0").most == 10
    assert not np.array_equal(R.draw(p, 64, 0, 2048), R.draw(p, 64, 0, 1024))  # keyed by the step
    # Past magnitude 10 (mmax20), timm floors an increasing enhancement's factor at 0.1 (found by review: < 0)
    row = np.array([[R.OPS.index("Brightness"), 1, 20, -1, 1]], np.float32)
    assert R._argument("Brightness", row)[0] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("auto", "must be timm's RandAugment string"),
        ("rand-n2", "needs a magnitude"),
        ("rand-m9-x3", "has 'x3', which is none of m, n, mstd, mmax, inc, p"),
        ("rand-m9-n0", "n is the number of layers"),
        ("rand-m9-p2", "p must be in [0, 1]"),
    ],
)
def test_a_bad_string_is_one_line(spec, words, capsys):
    argv = ["train", "--preset", "fashion_resnet_fast", f"train.randaugment={spec}", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err
    assert "config key 'train.randaugment'" in err


def test_random_erasing_draws_timms_rectangles_and_fills_them_with_noise_of_their_own():
    rows = erasing.draw(0.25, 20_000, 0, 512)
    erased = rows[rows[:, erasing.ERASED] > 0]
    assert len(erased) / len(rows) == pytest.approx(0.25, abs=0.01)
    h, w = erased[:, erasing.HEIGHT], erased[:, erasing.WIDTH]
    assert np.all((h * w >= 0.02 - 1e-6) & (h * w <= 1 / 3 + 1e-6) & (h < 1) & (w < 1))
    assert np.all((h / w >= 0.3 - 1e-5) & (h / w <= 1 / 0.3 + 1e-4))
    assert np.all((erased[:, erasing.TOP] + h <= 1) & (erased[:, erasing.LEFT] + w <= 1))
    x = torch.rand(64, 3, 32, 32) * 2 - 1
    rows = erasing.draw(0.5, 64, 0, 0)
    out = erasing.apply(x, rows)
    changed = (out != x).any(1)  # (N, H, W)
    on = rows[:, erasing.ERASED] > 0
    assert not changed[torch.from_numpy(~on)].any()  # an image not erased is as it was
    for i in np.flatnonzero(on):  # one rectangle of whole pixels, of the drawn size
        ys, xs = torch.nonzero(changed[i], as_tuple=True)
        box = changed[i, ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        assert box.all() and int(box.shape[0]) == round(rows[i, erasing.HEIGHT] * 32)
    fill = out.permute(0, 2, 3, 1)[changed]  # (pixels, channels): timm's N(0, 1) after ImageNet's normalization
    want_mean = torch.tensor([2 * m - 1 for m in erasing.IMAGENET_MEAN])
    assert torch.allclose(fill.mean(0), want_mean, atol=0.03)
    assert torch.allclose(fill.std(0), 2 * torch.tensor(erasing.IMAGENET_STD), rtol=0.05)
    # The noise is the image's own: the same whichever images share its micro-batch.
    assert torch.equal(torch.cat([erasing.apply(x[:7], rows[:7]), erasing.apply(x[7:], rows[7:])]), out)


def test_a_step_with_randaugment_and_erasing_is_the_same_whatever_its_micro_batches(capsys):
    def weights(micro, spec="rand-m9-mstd0.5-inc1-p1", erase=1.0):
        over = {"train.randaugment": spec, "train.random_erase": erase if spec else 0.0}
        cfg = tiny(**over, **{"train.micro_batch": micro, "eval.every_kimg": 0.0})
        cfg = cfg.override({"model.name": "convnet", "model.options": {}})  # (no BatchNorm: its statistics would)
        task = build_task(cfg, replicator_for(cfg), training_data(cfg))
        images, labels = task.data.get(torch.arange(64))
        task.rep.step(task.loss, task.batch(0, images, labels), task.opt)
        return torch.cat([p.detach().flatten() for p in task.plain().parameters()])

    whole = weights(64)
    assert float((whole - weights(16)).abs().max()) < 1e-5
    assert float((whole - weights(64, "")).abs().max()) > 1e-4  # (the step augmented)
    assert main(["train", "--preset", "fashion_resnet_fast", "train.random_erase=1.5", "--dry-run"]) == 2
    assert "config key 'train.random_erase' is a probability, in [0, 1], got 1.5" in capsys.readouterr().err
