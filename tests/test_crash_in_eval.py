"""A run that crashes (a SIGKILL, the machine gone) in an evaluation loses no training: the checkpoint due with it is
written first, its evaluation pending, and again once it is made; resumed, the run makes the evaluation and ends as
one left alone (found from outside: killed in evaluations, a run resumed from the checkpoint before, each time, and
under kills closer than that never got past it)."""

import json

import pytest
from safetensors.torch import load_file
from test_classify import tiny

import bigbatch
from bigbatch import checkpoint_find
from bigbatch.tasks.classify.task import ClassifyScorer


class Crashed(Exception):
    """Stands for the process dying: nothing after it runs."""


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    return bigbatch.train(tiny(), run_dir=tmp_path_factory.mktemp("alone") / "r", quiet=True)


def rows(run):
    """metrics.jsonl's rows without the times, which differ between two runs."""
    drop = ("seconds", "img_per_s", "eval_seconds")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]


@pytest.mark.parametrize("every_minutes", [0.0, 60.0])
def test_a_crash_in_an_evaluation_resumes_from_the_checkpoint_at_it(alone, tmp_path, monkeypatch, every_minutes):
    cfg = tiny(**{"checkpoint.every_minutes": every_minutes})
    if every_minutes:  # (by the clock alone, an hour apart: no checkpoint is due by kimg at the evaluation)
        cfg = cfg.override({"checkpoint.every_kimg": 100.0})
    real = ClassifyScorer.__call__

    def crashed(self):
        raise Crashed

    monkeypatch.setattr(ClassifyScorer, "__call__", crashed)  # (in the first evaluation, at 0.256 kimg)
    with pytest.raises(Crashed):
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert checkpoint_find.find_checkpoint(tmp_path / "r").name == "000000.256"  # the evaluation's, made first
    monkeypatch.setattr(ClassifyScorer, "__call__", real)
    bigbatch.train(cfg, run_dir=tmp_path / "r", resume=True, quiet=True)
    mine = load_file(checkpoint_find.find_checkpoint(tmp_path / "r") / "model.safetensors")
    theirs = load_file(checkpoint_find.find_checkpoint(alone) / "model.safetensors")
    assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
    assert rows(tmp_path / "r") == rows(alone)  # each evaluation once, in its place
