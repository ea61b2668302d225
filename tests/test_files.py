"""bigbatch.files' atomic writes in a folder other users may write to (such as /tmp): nothing is written through a
link planted at a temporary file's predictable name."""

from __future__ import annotations

import os

import pytest

from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write


def test_a_link_at_the_temporary_name_is_refused_and_its_file_kept(tmp_path):
    # Found by review: a link another user planted at .NAME.tmp-PID had the write land in the file it points to.
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    link = tmp_path / f".out.txt.tmp-{os.getpid()}"
    link.symlink_to(victim)
    with pytest.raises(BigbatchError, match=f"{link} is in the way of a file bigbatch writes") as e:
        atomic_write(tmp_path / "out.txt", "new")
    assert "\n" not in str(e.value)
    assert victim.read_text() == "mine" and not (tmp_path / "out.txt").exists()
    link.unlink()
    link.symlink_to(tmp_path / "not-there")  # (a dangling link: followed, it would make the file it names)
    with pytest.raises(BigbatchError, match="is in the way"):
        atomic_write(tmp_path / "out.txt", "new")
    assert not (tmp_path / "not-there").exists()


def test_a_leftover_of_this_users_own_at_the_temporary_name_is_replaced(tmp_path):
    # (a killed process of the same PID, or an earlier try of this one: as before, it goes)
    (tmp_path / f".out.txt.tmp-{os.getpid()}").write_text("half")
    atomic_write(tmp_path / "out.txt", "new", sync=False)
    assert (tmp_path / "out.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
