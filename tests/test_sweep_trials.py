"""A search's trials as an Optuna user expects them (each found from outside): a range sampled on a step, a config
the search sampled that training refuses the study's FAIL while the search goes on, and the table written as each
run ends (a sweep killed by SIGKILL had written none)."""

import csv

import pytest
from test_classify import tiny as tiny_classifier

import bigbatch
from bigbatch.cli import main
from bigbatch.sweep_space import suggest


def rows(folder):
    with open(folder / "results.csv") as f:
        return {row["run"]: row["status"] for row in csv.DictReader(f)}


def test_a_range_takes_a_step_and_a_bad_third_item_is_one_line(tmp_path):
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    batches = {suggest(study.ask(), "train.batch", (16, 64, 16)) for _ in range(40)}
    assert batches == {16, 32, 48, 64}  # (49 was sampled, which a micro-batch of 16 does not divide)
    lrs = {suggest(study.ask(), "train.lr", (0.1, 0.3, 0.1)) for _ in range(40)}
    assert {round(lr, 9) for lr in lrs} == {0.1, 0.2, 0.3}
    for third in (0, "lin", -16):
        with pytest.raises(bigbatch.BigbatchError, match=r"the third item is 'log' or a step > 0, e.g. \(16, 64, 16\)"):
            bigbatch.sweep(
                tiny_classifier(), {"train.batch": (16, 64, third)}, tmp_path / "r", search=study, n_trials=1,
                metric="val_top1",
            )  # fmt: skip
    with pytest.raises(
        bigbatch.BigbatchError, match=r"a range of whole numbers takes a whole step, got 0.5: give \(16"
    ):
        bigbatch.sweep(tiny_classifier(), {"train.batch": (16, 64, 0.5)}, tmp_path, search=study, n_trials=1,
                       metric="val_top1")  # fmt: skip
    # In a grid, a step's range is a search's too (found by review: (16, 64, 8) trained at 16, 64 and 8).
    with pytest.raises(bigbatch.BigbatchError, match=r"maps to a tuple \(16, 64, 8\), a search's \(low, high\) range"):
        bigbatch.sweep(tiny_classifier(), {"train.batch": (16, 64, 8)}, tmp_path)


def test_a_sampled_config_training_refuses_fails_its_trial_and_the_search_goes_on(tmp_path, capsys):
    optuna = pytest.importorskip("optuna")
    base = tiny_classifier(**{"train.kimg": 0.128, "eval.every_kimg": 0.128, "checkpoint.every_kimg": 0.128})
    runs, tables = tmp_path / "s", []

    def space(trial):
        if trial.number:  # the table as the trial before ended, before this one is sampled
            tables.append(rows(runs))
        return {"train.batch": [64, 48, 64][trial.number]}  # (48: not a multiple of its micro-batch of 32)

    study = optuna.create_study(direction="maximize")
    got = bigbatch.sweep(base, space, runs, search=study, n_trials=3, metric="val_top1")
    assert [r["status"] for r in got] == ["finished", "failed", "finished"]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    (first, second, third) = (r["run"] for r in got)
    assert tables == [{first: "finished"}, {first: "finished", second: "failed"}]
    out, err = capsys.readouterr()
    assert f"{second} failed: sampled {{'train.batch': 48}}: train.batch=48" in err
    assert "2 of 3 trials finished (1 failed); best trial-" in out


def test_a_grids_table_is_written_as_each_run_ends(tmp_path, monkeypatch):
    from bigbatch import loop

    train, tables = loop.train, []

    def train_after_reading_the_table(cfg, run_dir, **kw):
        tables.append(rows(run_dir.parent) if (run_dir.parent / "results.csv").exists() else {})
        return train(cfg, run_dir=run_dir, **kw)

    monkeypatch.setattr(loop, "train", train_after_reading_the_table)
    base = tiny_classifier(**{"train.kimg": 0.128, "eval.every_kimg": 0, "checkpoint.every_kimg": 0.128})
    bigbatch.sweep(base, {"train.lr": [0.1, 0.2]}, tmp_path / "g")
    assert tables == [{}, {"lr=0.1": "finished", "lr=0.2": "new"}]


def test_a_sweep_without_its_file_is_one_line(capsys):
    assert main(["sweep"]) == 2
    assert capsys.readouterr().err == (
        "bigbatch: error: bigbatch sweep needs FILE.py, the Python file that calls bigbatch.sweep (its ARGS after it)\n"
    )
