"""Decoding only the part of a JPEG that a crop needs, with the decoders at hand (OpenCV, nvJPEG), which decode
whole files only (FFCV's RandomResizedCrop decodes the whole image, then crops).

prepare writes JPEGs with a restart marker after every MCU (the 16x16-pixel block group of 4:2:0
colour): each MCU's entropy-coded bytes then stand alone (the DC predictors restart), so the bytes of
any rectangle of MCUs, behind the file's own headers with the width and height changed, are a valid
JPEG of that rectangle. Its pixels are the full decode's, bit for bit (the quantized coefficients are
the same; libjpeg-turbo's IDCT works block by block), except where chroma upsampling reads a
neighbouring sample that the rectangle left out: hence a margin of MARGIN output pixels around the
crop before rounding out to whole MCUs. The markers cost 5 to 8% more bytes and no pixels.

Written by hand: neither Pillow nor OpenCV exposes a cropped decode, and libjpeg-turbo's own
(tj3SetCroppingRegion) needs the system's libturbojpeg. Files written before (no restart markers),
progressive or multi-scan JPEGs are decoded whole, as before."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

RESTART_MCUS = 1  # prepare's restart interval: a marker after every MCU
MARGIN = 2  # output pixels kept beyond the crop on each side (one chroma sample, upsampled 2x)
_SOF = (0xC0, 0xC1)  # baseline and extended sequential Huffman: what the surgery handles


class Layout(NamedTuple):
    """Where a JPEG's parts are, from its headers."""

    height: int
    width: int
    mcu_h: int
    mcu_w: int
    interval: int  # MCUs between restart markers (0: none)
    sof_at: int  # offset of the frame header's marker
    scan_at: int  # offset of the entropy-coded data


def layout(data: bytes | bytearray | memoryview | np.ndarray) -> Layout | None:
    """The layout of a single-scan sequential JPEG, or None for any other file (progressive, lossless,
    arithmetic-coded, or not a JPEG)."""
    data = memoryview(data)  # (bytes of any kind: its items are ints)
    if bytes(data[:2]) != b"\xff\xd8":
        return None
    at, n, frame, interval = 2, len(data), None, 0
    while at + 4 <= n:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        length = (data[at + 2] << 8) | data[at + 3]
        if marker in _SOF:
            height, width, count = struct.unpack(">HHB", bytes(data[at + 5 : at + 10]))
            factors = [data[at + 11 + 3 * i] for i in range(count)]
            mcu_h = 8 * max(f & 15 for f in factors) if count > 1 else 8
            mcu_w = 8 * max(f >> 4 for f in factors) if count > 1 else 8
            frame = (height, width, mcu_h, mcu_w, count, at)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return None  # another frame type: progressive, lossless, arithmetic coding
        elif marker == 0xDD:
            interval = (data[at + 4] << 8) | data[at + 5]
        elif marker == 0xDA:
            if frame is None or data[at + 4] != frame[4] or not frame[0] or not frame[1]:
                return None  # a scan of some components only: more scans follow
            height, width, mcu_h, mcu_w, _, sof_at = frame
            return Layout(height, width, mcu_h, mcu_w, interval, sof_at, at + 2 + length)
        at += 2 + length
    return None


class Part(NamedTuple):
    """A JPEG of a rectangle of another's MCUs, and where that rectangle is in it (stored pixels)."""

    data: bytearray
    left: int
    top: int
    height: int
    width: int


def region(
    data: bytes | bytearray | memoryview | np.ndarray, box: tuple[int, int, int, int], factor: int = 1
) -> Part | None:
    """The JPEG of the whole MCUs around `box` = (x0, y0, x1, y1), the output pixels of a decode at
    1/factor (libjpeg's DCT scaling) that are wanted. Decoded at the same scale, its pixels from
    [y0 - top/factor, x0 - left/factor] on are the full decode's from [y0, x0]. None where the file
    cannot be cut (see the module's docstring) or the box needs all of it: the caller decodes it whole."""
    lay = layout(data)
    if lay is None or not lay.interval:
        return None
    k, mh, mw = lay.interval, lay.mcu_h, lay.mcu_w
    per_row, rows = -(-lay.width // mw), -(-lay.height // mh)
    if per_row % k:
        return None
    x0, y0, x1, y1 = box
    segments = per_row // k  # restart segments in an MCU row; columns g0..g1 of them are kept
    g0 = max(0, (x0 - MARGIN) * factor // mw) // k
    g1 = -(-min(per_row, -(-(x1 + MARGIN) * factor // mw)) // k)
    r0, r1 = max(0, (y0 - MARGIN) * factor // mh), min(rows, -(-(y1 + MARGIN) * factor // mh))
    if g0 == 0 and g1 == segments and r0 == 0 and r1 == rows:
        return None  # the whole image
    at = lay.scan_at
    source = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(source[at:-1] == 0xFF)
    code = source[ff + (at + 1)]
    is_marker = code != 0  # (0xFF 0x00 is a stuffed 0xFF byte of the data)
    ends, code = ff[is_marker], code[is_marker]  # where each segment's bytes end (from `at`), what ends it
    if len(ends) != rows * segments or code[-1] != 0xD9 or np.count_nonzero((code & 0xF8) == 0xD0) != len(ends) - 1:
        return None  # not one restart marker after every `k` MCUs, then the end of the image
    # The kept segments, row by row: a row's bytes run from its first segment's start (after the marker
    # before it) to its last one's end, and every kept segment is followed by a restart marker,
    # renumbered 0..7 in order, but the last one, by the end of the image.
    kept = ends.reshape(rows, segments)[r0:r1, g0:g1]
    before = r0 * segments + g0 - 1  # the segment before the first kept one
    if before >= 0:
        starts = ends[before : before + (r1 - r0) * segments : segments] + 2
    else:  # (the scan's first segment)
        starts = np.concatenate(([0], ends[segments - 1 : (r1 - 1) * segments : segments] + 2))
    view = memoryview(data)
    rows_kept = (view[at + a : at + b] for a, b in zip(starts.tolist(), (kept[:, -1] + 2).tolist()))
    out = bytearray().join([view[:at], *rows_kept])
    left, top = g0 * k * mw, r0 * mh
    width = lay.width - left if g1 == segments else (g1 - g0) * k * mw
    height = lay.height - top if r1 == rows else (r1 - r0) * mh
    out[lay.sof_at + 5 : lay.sof_at + 9] = struct.pack(">HH", height, width)
    # In the cut, row i starts at `at` + the bytes of the rows before it; a marker's code follows its 0xFF.
    lengths = kept[:, -1] + 2 - starts
    shift = np.cumsum(lengths) - lengths - starts + (at + 1)
    codes = np.frombuffer(out, np.uint8)
    codes[(kept + shift[:, None]).ravel()] = 0xD0 | np.arange(kept.size) & 7
    codes[-1] = 0xD9
    return Part(out, left, top, height, width)
