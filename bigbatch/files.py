"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one; the
temporary files of killed processes, found and removed; and a folder's lock, one writer at a time."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import math
import os
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from bigbatch.errors import BigbatchError, warn


def json_loads(text: str | bytes) -> Any:
    """json.loads, with a document nested too deep for Python's parser a ValueError as any other malformed one (found
    from outside: a meta.json, plan.json or metrics row of 200,000 brackets was a RecursionError's traceback)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to read") from None


def atomic_write(
    path: Path, data: bytes | str, sync: bool = True, replace: bool = True, through_link: bool = False
) -> None:
    """Write a file through a temporary sibling and a rename, so readers see the old or the new file (`sync`
    False: not fsynced first, for files written by the thousand: faces, frames). `replace` False: a file at `path`
    (one that came while this one was written too) stays, and FileExistsError is raised. `through_link`: a link of
    this user's own at `path` to a file (not to another link) is written through, as an edit in place of the file
    it names (xseg apply: found from outside, a linked face became a copy, the face it named without its mask), and
    the file keeps its permissions and owner (found from outside: faces edited as root were root's, and DFL's editor,
    the user's, could not save them); other names of it (hard links) keep it as it was, said."""
    path = Path(path)
    if not path.name:  # (found from outside: an empty OUT was a traceback)
        raise BigbatchError(f"cannot write {str(path)!r}: give a file name")
    if through_link and path.is_symlink() and os.lstat(path).st_uid == os.geteuid():  # (another's, as in /tmp: not)
        named = path.parent / os.readlink(path)  # (one hop: a chain could lead through a name others may replace)
        path = named if named.is_file() and not named.is_symlink() else path
    was = os.lstat(path) if through_link and path.is_file() and not path.is_symlink() else None
    tmp = temp_name(path)  # (remove_stale takes what a killed process left)
    _sweep_once(path.parent)
    try:
        write_file(tmp, data.encode() if isinstance(data, str) else data, sync=sync)
        if was is not None:
            _keep_mode_and_owner(tmp, path, was)
        if replace:
            os.replace(tmp, path)
        else:  # (a link fails where a file is: no window between a look and the rename; found from outside)
            _link_new(tmp, path)
            _remove(tmp)
    except BigbatchError:  # (something in the way at `tmp`: not this call's to remove)
        raise
    except OSError as e:  # named after the file being written, not its temporary sibling
        _remove(tmp)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        _remove(tmp)
        raise


_HOST = "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname())[:16] or "host"


def temp_name(path: Path) -> Path:
    """The temporary sibling atomic_write writes `path` through: .NAME.tmp-HOST-PID (the host: a process of
    another machine writing in a shared folder is not taken for a killed one of this machine's)."""
    return path.with_name(f".{path.name}.tmp-{_HOST}-{os.getpid()}")


STALE_S = 60.0
"""A temporary file unchanged for this long, of a process of this machine that is gone, is a killed writer's."""


def _sweep_once(folder: Path) -> None:
    """The temporary files killed writers of this machine left in `folder` removed, at this process's first write
    there: one look at the folder, whatever the files written there by the thousand (found from outside: each
    `sample --npz` killed while it wrote left its temporary file, 98 MB, that nothing removed; a run folder's are
    taken as it starts). Another machine's are left (found by review: its PIDs are not this one's), and any changed
    in the last STALE_S (a container's, of another PID namespace, still writing)."""
    key = os.path.abspath(folder)
    if key in _SWEPT:
        return
    _SWEPT.add(key)
    with contextlib.suppress(OSError):  # (a folder not there yet, or not readable: the write says so)
        old = time.time() - STALE_S
        found = folder.glob(f".*.tmp-{glob.escape(_HOST)}-*")
        remove_stale(p for p in found if p.is_file() and not p.is_symlink() and p.lstat().st_mtime < old)


_SWEPT: set[str] = set()


def _link_new(tmp: Path, path: Path) -> None:
    """`tmp` also named `path`, unless something is there (FileExistsError); on a file system without hard links,
    renamed there if nothing is there when it looks."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # (EPERM, ENOTSUP, ENOSYS of a FUSE mount, ...: found by review, an export failed there)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
        os.replace(tmp, path)


def _remove(tmp: Path) -> None:
    # (on a read-only file system even a file that is not there fails to go: EROFS, not ENOENT)
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def read_record(path: Path) -> dict:
    """A JSON object file's contents, or {} where it is missing, unreadable or not an object (a record not ours)."""
    try:
        record = json_loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure as a PNG atomically (100 dpi), and close it."""
    import io

    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())
    return path


def _keep_mode_and_owner(new: Path, path: Path, was: os.stat_result) -> None:
    """Give `new`, which replaces `path`, the permissions and owner `path` had (`was`); an owner this process may not
    give (not root) stays its own."""
    os.chmod(new, stat.S_IMODE(was.st_mode))
    if (was.st_uid, was.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(PermissionError):
            os.chown(new, was.st_uid, was.st_gid)
    if was.st_nlink > 1:
        warn(
            f"files in {path.parent} with other names (hard links) are written anew: their other names keep them as "
            "they were",
            once=True,
        )


def write_file(path: Path, data: bytes | memoryview, sync: bool = True) -> None:
    """Write a new file (`create_new`) and fsync it unless not `sync` (OSError naming the path, if the disk is
    full: a failed write names no file)."""
    with create_new(path) as f:
        try:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(path)) from None


def create_new(path: Path, mode: str = "wb") -> IO[bytes]:
    """Create the file `path` and open it ("wb"; "w+b" to read it back too), never through what is there
    (O_EXCL, O_NOFOLLOW: found by review, a link another user planted at a temporary file's predictable name in
    a shared folder such as /tmp had bigbatch overwrite the file it points to). A regular file of this user's
    there (a killed process's of the same PID, an earlier try's) goes first; anything else is refused."""
    path = Path(path)
    if _own_file(path):
        path.unlink(missing_ok=True)
    try:
        return open(path, mode.replace("w", "x"), opener=_no_follow)  # noqa: SIM115 (the caller's to close)
    except FileExistsError:
        raise BigbatchError(
            f"{path} is in the way of a file bigbatch writes (a link, or not this user's): remove it, or write "
            "elsewhere"
        ) from None


def _no_follow(path: str, flags: int) -> int:
    """open()'s opener: a link at `path` is not followed (ELOOP)."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)


def _own_file(path: Path) -> bool:
    """Whether `path` is a regular file (not a link) of this process's user (`foreign`)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode) and not foreign(path)
    except OSError:
        return False


def foreign(path: Path) -> bool:
    """Whether `path` (there) may be another user's: a link, or owned by another user, unless its folder is this
    user's and no one else may write it (found by review: on root-squashed or id-mapped NFS one's own files show
    another owner; there both show the server's overflow id)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return True
    if not hasattr(os, "geteuid") or st.st_uid == os.geteuid():
        return False
    parent = os.stat(os.path.dirname(os.path.abspath(path)))
    if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return True
    return parent.st_uid != os.geteuid() and not (parent.st_uid == st.st_uid == _overflow_uid())


def _overflow_uid() -> int:
    """The id a file of an unmapped owner shows (NFS's root squash: nobody's)."""
    try:
        return int(Path("/proc/sys/fs/overflowuid").read_text())
    except (OSError, ValueError):
        return 65534


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID runs on this machine (a zombie, ended but not reaped by its parent,
    does not: in a container whose first process reaps nothing, a killed process stays one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, ValueError):  # (no PID of this machine's: another's, kept; found by review, a traceback)
        return True
    except PermissionError:  # another user's process
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):  # no /proc (not Linux), or it ended meanwhile
        return not sys.platform.startswith("linux")
    return state not in ("Z", "X")


def owner_alive(path: Path) -> bool:
    """Whether the temporary file or folder `path`, named ...-PID, is a process's that runs (or one of this one's)."""
    pid = path.name.rpartition("-")[2]
    return not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid))


def remove_stale(paths: Iterable[Path]) -> None:
    """Delete temporary files or folders named ...-PID whose process is gone (killed while writing)."""
    for path in paths:
        if not owner_alive(path):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:  # (a link goes, not what it points to; another user's, in a shared folder, stays)
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)


def check_writable(folder: Path) -> None:
    """Refuse at the start a folder this process cannot write in (found from outside: a run's read-only checkpoints/
    was found at its first save, what it trained since its start lost)."""
    probe = folder / f".write-probe.tmp-{os.getpid()}"  # (a killed process's: remove_stale's)
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        probe.unlink()
    except OSError as e:
        if e.errno not in READ_ONLY:
            raise
        raise _cannot_write_in(folder, e) from None


READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)  # what says a folder may not be written in


def _cannot_write_in(folder: Path, e: OSError) -> BigbatchError:
    return BigbatchError(f"cannot write in {folder} ({e.strerror}): give a folder on storage this user may write to")


def metrics_row(line: str | bytes) -> dict | None:
    """One line of a metrics.jsonl as a row, or None if it is not one: a line cut short by a crash,
    or anything but an object with a finite number as its kimg."""
    try:
        row = json_loads(line)
    except ValueError:
        return None
    kimg = row.get("kimg") if isinstance(row, dict) else None
    if isinstance(kimg, int | float) and not isinstance(kimg, bool) and math.isfinite(kimg):
        return row
    return None


# The descriptors of the locks this process holds. A forked child (a DataLoader worker) inherits them, and an
# flock lasts while any copy is open: its copies become /dev/null in the child, so that the lock ends with
# this process however it ends (a SIGKILL leaves workers alive for seconds, holding the run against --resume).
_HELD: set[int] = set()


def _drop_held_locks() -> None:
    if _HELD:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd in _HELD:
            os.dup2(null, fd)
        os.close(null)
        _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_held_locks)


def held_by(pid: str | int, host: str) -> str:
    """A lock's holder as its messages name it: "process PID", and "on HOST" where the file says."""
    return f"process {pid}" + (f" on {host}" if host else "")


def unlock_folder(lock: IO | None, remove: bool = False) -> None:
    """Release a lock `lock_folder` returned (None: nothing was locked); `remove`: its file goes too (a
    process waiting on it finds it gone and makes its own)."""
    if lock is not None:
        if remove:
            Path(lock.name).unlink(missing_ok=True)  # (while held: no one else has locked this file)
        _HELD.discard(lock.fileno())
        lock.close()  # closing the file releases the flock


def still_held(lock: IO, path: Path) -> bool:
    """Whether the lock file `lock` is the file at `path` still (not deleted or replaced since it was taken)."""
    try:
        return os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def keep_lock(lock: IO | None, folder: Path, name: str) -> IO | None:
    """The lock `lock_folder` gave on FOLDER/`name`, held still under that name: where the file was deleted or
    replaced meanwhile (a "stale" lock file cleaned up; found from outside: `info` and `stop` then saw no one
    training, and a second process took the run), the lock is taken again on the file there now. BigbatchError
    where another process took that one first: this one stops."""
    if lock is None or still_held(lock, folder / name):
        return lock
    again = lock_folder(  # (before the old one goes: where this raises, the caller releases it as ever)
        folder,
        name,
        lambda folder, pid, holder: (
            f"{folder / name} was deleted or replaced while this process held it, and {holder} has "
            "taken it since: this process stops, leaving the run to it"
        ),
    )
    unlock_folder(lock)
    return again


def lock_folder(
    folder: Path, name: str, busy: Callable[[Path, str, str], str], waiting: Callable[[str], None] | None = None
) -> IO | None:
    """Hold an exclusive flock on FOLDER/`name` (a run's RUN/.lock, a sweep's, a prepare's output's) until
    `unlock_folder` (the kernel releases it when the process ends, however it ends; processes it forks do
    not hold it); the file holds the holder's PID and host. Held by another process:
    BigbatchError(busy(folder, pid, "process PID on HOST")), or with `waiting`, waited for: `waiting("process
    PID on HOST")` is called every second until it is free (and may raise, to stop waiting). None where the OS or
    file system has no flock."""
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    path = folder / name
    while True:
        try:
            f = open(path, "a+", opener=_no_follow)  # noqa: SIM115 (held until unlock_folder)
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # (another name of a file: see create_new)
                f.close()
                raise OSError(errno.ELOOP, "not a lock file", str(path))
        except OSError as e:  # (found from outside: a read-only run directory said only "Read-only file system")
            # (found by review: a link planted there had the lock overwrite its file; EMLINK: BSD's O_NOFOLLOW)
            if e.errno in (errno.ELOOP, errno.EMLINK):
                raise BigbatchError(f"{path} is in the way of bigbatch's lock file (a link): remove it") from None
            if e.errno not in READ_ONLY:
                raise
            raise _cannot_write_in(folder, e) from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().split()
            f.close()
            pid, host = holder[0] if holder else "?", holder[1] if len(holder) > 1 else ""
            if waiting is None:
                raise BigbatchError(busy(folder, pid, held_by(pid, host))) from None
            waiting(held_by(pid, host))
            time.sleep(1.0)
            continue
        except OSError as e:  # e.g. a network file system without locks
            f.close()
            warn(f"cannot lock {path} ({e.strerror}); make sure no other process uses {folder} meanwhile")
            return None
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file that its holder removed while we waited for it
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
            f.flush()
            with contextlib.suppress(OSError):  # (on a network file system, for other nodes to read: ranks_agree)
                os.fsync(f.fileno())
            _HELD.add(f.fileno())
            return f
        f.close()
