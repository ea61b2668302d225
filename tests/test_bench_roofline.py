"""bench/roofline.py: an op's bytes and FLOPs as counted, the extension from two micro-batches to the GPU's, the GPU's
layout of a step, and the table of a quick run."""

import contextlib
import re
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
import roofline  # noqa: E402


def test_an_ops_bytes_are_its_distinct_elements_read_and_written_and_its_flops_torchs():
    x, w, b = torch.randn(2, 8, 16, 16), torch.randn(4, 8, 3, 3), torch.ones(4, 1, 1).expand(4, 16, 16)
    with roofline.Work() as work:
        y = F.conv2d(x, w, padding=1)
        y.add_(b)  # (an expanded operand: its 4 distinct elements)
        y.zero_()  # (write-only: not read)
        ones = torch.ones_like(y)  # (its shape alone read)
    conv, add, zero, like = work.ops
    assert conv.flops == 2 * 2 * 4 * 16 * 16 * 8 * 9
    assert conv.bytes == 4 * (x.numel() + w.numel() + y.numel())
    assert not torch.count_nonzero(y) and add.bytes == 4 * (y.numel() + 4 + y.numel()) and add.flops == 0
    assert zero.bytes == 4 * y.numel() and like.bytes == 4 * ones.numel()


def test_a_counted_step_does_not_compute_what_has_flops():
    x = torch.randn(3, 5)
    with roofline.Work():
        y = x @ torch.randn(5, 2)
    assert torch.equal(y, torch.full((3, 2), 0.5))  # the stand-in's value, not the product


def test_ops_extend_along_the_images_and_an_op_once_an_image_as_often_as_images():
    op = roofline.Op
    conv2, conv4, relu = op("convolution", 20.0, 200.0), op("convolution", 40.0, 300.0), op("relu", 0.0, 8.0)
    conv, *_ = roofline.extended([conv2, relu], [conv4, relu], 2, 4, 32)
    assert (conv.flops, conv.bytes, conv.count) == (320.0, 1700.0, 1.0)  # (FLOPs the images'; bytes weights' too)
    # An op once an image (a draw on the device): 2 at 2 images, 4 at 4, 32 at 32.
    normal = op("normal_", 0.0, 8.0)
    out = roofline.extended([conv2, *[normal] * 2, relu], [conv4, *[normal] * 4, relu], 2, 4, 32)
    assert sum(o.count for o in out if o.name == "normal_") == 32
    # An op that is a copy at one size and a view at the other (2 images in a group of 2, 4 in two), once.
    out = roofline.extended([conv2, op("clone", 0.0, 4.0), relu], [conv4, op("_unsafe_view", 0.0, 8.0), relu], 2, 4, 32)
    assert [(o.name, o.count, o.bytes) for o in out[1:]] == [("_unsafe_view", 1.0, 64.0), ("relu", 1.0, 8.0)]
    # One the smaller size alone ran, none.
    assert [o.name for o in roofline.extended([conv2, op("clone", 0, 4), relu], [conv4, relu], 2, 4, 32)] == [
        "convolution",
        "relu",
    ]


def test_the_step_is_counted_in_the_gpus_layout_where_bigbatch_picks_one_by_device():
    # (torch.optim's fused kernels on a GPU, its for-each ones on a CPU: the count is the GPU's)
    def step_ops() -> list[str]:
        ((_, _, ops),) = roofline.count_classify(roofline.resnet50(True), 2)
        return [o.name for o in ops]

    with roofline.as_on_a_gpu():
        assert "_fused_sgd_" in step_ops()
    assert "_fused_sgd_" not in step_ops()


def test_a_quick_run_prints_each_works_roofline():
    bench = Path(roofline.__file__)
    out = subprocess.run(
        [sys.executable, str(bench), "--quick", "--works", "resnet50,stylegan2", "--measured", "resnet50=1.5"],
        capture_output=True, text=True, check=True, cwd=bench.parent.parent, timeout=300,
    ).stdout  # fmt: skip
    # What it was measured on and with which code (found from outside: no CPU table said it)
    measured = r"_Measured \d{4}-\d\d-\d\d on .+, torch's CPU kernels for \w+; commit \w+.*; load average"
    assert re.match(measured, out), out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| ")}
    resnet, stylegan = (
        rows["ResNet-50, 224 px, batch 256, bf16, channels-last"],
        rows[next(k for k in rows if "StyleGAN2" in k)],
    )
    for row in (resnet, stylegan):
        launches, tflop, gb, roof = float(row[1].replace(",", "")), float(row[2]), float(row[3]), float(row[6])
        assert launches > 100 and gb > 0 and roof > 0 and tflop >= 0
    assert resnet[8] == "1500.0" and resnet[9] == "-"  # (a GPU's full-size time over --quick's toy count: none, found
    # from outside, 1.71e+04 printed)
    assert stylegan[8] == "-" and re.search(r"convolutions \d", stylegan[10])


def test_an_op_written_into_a_tensor_given_writes_the_stand_in_there():
    into = torch.full((1, 4), float("nan"))
    with roofline.Work():
        torch.mm(torch.ones(1, 3), torch.ones(3, 4), out=into)
    assert torch.equal(into, torch.full((1, 4), 0.5))  # (spectral norm's vectors: finite, as the step needs)


def test_the_hosts_draws_are_not_counted_whatever_the_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (per_row draws on the calling thread then, where the count sees them)
    try:
        with roofline.as_on_a_gpu():
            phases = roofline.count_gan(roofline.stylegan2(True), 2, classes=0)
    finally:
        torch.set_num_threads(threads)
    assert "G with path length" in [name for name, _, _ in phases]
    assert not [o.name for _, _, ops in phases for o in ops if o.name in ("normal_", "randn", "randint", "uniform_")]


def test_stylegan2s_compiled_kernels_are_counted_as_one_op_each_moving_fewer_bytes():
    # (--fused: as on a device in fused.ON, each kernel reads its tensors and writes its output once)
    def count(*contexts):
        with roofline.as_on_a_gpu(), contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            phases = roofline.count_gan(roofline.stylegan2(True), 2, classes=0)
        return [o for _, _, ops in phases for o in ops]

    plain, compiled = count(), count(roofline.fused_as_one_op())
    kernels = {o.name for o in compiled if o.name.startswith("compiled:")}
    assert kernels == {"compiled:fir_sums", "compiled:bias_act_plain", "compiled:slope_times"}
    assert not any(o.name.startswith("compiled:") for o in plain)
    relus = [sum(o.name == "leaky_relu" for o in ops) for ops in (plain, compiled)]
    assert 0 < relus[1] < relus[0]  # (the fully connected layers' left: the mapping's, D's last)
    assert sum(o.bytes for o in compiled) < 0.95 * sum(o.bytes for o in plain)  # (toy sizes: 7% here, 20% at the GPU's)
    assert roofline.kind_of("compiled:fir_sums") == "Inductor's fused kernels"
