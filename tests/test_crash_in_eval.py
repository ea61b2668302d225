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


def rows(run):
    """metrics.jsonl's rows without the times, which differ between two runs."""
    drop = ("seconds", "img_per_s", "eval_seconds")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]


def crash_in(monkeypatch, evaluation: int, each_s: float = 0.0) -> None:
    """The scorer dies in its `evaluation`-th call; each before it takes `each_s` seconds of loop.py's clock (which
    nothing else moves: the steps take none)."""
    import time
    from types import SimpleNamespace

    from bigbatch import loop

    clock, calls, real = [0.0], [], ClassifyScorer.__call__
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=lambda: clock[0], perf_counter=time.perf_counter))

    def scored(self):
        calls.append(1)
        if len(calls) == evaluation:
            raise Crashed
        clock[0] += each_s
        return real(self)

    monkeypatch.setattr(ClassifyScorer, "__call__", scored)


@pytest.mark.parametrize(
    "given, each_s, evaluation",
    [
        ({}, 0.0, 1),  # the checkpoint due with the first evaluation (0.256 kimg each)
        ({}, 0.0, 2),  # ... with the run's last
        # checkpoints by the clock alone, every 10 minutes, evaluations 20 minutes long: the checkpoint the clock
        # asks for after the first, then one before the second (the clock would ask during it)
        ({"checkpoint.every_kimg": 100.0, "checkpoint.every_minutes": 10.0, "train.kimg": 0.768}, 1200.0, 2),
    ],
)
def test_a_crash_in_an_evaluation_resumes_from_the_checkpoint_at_it(tmp_path, monkeypatch, given, each_s, evaluation):
    cfg = tiny(**given)
    crash_in(monkeypatch, evaluation, each_s)
    with pytest.raises(Crashed):
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    at = checkpoint_find.find_checkpoint(tmp_path / "r").name
    assert at == f"000000.{256 * evaluation:03d}"  # the evaluation's, written before it
    if 256 * evaluation == round(cfg.train.kimg * 1000):  # (the run's last: info says its evaluation is to be made)
        from bigbatch.info import describe_run

        assert "its last evaluation was not made: `bigbatch train --run-dir" in describe_run(tmp_path / "r")
    monkeypatch.undo()
    bigbatch.train(cfg, run_dir=tmp_path / "r", resume=True, quiet=True)
    alone = bigbatch.train(cfg, run_dir=tmp_path / "alone", quiet=True)
    mine = load_file(checkpoint_find.find_checkpoint(tmp_path / "r") / "model.safetensors")
    theirs = load_file(checkpoint_find.find_checkpoint(alone) / "model.safetensors")
    assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
    assert rows(tmp_path / "r") == rows(alone)  # each evaluation once, in its place
