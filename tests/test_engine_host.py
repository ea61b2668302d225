"""The engine's work beside the models, in fewer kernels than a tensor at a time and with the same bits
(spectral norm's power iterations, G_ema's blend), and what a batch keeps on the host."""

import copy
import re

import numpy as np
import pytest
import torch
from torch import nn

import bigbatch


def test_spectral_norm_layers_iterated_at_once_are_each_iterated_alone():
    # The engine hands a class's layers to its before_micro_batches together (test_replicator.py's accumulation
    # tests go through it): BigGAN's power iterations as each layer's own in a forward outside an engine, to the
    # bit, in fewer ops (each a kernel launch on a GPU).
    check_power_iterations("cpu")


def check_power_iterations(device: str) -> None:
    """SpectralNorm.before_micro_batches on `device`: each layer's u and v those its own training forward makes
    outside an engine (F.normalize, a layer at a time), to the bit, in under half the ops, layers of two dtypes
    together (tests/test_cuda.py runs it on a GPU)."""
    from op_count import Ops

    from bigbatch.models.layers import SNLinear, SpectralNorm

    def sn_layers(nets):
        return [m for net in nets for m in net.modules() if isinstance(m, SpectralNorm)]

    nets = [net.to(device) for net in bigbatch.models.create("biggan", 32, 10, ch=8, dim_z=16)]
    nets.append(SNLinear(5, 3).double().to(device))  # (another dtype beside them: a group of its own)
    alone = copy.deepcopy(nets)
    layers, layers_alone = (sn_layers(n) for n in (nets, alone))
    for _ in range(3):
        with Ops() as together:
            SpectralNorm.before_micro_batches(layers, 0)
        with Ops() as each, torch.no_grad():
            for m in layers_alone:
                m.normalized_weight()  # (training mode, sn_update: the layer's own power iteration first)
        assert together.count < 0.5 * each.count, (together.count, each.count)
    for a, b in zip(alone, nets):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert len(layers) > 10 and all(m.sn_by_engine and not m.sn_update for m in layers)


def test_g_ema_blends_in_bounded_parts_to_the_bits_of_a_tensor_at_a_time(monkeypatch):
    # update_ema's temporaries are a part's (at most ema.PART elements, a larger tensor alone), not all of G's
    # weights at once; the same bits as p.lerp(p_ema, beta) tensor by tensor.
    from bigbatch.engine import ema

    G, _ = bigbatch.models.create("biggan", 32, 10, ch=8, dim_z=16)
    G_ema, alone = ema.make_ema(G), ema.make_ema(G)
    with torch.no_grad():
        for p in G.parameters():
            p.add_(torch.randn_like(p))
    monkeypatch.setattr(ema, "PART", 5000)
    sizes, lerp = [], torch._foreach_lerp
    monkeypatch.setattr(torch, "_foreach_lerp", lambda a, b, w: sizes.append([t.numel() for t in a]) or lerp(a, b, w))
    ema.update_ema(G_ema, G, 10_000, 256, 10.0, 0.0)
    beta = 0.5 ** (256 / 10_000)
    with torch.no_grad():
        for e, p in zip(alone.parameters(), G.parameters()):
            e.copy_(p.lerp(e, beta))
    assert all(torch.equal(a, b) for a, b in zip(G_ema.state_dict().values(), alone.state_dict().values()))
    assert len(sizes) > 3 and all(sum(s) <= 5000 or len(s) == 1 for s in sizes), sizes
    assert sum(map(sum, sizes)) == sum(p.numel() for p in G.parameters())


def test_a_numpy_array_in_a_batch_is_cut_with_it_and_stays_on_the_host():
    model = nn.Linear(3, 1)
    rep = bigbatch.Replicator(batch=8, micro_batch=2, device="cpu")
    model = rep.prepare(model)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, keys = torch.randn(8, 3), np.arange(8) * 10
    seen = []

    def step_fn(micro):
        x, keys = micro
        seen.append(keys)
        return model(x).square().mean()

    rep.step(step_fn, (x, keys), opt)
    assert all(isinstance(k, np.ndarray) for k in seen)
    assert [k.tolist() for k in seen] == [[0, 10], [20, 30], [40, 50], [60, 70]]
    with pytest.raises(bigbatch.BigbatchError, match="agree in dim 0"):
        rep.step(step_fn, (x, keys[:4]), opt)


def test_a_namedtuple_batch_is_cut_as_its_fields_and_a_wrong_return_says_what_it_was():
    # Found from outside: a namedtuple batch raised a TypeError inside the engine, and a step function that
    # forgot to return was told only what it should return.
    import collections

    Batch = collections.namedtuple("Batch", "x y")
    model = nn.Linear(3, 1)
    rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu")
    model = rep.prepare(model)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    seen = []

    def step_fn(micro):
        seen.append(type(micro))
        return (model(micro.x) - micro.y).square().mean()

    rep.step(step_fn, Batch(torch.randn(8, 3), torch.randn(8, 1)), opt)
    assert seen == [Batch, Batch]
    for returned, said in ((None, "got None (no return?)"), (1.0, "got a float"), (torch.ones(2), "shape (2,)")):
        with pytest.raises(bigbatch.BigbatchError, match=re.escape(said)):
            rep.step(lambda micro, r=returned: r, Batch(torch.randn(8, 3), torch.randn(8, 1)), opt)
    with pytest.raises(bigbatch.BigbatchError, match=r"got its .paths. str: .* as a NumPy array \(np.asarray"):
        rep.step(step_fn, {"x": torch.randn(8, 3), "paths": "a.png"}, opt)


def test_a_batch_the_processes_cannot_share_names_a_batch_and_world_sizes_that_would(monkeypatch):
    # Found from outside: a resume under 3 processes of a run of batch 16 was told only "a multiple of 3"; and a user
    # of the Replicator was given the config's key (train.batch=18), not its own argument.
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(bigbatch.BigbatchError, match=r"world size 3 \(batch=18, or 1, 2, 4, 8, 16 processes\)"):
        bigbatch.Replicator(batch=16, micro_batch=4, device="cpu")


def test_ema_rampup_counts_the_images_before_the_step_as_stylegan2_ada():
    # Found from outside: the ramp-up's half-life took the count after the step, so the first step blended G in at
    # 1 - 1e-6 where ADA's (ema_nimg = min(ema_nimg, cur_nimg * ema_rampup), cur_nimg before it) copies it.
    from bigbatch.engine.ema import update_ema

    G, G_ema = nn.Linear(3, 2), nn.Linear(3, 2)
    update_ema(G_ema, G, 64, 64, halflife_kimg=10, start_kimg=0, rampup=0.05)
    assert torch.equal(G_ema.weight, G.weight)
    before, G2 = G_ema.weight.detach().clone(), nn.Linear(3, 2)
    update_ema(G_ema, G2, 128, 64, halflife_kimg=10, start_kimg=0, rampup=0.05)
    beta = 0.5 ** (64 / (0.05 * 64))  # ADA's: batch / min(ema_nimg, 64 seen before * ema_rampup)
    assert torch.allclose(G_ema.weight, G2.weight + beta * (before - G2.weight), atol=1e-7)


def test_an_average_of_buffers_averages_bn_statistics_as_biggan_pytorch_and_copies_spectral_norms_vectors(tmp_path):
    # Found from outside: G_ema's BatchNorm statistics were G's latest, where BigGAN-PyTorch's utils.ema and
    # StudioGAN's Ema blend them as the weights; train.ema_buffers = "average" (the BigGAN presets') does so.
    from safetensors.torch import load_file

    from bigbatch.engine.ema import make_ema, update_ema

    G, _ = bigbatch.models.create("biggan", 32, 10, ch=8, dim_z=16)
    G_ema = make_ema(G)
    with torch.no_grad():
        for b in G.buffers():
            b.add_(torch.rand_like(b.float()).to(b.dtype) + 1)
    before = {k: v.clone() for k, v in G_ema.state_dict().items()}
    update_ema(G_ema, G, 10_000, 256, 10.0, 0.0, average_buffers=True)
    beta = 0.5 ** (256 / 10_000)
    now, new = G_ema.state_dict(), G.state_dict()
    for kind in ("running_mean", "running_var"):
        keys = [k for k in now if k.endswith(kind)]
        assert keys and all(torch.equal(now[k], new[k].lerp(before[k], beta)) for k in keys)
    for kind in ("sn_u", "sn_v", "num_batches_tracked"):  # (vectors read as unit ones; counts)
        keys = [k for k in now if k.endswith(kind)]
        assert keys and all(torch.equal(now[k], new[k]) for k in keys)
    # Through a run: the BigGAN presets average; others copy, as StyleGAN2-ADA.
    assert bigbatch.preset("biggan128_bs2048").train.ema_buffers == "average"
    tiny = {"model.name": "biggan", "model.ch": 8, "model.dim_z": 16, "train.kimg": 0.064, "train.batch": 32}
    for how in ("copy", "average"):
        cfg = bigbatch.preset("digits").override({**tiny, "train.ema_buffers": how, "checkpoint.every_kimg": 0.064})
        ckpt = bigbatch.train(cfg, run_dir=tmp_path / how, quiet=True) / "checkpoints" / "000000.064"
        g, g_ema = load_file(ckpt / "G.safetensors"), load_file(ckpt / "G_ema.safetensors")
        stats = [k for k in g if k.endswith("running_mean")]
        assert stats and all(torch.equal(g[k], g_ema[k]) == (how == "copy") for k in stats)
