"""Damage a checkpoint's own record hides, and a run whose every checkpoint was damaged, as its user reads them
(found from outside)."""

import json
import re

import pytest

import bigbatch
from bigbatch import checkpoints
from bigbatch.cli import main


def test_a_meta_json_edited_of_its_checksums_is_damage_and_a_run_of_none_intact_is_said_so(tiny, tmp_path, capsys):
    cfg = tiny.override({"train.kimg": 0.064, "checkpoint.every_kimg": 0.064, "sample.every_kimg": 0})
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    ckpt = checkpoints.complete_checkpoints(run)[-1]
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["checksumz"] = meta.pop("checksums")  # (a damaged record: a byte flipped in G after it then passed)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(checkpoints.Corrupt, match=r"its meta.json records no xxh3_128 checksum of \w+\.safetensors"):
        checkpoints.verify(ckpt)
    assert main(["info", str(run), "--verify"]) == 2
    capsys.readouterr()
    # Resumed, it is set aside; with none left intact, info says what the resume said, not "goes on from its start".
    assert main(["train", "--run-dir", str(run), "--resume"]) == 2
    refused = capsys.readouterr().err
    assert main(["info", str(run)]) == 0
    state = re.search(r"^state +(.*)$", capsys.readouterr().out, re.M).group(1)
    assert state.startswith("not training: no checkpoint of it is intact, each damaged checkpoint moved aside"), state
    assert "no checkpoint of" in refused and state.split("moved aside", 1)[1] in refused, (state, refused)
