"""A DFL-style workspace copied, moved or touched: extract goes on from its journal, the video known by its bytes
(found from outside: a touched video or a copied workspace refused its own faces, and the advice led to a second
refusal)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("dlib")
pytest.importorskip("av")
pytest.importorskip("skimage")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _faces  # noqa: E402

from bigbatch.cli import main  # noqa: E402

ARGS = ["--workers", "1", "--size", "256", "--min-face", "32", "--no-debug", "--no-second-pass"]


def test_extract_goes_on_in_a_copied_workspace_and_after_a_touch(capsys):
    Path("ws").mkdir()
    _faces.write_video(Path("ws/clip.mp4"), 3, 320, 240)
    assert main(["extract", "ws/clip.mp4", "ws/aligned", *ARGS]) == 0
    # `info` of the faces says what they are (found from outside: "neither a run directory nor a checkpoint folder")
    Path("ws/aligned/notes.jpg").write_bytes(b"not a face")
    capsys.readouterr()
    assert main(["info", "ws/aligned"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("faces       3 aligned faces (DeepFaceLab's) in ws/aligned; 1 JPEG without its metadata")
    assert "face type   whole_face (wf) 3\nsize        256px 3\nxseg        0 with labels" in said
    assert f"source      extracted from {Path('ws/clip.mp4').resolve()} by bigbatch extract (face_type " in said
    Path("ws/aligned/notes.jpg").unlink()
    assert main(["info", "ws"]) == 2  # (no face there: what it says of any folder)
    assert "is neither a run directory nor a checkpoint folder" in capsys.readouterr().err
    # The workspace copied elsewhere (new times for every file), its extract cut short before the last frame.
    shutil.copytree("ws", "copy", copy_function=shutil.copy)
    journal = Path("copy/aligned/.extract.jsonl")
    lines = journal.read_text().splitlines()
    last = json.loads(lines[-1])["frame"]
    journal.write_text("".join(f"{line}\n" for line in lines[:-1]))
    for face in Path("copy/aligned").glob(f"{Path(last).stem}_*.jpg"):
        face.unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in Path("copy/aligned").glob("*.jpg")}
    capsys.readouterr()
    assert main(["extract", "copy/clip.mp4", "copy/aligned", *ARGS]) == 0, capsys.readouterr().err
    faces = {p.name: p.stat().st_mtime_ns for p in Path("copy/aligned").glob("*.jpg")}
    assert sorted(faces) == sorted(p.name for p in Path("ws/aligned").glob("*.jpg"))  # the last frame's face made
    assert all(faces[name] == t for name, t in kept.items())  # the others kept, not extracted again
    assert json.loads(journal.read_text().splitlines()[0])["source"]["path"] == str(Path("copy/clip.mp4").resolve())
    # The video touched: the same bytes, nothing to do.
    os.utime("copy/clip.mp4", ns=(1, 1))
    assert main(["extract", "copy/clip.mp4", "copy/aligned", *ARGS]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in Path("copy/aligned").glob("*.jpg")} == faces
    # Other bytes at the same path: refused, and the advice given leads to an extract that runs.
    _faces.write_video(Path("copy/clip.mp4"), 3, 320, 240, seed=3)
    capsys.readouterr()
    assert main(["extract", "copy/clip.mp4", "copy/aligned", *ARGS]) == 2
    err = capsys.readouterr().err
    assert "an earlier version of" in err and "(or empty copy/aligned, .extract.jsonl too," in err, err
    for path in Path("copy/aligned").iterdir():
        path.unlink()
    assert main(["extract", "copy/clip.mp4", "copy/aligned", *ARGS]) == 0
