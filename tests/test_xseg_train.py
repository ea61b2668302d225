"""XSeg trained here, as DeepFaceLab trains it: the faces labelled in DFL's XSeg editor prepare with their
polygons drawn as DFL draws them (`prepare --masks labels`), `task = "xseg"` trains DFL's network on them with
DFL's augmentation, resumes bit for bit, and the model crosses to DFL's files and back, masks faces (`xseg
apply RUN`) and starts from DFL's own model (train.init_from)."""

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import skimage.data
import torch
from conftest import stopped_then_resumed
from safetensors.torch import load_file
from test_dfl_faces import dfl_jpeg, face_image, landmarks

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.cli import main
from bigbatch.data import dfl_faces
from bigbatch.data.dfl_faces import read_metadata
from bigbatch.data.load import training_data, validation_data
from bigbatch.data.prepare import prepare
from bigbatch.data.streams import generator
from bigbatch.errors import BigbatchError
from bigbatch.faces.xseg import load_xseg, model_file
from bigbatch.models import dfl
from bigbatch.tasks import build_task
from bigbatch.tasks.swap import warp
from bigbatch.tasks.xseg import augment
from bigbatch.tasks.xseg.task import XSegTask

RES = 256


def polygons(i):
    """A face's labels as DFL's editor saves them: an include polygon (an ellipse) and an exclude one inside."""
    cx, cy = 120 + 4 * i, 130 - 3 * i
    face = cv2.ellipse2Poly((cx, cy), (70, 90), 0, 0, 360, 10).astype(np.float32) + 0.7  # (DFL truncates them)
    hole = np.float32([[cx - 12, cy + 40], [cx + 12, cy + 40], [cx, cy + 62]])
    return {"polys": [{"type": 0, "pts": hole}, {"type": 1, "pts": face}]}  # (excludes saved first: drawn last)


def drawn(i):
    """DFL's SegIEPolys.overlay_mask of `polygons(i)`."""
    mask = np.zeros((RES, RES, 1), np.float32)
    polys = polygons(i)["polys"]
    for poly in sorted(polys, key=lambda p: p["type"] != 1):
        cv2.fillPoly(mask, [poly["pts"].astype(np.int32)], (1.0,) if poly["type"] == 1 else (0.0,))
    return mask[..., 0]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Eight aligned DFL faces, six of them labelled, and their prepared labels."""
    root = tmp_path_factory.mktemp("xseg")
    folder = root / "aligned"
    folder.mkdir()
    for i in range(8):
        image = face_image(RES, seed=i)
        image[drawn(i) > 0] = (190, 140, 110)  # the face: the labelled region
        meta = {"face_type": "whole_face", "landmarks": landmarks(seed=i), "source_filename": f"{i:05d}.png"}
        if i not in (2, 5):
            meta["seg_ie_polys"] = polygons(i)
        (folder / f"{i:05d}.jpg").write_bytes(dfl_jpeg(image, meta))
    report = prepare(str(folder), str(root / "labels.h5"), RES, workers=0, masks="labels")
    return folder, root / "labels.h5", report


def test_prepare_draws_dfls_labels_and_skips_faces_without(labelled):
    folder, h5, report = labelled
    assert report.count == 6 and sorted(name for name, _ in report.skipped) == ["00002.jpg", "00005.jpg"]
    assert all("no XSeg labels" in why for _, why in report.skipped)
    data = bigbatch.data.load_data(str(h5), RES)
    assert data.channels == 4 and data.meta.get("face_type") == "wf"
    images, _ = data.get(torch.arange(6))
    for row, i in enumerate((0, 1, 3, 4, 6, 7)):
        assert np.array_equal(images[row, ..., 3].numpy(), (drawn(i) * 255).astype(np.uint8))  # pixel for pixel
    assert drawn(0)[130 + 50, 120] == 0 and drawn(0)[130, 120] == 1  # (the exclude polygon cut out of the face)
    # DFL's older list form draws the same; polygons that are not DFL's are a reason, not a traceback
    meta = {"seg_ie_polys": [(p["type"], p["pts"].tolist()) for p in polygons(0)["polys"]] + [(1, [])]}
    assert np.array_equal(dfl_faces.label_mask(meta, (RES, RES)), drawn(0))  # (a polygon of no points passed over,
    # as DFL's overlay_mask passes it: found from outside, the face was refused)
    for bad in ({"polys": [{"pts": polygons(0)["polys"][1]["pts"]}]}, [(1, np.zeros((4, 3)))]):
        with pytest.raises(dfl_faces.NoFaceData, match="XSeg polygons are not DFL's"):
            dfl_faces.label_mask({"seg_ie_polys": bad}, (RES, RES))
    for eyes_mouth in ("some_folder", "dfl"):  # (dfl: found from outside, "give --masks dfl", which drops the labels)
        with pytest.raises(BigbatchError, match="--eyes-mouth is for a swap's faces, --masks labels for XSeg's"):
            prepare(str(folder), str(h5.parent / "x.h5"), RES, workers=0, masks="labels", eyes_mouth=eyes_mouth)


def test_prepare_takes_applied_xseg_masks_cut_at_half_where_no_face_is_labelled(labelled, tmp_path):
    # DFL's XSeg trainer falls back to the faces' applied masks, cut at 0.5 (fine-tuning on a model's own masks).
    folder, _, _ = labelled
    faces = tmp_path / "faces"
    faces.mkdir()
    soft = np.tile(np.linspace(0, 255, RES).astype(np.uint8), (RES, 1))  # (a ramp: half of it past 0.5)
    for i, path in enumerate(sorted(folder.glob("*.jpg"))[:3]):
        data = path.read_bytes()
        meta = read_metadata(data)
        meta.pop("xseg_mask", None)
        if i != 1:
            meta["xseg_mask"] = cv2.imencode(".png", soft)[1]
        (faces / path.name).write_bytes(dfl_faces.write_metadata(data, meta))
    report = prepare(str(faces), str(tmp_path / "applied.h5"), RES, workers=0, masks="xseg-applied")
    assert report.count == 2 and "no XSeg mask applied" in report.skipped[0][1]
    images, _ = bigbatch.data.load_data(str(tmp_path / "applied.h5"), RES).get(torch.arange(2))
    assert np.array_equal(images[0, ..., 3].numpy(), np.where(soft >= 128, 255, 0).astype(np.uint8))


def test_prepare_cuts_faces_of_other_types_to_one_as_dfls_xseg_trainer_does(labelled, tmp_path):
    from PIL import Image

    from bigbatch.data.align import transform_mat

    folder, _, _ = labelled
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for i, path in enumerate(sorted(folder.glob("*.jpg"))[:2]):  # (the second face extracted as full face)
        data = path.read_bytes()
        meta = read_metadata(data)
        meta["face_type"] = "full_face" if i else "whole_face"
        (mixed / path.name).write_bytes(dfl_faces.write_metadata(data, meta))
    with pytest.raises(
        BigbatchError, match="different DeepFaceLab face types.*an XSeg model trains on one: give --face-type"
    ):
        prepare(str(mixed), str(tmp_path / "m.h5"), RES, workers=0, masks="labels")
    report = prepare(str(mixed), str(tmp_path / "m.h5"), RES, workers=0, masks="labels", face_type="wf")
    data = bigbatch.data.load_data(str(tmp_path / "m.h5"), RES)
    assert report.count == 2 and data.meta["face_type"] == "wf"
    # The next prepare in this process is not cut (found by a test that ran after this one: it still was).
    with pytest.raises(BigbatchError, match="different DeepFaceLab face types"):
        prepare(str(mixed), str(tmp_path / "again.h5"), RES, workers=0, masks="labels")
    second = sorted(mixed.glob("*.jpg"))[1]
    raw = second.read_bytes()
    mat = transform_mat(dfl_faces.landmarks_of(read_metadata(raw)), RES, "wf")  # DFL's get_transform_mat
    image = np.asarray(Image.open(second).convert("RGB"))
    want = cv2.warpAffine(image, mat, (RES, RES), flags=cv2.INTER_LANCZOS4)
    label = cv2.warpAffine((dfl_faces.label_mask(read_metadata(raw), (RES, RES)) * 255).astype(np.uint8), mat,
                           (RES, RES), flags=cv2.INTER_LANCZOS4)  # fmt: skip
    got, _ = data.get(torch.tensor([1]))
    assert np.array_equal(got[0, ..., :3].numpy(), want) and np.array_equal(got[0, ..., 3].numpy(), label)
    first, _ = data.get(torch.tensor([0]))  # (the whole face as it was)
    assert np.array_equal(first[0, ..., :3].numpy(), np.asarray(Image.open(sorted(mixed.glob("*.jpg"))[0])))
    with pytest.raises(BigbatchError, match="--face-type cuts DeepFaceLab's aligned faces"):
        prepare(str(mixed), str(tmp_path / "x.h5"), RES, workers=0, masks="alpha", face_type="wf")


def test_the_augmentation_moves_the_label_with_the_face_and_does_not_depend_on_the_ranks(labelled):
    _, h5, _ = labelled
    faces, _ = bigbatch.data.load_data(str(h5), RES).get(torch.arange(4))
    x = faces.permute(0, 3, 1, 2).float() / 255
    draws = augment.draw(4, RES, generator(7, 20, 0))
    image, label = augment.apply(x, x.roll(1, 0), draws)
    assert image.shape == (4, 3, RES, RES) and label.shape == (4, 1, RES, RES)
    assert 0 <= image.min() and image.max() <= 1 and set(label.unique().tolist()) <= {0.0, 1.0}
    # The label is the face's label through the same warp the picture took (DFL warps both by one set of params).
    warped, _ = warp.apply(x, *draws[7:11], warp=True, masks_too=True)
    assert torch.equal(label, (warped[:, 3:4] >= 0.5).float())
    # Two ranks of two faces each augment exactly as one rank of four.
    halves = [augment.apply(x[s], x.roll(1, 0)[s], [d[s] for d in draws]) for s in (slice(0, 2), slice(2, 4))]
    assert torch.equal(torch.cat([h[0] for h in halves]), image)
    assert torch.equal(torch.cat([h[1] for h in halves]), label)
    again = augment.apply(x, x.roll(1, 0), augment.draw(4, RES, generator(7, 20, 0)))[0]
    other = augment.apply(x, x.roll(1, 0), augment.draw(4, RES, generator(7, 20, 4)))[0]
    assert torch.equal(again, image) and not torch.equal(other, image)  # the step's stream decides


def test_the_jpeg_round_trip_on_the_device_is_opencvs_within_a_level():
    # DFL's last augmentation re-compresses the face with cv2.imencode/imdecode; here it is computed on the device.
    image = skimage.data.astronaut()[:256, 128:384].copy()
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255
    for quality in (10, 30, 50, 75, 95):
        ours = augment.jpeg(x, torch.tensor([quality]))[0].permute(1, 2, 0).numpy() * 255
        _, encoded = cv2.imencode(".jpg", image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        theirs = cv2.imdecode(encoded, cv2.IMREAD_COLOR)[..., ::-1].astype(np.float64)
        off, lost = np.abs(ours - theirs).mean(), np.abs(theirs - image).mean()
        assert off < 1.0 and off < 0.4 * lost, (quality, off, lost)  # (mean 0.4-0.7 levels; JPEG's own loss 1.8-7.8)


ZIGZAG = [0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14,
          21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53,
          60, 61, 54, 47, 55, 62, 63]  # fmt: skip


def test_the_jpeg_tables_are_libjpegs_at_every_quality():
    # Read from OpenCV's own files (its DQT segments, in zigzag order); found by review: 33 of 91 qualities off by one.
    image = np.zeros((16, 16, 3), np.uint8)
    for quality in range(10, 101):
        data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes()
        theirs, at = [], data.find(b"\xff\xdb")
        while at >= 0:
            length = int.from_bytes(data[at + 2 : at + 4], "big")
            segment = data[at + 4 : at + 2 + length]
            while segment:  # (one segment may hold several tables: precision/id byte, then 64 values)
                theirs.append(list(segment[1:65]))
                segment = segment[65:]
            at = data.find(b"\xff\xdb", at + 2 + length)
        ours = [t[0].flatten()[ZIGZAG].int().tolist() for t in augment.quantisation_tables(torch.tensor([quality]))]
        assert ours == theirs[:2], quality


def xseg_config(h5, **over):
    cfg = bigbatch.preset("xseg").override(
        {
            "data.path": str(h5),
            "model.options": {"base_ch": 4},
            "train.batch": 4,
            "train.micro_batch": 2,
            "train.kimg": 0.016,
            "train.log_every_kimg": 0.004,
            "checkpoint.every_kimg": 0.008,
            "sample.every_kimg": 0.008,
        }
    )
    return cfg.override(over)


def test_xseg_trains_resumes_bit_exact_and_crosses_to_dfl_and_back(labelled, tmp_path, capsys):
    folder, h5, _ = labelled
    cfg = xseg_config(h5, **{"data.dst_path": str(h5)})  # (src's and dst's labelled faces, joined)
    capsys.readouterr()
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole", quiet=True)
    assert sorted(p.name for p in (whole / "samples").glob("preview-*.png"))
    fed = len(training_data(cfg)) + len(training_data(cfg.override({"data.path": cfg.data.dst_path})))
    assert f" epochs of {fed} images)" in capsys.readouterr().out  # (found from outside: src's alone)
    part = stopped_then_resumed(XSegTask, cfg, tmp_path / "part", at=8)
    ckpt = "checkpoints/000000.016/model.safetensors"
    assert (whole / ckpt).read_bytes() == (part / ckpt).read_bytes()
    # A resume may change the rate and the dropout (DFL asks again at each start), not the faces it reads.
    with pytest.raises(BigbatchError, match="the run was trained with the dst faces .* data.dst_path .none. differs"):
        bigbatch.train(cfg.override({"data.dst_path": "", "train.kimg": 0.02}), run_dir=part, resume=True, quiet=True)
    changed = cfg.override({"xseg.lr": 5e-4, "xseg.lr_dropout": False, "train.kimg": 0.02})
    bigbatch.train(changed, run_dir=part, resume=True, quiet=True)

    # The run masks faces; DFL's XSeg is base_ch 32 (its loader would start this one afresh): refused in one line.
    assert main(["eval", str(whole)]) == 2  # (found from outside: "not a GAN", and no way on)
    assert "the iou and val_loss rows of its metrics.jsonl" in capsys.readouterr().err
    assert main(["info", str(whole)]) == 0
    said = capsys.readouterr().out
    assert "rmsprop lr 0.0001, lr_dropout" in said and f"labelled faces {h5} and {h5}" in said and " sgd " not in said
    assert model_file(whole).read_bytes() == (whole / ckpt).read_bytes()  # (what merge's record digests)
    # Its checkpoints/ folder or checkpoints/latest (a shell's completion one step on) name the run (found from
    # outside: "not a readable DeepFaceLab file" and "holds no DeepFaceLab XSeg model").
    for named in (whole / "checkpoints" / "latest", whole / "checkpoints"):
        assert main(["xseg", "apply", str(named), str(folder)]) == 0
    assert main(["info", str(whole / "checkpoints" / "latest")]) == 0
    said = capsys.readouterr().out
    assert f"checkpoint  {whole / 'checkpoints' / '000000.016'}" in said and f"run         {whole}" in said
    assert main(["info", "--verify", str(whole / "checkpoints")]) == 0  # (found by review: called damaged)
    assert main(["xseg", "apply", str(whole), str(folder)]) == 0
    meta = read_metadata((folder / "00000.jpg").read_bytes())
    assert meta["xseg_mask"] is not None and cv2.imdecode(np.asarray(meta["xseg_mask"]), 0).shape == (RES, RES)
    capsys.readouterr()
    assert main(["export-dfl", str(whole), str(tmp_path / "dfl")]) == 2
    assert "base_ch 4, and DFL's is 32" in capsys.readouterr().err


def test_an_xseg_run_crosses_to_dfls_files_and_back(labelled, tmp_path, capsys):
    _, h5, _ = labelled
    cfg = xseg_config(h5, **{"model.options": {}, "train.batch": 2, "train.kimg": 0.002})  # (DFL's size: one step)
    run = bigbatch.train(
        cfg.override({"checkpoint.every_kimg": 0.002, "sample.every_kimg": 0.0}), run_dir=tmp_path / "r"
    )
    for args, says in [
        (["--name", "me"], "DFL's XSeg model has no name"),
        (["--face-type", "f"], "was trained on faces of DFL's face type 'wf', not 'f'"),
    ]:
        assert main(["export-dfl", str(run), str(tmp_path / "dfl"), *args]) == 2
        assert says in capsys.readouterr().err
    (tmp_path / "dfl").mkdir()  # (found from outside: an earlier DFL model's moments kept beside the new weights)
    (tmp_path / "dfl" / "XSeg_256_opt.npy").write_bytes(b"an earlier model's RMSprop moments")
    assert main(["export-dfl", str(run), str(tmp_path / "dfl")]) == 0
    assert sorted(p.name for p in (tmp_path / "dfl").iterdir()) == ["XSeg_256.npy", "XSeg_data.dat"]
    model, kind = load_xseg(tmp_path / "dfl")
    trained = load_file(next((run / "checkpoints").glob("0*/model.safetensors")))
    assert kind == "wf" and all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    assert dfl.read_pickle(tmp_path / "dfl" / "XSeg_data.dat")["options"] == {
        "face_type": "wf", "pretrain": False, "batch_size": 2
    }  # fmt: skip
    start = cfg.override({"train.init_from": str(tmp_path / "dfl")})
    first = build_task(start, replicator_for(start), training_data(start)).nets()["model"].state_dict()
    assert all(torch.equal(first[k], v) for k, v in trained.items())
    with pytest.raises(BigbatchError, match="was trained on f faces, and these are wf"):
        (tmp_path / "dfl" / "XSeg_data.dat").write_bytes(dfl.dumps({"iter": 1, "options": {"face_type": "f"}}))
        build_task(start, replicator_for(start), training_data(start))
    # ... and so does its dry run (found from outside: it passed the start the run refused)
    assert main(["train", "--config", str(run), f"train.init_from={tmp_path / 'dfl'}", "--dry-run"]) == 2
    assert "was trained on f faces, and these are wf" in capsys.readouterr().err


def test_xseg_learns_the_labels_and_scores_faces_it_never_trained_on(labelled, tmp_path):
    _, h5, _ = labelled
    fast = {"xseg.lr": 2e-3, "xseg.lr_dropout": False, "train.kimg": 0.12, "train.micro_batch": 4}
    held = {"data.val_fraction": 0.2, "eval.every_kimg": 0.04, "eval.batch_size": 2}  # (2 of the 6 faces)
    cfg = xseg_config(h5, **fast, **held, **{"checkpoint.every_kimg": 0.12, "sample.every_kimg": 0.0})
    train_faces, val_faces = training_data(cfg), validation_data(cfg)  # (the scores are of faces never trained on)
    assert len(train_faces) == 4 and len(val_faces) == 2
    assert not set(train_faces.indices.tolist()) & set(val_faces.indices.tolist())
    run = bigbatch.train(cfg, run_dir=tmp_path / "r")
    scored = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"iou"' in line]
    assert len(scored) == 3 and all(0 <= r["iou"] <= 1 and r["val_loss"] > 0 for r in scored)
    assert scored[-1]["iou"] > 0.6 and scored[-1]["val_loss"] < scored[0]["val_loss"]
    assert (run / "checkpoints" / "best" / "model.safetensors").is_file()
    model, _ = load_xseg(run)
    faces, _ = bigbatch.data.load_data(str(h5), RES).get(torch.arange(6))
    x = faces.permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        pred = torch.sigmoid(model(x[:, :3].flip(1))) >= 0.5
    truth = x[:, 3:4] >= 0.5
    iou = (pred & truth).sum() / (pred | truth).sum()
    assert iou > 0.8  # (an untrained network's: 0.0 to 0.3 over three seeds)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"data.resolution": 128}, 'must be 256 for task = "xseg"'),
        ({"train.lr": 0.05}, 'is not read by task = "xseg"'),
        ({"model.ch": 16}, r"its network is DFL's XSeg \(base_ch 32\)"),  # (was told of the optimizer: from outside)
        ({"swap.lr": 0.1}, 'is read by task = "swap" only'),
        ({"eval.every_kimg": 1.0, "data.val_fraction": 0.0}, "asks for held-out scores"),
        ({"eval.every_kimg": 1.0, "data.val_fraction": 0.1, "eval.best": "fid"}, "must be one of iou, val_loss"),
        ({"data.val_path": "x.h5"}, "holds out data.val_fraction"),
    ],
)
def test_xseg_configs_that_would_do_nothing_are_refused(labelled, over, message):
    with pytest.raises(BigbatchError, match=message):
        xseg_config(labelled[1], **over)


def test_xseg_keys_are_refused_by_the_other_tasks():
    with pytest.raises(BigbatchError, match="'xseg.lr' is read by task = \"xseg\" only"):
        bigbatch.preset("saehd_cpu").override({"xseg.lr": 0.1})


def test_two_processes_train_the_xseg_of_one_bit_for_bit(labelled, tmp_path):
    # 2 processes x 1 micro-batch of 2 against 1 process x 2: the augmentation's draws, the backgrounds and the
    # lr dropout follow global positions, so every weight is equal.
    _, h5, _ = labelled
    args = [
        "--preset", "xseg", f"data.path={h5}", f"data.dst_path={h5}", "model.options={base_ch=4}", "train.batch=4",
        "train.micro_batch=2", "train.kimg=0.008", "checkpoint.every_kimg=0.008", "sample.every_kimg=0.008",
        "train.log_every_kimg=0.004",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BIGBATCH_CACHE": str(tmp_path / "cache")}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    runs = {}
    for procs in (1, 2):
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"] if procs > 1 else []
        cmd = [sys.executable, *launch, "-m", "bigbatch.cli", "train", *args, "--run-dir", str(tmp_path / str(procs))]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[procs] = tmp_path / str(procs)
    assert '"world_size": 2' in (runs[2] / "plan.json").read_text()
    a, b = (load_file(runs[n] / "checkpoints" / "000000.008" / "model.safetensors") for n in (1, 2))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def logged(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k not in ("seconds", "img_per_s")} for row in rows]

    assert logged(runs[1]) == logged(runs[2]) and "loss_xseg" in logged(runs[1])[0]


def test_the_dry_run_refuses_what_xseg_training_refuses(labelled, tmp_path, capsys):
    folder, h5, _ = labelled
    prepare(str(folder), str(tmp_path / "small.h5"), 128, workers=0, masks="labels")
    prepare(str(folder), str(tmp_path / "plain.h5"), RES, workers=0)  # (no labels: RGB only)
    prepare(str(folder), str(tmp_path / "f.h5"), RES, workers=0, masks="labels", face_type="f")
    for over, says in [
        (  # (found from outside: it said to extract them again, where prepare --face-type cuts them)
            [f"data.path={h5}", f"data.dst_path={tmp_path / 'f.h5'}"],
            "the src faces are of DFL's face type 'wf' and the dst faces of 'f'; an XSeg model takes one: prepare the "
            "dst faces again with --face-type wf",
        ),
        ([f"data.path={tmp_path / 'small.h5'}"], "are 128 px, the model data.resolution = 256"),
        ([f"data.path={h5}", f"data.dst_path={tmp_path / 'plain.h5'}"], "XSeg trains on RGB + its label (4)"),
        ([f"data.path={h5}", "model.options={width=2}"], "'xseg' has no option 'width'"),
        ([f"data.path={h5}", "xseg.face_type=f"], "but the faces are 'wf': give xseg.face_type=wf"),
    ]:
        assert main(["train", "--preset", "xseg", *over, "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
    assert main(["train", "--preset", "xseg", f"data.path={h5}", "--dry-run"]) == 0
    assert "not XSeg labels" not in capsys.readouterr().err
    # A set of swap masks (landmarks' hulls where no XSeg mask is applied) trains, said (found from outside: unsaid)
    prepare(str(folder), str(tmp_path / "hulls.h5"), RES, workers=0, masks="dfl")
    capsys.readouterr()
    assert main(["train", "--preset", "xseg", f"data.path={tmp_path / 'hulls.h5'}", "--dry-run"]) == 0
    assert "hold masks prepared with --masks dfl, not XSeg labels: XSeg learns to draw" in capsys.readouterr().err
    # --masks labels prepares at XSeg's side unless told (found from outside: 512 px faces kept theirs)
    (tmp_path / "big").mkdir()
    meta = {"face_type": "whole_face", "landmarks": np.asarray(landmarks(seed=0)) * 2, "source_filename": "0.png"}
    meta["seg_ie_polys"] = {"polys": [{"type": 1, "pts": polygons(0)["polys"][1]["pts"] * 2}]}
    (tmp_path / "big" / "0.jpg").write_bytes(dfl_jpeg(face_image(2 * RES, seed=0), meta))
    assert main(["prepare", str(tmp_path / "big"), str(tmp_path / "side.h5"), "--masks", "labels"]) == 0
    assert bigbatch.data.load_data(str(tmp_path / "side.h5"), 0).resolution == 256
    # prepare's closing hint names a config that trains (found from outside: it named data.resolution=128)
    assert main(["prepare", str(folder), str(tmp_path / "s.h5"), "--masks", "labels", "--resolution", "128"]) == 0
    assert "XSeg trains on 256 px faces: prepare them again with --resolution 256" in capsys.readouterr().out
    assert main(["info", str(h5)]) == 0
    assert "XSeg labels (drawn in DFL's XSeg editor); face type wf" in capsys.readouterr().out
