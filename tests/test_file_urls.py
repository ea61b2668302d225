"""A file: URL names its local path wherever a path is given, in every form RFC 8089 and fsspec take (found from
outside: file:/abs and file://localhost/abs made folders named file: in the working folder, data paths took fewer
forms than run directories, and a run given as file:///abs was "file:/abs does not exist" to every command reading it).
"""

from pathlib import Path

import pytest

import bigbatch
from bigbatch.cli import main
from bigbatch.urls import Location, file_path


def test_each_form_is_its_path_and_another_hosts_is_one_line():
    for url, path in (
        ("file:///a/b%201", "/a/b 1"),
        ("file:///runs/exp#2?", "/runs/exp#2?"),  # (a file's name may hold them: urlsplit cut them off)
        ("file://localhost/a/", "/a/"),
        ("FILE:/a", "/a"),
        ("runs:v2", "runs:v2"),  # (a local name may hold a colon)
        ("s3://b/k", "s3://b/k"),
    ):
        assert file_path(url) == path, url
    for url, said in (("file://otherhost/a", "names the host otherhost"), ("file:a", "is not of an absolute path")):
        with pytest.raises(bigbatch.BigbatchError, match=f"^{url} {said}: give a path on this machine"):
            file_path(url)
    with pytest.raises(bigbatch.BigbatchError) as e:
        file_path("file://user:secret@host/a")
    assert "secret" not in str(e.value)
    assert Location.of("file://localhost/x/d.h5").path == Path("/x/d.h5")  # (a data path: ./localhost/x/d.h5 was read)


def test_commands_read_and_write_a_run_given_as_a_file_url(tiny, tmp_path, capsys):
    run = bigbatch.train(
        tiny.override({"train.kimg": 0.032, "sample.every_kimg": 0}), run_dir=tmp_path / "r", quiet=True
    )
    assert main(["info", f"file://{run}"]) == 0 and f"run         {run}\n" in capsys.readouterr().out
    assert main(["sample", f"file://localhost{run}", "--n", "4", "--out", f"file:{tmp_path / 's.png'}"]) == 0
    assert (tmp_path / "s.png").is_file()
    assert main(["plot", f"FILE://{run}", "--out", str(tmp_path / "p.png")]) == 0
    assert main(["stop", f"file://host{run}"]) == 2
    assert capsys.readouterr().err.endswith(f"file://host{run} names the host host: give a path on this machine "
                                            "(file:///abs/path, or the path itself)\n")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "r", "s.png"]  # (no folder named file:)


def test_a_sweep_files_own_arguments_are_its_own(tmp_path, capsys):
    # Found by review: file: arguments meant for the sweep file were parsed (and refused) by bigbatch.
    script = tmp_path / "grid.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    assert main(["sweep", str(script), "file:cache", "file://nas/share"]) == 0
    assert capsys.readouterr().out == "['file:cache', 'file://nas/share']\n"
