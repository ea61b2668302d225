"""The task interface: the loop trains any registered task (checkpoints, resume, previews, logs) without
knowing what it is; the config names the task, configs without one are GANs; building a task is
decided by train.seed alone and leaves the caller's global RNG as it was."""

import json

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.cli import main
from bigbatch.config import Config
from bigbatch.data import load_data
from bigbatch.tasks import build_task, list_tasks, register


class ToyAutoencoder:
    """The smallest task there is: a linear autoencoder on the real images, one Adam step an iteration."""

    scorer = None
    usage = "Reconstructions are in {run}/samples"

    def __init__(self, rep, data):
        size = data.resolution * data.resolution * data.channels
        self.rep, self.data, self.steps = rep, data, 0
        self.ae = nn.Sequential(nn.Flatten(), nn.Linear(size, 8), nn.Linear(8, size))
        self.ae_train = rep.prepare(self.ae)
        self.opt = rep.wrap_optimizer(torch.optim.Adam(self.ae.parameters(), lr=1e-2), "ae")

    def loss(self, images):
        x = images.float() / 255
        return F.mse_loss(self.ae_train(x), x.flatten(1))

    def step(self, feed):
        real = feed.next()
        loss = self.rep.step(self.loss, real.images, self.opt)
        self.steps += 1
        return {"loss": loss}

    def probe(self, m):
        self.rep.probe_step(self.loss, self.data.images[:m])

    def nets(self):
        return {"ae": self.ae}

    def state_dict(self):
        return {"opt": self.opt.state_dict(), "steps": self.steps}

    def load_state_dict(self, state):
        self.opt.load_state_dict(state["opt"])
        self.steps = state["steps"]

    def model_info(self):
        return {"n_classes": 0, "img_channels": self.data.channels}

    def previews(self, at_checkpoint):
        return {} if at_checkpoint else {"recon": Image.new("L", (8, 8))}

    def batch_sheet(self, nimg):
        return Image.new("L", (8, 8))


if "toy" not in list_tasks():

    @register("toy")
    def _build_toy(cfg, rep, data, *, run, resumed_at, quiet):
        return ToyAutoencoder(rep, data)


@pytest.fixture
def toy(tiny):
    return tiny.override({"task": "toy", "train.kimg": 0.256, "checkpoint.every_kimg": 0.128})


def test_the_loop_trains_any_registered_task(toy, tmp_path):
    run = bigbatch.train(toy, run_dir=tmp_path / "whole", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in rows] == [0.128, 0.256] and [r["step"] for r in rows] == [4, 8]
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["skipped_ae"] == 0
    ckpt = run / "checkpoints" / "000000.256"
    assert sorted(p.name for p in ckpt.glob("*.safetensors")) == ["ae.safetensors"]
    assert (run / "samples" / "recon-000000.256.png").exists()
    # Stopped half-way and resumed: the same weights as the run left alone.
    half = bigbatch.train(toy.override({"train.kimg": 0.128}), run_dir=tmp_path / "half", quiet=True)
    bigbatch.train(toy, run_dir=half, resume=True, quiet=True)
    again = half / "checkpoints" / "000000.256" / "ae.safetensors"
    assert again.read_bytes() == (ckpt / "ae.safetensors").read_bytes()


def test_the_config_names_the_task(capsys, tmp_path):
    saved = bigbatch.preset("digits").to_dict()
    del saved["task"]  # a config.toml written before there were tasks
    assert Config.from_dict(saved).task == "gan"
    assert main(["train", "task=segmenter", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'task' names no registered task 'segmenter'; valid:" in err and "gan" in err


def test_building_a_task_is_decided_by_the_seed_and_leaves_the_global_rng(tiny):
    data = load_data("builtin:digits", 16)
    weights = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        rng = torch.get_rng_state()
        task = build_task(tiny, replicator_for(tiny), data)
        assert torch.equal(torch.get_rng_state(), rng)
        weights.append(torch.cat([p.detach().flatten() for p in task.nets()["G"].parameters()]))
    assert torch.equal(*weights)
