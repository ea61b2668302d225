"""Experiments as code: bigbatch.sweep and `bigbatch sweep FILE.py`."""

import csv
import fcntl
import json
import os
import re
import subprocess
import sys

import pytest

import bigbatch
from bigbatch import checkpoints
from bigbatch.cli import main


def test_a_sweep_trains_each_combination_once_resumes_the_interrupted_and_tabulates(tiny, tmp_path, capsys):
    base = tiny.override({"train.kimg": 0.128, "checkpoint.every_kimg": 0.064, "train.micro_batch": 16})
    grid = {"train.batch": [16, 32], "train.g_lr": [2e-4]}
    rows = bigbatch.sweep(base, grid, tmp_path / "sweep")
    assert [(r["run"], r["train.batch"], r["status"]) for r in rows] == [
        ("batch=16,g_lr=0.0002", 16, "finished"),
        ("batch=32,g_lr=0.0002", 32, "finished"),
    ]
    assert all(r["kimg"] == 0.128 and r["img_per_s"] > 0 and "loss_D" in r for r in rows)
    with open(tmp_path / "sweep" / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["train.batch"] for t in table] == ["16", "32"] and table[1]["status"] == "finished"
    assert (tmp_path / "sweep" / "results.md").read_text().startswith("| run | train.batch | train.g_lr | status |")

    # One run loses its last checkpoint (as if killed before it): the sweep again resumes it, skips the other.
    first, second = (tmp_path / "sweep" / r["run"] for r in rows)
    finished = {p.name: p.stat().st_mtime_ns for p in (first / "checkpoints").iterdir()}
    weights = (second / "checkpoints" / "000000.128" / "G.safetensors").read_bytes()
    for ckpt in checkpoints.complete_checkpoints(second)[1:]:
        ckpt.rename(ckpt.with_name(".gone"))
    rows = bigbatch.sweep(base, grid, tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["finished", "finished"]
    assert {p.name: p.stat().st_mtime_ns for p in (first / "checkpoints").iterdir()} == finished
    assert (second / "checkpoints" / "000000.128" / "G.safetensors").read_bytes() == weights

    # The base changed since (found from outside: the finished runs were skipped and reported as the new
    # base's): refused by name before anything trains, as a resume is.
    with pytest.raises(
        bigbatch.BigbatchError, match=r"in train.seed \(0 -> 7\): for a .*give it another RUNS_DIR$"
    ) as e:
        bigbatch.sweep(base.override({"train.seed": 7}), grid, tmp_path / "sweep")
    assert len(str(e.value)) < 300  # (not resume's advice: found from outside, the fix came after 1,000 characters)
    assert (second / "checkpoints" / "000000.128" / "G.safetensors").read_bytes() == weights

    # Another sweep into the same folder (found from outside: it called the first one's runs failed).
    with open(tmp_path / "sweep" / ".sweep.lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        held.truncate(0)
        held.write("4242\n")
        held.flush()
        with pytest.raises(bigbatch.BigbatchError, match=r"in use by another sweep \(process 4242\)"):
            bigbatch.sweep(base, grid, tmp_path / "sweep")
    assert [r["status"] for r in bigbatch.sweep(base, grid, tmp_path / "sweep")] == ["finished", "finished"]
    # The grid's keys in another order are the same runs (found from outside: trained again, in new folders);
    # shorter, they are kept at their own length, and said so (found from outside: tabulated without a word).
    swapped = {"train.g_lr": grid["train.g_lr"], "train.batch": grid["train.batch"]}
    capsys.readouterr()
    rows = bigbatch.sweep(base.override({"train.kimg": 0.064}), swapped, tmp_path / "sweep")
    said = "batch=16,g_lr=0.0002 trained to its own train.kimg=0.128, past this sweep's 0.064: its row is of its own"
    assert said in capsys.readouterr().err
    assert [(r["run"], r["status"], r["kimg"]) for r in rows] == [
        ("batch=16,g_lr=0.0002", "finished", 0.128),
        ("batch=32,g_lr=0.0002", "finished", 0.128),
    ]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == [r["run"] for r in rows]

    with pytest.raises(bigbatch.BigbatchError, match="must map to a non-empty list"):
        bigbatch.sweep(base, {"train.batch": 16}, tmp_path / "bad")
    with pytest.raises(bigbatch.BigbatchError, match="'train.batch' lists 16 more than once"):
        bigbatch.sweep(base, {"train.batch": [16, 32, 16]}, tmp_path / "bad")
    with pytest.raises(bigbatch.BigbatchError, match="unknown config key 'train.bacth'"):
        bigbatch.sweep(base, {"train.bacth": [16]}, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # every config is checked before anything trains

    # A run that fails does not stop the others; the sweep says which failed once all have ended.
    grid = {"data.path": [str(tmp_path / "missing.h5"), "builtin:digits"]}
    with pytest.raises(bigbatch.BigbatchError, match=r"1 of 2 sweep runs failed \(path=.*missing"):
        bigbatch.sweep(base.override({"train.batch": 16}), grid, tmp_path / "failing")
    with open(tmp_path / "failing" / "results.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["failed", "finished"]

    # A run stopped past a shorter length than its own is not finished: its resume refuses the length, naming it
    # (found from outside: called finished, beside runs of the new length). One that reached its own length is.
    long = base.override({"train.batch": 16, "train.kimg": 0.256})
    (run,) = [tmp_path / "short" / r["run"] for r in bigbatch.sweep(long, {"train.seed": [0]}, tmp_path / "short")]
    for ckpt in checkpoints.complete_checkpoints(run)[2:]:  # (stopped at 0.128 of its 0.256)
        ckpt.rename(ckpt.with_name(f".gone-{ckpt.name}"))
    (run / "checkpoints" / "latest").write_text("000000.128\n")
    with pytest.raises(bigbatch.BigbatchError, match=r"1 of 1 sweep runs failed \(seed=0: .*is not beyond"):
        bigbatch.sweep(long.override({"train.kimg": 0.064}), {"train.seed": [0]}, tmp_path / "short")


def test_a_stopped_sweep_still_writes_its_table(tiny, tmp_path, monkeypatch, capsys):
    # Found from outside: a sweep stopped by Ctrl-C wrote no results table, not even the runs that finished.
    import bigbatch.loop

    real = bigbatch.loop.train

    def stopped_in_the_second(cfg, run_dir, **kw):  # (as a stop does: a checkpoint short of the run's end)
        short = cfg.train.batch == 32
        return real(cfg.override({"train.kimg": 0.064}) if short else cfg, run_dir=run_dir, **kw)

    monkeypatch.setattr(bigbatch.loop, "train", stopped_in_the_second)
    base = tiny.override({"train.kimg": 0.128, "checkpoint.every_kimg": 0.064, "train.micro_batch": 16})
    with pytest.raises(KeyboardInterrupt):
        bigbatch.sweep(base, {"train.batch": [16, 32, 64]}, tmp_path / "sweep")
    with open(tmp_path / "sweep" / "results.csv") as f:
        assert [(r["train.batch"], r["status"], r["kimg"]) for r in csv.DictReader(f)] == [
            ("16", "finished", "0.128"),
            ("32", "interrupted", "0.064"),
            ("64", "new", "0.0"),
        ]
    # `bigbatch sweep` says so in one line, as the README has it (found from outside: a second, "interrupted").
    (tmp_path / "base.toml").write_text(base.dumps())
    script = tmp_path / "batch.py"
    script.write_text(
        f"import bigbatch\nbase = bigbatch.Config.load({str(tmp_path / 'base.toml')!r})\n"
        f"bigbatch.sweep(base, {{'train.batch': [16, 32, 64]}}, {str(tmp_path / 'sweep')!r})\n"
    )
    capsys.readouterr()
    assert main(["sweep", str(script)]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "bigbatch sweep: stopped at batch=32; run the sweep again to resume it", err
    assert "bigbatch: interrupted" not in err  # (the run's warnings before it are its own)
    # Found from outside: a run stopped before its first log row showed kimg 0, though its checkpoint held more.
    from bigbatch.sweeps import result_row

    stopped = tmp_path / "sweep" / "batch=32"
    rows = (stopped / "metrics.jsonl").read_text().splitlines()
    (stopped / "metrics.jsonl").write_text("")
    row = result_row(stopped, {"train.batch": 32}, base.override({"train.batch": 32}))
    assert row["kimg"] == 0.064 and row["wall_s"] > 0  # (and its seconds the checkpoint's: found from outside, a
    (stopped / "metrics.jsonl").write_text(rows[0] + "\n")  # row's time beside the checkpoint's kimg)
    seconds = json.loads(rows[-1])["seconds"]
    assert result_row(stopped, {"train.batch": 32}, base.override({"train.batch": 32}))["wall_s"] >= seconds - 0.1
    # Scores to their significant digits (found from outside: to 4 decimals, KIDs of 4.4e-4 and 3.6e-4 were one).
    scored = json.dumps({"kimg": 0.064, "kid": 0.00036137, "eval_seconds": 1})
    (stopped / "metrics.jsonl").write_text(f"{rows[0]}\n{scored}\n")
    assert result_row(stopped, {"train.batch": 32}, base.override({"train.batch": 32}))["best_kid"] == 0.00036137


def test_no_two_combinations_share_a_run_folder():
    # Found from outside: names were cut at 200 characters, so a long value first and train.kimg last gave
    # two combinations one folder: the second "resumed" the first and the table reported both from it.
    from bigbatch.sweeps import run_names

    schedule = ",".join(f"{k / 1000:.3f}:16:64:0.1:0.2" for k in range(64, 256, 8))
    combos = [{"data.schedule": schedule, "model.options": {"bn": True}, "train.kimg": k} for k in (0.128, 0.256)]
    combos += [{"data.path": "a/b.h5"}, {"data.path": "a_b.h5"}, {"train.batch": 16}]
    names = run_names(combos)
    assert len(set(names)) == len(names) and all(len(n) <= 200 for n in names), names
    assert names[0].startswith("schedule=0.064_16_64") and names[-1] == "batch=16"
    assert run_names(combos) == names  # the same folders when the sweep runs again


def test_the_first_sweep_anyone_writes_runs_on_digits(tmp_path):
    # Found from outside: a grid over train.batch on the digits preset (micro_batch 64) was refused.
    small = {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.kimg": 0.064}
    rows = bigbatch.sweep(bigbatch.preset("digits").override(small), {"train.batch": [32, 64]}, tmp_path / "s")
    assert [(r["train.batch"], r["status"]) for r in rows] == [(32, "finished"), (64, "finished")]


def test_a_sweep_file_runs_with_bigbatch_sweep(tiny, tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny.override({"train.kimg": 0.064}).dumps())
    script = tmp_path / "lr.py"
    script.write_text(
        "import bigbatch\n"
        f"base = bigbatch.Config.load({str(config)!r})\n"
        "for lr in (1e-4, 2e-4):  # plain Python: loops, conditionals\n"
        f"    bigbatch.sweep(base, {{'train.g_lr': [lr], 'train.d_lr': [lr]}}, {str(tmp_path / 'runs')!r})\n"
    )
    assert main(["sweep", str(script)]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == [
        "g_lr=0.0001,d_lr=0.0001",
        "g_lr=0.0002,d_lr=0.0002",
    ]
    with open(tmp_path / "runs" / "results.csv") as f:  # both calls' runs: a later call keeps earlier rows
        assert [r["run"] for r in csv.DictReader(f)] == ["g_lr=0.0001,d_lr=0.0001", "g_lr=0.0002,d_lr=0.0002"]
    capsys.readouterr()
    assert main(["sweep", str(script)]) == 0  # again, once done: said so (found from outside: not a word)
    out = capsys.readouterr().out
    assert out.count(f"Sweep {tmp_path / 'runs'}: 1 of 1 runs finished (1 before this call); results in ") == 2
    assert main(["sweep", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "typo.py").write_text("import bigbatch\nbigbatch.sweep(\n")
    assert main(["sweep", str(tmp_path / "typo.py")]) == 2
    assert re.search(r"error: sweep file .*typo.py, line \d+: .*never closed", capsys.readouterr().err)
    (tmp_path / "data.h5").write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00")  # a data file given by mistake
    assert main(["sweep", str(tmp_path / "data.h5")]) == 2
    assert "data.h5 is not Python source" in capsys.readouterr().err  # (it said "line None")
    (tmp_path / "results.csv").write_text("run,status\nrun,finished\n")  # (it parses: a NameError's traceback)
    assert main(["sweep", str(tmp_path / "results.csv")]) == 2
    assert "results.csv is not Python source (not a .py)" in capsys.readouterr().err
    (tmp_path / "none.py").write_text("print('no sweep here')\n")
    assert main(["sweep", str(tmp_path / "none.py")]) == 0
    assert "ran without calling bigbatch.sweep: nothing was trained" in capsys.readouterr().err
    # A module beside the file is imported, as `python FILE.py` finds it (found from outside: ModuleNotFoundError).
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "beside_the_sweep_file.py").write_text("print('found beside it')\n")
    (tmp_path / "elsewhere" / "uses.py").write_text("import beside_the_sweep_file\n")
    assert main(["sweep", str(tmp_path / "elsewhere" / "uses.py")]) == 0
    assert "found beside it" in capsys.readouterr().out


def test_a_search_into_a_folder_of_another_bases_trials_is_refused_before_it_trains(tiny, tmp_path):
    # Found from outside: a second search (another base, the same seeded sampler) took the first one's trial
    # folders, failed to resume each, and wrote `failed` over their rows in results.md.
    import hashlib
    import json

    optuna = pytest.importorskip("optuna")
    values = {"train.seed": 7}
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    earlier = tmp_path / "runs" / f"trial-0000-{digest}"
    earlier.mkdir(parents=True)
    scored = tiny.override({"eval.every_kimg": 0.256, "eval.extractor": "classifier"})  # (logs fcd)
    (earlier / "config.toml").write_text(scored.override({**values, "train.g_lr": 1e-3}).dumps())
    (tmp_path / "runs" / "results.csv").write_text(f"run,status\n{earlier.name},finished\n")
    study = optuna.create_study(direction="minimize")
    with pytest.raises(bigbatch.BigbatchError, match=r"another config .* in train.g_lr .* give it another RUNS_DIR"):
        bigbatch.sweep(scored, {"train.seed": [7]}, tmp_path / "runs", search=study, n_trials=1, metric="fcd")
    assert (tmp_path / "runs" / "results.csv").read_text() == f"run,status\n{earlier.name},finished\n"
    assert [t.state.name for t in study.get_trials()] == ["FAIL"] and not (earlier / "metrics.jsonl").exists()


def test_a_search_samples_configs_from_an_optuna_study_and_prunes_on_the_metric(tmp_path, monkeypatch, capsys):
    optuna = pytest.importorskip("optuna")
    from test_classify import tiny as tiny_classifier

    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    seen = []  # the trials' states as the pruner sees them

    class PruneTheSecond(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            seen.append([t.state.name for t in study.get_trials()])
            return trial.number == 1

    study = optuna.create_study(direction="maximize", pruner=PruneTheSecond())
    # (a batch of 96 evaluates past each 3.072 kimg, at 3,168, 6,240, ... images: still its 1st, 2nd, ... evaluation;
    # long enough after the first for the stop to land: found from outside, a run of 0.4 s had ended before it, and
    # was called pruned)
    base = tiny_classifier(
        **{"train.kimg": 12.288, "train.batch": 96, "eval.every_kimg": 3.072, "checkpoint.every_kimg": 12.288}
    )
    space = {"train.lr": (0.01, 0.5, "log"), "train.label_smoothing": [0.0, 0.1]}
    rows = bigbatch.sweep(base, space, tmp_path / "search", search=study, n_trials=2, metric="val_top1")

    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    first, second = rows
    assert first["status"] == "finished" and second["status"] == "pruned"
    assert first["run"].startswith("trial-0000-") and 0.01 <= first["train.lr"] <= 0.5
    # The trial's value is its run's best val_top1; the pruned run was stopped at its first evaluation.
    assert trials[0].value == pytest.approx(first["best_val_top1"], abs=1e-4) and list(
        trials[0].intermediate_values
    ) == [1, 2, 3, 4]
    assert list(trials[1].intermediate_values) == [1]  # steps: the evaluations' numbers
    # Each trial is told as its run ends, before the next is sampled (found from outside: all were told at the
    # search's end, so a sampler learnt nothing and a pruner had no completed trial to compare with).
    assert seen[-1] == ["COMPLETE", "RUNNING"]
    assert checkpoints.complete_checkpoints(tmp_path / "search" / second["run"])  # stopped with a checkpoint
    assert second["kimg"] < 12.288  # (before its end: a run that ended first is complete, not pruned)
    table = (tmp_path / "search" / "results.md").read_text()
    assert "| pruned |" in table and "| finished |" in table
    out = capsys.readouterr().out  # (each evaluation said as it is told: found from outside, silent for hours)
    assert f"bigbatch sweep: {first['run']}: val_top1 {trials[0].intermediate_values[1]:g} at kimg " in out
    last = out.splitlines()[-1]  # (as a grid's: found from outside, a search ended without a word)
    best = f"best {first['run']}: val_top1 {trials[0].value:g}"
    assert last.startswith(f"Search {tmp_path / 'search'}: 1 of 2 trials finished (1 pruned); {best}; results"), last

    with pytest.raises(bigbatch.BigbatchError, match="val_top1 is better higher: create the study with direction="):
        bigbatch.sweep(base, space, tmp_path / "bad", search=optuna.create_study(), n_trials=1, metric="val_top1")
    with pytest.raises(bigbatch.BigbatchError, match="needs n_trials"):
        bigbatch.sweep(base, space, tmp_path / "bad", search=study, metric="val_top1")


def test_a_search_stopped_by_sigterm_writes_its_table_and_says_so(tmp_path, capsys, monkeypatch):
    # Found from outside: SIGTERM to `bigbatch sweep` of a search wrote no table, exited 143, said only that.
    pytest.importorskip("optuna")
    from test_classify import tiny as tiny_classifier

    (tmp_path / "base.toml").write_text(tiny_classifier(**{"train.kimg": 0.256}).dumps())
    script = tmp_path / "search.py"
    script.write_text(
        "import os, signal, bigbatch, optuna\n"
        f"base = bigbatch.Config.load({str(tmp_path / 'base.toml')!r})\n"
        "def space(trial):\n"
        "    if trial.number == 1:  # (as `kill` would, once the first trial has ended)\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return {'train.seed': trial.number}\n"
        "study = optuna.create_study(direction='maximize')\n"
        "bigbatch.sweep(base, space, os.environ['RUNS'], search=study, n_trials=3, metric='val_top1')\n"
    )
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    assert main(["sweep", str(script)]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("bigbatch sweep: stopped (by SIGTERM); run the search again to go on (a new study"), err
    with open(tmp_path / "runs" / "results.csv") as f:
        assert [(r["train.seed"], r["status"]) for r in csv.DictReader(f)] == [("0", "finished")]
    # The same from a script run by Python, not the CLI (found from outside: killed at once, no table, no word; now
    # bigbatch.sweep raises a KeyboardInterrupt).
    env = {**os.environ, "RUNS": str(tmp_path / "py"), "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode and "bigbatch sweep: stopped (by SIGTERM)" in done.stderr, done.stderr[-2000:]
    assert "[1/3] trial-0000-" in done.stdout  # (a line a trial, quiet or not: found from outside, minutes of nothing)
    with open(tmp_path / "py" / "results.csv") as f:
        assert [(r["train.seed"], r["status"]) for r in csv.DictReader(f)] == [("0", "finished")]


def test_a_search_refuses_a_metric_its_runs_do_not_log_before_anything_trains(tiny, tmp_path):
    # Found from outside: a misspelt metric was found once every trial had trained, each told as failed.
    optuna = pytest.importorskip("optuna")
    scored = tiny.override({"eval.every_kimg": 0.256, "eval.extractor": "classifier", "eval.metrics": "fid,kid"})
    rotations = bigbatch.preset("fashion_resnet").override({"train.labels": "rotation"})
    for base, metric, said in (
        (scored, "fidd", r"'fidd' is not a score these runs log \(fcd, kcd, kcd_std\)"),
        (scored, "fid", r"'fid' is not a score .*set eval.metrics \(eval.extractor\)"),
        (tiny.override({"eval.every_kimg": 0}), "fid", "every eval.every_kimg, which is 0"),
        (tiny.override({"eval.every_kimg": 0}), "accuracy", r"'accuracy' is not a score these runs log \(fid"),  # (the
        # name first: found from outside, "set eval.every_kimg", then that it is not a score)
        # (top-5 of 4 rotations is always 100, and not logged: found by review, every trial trained and failed)
        (rotations, "val_top5", r"'val_top5' is not a score these runs log \(val_top1, val_loss\)"),
    ):
        study = optuna.create_study(direction="maximize" if metric == "val_top5" else "minimize")
        with pytest.raises(bigbatch.BigbatchError, match=said):
            bigbatch.sweep(base, {"train.seed": [1, 2]}, tmp_path / "runs", search=study, n_trials=2, metric=metric)
        assert not study.get_trials()  # (refused before a trial was asked for: found from outside, after its direction)
    assert not (tmp_path / "runs").exists()


def test_a_sweep_into_a_url_is_refused_not_written_to_a_local_folder(tiny, tmp_path, monkeypatch):
    # Found from outside: s3://b/runs became the local folder ./s3:/b/runs, and runs trained there.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(bigbatch.BigbatchError, match="runs_dir s3://b/runs is a URL, and a sweep writes local files"):
        bigbatch.sweep(tiny, {"train.seed": [1]}, "s3://b/runs")
    with pytest.raises(bigbatch.BigbatchError, match="run_dir s3://b/run is a URL, and train writes local files"):
        bigbatch.train(tiny, run_dir="s3://b/run")
    assert not list(tmp_path.iterdir())
    # ... and file:///abs is /abs (found from outside: it trained into ./file:/abs).
    run = bigbatch.train(tiny.override({"train.kimg": 0.032}), run_dir=f"file://{tmp_path / 'r'}", quiet=True)
    assert run == tmp_path / "r" and [p.name for p in tmp_path.iterdir()] == ["r"]


def test_a_combinations_folder_is_found_whatever_the_order_of_its_keys_but_not_another_combinations(tmp_path):
    from bigbatch.sweep_table import existing_folders

    for name in ("batch=16,ch=8", "lr=1,lr=2"):
        (tmp_path / name).mkdir()
    # train.lr=2 and swap.lr=1 is another combination than train.lr=1 and swap.lr=2, though its parts read alike.
    assert existing_folders(tmp_path, ["ch=8,batch=16", "ch=9,batch=16", "lr=2,lr=1", "lr=1,lr=2"]) == [
        "batch=16,ch=8",
        "ch=9,batch=16",
        "lr=2,lr=1",
        "lr=1,lr=2",
    ]
