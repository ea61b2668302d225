"""A resumed run draws the sheets of the checkpoint it starts from where they are missing: a run stopped (killed, a
full disk) between publishing its checkpoint and drawing them had lost them for good (found from outside)."""

import bigbatch


def test_a_resume_draws_the_sheets_its_checkpoint_lacks_and_keeps_those_there(tiny, tmp_path):
    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    sheets = sorted(p.name for p in (run / "samples").glob("*-000000.256.png"))
    assert sheets and all(not name.startswith("batch-") for name in sheets), sheets
    (run / "samples" / sheets[0]).unlink()  # as a kill right after the checkpoint left it
    kept = run / "samples" / sheets[-1]
    before = kept.stat().st_mtime_ns
    bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=run, resume=True, quiet=True)
    assert sorted(p.name for p in (run / "samples").glob("*-000000.256.png")) == sheets
    assert kept.stat().st_mtime_ns == before  # (not drawn again)
