"""Data sets and the order in which they are read."""

from bigbatch.data.builtin import ImageData, load_data

__all__ = ["ImageData", "load_data"]
