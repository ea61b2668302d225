"""What a run writes beside its weights never costs it training: a sample sheet that cannot be written stops the run
with its weights saved where it stands; a crash in an evaluation leaves the sheets due with it drawn; a resume may
change what the previews draw (sample.*); a SIGTERM while `bigbatch train` imports torch is kept for its loop."""

import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

import bigbatch
from bigbatch import checkpoint_find
from bigbatch.rundir import Run


def same_weights(a, b) -> bool:
    a, b = checkpoint_find.find_checkpoint(a), checkpoint_find.find_checkpoint(b)
    for net in ("G", "D", "G_ema"):
        mine, theirs = load_file(a / f"{net}.safetensors"), load_file(b / f"{net}.safetensors")
        if mine.keys() != theirs.keys() or not all(mine[k].equal(theirs[k]) for k in mine):
            return False
    return True


def read_only_at_256(monkeypatch, checkpoints: bool, sheet: str) -> None:
    """Run.write_previews failing at 256 images as a read-only file system fails it (naming `sheet`): the regular
    sheets' write, or (`checkpoints`) a checkpoint's; a resume's drawing of those missing is left alone."""
    write = Run.write_previews

    def read_only(self, task, nimg, at_checkpoint, missing=False):
        if nimg == 256 and at_checkpoint == checkpoints and not missing:
            raise OSError(30, "Read-only file system", str(self.path / "samples" / sheet))
        return write(self, task, nimg, at_checkpoint, missing)

    monkeypatch.setattr(Run, "write_previews", read_only)


@pytest.mark.parametrize("every_kimg", [0.512, 0.256])  # (no checkpoint due at the failed sheet; one due with it)
def test_a_sheet_that_cannot_be_written_stops_the_run_saved_where_it_stands(tiny, tmp_path, monkeypatch, every_kimg):
    cfg = tiny.override({"sample.every_kimg": 0.128, "checkpoint.every_kimg": every_kimg})
    read_only_at_256(monkeypatch, checkpoints=False, sheet="grid-000000.256.png")
    with pytest.raises(bigbatch.BigbatchError) as failed:
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    said = str(failed.value)
    assert said.startswith("[Errno 30] Read-only file system") and "; saved " in said, said
    assert f"continue with: bigbatch train --run-dir {tmp_path / 'r'} --resume" in said
    assert checkpoint_find.find_checkpoint(tmp_path / "r").name == "000000.256"
    monkeypatch.undo()
    bigbatch.train(cfg, run_dir=tmp_path / "r", resume=True, quiet=True)
    assert same_weights(tmp_path / "r", bigbatch.train(cfg, run_dir=tmp_path / "alone", quiet=True))
    # Every sheet the run left alone drew, the one that failed too (drawn by the resume), and the stop's checkpoint's.
    drawn, alone = ({p.name for p in (tmp_path / run / "samples").iterdir()} for run in ("r", "alone"))
    assert "grid-000000.256.png" in drawn and drawn - alone <= {"classes-000000.256.png", "interp-000000.256.png"}
    assert alone <= drawn


def test_a_checkpoints_sheet_that_cannot_be_written_says_how_the_run_goes_on(tiny, tmp_path, monkeypatch):
    # Found from outside: the error alone, where a sheet of the regular cadence said the checkpoint and the command.
    cfg = tiny.override({"sample.every_kimg": 0.512, "checkpoint.every_kimg": 0.256})
    read_only_at_256(monkeypatch, checkpoints=True, sheet="classes-000000.256.png")
    with pytest.raises(bigbatch.BigbatchError) as failed:
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    said = str(failed.value)
    assert said.startswith("[Errno 30] Read-only file system") and "000000.256. Once it writes again" in said, said
    assert f"bigbatch train --run-dir {tmp_path / 'r'} --resume" in said, said
    monkeypatch.undo()
    bigbatch.train(cfg, run_dir=tmp_path / "r", resume=True, quiet=True)
    assert (tmp_path / "r" / "samples" / "classes-000000.256.png").is_file()  # (drawn by the resume)


def test_a_crash_in_an_evaluation_leaves_the_sheets_due_with_it_drawn(tiny, tmp_path, monkeypatch):
    from bigbatch.tasks.gan.scorer import Scorer

    class Crashed(Exception):
        """Stands for the process dying: nothing after it runs."""

    def crash(self, *args, **kwargs):
        raise Crashed

    cfg = tiny.override(
        {
            "eval.every_kimg": 0.256,
            "eval.metrics": "fid",
            "eval.extractor": "classifier",
            "eval.classifier": {"steps": 5, "width": 8, "resolution": 16},
            "eval.n": 40,
            "eval.reference_n": 80,
        }
    )
    monkeypatch.setattr(Scorer, "__call__", crash)
    with pytest.raises(Crashed):
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    drawn = sorted(p.name for p in (tmp_path / "r" / "samples").glob("*-000000.256.png"))
    assert drawn == ["classes-000000.256.png", "grid-000000.256.png", "interp-000000.256.png"]


def test_a_resume_may_change_what_the_previews_draw(tiny, tmp_path):
    from PIL import Image

    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "r", quiet=True)
    changed = {"train.kimg": 0.512, "sample.n": 8, "sample.seed": 3, "sample.truncation": 1.5}
    bigbatch.train(tiny.override(changed), run_dir=run, resume=True, quiet=True)
    assert checkpoint_find.find_checkpoint(run).name == "000000.512"
    before, after = (Image.open(run / "samples" / f"grid-000000.{k}.png").size for k in (256, 512))
    assert before[0] == after[0] and before[1] > after[1]  # (sample.n 16, two rows of 8; then 8, one row)


def test_a_sigterm_while_bigbatch_train_imports_torch_is_kept_for_its_loop(tmp_path):
    # The command is held in its import of torch (a finder on sys.meta_path, set up by sitecustomize) until the
    # signal has come: deterministic, where a sleep would race the start-up.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "class Hold:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            sys.meta_path.remove(self)\n"
        "            open(os.environ['HELD'], 'w').close()\n"
        "            while not os.path.exists(os.environ['GO']):\n"
        "                time.sleep(0.01)\n"
        "sys.meta_path.insert(0, Hold())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), *sys.path]), "OMP_NUM_THREADS": "1"}
    env |= {"HELD": str(tmp_path / "held"), "GO": str(tmp_path / "go")}
    args = ["--preset", "digits", "data.resolution=16", "model.ch=8", "train.kimg=0.512", "--run-dir", "r"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bigbatch", "train", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "held").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # (its handler runs between the held import's sleeps)
    (tmp_path / "go").touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (proc.returncode, err[-3000:])  # (it died of the signal: -15)
    assert "Stopped by signal; saved r/checkpoints/000000.000. Continue with: bigbatch train --run-dir r" in out


def test_a_folder_that_is_not_this_runs_is_said_so(tiny, tmp_path):
    # Found from outside: a new run's rows were appended to a folder's own metrics.jsonl; a classifier's checkpoint
    # copied into a GAN run was "a config that differs: drop the override", where none was given.
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "metrics.jsonl").write_text('{"x": 1}\n')
    for resume in (False, "auto"):
        with pytest.raises(bigbatch.BigbatchError, match=r"foreign holds a metrics.jsonl but no run \(no config.toml"):
            bigbatch.train(tiny, run_dir=tmp_path / "foreign", resume=resume, quiet=True)
    assert (tmp_path / "foreign" / "metrics.jsonl").read_text() == '{"x": 1}\n'
    from test_classify import tiny as classifier

    gan = bigbatch.train(tiny.override({"train.kimg": 0.128}), run_dir=tmp_path / "gan", quiet=True)
    other = bigbatch.train(classifier(**{"train.kimg": 0.064}), run_dir=tmp_path / "cls", quiet=True)
    copied = gan / "checkpoints" / "000000.600"
    checkpoint_find.find_checkpoint(other).rename(copied)
    (gan / "checkpoints" / "latest").write_text("000000.600\n")
    with pytest.raises(bigbatch.BigbatchError) as refused:
        bigbatch.train(tiny.override({"train.kimg": 0.7}), run_dir=gan, resume=True, quiet=True)
    assert str(refused.value) == (
        f"checkpoint {copied} was trained as a classify run, and this run is a gan one: it was copied in from another "
        "run; remove it from this run's checkpoints"
    )
    (gan / "checkpoints" / "latest").write_text("000000.128\n")  # (its own again: the config given is another's)
    with pytest.raises(bigbatch.BigbatchError, match="trained as a gan run, and the config given is a classify one"):
        bigbatch.train(classifier(**{"train.kimg": 0.7}), run_dir=gan, resume=True, quiet=True)


def test_a_resume_with_nothing_to_train_sweeps_the_checkpoints_killed_saves_left(tiny, tmp_path):
    # Found from outside: a prune killed midway left a whole checkpoint (GBs of BigGAN's), which only a save swept.
    cfg = tiny.override({"train.kimg": 0.064, "checkpoint.every_kimg": 0.064, "sample.every_kimg": 0})
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    left = [run / "checkpoints" / f".pruned-000000.032-{dead.pid}", run / "checkpoints" / f".tmp-000000.096-{dead.pid}"]
    for folder in left:
        folder.mkdir()
        (folder / "G.safetensors").write_bytes(b"half")
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)  # (nothing to train: no save)
    assert not any(folder.exists() for folder in left)
