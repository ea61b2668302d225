"""bench/throughput.py's counters and its classify measure: FLOPs and peaks are counted without undoing
train.compile, and a classify step's FLOPs are its model's forward and backward. bench/resample.py's table."""

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import bigbatch
from bigbatch import models

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))


def _counting_backend(calls: list[int]):
    """A torch.compile backend that runs the captured graph as it is and counts the calls that reach it."""

    def backend(gm, example_inputs):
        def run(*args):
            calls[0] += 1
            return gm(*args)

        return run

    return backend


@pytest.mark.parametrize("first", [False, True], ids=["after-compiling", "before-compiling"])
def test_counters_leave_a_compiled_model_compiled(first):
    # A model called under a dispatch mode (FlopCounterMode, CPUPeak) runs eagerly, and in torch 2.13 every
    # compiled model in the process does from then on: counted so, a benchmark would time eager code.
    from throughput import count_flops, counted_peak

    torch._dynamo.reset()
    calls = [0]
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend=_counting_backend(calls))
    x = torch.randn(8, 16)

    def step():
        compiled(x).sum().backward()

    if not first:
        step()
    flops = count_flops(step)
    peak = counted_peak(step)
    before = calls[0]
    step()
    step()
    assert calls[0] - before == 2  # both plain calls ran the compiled graph
    # Forward, then backward: the weights' gradients, and the inputs' of the second layer only (x needs none).
    assert flops == 2 * 8 * (2 * 16 * 32 + 3 * 32 * 4)
    assert peak > 0


def test_classify_step_flops_are_its_models_forward_and_backward():
    from throughput import measure_classify

    cfg = bigbatch.preset("fashion_resnet_fast").override(
        {"data.resolution": 8, "train.batch": 4, "train.micro_batch": 4, "model.options.depth": 8}
    )
    r = measure_classify(cfg, "fp32", False, 4, 2, 10)
    assert r["img_per_s"] > 0 and r["s_per_iter"] > 0 and r["peak"] > 0
    assert r["plan"] == "4x1"

    net = models.create_classifier("resnet_cifar", 10, ch=16, img_channels=3, depth=8)
    with FlopCounterMode(display=False) as counter:
        net(torch.randn(4, 3, 8, 8)).sum().backward()
    assert r["flops"] == counter.get_total_flops()
    assert r["flop_per_s"] == pytest.approx(r["flops"] / r["s_per_iter"])


def test_resample_bench_times_both_ways_for_every_layer_and_width():
    import subprocess

    script = Path(__file__).parent.parent / "bench" / "resample.py"
    args = ["--channels", "4,8", "--batch", "1", "--repeats", "1", "--precisions", "fp32"]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| fp32 |")]
    assert [row.split("|")[2:4] for row in rows] == [[" D ", " 4 "], [" D ", " 8 "], [" G ", " 4 "], [" G ", " 8 "]]
    assert all(row.count(" = **") == 4 for row in rows)  # two ops / one op at 8, 16, 32 and 64 px


def test_frozen_step_bench_times_each_way_for_each_train_bn(capsys):
    import frozen_step

    frozen_step.main(["--models", "resnet18", "--steps", "1"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| resnet18")]
    assert [r[1].strip() for r in rows] == ["True", "False"]
    assert all(re.fullmatch(r" \d+\.\d{3} ", c) for r in rows for c in r[2:5]) and all(float(r[5]) > 0 for r in rows)
    from bigbatch.engine import frozen

    assert frozen.hold is frozen_step.hold_of_the_engine  # (put back, whatever the bench patched)


def test_world_size_bench_times_the_batchnorm_replay():
    import world_size

    # Each split once (found from outside: --procs 2 ran 2 x 1 twice, into one folder, and crashed on the second).
    assert [world_size.splits(k) for k in (2, 3, 4)] == [[(2, 4)], [(3, 4)], [(4, 4), (2, 4)]]

    assert re.fullmatch(
        r"53 BatchNorms, 2 micro-batches a step: [\d.]+ ms a step \(CPU, 1 thread\)", world_size.replay_cost(2, 1)
    )


def test_compile_start_times_a_cold_start_then_one_from_the_cache():
    # bench/compile_start.py: each start a new process on one fresh compile cache (the tiny digits GAN here).
    import subprocess

    bench = Path(__file__).parent.parent / "bench" / "compile_start.py"
    tiny = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16"]
    # (D without spectral norm: a fifth fewer kernels to build; test_compile_cache.py keeps it, whose AOTAutograd
    # pairs it checks)
    out = subprocess.run([sys.executable, str(bench), *tiny, "model.options={d_sn=false}"], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("_Measured "), out.stdout  # (when, on what, with which code: found from outside)
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if re.match(r"\| \d", line)]
    (cold, cold_s, graphs, cold_hits, cold_left, _), (warm, warm_s, warm_graphs, hits, left, _) = rows
    assert cold.strip() == "1, cold (empty cache)" and warm.strip() == "2, warm"
    assert int(cold_hits) == 0 and int(hits) == int(warm_graphs) == int(graphs) > 0
    assert int(cold_left) == int(left) == 0 and float(warm_s) < float(cold_s)
    # A config the model refuses is one line and status 2 (found by review: the first start's traceback).
    bad = subprocess.run([sys.executable, str(bench), *tiny, "data.resolution=8"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "bigbatch: error: dcgan supports power-of-two resolutions >= 16 (data.resolution), got 8"
    ], bad.stderr


def test_host_ops_counts_fewer_launches_for_a_gpus_optimizer_and_ema_step():
    # bench/host_ops.py: SAEHD's optimizer step over multi-tensor parts and G_ema's update as multi-tensor
    # kernels dispatch a fraction of the ops the CPU's way does (each at least one kernel launch on a GPU).
    import subprocess

    script = Path(__file__).parent.parent / "bench" / "host_ops.py"
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.match(r"_Measured [\d-]+ on .*; commit \w+", out.stdout), out.stdout  # (the code the counts are of)
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[2:] for r in out.stdout.splitlines() if r.startswith("| ")}
    for name in ("SAEHD 64 px df-ud 32/16/16/8: AdaBelief step", "BigGAN 32 px ch 8: G_ema update"):
        before, now = (int(c.strip(" |").replace(",", "")) for c in rows[name])
        assert 0 < 10 * now < before, (name, before, now)
    assert any(name.startswith("StyleGAN2 64 px, batch 8") for name in rows)
    # BatchNorm statistics kept and replayed in fewer ops than there are BatchNorms (a tensor at a time: 8 each)
    row = next(r for r in out.stdout.splitlines() if r.startswith("| resnet50 ch 8: BatchNorm statistics"))
    _, bns, before, now = (c.strip() for c in row.strip("| ").split(" | "))
    assert before == "-" and 0 < int(now) < int(bns.split()[0]), row
    # The GPU decode's 128 crops cut, resized and mirrored as a batch: a third of the ops of one region at a time.
    row = next(r for r in out.stdout.splitlines() if r.startswith("| data.decode gpu: 128 crops"))
    before, now = (int(c.split()[0].replace(",", "")) for c in row.strip("| ").split(" | ")[2:])
    assert 0 < 3 * now < before, row


def test_step_ops_counts_a_whole_gan_iteration_against_a_bare_loop():
    # bench/step_ops.py: BigGAN's iteration through bigbatch.train launches fewer kernels than a bare loop of the
    # same models (spectral norm's power iterations once a step, all layers at once, not in every forward).
    import subprocess

    script = Path(__file__).parent.parent / "bench" / "step_ops.py"
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(r for r in out.stdout.splitlines() if r.startswith("| BigGAN 32 px"))
    name, bare, ours, ratio, more, fewer = (c.strip() for c in row.strip("| ").split(" | "))
    bare, ours = int(bare.replace(",", "")), int(ours.replace(",", ""))
    assert 0 < ours < bare and float(ratio) == round(ours / bare, 2), row
    assert "clamp_min +" in fewer, row  # the bare loop's power iteration in every forward: F.normalize's clamps


def test_a_compiled_stylegan2_compiles_its_plain_steps_before_the_timed_ones(monkeypatch, request):
    # bench/gpu.py's stylegan2-bf16-compile: G's step 0 is a lazy path-length step, run eagerly, so a warm-up of
    # g_step(0) five times compiled nothing of G's plain step, and its first timed step compiled it (8.6 s an
    # iteration timed on this CPU at toy sizes, 0.025 s once warm).
    import argparse

    from _gpu_sizes import config
    from throughput import measure
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", lambda model, **kw: torch._dynamo.optimize("eager")(model))
    torch._dynamo.reset()
    request.addfinalizer(torch._dynamo.reset)  # (no later test of this process finds these eager graphs)
    cfg = config(argparse.Namespace(sizes="toy", device="cpu"), "stylegan2").override({"train.compile": True})
    warm = []
    measure(
        cfg,
        "fp32",
        False,
        4,
        2,
        0,
        plain=False,
        flops=False,
        warmup=2,
        after_warmup=lambda: warm.append(counters["stats"]["unique_graphs"]),
    )
    assert warm[0] == counters["stats"]["unique_graphs"] > 0  # every graph compiled before the timed steps
