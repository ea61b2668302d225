"""`bigbatch enhance`: DeepFaceLab's faceset enhancer without DFL. Each aligned face goes through DFL's FaceEnhancer
at 4x and back to its size and is written with its metadata as it was; a rerun keeps what was done, and
--in-place puts the faces over their originals as DFL's merge answer does."""

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from test_dfl_faces import dfl_jpeg, face_image, landmarks

from bigbatch.cli import main
from bigbatch.data.dfl_faces import read_metadata
from bigbatch.faces.enhance import enhance_folder, load_enhancer
from bigbatch.models import dfl
from bigbatch.models.face_enhancer import FaceEnhancer, enhance


def faces_and_weights(root: Path, n: int = 3, seed: int = 0) -> tuple[Path, Path]:
    folder = root / "aligned"
    folder.mkdir()
    for i in range(n):
        meta = {"face_type": "whole_face", "landmarks": landmarks(seed=i), "source_filename": f"{i:05d}.png"}
        meta["seg_ie_polys"] = {"polys": [{"type": 1, "pts": np.float32([[10, 10], [200, 20], [100, 200]])}]}
        image = cv2.GaussianBlur(face_image(256, seed=i), (9, 9), 3)  # (a soft face: the enhancer sharpens it)
        (folder / f"{i:05d}.jpg").write_bytes(dfl_jpeg(image, meta))
    (folder / "notes.jpg").write_bytes(cv2.imencode(".jpg", face_image(64))[1].tobytes())  # (no metadata)
    facelib = root / "facelib"
    facelib.mkdir()
    torch.manual_seed(seed)
    dfl.write_weights(facelib / "FaceEnhancer.npy", dfl.export_part(FaceEnhancer(width=0.125)))
    return folder, facelib


def plain(x):
    """Metadata as plain lists and dicts (arrays as lists), to compare."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return x.tolist() if isinstance(x, np.ndarray | np.generic) else x


def same(a: dict, b: dict) -> bool:
    return plain(a) == plain(b)


def interrupted_in_place(folder: Path, facelib: Path) -> None:
    """An in-place enhance of `folder` interrupted (Ctrl-C) at the second of its moves back over the faces."""
    real_replace, calls = os.replace, []

    def stop_after_one(a, b):
        if Path(b).parent == folder and not Path(b).name.startswith("."):
            calls.append(a)
            if len(calls) > 1:
                raise KeyboardInterrupt
        real_replace(a, b)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", stop_after_one)
        with pytest.raises(KeyboardInterrupt):
            enhance_folder(folder, facelib, in_place=True)


def test_enhance_runs_dfls_enhancer_over_each_face_and_keeps_its_metadata(tmp_path, capsys):
    folder, facelib = faces_and_weights(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["enhance", str(folder), "--weights", str(facelib), "--device", "cpu"]) == 0
    out = tmp_path / "aligned_enhanced"  # DFL's folder
    said = capsys.readouterr()
    assert f"Enhanced 3 faces of {folder} into {out}\n" in said.out and "notes.jpg" in said.err
    model = load_enhancer(facelib, "cpu")
    for name in ("00000.jpg", "00002.jpg"):
        data = (out / name).read_bytes()
        assert same(read_metadata(data), read_metadata(before[name]))  # landmarks, labels: as they were
        got = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).astype(np.float64)
        source = cv2.imdecode(np.frombuffer(before[name], np.uint8), cv2.IMREAD_COLOR).astype(np.float32) / 255
        want = np.clip(enhance(model, source, preserve_size=True) * 255, 0, 255).astype(np.uint8)
        assert got.shape == want.shape == (256, 256, 3) and np.abs(got - want).mean() < 1.0  # (JPEG of quality 100)
        assert np.abs(got - source * 255).mean() > 2  # (it did something)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the faces themselves untouched

    # A rerun keeps what was done and redoes what changed since: here two faces swapped names (found by review:
    # the old enhanced copies went over the new faces), and one face's output was lost (as if killed before it).
    stamp = (out / "00001.jpg").stat().st_mtime_ns
    (out / "00002.jpg").unlink()
    os.replace(folder / "00000.jpg", folder / "swap.tmp")
    os.replace(folder / "00001.jpg", folder / "00000.jpg")
    os.replace(folder / "swap.tmp", folder / "00001.jpg")
    (folder / "00001.jpg").touch()  # (a rename keeps the time: sort's renames are caught by the size, or by this)
    os.utime(folder / "00000.jpg", ns=(stamp, stamp + 1))
    source = {n: read_metadata((folder / n).read_bytes())["source_filename"] for n in ("00000.jpg", "00001.jpg")}

    # In place, interrupted while moving the faces back: a rerun without --in-place is refused, with it it finishes.
    interrupted_in_place(folder, facelib)
    assert main(["enhance", str(folder), "--weights", str(facelib)]) == 2
    assert "stopped while moving its faces back" in capsys.readouterr().err
    assert main(["enhance", str(folder), "--weights", str(facelib), "--in-place"]) == 0
    assert "Moved the 2 enhanced faces left over those of" in capsys.readouterr().out
    assert not out.exists()
    for name in ("00000.jpg", "00001.jpg", "00002.jpg"):
        data = (folder / name).read_bytes()
        assert data != before[name] and read_metadata(data)["source_filename"] == source.get(name, "00002.png")


def test_enhance_takes_any_jpeg_name_and_the_current_folder(tmp_path, monkeypatch, capsys):
    folder, facelib = faces_and_weights(tmp_path, n=2)
    os.replace(folder / "00001.jpg", folder / "00001.JPG")  # (found by review: left behind, then deleted)
    before = (folder / "00001.JPG").read_bytes()
    monkeypatch.chdir(folder)
    assert main(["enhance", ".", "--weights", str(facelib), "--in-place"]) == 0  # (".": found by review)
    assert "Enhanced 2 faces of . in place" in capsys.readouterr().out
    assert (folder / "00001.JPG").read_bytes() != before and not (tmp_path / "aligned_enhanced").exists()


def test_enhance_redoes_faces_of_other_weights_and_never_deletes_what_it_did_not_write(tmp_path, capsys):
    folder, facelib = faces_and_weights(tmp_path, n=1)
    out = tmp_path / "mine"
    assert main(["enhance", str(folder), "--weights", str(facelib), "--out", str(out)]) == 0
    first = (out / "00000.jpg").read_bytes()
    capsys.readouterr()  # (a rerun of nothing new says so: found from outside, "Enhanced 1 faces")
    assert main(["enhance", str(folder), "--weights", str(facelib), "--out", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"into {out} (1 of them kept from an earlier run)\n")
    torch.manual_seed(1)
    dfl.write_weights(facelib / "FaceEnhancer.npy", dfl.export_part(FaceEnhancer(width=0.125)))
    assert main(["enhance", str(folder), "--weights", str(facelib), "--out", str(out)]) == 0
    assert (out / "00000.jpg").read_bytes() != first  # (other weights: done again)
    other = tmp_path / "other"
    other.mkdir()
    (other / "00000.jpg").write_bytes(b"the user's own")
    capsys.readouterr()
    for args, says in [
        (["--out", str(other)], "already holds faces named as those of"),
        (["--out", str(folder)], "is FACES itself: give --in-place"),
        (["--out", str(out), "--in-place"], "give one of them"),
        (["--weights", str(tmp_path)], "holds no FaceEnhancer.npy"),
    ]:
        weights = [] if "--weights" in args else ["--weights", str(facelib)]
        assert main(["enhance", str(folder), *weights, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
    assert (other / "00000.jpg").read_bytes() == b"the user's own"


def test_an_interrupted_in_place_run_finished_after_a_sort_leaves_the_stale_copies_out_of_the_faces(tmp_path, capsys):
    # Found from outside: after `sort` renamed the faces between an interrupted in-place run and its rerun, the
    # rerun moved the enhanced copies back under the old names, beside the renamed faces: each face twice.
    folder, facelib = faces_and_weights(tmp_path, n=3)
    interrupted_in_place(folder, facelib)
    for i, face in enumerate(sorted(folder.glob("0*.jpg"))):  # as sort renames them
        os.replace(face, folder / f"sorted{i}.jpg")
    assert main(["enhance", str(folder), "--weights", str(facelib), "--in-place"]) == 0
    out, err = capsys.readouterr()
    assert "Moved the 0 enhanced faces left over those of" in out
    assert "2 enhanced faces were left in " in err and "their originals were renamed, changed or deleted" in err
    assert sorted(p.name for p in folder.glob("*.jpg")) == ["notes.jpg", "sorted0.jpg", "sorted1.jpg", "sorted2.jpg"]
    (aside,) = (tmp_path / "aligned_enhanced").glob("left-*")  # (kept, nothing lost; out of the next run's way)
    assert len(list(aside.glob("*.jpg"))) == 2 and str(aside) in err
    assert main(["enhance", str(folder), "--weights", str(facelib), "--in-place"]) == 0  # (review: it was refused)
    # A folder of no aligned face: refused, and no folder left behind holding the record alone.
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(cv2.imencode(".jpg", face_image(64))[1].tobytes())
    for in_place in ([], ["--in-place"]):
        assert main(["enhance", str(tmp_path / "photos"), "--weights", str(facelib), *in_place]) == 2
        assert not (tmp_path / "photos_enhanced").exists()


def test_a_stopped_enhance_keeps_each_face_it_wrote_and_never_replaces_one_it_did_not(tmp_path, capsys):
    # Found from outside: a file of the user's own in an output folder an earlier enhance had recorded was replaced;
    # faces written before a stop (the record kept every 10 s) were enhanced again.
    from bigbatch.faces import enhance as module

    folder, facelib = faces_and_weights(tmp_path, n=3)
    out, real, calls = tmp_path / "out", module._enhanced, []

    def stop_at_the_third(model, path):
        calls.append(path.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(model, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_enhanced", stop_at_the_third)
        with pytest.raises(KeyboardInterrupt):
            enhance_folder(folder, facelib, out=out)
    kept = {p.name: p.read_bytes() for p in out.glob("0*.jpg")}
    assert sorted(kept) == ["00000.jpg", "00001.jpg"]
    calls.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_enhanced", lambda model, path: calls.append(path.name) or real(model, path))
        assert enhance_folder(folder, facelib, out=out).done == 3
    assert calls == ["00002.jpg", "notes.jpg"] and all((out / n).read_bytes() == b for n, b in kept.items())
    # A face begun and never ended (its write stopped), and a line cut short by the stop: that face done again.
    (out / "00001.jpg").write_bytes(b"half")
    (out / ".enhance.journal").write_text('{"started": "00001.jpg"}\n{}\n{"finis')
    calls.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "_enhanced", lambda model, path: calls.append(path.name) or real(model, path))
        enhance_folder(folder, facelib, out=out)
    assert calls == ["00001.jpg", "notes.jpg"] and (out / "00001.jpg").read_bytes() == kept["00001.jpg"]
    (folder / "00009.jpg").write_bytes((folder / "00000.jpg").read_bytes())  # a new face, named as a file of yours
    (out / "00009.jpg").write_bytes(b"the user's own")
    assert main(["enhance", str(folder), "--weights", str(facelib), "--out", str(out)]) == 2
    assert "already holds faces named as those of" in capsys.readouterr().err
    assert (out / "00009.jpg").read_bytes() == b"the user's own"
