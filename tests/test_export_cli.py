"""`bigbatch export`'s file: its format as its name says, never over a file that came while it was made, and
where it came from named wherever the file goes."""

import json

import pytest
import torch

import bigbatch
from bigbatch import export as export_module
from bigbatch.cli import main
from bigbatch.provenance import code_version


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "model.ch": 8, "model.dim_z": 16, "train.kimg": 0.064, "train.batch": 32}
    )
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("export") / "run", quiet=True)


def test_a_file_named_for_another_format_is_refused(run, tmp_path, capsys):
    for name, fmt, words in [
        ("m.dfm", "onnx", "--format onnx writes no .dfm file: name OUT for its format (.dfm is dfm's)"),
        ("m.onnx", "torchscript", "--format torchscript writes no .onnx file"),
        ("m.pt", "pt2", "--format pt2 writes no .pt file"),
    ]:
        assert main(["export", str(run), str(tmp_path / name), "--format", fmt]) == 2
        assert words in capsys.readouterr().err and not (tmp_path / name).exists()
    assert main(["export", str(run), str(tmp_path / "G.safetensors")]) == 2
    assert "a run's weights are safetensors already, in RUN/checkpoints/KIMG/" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "m.omnx")]) == 2  # (found from outside: written as TorchScript)
    assert ".omnx names no format export writes: name it .pt (TorchScript)" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "m.pt"), "--format", "TorchScript"]) == 0  # (any case)
    (tmp_path / "f.pt").write_text("a file")
    assert main(["export", str(run), str(tmp_path / "f.pt" / "m.pt")]) == 2
    assert "a file is in the way of its folder" in capsys.readouterr().err
    # Found from outside: OUT/ was written as a file named OUT, and .onnx (no suffix to os.path) as TorchScript.
    assert main(["export", str(run), f"{tmp_path / 'new'}/"]) == 2
    assert "names a folder; export writes one file: name it, e.g. " in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / ".onnx")]) == 2
    assert ".onnx: give the file a name before its suffix, e.g. model.onnx" in capsys.readouterr().err
    # ... and --overwrite replaced the run's checkpoints/latest with the export.
    assert main(["export", str(run), str(run / "checkpoints" / "latest"), "--overwrite"]) == 2
    assert "is inside a run's checkpoints folder: write the export elsewhere" in capsys.readouterr().err
    assert not any((tmp_path / n).exists() for n in ("new", ".onnx")) and (run / "checkpoints" / "latest").is_file()
    assert len((run / "checkpoints" / "latest").read_text()) < 100  # (still the name of a checkpoint)


def test_a_file_that_came_while_the_export_ran_stays(run, tmp_path, monkeypatch, capsys):
    # Found from outside: it was checked for before the export (seconds, for ONNX), and replaced after.
    out = tmp_path / "m.pt"
    made = export_module._torchscript

    def meanwhile(d):
        data = made(d)
        out.write_text("another's file")
        return data

    monkeypatch.setattr(export_module, "_torchscript", meanwhile)
    assert main(["export", str(run), str(out)]) == 2
    assert f"{out} exists: give --overwrite to replace it" in capsys.readouterr().err
    assert out.read_text() == "another's file" and [p.name for p in tmp_path.iterdir()] == ["m.pt"]
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    extra = {"bigbatch.json": ""}
    torch.jit.load(str(out), _extra_files=extra)
    said = json.loads(extra["bigbatch.json"])["checkpoint"]  # (by the run's name: not as typed, no home folder)
    assert said.startswith(f"{run.resolve().name}/checkpoints/") and "/tmp" not in said, said


def test_a_file_system_without_hard_links_still_takes_a_new_file(tmp_path, monkeypatch):
    # (FUSE mounts answer link() with ENOSYS: found by review, an export failed there)
    import errno
    import os

    from bigbatch.files import atomic_write

    def no_links(src, dst):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "link", no_links)
    atomic_write(tmp_path / "new.pt", b"made", replace=False)
    assert (tmp_path / "new.pt").read_bytes() == b"made"
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "new.pt", b"again", replace=False)
    assert (tmp_path / "new.pt").read_bytes() == b"made" and [p.name for p in tmp_path.iterdir()] == ["new.pt"]


def test_info_of_an_exported_file_says_its_settings_read_without_its_code(run, tmp_path, capsys):
    # Found from outside: "neither a run directory nor a checkpoint folder", with no word of what info reads.
    for name in ("m.pt", "m.onnx"):
        assert main(["export", str(run), str(tmp_path / name)]) == 0
        capsys.readouterr()
        assert main(["info", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert f"export      {tmp_path / name}\ntask        gan\nmodel       dcgan\n" in out, out
        assert "class_names 0, 1, 2, 3, 4, 5" in out and "kimg        0.064\n" in out and "resolution  16\n" in out
        assert f"bigbatch    {code_version()}\n" in out  # (the code that exported it, as a checkpoint's meta.json)
    # Exported again, the same bytes, with no path of this machine (found from outside: the exporter's stack traces
    # and objects' addresses in every node)
    assert main(["export", str(run), str(tmp_path / "again.onnx")]) == 0
    onnx = (tmp_path / "m.onnx").read_bytes()
    assert (tmp_path / "again.onnx").read_bytes() == onnx and b"site-packages" not in onnx and b" at 0x" not in onnx
    # An exported file where a run is read: what it is and where to go (found from outside: "neither a run directory
    # nor a checkpoint folder", and eval's "a single file; give a folder of images")
    for command in (["sample", str(tmp_path / "m.pt")], ["eval", str(tmp_path / "m.onnx"), "builtin:digits"]):
        assert main(command) == 2
        assert "is a model file, not a run: give the run it was exported from" in capsys.readouterr().err, command
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pth")  # (a zip too, holding no settings)
    assert main(["info", str(tmp_path / "weights.pth")]) == 2
    assert "is none of what info reads: a run directory, one of its" in capsys.readouterr().err
    # An export cut short is said to be (found from outside: "none of what info reads").
    (tmp_path / "cut.onnx").write_bytes((tmp_path / "m.onnx").read_bytes()[:3000])
    assert main(["info", str(tmp_path / "cut.onnx")]) == 2
    assert "holds no settings of a bigbatch export (cut short or damaged" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "m.pt"), "--verify"]) == 2


@pytest.fixture(scope="module")
def stylegan_run(tmp_path_factory):
    cfg = bigbatch.preset("stylegan2_cifar").override(
        {"data.path": "builtin:digits", "data.resolution": 16, "model.ch": 2, "model.dim_z": 16, "train.batch": 8}
    )
    cfg = cfg.override({"train.kimg": 0.008, "eval.every_kimg": 0, "sample.every_kimg": 0})
    return bigbatch.train(cfg, run_dir=tmp_path_factory.mktemp("export") / "sg", quiet=True)


@pytest.mark.parametrize("which", ["run", "stylegan_run"])
def test_a_class_out_of_range_is_refused_by_every_format(which, request, tmp_path):
    # Found from outside: ONNX took class -1 and gave a mix of two classes' images (its one-hot of -1 nothing, its
    # conditional gains wrapped to the last class); TorchScript refused it. A G of one-hot classes (StyleGAN2's) took
    # 10 too (found by review).
    import onnxruntime

    run = request.getfixturevalue(which)
    z = torch.randn(2, 16)
    for name in ("g.pt", "g.pt2", "g.onnx"):
        assert main(["export", str(run), str(tmp_path / name)]) == 0
    script, exported = torch.jit.load(str(tmp_path / "g.pt")), torch.export.load(str(tmp_path / "g.pt2")).module()
    session = onnxruntime.InferenceSession(str(tmp_path / "g.onnx"))  # (each loaded once: loads took most of it)
    runs = {
        "g.pt": lambda y: script(z, y),
        "g.pt2": lambda y: exported(z, y),
        "g.onnx": lambda y: session.run(None, {"z": z.numpy(), "y": y.numpy()}),
    }
    for call in runs.values():
        call(torch.tensor([0, 9]))
        for bad in (-1, 10):
            with pytest.raises(Exception):  # noqa: B017 -- each runtime's own error
                call(torch.tensor([0, bad]))
