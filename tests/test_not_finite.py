"""Weights that are not finite never come in unsaid: a checkpoint, or train.init_from's run, holding NaN or infinite
weights (a run never saves them: they came from elsewhere) is refused in one line where it is loaded, by a resume,
a fine-tune, sample, eval and export; and a run whose steps were skipped for non-finite gradients says how many, its
warnings thinned to the 1st, 10th, 100th, ..."""

import json

import pytest
import xxhash
from safetensors.torch import load_file, save_file

from bigbatch import checkpoint_find, checkpoints
from bigbatch.cli import main

SMALL = ["data.resolution=16", "model.ch=8", "model.dim_z=16", "eval.every_kimg=0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    import bigbatch

    cfg = bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.ch": 8,
            "model.dim_z": 16,
            "train.batch": 16,
            "train.kimg": 0.032,
            "checkpoint.every_kimg": 0.032,
            "sample.every_kimg": 0,
            "eval.every_kimg": 0,
            "model.options": {"g_sn": True},
        }
    )
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("nan") / "r", quiet=True)


def poisoned(run, tmp_path, net: str, key: str | None = None, value: float = float("nan")):
    """A copy of `run` whose checkpoint's `net` holds `value` at the start of `key` (default: its first float
    tensor), the checksums rewritten (as a file made elsewhere would be, checked and intact)."""
    import shutil

    copy = tmp_path / f"{net}-{value}"
    shutil.copytree(run, copy)
    ckpt = checkpoint_find.find_checkpoint(copy)
    tensors = load_file(ckpt / f"{net}.safetensors")
    key = key or next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[key].view(-1)[0] = value
    save_file(tensors, ckpt / f"{net}.safetensors")
    data = (ckpt / f"{net}.safetensors").read_bytes()
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"][f"{net}.safetensors"] = len(data)
    meta["checksums"][checkpoints.CHECKSUM][f"{net}.safetensors"] = xxhash.xxh3_128(data).hexdigest()
    (ckpt / "meta.json").write_text(json.dumps(meta))
    return copy, key


def test_a_resume_of_weights_not_finite_is_refused_naming_them_and_the_way_back(trained, tmp_path, capsys):
    run, key = poisoned(trained, tmp_path, "G")
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.064"]) == 2
    err = capsys.readouterr().err
    assert f"G of checkpoint {checkpoint_find.find_checkpoint(run)}: its {key} holds NaN or infinite values" in err
    assert f"resume from an earlier checkpoint: its name in {run / 'checkpoints' / 'latest'}" in err
    assert err.count("\n") == 1  # one line, nothing trained
    # A buffer's NaN too (D's spectral-norm vector), which every step of D would spread.
    run, key = poisoned(trained, tmp_path, "D", key="blocks.0.conv.sn_u")
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.064"]) == 2
    assert f"its {key} holds NaN or infinite values" in capsys.readouterr().err


def test_sample_eval_export_and_a_fine_tune_refuse_a_g_ema_not_finite(trained, tmp_path, capsys):
    run, key = poisoned(trained, tmp_path, "G_ema", value=float("inf"))
    for argv in (["sample", str(run)], ["eval", str(run), "--metrics", "fid", "--n", "64"],
                 ["export", str(run), str(tmp_path / "g.onnx")]):  # fmt: skip
        assert main(argv) == 2, argv
        assert f"G_ema of checkpoint {checkpoint_find.find_checkpoint(run)}: its {key} holds NaN" in (
            capsys.readouterr().err
        )
    assert not (tmp_path / "g.onnx").exists() and not (run / "eval").exists()  # (no score kept of it)
    # A fine-tune from it, before anything trains (found from outside: trained 0.5 kimg, then discarded).
    given = ["train", "--preset", "digits", *SMALL, "model.options.g_sn=true", "--run-dir", str(tmp_path / "ft")]
    assert main([*given, f"train.init_from={run}"]) == 2
    err = capsys.readouterr().err
    assert "cannot fine-tune from" in err and f"its {key} holds NaN or infinite values" in err
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_skipped_steps_are_said_at_the_1st_10th_and_100th_and_counted_at_the_end(tmp_path, capsys):
    argv = [
        "train",
        "--preset",
        "digits",
        *SMALL,
        "train.batch=8",
        "train.kimg=0.096",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    # 12 steps of each, every one skipped (a rate no network survives; the skip limit off)
    assert main([*argv, "train.g_lr=1e36", "train.d_lr=1e36", "train.skip_limit=1.0", "sample.every_kimg=0"]) == 0
    out = capsys.readouterr()
    said = [line.split("warning: ")[1] for line in out.err.splitlines() if "not finite" in line]
    assert said == [
        "G step 1 skipped: its loss or gradients are not finite",
        "D step 2 skipped: its loss or gradients are not finite",
        "G step 10 skipped: its loss or gradients are not finite (10 skipped so far)",
        "D step 11 skipped: its loss or gradients are not finite (10 skipped so far)",
        "12 of its 12 G steps and 11 of its 12 D steps were skipped: their loss or gradients were not finite",
    ], out.err
    assert out.out.splitlines()[-1].startswith("Done: ")
