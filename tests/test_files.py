"""bigbatch.files' atomic writes in a folder other users may write to (such as /tmp): nothing is written through a
link planted at a temporary file's predictable name."""

from __future__ import annotations

import os

import pytest

from bigbatch.errors import BigbatchError
from bigbatch.files import STALE_S, atomic_write, temp_name


def test_a_link_at_the_temporary_name_is_refused_and_its_file_kept(tmp_path):
    # Found by review: a link another user planted at .NAME.tmp-PID had the write land in the file it points to.
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    link = temp_name(tmp_path / "out.txt")
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
    (temp_name(tmp_path / "out.txt")).write_text("half")
    atomic_write(tmp_path / "out.txt", "new", sync=False)
    assert (tmp_path / "out.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_leftover_showing_another_owner_is_this_users_where_no_one_else_may_write(tmp_path):
    # Found by review: on root-squashed or id-mapped NFS one's own files show another owner, and a same-PID leftover
    # (containers reuse low PIDs) was refused; in a folder only its owner may write, it is one's own.
    tmp_path.chmod(0o755)
    leftover = temp_name(tmp_path / "out.txt")
    leftover.write_text("half")
    os.chown(leftover, 65534, 65534)
    atomic_write(tmp_path / "out.txt", "new", sync=False)
    assert (tmp_path / "out.txt").read_text() == "new" and not leftover.exists()
    tmp_path.chmod(0o1777)  # (a folder others may write, such as /tmp: another user's file there is theirs)
    leftover.write_text("theirs")
    os.chown(leftover, 65534, 65534)
    with pytest.raises(BigbatchError, match="is in the way"):
        atomic_write(tmp_path / "out.txt", "new")
    assert leftover.read_text() == "theirs"


def test_a_link_of_ones_own_is_written_through_where_asked_and_replaced_elsewhere(tmp_path):
    # Found from outside: xseg apply made a face linked from another folder a copy, the face it linked to left without
    # its mask (DFL's save writes through the link). Asked, one hop of one's own link is followed; a link to a link is
    # not (a name along a chain may be one others can replace), nor, unasked, any link (a run's output over a link
    # into a shared folder is its own file).
    (tmp_path / "faces").mkdir()
    (tmp_path / "faces" / "a.jpg").write_text("old")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "a.jpg").symlink_to(tmp_path / "faces" / "a.jpg")
    atomic_write(tmp_path / "linked" / "a.jpg", "new", sync=False, through_link=True)
    assert (tmp_path / "linked" / "a.jpg").is_symlink() and (tmp_path / "faces" / "a.jpg").read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "faces").iterdir()) == ["a.jpg"]  # (no temporary left)
    (tmp_path / "linked" / "b.jpg").symlink_to(tmp_path / "linked" / "a.jpg")  # (a link to a link: replaced)
    atomic_write(tmp_path / "linked" / "b.jpg", "b", sync=False, through_link=True)
    assert not (tmp_path / "linked" / "b.jpg").is_symlink() and (tmp_path / "faces" / "a.jpg").read_text() == "new"
    atomic_write(tmp_path / "linked" / "a.jpg", "mine", sync=False)
    assert not (tmp_path / "linked" / "a.jpg").is_symlink() and (tmp_path / "faces" / "a.jpg").read_text() == "new"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="lchown needs root")
def test_another_users_link_at_the_name_is_replaced_not_followed(tmp_path):
    # (in a folder others may write, a link planted at the very name must not redirect the write)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "out.txt").symlink_to(victim)
    os.lchown(tmp_path / "out.txt", 65534, 65534)
    atomic_write(tmp_path / "out.txt", "new", sync=False, through_link=True)
    assert victim.read_text() == "mine" and not (tmp_path / "out.txt").is_symlink()


def test_what_a_killed_writer_of_this_machine_left_in_the_folder_goes_with_the_next_write(tmp_path):
    # Found from outside: each `sample --npz` killed while it wrote left its temporary file (98 MB), which no later
    # command removed. Kept (found by review): a process's still writing, another machine's in a shared folder (its
    # PIDs are not this one's), and one changed within STALE_S (a container's of another PID namespace).
    import subprocess
    import sys
    import time

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    mine = temp_name(tmp_path / "s.npz").name.rpartition("-")[0]  # .s.npz.tmp-HOST
    killed, other = tmp_path / f"{mine}-{dead}", tmp_path / f".t.png{mine[6:]}-{dead}"
    fresh, writing = tmp_path / f".u.png{mine[6:]}-{dead}", tmp_path / f"{mine}-{os.getppid()}"
    elsewhere, huge = tmp_path / f".s.npz.tmp-otherhost-{dead}", tmp_path / f"{mine}-99999999999999"
    for leftover in (killed, other, fresh, writing, elsewhere, huge):
        leftover.write_bytes(b"half")
        if leftover != fresh:
            then = time.time() - 2 * STALE_S
            os.utime(leftover, (then, then))
    atomic_write(tmp_path / "s.npz", b"new")
    left = {fresh, writing, elsewhere, huge}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s.npz", *(p.name for p in left)])
