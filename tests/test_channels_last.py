"""train.channels_last: convolutions in NHWC memory order ("auto": on for GANs and classifiers, off for
SAEHD). It trains and resumes bit-exact as NCHW does, and never reaches oneDNN's broken channels-last
backward of a strided 1x1 convolution from few channels (heap corruption: oneDNN issue 6035)."""

import subprocess
import sys

import bigbatch
from bigbatch.batching import replicator_for

SCRIPT = """
import torch
from torch import nn
from bigbatch import Replicator

torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(32, 3, 64, 64)
grads = []
# NCHW; channels-last; and NCHW weights fed NHWC images, as a classifier's arrive (a convolution follows its input)
for channels_last, images in ((False, x), (True, x), (False, x.contiguous(memory_format=torch.channels_last))):
    torch.manual_seed(1)  # a 1x1 stride-2 convolution from 8 channels at 64 px: what crashed oneDNN
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 1, stride=2), nn.ReLU(),
                        nn.Conv2d(16, 16, 3, padding=1))
    with Replicator(32, 32, device="cpu", channels_last=channels_last) as rep:
        model = rep.prepare(net)
        (model(images) * torch.linspace(-1, 1, 16 * 32 * 32).view(16, 32, 32)).square().mean().backward()
    grads.append([p.grad for p in net.parameters()])
    assert net[0].weight.stride()[1] == (1 if channels_last else 9), net[0].weight.stride()  # NHWC if asked
    assert net[2].weight.stride() == (8, 1, 1, 1)  # kept NCHW, the oneDNN bug's layer
worst = max(((a - b).abs().max() / a.abs().max()).item() for other in grads[1:] for a, b in zip(grads[0], other))
assert worst < 1e-4, worst
print("same gradients", worst)
"""


def test_channels_last_gives_nchws_gradients_and_avoids_onednns_strided_1x1_bug():
    # In a process of its own: were the bug reached, the heap corruption would end the whole suite.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "same gradients" in out.stdout, out.stderr[-3000:]


def test_channels_last_is_on_for_gans_and_classifiers_and_off_for_the_autoencoder():
    for preset, auto in (("digits", True), ("fashion_resnet", True), ("saehd_cpu", False)):
        cfg = bigbatch.preset(preset).override({"train.device": "cpu"})
        with replicator_for(cfg) as rep:
            assert rep.channels_last is auto, preset
        with replicator_for(cfg.override({"train.channels_last": not auto})) as rep:
            assert rep.channels_last is (not auto), preset


def test_a_gans_average_is_kept_in_gs_memory_order(tiny):
    # Found by reading for the GPU: G_ema stayed NCHW beside a channels-last G, so every EMA update took the
    # per-tensor path of the multi-tensor kernels, and samples ran NCHW.
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    for channels_last in (True, False):
        cfg = tiny.override({"train.channels_last": channels_last})
        with replicator_for(cfg) as rep:
            nets = build_task(cfg, rep, training_data(cfg)).nets()
        strides = [[p.stride() for p in nets[n].parameters()] for n in ("G", "G_ema")]
        assert strides[0] == strides[1] and (channels_last or all(p.is_contiguous() for p in nets["G"].parameters()))


def test_a_channels_last_run_resumes_bit_exact(tiny, tmp_path):
    def weights(run):
        return {n: (run / "checkpoints" / "000000.512" / f"{n}.safetensors").read_bytes() for n in ("G", "D", "G_ema")}

    cfg, nchw_cfg = tiny.override({"train.channels_last": True}), tiny.override({"train.channels_last": False})
    whole = weights(bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True))
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "parts", quiet=True)
    assert weights(bigbatch.train(cfg, run_dir=tmp_path / "parts", resume=True, quiet=True)) == whole
    nchw = weights(bigbatch.train(nchw_cfg, run_dir=tmp_path / "nchw", quiet=True))
    assert nchw["G"] != whole["G"]  # the option changes the computation: it was applied
    # How a run computes, not what it trains: a resumed run may switch it (as train.compile).
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "switched", quiet=True)
    bigbatch.train(nchw_cfg, run_dir=tmp_path / "switched", resume=True, quiet=True)
