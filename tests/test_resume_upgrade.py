"""A run resumed after bigbatch was upgraded: each checkpoint names the bigbatch that wrote it (its version and a
digest of its sources), a resume under other code says so and plan.json keeps it; a key the run never read, changed
since by its preset, does not refuse the preset's --resume."""

import json

import pytest

import bigbatch
from bigbatch import checkpoint_find
from bigbatch.cli import main
from bigbatch.provenance import code_version, sources_digest

GAN = ["--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=16"]
GAN += ["sample.every_kimg=0", "eval.every_kimg=0", "checkpoint.every_kimg=0.032"]


def test_code_version_names_the_release_and_a_digest_that_any_change_of_a_source_changes(tmp_path):
    import shutil
    from pathlib import Path

    package = Path(bigbatch.__file__).parent
    version, digest = code_version().split("+")
    assert version == bigbatch.__version__ and digest == sources_digest(package)
    copy = shutil.copytree(package, tmp_path / "bigbatch", ignore=shutil.ignore_patterns("__pycache__"))
    assert sources_digest(copy) == digest
    (copy / "README.txt").write_text("not a source")  # (nor is a compiled file: what runs is the sources)
    assert sources_digest(copy) == digest
    (copy / "loop.py").write_text((copy / "loop.py").read_text() + "\n")
    assert sources_digest(copy) != digest


@pytest.mark.parametrize("wrote", ["0.1.0+000000000000", None])
def test_a_resume_under_other_code_says_which_wrote_the_checkpoint_and_keeps_it(tmp_path, capsys, wrote):
    run = tmp_path / "r"
    assert main(["train", *GAN, "--run-dir", str(run), "train.kimg=0.032"]) == 0
    ckpt = checkpoint_find.find_checkpoint(run)
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["bigbatch"] == code_version()
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    assert f"(0.032 of 0.032 kimg, by bigbatch {code_version()})" in capsys.readouterr().out
    # Written by another bigbatch (meta.json, which no checksum covers, as an older release wrote it)
    if wrote is None:
        del meta["bigbatch"]
    else:
        meta["bigbatch"] = wrote
    (ckpt / "meta.json").write_text(json.dumps(meta))
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.064"]) == 0
    err = capsys.readouterr().err
    by = f"bigbatch {wrote}" if wrote else "an earlier bigbatch (before versions were recorded)"
    assert f"checkpoint {ckpt.name} was written by {by}, and this is {code_version()}: the run goes on" in err
    resumes = json.loads((run / "plan.json").read_text())["resumes"]
    assert resumes == [
        {"at_kimg": 0.032, "changed": {"bigbatch": [wrote, code_version()], "train.kimg": [0.032, 0.064]}}
    ]
    # The same code again: nothing said.
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.096"]) == 0
    assert "was written by" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "phases",
    ["data.schedule=[{kimg = 0, resolution = 16, batch = 32, lr = [0.2, 0.02]}]", "data.schedule=0:16:32:0.2:0.02"],
)
def test_a_rate_the_schedules_phases_leave_unread_does_not_refuse_a_resume(tmp_path, capsys, phases):
    given = ["--preset", "fashion_resnet", phases, "data.path=builtin:digits", "data.val_path=", "model.ch=8"]
    given += ["model.options.depth=8", "train.warmup_kimg=0", "train.lr_decay=none", "eval.every_kimg=0"]
    given += ["checkpoint.every_kimg=0.064", "--run-dir", str(tmp_path / "r")]
    # Begun when the preset set train.lr = 1 (read by nothing: the phases give the rates), resumed as it now does.
    assert main(["train", *given, "train.lr=1.0", "train.kimg=0.064"]) == 0
    assert main(["train", *given, "train.lr=0.1", "train.kimg=0.128", "--resume=auto"]) == 0, capsys.readouterr().err
    assert "train.lr" not in json.dumps(json.loads((tmp_path / "r" / "plan.json").read_text()).get("resumes", []))
    assert bigbatch.Config.load(tmp_path / "r").train.lr == 1.0  # the run's own, kept
    # A rate it does read still refuses it (the phases' own).
    other = "data.schedule=[{kimg = 0, resolution = 16, batch = 32, lr = [0.3, 0.02]}]"
    assert main(["train", *given[:2], other, *given[3:], "train.kimg=0.192", "--resume=auto"]) == 2
    assert "the config differs from the one" in capsys.readouterr().err
