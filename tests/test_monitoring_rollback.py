"""Watching a run rolled back and resumed (found from outside): `info` says it is rolled back, not crashed; the rows
past the checkpoint it goes on from are kept beside metrics.jsonl, as its newer checkpoints are kept aside; an
evaluation made again at that checkpoint is one TensorBoard point, not two; the printed ETA counts the evaluations
still due."""

import json

from bigbatch.cli import main

SMALL = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=8"]
# The offline classifier's FID, cheap (tests/test_distributed.py's), at each checkpoint.
EVAL = ["eval.metrics=fid", "eval.extractor=classifier", "eval.classifier={steps=5,width=8,resolution=16}"]
EVAL += ["eval.n=40", "eval.reference_n=80", "eval.every_kimg=0.032", "checkpoint.every_kimg=0.032"]
ARGS = [*SMALL, *EVAL, "train.log_every_kimg=0.016", "sample.every_kimg=0", "checkpoint.keep=10"]


def _scalars(run, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return sorted(e.step for e in events.Scalars(tag))


def test_a_rolled_back_run_is_said_so_keeps_its_rows_aside_and_logs_one_point_a_step(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(run)]) == 0
    before = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kimg"] for r in before if "fcd" in r] == [0.032, 0.064]
    (run / "checkpoints" / "latest").write_text("000000.032\n")  # rolled back, as README says
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    said = capsys.readouterr().out
    assert "rolled back to its checkpoint at 0.032 kimg (checkpoints/latest names it; 1 newer, to 000000.064" in said
    assert "killed or crashed" not in said
    assert main(["train", *ARGS, "train.kimg=0.064", "--run-dir", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "its 3 rows past 0.032 kimg, of another history, kept as metrics.jsonl.superseded-000000.032-" in err, err
    (aside,) = run.glob("metrics.jsonl.superseded-000000.032-*")
    assert [json.loads(line) for line in aside.read_text().splitlines()] == [r for r in before if r["kimg"] > 0.032]
    after = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The evaluation at the checkpoint, pending in it (written before it was made), made again: one row, one point.
    assert [r["kimg"] for r in after if "fcd" in r] == [0.032, 0.064]
    assert _scalars(run, "fcd") == [32, 64] and _scalars(run, "loss_D") == [16, 32, 48, 64]


def test_the_printed_eta_counts_the_evaluations_still_due():
    from types import SimpleNamespace

    import bigbatch
    from bigbatch.progress import Progress

    cfg = bigbatch.preset("digits").override({"eval.every_kimg": 0.016})
    at = SimpleNamespace(total=64, run=SimpleNamespace(cfg=cfg), rep=SimpleNamespace(batch=8))
    # (at 16, 32, 48 and 64 images: the end's is 64's own)
    assert [Progress.evals_left(at, n) for n in (0, 16, 40, 63, 64)] == [4, 3, 2, 1, 0]
    at.total = 70  # (an end off every_kimg's grid: an evaluation of its own)
    assert Progress.evals_left(at, 64) == 1 and Progress.evals_left(at, 0) == 5
    at.run = SimpleNamespace(cfg=cfg.override({"eval.every_kimg": 0}))
    assert Progress.evals_left(at, 0) == 0
    # At most one a step: a step past several of eval.fine_every_kimg's ticks scores once (found by review: 30 for 12).
    fine = {"eval.every_kimg": 1.0, "eval.fine_from_kimg": 0.0, "eval.fine_every_kimg": 0.1}
    at = SimpleNamespace(total=3072, run=SimpleNamespace(cfg=cfg.override(fine)), rep=SimpleNamespace(batch=256))
    assert Progress.evals_left(at, 0) == 12


def test_a_resumed_runs_event_file_sorts_after_the_files_before_it(tmp_path):
    # Found by the suite: made in the same second as the file before it, numbered 10 after 9, it sorted first, and
    # TensorBoard read its purge of the steps past the checkpoint before those steps (each evaluation twice).
    import time

    from torch.utils.tensorboard import SummaryWriter

    from bigbatch.progress import _event_writer

    now = int(time.time())  # (a file before ours, of this second, whose name sorts after the one ours would have)
    (tmp_path / f"events.out.tfevents.{now:010d}.zzzz.1.0").write_bytes(b"")
    _event_writer(SummaryWriter, tmp_path, None).close()  # (a new run's: made as it is)
    assert len(list(tmp_path.iterdir())) == 2
    _event_writer(SummaryWriter, tmp_path, 32).close()
    names = sorted(f.name for f in tmp_path.iterdir())
    assert len(names) == 3 and not names[-1].endswith(".zzzz.1.0") and int(names[-1].split(".")[3]) > now


def test_a_rollback_keeps_its_rows_aside_beside_a_damaged_files_copy(tmp_path):
    # (found by the suite: the damaged file's copy took the name meant for the rows set aside)
    from bigbatch.metrics_file import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kimg": 0.016, "step": 2}\nnot a row\n{"kimg": 0.032, "step": 4}\n{"kimg": 0.048, "step": 6}\n')
    truncate_metrics(path, 16, superseded="superseded-x")
    assert path.read_text() == '{"kimg": 0.016, "step": 2}\n'
    assert (tmp_path / "metrics.jsonl.damaged").read_text().count("\n") == 4
    kept = (tmp_path / "metrics.jsonl.superseded-x").read_text().splitlines()
    assert [json.loads(line)["kimg"] for line in kept] == [0.032, 0.048]
