"""Data sets and the order in which they are read."""

from bigbatch.data.h5describe import describe_data, image_names
from bigbatch.data.hdf5 import H5Data, read_meta, verify_data
from bigbatch.data.images import ImageData
from bigbatch.data.load import load_data
from bigbatch.data.loader import Batch, BatchLoader, Loader, RankSampler, Step
from bigbatch.data.prepare import Report, prepare
from bigbatch.data.schedule import BucketOrder, Phase, Schedule, resize_batch

__all__ = [
    "Batch",
    "BatchLoader",
    "BucketOrder",
    "H5Data",
    "ImageData",
    "Loader",
    "Phase",
    "RankSampler",
    "Report",
    "Schedule",
    "Step",
    "describe_data",
    "image_names",
    "load_data",
    "prepare",
    "read_meta",
    "resize_batch",
    "verify_data",
]
