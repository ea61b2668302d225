"""Data that stops reading under a training run (a network store gone, a file cut short): the run saves where it
is, says so in one line, and once the data reads again resumes to the weights of a run left alone."""

import json

import pytest

import bigbatch
from bigbatch.checkpoint_find import find_checkpoint
from bigbatch.data.prepare import prepare
from bigbatch.tasks.gan.task import GANTask


def test_a_run_whose_data_stops_reading_saves_where_it_is_and_resumes_to_the_same_weights(tiny, tmp_path):
    data = tmp_path / "d.h5"
    prepare("builtin:digits", str(data), resolution=16, workers=0, limit=512)
    cfg = tiny.override({"data.path": str(data), "train.kimg": 0.384})
    alone = bigbatch.train(cfg, run_dir=tmp_path / "alone", quiet=True)
    for workers in (0, 1):  # (the loader's workers change no weight: one run left alone for both)
        cut_short(data, cfg.override({"data.workers": workers}), tmp_path / f"cut{workers}", alone)


def cut_short(data, cfg, run, alone):
    """`cfg` trained into `run`, its data file cut short after 128 images and then put back: the weights `alone`'s."""
    whole = data.read_bytes()
    workers = cfg.data.workers
    step = GANTask.step

    def step_then_cut(self, feed):  # the file cut short after the step that reaches 128 images
        out = step(self, feed)
        if feed.nimg == 128:
            with open(data, "r+b") as f:
                f.truncate(len(whole) // 2)
        return out

    with pytest.MonkeyPatch.context() as patch, pytest.raises(bigbatch.BigbatchError) as e:
        patch.setattr(GANTask, "step", step_then_cut)
        bigbatch.train(cfg, run_dir=run, quiet=True)
    said = str(e.value)
    saved = find_checkpoint(run)
    # (with a worker, the batches it read ahead before the cut are trained on: the save comes at a later step)
    assert saved.name in ("000000.128", "000000.160", "000000.192", "000000.224", "000000.256"), saved
    assert workers or saved.name == "000000.128"
    assert said == (
        f"data file {data} is shorter than its index says: it is truncated; saved {saved}. Once it reads again, "
        f"continue with: bigbatch train --run-dir {run} --resume"
    )
    assert json.loads((saved / "meta.json").read_text())["stopped"] is True

    data.write_bytes(whole)  # the data back
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)
    ours, theirs = find_checkpoint(run), find_checkpoint(alone)
    assert ours.name == theirs.name == "000000.384"
    for name in ("G", "D", "G_ema"):
        assert (ours / f"{name}.safetensors").read_bytes() == (theirs / f"{name}.safetensors").read_bytes(), name
