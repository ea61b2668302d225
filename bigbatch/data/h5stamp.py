"""What tells the data file a process reads from another put at its path since it was opened (as prepare
--overwrite puts one): a local file's device and inode, read as each process opens it; an object's ETag (or size and
time), read as each process opens it and again every CHECK_EVERY_S as it reads (found from outside: an s3:// data
file replaced as a run trained was read on, its new images beside the old file's labels)."""

from __future__ import annotations

import os
import time
from typing import Any

from bigbatch.data.listing import STAMP_FIELDS, object_stamp
from bigbatch.errors import BigbatchError
from bigbatch.urls import Location

CHECK_EVERY_S = 30.0
"""How often a process reading an object asks for its ETag again (a HEAD request: not one a batch)."""


def local_stamp(fd: int | None) -> tuple | None:
    """A local file's device and inode, through its descriptor (None: none; one cut short in place is said as
    truncated where its reads fall short)."""
    if fd is None:
        return None
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def remote_stamp(fs: Any, path: str) -> tuple | None:
    """An object's stamp as its store says it now (its listing cache dropped first); None where it says none."""
    fs.invalidate_cache(path)
    info = fs.info(path)
    return ("object", object_stamp(info)) if any(info.get(f) for f in STAMP_FIELDS) else None


def same_file(location: Location, now: tuple | None, stamp: tuple | None) -> None:
    """One line where the file read now is not the one whose index (and content hash) the data was opened with
    (found from outside: a prepare --overwrite onto data.path as a run started had it train on the new images while
    its checkpoints recorded the old ones' hash)."""
    if stamp is not None and now is not None and now != stamp:
        raise BigbatchError(
            f"data file {location.name} was replaced since it was opened (prepare --overwrite?): the images read "
            "would not be those its content hash names; start the command again"
        )


class RemoteCheck:
    """An object's stamp checked as a process opens it, then every CHECK_EVERY_S as it reads."""

    def __init__(self, location: Location, fs: Any, path: str, stamp: tuple | None):
        self.location, self.fs, self.path, self.stamp = location, fs, path, stamp
        self.at = -float("inf")
        self()

    def __call__(self) -> None:
        if self.stamp is not None and time.monotonic() - self.at >= CHECK_EVERY_S:
            same_file(self.location, remote_stamp(self.fs, self.path), self.stamp)
            self.at = time.monotonic()
