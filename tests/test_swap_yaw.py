"""swap.uniform_yaw, DeepFaceLab's "uniform yaw distribution of samples": prepare keeps each aligned DFL face's
yaw from its landmarks, and training draws each side's faces evenly over bins of yaw, in an order that depends
only on the seed and the images seen (so resume and any rank count read the same faces)."""

from collections import Counter

import numpy as np
import pytest
import torch
from test_dfl_faces import dfl_jpeg, face_image, landmarks
from test_swap import _task, swap_config

import bigbatch
from bigbatch.cli import main
from bigbatch.data import load_data
from bigbatch.data.dfl_faces import face_yaw
from bigbatch.data.prepare import prepare
from bigbatch.data.streams import YawOrder
from bigbatch.tasks.interface import Feed

FRONTAL, PROFILE = 10, 2  # faces of each kind in a side's set


def turned(shift: float) -> np.ndarray:
    """A face's landmarks with its nose moved `shift` px sideways: the head turned (every face of a kind in one
    bin of yaw)."""
    points = landmarks(64)
    points[27:36, 0] += shift
    return points


@pytest.fixture
def yawed_faces(tmp_path):
    """src and dst face sets of aligned DFL faces (64 px): FRONTAL facing the camera (dark), PROFILE turned
    (bright), so that a face's kind shows in its pixels."""
    paths = []
    for side in ("src", "dst"):
        folder = tmp_path / "yawed" / side
        folder.mkdir(parents=True)
        for i in range(FRONTAL + PROFILE):
            profile = i >= FRONTAL
            image = face_image(64, seed=i) // 4 + (160 if profile else 0)
            meta = {"face_type": "whole_face", "landmarks": turned(16.0 if profile else 0.0).tolist()}
            (folder / f"{i:02d}.jpg").write_bytes(dfl_jpeg(image, meta))
        out = tmp_path / "yawed" / f"{side}.h5"
        prepare(str(folder), str(out), 64, workers=0)
        paths.append(out)
    return paths


def test_prepare_keeps_each_aligned_faces_yaw_and_info_says_so(yawed_faces, tmp_path, capsys):
    data = load_data(str(yawed_faces[0]), 64)
    expected = [face_yaw(turned(16.0 if i >= FRONTAL else 0.0)) for i in range(FRONTAL + PROFILE)]
    assert data.yaws is not None and np.allclose(data.yaws, expected, atol=1e-6)
    assert abs(data.yaws[:FRONTAL]).max() < 0.05 and (data.yaws[FRONTAL:] < -0.15).all()
    assert main(["info", str(yawed_faces[0])]) == 0
    assert "yaws" in capsys.readouterr().out
    # Images that are not aligned DFL faces carry none (and a swap with uniform_yaw is refused, below).
    plain = tmp_path / "plain"
    plain.mkdir()
    for i in range(3):
        from PIL import Image

        Image.fromarray(face_image(64, seed=i)).save(plain / f"{i}.jpg")
    prepare(str(plain), str(tmp_path / "plain.h5"), 64, workers=0)
    assert load_data(str(tmp_path / "plain.h5"), 64).yaws is None


def test_yaw_order_draws_every_bin_as_often_and_depends_only_on_the_position():
    rng = np.random.default_rng(0)
    yaws = np.concatenate([rng.normal(0, 0.004, 90), np.full(6, 0.7), np.full(4, -0.6)])  # 90 frontal, 10 turned
    order = YawOrder(yaws, seed=3)
    bins = len(order.bins)
    drawn = order.indices(0, bins * 60)
    # Each round of B positions takes every bin once; the turned faces' two bins are drawn as often as any.
    per_bin = Counter(int(np.digitize(yaws[i], np.linspace(-1, 1, 129)[1:-1])) for i in drawn.tolist())
    assert len(per_bin) == bins and set(per_bin.values()) == {60}
    turned_share = float(np.mean(np.abs(yaws[drawn.numpy()]) > 0.5))
    assert turned_share == pytest.approx(2 / bins) and turned_share > 0.1 * 3  # 10% of the set, far more drawn
    # Within a bin the faces come in permutations: the 6 faces of yaw 0.7 each once per 6 draws of their bin.
    seventy = [i for i in drawn.tolist() if yaws[i] == 0.7]
    assert all(sorted(seventy[k : k + 6]) == list(range(90, 96)) for k in range(0, 60, 6))
    # The order is the position's, however the positions are asked for (a resume, another rank's share)...
    pieces = torch.cat([order.indices(a, b - a) for a, b in ((0, 7), (7, 100), (100, bins * 60))])
    half = bins * 30
    assert torch.equal(pieces, drawn) and torch.equal(YawOrder(yaws, seed=3).indices(half, 50), drawn[half : half + 50])
    # ... and the seed's.
    assert not torch.equal(YawOrder(yaws, seed=4).indices(0, 200), drawn[:200])


def test_training_reads_the_sides_evenly_over_yaw(yawed_faces):
    cfg = swap_config(*yawed_faces, **{"swap.uniform_yaw": True, "swap.eyes_mouth_prio": False})
    task = _task(cfg)
    feed = Feed(task.src, bigbatch.data.Schedule.constant(0, 4), task.rep, cfg, order=task.data_order)
    read_dst = feed.companion(task.dst, task.dst_order)
    bright = []
    for _ in range(6):  # 24 faces a side: half of them the 2 of 12 that are turned
        src, dst = feed.next(), read_dst()
        bright += [float(side.images.float().mean(dim=(1, 2, 3)).gt(128).float().mean()) for side in (src, dst)]
    feed.close()
    assert np.mean(bright) == pytest.approx(0.5)
    plain = _task(swap_config(*yawed_faces, **{"swap.eyes_mouth_prio": False}))
    assert plain.data_order is None and plain.dst_order is None  # (off: the loop's own order)


def test_train_runs_with_uniform_yaw_and_refuses_faces_without_yaws(yawed_faces, faces, tmp_path, capsys):
    base = ["train", "--preset", "saehd_cpu", "model.options={archi='df-u',ae_dims=16,e_dims=4,d_dims=4,d_mask_dims=2}"]
    small = ["train.batch=4", "train.micro_batch=4", "train.kimg=0.008", "data.val_fraction=0", "eval.every_kimg=0"]
    src, dst = yawed_faces
    run = tmp_path / "run"
    argv = [*base, *small, f"data.path='{src}'", f"data.dst_path='{dst}'", "swap.uniform_yaw=true"]
    assert main([*argv, "--run-dir", str(run)]) == 0
    assert "swap.uniform_yaw: the faces in src's 2, dst's 2 bins of yaw" in capsys.readouterr().out
    assert bigbatch.Config.load(run / "config.toml").swap.uniform_yaw
    # DFL asks the option again at each restart: a resume may turn it off (said), the order then the loop's own.
    assert main(["train", "--run-dir", str(run), "--resume", "train.kimg=0.012", "swap.uniform_yaw=false"]) == 0
    assert "swap.uniform_yaw" in capsys.readouterr().err
    # Faces prepared from images without DFL's landmarks: one line naming the key and the fix, in training and
    # in the dry run (found by review: the dry run passed them).
    argv = [*base, *small, f"data.path='{faces[0]}'", f"data.dst_path='{dst}'", "swap.uniform_yaw=true"]
    for extra in (["--run-dir", str(tmp_path / "no")], ["--dry-run"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "swap.uniform_yaw" in err and "have none" in err and "aligned DeepFaceLab faces" in err
        assert len(err.splitlines()) == 1


def test_the_loop_reads_src_in_the_tasks_order(yawed_faces, tmp_path, monkeypatch):
    import bigbatch.loop

    orders = []

    class Spy(bigbatch.loop.Feed):
        def __init__(self, *args, order=None, **kwargs):
            orders.append(order)
            super().__init__(*args, order=order, **kwargs)

    monkeypatch.setattr(bigbatch.loop, "Feed", Spy)
    cfg = swap_config(*yawed_faces, **{"swap.uniform_yaw": True, "swap.eyes_mouth_prio": False, "train.kimg": 0.004})
    bigbatch.train(cfg, run_dir=tmp_path / "run")
    assert len(orders) == 1 and isinstance(orders[0], YawOrder)


def test_dfls_uniform_yaw_option_crosses_both_ways():
    from bigbatch.tasks.swap.files import config_of, dfl_options

    options = {"resolution": 64, "archi": "df-u", "ae_dims": 16, "e_dims": 4, "d_dims": 4, "d_mask_dims": 2}
    assert config_of({**options, "uniform_yaw": True}).swap.uniform_yaw
    assert not config_of({**options, "uniform_yaw": False}).swap.uniform_yaw
    cfg = bigbatch.preset("saehd_cpu").override({"swap.uniform_yaw": True})
    assert dfl_options(cfg, "wf")["uniform_yaw"] is True


def test_a_killed_prepares_parts_keep_the_yaws(tmp_path):
    from bigbatch.data.parts import Parts

    parts = Parts(tmp_path / "parts", {"k": 1})
    image = np.zeros((4, 4, 3), np.uint8)
    parts.save(0, [(0, image, "wf", (4, 4), -0.25), "not an image", (0, image, None, (4, 4), None)])
    back = Parts(tmp_path / "parts", {"k": 1}).load(0)
    assert [r if isinstance(r, str) else r[4] for r in back] == [-0.25, "not an image", None]


def test_a_face_without_usable_landmarks_keeps_its_image_and_says_why_no_yaws_are_kept(tmp_path, capsys, monkeypatch):
    """Found by review: a NaN landmark made the whole file "damaged", a landmark that is not a number skipped a
    good image as "corrupt", and one face without landmarks dropped every yaw without a word."""
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    folder = tmp_path / "faces"
    folder.mkdir()
    nan = turned(0.0)
    nan[0, 0] = np.nan
    for i, points in enumerate([turned(0.0), nan, [["a", "b"]] * 68, [[10**400, 0]] * 68]):
        meta = {"face_type": "whole_face", "landmarks": points if isinstance(points, list) else points.tolist()}
        (folder / f"{i}.jpg").write_bytes(dfl_jpeg(face_image(64, seed=i), meta))
    report = prepare(str(folder), str(tmp_path / "f.h5"), 64, workers=0)
    assert report.count == 4 and not report.skipped
    assert "3 of the 4 images carry no usable DeepFaceLab landmarks (none, NaN or not numbers; e.g. 1.jpg)" in (
        capsys.readouterr().err
    )
    assert load_data(str(tmp_path / "f.h5"), 64).yaws is None  # (and the file reads)
    # Their masks come from those landmarks: with --masks dfl such faces are skipped, saying why (found from
    # outside: a NaN one was kept with an empty mask, a string one called "corrupt").
    report = prepare(str(folder), str(tmp_path / "m.h5"), 64, workers=0, masks="dfl")
    assert report.count == 1 and [name for name, _ in report.skipped] == ["1.jpg", "2.jpg", "3.jpg"]
    assert "not all finite numbers" in report.skipped[0][1] and "are not numbers" in report.skipped[1][1]


def test_a_prepare_out_of_memory_keeps_what_it_decoded(tmp_path, monkeypatch):
    """Found by review: memory running out deleted the parts a rerun resumes from, though the message said to
    run again with fewer workers."""
    from PIL import Image

    from bigbatch.data import sources
    from bigbatch.data.parts import PART

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(PART + 8):
        Image.fromarray(np.full((4, 4, 3), i % 256, np.uint8)).save(folder / f"{i:04d}.png")
    real, calls = sources.decode, []

    def runs_out(*args, **kwargs):
        calls.append(1)
        if len(calls) > PART + 4:
            raise MemoryError
        return real(*args, **kwargs)

    monkeypatch.setattr(sources, "decode", runs_out)
    with pytest.raises(bigbatch.BigbatchError, match="out of memory decoding an image") as refused:
        prepare(str(folder), str(tmp_path / "m.h5"), workers=0)
    assert "again with fewer --workers or more memory, and it resumes where it stopped" in str(refused.value)
    assert list((tmp_path / ".m.h5.parts").glob("part-*.npz"))  # the first PART images, kept for the rerun


def test_a_model_converted_without_data_paths_resumes_on_the_data_given_then(faces, tmp_path):
    """Found from outside: refused for ever, as a checkpoint "from before data hashes were recorded" that could
    resume only on convert's placeholder paths. (Here beside uniform_yaw, which crosses convert too.)"""
    from test_swap import dfl_folder

    dfl_folder(tmp_path / "dfl")
    assert main(["convert", str(tmp_path / "dfl"), str(tmp_path / "run")]) == 0
    paths = [f"data.path={faces[0]}", f"data.dst_path={faces[1]}", "data.val_fraction=0.0", "eval.every_kimg=0.0"]
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--resume", "train.kimg=0.004", *paths]) == 0
