"""A reader of a run's latest checkpoint is told where its checkpoints/best/ scored far better (fastai's
SaveModelCallback and timm's model_best hand over the best; bigbatch reads the latest unless told)."""

import json

from test_classify import tiny

import bigbatch
from bigbatch.checkpoint_find import find_checkpoint


def test_reading_the_latest_says_so_where_best_scored_far_better(tmp_path, capsys, monkeypatch):
    # Found from outside: a fine-tune's val_top1 fell from 98.3 to 30 as it unfroze; predict read the latest unsaid.
    over = {"train.kimg": 0.128, "checkpoint.every_kimg": 0.064, "eval.every_kimg": 0.064, "sample.every_kimg": 0}
    run = bigbatch.train(tiny(**over), run_dir=tmp_path / "r", quiet=True)
    best, latest = run / "checkpoints" / "best", find_checkpoint(run)

    def scored(value, best):  # the latest's evaluation, as metrics.jsonl has it, and best/'s
        meta = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
        meta["best"]["value"] = best
        (run / "checkpoints" / "best" / "meta.json").write_text(json.dumps(meta))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows[-1]["val_top1"] = value  # (the run's last row: its evaluation at the end)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    said = f"checkpoints/best/ scored val_top1 90 at {json.loads((best / 'meta.json').read_text())['kimg']:g} kimg, "
    said += f"the latest checkpoint read here 30 ({latest.name}): give {best} to read the best"
    for latest_score, told in ((30.0, True), (88.0, False)):  # (within a twentieth: nothing said)
        monkeypatch.setattr("bigbatch.errors._WARNED", set())
        scored(latest_score, 90.0)
        capsys.readouterr()
        bigbatch.load_classifier(run)
        assert (said in capsys.readouterr().err) == told
