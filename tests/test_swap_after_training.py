"""After training a swap run: `bigbatch eval` scores held-out or given faces as SSIM, `bigbatch lr-find`
sweeps swap.lr on DFL's src + dst loss, and a resume switches the options DFL users switch."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from test_swap import TINY, swap_config

import bigbatch
import bigbatch.checkpoint_find
from bigbatch.cli import main
from bigbatch.models import dfl
from bigbatch.tasks.swap.load import load_autoencoder, optimizer_parameters


def test_lr_find_sweeps_swap_lr_on_the_src_and_dst_loss(tmp_path, capsys):
    from bigbatch.cli import main

    options = 'model.options={archi="df-u",ae_dims=16,e_dims=4,d_dims=4,d_mask_dims=2}'
    argv = ["lr-find", "--preset", "saehd_cpu", options, "train.batch=4", "--steps", "8", "--start-lr", "1e-6"]
    assert main([*argv, "--end-lr", "1e-2", "--out", str(tmp_path / "lr.png")]) == 0
    out = capsys.readouterr().out
    assert "8 steps at batch 4, rates 1.0e-06..1.0e-02" in out and "suggested swap.lr: valley" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lr.json", "lr.png"]  # the curve, its numbers: no run


def test_eval_scores_the_held_out_faces_as_training_did_and_other_faces_on_request(
    faces, tmp_path, capsys, monkeypatch
):
    from bigbatch.cli import main

    over = {"data.val_fraction": 0.25, "eval.every_kimg": 0.008, "swap.true_face_power": 0.0, "swap.gan_power": 0.0}
    over["eval.batch_size"] = 4
    run = bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "run", quiet=True)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if "ssim" in r][-1]
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "held-out faces at 64 px" in out and "src SSIM" in out and "(3 faces)" in out
    (held,) = (run / "eval").glob("heldout-*")  # (the latest checkpoint's name)
    metrics = json.loads((held / "metrics.json").read_text())
    assert metrics["src_ssim"] == pytest.approx(last["src_ssim"], abs=1e-6)
    assert metrics["dst_ssim"] == pytest.approx(last["dst_ssim"], abs=1e-6)
    assert Image.open(held / "preview.png").size == (7 * 64, 3 * 64)
    # Other faces: each side through its own path; one side alone is scored alone.
    monkeypatch.setattr("bigbatch.images_done.LINE_EVERY_S", 0.0)  # off a terminal: a progress line a batch
    assert main(["eval", str(run), str(faces[0]), "--dst", str(faces[1]), "--checkpoint", "best"]) == 0
    err = capsys.readouterr().err
    assert "eval: src faces: 4/12 images" in err and "eval: dst faces: 8/12 images" in err
    (both_dir,) = (run / "eval").glob("src+dst-best-0*")
    both = json.loads((both_dir / "metrics.json").read_text())
    assert both["src_n"] == both["dst_n"] == 12 and 0 < both["src_ssim"] <= 1
    assert main(["eval", str(run), "--dst", str(faces[1]), "--checkpoint", "best"]) == 0
    (alone_dir,) = (run / "eval").glob("dst-best-0*")
    alone = json.loads((alone_dir / "metrics.json").read_text())
    assert "src_ssim" not in alone and alone["ssim"] == alone["dst_ssim"] == pytest.approx(both["dst_ssim"], abs=1e-6)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "src.h5"), "--dst", str(faces[1])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dst names the dst faces of a swap run" in err
    # Faces of another size than the model's are refused, as training refuses them, not scored.
    from bigbatch.data.prepare import prepare

    prepare(str(tmp_path / "src" / "img"), str(tmp_path / "small.h5"), 32, workers=0, masks="alpha")
    assert main(["eval", str(run), str(tmp_path / "small.h5")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "are 32 px, the model data.resolution = 64: prepare them with --resolution 64" in err
    )


def test_a_resume_switches_the_options_dfl_users_switch_between_sessions(faces, tmp_path, capsys):
    # Found from outside: DFL asks its options again at each restart (random warp off late, then lr dropout);
    # a resume refused every swap key, and init_from started the discriminators anew.
    # A liae model (the presets'), whose inter_AB leaves the trained weights without random warp (found by
    # review: its moments no longer fit, read as a damaged checkpoint; the new rates stood unapplied).
    liae = {"model.options": {"archi": "liae-u", **TINY}, "swap.true_face_power": 0.0}
    over = {"train.kimg": 0.008, "swap.gan_power": 0.0, "swap.lr_dropout": False, **liae}
    run = bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "run", quiet=True)
    later = {**over, "train.kimg": 0.016, "swap.random_warp": False, "swap.lr_dropout": True, "swap.lr": 1e-5}
    capsys.readouterr()
    bigbatch.train(swap_config(*faces, **later, **{"swap.ct_mode": "rct"}), run_dir=run, resume=True, quiet=True)
    said = capsys.readouterr().err
    assert "swap.lr_dropout False -> True" in said and "swap.random_warp True -> False" in said
    state = torch.load(run / "checkpoints" / "000000.016" / "state.pt", weights_only=True)
    (group,) = state["opt"]["param_groups"]
    assert (group["lr"], group["lr_dropout"], group["lr_cos"]) == (1e-5, 0.3, 500)
    # inter_AB, untrained without random warp, keeps its moments, as DFL's optimizer does (found from outside: they
    # were dropped, then zeros went to DFL's file and a resume with random warp on started them from zero).
    names = [name for name, _ in load_autoencoder(run).named_parameters()]
    before = torch.load(run / "checkpoints" / "000000.008" / "state.pt", weights_only=True)["opt"]["state"]
    inter_ab = [i for i, name in enumerate(names) if name.startswith("inter_AB.")]
    assert inter_ab and all(torch.equal(before[i]["m"], state["opt"]["state"][i]["m"]) for i in inter_ab)
    assert not torch.equal(before[0]["m"], state["opt"]["state"][0]["m"])  # (the encoder trained on)
    assert main(["export-dfl", str(run), str(tmp_path / "dfl"), "--face-type", "wf"]) == 0
    moments = dfl.read_weights(tmp_path / "dfl" / "new_SAEHD_src_dst_opt.npy")
    assert any(k.startswith("ms_inter_AB/") and np.abs(v).max() > 0 for k, v in moments.items())
    # A checkpoint saved before this, without random warp, held the weights without inter_AB: read in that order.
    model = load_autoencoder(run)
    without = [p for name, p in model.named_parameters() if not name.startswith("inter_AB.")]
    assert optimizer_parameters(model, len(without)) == without
    with pytest.raises(bigbatch.BigbatchError, match="the saved optimizer holds 3 weights, and this model has"):
        optimizer_parameters(model, 3)
    with pytest.raises(bigbatch.BigbatchError, match=r"in swap.gan_power \(0.0 -> 0.1\)"):
        bigbatch.train(swap_config(*faces, **{**later, "swap.gan_power": 0.1}), run_dir=run, resume=True)


def test_init_from_a_swap_run_carries_its_discriminators_on(faces, tmp_path, capsys):
    # Found from outside: train.init_from a swap run trained with gan_power started the discriminators anew
    # (DFL keeps its GAN.npy across restarts), so loss_gan went back to a fresh discriminator's.
    from safetensors.torch import load_file

    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    run = bigbatch.train(swap_config(*faces, **{"train.kimg": 0.008}), run_dir=tmp_path / "run", quiet=True)
    cfg = swap_config(*faces, **{"train.init_from": str(run), "swap.random_warp": False})
    with replicator_for(cfg) as rep:
        nets = build_task(cfg, rep, training_data(cfg), quiet=False).nets()
    assert "its code_discriminator, gan carried on" in capsys.readouterr().out
    for name in ("gan", "code_discriminator"):
        saved = load_file(run / "checkpoints" / "000000.008" / f"{name}.safetensors")
        assert all(torch.equal(v, saved[k]) for k, v in nets[name].state_dict().items()), name


def test_a_dry_run_refuses_faces_of_another_size_as_the_run_does(faces, tmp_path, capsys):
    # Found by review: the dry run passed src and dst faces the run refused for their size.
    from bigbatch.cli import main

    cfg = swap_config(*faces)
    (tmp_path / "c.toml").write_text(cfg.override({"data.resolution": 2 * cfg.data.resolution}).dumps())
    assert main(["train", "--config", str(tmp_path / "c.toml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"the src faces {faces[0]} are {cfg.data.resolution} px, the model data.resolution = " in err


def test_a_resume_changes_a_discriminators_power_but_not_whether_there_is_one(faces, tmp_path, capsys):
    # Found from outside: DFL asks gan_power and true_face_power again at each restart (users lower them late), and
    # a resume refused any change of them; adding or removing a discriminator still needs a new run.
    over = {"train.kimg": 0.008, "swap.lr_dropout": False}
    run = bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "run")
    # (the console shows DFL's per-sample src and dst losses: found from outside, only the batch's sum, "loss")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kimg ")]
    assert lines and all(re.search(r"  dst_loss \d+\.\d{3}  .*  src_loss \d+\.\d{3}  ", line) for line in lines)
    later = {**over, "train.kimg": 0.016, "swap.gan_power": 0.05, "swap.true_face_power": 0.2}
    capsys.readouterr()
    bigbatch.train(swap_config(*faces, **later), run_dir=run, resume=True, quiet=True)
    said = capsys.readouterr().err
    assert "swap.gan_power 0.1 -> 0.05" in said and "swap.true_face_power 0.1 -> 0.2" in said
    assert (run / "checkpoints" / "000000.016" / "gan.safetensors").exists()
    off = {**later, "train.kimg": 0.024, "swap.gan_power": 0.0}
    with pytest.raises(bigbatch.BigbatchError, match=r"in swap.gan_power \(0.05 -> 0.0\).*from one value above 0 to"):
        bigbatch.train(swap_config(*faces, **off), run_dir=run, resume=True)


def test_the_discriminators_judge_the_autoencoder_as_its_step_left_it(faces, tmp_path, monkeypatch):
    # Found from outside: DFL runs each discriminator's step as a session of its own, which computes the codes
    # and reconstructions again after the autoencoder's update; they were taken from the forward before it.
    from bigbatch.tasks.swap.task import SwapTask

    steps, judged = [], {"code_d_loss": [], "gan_d_loss": []}
    for method, original in ((m, getattr(SwapTask, m)) for m in judged):
        monkeypatch.setattr(SwapTask, method, lambda self, m, o=original, k=method: judged[k].append(m) or o(self, m))
    original_step = SwapTask.step

    def step(self, feed):  # each step's inputs, as the autoencoder's forward takes them
        loss, inputs = SwapTask.loss.__get__(self), []
        self.loss = lambda micro: inputs.append(self.sides(micro, self.rep.device)) or loss(micro)
        steps.append(inputs)
        return original_step(self, feed)

    monkeypatch.setattr(SwapTask, "step", step)
    over = {"train.kimg": 0.004, "checkpoint.every_kimg": 0.004, "swap.lr_dropout": False}
    run = bigbatch.train(swap_config(*faces, **over, **{"swap.masked_training": False}), run_dir=tmp_path / "run")
    (inputs,) = steps  # one step of 2 micro-batches
    src_in, dst_in = (torch.cat([side[k][0] for side in inputs]) for k in (0, 1))
    with torch.no_grad():
        pred_src, _, _, _, src_code, dst_code = load_autoencoder(run)(src_in, dst_in)  # the weights after the step
    codes = [torch.cat(t) for t in zip(*judged["code_d_loss"])]
    assert torch.allclose(codes[0], src_code, atol=1e-6) and torch.allclose(codes[1], dst_code, atol=1e-6)
    assert torch.allclose(torch.cat([m[0] for m in judged["gan_d_loss"]]), pred_src, atol=1e-6)


def test_a_stop_during_the_held_out_score_saves_at_once(faces, tmp_path, capsys, monkeypatch):
    # Found from outside: SIGTERM in a swap run's evaluation waited for its end (69 s of 3,090 faces), past a
    # scheduler's grace period; the stop now ends it between batches, and the resumed run scores again.
    import os
    import signal

    from bigbatch.tasks.swap import scorer

    over = {"data.val_fraction": 0.25, "eval.every_kimg": 0.008, "swap.true_face_power": 0.0, "swap.gan_power": 0.0}
    over["eval.batch_size"] = 1
    batches = []
    score = scorer.ssim

    def signalled(*args, **kwargs):
        batches.append(1)
        if len(batches) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return score(*args, **kwargs)

    monkeypatch.setattr(scorer, "ssim", signalled)
    with pytest.raises(bigbatch.Stopped):
        bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "run", quiet=True)
    assert len(batches) == 1  # (of 6: 3 held-out faces a side, one a batch)
    assert bigbatch.checkpoint_find.find_checkpoint(tmp_path / "run").name == "000000.008"
    monkeypatch.setattr(scorer, "ssim", score)
    bigbatch.train(swap_config(*faces, **over), run_dir=tmp_path / "run", resume=True, quiet=True)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows if "ssim" in r] == [0.008, 0.016]
