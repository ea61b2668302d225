"""DeepFaceLab's XSeg: the network computes what leras's layers compute by their definitions (a NumPy
re-implementation, layer by layer, in float64), from a weight file in DFL's format; and its file round-trips."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

from bigbatch.models import dfl
from bigbatch.models.xseg import XSeg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # (_faces: the test photo's face)


def conv_same(x, w, b):
    """leras Conv2D 3x3 SAME: symmetric padding 1, cross-correlation; x (C, H, W), w (3, 3, in, out)."""
    p = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    windows = sliding_window_view(p, (3, 3), axis=(1, 2))  # (C, H, W, 3, 3)
    return np.einsum("chwij,ijco->ohw", windows, w) + b[:, None, None]


def conv_transpose_same(x, w, b):
    """TF's conv2d_transpose, stride 2, SAME: the gradient of a SAME stride-2 convolution of a 2n input, which
    pads 0 before and 1 after: out[2j + k] += w[k] x[j]; w (3, 3, out, in)."""
    c, h, wd = x.shape
    out = np.zeros((w.shape[2], 2 * h + 1, 2 * wd + 1))
    for i in range(3):
        for j in range(3):
            out[:, i : i + 2 * h : 2, j : j + 2 * wd : 2] += np.einsum("chw,oc->ohw", x, w[i, j])
    return out[:, : 2 * h, : 2 * wd] + b[:, None, None]


def frn_tlu(x, weights, prefix):
    nu2 = (x**2).mean(axis=(1, 2), keepdims=True)
    x = x / np.sqrt(nu2 + np.abs(weights[f"{prefix}/frn/eps:0"]))
    x = x * weights[f"{prefix}/frn/weight:0"][:, None, None] + weights[f"{prefix}/frn/bias:0"][:, None, None]
    return np.maximum(x, weights[f"{prefix}/tlu/tau:0"][:, None, None])


def block(x, weights, name, up=False):
    f = conv_transpose_same if up else conv_same
    return frn_tlu(f(x, weights[f"{name}/conv/weight:0"], weights[f"{name}/conv/bias:0"]), weights, name)


def blur_pool(x, size):
    a = np.array([[1.0], [1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 3.0, 3.0, 1.0]][size - 1])
    k = np.outer(a, a) / np.outer(a, a).sum()
    before, after = int((size - 1) / 2), int(np.ceil((size - 1) / 2))
    p = np.pad(x, ((0, 0), (before, after), (before, after)))
    windows = sliding_window_view(p, (size, size), axis=(1, 2))[:, ::2, ::2]
    return np.einsum("chwij,ij->chw", windows, k)


def leras_xseg(x, weights, base):
    """DFL's XSeg.forward on one face (3, 256, 256), as leras's layers define it."""
    skips = []
    stages = [["conv01", "conv02"], ["conv11", "conv12"], ["conv21", "conv22"], ["conv31", "conv32", "conv33"],
              ["conv41", "conv42", "conv43"], ["conv51", "conv52", "conv53"]]  # fmt: skip
    for names, size in zip(stages, (4, 3, 2, 2, 2, 2)):
        for name in names:
            x = block(x, weights, name)
        skips.append(x)
        x = blur_pool(x, size)
    x = x.reshape(-1) @ weights["dense1/weight:0"] + weights["dense1/bias:0"]  # (flatten: NCHW order)
    x = x @ weights["dense2/weight:0"] + weights["dense2/bias:0"]
    x = x.reshape(base * 8, 4, 4)
    ups = [("up5", ["uconv53", "uconv52", "uconv51"]), ("up4", ["uconv43", "uconv42", "uconv41"]),
           ("up3", ["uconv33", "uconv32", "uconv31"]), ("up2", ["uconv22", "uconv21"]),
           ("up1", ["uconv12", "uconv11"]), ("up0", ["uconv02", "uconv01"])]  # fmt: skip
    for (up, names), skip in zip(ups, reversed(skips)):
        x = np.concatenate([block(x, weights, up, up=True), skip])
        for name in names:
            x = block(x, weights, name)
    return conv_same(x, weights["out_conv/weight:0"], weights["out_conv/bias:0"])


def dfl_weights(base, seed=0):
    """A weight file's arrays as DFL's XSeg of `base` channels holds them, random (FRN and TLU too)."""
    rng = np.random.default_rng(seed)
    shapes = {k: dfl.to_dfl(v).shape for k, v in XSeg(base).state_dict().items()}
    weights = {}
    for key, shape in shapes.items():
        name = dfl.dfl_key(key)
        scale = 0.3 if name.endswith(("conv/weight:0", "out_conv/weight:0")) else 0.05
        weights[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("frn/weight:0"):
            weights[name] += 1
        if name.endswith("eps:0"):
            weights[name] = np.float32([1e-3])
    return weights


def test_xseg_computes_what_lerass_layers_do_from_dfls_weight_file(tmp_path):
    weights = dfl_weights(base=2)
    dfl.write_weights(tmp_path / "XSeg_256.npy", weights)
    model = XSeg(base_ch=2)
    dfl.import_part(model, dfl.read_weights(tmp_path / "XSeg_256.npy"), "XSeg_256.npy")
    x = np.random.default_rng(1).random((2, 3, 256, 256))
    with torch.no_grad():
        got = model(torch.from_numpy(x).float()).double().numpy()
    want = np.stack([leras_xseg(face, {k: v.astype(np.float64) for k, v in weights.items()}, 2) for face in x])
    assert got.shape == (2, 1, 256, 256)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    assert np.abs(got[0] - got[1]).max() > 1e-3  # (each face its own: FRN's statistics are per image)
    # and back: DFL's arrays, byte for byte
    back = dfl.export_part(model)
    assert back.keys() == weights.keys() and all(np.array_equal(back[k], weights[k]) for k in weights)


def test_xseg_reads_256_px_faces_only():
    with pytest.raises(ValueError, match="XSeg reads 256x256 faces"):
        XSeg(base_ch=1)(torch.zeros(1, 3, 128, 128))


@pytest.fixture(scope="module")
def aligned():
    """The astronaut's aligned whole face (BGR, 256 px) and its metadata, as extract writes them."""
    pytest.importorskip("dlib")
    pytest.importorskip("skimage")
    import _faces

    from bigbatch.data.dfl_faces import read_metadata
    from bigbatch.faces.extract import Extractor, Settings

    image = _faces.photo()
    (found,) = Extractor(Settings()).find(image)
    (data,), _ = Extractor(Settings(size=256)).aligned(image, [found], "00001.png")
    return data, read_metadata(data)


def test_xseg_apply_writes_dfls_mask_into_each_face_and_remove_takes_it_out(aligned, tmp_path, capsys):
    import cv2

    from bigbatch.cli import main
    from bigbatch.data.dfl_faces import face_masks, read_metadata, write_metadata
    from bigbatch.faces.xseg import load_xseg

    data, meta = aligned
    (tmp_path / "model").mkdir()
    dfl.write_weights(tmp_path / "model" / "XSeg_256.npy", dfl_weights(base=4, seed=3))
    faces = tmp_path / "faces"
    faces.mkdir()
    (faces / "1.jpg").write_bytes(data)
    small = cv2.imencode(".jpg", cv2.resize(cv2.imdecode(np.frombuffer(data, np.uint8), 1), (128, 128)))[1]
    (faces / "2.jpg").write_bytes(write_metadata(small.tobytes(), meta))  # (resized to 256 for the model)
    (faces / "3.jpg").write_bytes(small.tobytes())  # not an aligned face: left as it is, said
    # An edited face keeps its permissions and owner (found from outside: applied as root, each face became root's,
    # and DFL's editor, the user's, could not save it); a hard link's other name keeps the face as it was, said.
    os.chmod(faces / "2.jpg", 0o640)
    owner = (65534, 65534) if os.geteuid() == 0 else (os.geteuid(), os.getegid())  # (root: another user's face)
    os.chown(faces / "2.jpg", *owner)
    os.link(faces / "1.jpg", tmp_path / "other-name.jpg")
    assert main(["xseg", "apply", str(tmp_path / "model"), str(faces), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "Applied XSeg to 2 faces" in out and "1 file left as it was (3.jpg: not an aligned" in err
    kept = os.stat(faces / "2.jpg")
    assert (kept.st_mode & 0o777, kept.st_uid, kept.st_gid) == (0o640, *owner)
    assert (tmp_path / "other-name.jpg").read_bytes() == data and "with other names (hard links) are written" in err
    model, kind = load_xseg(tmp_path / "model")
    assert kind is None
    for name in ("1.jpg", "2.jpg"):
        written = (faces / name).read_bytes()
        assert b"numpy._core" not in written  # (DFL's NumPy 1 reads the array)
        stored = read_metadata(written)["xseg_mask"]
        assert isinstance(stored, np.ndarray) and stored.dtype == np.uint8
        mask = cv2.imdecode(stored, cv2.IMREAD_UNCHANGED)  # as DFL's get_xseg_mask reads it
        image = cv2.imdecode(np.frombuffer(written, np.uint8), cv2.IMREAD_COLOR).astype(np.float32) / 255
        face = cv2.resize(image, (256, 256), interpolation=cv2.INTER_LANCZOS4) if image.shape[0] != 256 else image
        with torch.no_grad():
            want = torch.sigmoid(model(torch.from_numpy(face).permute(2, 0, 1)[None]))[0, 0].numpy() >= 0.5
        assert mask.shape == (256, 256) and set(np.unique(mask)) <= {0, 255}
        assert 0.02 < want.mean() < 0.98 and np.array_equal(mask == 255, want)
        # prepare --masks dfl takes it (not the landmarks' hull)
        (plane,), _ = face_masks(written, image.shape[:2], eyes_mouth=False)
        resized = np.asarray(Image.fromarray(mask).resize(image.shape[1::-1], Image.Resampling.BICUBIC))
        assert np.abs(plane.astype(int) - resized.astype(int)).max() <= 1
    assert (faces / "3.jpg").read_bytes() == small.tobytes()
    # A model trained on full faces masks whole faces cut to full face, and back (DFL's XSeg_data.dat says it)
    dfl.write_weights(tmp_path / "model" / "XSeg_data.dat", {"options": {"face_type": "f"}})
    assert main(["xseg", "apply", str(tmp_path / "model"), str(faces), "--device", "cpu"]) == 0
    cut = cv2.imdecode(read_metadata((faces / "1.jpg").read_bytes())["xseg_mask"], cv2.IMREAD_UNCHANGED)
    assert cut.shape == (256, 256) and not np.array_equal(cut, mask)
    assert cut[:8].max() == 0 and cut[:, :8].max() == 0  # (outside the full face's square: nothing)
    # The model's file says its face type; --face-type is for a model whose file does not (found by review: the
    # flag won over the file)
    capsys.readouterr()
    assert main(["xseg", "apply", str(tmp_path / "model"), str(faces), "--device", "cpu", "--face-type", "wf"]) == 0
    assert "--face-type wf left aside: the model says it was trained on f faces" in (capsys.readouterr().err)
    again = cv2.imdecode(read_metadata((faces / "1.jpg").read_bytes())["xseg_mask"], cv2.IMREAD_UNCHANGED)
    assert np.array_equal(again, cut)
    # A face whose metadata and mask outgrow one JPEG segment is left as it was, said (found by review: a
    # traceback)
    for n in range(4000, 0, -50):  # (the most polygon points that fit, as a heavily labelled face's)
        crowded = {**meta, "seg_ie_polys": {"polys": [{"type": 1, "pts": [[i * 1.5, i * 2.5] for i in range(n)]}]}}
        try:
            (faces / "4.jpg").write_bytes(write_metadata(small.tobytes(), crowded))
            break
        except ValueError:
            continue
    assert main(["xseg", "apply", str(tmp_path / "model"), str(faces), "--device", "cpu"]) == 0
    assert "2 files left as they were (3.jpg: " in (err := capsys.readouterr().err)  # (3.jpg, not a face, and 4.jpg:
    assert err.endswith("; also 4.jpg)\n")  # each named, found from outside: the second went unnamed)
    assert "xseg_mask" not in read_metadata((faces / "4.jpg").read_bytes())
    (faces / "4.jpg").unlink()
    capsys.readouterr()
    assert main(["xseg", "remove", str(faces)]) == 0
    assert "Removed the XSeg masks of 2 faces" in capsys.readouterr().out
    assert "xseg_mask" not in read_metadata((faces / "1.jpg").read_bytes())
    for argv, words in [
        (["xseg", "apply", str(faces), str(faces)], "holds no DeepFaceLab XSeg model (XSeg_256.npy)"),
        (["xseg", "apply", str(tmp_path / "model"), str(tmp_path / "nowhere")], "is not a folder of aligned faces"),
        (["xseg", "apply", str(tmp_path / "model"), str(faces), "--face-type", "x"], "unknown face type 'x'"),
        (["xseg", "apply", str(tmp_path / "model"), str(tmp_path / "model")], "holds no aligned faces (.jpg)"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("bigbatch: error: ") and err.count("\n") == 1 and words in err, err


def _tf1_upsample(x):
    """tf.compat.v1's resize_images, bilinear, twice the size, no half-pixel centres: out[i] reads in[i / 2]."""

    def along(a, axis):
        n = a.shape[axis]
        src = np.arange(2 * n) / 2
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, n - 1)
        f = (src - lo).reshape([-1 if d == axis else 1 for d in range(a.ndim)])
        return np.take(a, lo, axis) * (1 - f) + np.take(a, hi, axis) * f

    return along(along(x, 1), 2)


def leras_enhancer(x, weights, params=(0.2, 1.0)):
    """DFL's FaceEnhancer.forward on one BGR patch (3, H, W) in [-1, 1], as leras defines its layers."""

    def conv(name, a):
        return conv_same(a, weights[f"{name}/weight:0"], weights[f"{name}/bias:0"])

    def act(name, a):
        a = conv(name, a)
        return np.where(a > 0, a, 0.1 * a)

    def pool(a):
        c, h, w = a.shape
        return a.reshape(c, h // 2, 2, w // 2, 2).mean(axis=(2, 4))

    a = conv("conv1", x) + (np.array([[params[0]]]) @ weights["dense1/weight:0"])[0][:, None, None]
    a = a + (np.array([[params[1]]]) @ weights["dense2/weight:0"])[0][:, None, None]
    a = np.where(a > 0, a, 0.1 * a)
    skips = []
    for level in range(5):
        a = pool(a) if level else a
        a = act(f"e{level}_conv1", act(f"e{level}_conv0", a))
        skips.append(a)
    a = pool(a)
    for k in range(4):
        a = act(f"center_conv{k}", a)
    for level in (4, 3, 2, 1, 0):
        a = np.concatenate([_tf1_upsample(a), skips[level]])
        a = act(f"d{level}_conv1", act(f"d{level}_conv0", a))
    d0 = a
    out1x = x + np.tanh(conv("out1x_conv1", act("out1x_conv0", d0)))
    d2x = _tf1_upsample(act("dec2x_conv1", act("dec2x_conv0", d0)))
    out2x = _tf1_upsample(out1x) + np.tanh(conv("out2x_conv1", act("out2x_conv0", d2x)))
    d4x = _tf1_upsample(act("dec4x_conv1", act("dec4x_conv0", d2x)))
    return _tf1_upsample(out2x) + np.tanh(conv("out4x_conv1", act("out4x_conv0", d4x)))


def test_face_enhancer_computes_what_lerass_layers_do_from_dfls_weight_file(tmp_path):
    from bigbatch.models.face_enhancer import FaceEnhancer

    rng = np.random.default_rng(2)
    shapes = {dfl.dfl_key(k): dfl.to_dfl(v).shape for k, v in FaceEnhancer(width=0.05).state_dict().items()}
    weights = {
        k: (rng.standard_normal(s) * (0.2 if len(s) == 4 else 0.5)).astype(np.float32) for k, s in shapes.items()
    }
    dfl.write_weights(tmp_path / "FaceEnhancer.npy", weights)
    model = FaceEnhancer(width=0.05)
    dfl.import_part(model, dfl.read_weights(tmp_path / "FaceEnhancer.npy"), "FaceEnhancer.npy")
    x = rng.random((3, 64, 96)) * 2 - 1
    with torch.no_grad():
        got = model(torch.from_numpy(x)[None].float(), torch.tensor([[0.2]]), torch.tensor([[1.0]]))[0].numpy()
    want = leras_enhancer(x, {k: v.astype(np.float64) for k, v in weights.items()})
    assert got.shape == (3, 256, 384) and np.abs(got - want).max() < 5e-4 * np.abs(want).max()  # (float32)


def test_enhance_tiles_a_face_in_dfls_patches_and_puts_it_back_together():
    """DFL's enhance: padded to 192, patches half a patch apart blended by a pyramid, cut back. A network that
    repeats each pixel 4x4 gives, tile by tile, the whole face so (each output pixel reads its own pixel only)."""
    from bigbatch.models import face_enhancer as fe

    class Repeater(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, a, b):
            return x.repeat_interleave(4, 2).repeat_interleave(4, 3)

    rng = np.random.default_rng(0)
    for h, w in ((64, 64), (300, 230)):  # smaller than a patch (padded), and larger (three patches a side)
        face = rng.random((h, w, 3)).astype(np.float32)
        got = fe.enhance(Repeater(), face)
        want = face.repeat(4, 0).repeat(4, 1)
        # (but for the outermost ring, where every patch's pyramid weight is 0, as in DFL's: grey there)
        assert got.shape == (4 * h, 4 * w, 3) and np.abs(got - want)[1:-1, 1:-1].max() < 1e-5, (h, w)
    assert fe.enhance(Repeater(), face, preserve_size=True).shape == face.shape


def test_merges_xseg_masks_are_xsegs_of_the_swap_at_256_and_of_the_dst_face_in_bgr():
    """Found by review: nothing checked what merge_masks computes (the BGR flip, which half is which, the sizes)."""
    import cv2

    from bigbatch.faces.xseg import merge_masks

    weights = dfl_weights(base=2, seed=4)
    model = XSeg(base_ch=2)
    dfl.import_part(model, weights, "XSeg_256.npy")
    rng = np.random.default_rng(3)
    swap, dst = rng.random((64, 64, 3)).astype(np.float32), rng.random((256, 256, 3)).astype(np.float32)
    double = {k: v.astype(np.float64) for k, v in weights.items()}

    def want(face_rgb):  # DFL's: XSeg of the BGR face, clipped, 0 under 0.1, back to the model's 64 px bicubic
        logits = leras_xseg(face_rgb[..., ::-1].transpose(2, 0, 1).astype(np.float64), double, 2)[0]
        mask = np.clip(1 / (1 + np.exp(-logits)), 0, 1)
        mask[mask < 0.1] = 0
        return cv2.resize(mask.astype(np.float32), (64, 64), interpolation=cv2.INTER_CUBIC)

    ((of_swap, of_dst),) = merge_masks(model, [swap], [dst], 64)
    assert np.abs(of_swap - want(cv2.resize(swap, (256, 256), interpolation=cv2.INTER_CUBIC))).max() < 1e-4
    assert np.abs(of_dst - want(dst)).max() < 1e-4 and np.abs(of_swap - of_dst).max() > 0.05
    ((none, only_dst),) = merge_masks(model, [swap], [dst], 64, need=(False, True))  # (what xseg-dst reads)
    assert not none.any() and np.abs(only_dst - of_dst).max() < 1e-5
