"""The model zoo around the families: BigGAN-PyTorch weights in and out, fine-tuning, FreezeD."""

import pytest
import torch
from safetensors.torch import load_file

import bigbatch
import bigbatch.checkpoint_find
from bigbatch.cli import main
from bigbatch.models import convert
from bigbatch.models.layers import SpectralNorm

TINY = {
    "biggan": (32, dict(ch=8, dim_z=16, g_attn=16, d_attn=16)),
    "biggan unshared": (32, dict(ch=8, dim_z=16, shared=False, hier=False, g_attn=0, d_attn=0)),
    "sagan": (32, dict(ch=8, dim_z=16, g_attn=16, d_attn=8)),
    "biggan_deep": (128, dict(ch=16, dim_z=16)),
}


def tiny_pair(key, n_classes=5, seed=0):
    torch.manual_seed(seed)
    resolution, kwargs = TINY[key]
    G, D = bigbatch.models.create(key.split()[0], resolution, n_classes, **kwargs)
    for net in (G, D):
        for p in net.parameters():
            p.data.normal_(0, 0.05)
        for m in net.modules():  # the exact top singular vectors: a power iteration from them stays put
            if isinstance(m, SpectralNorm):
                U, _, Vh = torch.linalg.svd(m.weight.detach().flatten(1).double(), full_matrices=False)
                m.sn_u, m.sn_v = U[:, :1].t().float().contiguous(), Vh[:1].float().contiguous()
        for m in net.modules():  # BN statistics that are not the defaults
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
        net.eval()
    return G, D


@pytest.mark.parametrize("key", list(TINY))
def test_weights_in_biggan_pytorch_layout_load_with_identical_outputs(key):
    G, D = tiny_pair(key)
    G2, D2 = tiny_pair(key, seed=1)  # other weights, to be overwritten
    for src, dst in ((G, G2), (D, D2)):
        ref = convert.to_reference(src)
        assert not any("sn_" in k or "running_" in k for k in ref)
        dst.load_state_dict(convert.from_reference(dst, ref))
    z, y = torch.randn(3, G.dim_z), torch.tensor([0, 2, 4])
    x = G(z, y)
    torch.testing.assert_close(G2(z, y), x, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(D2(x, y), D(x, y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", ["biggan", "biggan_deep"])
def test_biggan_pytorchs_forward_of_exported_weights_divides_by_our_sigma(key):
    # BigGAN-PyTorch's spectral norm runs a power iteration from u0 in every forward, eval mode too (its
    # layers.SN.W_: v = normalize(u0 W), u = normalize(v W^T), sv = v W^T u^T). Found from outside: u0 was our u, so
    # its forward divided by another sigma than ours (images 0.05 apart) unless the vectors had converged.
    import torch.nn.functional as F

    G, _ = tiny_pair(key)
    torch.manual_seed(1)
    for m in G.modules():  # vectors one iteration from a random start, as early in training: not converged
        if isinstance(m, SpectralNorm):
            m.sn_u = F.normalize(torch.randn_like(m.sn_u), dim=1)
            m._power_iteration()
    ref = convert.to_reference(G)
    checked = 0
    for name, m in G.named_modules():
        if isinstance(m, SpectralNorm):
            w = m.weight.detach().flatten(1)
            u0 = ref[convert.reference_name(G, f"{name}.sn_u")]
            v = F.normalize(u0 @ w, dim=1)
            u = F.normalize(v @ w.t(), dim=1)
            theirs, ours = (v @ w.t() @ u.t()).squeeze(), (m.sn_u @ w @ m.sn_v.t()).squeeze()
            torch.testing.assert_close(theirs, ours, rtol=2e-5, atol=0)
            checked += 1
    assert checked > 10


def test_an_averaged_generators_spectral_norm_is_exported_as_biggan_pytorchs_forward_divides(capsys):
    # G_ema averages G's weights and keeps G's vectors (as StudioGAN's EMA), so u W v^T is not |W v|: found from
    # outside, its images came out 0.21 apart in BigGAN-PyTorch. Now u0 gives that sigma where a u0 can, and the
    # layers where none can are said.
    import torch.nn.functional as F

    G, _ = tiny_pair("biggan")
    other, _ = tiny_pair("biggan", seed=1)
    with torch.no_grad():  # an average of G and another G, G's vectors kept
        for p, q in zip(G.parameters(), other.parameters()):
            p.lerp_(q, 0.3)
    capsys.readouterr()
    ref = convert.to_reference(G)
    said = capsys.readouterr().err
    named = set(said.partition(": no u0 gives")[0].removeprefix("bigbatch: warning: ").split(", ")) if said else set()
    moved = 0
    for name, m in G.named_modules():
        if isinstance(m, SpectralNorm):
            w = m.weight.detach().flatten(1)
            v = F.normalize(ref[convert.reference_name(G, f"{name}.sn_u")] @ w, dim=1)
            theirs, ours = (w @ v.t()).norm(), (m.sn_u @ w @ m.sn_v.t()).squeeze()
            moved += not torch.isclose((w @ m.sn_v.t()).norm(), ours, rtol=1e-3)  # (the vectors' own |W v|: off)
            if name not in named:
                torch.testing.assert_close(theirs, ours, rtol=2e-5, atol=0, msg=name)
    assert moved > 10 and (not said or "no u0 gives BigGAN-PyTorch's forward this model's spectral norm" in said)


@pytest.mark.parametrize("key", ["biggan", "biggan_deep"])
def test_the_exported_conditioning_weights_read_the_references_order(key):
    # BigGAN.py joins each block's [shared(y), z chunk]; BigGANdeep.py's forward z = torch.cat([y, z], 1) for the
    # first linear and every block. Found from outside: the deep G's columns were exported in our [z, shared(y)]
    # order, which loads silently at dim_z = shared_dim (128 each) and gives other images.
    import torch.nn.functional as F

    G, _ = tiny_pair(key)
    ref = convert.to_reference(G)
    z, y = torch.randn(3, G.dim_z), torch.tensor([0, 2, 4])
    e = G.shared(y)
    if key == "biggan_deep":
        ours, theirs = torch.cat([z, e], 1), torch.cat([e, z], 1)
        torch.testing.assert_close(F.linear(theirs, ref["linear.weight"]), F.linear(ours, G.linear.weight))
    else:
        chunk = z[:, : G.blocks[0].bn1.gain.weight.shape[1] - e.shape[1]]
        ours = theirs = torch.cat([e, chunk], 1)  # (BigGAN's own order: nothing moved)
    gain = G.blocks[0].bn1.gain.weight
    torch.testing.assert_close(F.linear(theirs, ref["blocks.0.0.bn1.gain.weight"]), F.linear(ours, gain))
    back, _ = tiny_pair(key, seed=1)
    back.load_state_dict(convert.from_reference(back, ref))
    assert torch.equal(back.linear.weight, G.linear.weight) and torch.equal(back.blocks[0].bn1.gain.weight, gain)


def test_reference_names_at_the_reference_configurations():
    with torch.device("meta"):
        G, D = bigbatch.models.create("biggan", 128, 1000, ch=96, dim_z=120)
        Gd, Dd = bigbatch.models.create("biggan_deep", 128, 1000)
    names = {net: set(convert.to_reference(m)) for net, m in (("G", G), ("D", D), ("Gd", Gd), ("Dd", Dd))}
    # Names as BigGAN-PyTorch's BigGAN.py / BigGANdeep.py register them.
    assert {
        "shared.weight",
        "linear.u0",
        "linear.sv0",
        "blocks.0.0.bn1.gain.u0",
        "blocks.0.0.bn1.stored_mean",
        "blocks.0.0.conv_sc.weight",
        "blocks.3.1.gamma",  # attention after the 64-px block
        "output_layer.0.gain",
        "output_layer.0.stored_var",
        "output_layer.2.weight",
    } <= names["G"]
    assert {"blocks.0.1.theta.u0", "blocks.5.0.conv2.weight", "embed.weight", "embed.u0"} <= names["D"]
    assert {"blocks.7.1.gamma", "blocks.9.0.bn4.gain.weight", "output_layer.2.weight"} <= names["Gd"]
    assert {"input_conv.weight", "blocks.0.0.conv_sc.weight", "blocks.0.1.conv4.weight", "blocks.0.2.gamma"} <= names[
        "Dd"
    ]
    assert not any(k.startswith("blocks.10") for k in names["Gd"])  # 5 stages x depth 2


def test_wrong_weights_are_one_clear_error():
    G, _ = tiny_pair("biggan")
    ref = convert.to_reference(G)
    other, _ = bigbatch.models.create("biggan", 32, 5, ch=16, dim_z=16, g_attn=16)
    with pytest.raises(bigbatch.BigbatchError, match="not BigGAN-PyTorch weights of this model.*shape"):
        convert.from_reference(other, ref)
    del ref["shared.weight"]
    with pytest.raises(bigbatch.BigbatchError, match="missing shared.weight"):
        convert.from_reference(G, ref)
    # An SN-GAN is built of BigGAN's classes, and BigGAN-PyTorch has no SN-GAN to load it (found from outside: a
    # layout was given).
    for net in bigbatch.models.create("sngan", 32, 5, ch=4, dim_z=16):
        with pytest.raises(bigbatch.BigbatchError, match="convert only into the families .*; got sngan$"):
            convert.to_reference(net)


def write_reference_weights(folder, G, D):
    folder.mkdir()
    torch.save(convert.to_reference(G), folder / "G.pth")
    torch.save(convert.to_reference(G), folder / "G_ema.pth")
    torch.save(convert.to_reference(D), folder / "D.pth")


TINY_RUN = ["data.resolution=32", "model.ch=8", "model.dim_z=16", "model.options={g_attn=16, d_attn=16}"]


def test_a_lone_unshared_g_tells_its_classes_by_its_embeddings(tmp_path):
    # The CIFAR script's G (no shared embedding: each conditional BN's gain an embedding of the classes), alone
    # (found from outside: "pass --classes N", though the weights say it).
    G, _ = tiny_pair("biggan unshared")
    (tmp_path / "w").mkdir()
    torch.save(convert.to_reference(G), tmp_path / "w" / "G.pth")
    options = "model.options={shared=false, hier=false, g_attn=0, d_attn=0}"
    argv = ["convert", str(tmp_path / "w" / "G.pth"), str(tmp_path / "run"), *TINY_RUN[:3], options]
    assert main(argv) == 0
    G_loaded = bigbatch.load_generator(tmp_path / "run")
    assert G_loaded.n_classes == 5
    z, y = torch.randn(2, 16), torch.tensor([1, 4])
    torch.testing.assert_close(G_loaded(z, y), G(z, y), rtol=1e-5, atol=1e-5)


def test_convert_then_sample_then_fine_tune_on_other_classes(tmp_path, capsys):
    G, D = tiny_pair("biggan")
    write_reference_weights(tmp_path / "weights", G, D)
    # convert: a run directory whose G_ema reproduces the reference weights
    rng = torch.get_rng_state()
    assert main(["convert", str(tmp_path / "weights"), "converted", *TINY_RUN]) == 0
    assert torch.equal(torch.get_rng_state(), rng)  # converting leaves the caller's global RNG alone
    G_loaded = bigbatch.load_generator("converted")
    z, y = torch.randn(2, 16), torch.tensor([1, 3])
    torch.testing.assert_close(G_loaded(z, y), G(z, y), rtol=1e-5, atol=1e-5)
    assert main(["sample", "converted", "--n", "4", "--out", "s.png"]) == 0
    capsys.readouterr()

    # fine-tune on digits (10 classes, not 5): class embeddings re-initialised, everything else loaded
    tune = [
        "--preset",
        "digits",
        "model.name=biggan",
        *TINY_RUN,
        "train.batch=8",
        "train.micro_batch=8",
        "train.kimg=0.016",
        "train.g_lr=1e-12",
        "train.d_lr=1e-3",
        "train.freeze_d=2",
        "--run-dir",
        "tuned",
        "--quiet",
    ]
    # Another family's run is named as such (found from outside: "w_avg is missing", a buffer of StyleGAN2's G).
    assert main(["train", "--init-from", "converted", *tune, "model.name=sngan", "model.options={}"]) == 2
    assert "converted is a biggan run, and this one trains sngan: fine-tuning takes" in capsys.readouterr().err
    assert main(["train", "--init-from", "converted", *tune]) == 0
    said = capsys.readouterr()  # what was thrown away said under --quiet too (found from outside: unsaid)
    assert "re-initialised for this data set's classes: G's shared.weight; D's embed.sn_u, embed.weight" in said.err
    assert "Fine-tuning from" not in said.out
    ckpt = bigbatch.checkpoint_find.find_checkpoint("tuned")
    G_new, D_new = load_file(str(ckpt / "G.safetensors")), load_file(str(ckpt / "D.safetensors"))
    G_old, D_old = G.state_dict(), D.state_dict()
    assert G_new["shared.weight"].shape == (10, 128) and G_old["shared.weight"].shape == (5, 128)
    assert D_new["embed.weight"].shape[0] == 10
    # lr 1e-12: G is still the pretrained one
    torch.testing.assert_close(G_new["blocks.0.conv1.weight"], G_old["blocks.0.conv1.weight"], rtol=0, atol=1e-9)
    # FreezeD: D's first two blocks did not move, the rest did
    assert torch.equal(D_new["blocks.0.conv1.weight"], D_old["blocks.0.conv1.weight"])
    assert torch.equal(D_new["blocks.1.conv2.weight"], D_old["blocks.1.conv2.weight"])
    assert not torch.equal(D_new["blocks.2.conv1.weight"], D_old["blocks.2.conv1.weight"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["convert", "nowhere", "out"], "nowhere does not exist"),
        (["convert", "junk.pth", "out", *TINY_RUN], "junk.pth is not a PyTorch file (neither"),
        (
            ["train", "--preset", "fashion_resnet", "data.path=builtin:digits", "train.init_from=junk.pth"],
            "train.init_from junk.pth is not a PyTorch file (neither",
        ),
        (  # (found from outside: torch's warning over several lines, then its refusal)
            ["train", "--preset", "fashion_resnet", "data.path=builtin:digits", "train.init_from=model.pt"],
            "train.init_from model.pt is a TorchScript file (such as bigbatch export writes), not weights",
        ),
        (["convert", "weights", "out", "model.name=dcgan"], "convert into biggan, sagan, biggan_deep"),
        (["convert", "weights", "out", *TINY_RUN, "model.ch=16"], "not BigGAN-PyTorch weights of this model"),
        (["train", "--init-from", "nowhere"], "nowhere does not exist"),
        (["train", "train.freeze_d=99", "train.kimg=0.016"], "train.freeze_d=99, but this D has 3 blocks"),
    ],
)
def test_convert_and_fine_tune_bad_input(tmp_path, capsys, argv, words):
    G, D = tiny_pair("biggan")
    write_reference_weights(tmp_path / "weights", G, D)
    (tmp_path / "junk.pth").write_bytes(b"not a zip file at all")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "model.pt"))
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("bigbatch: error: ") and err.count("\n") == 1, err
    assert words in err and "weights_only" not in err  # torch's advice to unpickle anything: never passed on


def test_linear_lr_decay_follows_images_seen(tiny):
    cfg = tiny.override({"train.lr_decay": "linear", "train.kimg": 0.128, "train.g_lr": 1e-3, "train.d_lr": 2e-3})
    run = bigbatch.train(cfg, run_dir="run", quiet=True)
    state = torch.load(bigbatch.checkpoint_find.find_checkpoint(run) / "state.pt", weights_only=True)
    # the last iteration started at 96 of 128 images
    assert state["opt_G"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * (1 - 96 / 128))
    assert state["opt_D"]["param_groups"][0]["lr"] == pytest.approx(2e-3 * (1 - 96 / 128))


def test_a_converted_run_resumes_and_its_g_ema_or_a_fine_tunes_is_blended_on_not_replaced(tmp_path, capsys):
    # Found from outside: --resume of a converted GAN failed on its missing optimizer state; under the BigGAN preset's
    # ema_start_kimg (40,960 kimg) a fine-tune's pretrained G_ema was replaced by G; given BigGAN-PyTorch's
    # G_ema_best0.pth, D_best0.pth beside it was not read; an ADA snapshot was "not a PyTorch weights file".
    G, D = tiny_pair("biggan", n_classes=10)
    (tmp_path / "w").mkdir()
    for net, m in (("G", G), ("G_ema", G), ("D", D)):
        torch.save(convert.to_reference(m), tmp_path / "w" / f"{net}_best0.pth")
    (tmp_path / "w" / "network-snapshot-000000.pkl").write_bytes(b"a pickle")
    assert main(["convert", str(tmp_path / "w"), "out", *TINY_RUN]) == 2
    err = capsys.readouterr().err
    assert "network-snapshot-000000.pkl is a network pickle (StyleGAN2-ADA's snapshot)" in err, err
    (tmp_path / "w" / "network-snapshot-000000.pkl").unlink()
    assert main(["convert", str(tmp_path / "w"), "out", *TINY_RUN]) == 2
    assert "but G_best0.pth, G_ema_best0.pth: give one of those files" in capsys.readouterr().err

    small = ["data.path=builtin:digits", "train.batch=8", "train.micro_batch=8", "train.kimg=0.016"]
    small += ["sample.every_kimg=0", "eval.every_kimg=0"]
    assert main(["convert", str(tmp_path / "w" / "G_ema_best0.pth"), "conv", *TINY_RUN, *small]) == 0
    assert "freshly initialised" not in capsys.readouterr().err  # (D_best0.pth read)
    D_run = load_file("conv/checkpoints/000000.000/D.safetensors")
    assert torch.equal(D_run["blocks.0.conv1.weight"], D.state_dict()["blocks.0.conv1.weight"])

    def blended(run):
        ckpt = bigbatch.checkpoint_find.find_checkpoint(run)
        G_run, G_ema = load_file(str(ckpt / "G.safetensors")), load_file(str(ckpt / "G_ema.safetensors"))
        return ckpt.name == "000000.016" and not torch.equal(G_run["linear.weight"], G_ema["linear.weight"])

    assert main(["train", "--run-dir", "conv", "--resume", "--quiet"]) == 0  # (biggan128_bs2048: EMA from 40,960 kimg)
    assert blended("conv")
    tune = ["--preset", "biggan128_bs2048", "--init-from", "conv", "--run-dir", "tuned", "--quiet", *TINY_RUN, *small]
    assert main(["train", *tune]) == 0
    assert blended("tuned")
    # Under train.ema_rampup the half-life counts from the fine-tune's first image: its first step copied G into
    # G_ema, the pretrained average lost (found from outside; StyleGAN2-ADA turns the ramp-up off on a resume).
    assert main(["train", *tune, "--run-dir", "ramped", "train.ema_rampup=0.05"]) == 0
    ckpt, source = bigbatch.checkpoint_find.find_checkpoint("ramped"), convert.to_reference(G)["linear.weight"]
    G_run, G_ema = (load_file(str(ckpt / f"{n}.safetensors"))["linear.weight"] for n in ("G", "G_ema"))
    assert 0 < float((G_ema - source).norm()) < float((G_run - source).norm()) / 10
