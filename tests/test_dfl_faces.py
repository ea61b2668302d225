"""DeepFaceLab's aligned faces prepare as they are: `bigbatch prepare --masks dfl --eyes-mouth dfl`
reads the metadata DFL's extractor writes into each JPEG (an APP15 segment holding a pickled dict,
DFLIMG/DFLJPG.py), takes XSeg's mask or the landmarks' hull as DFL's trainer does, refuses metadata
that would run code, and skips (and lists) images without it."""

import io
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import bigbatch
from bigbatch.data import dfl_faces
from bigbatch.data.prepare import prepare
from bigbatch.errors import BigbatchError


def landmarks(size=256, shift=(0.0, 0.0), seed=0):
    """A plausible 68-point face (dlib's order) in an aligned image of `size` pixels."""
    rng = np.random.default_rng(seed)
    s = size / 256
    jaw = [(40 + 176 * t, 120 + 110 * np.sin(np.pi * t)) for t in np.linspace(0, 1, 17)]
    brows = [(60 + 14 * i, 92 - 6 * np.sin(np.pi * i / 4)) for i in range(5)]
    brows += [(140 + 14 * i, 92 - 6 * np.sin(np.pi * i / 4)) for i in range(5)]
    nose = [(128, 110 + 12 * i) for i in range(4)] + [(112 + 8 * i, 160 - 4 * abs(i - 2)) for i in range(5)]

    def eye(cx):
        return [(cx - 16, 118), (cx - 8, 112), (cx + 8, 112), (cx + 16, 118), (cx + 8, 123), (cx - 8, 123)]

    outer = [(128 + 30 * np.cos(a), 190 + 12 * np.sin(a)) for a in np.linspace(np.pi, 3 * np.pi, 13)[:-1]]
    inner = [(128 + 18 * np.cos(a), 190 + 5 * np.sin(a)) for a in np.linspace(np.pi, 3 * np.pi, 9)[:-1]]
    points = np.array(jaw + brows + nose + eye(92) + eye(164) + outer + inner, dtype=np.float64)
    assert points.shape == (68, 2)
    return (points + np.array(shift) + rng.normal(0, 1, points.shape)) * s


def dfl_jpeg(image, meta):
    """A JPEG as DFL's DFLJPG.dump writes it: the pickled dict in an APP15 segment after the last APPn."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    data = buffer.getvalue()
    at = 2
    while data[at] == 0xFF and 0xE0 <= data[at + 1] <= 0xEF:  # past the APPn segments
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    payload = pickle.dumps(meta)
    return data[:at] + b"\xff\xef" + (len(payload) + 2).to_bytes(2, "big") + payload + data[at:]


def face_image(size=256, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((size, size, 3)) * 80 + 60).astype(np.uint8)


def cv2_hull(size, points, mod=1.0):
    """DFL's get_image_hull_mask on OpenCV, as LandmarksProcessor computes it."""
    cv2 = pytest.importorskip("cv2")
    lm = dfl_faces._expand_eyebrows(points, mod).astype(np.int32)
    parts = [
        (lm[0:9], lm[17:18]), (lm[8:17], lm[26:27]), (lm[17:20], lm[8:9]), (lm[24:27], lm[8:9]),
        (lm[19:25], lm[8:9]), (lm[17:22], lm[27:28], lm[31:36], lm[8:9]),
        (lm[22:27], lm[27:28], lm[31:36], lm[8:9]), (lm[27:31], lm[31:36]),
    ]  # fmt: skip
    mask = np.zeros((size, size, 1), np.float32)
    for part in parts:
        cv2.fillConvexPoly(mask, cv2.convexHull(np.concatenate(part)), (1,))
    return mask[..., 0]


def cv2_eyes_mouth(size, points):
    cv2 = pytest.importorskip("cv2")
    lm = points.astype(np.int32)
    total = np.zeros((size, size), np.float32)
    for hulls in ([lm[36:42], lm[42:48]], [lm[60:]]):
        mask = np.zeros((size, size, 1), np.float32)
        for h in hulls:
            cv2.fillConvexPoly(mask, cv2.convexHull(h), (1,))
        d = size // 32
        mask = cv2.dilate(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (d, d)), iterations=1)
        k = size // 16
        k += 1 - k % 2
        total += cv2.GaussianBlur(mask, (k, k), 0)
    return np.clip(total, 0, 1)


@pytest.mark.parametrize("size", [48, 64, 256, 512])
def test_the_masks_are_dfls(size):
    # Pixel for pixel (Pillow's polygons, used before, made the eyes-and-mouth plane 3-6% smaller than DFL's,
    # and a face of 32 to 63 px failed: its dilation kernel was empty).
    points = landmarks(size)
    ours = dfl_faces.hull_mask((size, size), points, 1.0)
    assert ours.sum() > 0.2 * size * size and np.array_equal(ours, cv2_hull(size, points))
    raised = dfl_faces.hull_mask((size, size), points, 2.0)
    assert raised.sum() > ours.sum() and (raised >= ours).all()  # eyebrows_expand_mod raises the brows
    em = dfl_faces.eyes_mouth_mask((size, size), points)
    assert 0 < em.max() <= 1 and np.array_equal(em, cv2_eyes_mouth(size, points))


def test_prepare_reads_dfls_aligned_faces(tmp_path):
    folder = tmp_path / "aligned"
    folder.mkdir()
    cv2 = pytest.importorskip("cv2")
    for i in range(4):
        meta = {"face_type": "whole_face", "landmarks": landmarks(seed=i), "source_filename": f"{i:05d}.png",
                "eyebrows_expand_mod": 1.0, "source_rect": (10, 20, 200, 220)}  # fmt: skip
        if i == 1:  # XSeg's mask, compressed into the image as DFL's set_xseg_mask does
            xseg = np.zeros((256, 256), np.uint8)
            xseg[64:192, 80:176] = 255
            meta["xseg_mask"] = cv2.imencode(".png", xseg)[1]
        (folder / f"{i:05d}.jpg").write_bytes(dfl_jpeg(face_image(seed=i), meta))
    Image.fromarray(face_image()).save(folder / "plain.jpg")  # an image with no DFL metadata
    # A face in a sub-folder is not one of the set, as DFL's trainer reads its folder (found from outside: a
    # rejects/ folder was taken as the one class, and the faces beside it left out).
    (folder / "rejects").mkdir()
    (folder / "rejects" / "00009.jpg").write_bytes((folder / "00002.jpg").read_bytes())
    report = prepare(str(folder), str(tmp_path / "faces.h5"), 128, workers=2, masks="dfl", eyes_mouth="dfl")
    skipped = dict(report.skipped)
    assert report.count == 4 and sorted(skipped) == ["plain.jpg", "rejects/00009.jpg"]
    assert "no DeepFaceLab metadata" in skipped["plain.jpg"]
    assert skipped["rejects/00009.jpg"].startswith("in a sub-folder: a face set is its folder's top level")
    data = bigbatch.data.load_data(str(tmp_path / "faces.h5"), 128)
    images, _ = data.get(np.arange(4))
    images = images.numpy()
    assert data.channels == 5
    hull = np.asarray(Image.fromarray(cv2_hull(256, landmarks(seed=0)) * 255).convert("L").resize((128, 128)))
    assert np.abs(images[0, ..., 3].astype(float) - hull).mean() < 8  # the landmarks' hull, resized
    xseg = images[1, ..., 3]
    assert xseg[40:88, 48:80].min() > 200 and xseg[:24].max() < 40  # XSeg's mask, not the hull
    em = images[0, ..., 4]
    assert em.max() > 200 and em[112:].max() < 10 and em[:40].max() < 10  # eyes and mouth; not above nor below
    # Without --eyes-mouth: four channels; --eyes-mouth dfl needs --masks dfl.
    assert prepare(str(folder), str(tmp_path / "m.h5"), 64, workers=0, masks="dfl").shape[2] == 4
    with pytest.raises(BigbatchError, match="--eyes-mouth dfl reads DeepFaceLab's aligned faces: give --masks dfl"):
        prepare(str(folder), str(tmp_path / "x.h5"), 64, workers=0, masks="alpha", eyes_mouth="dfl")


class Made:
    """Pickled as the call `call` (a callable and its arguments)."""

    def __init__(self, call):
        self.call = call

    def __reduce__(self):
        return self.call


def test_metadata_that_would_run_code_is_refused(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("touch hacked",))

    folder = tmp_path / "aligned"
    folder.mkdir()
    good = {"landmarks": landmarks()}
    (folder / "a.jpg").write_bytes(dfl_jpeg(face_image(), good))
    (folder / "b.jpg").write_bytes(dfl_jpeg(face_image(), {"landmarks": landmarks(), "x": Exploit()}))
    report = prepare(str(folder), str(tmp_path / "f.h5"), 64, workers=0, masks="dfl")
    assert report.count == 1 and "asks to load posix.system" in report.skipped[0][1]
    assert not (tmp_path / "hacked").exists() and not os.path.exists("hacked")
    out = subprocess.run(
        [sys.executable, "-m", "bigbatch.cli", "prepare", str(folder), str(tmp_path / "g.h5"), "--resolution", "64",
         "--masks", "dfl", "--strict", "--workers", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2 and "refusing it" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "hacked").exists()
    # Found from outside: 254 bytes of nested shared lists grew to 2 GB read as landmarks (2**k numbers).
    bomb = [0.0, 0.0]
    for _ in range(30):
        bomb = [bomb, bomb]
    (folder / "b.jpg").write_bytes(dfl_jpeg(face_image(), {"landmarks": bomb}))
    report = prepare(str(folder), str(tmp_path / "h.h5"), 64, workers=0, masks="dfl")
    assert report.count == 1 and "would hold more than 50,000,000 items when read" in report.skipped[0][1]
    loop: list = []
    loop.append(loop)  # (a container inside itself: the check's walk ends, and refuses it)
    (folder / "b.jpg").write_bytes(dfl_jpeg(face_image(), {"landmarks": loop}))
    report = prepare(str(folder), str(tmp_path / "i.h5"), 64, workers=0, masks="dfl")
    assert report.count == 1 and "holds a container inside itself" in report.skipped[0][1]
    # Arrays only as NumPy pickles them: not one of any size made of uninitialised memory (found by review).
    reconstruct = np.arange(1).__reduce__()[0]  # (NumPy's _reconstruct, what an array's pickle calls)
    for k, (call, words) in enumerate(
        [
            ((np.ndarray, ((68, 2),)), "asks to make an array of uninitialised memory"),
            ((reconstruct, (np.ndarray, (1 << 40,), b"b")), "asks to make an array other than as NumPy pickles one"),
        ]
    ):
        (folder / "b.jpg").write_bytes(dfl_jpeg(face_image(), {"landmarks": Made(call)}))
        report = prepare(str(folder), str(tmp_path / f"j{k}.h5"), 64, workers=0, masks="dfl")
        assert report.count == 1 and words in report.skipped[0][1], report.skipped


def test_the_face_type_is_read_recorded_by_the_run_and_must_agree(tmp_path):
    # DFL's merger crops by the face type: prepare reads it from the faces, the run records it, export-dfl
    # writes it. Faces of two types are refused in one line (a model takes one).
    from bigbatch.batching import replicator_for
    from bigbatch.data.load import training_data
    from bigbatch.tasks import build_task

    paths = {}
    for side, types in (("src", ["full_face"] * 3), ("dst", ["full_face"] * 3), ("mixed", ["full_face", "head"])):
        folder = tmp_path / side
        folder.mkdir()
        for i, face_type in enumerate(types):
            meta = {"face_type": face_type, "landmarks": landmarks(seed=i)}
            (folder / f"{i}.jpg").write_bytes(dfl_jpeg(face_image(seed=i), meta))
        paths[side] = tmp_path / f"{side}.h5"
    with pytest.raises(
        BigbatchError,
        match=r"face types: f \(0.jpg\), head \(1.jpg\); a SAEHD model trains on one: give --face-type",
    ):
        prepare(str(tmp_path / "mixed"), str(paths["mixed"]), 64, workers=0, masks="dfl")
    assert not paths["mixed"].exists()
    for side in ("src", "dst"):
        prepare(str(tmp_path / side), str(paths[side]), 64, workers=0, masks="dfl")
    assert bigbatch.data.hdf5.read_meta(paths["src"])["face_type"] == "f"
    prepare(str(tmp_path / "src"), str(tmp_path / "plain.h5"), 64, workers=0)  # (without masks too: found from
    assert bigbatch.data.hdf5.read_meta(tmp_path / "plain.h5")["face_type"] == "f"  # outside, its yaws alone)
    assert "face mask; face type f" in bigbatch.data.describe_data(paths["src"])  # bigbatch info
    tiny = {"archi": "df", "ae_dims": 16, "e_dims": 4, "d_dims": 4, "d_mask_dims": 2}
    over = {"data.path": str(paths["src"]), "data.dst_path": str(paths["dst"]), "model.options": tiny}
    over.update({"train.batch": 2, "data.val_fraction": 0.0, "eval.every_kimg": 0.0})
    cfg = bigbatch.preset("saehd_cpu").override(over)
    task = build_task(cfg, replicator_for(cfg), training_data(cfg))
    assert task.model_info()["face_type"] == "f"
    wrong = cfg.override({"swap.face_type": "wf"})
    with pytest.raises(BigbatchError, match="'swap.face_type' is 'wf', but the faces are 'f'"):
        build_task(wrong, replicator_for(wrong), training_data(wrong))
    # Resumed, the face type is the model's: the faces are to prepare again (found from outside: told to give
    # swap.face_type=f, which the resume then refused).
    with pytest.raises(BigbatchError, match="model is 'wf', but the faces are 'f': prepare them again with --face-"):
        build_task(wrong, replicator_for(wrong), training_data(wrong), resumed_at=64)
    # Sides of two types: the one to prepare again is the model's (found from outside: the src side's was offered,
    # which the model's swap.face_type then refused).
    prepare(str(tmp_path / "src"), str(tmp_path / "src_wf.h5"), 64, workers=0, masks="dfl", face_type="wf")
    two = cfg.override({"data.path": str(tmp_path / "src_wf.h5"), "swap.face_type": "f"})
    with pytest.raises(BigbatchError, match="a SAEHD model takes one: prepare the src faces again with --face-type f"):
        build_task(two, replicator_for(two), training_data(two))
    # Its eval refuses them too, as training and swap do (found from outside: scored without a word).
    from bigbatch.tasks.swap.report import evaluate_swap

    run = bigbatch.train(cfg.override({"train.kimg": 0.002}), run_dir=tmp_path / "run", quiet=True)
    with pytest.raises(BigbatchError, match=r"src_wf.h5 holds faces of DFL's face type 'wf', and the model was .* 'f'"):
        evaluate_swap(run, str(tmp_path / "src_wf.h5"))
    assert evaluate_swap(run, str(paths["src"]))["src_n"] == 3
