"""DeepFaceLab's SAEHD, layer for layer: the shapes of each archi, DFL's weight files read safely and
written back byte for byte, and outputs equal to a NumPy computation written the way leras computes
(NHWC, TF-layout kernels, its flatten/reshape order and its depth_to_space channel order)."""

import copy
import os
import pickle
import re

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from bigbatch.errors import BigbatchError
from bigbatch.models import dfl
from bigbatch.models.saehd import SAEHD


@pytest.mark.parametrize("archi", ["df", "liae", "df-ud", "liae-ud", "df-t", "liae-udt", "df-c"])
def test_every_archi_maps_images_to_images_and_masks(archi):
    torch.manual_seed(0)
    res = 64
    model = SAEHD(res, archi, ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    x = torch.rand(2, 3, res, res)
    for image, mask in (model.src(x), model.dst(x), model.swap(x)[:2]):
        assert image.shape == (2, 3, res, res) and mask.shape == (2, 1, res, res)
        assert 0 <= float(image.min()) and float(image.max()) <= 1
    assert model.parts == (
        ["encoder", "inter", "decoder_src", "decoder_dst"]
        if archi.startswith("df")
        else ["encoder", "inter_AB", "inter_B", "decoder"]
    )
    with pytest.raises(BigbatchError, match="multiple of 32"):
        SAEHD(80, "df-d")
    with pytest.raises(BigbatchError, match="multiple of 32"):
        SAEHD(80, "df-t")  # five downscales
    with pytest.raises(BigbatchError, match="df or liae"):
        SAEHD(64, "df-")
    with pytest.raises(BigbatchError, match="df or liae"):
        SAEHD(64, "liae-x")


def test_liae_ud_at_dfl_defaults_has_dfls_keys_and_shapes():
    model = SAEHD()  # DFL's defaults: 128 px, liae-ud, 256/64/64/22
    encoder, inter, decoder = (dfl.export_part(getattr(model, p)) for p in ("encoder", "inter_AB", "decoder"))
    assert {k: v.shape for k, v in encoder.items() if k.endswith("weight:0")} == {
        f"down1/downs_{i}/conv1/weight:0": s
        for i, s in enumerate([(5, 5, 3, 64), (5, 5, 64, 128), (5, 5, 128, 256), (5, 5, 256, 512)])
    }
    assert inter["dense1/weight:0"].shape == (32768, 256) and inter["dense2/weight:0"].shape == (256, 8192)
    assert inter["upscale1/conv1/weight:0"].shape == (3, 3, 512, 2048) and inter["dense2/bias:0"].shape == (8192,)
    expected = {
        "upscale0/conv1/weight:0": (3, 3, 1024, 2048),
        "upscale2/conv1/weight:0": (3, 3, 256, 512),
        "res0/conv2/weight:0": (3, 3, 512, 512),
        "upscalem0/conv1/weight:0": (3, 3, 1024, 704),
        "upscalem3/conv1/weight:0": (3, 3, 44, 88),
        "out_conv/weight:0": (1, 1, 128, 3),
        "out_conv3/weight:0": (3, 3, 128, 3),
        "out_convm/weight:0": (1, 1, 22, 1),
    }
    assert {k: decoder[k].shape for k in expected} == expected
    # In the order DFL builds (and files) them: upscales, residual blocks, mask upscales, output convs.
    names = list(dict.fromkeys(k.split("/")[0] for k in decoder))
    assert names == [
        *(f"upscale{i}" for i in range(3)),
        *(f"res{i}" for i in range(3)),
        *(f"upscalem{i}" for i in range(3)),
        *("out_conv", "out_conv1", "out_conv2", "out_conv3", "upscalem3", "out_convm"),
    ]


# ---- a NumPy SAEHD written as leras computes it (NHWC) --------------------------------------------
def np_conv(x, p, name, stride=1):
    w, b = p[f"{name}/weight:0"], p[f"{name}/bias:0"]
    k = w.shape[0]
    pad = ((k - 1) + 1) // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    win = sliding_window_view(xp, (k, k), axis=(1, 2))[:, ::stride, ::stride]  # N, H, W, C, k, k
    return np.einsum("nhwcij,ijco->nhwo", win, w) + b


def np_act(x, slope):
    return np.where(x >= 0, x, x * slope)


def np_d2s(x, size=2):  # leras's NHWC depth_to_space, as written there
    b, h, w, c = x.shape
    oc = c // (size * size)
    x = x.reshape(-1, h, w, size, size, oc).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h * size, w * size, oc)


def np_upscale(x, p, name):
    return np_d2s(np_act(np_conv(x, p, f"{name}/conv1"), 0.1))


def np_res(x, p, name):
    y = np_act(np_conv(x, p, f"{name}/conv1"), 0.2)
    return np_act(x + np_conv(y, p, f"{name}/conv2"), 0.2)


def np_encoder(x, p, u):
    for i in range(4):
        x = np_act(np_conv(x, p, f"down1/downs_{i}/conv1", stride=2), 0.1)
    x = x.transpose(0, 3, 1, 2).reshape(len(x), -1)  # leras flatten: C, H, W order
    return x * (1 / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)) if u else x


def np_inter(x, p, ch, lowest):
    x = (x @ p["dense1/weight:0"] + p["dense1/bias:0"]) @ p["dense2/weight:0"] + p["dense2/bias:0"]
    x = x.reshape(-1, ch, lowest, lowest).transpose(0, 2, 3, 1)  # leras reshape_4D
    return np_upscale(x, p, "upscale1")


def np_decoder(z, p, d):
    x = z
    for i in range(3):
        x = np_res(np_upscale(x, p, f"upscale{i}"), p, f"res{i}")
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    if d:
        outs = [np_conv(x, p, n) for n in ("out_conv", "out_conv1", "out_conv2", "out_conv3")]
        x = sig(np_d2s(np.concatenate(outs, axis=-1)))
    else:
        x = sig(np_conv(x, p, "out_conv"))
    m = z
    for i in range(4 if d else 3):
        m = np_upscale(m, p, f"upscalem{i}")
    return x, sig(np_conv(m, p, "out_convm"))


@pytest.mark.parametrize("archi", ["df-ud", "liae-u", "liae-ud"])
def test_outputs_equal_a_numpy_computation_in_leras_order(archi):
    torch.manual_seed(1)
    res, ae = 64, 16
    model = SAEHD(res, archi, ae_dims=ae, e_dims=8, d_dims=8, d_mask_dims=4).double()
    for param in model.parameters():  # biases too: zero biases would hide a misplaced one
        param.data.uniform_(-0.3, 0.3)
    parts = {}
    for name in model.parts:  # as DFL's files hold them (float32), loaded back: both sides use the same values
        arrays = dfl.export_part(getattr(model, name))
        dfl.import_part(getattr(model, name), arrays, name)
        parts[name] = {k: v.astype(np.float64) for k, v in arrays.items()}
    x = np.random.default_rng(0).random((2, res, res, 3))  # NHWC, as leras on a CPU
    d = "d" in archi
    lowest = res // (32 if d else 16)
    code = np_encoder(x, parts["encoder"], u=True)
    if archi.startswith("df"):
        z = np_inter(code, parts["inter"], ae, lowest)
        want_src, want_swap = np_decoder(z, parts["decoder_src"], d), np_decoder(z, parts["decoder_src"], d)
        want_dst = np_decoder(z, parts["decoder_dst"], d)
    else:
        ab, b = np_inter(code, parts["inter_AB"], 2 * ae, lowest), np_inter(code, parts["inter_B"], 2 * ae, lowest)
        want_src = want_swap = np_decoder(np.concatenate([ab, ab], -1), parts["decoder"], d)
        want_dst = np_decoder(np.concatenate([b, ab], -1), parts["decoder"], d)
    with torch.no_grad():
        xt = torch.from_numpy(x).permute(0, 3, 1, 2)
        got = {"src": model.src(xt), "dst": model.dst(xt), "swap": model.swap(xt)[:2]}
        # The training forward (src and dst through the shared parts at once) gives the same faces.
        train = model(xt, xt.flip(0))
        got["train src"], got["train dst"] = train[:2], tuple(t.flip(0) for t in train[2:4])
    for side, want in (("src", want_src), ("dst", want_dst), ("swap", want_swap), ("train src", want_src),
                       ("train dst", want_dst)):  # fmt: skip
        for g, w in zip(got[side], want):
            np.testing.assert_allclose(g.permute(0, 2, 3, 1).numpy(), w, rtol=1e-9, atol=1e-12, err_msg=side)


@pytest.mark.parametrize("archi", ["df", "liae-ud", "df-udt", "liae-c"])
def test_a_model_packed_for_cpu_inference_gives_the_plain_outputs_and_follows_its_weights(archi):
    torch.manual_seed(2)
    res = 64
    plain = SAEHD(res, archi, ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    packed = SAEHD(res, archi, ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    packed.load_state_dict(plain.state_dict())
    assert packed.pack_for_cpu() is packed
    x = torch.rand(3, 3, res, res)

    def outputs(model, x):
        with torch.inference_mode():
            return [*model.src(x), *model.dst(x), *model.swap(x)]

    def same(x):
        for got, want in zip(outputs(packed, x), outputs(plain, x), strict=True):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    same(x)
    same(x[:1])  # another batch size
    # A used packed model copies (as export-dfl copies to flip its colour order): the copy packs afresh.
    copied = copy.deepcopy(packed)
    for got, want in zip(outputs(copied, x), outputs(plain, x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # A model made under inference mode (its weights keep no version count) packs too.
    with torch.inference_mode():
        made_there = SAEHD(res, archi, ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
        made_there.load_state_dict(plain.state_dict())
    for got, want in zip(outputs(made_there.pack_for_cpu(), x), outputs(plain, x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # A training step's in-place update (as an optimizer's) reaches the packed forward.
    for model in (plain, packed):
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.5)
    same(x)
    # The training forward keeps its autograd graph, and gives the plain model's gradients.
    grads = []
    for model in (plain, packed):
        model.zero_grad()
        sum(t.sum() for t in model(x, x.flip(0))[:4]).backward()
        grads.append([p.grad for p in model.parameters()])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dfl_files_load_safely_and_write_back_byte_for_byte(tmp_path):
    torch.manual_seed(2)
    model = SAEHD(64, "df-ud", ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    for part in model.parts:
        dfl.write_weights(tmp_path / f"new_SAEHD_{part}.npy", dfl.export_part(getattr(model, part)))
    again = SAEHD(64, "df-ud", ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    for part in again.parts:
        arrays = dfl.read_weights(tmp_path / f"new_SAEHD_{part}.npy")
        assert all(v.dtype == np.float32 for v in arrays.values())
        dfl.import_part(getattr(again, part), arrays, part)
        for k, v in dfl.export_part(getattr(again, part)).items():  # import -> export: the same arrays
            assert v.tobytes() == arrays[k].tobytes() and v.shape == arrays[k].shape, k
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(model.swap(x)[0], again.swap(x)[0])

    # Another archi's file is named, key and all; DFL's _data.dat (numpy scalars inside) reads.
    liae = SAEHD(64, "liae-ud", ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    with pytest.raises(BigbatchError, match="new_SAEHD_decoder_src.npy: upscale0/conv1/weight:0 has shape"):
        dfl.import_part(
            liae.decoder, dfl.read_weights(tmp_path / "new_SAEHD_decoder_src.npy"), "new_SAEHD_decoder_src.npy"
        )
    data = {
        "iter": 1200,
        "options": {"resolution": np.int64(64), "archi": "df-ud", "adabelief": True},
        "loss_history": [[0.5, 0.4]],
    }
    (tmp_path / "new_SAEHD_data.dat").write_bytes(pickle.dumps(data))
    assert dfl.read_pickle(tmp_path / "new_SAEHD_data.dat") == data
    # Found from outside: well-formed pickles of wrong values ended in tracebacks; each is one line naming the key.
    dims = {"resolution": 64, "archi": "df-ud", "ae_dims": 16, "e_dims": 8, "d_dims": 8, "d_mask_dims": 4}
    for bad, said in (({"ae_dims": "abc"}, "ae_dims is 'abc', not int"), ({"resolution": None}, "resolution is None")):
        (tmp_path / "new_SAEHD_data.dat").write_bytes(pickle.dumps({"iter": 5, "options": {**dims, **bad}}))
        with pytest.raises(BigbatchError, match=re.escape(f"new_SAEHD_data.dat: its option {said}")):
            dfl.load_model_folder(tmp_path, "new")
    (tmp_path / "new_SAEHD_data.dat").write_bytes(pickle.dumps({"iter": "many", "options": dims}))
    with pytest.raises(BigbatchError, match="its option iter is 'many', not int"):
        dfl.load_model_folder(tmp_path, "new")
    strings = dfl.read_weights(tmp_path / "new_SAEHD_encoder.npy")
    strings[next(iter(strings))] = np.array(["x"])
    with pytest.raises(BigbatchError, match="holds <U1 values, not weights"):
        dfl.import_part(model.encoder, strings, "encoder")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch hacked",))


def test_a_pickle_that_would_run_code_is_refused_in_one_line(tmp_path):
    evil = tmp_path / "evil_SAEHD_encoder.npy"
    evil.write_bytes(pickle.dumps({"down1/downs_0/conv1/weight:0": _RunsCode()}, 4))
    with pytest.raises(BigbatchError) as e:
        dfl.read_weights(evil)
    assert "system, which is not an array" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "hacked").exists() and not os.path.exists("hacked")
    (tmp_path / "cut.npy").write_bytes(pickle.dumps({"a": np.zeros(3)}, 4)[:20])
    with pytest.raises(BigbatchError, match="not a readable DeepFaceLab file"):
        dfl.read_weights(tmp_path / "cut.npy")
    (tmp_path / "list.npy").write_bytes(pickle.dumps([1, 2], 4))
    with pytest.raises(BigbatchError, match="not a DeepFaceLab weight file"):
        dfl.read_weights(tmp_path / "list.npy")


# ---- losses and optimizers, against NumPy ports of DFL's code ---------------------------------------
def np_dssim(a, b, fs, sigma=1.5):  # NHWC, leras's nn.dssim step by step
    k = np.arange(fs, dtype=np.float64) - (fs - 1) / 2.0
    k = -0.5 * k**2 / sigma**2
    k = k.reshape(1, -1) + k.reshape(-1, 1)
    k = np.exp(k - k.max())
    k /= k.sum()
    red = lambda x: np.einsum("nhwcij,ij->nhwc", sliding_window_view(x, (fs, fs), axis=(1, 2)), k)  # noqa: E731
    c1, c2 = 0.01**2, 0.03**2
    m0, m1 = red(a), red(b)
    num0, den0 = m0 * m1 * 2, m0**2 + m1**2
    lum = (num0 + c1) / (den0 + c1)
    cs = (red(a * b) * 2 - num0 + c2) / (red(a**2 + b**2) - den0 + c2)
    return (1 - (lum * cs).mean(axis=(1, 2))) / 2


def test_dssim_is_dfls_and_runs_in_float32_under_autocast():
    from bigbatch.tasks.swap.losses import dssim, reconstruction_loss

    rng = np.random.default_rng(0)
    a, b = rng.random((2, 40, 40, 3)), rng.random((2, 40, 40, 3))
    ta, tb = (torch.from_numpy(x).permute(0, 3, 1, 2).float() for x in (a, b))
    for fs in (11, 22):  # an even window is centred between pixels, as DFL's
        np.testing.assert_allclose(dssim(ta, tb, fs).numpy(), np_dssim(a, b, fs), rtol=1e-4, atol=1e-6)
    assert float(dssim(ta, ta, 11).abs().max()) < 1e-6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = dssim(ta.bfloat16(), tb.bfloat16(), 11)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, dssim(ta.bfloat16().float(), tb.bfloat16().float(), 11))
    big = torch.full((1, 3, 64, 64), 60000.0, dtype=torch.float16)  # squares overflow float16
    assert torch.isfinite(dssim(big, big * 0.5, 44, max_val=65504.0)).all()
    # 128 px: one 10x window of 11; 256 px: 5x windows of 22 and 11; and 10x MSE each time.
    x, y = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    mse = 10 * (x - y).square().mean((1, 2, 3))
    torch.testing.assert_close(reconstruction_loss(x, y, 128), 10 * dssim(x, y, 11).mean(1) + mse)
    torch.testing.assert_close(reconstruction_loss(x, y, 256), 5 * (dssim(x, y, 22) + dssim(x, y, 11)).mean(1) + mse)


def test_dssim_and_blur_gradients_are_those_of_their_2d_windows():
    from bigbatch.tasks.swap.losses import dssim, gaussian_blur

    def window2d(size, sigma, softmax):
        d = torch.arange(size, dtype=torch.float64) - ((size - 1) / 2 if softmax else size // 2)
        g = torch.softmax(-(d**2) / (2 * sigma**2), 0) if softmax else torch.exp(-(d**2) / (2 * sigma**2))
        g = g / g.sum()
        return torch.outer(g, g).expand(3, 1, size, size)

    def ref_dssim(a, b, size):
        w = window2d(size, 1.5, True)
        mean = lambda x: torch.nn.functional.conv2d(x, w, groups=3)  # noqa: E731
        c1, c2 = 0.01**2, 0.03**2
        mu_a, mu_b = mean(a), mean(b)
        num0, den0 = mu_a * mu_b * 2, mu_a**2 + mu_b**2
        cs = (mean(a * b) * 2 - num0 + c2) / (mean(a**2 + b**2) - den0 + c2)
        return (1 - ((num0 + c1) / (den0 + c1) * cs).mean((2, 3))) / 2

    a, b = torch.rand(2, 3, 30, 30, dtype=torch.float64), torch.rand(2, 3, 30, 30, dtype=torch.float64)
    weights = torch.rand(2, 3, dtype=torch.float64)
    for size in (11, 6):
        want = torch.autograd.grad((ref_dssim(a, b.requires_grad_(), size) * weights).sum(), b)[0]
        got = torch.autograd.grad((dssim(a, b.requires_grad_(), size) * weights).sum(), b)[0]  # in float32
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    x, out_weights = torch.rand(2, 3, 30, 30, dtype=torch.float64, requires_grad=True), torch.rand(2, 3, 30, 30)
    w = window2d(9, 2.0, False)  # sigma 2: int(4 sigma) = 8 taps, made odd
    want = torch.autograd.grad((torch.nn.functional.conv2d(x, w, padding=4, groups=3) * out_weights).sum(), x)[0]
    got = torch.autograd.grad((gaussian_blur(x, 2.0) * out_weights).sum(), x)[0]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-12)  # (the taps are float32's)


def test_adabelief_and_rmsprop_update_as_dfls():
    from bigbatch.tasks.swap.optim import AdaBelief, RMSprop

    # A weight of 280,000 elements: the update goes over a large weight piece by piece (in cache).
    grads = np.random.default_rng(1).normal(size=(5, 700, 400))
    p0 = np.random.default_rng(2).normal(size=(700, 400))
    for opt_cls in (AdaBelief, RMSprop):
        p = torch.nn.Parameter(torch.tensor(p0))
        opt = opt_cls([p], lr=0.01, lr_cos=7)
        want, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        for step, g in enumerate(grads):
            p.grad = torch.tensor(g)
            opt.step()
            lr = 0.01 * (np.cos(step * 2 * np.pi / 7) + 1) / 2
            if opt_cls is AdaBelief:
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * (g - m) ** 2
                want = want - lr * m / (np.sqrt(v) + 1e-6)
            else:
                v = 0.9 * v + 0.1 * g**2
                want = want - lr * g / (np.sqrt(v) + 1e-6)
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-12, atol=1e-15, err_msg=opt_cls.__name__)
    # One step counter per optimizer (DFL's iters), counting steps where a parameter had no gradient.
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    opt = AdaBelief([a, b], lr=1.0, lr_cos=4)
    for step in range(3):
        a.grad, b.grad = torch.ones(3), (torch.ones(3) if step == 2 else None)
        opt.step()
    assert opt.state_dict()["param_groups"][0]["step"] == 3
    assert torch.equal(b.detach(), torch.zeros(3))  # its first update came at step 2: rate (cos π + 1) / 2 = 0
    assert not torch.equal(a.detach(), torch.zeros(3))
    # lr_dropout 0.3: about 30% of the elements move at each step, the others keep their value.
    p = torch.nn.Parameter(torch.zeros(300_000))
    opt = AdaBelief([p], lr=0.01, lr_dropout=0.3, seed=(0,))
    p.grad = torch.ones(300_000)
    opt.step()
    moved = p.detach() != 0
    assert 0.29 < float(moved.float().mean()) < 0.31 and 0.25 < float(moved[-30_000:].float().mean()) < 0.35
    torch.testing.assert_close(p.detach()[moved], torch.full_like(p[moved], -0.01 * 0.1 / (0.9 * 0.001**0.5 + 1e-6)))


def test_dfl_optimizers_update_a_gpus_parts_as_the_cpus_pieces(monkeypatch):
    """On a GPU the update runs over parts of many weights at once (multi-tensor kernels): the same
    arithmetic element by element, so the same bits as the CPU's pieces (here both on CPU)."""
    from bigbatch.tasks.swap import optim

    shapes = [(700, 400), (3,), (5, 4, 3, 3), (64,), (300, 200), (2, 3)]  # a transposed one: not contiguous
    grads = [
        [torch.randn(s, generator=torch.Generator().manual_seed(10 * i + j)) for j, s in enumerate(shapes)]
        for i in range(3)
    ]

    def train(cls: type, parts: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(torch.full(s, 0.5)) for s in shapes]
        params[-1] = torch.nn.Parameter(torch.full((3, 2), 0.5).t())
        opt = cls(params, lr=0.01, lr_cos=7)
        with monkeypatch.context() as m:
            if parts:  # the GPU's layout, with parts of 70,000 elements: a weight cut, small ones together
                m.setattr(optim, "_on_cpu", optim._on_device)
                m.setattr(optim, "DEVICE_PART", 70_000)
            for step in grads:
                for p, g in zip(params, step):
                    p.grad = g.reshape(p.shape)
                opt.step()
        return [p.detach().clone() for p in params] + [t for s in opt.state.values() for t in s.values()]

    for cls in (optim.AdaBelief, optim.RMSprop):
        for a, b in zip(train(cls, False), train(cls, True)):
            assert torch.equal(a, b), cls.__name__
    # lr dropout in parts: about 30% of the elements move, and the same ones for the same seed (every rank).
    monkeypatch.setattr(optim, "_on_cpu", optim._on_device)
    monkeypatch.setattr(optim, "DEVICE_PART", 70_000)
    moved = []
    for _ in range(2):
        p = torch.nn.Parameter(torch.zeros(300_000))
        opt = optim.AdaBelief([p], lr=0.01, lr_dropout=0.3, seed=(4,))
        p.grad = torch.ones(300_000)
        opt.step()
        moved.append(p.detach() != 0)
    assert torch.equal(moved[0], moved[1]) and 0.29 < float(moved[0].float().mean()) < 0.31
    assert 0.25 < float(moved[0][-30_000:].float().mean()) < 0.35


def test_a_dfl_model_folder_reads_as_an_rgb_model_and_writes_back(tmp_path):
    torch.manual_seed(3)
    model = SAEHD(64, "liae-ud", ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    dfl.save_model_folder(model, tmp_path / "model", "mine", {"face_type": "wf", "ae_dims": 999}, iteration=1200)
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    parts = ("data.dat", "decoder.npy", "encoder.npy", "inter_AB.npy", "inter_B.npy")
    assert files == [f"mine_SAEHD_{p}" for p in parts]
    loaded, data = dfl.load_model_folder(tmp_path / "model")
    assert data["iter"] == 1200 and data["options"]["face_type"] == "wf" and data["options"]["ae_dims"] == 16
    rgb = torch.rand(2, 3, 64, 64)
    for a, b in zip(model.swap(rgb), loaded.swap(rgb)):
        torch.testing.assert_close(a, b)
    # The files are DFL's BGR model: fed BGR, it gives the RGB model's output in BGR.
    raw = SAEHD(64, "liae-ud", ae_dims=16, e_dims=8, d_dims=8, d_mask_dims=4)
    for part in raw.parts:
        dfl.import_part(getattr(raw, part), dfl.read_weights(tmp_path / "model" / f"mine_SAEHD_{part}.npy"), part)
    image, mask, _ = raw.swap(rgb.flip(1))
    torch.testing.assert_close(image.flip(1), model.swap(rgb)[0])
    torch.testing.assert_close(mask, model.swap(rgb)[1])

    dfl.save_model_folder(model, tmp_path / "model", "other")
    with pytest.raises(BigbatchError, match="several SAEHD models \\(mine, other\\): name the one"):
        dfl.load_model_folder(tmp_path / "model")
    assert dfl.load_model_folder(tmp_path / "model", "other")[1]["iter"] == 0
    with pytest.raises(BigbatchError, match="holds no DeepFaceLab SAEHD model"):
        dfl.load_model_folder(tmp_path)


def test_fp16_trains_a_u_archi_whose_codes_are_small():
    # Found from outside: fp16 skipped every step of liae-ud, df-ud and df-u (the "u" pixel-normalizes the
    # code): rsqrt's gradient at a code of mean square 1e-4 is 5e5, past fp16's 65,504. SAEHD's code is now
    # normalized in fp32, and an fp16 step's gradients are fp32's, rounded.
    from bigbatch.models.saehd import pixel_norm

    code = torch.randn(4, 8192, dtype=torch.float64) * 0.01
    grads = []
    for dtype in (torch.float16, torch.float32):
        x = code.to(dtype).requires_grad_()
        (pixel_norm(x) * torch.linspace(-1, 1, 8192, dtype=dtype)).sum().backward()
        grads.append(x.grad.double())
    assert torch.isfinite(grads[0]).all() and torch.allclose(grads[0], grads[1], rtol=1e-3, atol=0.1)  # (of up to 100)
