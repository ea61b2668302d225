"""The training progress a user reads: rank 0's console rows and metrics.jsonl."""

from types import SimpleNamespace

from bigbatch.progress import Progress


class _Rep:
    is_main, batch = True, 8

    def counters(self):
        return {"G": {"skipped": 1, "loss_scale": 512.0}}


def test_a_loss_whose_steps_were_all_skipped_shows_as_a_dash(tmp_path, capsys):
    # Found from outside: a row whose G steps were all skipped (fp16 settling) printed "loss_G nan", read as a run
    # diverged; its metrics.jsonl row leaves the loss out.
    rows = []
    train = SimpleNamespace(images=32, kimg=0.032, log_every_kimg=0.016)
    run = SimpleNamespace(cfg=SimpleNamespace(train=train, name="t"), path=tmp_path, log=rows.append, log_window=None)
    progress = Progress(run, _Rep(), 0, 0.0, False, False)
    progress.add(1.0, 0, 16, {"loss_G": 1.25, "loss_D": 0.5})
    progress.log(16, 2)
    progress.add(1.0, 16, 32, {"loss_D": 0.75, "loss_G": float("nan")})
    progress.log(32, 4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kimg")]
    assert lines[0].startswith("kimg 0.016/0.032  loss_D 0.500  loss_G 1.250  16 img/s")
    assert lines[1].startswith("kimg 0.032/0.032  loss_D 0.750  loss_G -  16 img/s"), lines
    assert "loss_G" not in rows[1] and rows[1]["skipped_G"] == 0 and rows[1]["loss_scale_G"] == 512.0
