"""Golden data for bigbatch's port of DeepFaceLab's face detector (S3FD) and landmarker (2DFAN): DFL's own
extractors (facelib/S3FDExtractor.py, facelib/FANExtractor.py, on DFL's TensorFlow wrapper core/leras) built with
made, deterministic weights, run on fixed inputs, and their inputs, intermediate results and outputs written to one
compressed .npz (tests/data/dfl_detect_golden.npz, described key by key in tests/data/dfl_detect_golden.md).

DFL (iperov/DeepFaceLab) is GPL-3: this script imports its code from a checkout given by --dfl at run time and
commits only the numbers it produces, never DFL's code; it changes none of the checkout's files. DFL's real weights
(facelib/S3FD.npy, facelib/2DFAN.npy) are not needed: the weights are made here (the recipe below), written in
DFL's Saveable.save_weights format to a folder under --work (S3FD's by save_weights itself, FAN's by the same
pickle.dumps(dict, 4), checked byte for byte against save_weights on S3FD), and read back by the extractors' own
load_weights (the extractor modules' __file__ is pointed at that folder at run time: it is where they look). About
two minutes on two cores.

It needs a throwaway environment outside the repository with a TensorFlow that leras runs on (CPU only; never
torch, never bigbatch's .venv):

    python3 -m venv /tmp/tfenv
    /tmp/tfenv/bin/pip install tensorflow-cpu==2.15.1 numpy==1.23.5 opencv-python-headless==4.10.0.84 \\
        'scipy<1.12' 'numexpr<2.9' pillow colorama tqdm scikit-image==0.22.0
    mkdir -p /tmp/dfl && git --git-dir=/work/.mirror/iperov+DeepFaceLab/repo archive HEAD -- '*.py' | tar -x -C /tmp/dfl
    /tmp/tfenv/bin/python bench/dfl_golden_detect.py --dfl /tmp/dfl --work /tmp/dfl_detect_work

leras on the CPU: nn.initialize(nn.DeviceConfig.CPU(), data_format="NHWC") before the extractors are made (their
own nn.initialize(data_format="NHWC") then finds TensorFlow set up and keeps it; without a device config it asks
Devices.getDevices(), which fails unless the main process ran nn.initialize_main_env()).

The weight recipe (make_weights; a test re-implements it with NumPy alone and checks it against the stored
per-key MD5s of the float32 bytes). For one model: keys = the names DFL's save_weights writes, i.e. each
variable's TF name without the model's scope (the first '/' component), ':0' kept ('conv1_1/weight:0'); then

    rng = np.random.default_rng(seed)
    for key in sorted(keys):                         # Python's str sort
        z = rng.standard_normal(shape)               # float64, shape as the variable's (kernels HWIO)
        base = {conv kernel ('weight:0' of rank 4, not an L2Norm): sqrt(2 / prod(shape[:-1])) * z,
                bias ('bias:0'):                                   0.05 * z,
                scale ('weight:0' of rank 1 = BatchNorm gamma, or an L2Norm's (1,1,1,C) 'weight:0'): 1 + 0.1 * z,
                BatchNorm 'running_mean:0':                        0.1 * z,
                BatchNorm 'running_var:0':                         1 + 0.1 * |z|}
        w = gain[key] * base;  w[..., -1] += last_offset[key];  w = w.astype(np.float32)

gain and last_offset (1 and 0 unless listed) keep random weights in a useful range; they are stored per key:
  S3FD: conv1_1/weight:0 gain 1/64 (its input is 0..255 minus the mean: keeps activations O(1));
        the three L2Norm weights gain 10 (the real model's L2Norm scales are 10, 8 and 5);
        each *_mbox_conf head's bias a negative offset on its last (face) channel (S3FD_FACE_OFFSET), so that a
        moderate number of boxes pass DFL's 0.5 score after NMS, some of them then under the 40 px filter.
  FAN:  every BatchNorm gamma gain FAN_BN_GAIN (0.5), which keeps the residual stack's activations (and the
        heatmaps, |h| < 1.2e3) in float16's range instead of O(1e7).

What it runs (the .md says each key's call):
  a. the weights: made, saved in save_weights's format, loaded by the extractors' load_weights, checked equal;
  b. S3FDExtractor.extract(image, is_bgr=True) on two BGR images (the astronaut resized to 640x640, rows 0..479,
     and a 320x240 window of that), recording the resized network input, the model's 12 outputs and
     S3FDExtractor.refine's boxes for them, and extract's returned rects; refine again on outputs perturbed by
     1e-4 (relative), to say how firmly the rects follow from the outputs;
  c. FANExtractor.extract(image, rects, second_pass_extractor=None, is_bgr=True) on the first image with two rects
     (one partly outside the image), recording each crop (FANExtractor.crop's 256x256 uint8 RGB), each heatmap
     (the model's output, 68x64x64), get_pts_from_predict's points and the landmarks; once more with
     multi_sample=True on the first rect (5 crops at the centre and +-1 px); get_pts_from_predict applied by DFL to
     the stored float16 heatmaps (so a decoder can be checked exactly from the stored data); the argmax gaps;
  d. FANExtractor.extract(image, [SECOND_PASS_RECT], second_pass_extractor=<the S3FD extractor>): the first pass,
     the aligned FULL face, S3FD on it (one face), FAN with multi_sample on that face, mapped back.

Arrays that are checked exactly but would make the file large (the 640x480 network input, FAN's multi-sample
crops, the aligned face) are stored as MD5s of their C-order bytes; the heatmaps as float16.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
from _dfl_golden import astronaut_bgr, dfl_commit, open_checkout, write_golden

S3FD_SEED = 20261128
FAN_SEED = 20261129
# S3FD: offsets on the last (face) channel of each conf head's bias, chosen (with these seeds) so that a moderate
# number of boxes pass DFL's thresholds, some of them then dropped by the 40 px filter.
S3FD_FACE_OFFSET = {
    "conv3_3_norm_mbox_conf": -0.3,
    "conv4_3_norm_mbox_conf": -1.2,
    "conv5_3_norm_mbox_conf": -1.8,
    "fc7_mbox_conf": -2.0,
    "conv6_2_mbox_conf": -0.8,
    "conv7_2_mbox_conf": -0.8,
}
S3FD_INPUT_GAIN = 1.0 / 64
S3FD_L2NORM_GAIN = 10.0
FAN_BN_GAIN = 0.5

FAN_RECTS = ((150, 40, 300, 220), (540, 380, 660, 490))  # (l, t, r, b); the second runs past the image's corner
# The rect for the second-pass case: one for which S3FD (with these weights) finds exactly one face in the aligned
# FULL face, so that the second pass runs (for FAN_RECTS[0] it finds 3, and the second pass is skipped).
SECOND_PASS_RECT = (190, 60, 350, 250)


def import_dfl(dfl: Path) -> SimpleNamespace:
    """leras initialised on the CPU, and DFL's extractor modules, imported from the checkout at `dfl` unchanged."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # CPU only, whatever TensorFlow wheel is installed
    # Two threads: this runs on small shared machines. TensorFlow reads these when it makes its thread pools.
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "2")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    open_checkout(dfl, "facelib/S3FDExtractor.py", ("facelib",))  # (facelib/__init__: FaceEnhancer and XSeg too)
    from core.leras import nn

    nn.initialize(nn.DeviceConfig.CPU(), data_format="NHWC")
    return SimpleNamespace(
        nn=nn,
        s3fd_module=importlib.import_module("facelib.S3FDExtractor"),
        fan_module=importlib.import_module("facelib.FANExtractor"),
    )


# ---------------------------------------------------------------------------------------------------------------
# weights


def weight_kind(key: str, shape: tuple[int, ...]) -> str:
    """conv, bias, scale, mean or var: which base recipe a weight gets (see the module docstring)."""
    layer, leaf = key.rsplit("/", 1)
    if leaf == "running_mean:0":
        return "mean"
    if leaf == "running_var:0":
        return "var"
    if leaf == "bias:0":
        return "bias"
    if leaf == "weight:0":
        if len(shape) == 1 or layer.endswith("_norm"):  # BatchNorm2D gamma; S3FD's L2Norm (1, 1, 1, C)
            return "scale"
        if len(shape) == 4:
            return "conv"
    raise ValueError(f"unknown weight {key} {shape}")


def gain_offset(model: str, key: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """The gain and the last-channel offset of one weight (1 and 0 unless the docstring lists it)."""
    layer, leaf = key.rsplit("/", 1)
    kind = weight_kind(key, shape)
    if model == "s3fd":
        if key == "conv1_1/weight:0":
            return S3FD_INPUT_GAIN, 0.0
        if kind == "scale":
            return S3FD_L2NORM_GAIN, 0.0
        if layer in S3FD_FACE_OFFSET and leaf == "bias:0":
            return 1.0, S3FD_FACE_OFFSET[layer]
    elif model == "fan":
        if kind == "scale":
            return FAN_BN_GAIN, 0.0
    return 1.0, 0.0


def make_weights(names_shapes: list[tuple[str, tuple[int, ...]]], seed: int, model: str) -> dict[str, np.ndarray]:
    """The made weights of one model: {key: float32 array}, drawn in sorted key order (the module docstring)."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in sorted(names_shapes):
        z = rng.standard_normal(shape)
        kind = weight_kind(key, shape)
        if kind == "conv":
            base = np.sqrt(2.0 / np.prod(shape[:-1])) * z
        elif kind == "bias":
            base = 0.05 * z
        elif kind == "scale":
            base = 1.0 + 0.1 * z
        elif kind == "mean":
            base = 0.1 * z
        else:
            base = 1.0 + 0.1 * np.abs(z)
        gain, offset = gain_offset(model, key, shape)
        w = gain * base
        w[..., -1] += offset
        out[key] = w.astype(np.float32)
    return out


def model_names_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of a leras model's weights in get_weights() order; key as save_weights writes it."""
    out = []
    for w in model.get_weights():
        scope, key = w.name.split("/", 1)
        assert scope == model.name, (w.name, model.name)
        out.append((key, tuple(w.shape.as_list())))
    return out


def weights_table(model: str, names_shapes, weights: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The npz keys that describe one model's weights (sorted key order, as drawn)."""
    items = sorted(names_shapes)
    shapes = np.zeros((len(items), 4), dtype=np.int32)  # padded with 0 after the rank
    for i, (_, shape) in enumerate(items):
        shapes[i, : len(shape)] = shape
    go = [gain_offset(model, k, s) for k, s in items]
    return {
        f"{model}_seed": np.array(seed, dtype=np.int64),
        f"{model}_keys": np.array([k for k, _ in items]),
        f"{model}_shapes": shapes,
        f"{model}_ranks": np.array([len(s) for _, s in items], dtype=np.int32),
        f"{model}_kinds": np.array([weight_kind(k, s) for k, s in items]),
        f"{model}_gain": np.array([g for g, _ in go], dtype=np.float64),
        f"{model}_last_offset": np.array([o for _, o in go], dtype=np.float64),
        f"{model}_sum": np.array([weights[k].astype(np.float64).sum() for k, _ in items]),
        f"{model}_abs_sum": np.array([np.abs(weights[k].astype(np.float64)).sum() for k, _ in items]),
        f"{model}_first": np.array([weights[k].reshape(-1)[0] for k, _ in items], dtype=np.float32),
        f"{model}_md5": np.array([md5(weights[k]) for k, _ in items]),  # exact, unlike the float64 sums
        # the keys in get_weights() order (DFL's build order, the order save_weights writes them in)
        f"{model}_keys_dfl_order": np.array([k for k, _ in names_shapes]),
    }


def build_extractors(dfl: SimpleNamespace, work: Path) -> tuple[object, object]:
    """S3FDExtractor() and FANExtractor(), loading S3FD.npy and 2DFAN.npy from work/facelib."""
    folder = work / "facelib"
    # The extractors look for their weights at Path(__file__).parent: their module's __file__, read at call time.
    dfl.s3fd_module.__file__ = str(folder / "S3FDExtractor.py")
    dfl.fan_module.__file__ = str(folder / "FANExtractor.py")
    return dfl.s3fd_module.S3FDExtractor(), dfl.fan_module.FANExtractor()


def weights_bytes(names_shapes, weights: dict[str, np.ndarray]) -> bytes:
    """What DFL's Saveable.save_weights writes: pickle.dumps({key: array}, 4), keys in get_weights() order."""
    return pickle.dumps({key: weights[key] for key, _ in names_shapes}, 4)


def prepare_weights(dfl: SimpleNamespace, work: Path) -> dict[str, object]:
    """Make both models' weights and write them where the extractors load them from, in save_weights's format.

    S3FD's file is written by DFL's own save_weights (after set_weights) and checked byte for byte against
    weights_bytes; FAN's is written by weights_bytes alone (save_weights runs the session once per variable, and
    FAN's 945 make that minutes long)."""
    folder = work / "facelib"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"s3fd": folder / "S3FD.npy", "fan": folder / "2DFAN.npy"}
    for p in paths.values():  # empty dicts: load_weights then runs each variable's initializer
        p.write_bytes(pickle.dumps({}, 4))
    s3fd, fan = build_extractors(dfl, work)
    out = {}
    for model, seed, extractor in (("s3fd", S3FD_SEED, s3fd), ("fan", FAN_SEED, fan)):
        ns = model_names_shapes(extractor.model)
        weights = make_weights(ns, seed, model)
        data = weights_bytes(ns, weights)
        if model == "s3fd":
            extractor.model.set_weights([weights[k] for k, _ in ns])
            extractor.model.save_weights(paths[model])  # DFL's own writer
            assert paths[model].read_bytes() == data, "save_weights's format is not pickle.dumps(dict, 4)"
        else:
            paths[model].write_bytes(data)
        out[model] = (ns, weights, seed)
    dfl.nn.reset_session()  # a new graph: the extractors are made again and load the files
    return out


def check_loaded(extractor, weights: dict[str, np.ndarray]) -> None:
    """After the extractor's own load_weights: every variable equals the made weight (load_weights hides errors)."""
    ns = model_names_shapes(extractor.model)
    values = extractor.model.get_weights_np()
    assert len(values) == len(weights) == len(ns)
    for (key, _), value in zip(ns, values):
        assert value.dtype == np.float32 and np.array_equal(value, weights[key]), key


# ---------------------------------------------------------------------------------------------------------------
# inputs

IMAGE1_WINDOW = (20, 130, 240, 320)  # top, left, height, width of the 320x240 image inside the 640x480 one


def detect_images() -> list[np.ndarray]:
    """The two BGR uint8 images S3FD runs on: 640x480 (the astronaut resized to 640x640 by INTER_AREA, rows
    0..479) and 320x240 (IMAGE1_WINDOW of the first: the face at about the same pixel size)."""
    big = np.ascontiguousarray(cv2.resize(astronaut_bgr(), (640, 640), interpolation=cv2.INTER_AREA)[:480])
    top, left, h, w = IMAGE1_WINDOW
    return [big, np.ascontiguousarray(big[top : top + h, left : left + w])]


def md5(a: np.ndarray) -> str:
    """The MD5 of an array's C-order bytes (for arrays checked exactly but not stored)."""
    return hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# S3FD

PERTURB = 1e-4  # relative noise on the 12 outputs: how a port's float error could move the rects
PERTURB_TRIES = 8


def golden_s3fd(s3fd, images: list[np.ndarray]) -> dict[str, np.ndarray]:
    """extract on each image, with the network input, the 12 outputs and refine's boxes recorded."""
    runs, refines = [], []
    run, refine = s3fd.model.run, s3fd.refine

    def record_run(inputs):
        out = run(inputs)
        runs.append((inputs[0].copy(), out))
        return out

    def record_refine(olist):
        out = refine(olist)
        refines.append(np.array(out, dtype=np.int64).reshape(-1, 4))
        return out

    s3fd.model.run, s3fd.refine = record_run, record_refine  # instance attributes: the class is unchanged
    out: dict[str, np.ndarray] = {}
    try:
        for i, img in enumerate(images):
            runs.clear()
            refines.clear()
            rects = s3fd.extract(img, is_bgr=True)
            assert len(runs) == 1 and len(refines) == 1
            net_in, olist = runs[0]
            assert len(olist) == 12 and net_in.dtype == np.uint8
            again = run([net_in])  # the same graph on the same input: deterministic?
            assert all(np.array_equal(a, b) for a, b in zip(again, olist)), "S3FD run is not deterministic"
            if i == 0:
                out["s3fd_0_image"] = img
            else:
                out[f"s3fd_{i}_image_window"] = np.array(IMAGE1_WINDOW, dtype=np.int32)
            out[f"s3fd_{i}_image_md5"] = np.array(md5(img))
            out[f"s3fd_{i}_net_input_shape"] = np.array(net_in.shape[1:], dtype=np.int32)
            out[f"s3fd_{i}_net_input_md5"] = np.array(md5(net_in[0]))
            if i == 1:
                out[f"s3fd_{i}_net_input"] = net_in[0]
            for j, o in enumerate(olist):
                out[f"s3fd_{i}_{('cls', 'reg')[j % 2]}{j // 2 + 1}"] = o[0]
            out[f"s3fd_{i}_refine"] = refines[0]
            out[f"s3fd_{i}_rects"] = np.array(rects, dtype=np.int64).reshape(-1, 4)
            out.update(s3fd_robustness(f"s3fd_{i}", olist, refine, img.shape, rects))
    finally:
        del s3fd.model.run, s3fd.refine
    return out


def extract_post(boxes, input_scale: float) -> list[tuple[int, int, int, int]]:
    """What S3FDExtractor.extract does to refine's boxes (for the perturbation check only; the golden rects are
    DFL's): scale up, drop a side < 40, extend the bottom by 10%, int, sort by area (largest first, stable)."""
    rects = []
    for ltrb in boxes:
        left, top, right, bottom = (x * input_scale for x in ltrb)
        if min(right - left, bottom - top) < 40:
            continue
        bottom += (bottom - top) * 0.1
        rects.append(tuple(int(x) for x in (left, top, right, bottom)))
    return sorted(rects, key=lambda q: (q[2] - q[0]) * (q[3] - q[1]), reverse=True)


def s3fd_robustness(prefix: str, olist, refine, shape, rects) -> dict[str, np.ndarray]:
    """How firmly the golden rects follow from the outputs: DFL's refine on outputs perturbed by PERTURB (relative),
    PERTURB_TRIES times; the largest change of a rect's coordinates when their number stays the same."""
    h, w = shape[:2]
    d = max(w, h)
    input_scale = d / max(64, 640 if d >= 1280 else d / 2)
    assert extract_post(refine(olist), input_scale) == [tuple(r) for r in rects]
    rng = np.random.default_rng(1000)
    same, max_px = 0, 0
    for _ in range(PERTURB_TRIES):
        noisy = [(o * (1 + PERTURB * rng.standard_normal(o.shape))).astype(np.float32) for o in olist]
        got = extract_post(refine(noisy), input_scale)
        if len(got) == len(rects):
            same += 1
            if rects:
                max_px = max(max_px, int(np.abs(np.array(got) - np.array(rects)).max()))
    scores = np.concatenate([o[0, ..., 1].reshape(-1) for o in olist[::2]])
    return {
        f"{prefix}_n_candidates": np.array((scores > 0.05).sum(), dtype=np.int64),
        f"{prefix}_perturbed_same_count": np.array(same, dtype=np.int64),
        f"{prefix}_perturbed_max_px": np.array(max_px, dtype=np.int64),
    }


# ---------------------------------------------------------------------------------------------------------------
# FAN

FAN_SUBSET = np.arange(0, 68, 4)  # the heatmap channels stored for the second crop (all 68 for the first)


def golden_fan(fan, s3fd, image: np.ndarray) -> dict[str, np.ndarray]:
    """FANExtractor.extract on the first image: two rects; the first with multi_sample=True; SECOND_PASS_RECT with
    S3FD as the second-pass extractor."""
    crops, heatmaps, pts, detections, s3fd_runs = [], [], [], [], []
    run, crop, get_pts, detect = fan.model.run, fan.crop, fan.get_pts_from_predict, s3fd.extract
    s3fd_run = s3fd.model.run

    def record_crop(*args, **kwargs):
        out = crop(*args, **kwargs)
        crops.append(out.copy())
        return out

    def record_run(inputs):
        out = run(inputs)
        heatmaps.append(out[0].copy())  # run returns the (1, 68, 64, 64) batch
        return out

    def record_pts(a, center, scale):
        out = get_pts(a, center, scale)
        pts.append((out.copy(), np.array(center, dtype=np.float64), float(scale)))
        return out

    def record_detect(img, *args, **kwargs):
        out = detect(img, *args, **kwargs)
        detections.append((img.copy(), out, kwargs))
        return out

    def record_s3fd_run(inputs):
        out = s3fd_run(inputs)
        s3fd_runs.append(out)
        return out

    fan.model.run, fan.crop, fan.get_pts_from_predict = record_run, record_crop, record_pts
    s3fd.extract, s3fd.model.run = record_detect, record_s3fd_run
    out: dict[str, np.ndarray] = {}
    cases = (
        ("fan", FAN_RECTS, False, None),
        ("fan_multi", FAN_RECTS[:1], True, None),
        ("fan_second", (SECOND_PASS_RECT,), False, s3fd),
    )
    try:
        for name, rects, multi, second in cases:
            crops.clear()
            heatmaps.clear()
            pts.clear()
            detections.clear()
            s3fd_runs.clear()
            lms = fan.extract(image, list(rects), second_pass_extractor=second, is_bgr=True, multi_sample=multi)
            assert all(lm is not None for lm in lms), "FAN failed (extract catches every exception)"
            n = len(crops)
            assert len(heatmaps) == n == len(pts)
            hm = np.stack(heatmaps)
            assert np.isfinite(hm).all() and np.abs(hm).max() < 6e4, "heatmaps must fit float16"
            out[f"{name}_rects"] = np.array(rects, dtype=np.int64)
            out[f"{name}_landmarks"] = np.stack(lms)
            if name == "fan_second":
                out.update(second_pass(fan, s3fd, image, detections, s3fd_runs, crops, heatmaps, pts))
                continue
            assert n == len(rects) * (5 if multi else 1)
            out[f"{name}_centers"] = np.stack([c for _, c, _ in pts])
            out[f"{name}_scales"] = np.array([s for _, _, s in pts], dtype=np.float64)
            out[f"{name}_pts"] = np.stack([p for p, _, _ in pts])
            out[f"{name}_crops_md5"] = np.array([md5(c) for c in crops])
            out[f"{name}_heatmap_absmax"] = np.abs(hm).max(axis=(1, 2, 3)).astype(np.float32)
            out[f"{name}_heatmap_argmax"] = hm.reshape(n, 68, -1).argmax(-1).astype(np.int32)
            out.update(fan_margins(name, hm))
            if multi:
                assert np.array_equal(crops[0], out["fan_crops"][0])  # the first sample is the plain crop
                continue
            out["fan_crops"] = np.stack(crops)
            # the heatmaps, float16: all 68 channels of the first crop, FAN_SUBSET of the second; and DFL's own
            # decoding of exactly these stored values (exact golden data for a decoder)
            out["fan_heatmap_subset"] = FAN_SUBSET.astype(np.int32)
            for k, h in enumerate(hm):
                h16 = (h if k == 0 else h[FAN_SUBSET]).astype(np.float16)
                out[f"fan_heatmaps_f16_{k}"] = h16
                out[f"fan_pts_from_f16_{k}"] = get_pts(h16.astype(np.float32), pts[k][1], pts[k][2])
    finally:
        del fan.model.run, fan.crop, fan.get_pts_from_predict, s3fd.extract, s3fd.model.run
    return out


def fan_margins(name: str, hm: np.ndarray) -> dict[str, np.ndarray]:
    """How firmly the points follow from the heatmaps: per crop and channel, the gap between the largest and the
    second largest value (the argmax), and |the neighbours' differences| that pick the +-0.25 steps (x, y; NaN
    where the argmax is on the border and no step is taken)."""
    n = len(hm)
    flat = hm.reshape(n, 68, -1).astype(np.float64)
    top2 = np.sort(flat, axis=-1)[..., -2:]
    steps = np.full((n, 68, 2), np.nan)
    for k in range(n):
        for c in range(68):
            y, x = divmod(int(flat[k, c].argmax()), 64)
            if 0 < x < 63 and 0 < y < 63:
                a = hm[k, c].astype(np.float64)
                steps[k, c] = abs(a[y, x + 1] - a[y, x - 1]), abs(a[y + 1, x] - a[y - 1, x])
    return {
        f"{name}_argmax_gap": (top2[..., 1] - top2[..., 0]).astype(np.float32),
        f"{name}_step_absdiff": steps.astype(np.float32),
    }


def second_pass(fan, s3fd, image, detections, s3fd_runs, crops, heatmaps, pts) -> dict[str, np.ndarray]:
    """What the second pass did: S3FD on the aligned FULL 256 face (RGB, is_bgr=False); as it found exactly one
    face, FAN with multi_sample there (5 crops), mapped back to the image."""
    assert len(detections) == 1 == len(s3fd_runs)
    face, rects2, kwargs = detections[0]
    assert len(rects2) == 1 and kwargs == {"is_bgr": False}, (rects2, kwargs)
    assert len(pts) == 6  # the first pass (1 crop) and multi_sample on the face (5)
    # The aligned face as FANExtractor makes it: DFL's get_transform_mat(first-pass points, 256, FULL), then
    # cv2.warpAffine(rgb, mat, (256, 256), cv2.INTER_CUBIC), whose 4th positional argument is dst: bilinear.
    module = sys.modules[type(fan).__module__]
    mat = module.LandmarksProcessor.get_transform_mat(pts[0][0], 256, module.FaceType.FULL)
    rgb = image[:, :, ::-1]
    assert np.array_equal(face, cv2.warpAffine(rgb, mat, (256, 256), flags=cv2.INTER_LINEAR))
    assert not np.array_equal(face, cv2.warpAffine(rgb, mat, (256, 256), flags=cv2.INTER_CUBIC))
    res = {
        "fan_second_mat": np.asarray(mat, dtype=np.float64),
        "fan_second_face_md5": np.array(md5(face)),
        "fan_second_face_shape": np.array(face.shape, dtype=np.int32),
        "fan_second_rects2": np.array(rects2, dtype=np.int64).reshape(-1, 4),
        "fan_second_first_pass_pts": pts[0][0],
        "fan_second_face_centers": np.stack([c for _, c, _ in pts[1:]]),
        "fan_second_face_scales": np.array([s for _, _, s in pts[1:]], dtype=np.float64),
        "fan_second_face_pts": np.stack([p for p, _, _ in pts[1:]]),
        "fan_second_crops_md5": np.array([md5(c) for c in crops]),
        "fan_second_heatmap_argmax": np.stack([h.reshape(68, -1).argmax(-1) for h in heatmaps]).astype(np.int32),
        **s3fd_robustness("fan_second_s3fd", s3fd_runs[0], s3fd.refine, face.shape, rects2),
    }
    return res


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--dfl", type=Path, required=True, help="a DeepFaceLab checkout (its .py files)")
    parser.add_argument("--out", type=Path, default=Path("tests/data/dfl_detect_golden.npz"))
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/dfl_detect_work"), help="a folder for the made weight files"
    )
    args = parser.parse_args(argv)
    t0 = time.time()
    dfl = import_dfl(args.dfl)
    log = lambda what: print(f"[{time.time() - t0:6.1f} s] {what}", flush=True)
    log("leras initialised")
    made = prepare_weights(dfl, args.work)
    log("weights made and saved")
    s3fd, fan = build_extractors(dfl, args.work)
    log("extractors built")
    check_loaded(s3fd, made["s3fd"][1])
    check_loaded(fan, made["fan"][1])

    import tensorflow

    log("weights checked")
    images = detect_images()
    s3fd_out = golden_s3fd(s3fd, images)
    log("S3FD run")
    fan_out = golden_fan(fan, s3fd, images[0])
    log("FAN run")
    golden = {
        **weights_table("s3fd", made["s3fd"][0], made["s3fd"][1], made["s3fd"][2]),
        **weights_table("fan", made["fan"][0], made["fan"][1], made["fan"][2]),
        **s3fd_out,
        **fan_out,
        "dfl_commit": np.array(dfl_commit(args.dfl)),
        "versions": np.array(
            [
                f"tensorflow {tensorflow.version.VERSION}",
                f"numpy {np.__version__}",
                f"opencv {cv2.__version__}",
                f"python {sys.version.split()[0]}",
            ]
        ),
    }
    write_golden(args.out, golden)
    return 0


if __name__ == "__main__":
    sys.exit(main())
