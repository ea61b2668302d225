"""The swap task (DeepFaceLab's SAEHD on the engine): each archi's shapes, every loss term, the warp,
training with masks and both discriminators, resume and process-count invariance, and the files in
and out (prepare --masks, export-dfl, convert, swap)."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import stopped_then_resumed
from PIL import Image
from safetensors.torch import load_file

import bigbatch
from bigbatch.cli import main
from bigbatch.errors import BigbatchError
from bigbatch.models import dfl
from bigbatch.models.saehd import SAEHD
from bigbatch.tasks.swap import warp
from bigbatch.tasks.swap.files import swap_folder
from bigbatch.tasks.swap.load import dfl_record, load_autoencoder
from bigbatch.tasks.swap.task import SwapTask, preview_sheet, swap_faces

TINY = {"ae_dims": 16, "e_dims": 4, "d_dims": 4, "d_mask_dims": 2}


@pytest.mark.parametrize("archi", ["df", "liae", "df-ud", "liae-ud", "df-t", "liae-udt", "df-c"])
def test_every_archi_reconstructs_at_its_resolution_and_trains_every_weight(archi):
    torch.manual_seed(0)
    net = SAEHD(64, archi, **TINY)
    src, dst = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    a, am, b, bm, src_code, dst_code = net(src, dst)
    assert a.shape == b.shape == (2, 3, 64, 64) and am.shape == bm.shape == (2, 1, 64, 64)
    assert src_code.shape == dst_code.shape and src_code.shape[0] == 2
    (a.sum() + am.sum() + b.sum() + bm.sum()).backward()
    # liae's inter_AB feeds both sides, inter_B dst only; df's decoders one side each: all get gradients.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    image, mask, dst_mask = net.swap(dst)
    assert image.shape == (2, 3, 64, 64) and mask.shape == dst_mask.shape == (2, 1, 64, 64)
    for block in net.checkpoint_blocks:
        net.get_submodule(block)


def swap_config(src, dst, **over):
    cfg = bigbatch.preset("saehd_cpu").override(
        {
            "data.path": str(src),
            "data.dst_path": str(dst),
            "data.val_fraction": 0.0,
            "model.options": {"archi": "df-u", **TINY},
            "train.batch": 4,
            "train.micro_batch": 2,
            "train.kimg": 0.016,
            "train.log_every_kimg": 0.004,
            "checkpoint.every_kimg": 0.008,
            "sample.every_kimg": 0.008,
            "eval.every_kimg": 0.0,
            "swap.eyes_mouth_prio": True,
            "swap.true_face_power": 0.1,
            "swap.gan_power": 0.1,
            "swap.lr_dropout": True,
        }
    )
    return cfg.override(over)


def _task(cfg):
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    return build_task(cfg, replicator_for(cfg), training_data(cfg))


def test_each_loss_term_is_dfls(faces):
    task = _task(swap_config(*faces))
    torch.manual_seed(0)
    target, pred = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    mask = torch.zeros(2, 1, 64, 64)
    mask[..., 16:48, 16:48] = 1
    em = torch.zeros(2, 1, 64, 64)
    em[..., 24:30, 20:44] = 1
    pred_mask = torch.rand(2, 1, 64, 64)
    base = task.side_loss(target, mask, None, pred, pred_mask)
    # Masked training: what lies outside the blurred mask does not count in the image terms.
    outside = pred.clone()
    outside[..., :, :4] = 0.0
    assert torch.allclose(task.side_loss(target, mask, None, outside, pred_mask), base, atol=1e-5)
    # The eyes-and-mouth priority adds 300·L1 inside the region.
    extra = task.side_loss(target, mask, em, pred, pred_mask) - base
    assert torch.allclose(extra, 300 * ((target - pred) * em).abs().mean(dim=(1, 2, 3)), atol=1e-4)
    # The mask term: 10·MSE of the predicted mask.
    other = task.side_loss(target, mask, None, pred, pred_mask + 0.1) - base
    expected = 10 * ((mask - pred_mask - 0.1).square() - (mask - pred_mask).square()).mean(dim=(1, 2, 3))
    assert torch.allclose(other, expected, atol=1e-5)
    # Without masked training the image terms see the whole image.
    task.cfg = task.cfg.override({"swap.masked_training": False})
    assert not torch.allclose(
        task.side_loss(target, mask, None, outside, pred_mask), task.side_loss(target, mask, None, pred, pred_mask)
    )


def test_training_with_both_discriminators_resumes_bit_exact(faces, tmp_path):
    # with every DFL option on: both discriminators, lr dropout, colour transfer, HSV shift, styles, blur-out
    colour = {"swap.ct_mode": "idt", "swap.random_hsv_power": 0.1, "swap.blur_out_mask": True}
    cfg = swap_config(*faces, **colour, **{"swap.face_style_power": 0.1, "swap.bg_style_power": 1.0})
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "src_loss" in r]
    assert trained and all(k in trained[-1] for k in ("dst_loss", "loss_code_discriminator", "loss_gan"))
    ckpt = whole / "checkpoints" / "000000.016"
    assert {p.name for p in ckpt.glob("*.safetensors")} == {
        "model.safetensors",
        "code_discriminator.safetensors",
        "gan.safetensors",
    }
    preview = Image.open(sorted((whole / "samples").glob("preview-*.png"))[-1])
    assert preview.size == (7 * 64, 8 * 64)  # src, rec, dst, rec, swap, mask, blend; a row per face (sample.n 8)

    part = stopped_then_resumed(SwapTask, cfg, tmp_path / "part", at=8)
    for name in ("model", "code_discriminator", "gan"):
        a = (ckpt / f"{name}.safetensors").read_bytes()
        assert a == (part / "checkpoints" / "000000.016" / f"{name}.safetensors").read_bytes(), name
    # The same dst faces at another path resume (refused as a change of config), as src's do ...
    moved = tmp_path / "moved.h5"
    moved.write_bytes(faces[1].read_bytes())
    elsewhere = cfg.override({"train.kimg": 0.02, "data.dst_path": str(moved)})
    bigbatch.train(elsewhere, run_dir=part, resume=True, quiet=True)
    # ... and other dst faces under the same path are refused, as for src.
    faces[1].write_bytes(faces[0].read_bytes())
    with pytest.raises(BigbatchError, match="data.dst_path .* holds other images than the run was trained on"):
        bigbatch.train(cfg.override({"train.kimg": 0.024}), run_dir=part, resume=True, quiet=True)


def test_two_processes_train_the_weights_of_one(faces, tmp_path):
    over = {"train.kimg": 0.008, "train.batch": 8, "train.micro_batch": 2}
    colour = {"swap.ct_mode": "sot", "swap.random_hsv_power": 0.05}
    cfg = swap_config(*faces, **over, **colour, **{"swap.face_style_power": 0.1, "swap.bg_style_power": 1.0})
    (tmp_path / "swap.toml").write_text(cfg.dumps())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    weights = []
    for procs in (1, 2):
        cmd = [sys.executable, "-m", "bigbatch.cli", "train"]
        if procs > 1:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "-m",
                "bigbatch.cli",
                "train",
            ]
        run = tmp_path / f"p{procs}"
        out = subprocess.run(
            cmd + ["--config", str(tmp_path / "swap.toml"), "--run-dir", str(run)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        weights.append(load_file(run / "checkpoints" / "000000.008" / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    # The same images, warps, colour draws and dropout masks (and the style losses' decoder passes, made
    # outside DDP's forward, reduced all the same); the gradient sums in another order.
    for k in weights[0]:
        assert torch.allclose(weights[0][k], weights[1][k], rtol=1e-4, atol=1e-6), k


def test_export_convert_and_swap_round_trip(faces, tmp_path, capsys):
    over = {"train.kimg": 0.004, "swap.true_face_power": 0.0, "swap.gan_power": 0.0}
    # micro_batch "auto" probes the autoencoder alone; checkpointing recomputes its blocks and losses.
    over.update({"train.micro_batch": "auto", "train.memory_budget": "4GiB", "train.checkpointing": True})
    cfg = swap_config(*faces, **over)
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)

    def cli(*args):  # the command line, in this process (each a new interpreter took most of this test's time)
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    # Faces not prepared from DFL's: their face type (which DFL's merger crops by) is asked for, not guessed.
    out = cli("export-dfl", str(run), str(tmp_path / "dfl"), "--name", "me")
    assert out.returncode == 2 and "give --face-type h|mf|f|wf|head" in out.stderr and not (tmp_path / "dfl").exists()
    out = cli("export-dfl", str(run), str(tmp_path / "dfl"), "--name", "me", "--face-type", "wf")
    assert out.returncode == 0, out.stderr
    # dims DFL's prompt would not give (found from outside: written without a word)
    assert "the model's ae_dims 16, e_dims 4, d_dims 4, d_mask_dims 2 lie outside DFL's own choices" in out.stderr
    written = {f.name: f.read_bytes() for f in (tmp_path / "dfl").iterdir()}
    data = dfl.read_pickle(tmp_path / "dfl" / "me_SAEHD_data.dat")  # DFL's loss graph: an entry an iteration
    assert len(data["loss_history"]) == data["iter"] and all(len(e) == 2 for e in data["loss_history"])
    again = ("export-dfl", str(run), str(tmp_path / "dfl"), "--name", "me", "--face-type", "wf")
    out = cli(*again)  # a model of that name is there: not replaced without a word
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--overwrite to replace it" in out.stderr
    assert cli(*again, "--overwrite").returncode == 0
    assert {f.name: f.read_bytes() for f in (tmp_path / "dfl").iterdir()} == written
    # Found from outside: the replaced model's other weights stayed (DFL loads a GAN.npy whose shapes fit).
    for stale in ("me_SAEHD_GAN.npy", "me_SAEHD_GAN_opt.npy", "me_SAEHD_inter_AB.npy", "me_SAEHD_summary.txt"):
        (tmp_path / "dfl" / stale).write_bytes(b"old")
    assert cli(*again, "--overwrite").returncode == 0
    kept = {f.name: f.read_bytes() for f in (tmp_path / "dfl").iterdir()}
    assert kept == {**written, "me_SAEHD_summary.txt": b"old"}  # (DFL's summary is not a weight: left)
    (tmp_path / "dfl" / "me_SAEHD_summary.txt").unlink()
    out = cli("export-dfl", str(tmp_path / "dfl"), str(tmp_path / "dfl2"))  # (found from outside: a traceback)
    assert out.returncode == 2 and "dfl is a DeepFaceLab model folder already" in out.stderr, out.stderr
    data = dfl.read_pickle(tmp_path / "dfl" / "me_SAEHD_data.dat")
    assert data["options"]["archi"] == "df-u" and data["options"]["eyes_mouth_prio"] is True and data["iter"] == 1
    assert data["options"]["face_type"] == "wf"
    # The model is DFL's: an override of its shape is refused (found from outside: a run no command could load).
    out = cli("convert", str(tmp_path / "dfl"), str(tmp_path / "back"), "model.options.ae_dims=64")
    assert out.returncode == 2 and not (tmp_path / "back").exists()
    assert "error: model.options.ae_dims: the model is the one" in out.stderr and "(df-u, 64 px" in out.stderr
    # Its face type too (found from outside: taken, and its exports told DFL's merger to crop other faces).
    out = cli("convert", str(tmp_path / "dfl"), str(tmp_path / "back"), "swap.face_type=f")
    assert out.returncode == 2 and "trained on faces of DFL's face type 'wf'" in out.stderr
    assert not (tmp_path / "back").exists()
    for name in ("../evil", "a/b", ""):  # (found from outside: written beside the folder, or failed half-way)
        out = cli("export-dfl", str(run), str(tmp_path / "named"), "--name", name, "--face-type", "wf")
        assert out.returncode == 2 and "give the model's name alone" in out.stderr
    assert not (tmp_path / "named").exists() and not list(tmp_path.glob("evil*"))
    out = cli("convert", str(tmp_path / "dfl"), str(tmp_path / "back"))
    assert out.returncode == 0, out.stderr
    # An older DFL model's _data.dat, before d_mask_dims, and without a face type: DFL's defaults filled in (d_dims
    # // 3 made even, "f"), as its load_or_def_option does (found from outside: refused).
    shutil.copytree(tmp_path / "dfl", tmp_path / "old")
    old = dfl.read_pickle(tmp_path / "old" / "me_SAEHD_data.dat")
    old["options"] = {k: v for k, v in old["options"].items() if k not in ("d_mask_dims", "face_type")}
    (tmp_path / "old" / "me_SAEHD_data.dat").write_bytes(dfl.dumps(old))
    assert cli("convert", str(tmp_path / "old"), str(tmp_path / "old_run")).returncode == 0
    converted = bigbatch.Config.load(tmp_path / "old_run" / "config.toml")
    assert converted.model.options["d_mask_dims"] == TINY["d_mask_dims"] == 2 and converted.swap.face_type == "f"
    a, b = load_autoencoder(run), load_autoencoder(tmp_path / "back")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    back = bigbatch.Config.load(tmp_path / "back" / "config.toml")
    assert back.task == "swap" and back.swap.eyes_mouth_prio and back.model.options["ae_dims"] == TINY["ae_dims"]
    # DFL's aligned faces of another face type than the model's are refused (found from outside: swapped framed
    # as the model never saw); faces of its own type, or without DFL's metadata, are swapped.
    from test_dfl_faces import dfl_jpeg

    (tmp_path / "typed").mkdir()
    face = np.asarray(Image.open(tmp_path / "dst" / "img" / "00.png").convert("RGB"))
    for kind in ("whole_face", "full_face"):
        (tmp_path / "typed" / f"{kind}.jpg").write_bytes(dfl_jpeg(face, {"face_type": kind}))
        out = cli("swap", str(tmp_path / "back"), str(tmp_path / "typed"), str(tmp_path / f"swapped_{kind}"))
        assert out.returncode == (0 if kind == "whole_face" else 2), out.stderr
    assert "full_face.jpg is a full_face face and" in out.stderr and "swaps whole_face faces: extract" in out.stderr
    n = swap_folder(tmp_path / "back", tmp_path / "dst" / "img", tmp_path / "swapped")
    assert n == 12 and len(list((tmp_path / "swapped" / "masks").glob("*.png"))) == 12
    assert Image.open(tmp_path / "swapped" / "00.png").size == (72, 72)  # the dst face's own size, as DFL pastes it
    same = cli("swap", str(run), str(tmp_path / "dst" / "img"), str(tmp_path / "dst" / "img"))
    assert same.returncode == 2 and "would replace the faces of" in same.stderr  # (it overwrote them)
    (tmp_path / "twins").mkdir()
    for suffix in (".jpg", ".png"):
        Image.open(tmp_path / "dst" / "img" / "00.png").convert("RGB").save(tmp_path / "twins" / f"00{suffix}")
    twins = cli("swap", str(run), str(tmp_path / "twins"), str(tmp_path / "o"))
    assert twins.returncode == 2 and "00.jpg and 00.png would both be written as" in twins.stderr
    (tmp_path / "wide").mkdir()
    Image.open(tmp_path / "dst" / "img" / "00.png").convert("RGB").resize((80, 60)).save(tmp_path / "wide" / "w.png")
    wide = cli("swap", str(run), str(tmp_path / "wide"), str(tmp_path / "wide_out"))
    assert wide.returncode == 0 and "is 80x60, not square as aligned faces are" in wide.stderr
    assert Image.open(tmp_path / "wide_out" / "w.png").size == (80, 60)
    # An earlier swap's faces left in OUT_DIR are said (found from outside: unsaid); "none" as merge takes it.
    assert swap_folder(run, tmp_path / "wide", tmp_path / "swapped", color_transfer="none") == 1
    assert (
        "swapped holds 24 images this swap does not write (00.png, 01.png, 02.png, ...), of an"
        in capsys.readouterr().err
    )
    # DFL's merger's colour transfer: the swap takes its dst face's colours before the blend
    out = cli("swap", str(run), str(tmp_path / "dst" / "img"), str(tmp_path / "ct"), "--color-transfer", "idt-m")
    assert out.returncode == 0, out.stderr
    plain, recoloured = (np.asarray(Image.open(tmp_path / d / "00.png")) for d in ("swapped", "ct"))
    assert plain.shape == recoloured.shape and (plain != recoloured).any()
    with pytest.raises(
        BigbatchError, match=r"unknown colour transfer 'mix-m'; valid: rct, lct, .* \(DFL's merger's but mix-m"
    ):
        swap_folder(run, tmp_path / "dst" / "img", tmp_path / "o", color_transfer="mix-m")
    for bad in ("0", "-3"):  # not "swapped 12 faces" with none written, nor a traceback
        out = cli("swap", str(run), str(tmp_path / "dst" / "img"), str(tmp_path / "o"), "--batch", bad)
        assert out.returncode == 2 and f"--batch (faces per forward) must be at least 1, got {bad}" in out.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    out = cli("swap", str(run), str(tmp_path / "broken"), str(tmp_path / "o"))
    assert out.returncode == 2 and "holds no readable image" in out.stderr and not (tmp_path / "o").exists()
    # one unreadable face among good ones: skipped and named, as predict and extract do, the rest swapped
    Image.open(tmp_path / "dst" / "img" / "00.png").save(tmp_path / "broken" / "b.png")
    out = cli("swap", str(run), str(tmp_path / "broken"), str(tmp_path / "o"))
    assert out.returncode == 0 and "bigbatch: skipped a.jpg: not a readable image" in out.stderr
    assert "Swapped 1 faces" in out.stdout and sorted(p.name for p in (tmp_path / "o").glob("*.png")) == ["b.png"]
    out = cli("swap", str(tmp_path / "nowhere"), str(tmp_path / "dst" / "img"), str(tmp_path / "o"))
    assert out.returncode == 2 and "or a DeepFaceLab SAEHD model folder" in out.stderr
    (tmp_path / "a_file").write_text("")
    out = cli("export-dfl", str(run), str(tmp_path / "a_file"), "--face-type", "wf")
    assert out.returncode == 2 and "a_file is a file: give a folder for the DeepFaceLab model" in out.stderr
    # The optimizer's moments go to DFL's src_dst_opt file, under DFL's names, and come back with train.init_from.
    opt_file = dfl.read_weights(tmp_path / "dfl" / "me_SAEHD_src_dst_opt.npy")
    assert int(opt_file["iters:0"]) == 1
    assert {"ms_encoder/down1/downs_0/conv1/weight_0:0", "vs_decoder_dst/out_convm/bias_0:0"} <= set(opt_file)
    started = _task(cfg.override({"train.init_from": str(tmp_path / "dfl")}))
    assert all(torch.equal(x, y) for x, y in zip(started.plain().state_dict().values(), a.state_dict().values()))
    saved = torch.load(run / "checkpoints" / "000000.004" / "state.pt", weights_only=True)["opt"]
    mine = started.opt.state_dict()
    assert mine["param_groups"][0]["step"] == 1 and mine["state"].keys() == saved["state"].keys()
    for i, moments in saved["state"].items():
        assert all(torch.equal(moments[k], mine["state"][i][k]) for k in ("m", "v")), i
    info = cli("info", str(run))
    assert info.returncode == 0 and "src " in info.stdout and "adabelief lr" in info.stdout
    # One file to deploy: aligned faces in, the swap and its mask out, as `bigbatch swap` makes them.
    import onnxruntime

    assert cli("export", str(run), str(tmp_path / "s.pt")).returncode == 0
    done = cli("export", str(run), str(tmp_path / "s.onnx"), "--format", "onnx")
    # (an ONNX session is run by its inputs' names: found from outside, the usage said "model(...)")
    assert done.returncode == 0 and "session.run(None, {'faces': ...}) of (aligned faces uint8" in done.stdout
    dst, _ = bigbatch.data.load_data(str(faces[1]), 64).get(torch.arange(3))
    dst = dst[..., :3].contiguous()  # RGB (the data carries the mask and eyes too)
    want = swap_faces(a, dst)
    got = torch.jit.load(str(tmp_path / "s.pt"))(dst)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    got = onnxruntime.InferenceSession(str(tmp_path / "s.onnx")).run(None, {"faces": dst.numpy()})
    assert all(np.abs(x.astype(int) - y.numpy().astype(int)).max() <= 1 for x, y in zip(got, want))
    sheet = preview_sheet(a, torch.zeros(2, 64, 64, 3, dtype=torch.uint8), torch.zeros(2, 64, 64, 3, dtype=torch.uint8))
    assert sheet.size == (7 * 64, 2 * 64)
    bad = cli("swap", str(run), str(tmp_path / "nowhere"), str(tmp_path / "o"))
    assert bad.returncode == 2 and "not a folder of aligned face images" in bad.stderr and "Traceback" not in bad.stderr
    # DFL's model folder often holds several models: one is named by its _data.dat (there was no way to).
    assert cli("export-dfl", str(run), str(tmp_path / "dfl"), "--name", "you", "--face-type", "wf").returncode == 0
    two = cli("convert", str(tmp_path / "dfl"), str(tmp_path / "back2"))
    assert two.returncode == 2 and "several SAEHD models (me, you): name the one to read by its file" in two.stderr
    one = cli("convert", str(tmp_path / "dfl" / "you_SAEHD_data.dat"), str(tmp_path / "back2"))
    assert one.returncode == 0, one.stderr
    b = load_autoencoder(tmp_path / "dfl" / "you_SAEHD_data.dat")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert bigbatch.Config.load(tmp_path / "back2" / "config.toml").swap.face_type == "wf"


@pytest.mark.parametrize(
    "over, words",
    [
        ({"data.dst_path": ""}, "data.dst_path' must name the dst faces"),
        ({"model.options": {"archi": "liae-ud", **TINY}}, "true_face_power' works with df archis only"),
        ({"train.g_lr": 1e-3}, "'train.g_lr' is not read by task = \"swap\""),
        ({"data.xflip": True}, "swap.src_flip and swap.dst_flip"),
        ({"eval.every_kimg": 1.0}, "set data.val_fraction"),
        ({"swap.random_hsv_power": 0.5}, "random_hsv_power' must be in 0.0..0.3"),
        ({"swap.face_style_power": -1.0}, "face_style_power' must be a finite number >= 0"),
        ({"swap.ct_mode": "fancy"}, "swap.ct_mode' must be 'none' | 'rct'"),
        ({"swap.gan_power": 10.0}, "gan_power' must be in 0.0..5.0"),
        ({"swap.true_face_power": 5.0}, "true_face_power' must be in 0.0..1.0"),
        ({"swap.clipgrad": True}, "DFL's clipgrad is train.grad_clip = 1.0 here"),  # (found from outside)
        ({"swap.ae_dims": 128}, "the dims are model.options: archi, ae_dims"),  # (found from outside: "did you
        ({"swap.adabelief": False}, 'swap.optimizer = "adabelief"'),  # mean 'gan_dims'?", or nothing)
        ({"swap.use_fp16": True}, 'train.precision = "fp16"'),
        ({"swap.target_iter": 100_000}, "DFL's target_iter is the run's length: train.kimg"),  # (found from outside:
        ({"swap.autobackup_hour": 1}, "checkpoints come every checkpoint.every_kimg"),  # an unknown key, no pointer)
        ({"swap.face_type": "whole_face"}, "DFL's 'whole_face' is 'wf' here"),  # (found from outside: the list alone)
        ({"swap.lr_dropout": "y"}, "DFL's 'y' is true here"),
    ],
)
def test_config_mistakes_are_named(faces, over, words):
    with pytest.raises(BigbatchError, match=words.replace("(", r"\(").replace(".", r"\.")):
        swap_config(*faces).override(over)


def test_eyes_mouth_priority_needs_the_region(tmp_path):
    cfg = bigbatch.preset("saehd_cpu").override(
        {
            "data.dst_path": "builtin:digits",
            "model.options": {"archi": "df-u", **TINY},
            "swap.eyes_mouth_prio": True,
            "data.val_fraction": 0.0,
            "eval.every_kimg": 0.0,
        }
    )
    with pytest.raises(BigbatchError, match="eyes_mouth_prio' needs the eyes-and-mouth region"):
        _task(cfg)
    with pytest.raises(BigbatchError, match="blur_out_mask' needs face masks in both data sets"):
        _task(cfg.override({"swap.eyes_mouth_prio": False, "swap.blur_out_mask": True}))


@pytest.mark.parametrize("mode", ["rct", "mkl"])
def test_src_faces_take_their_rows_dst_colours_and_only_the_input_is_hsv_shifted(faces, monkeypatch, mode):
    cfg = swap_config(*faces, **{"swap.ct_mode": mode, "swap.random_hsv_power": 0.3, "swap.random_warp": False})
    task = _task(cfg.override({"swap.gan_power": 0.0, "swap.true_face_power": 0.0}))
    seen = []
    targets = SwapTask.targets

    def watched(self, x, *args):
        seen.append((x, targets(self, x, *args)))
        return seen[-1][1]

    monkeypatch.setattr(SwapTask, "targets", watched)
    src, _ = task.src.get(torch.arange(4))
    dst, _ = task.dst.get(torch.arange(4) + 4)
    tint = lambda x, rgb: torch.cat([(x[..., :3] * torch.tensor(rgb)).to(torch.uint8), x[..., 3:]], -1)  # noqa: E731
    src = torch.cat([tint(src[i : i + 1], [1.0, 0.5 - 0.1 * i, 0.2]) for i in range(4)])  # reddish, each its own
    dst = torch.cat([tint(dst[i : i + 1], [0.2, 0.3 + 0.1 * i, 0.9]) for i in range(4)])  # bluish, each its own
    from bigbatch.tasks.swap.task import _draws

    draws = _draws(4, 0, cfg.swap, 0)
    torch.manual_seed(0)
    task.loss((src, dst, *draws))
    (recoloured, (src_in, src_t, _, _)), _ = seen
    before, style = src.permute(0, 3, 1, 2)[:, :3].float() / 255, dst.permute(0, 3, 1, 2)[:, :3].float() / 255
    gap = lambda x: (x.mean(dim=(2, 3)) - style.mean(dim=(2, 3))).abs().sum(1)  # noqa: E731
    assert (gap(recoloured[:, :3]) < gap(before) / 2).all()  # each face toward its own row's dst face
    assert torch.equal(recoloured[:, 3:], src.permute(0, 3, 1, 2)[:, 3:].float() / 255)  # masks untouched
    # The target is the recoloured face (moved by the draws' affine); the input, that face shifted in HSV.
    _, same = warp.apply(recoloured, *draws[:4], warp=False)
    assert torch.equal(src_t, same[:, :3]) and (src_in - src_t).abs().amax(dim=(1, 2, 3)).min() > 0.02


@pytest.mark.parametrize("archi", ["df-u", "liae-u"])
def test_the_style_losses_train_the_swap_as_dfl(faces, archi):
    """face_style_power: the swap's decoder learns, the code is left alone; bg_style_power: both learn.
    Each adds its term to src_loss, computed on the swap decoded from the dst code."""
    base = swap_config(*faces, **{"model.options": {"archi": archi, **TINY}, "swap.true_face_power": 0.0})
    base = base.override({"swap.gan_power": 0.0, "swap.lr_dropout": False})
    task = _task(base)
    net = task.plain()
    src, _ = task.src.get(torch.arange(2))
    dst, _ = task.dst.get(torch.arange(2))
    from bigbatch.tasks.swap.task import _draws

    micro = (src, dst, *_draws(2, 0, base.swap, 0))

    def grads(cfg):
        task.cfg = cfg
        net.zero_grad(set_to_none=True)
        out = task.loss(micro)
        out["loss"].backward()
        return out["src_loss"], {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}

    plain, before = grads(base)
    decoder = "decoder_src" if archi.startswith("df") else "decoder"
    for key, code_learns in (("face_style_power", False), ("bg_style_power", True)):
        src_loss, after = grads(base.override({f"swap.{key}": 10.0}))
        assert src_loss > plain, key
        moved = {n for n in after if not torch.allclose(after[n], before[n], rtol=0, atol=1e-9)}
        assert any(n.startswith(decoder) for n in moved), key
        assert any(n.startswith("encoder") for n in moved) == code_learns, key


def dfl_folder(folder, face_type="f", iteration=1200, seed=0):
    """A SAEHD model folder as DeepFaceLab writes one: its weights, its AdaBelief moments (iters 1200), and
    _data.dat with DFL's options in its order (bigbatch's and those bigbatch does not use), its loss
    history and its preview faces (arrays), pickled as ModelBase.save does."""
    torch.manual_seed(seed)
    model = SAEHD(64, "df-u", **TINY)
    dfl.save_model_folder(model, folder, "dfl")
    g = torch.Generator().manual_seed(seed)
    moments = {
        p: {"m": torch.randn(p.shape, generator=g), "v": torch.rand(p.shape, generator=g)} for p in model.parameters()
    }
    dfl.write_weights(
        folder / "dfl_SAEHD_src_dst_opt.npy", dfl.export_optimizer(model, moments, iteration, "adabelief")
    )
    options = {
        "autobackup_hour": 1, "write_preview_history": False, "target_iter": 250000, "random_src_flip": False,
        "random_dst_flip": True, "batch_size": 4, "resolution": 64, "face_type": face_type, "models_opt_on_gpu": True,
        "archi": "df-u", **{k: v for k, v in TINY.items()}, "masked_training": True, "eyes_mouth_prio": True,
        "uniform_yaw": False, "blur_out_mask": False, "adabelief": True, "lr_dropout": "cpu", "random_warp": True,
        "random_hsv_power": np.float64(0.0), "true_face_power": 0.1, "face_style_power": 0.0, "bg_style_power": 0.0,
        "ct_mode": "none", "clipgrad": False, "pretrain": False, "use_fp16": False, "gan_power": 0.1,
        "gan_patch_size": 8, "gan_dims": 16,
    }  # fmt: skip
    preview = [[np.random.default_rng(seed).random((4, 64, 64, 3), dtype=np.float32)] * 2]
    data = {"iter": iteration, "options": options, "loss_history": [[0.5 - i / 1e4, 0.6] for i in range(iteration)],
            "sample_for_preview": preview, "choosed_gpu_indexes": None}  # fmt: skip
    (folder / "dfl_SAEHD_data.dat").write_bytes(pickle.dumps(data))
    return model


def test_dfl_round_trips_keep_the_face_type_the_options_and_the_optimizer(faces, tmp_path, monkeypatch, capsys):
    """Found by running DFL's own code on bigbatch's files: a face type "f" came back "wf", options and the
    optimizer were lost through convert, and a 0-step export was re-initialised by DFL (iteration 0)."""

    def cli(*args):  # the command line, in this process
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    src = tmp_path / "from_dfl"
    dfl_folder(src, face_type="f")
    paths = [f"data.path={faces[0]}", f"data.dst_path={faces[1]}", "data.val_fraction=0.0", "eval.every_kimg=0.0"]
    out = cli("convert", str(src), str(tmp_path / "run"), *paths, "checkpoint.every_kimg=0.004")
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    assert bigbatch.Config.load(run / "config.toml").swap.face_type == "f"
    # convert, then export-dfl: every file DFL wrote, byte for byte (options bigbatch does not use, the
    # loss history and preview faces, the optimizer's moments and step count).
    out = cli("export-dfl", str(run), str(tmp_path / "back"), "--name", "dfl")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == sorted(p.name for p in src.iterdir())
    for f in src.iterdir():
        assert (tmp_path / "back" / f.name).read_bytes() == f.read_bytes(), f.name
    dfl_folder(pretrained := tmp_path / "pretrained")  # (found from outside: DFL's pretrain option dropped silently)
    data = dfl.read_pickle(dat := pretrained / "dfl_SAEHD_data.dat")
    dat.write_bytes(pickle.dumps({**data, "options": {**data["options"], "pretrain": 1}}))
    assert "was pretrained (DFL's pretrain option): DFL" in cli("convert", str(pretrained), str(tmp_path / "p")).stderr
    # Untrained here, it goes back as DFL wrote it (found from outside: pretrain turned off, so that DFL skipped
    # what it does as pretraining ends).
    assert cli("export-dfl", str(tmp_path / "p"), str(tmp_path / "p_back"), "--name", "dfl").returncode == 0
    assert (tmp_path / "p_back" / dat.name).read_bytes() == dat.read_bytes()
    one = cli("convert", str(pretrained / "dfl_SAEHD_encoder.npy"), str(tmp_path / "q")).stderr  # (read as a GAN's)
    assert "is one file of a DeepFaceLab model: give its folder" in one
    # A DFL folder where a run is read: what bigbatch takes of DFL's, and how (found from outside: "neither a run
    # directory nor a checkpoint folder", of a SAEHD model exported to ONNX and of an AMP model swapped).
    (amp := tmp_path / "amp").mkdir()
    (amp / "me_AMP_data.dat").write_bytes(b"")
    (tmp_path / "in").mkdir()
    Image.new("RGB", (64, 64)).save(tmp_path / "in" / "face.png")
    exported = ("export", str(pretrained), str(tmp_path / "d.onnx"))
    for args, kind in ((exported, "SAEHD"), (("swap", str(amp), str(tmp_path / "in"), str(tmp_path / "o")), "AMP")):
        said = cli(*args)
        assert said.returncode == 2 and f"holds a DeepFaceLab {kind} model (" in said.stderr, said.stderr
        said_how = f"`bigbatch convert {args[1]} RUN` makes it a run" if kind == "SAEHD" else "bigbatch reads SAEHD's"
        assert said_how in said.stderr
    gone = cli("convert", str(tmp_path / "nowhere" / "new_SAEHD_data.dat"), str(tmp_path / "r")).stderr
    assert "new_SAEHD_data.dat does not exist: give a DeepFaceLab model folder" in gone  # (found from outside)
    out = cli("export-dfl", str(run), str(tmp_path / "o"), "--face-type", "wf")
    assert out.returncode == 2 and "face type 'f', not 'wf'" in out.stderr and not (tmp_path / "o").exists()

    # Training continued from the converted run goes on with DFL's AdaBelief moments and step count: the
    # same step as train.init_from the DFL folder itself (which reads DFL's own optimizer file).
    # So does train.init_from the converted run.
    cfg = bigbatch.Config.load(run / "config.toml").override({"train.kimg": 0.004, "sample.every_kimg": 0.004})
    fresh = bigbatch.train(cfg.override({"train.init_from": str(src)}), run_dir=tmp_path / "fresh", quiet=True)
    again = bigbatch.train(cfg.override({"train.init_from": str(run)}), run_dir=tmp_path / "again", quiet=True)
    resumed = bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)
    with pytest.raises(BigbatchError, match="trained on faces of DFL's face type 'f', and these are 'wf'"):
        bigbatch.train(cfg.override({"train.init_from": str(src), "swap.face_type": "wf"}), run_dir=tmp_path / "wf")
    a, b, c = (load_file(r / "checkpoints" / "000000.004" / "model.safetensors") for r in (resumed, fresh, again))
    assert a.keys() == b.keys() == c.keys() and all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    assert torch.load(again / "checkpoints" / "000000.004" / "state.pt", weights_only=True)["dfl_iter"] == 1200
    moved = dfl_folder(tmp_path / "unused")  # (the weights did move: a step was taken)
    assert not torch.equal(
        a["encoder.down1.downs.0.conv1.weight"], moved.state_dict()["encoder.down1.downs.0.conv1.weight"]
    )
    state = torch.load(resumed / "checkpoints" / "000000.004" / "state.pt", weights_only=True)
    assert state["opt"]["param_groups"][0]["step"] == 1201 and state["dfl_iter"] == 1200
    assert {"opt_code_discriminator", "opt_gan"} <= set(state)  # DFL's discriminators on: they trained too
    assert dfl_record(resumed)[1] == 1201  # what a run started from it carries: DFL's iterations and its own
    # ... and exports as iteration 1201, with DFL's options it does not use, and DFL's history, still there.
    assert cli("export-dfl", str(resumed), str(tmp_path / "on")).returncode == 0
    data = dfl.read_pickle(tmp_path / "on" / "new_SAEHD_data.dat")
    assert data["iter"] == 1201 and data["options"]["target_iter"] == 250000 and data["options"]["lr_dropout"] == "cpu"
    assert data["options"]["face_type"] == "f" and len(data["loss_history"]) == 1201
    # DFL's history, then this run's iteration: its log row's losses (found from outside: written empty).
    row = [r for r in map(json.loads, (resumed / "metrics.jsonl").read_text().splitlines()) if "src_loss" in r][-1]
    assert data["loss_history"][:1200] == [[0.5 - i / 1e4, 0.6] for i in range(1200)]
    assert data["loss_history"][1200] == [row["src_loss"], row["dst_loss"]]

    # A run of no step loads in DFL as the model it is: DFL re-initialises a model whose _data.dat says
    # iteration 0, so it is written as iteration 1. Read back as DFL reads it (the restricted reader).
    import bigbatch.loop as training

    build = training.build_task

    def build_then_stop(*args, **kwargs):
        task = build(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # saves a checkpoint before the first step
        return task

    over = {"swap.true_face_power": 0.0, "swap.gan_power": 0.0, "swap.face_type": "h"}
    with monkeypatch.context() as patched:  # (not monkeypatch.undo(): that would leave tmp_path too)
        patched.setattr(training, "build_task", build_then_stop)
        with pytest.raises(bigbatch.Stopped):
            bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "z", quiet=True)
    zero = tmp_path / "z"
    assert torch.load(zero / "checkpoints" / "000000.000" / "state.pt", weights_only=True)["steps"] == 0
    assert cli("export-dfl", str(zero), str(tmp_path / "z_dfl")).returncode == 0
    model, data = dfl.load_model_folder(tmp_path / "z_dfl")
    assert data["iter"] == 1 and data["options"]["face_type"] == "h"
    trained = load_autoencoder(zero)
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), trained.state_dict().values()))


def test_export_dfl_says_which_settings_dfl_does_not_take(capsys):
    # Found from outside: a learning rate of 2e-4 went to DFL without a word, where DFL trains at its fixed 5e-5.
    from bigbatch.tasks.swap.files import dfl_options

    capsys.readouterr()
    options = dfl_options(bigbatch.preset("saehd128").override({"swap.lr": 2e-4, "train.grad_clip": 0.5}), "f")
    err = capsys.readouterr().err
    assert "swap.lr 0.0002 stays here: DFL has no such option, and trains this model on at its fixed 5e-05" in err
    assert "train.grad_clip 0.5 goes to DFL as its clipgrad" in err and options["clipgrad"] is True
    dfl_options(bigbatch.preset("saehd128"), "f")
    assert "swap.lr" not in capsys.readouterr().err
