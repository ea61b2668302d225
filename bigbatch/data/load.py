"""`load_data`: open the data set any `data.path` names (built-in, or a DATA.h5 local or remote)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bigbatch.data.builtin import BUILTIN
from bigbatch.data.images import ImageData
from bigbatch.errors import BigbatchError

if TYPE_CHECKING:
    from bigbatch.data.hdf5 import H5Data


def load_data(
    path: str, resolution: int, in_ram: bool = False, storage_options: dict[str, Any] | None = None
) -> ImageData | H5Data:
    """Open a data set named by `data.path`: builtin:NAME (made at `resolution`), or a DATA.h5 written
    by `bigbatch prepare`, local or at an fsspec URL (s3://bucket/DATA.h5), as it was prepared.
    `in_ram` reads a data file's images into memory once; `storage_options` go to fsspec (credentials
    are better left to the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL)."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN:
            raise BigbatchError(
                f"unknown built-in data set '{name}'; valid: {', '.join('builtin:' + n for n in BUILTIN)}"
            )
        return BUILTIN[name](resolution)
    from bigbatch.data.sources import is_url, public_name

    if is_url(path) or path.lower().endswith((".h5", ".hdf5")):
        from bigbatch.data.hdf5 import H5Data

        return H5Data(path, in_ram=in_ram, storage_options=storage_options)
    raise BigbatchError(
        f"cannot open data set '{public_name(path)}': give a DATA.h5 written by `bigbatch prepare` (a path or "
        f"s3://... URL) or one of {', '.join('builtin:' + n for n in BUILTIN)}"
    )
