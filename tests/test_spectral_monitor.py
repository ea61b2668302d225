"""A GAN of spectrally normalized layers logs each layer's sigma (BigGAN-PyTorch's SV log, StudioGAN's SN_of_dis): the
largest of G's and D's in metrics.jsonl, each layer's in TensorBoard, the sigma the layers divide by."""

import json

import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bigbatch.cli import main


def test_the_largest_sigma_of_g_and_d_is_logged_and_each_layers_in_tensorboard(tmp_path):
    run = tmp_path / "run"
    args = ["--preset", "digits", "data.resolution=16", "model.ch=4", "model.dim_z=16", "model.options={g_sn=true}"]
    args += ["train.batch=8", "train.kimg=0.016", "train.log_every_kimg=0.008"]
    args += ["checkpoint.every_kimg=0.016", "sample.every_kimg=0", "eval.every_kimg=0", "--run-dir", str(run)]
    assert main(["train", *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["sv_max_D"] != rows[1]["sv_max_D"]  # (the sigmas the training moved)
    sigmas = {}
    for net in ("G", "D"):
        weights = load_file(run / "checkpoints" / "000000.016" / f"{net}.safetensors")
        for key in weights:
            if key.endswith(".sn_u"):
                layer = key.removesuffix(".sn_u")
                w = weights[f"{layer}.weight"].flatten(1)
                sigmas[f"sv/{net}/{layer}"] = (weights[key] @ w @ weights[f"{layer}.sn_v"].t()).item()
    for net in ("G", "D"):
        largest = max(v for k, v in sigmas.items() if k.startswith(f"sv/{net}/"))
        assert abs(rows[-1][f"sv_max_{net}"] - largest) <= 1e-6 * largest, net
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    logged = {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"] if tag.startswith("sv/")}
    assert logged.keys() == sigmas.keys() and len(logged) >= 6
    assert all(abs(logged[k] - sigmas[k]) <= 1e-6 * abs(sigmas[k]) for k in sigmas)
    assert torch.isfinite(torch.tensor(list(logged.values()))).all()
    # A resume keeps them at its checkpoint, each once (found from outside: each resume dropped them there).
    assert main(["train", *args, "--resume"]) == 0  # (nothing to train: its events at 0.016 kimg logged again)
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for tag in sigmas:
        assert [e.step for e in events.Scalars(tag)] == [8, 16], tag
        assert abs(events.Scalars(tag)[-1].value - logged[tag]) <= 1e-6 * abs(logged[tag])
