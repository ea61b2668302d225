"""`bigbatch eval RUN --truncation 0.25,0.5,inf` (or `--psi 0.5,0.7,1`): the scores at each value, a JSON line each,
printed and kept in RUN/eval/scores.jsonl, the reference and extractor made once (BigGAN-PyTorch's sample.py
--sample_trunc_curves; ADA's metrics at several truncations)."""

import json
from types import SimpleNamespace

import pytest

import bigbatch
from bigbatch.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.name": "stylegan2",
            "model.ch": 2,
            "model.dim_z": 16,
            "model.options": {"w_dim": 16, "map_layers": 2, "ch_max": 16, "mbstd_group": 4},
            "train.loss": "ns",
            "train.batch": 8,
            "train.kimg": 0.008,
            "eval.every_kimg": 0,
            "sample.every_kimg": 0,
        }
    )
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("sweep") / "r", quiet=True)


@pytest.fixture
def scored(monkeypatch):
    """What each evaluation was asked: (truncation, G's psi), its "is" the call's number; the extractor built once."""
    calls, built = [], []
    stand_in = SimpleNamespace(name="stand-in", has_logits=True, family="inception", digest="x")
    monkeypatch.setattr(
        "bigbatch.tasks.classify.features.feature_extractor", lambda *a, **k: built.append(1) or stand_in
    )

    def evaluate(G, data, metrics, truncation, **kw):
        calls.append((truncation, G.truncation_psi))
        return {"is": float(len(calls))}

    monkeypatch.setattr("bigbatch.metrics.evaluate", evaluate)
    return SimpleNamespace(calls=calls, built=built)


def lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_a_sweep_of_truncations_scores_each_a_line_each_and_keeps_them(run, scored, capsys):
    assert main(["eval", str(run), "--metrics", "is", "--n", "16", "--truncation", "0.5,1,inf"]) == 0
    assert scored.calls == [(0.5, 1.0), (1.0, 1.0), (float("inf"), 1.0)] and scored.built == [1]
    said = lines(capsys)
    assert [(r.get("truncation"), r["is"]) for r in said] == [(0.5, 1.0), (1.0, 2.0), (None, 3.0)]
    kept = [json.loads(line) for line in (run / "eval" / "scores.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in kept[-3:]] == said


def test_a_sweep_of_psi_sets_each_in_turn(run, scored, capsys):
    assert main(["eval", str(run), "--metrics", "is", "--n", "16", "--psi", "0.5,0.7,1"]) == 0
    assert scored.calls == [(float("inf"), 0.5), (float("inf"), 0.7), (float("inf"), 1.0)]
    assert [r["psi"] for r in lines(capsys)] == [0.5, 0.7, 1.0]


def test_each_value_is_said_and_kept_as_it_is_scored(run, scored, capsys, monkeypatch):
    def evaluate(G, data, metrics, truncation, **kw):
        if truncation == 1.0:  # (the second: the process dies, or the machine)
            raise bigbatch.BigbatchError("stand-in for an evaluation cut short")
        return {"is": 7.0}

    monkeypatch.setattr("bigbatch.metrics.evaluate", evaluate)
    before = len((run / "eval" / "scores.jsonl").read_text().splitlines()) if (run / "eval").exists() else 0
    assert main(["eval", str(run), "--metrics", "is", "--n", "16", "--truncation", "0.5,1"]) == 2
    assert [r.get("truncation") for r in lines(capsys)] == [0.5]  # the first, said and kept before the second
    kept = (run / "eval" / "scores.jsonl").read_text().splitlines()[before:]
    assert [json.loads(line)["truncation"] for line in kept] == [0.5]


@pytest.mark.parametrize(
    "given, said",
    [
        (["--truncation", "0.5,1", "--psi", "0.5,1"], "--truncation and --psi each sweep the values listed: give a"),
        (["--truncation", "0.5,0"], "--truncation must be a threshold >= "),
        (["--psi", "0.5,nan"], "--psi must be a number (1 = off, 0.7 typical), got nan"),
        (["--truncation", "0.5,x"], "argument --truncation: must be a number or numbers, comma-separated, got '0.5,x'"),
    ],
)
def test_a_sweep_it_cannot_score_is_one_line_before_any_score(run, scored, capsys, given, said):
    assert main(["eval", str(run), "--metrics", "is", "--n", "16", *given]) == 2
    assert said in capsys.readouterr().err and scored.calls == []
