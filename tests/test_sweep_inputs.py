"""A sweep's and a search's bad input refused in one line before anything trains, a sweep's folder told apart from a
run's by every command, and the table's rows as a user reads them (each found from outside)."""

import csv

import pytest
from test_classify import tiny as tiny_classifier

import bigbatch
from bigbatch.cli import main
from bigbatch.sweep_space import check_space
from bigbatch.sweep_table import write_results


def test_a_search_space_is_checked_before_its_first_trial_and_a_bad_sample_names_its_trial(tiny, tmp_path):
    optuna = pytest.importorskip("optuna")
    runs = tmp_path / "runs"

    def search(space):
        study = optuna.create_study(direction="minimize")
        bigbatch.sweep(tiny, space, runs, search=study, n_trials=4, metric="fcd")
        return study

    scored = tiny.override({"eval.every_kimg": 0.256, "eval.extractor": "classifier"})
    for space, said in (  # (a choice of 0 stopped the search at its fourth trial; a reversed range: a traceback)
        ({"train.batch": [16, 0]}, "search choices for 'train.batch': config key 'train.batch' must be a positive"),
        ({"train.batch": (0, 16)}, "search range for 'train.batch': config key 'train.batch' must be a positive"),
        ({"train.g_lr": (1e-3, 1e-4)}, "search range for 'train.g_lr': low 0.001 > high 0.0001: give (low, high)"),
        ({"train.g_lr": (0.0, 1e-4, "log")}, "search range for 'train.g_lr': a log scale needs low > 0, got 0.0"),
    ):
        with pytest.raises(bigbatch.BigbatchError) as e:
            study = optuna.create_study(direction="minimize")
            bigbatch.sweep(scored, space, runs, search=study, n_trials=4, metric="fcd")
        assert said in str(e.value) and not study.get_trials(), e.value
    # a metric the runs do not log, said before the study's direction (found from outside: "fid is better lower",
    # then, the study made again, "not a score these runs log")
    with pytest.raises(bigbatch.BigbatchError, match="a search's metric 'fid' is not a score these runs log"):
        search = optuna.create_study(direction="maximize")
        bigbatch.sweep(scored, {"train.g_lr": [1e-4]}, runs, search=search, n_trials=1, metric="fid")
    assert not runs.exists()
    check_space(tiny_classifier(), {"train.momentum": (0.8, 1.0)})  # (an open end: sampled inside)
    # A choice valid beside another entry's (SGD's momentum, with SGD sampled beside it) is taken.
    adamw = tiny_classifier(**{"train.optimizer": "adamw"})
    check_space(adamw, {"train.optimizer": ["adamw", "sgd"], "train.momentum": [0.5]})
    with pytest.raises(bigbatch.BigbatchError, match="search choices for 'train.momentum': config key 'train.mom"):
        check_space(adamw, {"train.optimizer": ["adamw"], "train.momentum": [0.5]})
    with pytest.raises(bigbatch.BigbatchError, match=r"^the search's trial 0 sampled \{'train.batch': 0\}: config key"):
        bigbatch.sweep(
            scored, lambda t: {"train.batch": 0}, runs, search=optuna.create_study(), n_trials=2, metric="fcd"
        )
    # A search refused at its first trial leaves no folder of a lock alone (found from outside).
    with pytest.raises(bigbatch.BigbatchError, match="a search's metric 'fcd' is not a score these runs log"):
        study = optuna.create_study(direction="minimize")
        bigbatch.sweep(scored, lambda t: {"eval.metrics": "is"}, runs / "m", search=study, n_trials=1, metric="fcd")
    assert not (runs / "m").exists()


def test_a_sweeps_own_arguments_are_checked_in_one_line(tiny, tmp_path, capsys):
    with pytest.raises(bigbatch.BigbatchError, match=r"^sweep base must be a Config \(bigbatch.preset"):
        bigbatch.sweep({"train.kimg": 1}, {"train.batch": [16]}, tmp_path / "a")
    with pytest.raises(bigbatch.BigbatchError, match=r"^sweep nprocs must be >= 1 \(ranks per run\), got 0"):
        bigbatch.sweep(tiny, {"train.batch": [16]}, tmp_path / "b", nprocs=0)  # (a local grid trained on)
    (tmp_path / "file.py").write_text("")
    with pytest.raises(bigbatch.BigbatchError, match=r"runs_dir .*file.py is a file: give a folder for the sweep's"):
        bigbatch.sweep(tiny, {"train.batch": [16]}, tmp_path / "file.py")
    # (found from outside: each refused once runs had trained, or the runs folder and its table were written)
    plans = {"train.micro_batch": [16, 5], "train.batch": [16]}
    with pytest.raises(bigbatch.BigbatchError, match=r"^the sweep's run micro_batch=5,batch=16: train.batch=16 is no"):
        bigbatch.sweep(tiny, plans, tmp_path / "c")
    with pytest.raises(bigbatch.BigbatchError, match=r"^the sweep's run batch=24: train.batch=24 is not a multip"):
        bigbatch.sweep(tiny, {"train.batch": [32, 24]}, tmp_path / "c", launcher="ray", nprocs=16)
    with pytest.raises(bigbatch.BigbatchError, match=r"^sweep launcher 'nope': give 'local', 'ray' or a dask"):
        bigbatch.sweep(tiny, {"train.batch": [16]}, tmp_path / "c", launcher="nope")
    # A search's range in a grid (found from outside: trained at its two ends)
    with pytest.raises(bigbatch.BigbatchError, match=r"^sweep grid key 'train.g_lr' maps to a tuple \(0.001, 0.1\), a"):
        bigbatch.sweep(tiny, {"train.g_lr": (1e-3, 1e-1)}, tmp_path / "c")
    assert not any(tmp_path / n for n in "abc" if (tmp_path / n).exists())
    (tmp_path / "folder").mkdir()
    assert main(["sweep", str(tmp_path / "folder")]) == 2  # (it "does not exist")
    assert f"sweep file {tmp_path / 'folder'} is a folder" in capsys.readouterr().err


def test_a_sweeps_folder_is_not_taken_for_a_run(tiny, tmp_path, capsys):
    # Found from outside: `train --run-dir` into a sweep's folder wrote a run among its runs, which plot and info then
    # showed alone; info and stop called it "neither a run directory nor a checkpoint folder".
    sweep = tmp_path / "sweep"
    (sweep / "batch=16").mkdir(parents=True)
    (sweep / "results.csv").write_text("run,train.batch,status\nbatch=16,16,finished\n")
    with pytest.raises(
        bigbatch.BigbatchError, match=r"is a sweep's folder \(its results.csv\): a run goes in a folder"
    ):
        bigbatch.train(tiny, run_dir=sweep, quiet=True)
    assert sorted(p.name for p in sweep.iterdir()) == ["batch=16", "results.csv"]
    for argv in (["info", str(sweep)], ["info", str(sweep), "--verify"], ["sample", str(sweep)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{sweep} is a sweep's folder (its results.md tabulates its runs): give one of its runs" in err, err


def test_a_later_calls_rows_take_their_places_and_read_alike(tmp_path):
    write_results(tmp_path, [{"run": r, "train.batch": b, "status": "finished"} for r, b in (("a", 16), ("b", 32))])
    write_results(tmp_path, [{"run": "a", "train.batch": 16, "status": "finished", "kimg": 0.5}])
    with open(tmp_path / "results.csv") as f:
        assert [r["run"] for r in csv.DictReader(f)] == ["a", "b"]  # (ours went to the bottom)
    table = (tmp_path / "results.md").read_text().splitlines()
    assert table[2:] == ["| a | 16 | finished | 0.5 |", "| b | 32 | finished |  |"]  # (32 read back as 32.0)


def test_a_run_that_failed_last_time_is_said_to_be_tried_again(tiny, tmp_path, capsys):
    grid = {"data.path": [str(tmp_path / "missing.h5")]}
    for _ in range(2):
        with pytest.raises(bigbatch.BigbatchError, match="1 of 1 sweep runs failed"):
            bigbatch.sweep(tiny, grid, tmp_path / "runs")
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": new") and out[1].endswith(": failed last time: trying it again"), out


def test_a_search_on_a_score_extractor_auto_does_not_log_is_refused_before_it_trains(tiny, tmp_path, monkeypatch):
    # Found from outside: "auto" was taken for either family, so a search on fcd trained every trial of runs that
    # logged fid (Inception's weights being here), then found no fcd.
    optuna = pytest.importorskip("optuna")
    scored = tiny.override({"eval.every_kimg": 0.256, "eval.extractor": "auto"})
    for here, metric, logged in ((True, "fcd", "fid"), (False, "fid", "fcd")):
        monkeypatch.setattr("bigbatch.metrics.extractors.inception_available", lambda here=here: here)
        with pytest.raises(bigbatch.BigbatchError, match=rf"'{metric}' is not a score these runs log \({logged}"):
            bigbatch.sweep(scored, {"train.seed": [1]}, tmp_path / "r", search=optuna.create_study(), n_trials=1,
                           metric=metric)  # fmt: skip
    assert not (tmp_path / "r").exists() or not any(p.is_dir() for p in (tmp_path / "r").iterdir())


def test_a_search_whose_trial_failed_says_its_best_and_returns(tmp_path, capsys, monkeypatch):
    # Found from outside: one diverged trial (a study's FAIL, which Optuna's optimize(catch=...) goes on from) ended
    # the search with an error: its best unsaid, and the caller's code after sweep() (README's study.best_params)
    # never ran. A search all of whose trials failed is still an error.
    optuna = pytest.importorskip("optuna")
    from test_classify import tiny as tiny_classifier

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    base = tiny_classifier(**{"train.kimg": 0.384, "eval.every_kimg": 0.128, "checkpoint.every_kimg": 0.384})
    space = {"train.lr": [1e38, 0.1]}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.GridSampler(space, seed=0))
    rows = bigbatch.sweep(base, space, tmp_path / "s", search=study, n_trials=2, metric="val_top1")
    assert sorted(r["status"] for r in rows) == ["failed", "finished"]
    out, err = capsys.readouterr()
    assert "trials finished (1 failed); best trial-" in out and "1 of 2 sweep runs failed (trial-" in err
    study = optuna.create_study(direction="maximize")
    with pytest.raises(bigbatch.BigbatchError, match="1 of 1 sweep runs failed"):
        bigbatch.sweep(base, {"train.lr": [1e38]}, tmp_path / "all", search=study, n_trials=1, metric="val_top1")


def test_what_a_new_run_refuses_of_the_base_is_refused_before_any_run_trains(tmp_path):
    # Found from outside: a GAN's eval.n in a classifier's base passed the sweep's checks, and every run failed as it
    # started, the cause said once a run in an 800-character line.
    base = tiny_classifier(**{"eval.n": 500})
    with pytest.raises(bigbatch.BigbatchError, match=r"^the sweep's run batch=32: config key 'eval.n' is for a GAN"):
        bigbatch.sweep(base, {"train.batch": [32, 64]}, tmp_path / "grid")
    assert not (tmp_path / "grid").exists()
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(direction="maximize")
    with pytest.raises(bigbatch.BigbatchError, match=r"^the sweep's run trial-0000-\w+: config key 'eval.n' is for"):
        bigbatch.sweep(base, {"train.batch": [32]}, tmp_path / "s", search=study, n_trials=2, metric="val_top1")
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]
