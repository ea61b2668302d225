"""bigbatch merge: swapped faces put back into frames as DFL's merger puts them (checked against DFL's own
MergeMasked's outputs, tests/data/dfl_faces_golden.npz), and the whole workflow a user runs, through the CLI:
a video -> extract -> prepare --masks dfl -> train -> merge --video."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

pytest.importorskip("dlib")
pytest.importorskip("av")
pytest.importorskip("skimage")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _faces  # noqa: E402

import bigbatch  # noqa: E402
from bigbatch.cli import main  # noqa: E402
from bigbatch.data import align  # noqa: E402
from bigbatch.errors import BigbatchError  # noqa: E402
from bigbatch.faces import merge, merge_run  # noqa: E402

GOLDEN = np.load(Path(__file__).parent / "data" / "dfl_faces_golden.npz", allow_pickle=False)
DFL_MASKS = {0: "full", 1: "hull", 2: "learned-prd", 3: "learned-dst", 4: "learned", 5: "learned-sum"}


def _golden_predictor(kind: str):
    """The golden data's stand-in model (its masks, and a tint given in BGR), on RGB faces."""
    prd_mask = GOLDEN["merge_prd_mask_u8"].astype(np.float32) / 255
    dst_mask = GOLDEN["merge_dst_mask_u8"].astype(np.float32) / 255
    mul = np.asarray(GOLDEN["merge_tint_mul"], np.float32)[::-1]
    add = np.asarray(GOLDEN["merge_tint_add"], np.float32)[::-1]

    def face(x):
        return np.clip(x * mul + add, 0, 1).astype(np.float32) if kind == "tint" else x.copy()

    return lambda x: (face(x), prd_mask.copy(), dst_mask.copy())


def _settings(row) -> merge.MergeSettings:
    mode, mask, erode, blur, ct, scale, masked, threshold, _ = (int(v) for v in row)
    ct_name = str(GOLDEN["merge_ctm_names"][ct])
    return merge.MergeSettings(
        mode=str(GOLDEN["merge_mode_names"][mode]),
        mask=DFL_MASKS[mask],
        erode=erode,
        blur=blur,
        color="none" if ct_name == "None" else ct_name,
        scale=scale,
        hist_threshold=threshold,
        masked_hist=bool(masked),
    )


@pytest.mark.parametrize("case", range(len(GOLDEN["merge_names"])), ids=list(GOLDEN["merge_names"]))
def test_a_merge_is_dfls_within_a_few_levels(case):
    """Every mode (overlay, hist-match, seamless, seamless-hist-match, raw-rgb), DFL's mask modes, erode and
    dilate, blur, rct and the output scale give DFL's merged frame: the same pixels but a few, off by a few
    levels at most (bicubic warps of float32 frames, where OpenCV's rounding and ours part)."""
    frame = np.ascontiguousarray(GOLDEN["merge_frame"][..., ::-1])
    want = (GOLDEN["merge_frame"].astype(np.int16) + GOLDEN["merge_out_delta"][case]).astype(np.uint8)[..., ::-1]
    row = GOLDEN["merge_settings"][case]
    predictor = _golden_predictor(str(GOLDEN["merge_predictors"][row[-1]]))
    res = int(GOLDEN["merge_resolution"])
    out, mask = merge.merge_frame(frame, [GOLDEN["merge_landmarks"]], predictor, res, align.FaceType.WHOLE_FACE,
                                  _settings(row))  # fmt: skip
    diff = np.abs(out.astype(int) - want)
    assert diff.max() <= 8 and diff.mean() < 0.1 and (diff > 2).mean() < 2e-3  # (a full mask: its hard edge)
    mask_diff = np.abs(mask.astype(int) - GOLDEN["merge_mask"][case])
    assert mask_diff.max() <= 6 and mask_diff.mean() < 0.2


def test_raw_predict_is_the_models_face_and_mask():
    frame = np.ascontiguousarray(GOLDEN["merge_frame"][..., ::-1])
    row = GOLDEN["merge_rawpredict_settings"]
    res = int(GOLDEN["merge_resolution"])
    out, mask = merge.merge_frame(frame, [GOLDEN["merge_landmarks"]], _golden_predictor("tint"), res,
                                  align.FaceType.WHOLE_FACE, _settings(row))  # fmt: skip
    diff = np.abs(out.astype(int) - GOLDEN["merge_rawpredict_out"][..., ::-1])
    assert diff.max() <= 4 and diff.mean() < 0.25  # (the square sampled bicubically: an ulp moves a level)
    assert np.abs(mask.astype(int) - GOLDEN["merge_rawpredict_mask"]).max() <= 2


def test_an_identity_model_changes_nothing_but_resampling():
    """A model that gives back its input merges into the frame it came from (bicubic there and back)."""
    frame, _ = next(_faces.frames(1, 480, 360))
    from bigbatch.faces.extract import Extractor, Settings

    (face,) = Extractor(Settings()).find(frame)
    ones = np.ones((256, 256), np.float32)
    s = merge.MergeSettings(mask="full", color="none")
    out, mask = merge.merge_frame(
        frame, [face.landmarks], lambda x: (x.copy(), ones, ones), 256, align.FaceType.WHOLE_FACE, s
    )
    inside = mask > 250
    assert inside.mean() > 0.1
    error = np.abs(out.astype(np.float64) - frame)[inside].mean()
    assert error < 1.5  # (DFL's own merge of this: 0.83/255 on the astronaut, FACES.md)


def test_super_resolution_merges_the_enhanced_swap_at_4x_where_the_face_was():
    """An identity model whose 'enhancer' is a plain 4x resize merges back into the frame it came from, at 4x:
    the geometry of DFL's output_size (the face cut at 4x, the model fed it resized down, the masks at 4x)."""
    frame, _ = next(_faces.frames(1, 480, 360))
    from bigbatch.faces.extract import Extractor, Settings

    (face,) = Extractor(Settings()).find(frame)
    ones = np.ones((64, 64), np.float32)
    errors = []
    for power in (0, 100):
        s = merge.MergeSettings(mask="full", color="none", super_resolution=power)

        def up(x):
            return cv2.resize(x, (256, 256), interpolation=cv2.INTER_CUBIC)

        out, mask = merge.merge_frame(
            frame, [face.landmarks], lambda x: (x.copy(), ones, ones), 64, align.FaceType.FULL, s, enhancer=up
        )
        inside = mask > 250
        errors.append(np.abs(out.astype(np.float64) - frame)[inside].mean())
    assert errors[1] < 0.9 * errors[0] and errors[1] < 3.5  # (the face at 4x: nearer the frame than at 64 px)
    # XSeg's mask of the swap is taken of the enhanced 4x swap, as DFL's: the swap and its enhancement mixed by the
    # power (before, it was refused with super resolution)
    given, seen, zeros = [], [], np.zeros((64, 64), np.float32)

    def segmenter(face):
        seen.append(face)
        return np.ones(face.shape[:2], np.float32)

    def merged(mask, **kw):
        s = merge.MergeSettings(mask=mask, color="none", super_resolution=50)

        def predict(x):  # (XSeg's masks of the swap before its enhancement: 0)
            given.append(x)
            return x.copy(), ones, ones, zeros, ones

        return merge.merge_frame(frame, [face.landmarks], predict, 64, align.FaceType.FULL, s, enhancer=up, **kw)[0]

    assert np.array_equal(merged("xseg-prd", segmenter=segmenter), merged("full"))
    enhanced = np.clip(cv2.resize(given[0], (256, 256)) * 0.5 + up(given[0]) * 0.5, 0, 1)
    assert len(seen) == 1 and np.allclose(seen[0], enhanced)


def test_the_xseg_masks_are_dfls_mask_modes_6_to_9():
    """xseg-prd, xseg-dst, xseg (both) and learned*xseg (all four) take XSeg's masks of the swap and of the dst
    face where DFL's MergeMasked takes them: each merges as the learned mask of the same values would."""
    frame, _ = next(_faces.frames(1, 480, 360))
    from bigbatch.faces.extract import Extractor, Settings

    (face,) = Extractor(Settings()).find(frame)
    ones, left = np.ones((64, 64), np.float32), np.zeros((64, 64), np.float32)
    left[:, :32] = 1
    top = left.T.copy()

    def merged(mask, outputs):
        s = merge.MergeSettings(mask=mask, color="none")
        return merge.merge_frame(frame, [face.landmarks], lambda x: (x.copy(), *outputs), 64, align.FaceType.FULL, s)

    learned = merged("learned", (left * top, ones))  # (the learned masks' product)
    for mask, xseg in [("xseg-prd", (left * top, ones)), ("xseg-dst", (ones, left * top)), ("xseg", (left, top))]:
        got = merged(mask, (ones, ones, *xseg))
        assert all(np.array_equal(a, b) for a, b in zip(got, learned)), mask
    got = merged("learned*xseg", (left, ones, ones, top))
    assert all(np.array_equal(a, b) for a, b in zip(got, learned))


def test_settings_are_checked():
    with pytest.raises(BigbatchError, match="--mode 'blend' is not one of overlay"):
        merge.MergeSettings(mode="blend")
    with pytest.raises(BigbatchError, match="--color 'mix-m'"):
        merge.MergeSettings(color="mix-m")
    with pytest.raises(BigbatchError, match="--erode must be -400 to 400"):
        merge.MergeSettings(erode=500)


README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = {  # what each README command gets added, for made clips on a CPU in seconds
    # (with OUT_debug/, as printed: prepare took OUT/debug for a class; the clips' faces are 38 to 50 px)
    "extract": ["--size", "256", "--workers", "1", "--min-face", "32"],
    "train": [
        'model.options={archi="df-u",ae_dims=16,e_dims=4,d_dims=4,d_mask_dims=2}', "data.resolution=64",
        "train.batch=4", "train.micro_batch=4", "train.kimg=0.008", "checkpoint.every_kimg=0.008",
        "sample.every_kimg=0", "eval.every_kimg=0", "--quiet",
    ],
    "merge": ["--mask", "hull", "--blur", "20"],  # (the landmarks' mask: a model trained for two steps has none)
}  # fmt: skip


def readme_swap_commands() -> list[list[str]]:
    """The README's "from two videos to a merged video" commands, as argument lists."""
    import re
    import shlex

    text = README.read_text()
    section = text[text.index("#### From two videos to a merged video") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line.split("  #")[0]) for line in block.strip().splitlines()]


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """The README's face swap from two videos, run as printed (sizes shrunk) on made clips."""
    import os

    root = tmp_path_factory.mktemp("swap")
    _faces.write_video(root / "data_src.mp4", 4, 320, 240, seed=1)
    _faces.write_video(root / "data_dst.mp4", 4, 320, 240, seed=2)
    commands = readme_swap_commands()
    assert [c[1] for c in commands] == ["extract", "extract", "prepare", "prepare", "train", "merge"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for command in commands:
            args = [a.replace("128", "64") if command[1] == "prepare" else a for a in command[1:]]
            assert main([*args, *SMALL.get(command[1], [])]) == 0, command
    finally:
        os.chdir(cwd)
    return root, root / "runs" / "swap"


def test_the_readme_swap_made_a_video_and_merged_frames(workflow):
    import av

    root, _ = workflow
    with av.open(str(root / "result.mp4")) as c:
        assert sorted(s.type for s in c.streams) == ["audio", "video"]  # the dst video's audio kept
        assert c.streams.video[0].average_rate == 25 and sum(1 for _ in c.decode(video=0)) == 4
    assert sorted(p.name for p in (root / "merged").glob("*.png")) == [f"{i + 1:05d}.png" for i in range(4)]


def test_merge_seamless_writes_frames_masks_and_video(workflow, capsys):
    import av

    root, run = workflow
    args = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "merged", "--video", "merged.mp4"]
    # (the mask of the landmarks: a model trained for two steps has not learned one)
    assert (
        main([*args, "--mode", "seamless", "--mask", "hull", "--blur", "20", "--erode", "10", "--device", "cpu"]) == 0
    )
    out = capsys.readouterr().out
    assert "Merged 4 faces into 4 frames" in out and "Wrote merged.mp4: 4 frames at 25 fps with the audio" in out
    names = sorted(p.name for p in Path("merged").glob("*.png"))
    assert names == [f"{i + 1:05d}.png" for i in range(4)]
    frame = cv2.imread("merged/00001.png")
    mask = cv2.imread("merged/masks/00001.png", cv2.IMREAD_UNCHANGED)
    assert frame.shape == (240, 320, 3) and mask.shape == (240, 320)
    assert 0 < (mask > 128).mean() < 0.5  # the face, not the frame
    with av.open("merged.mp4") as c:
        assert sorted(s.type for s in c.streams) == ["audio", "video"]
        assert sum(1 for _ in c.decode(video=0)) == 4
    # outside the mask the frame is untouched (up to the source video's own decode)
    with av.open(str(root / "data_dst.mp4")) as c:
        first = next(c.decode(video=0)).to_ndarray(format="rgb24")[..., ::-1]
    assert np.abs(frame.astype(int) - first)[mask == 0].max() == 0


def test_merge_from_a_frames_folder_passes_faceless_frames_and_resumes(workflow, capsys):
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "frames"]) == 0
    blank = np.full((240, 320, 3), 96, np.uint8)
    cv2.imwrite("frames/00005.png", blank)
    # (--any-source: the faces are the video's, and the frames its frames and one more)
    args = ["merge", "--any-source", str(run), "frames", str(root / "dst_aligned"), "out", "--color", "none"]
    assert main(args) == 0
    assert "Merged 4 faces into 5 frames" in capsys.readouterr().out
    assert np.array_equal(cv2.imread("out/00005.png"), blank)  # no face: the frame as it was
    assert not cv2.imread("out/masks/00005.png", cv2.IMREAD_UNCHANGED).any()
    before = {p.name: p.stat().st_mtime_ns for p in Path("out").glob("*.png")}
    Path("out/00003.png").unlink()  # as an interrupted merge leaves it
    assert main(args) == 0
    after = {p.name: p.stat().st_mtime_ns for p in Path("out").glob("*.png")}
    assert [n for n in after if after[n] != before.get(n)] == ["00003.png"]
    assert main([*args[:-2], "--color", "rct"]) == 0  # other settings: every frame again
    again = {p.name: p.stat().st_mtime_ns for p in Path("out").glob("*.png")}
    assert all(again[n] != after[n] for n in again)
    # An interrupted merge --video goes on: the frames merged before are read back into the video, in order.
    Path("out/00002.png").unlink()
    capsys.readouterr()
    Path(".out.tmp-999999999.mp4").write_bytes(b"of a merge killed while writing its video")
    assert main([*args[:-2], "--color", "rct", "--video", "out.mp4", "--preset", "ultrafast"]) == 0
    said = capsys.readouterr()  # (frames `video frames` took: its rate and sound; found from outside: 25 fps, silent)
    assert f"Wrote out.mp4: 5 frames at 25 fps with the audio of {root / 'data_dst.mp4'}" in said.out, said
    assert "neither --fps nor --audio-from" not in said.err
    assert not Path(".out.tmp-999999999.mp4").exists()  # (found from outside: left there)
    video = [f[..., ::-1].astype(int) for f in video_frames(Path("out.mp4"))]
    pngs = [cv2.imread(f"out/{i + 1:05d}.png").astype(int) for i in range(5)]
    for i, frame in enumerate(video):
        errors = [np.abs(frame - png).mean() for png in pngs]
        assert int(np.argmin(errors)) == i and errors[i] < 3, (i, errors)
    Path("frames/.frames.json").unlink()  # frames of no known video: 25 fps and no sound, said
    assert main([*args[:-2], "--color", "rct", "--video", "silent.mp4", "--preset", "ultrafast"]) == 0
    assert "neither --fps nor --audio-from: 25 fps and no sound" in capsys.readouterr().err  # (found from outside)
    # A silent source of audio is said to be silent (it was said to give its audio).
    assert main(["video", "make", "out", "again.mp4", "--audio-from", "silent.mp4", "--preset", "ultrafast"]) == 0
    assert "(no audio: silent.mp4 has none)" in capsys.readouterr().out
    # Frames none of which has a face (extract found none: its journal says so) pass through unchanged, odd
    # sides too (found from outside: a 300x451 frame came out 300x450).
    Path("faceless").mkdir()
    odd = np.full((241, 321, 3), 96, np.uint8)
    cv2.imwrite("faceless/00001.png", odd)
    assert main(["extract", "faceless", "none_found", "--workers", "1", "--no-debug"]) == 0
    assert main(["merge", str(run), "faceless", "none_found", "merged_faceless"]) == 0
    assert np.array_equal(cv2.imread("merged_faceless/00001.png"), odd)
    # A frame that does not decode (extract listed it and went on): skipped into PNGs, said; refused into a
    # video, which would lose it (found from outside: refused either way, the user left to delete it).
    Path("faceless/00002.png").write_bytes(b"not a png")
    capsys.readouterr()
    assert main(["merge", str(run), "faceless", "none_found", "merged_broken"]) == 0
    assert "00002.png does not decode as an image: skipped" in capsys.readouterr().err
    assert sorted(p.name for p in Path("merged_broken").glob("*.png")) == ["00001.png"]
    assert main(["merge", str(run), "faceless", "none_found", "merged_b2", "--video", "b.mp4"]) == 2
    assert "the video would lose its frame" in capsys.readouterr().err
    # dst faces sorted (renamed 00000.jpg on, as DFL's sort does) merge as before: a face's frame is in its metadata.
    shutil.copytree(root / "dst_aligned", "sorted_aligned")
    assert main(["sort", "sorted_aligned", "--by", "blur"]) == 0
    assert main([*args[:3], "frames", str(root / "dst_aligned"), "out_none", "--color", "none"]) == 0
    assert main([*args[:3], "frames", "sorted_aligned", "merged_sorted", "--color", "none"]) == 0
    for i in range(1, 5):
        assert np.array_equal(cv2.imread(f"merged_sorted/{i:05d}.png"), cv2.imread(f"out_none/{i:05d}.png"))
    # Odd frames with faces and without keep one size, the frames' own (found from outside: those with a face
    # lost a row and a column, those without did not, and `video make` refused the two sizes).
    Path("odd").mkdir()
    for i in range(1, 6):
        cv2.imwrite(f"odd/{i:05d}.png", np.pad(cv2.imread(f"frames/{i:05d}.png"), ((0, 1), (0, 1), (0, 0)), "edge"))
    assert main([*args[:3], "odd", str(root / "dst_aligned"), "merged_odd", "--color", "none"]) == 0
    assert {cv2.imread(f"merged_odd/{i:05d}.png").shape for i in range(1, 6)} == {(241, 321, 3)}
    assert main(["video", "make", "merged_odd", "odd.mp4", "--preset", "ultrafast"]) == 0


def test_merge_refuses_bad_input_in_one_line(workflow, capsys):
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "frames"]) == 0
    Path("frames/00002.png").unlink()
    Path("plain").mkdir()
    cv2.imwrite("plain/00001_0.jpg", np.zeros((64, 64, 3), np.uint8))  # a face with no DFL metadata
    cases = [
        (["merge", str(run), "frames", str(root / "dst_aligned"), "o"], "not in frames (such as 00002)"),
        (["merge", str(run), str(root / "data_dst.mp4"), "plain", "o"], "no DFL face metadata"),
        (["merge", str(run), str(root / "data_dst.mp4"), "frames", "o"], "frames holds no aligned faces"),
        (["merge", str(root), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "o"], str(root)),
        (["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "o", "--mode", "x"], "--mode 'x'"),
        (
            ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "o", "--video", "o.gif"],
            "--video o.gif",
        ),
    ]
    good = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "o"]
    cases.append(([*good, "--video", "o.mp4", "--audio-from", "none.mp4"], "--audio-from none.mp4: no such file"))
    cases.append(([*good, "--video", "o.mp4", "--fps", "nan"], "--fps must be a frame rate of 0.001 to 1000"))
    # Found from outside: OUT the frames or the aligned faces (merged PNGs written over them), another face type
    # than the run's (a crop it was not trained on), a missing folder of faces said to be no such folder.
    cases.append((["merge", str(run), "frames", str(root / "dst_aligned"), "frames"], "is the FRAMES folder"))
    aligned = str(root / "dst_aligned")
    cases.append((["merge", str(run), str(root / "data_dst.mp4"), aligned, aligned], "is the ALIGNED folder"))
    cases.append(([*good, "--face-type", "f"], "was trained on wf faces"))
    cases.append(([*good[:3], "nowhere", "o"], "nowhere does not exist"))
    cases.append(([*good, "--mode", "raw-predict", "--video", "o.mp4"], "they make no video; drop --video"))
    for args, says in cases:
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert not Path("o").exists() or not any(Path("o").glob("*.png"))
    # A merge --video that fails part of the way (a frame that does not decode, after chunks of frames have
    # gone to the video) leaves no video behind.
    assert main(["video", "frames", str(root / "data_dst.mp4"), "whole"]) == 0
    for i in range(4, 40):  # faceless frames after the four with faces
        shutil.copy("whole/00001.png", f"whole/{i + 1:05d}.png")
    Path("whole/00040.png").write_bytes(b"not a png")
    capsys.readouterr()
    args = ["merge", str(run), "whole", str(root / "dst_aligned"), "w", "--video", "w.mp4", "--preset", "ultrafast"]
    args.insert(1, "--any-source")
    assert main(args) == 2  # (ultrafast: x264 holds back no frames, so the video file is begun)
    assert "00040.png does not decode" in capsys.readouterr().err
    assert len(list(Path("w").glob("*.png"))) >= 16  # (two chunks at least were merged and went to the video)
    assert not [p.name for p in Path().iterdir() if p.name.startswith(("w.mp4", ".w.tmp"))]


def test_merge_with_an_xseg_model_masks_by_it_and_merges_again_when_it_changes(workflow, capsys):
    from test_xseg import dfl_weights

    from bigbatch.models import dfl

    root, run = workflow
    Path("xseg").mkdir()
    dfl.write_weights("xseg/XSeg_256.npy", dfl_weights(base=4, seed=5))
    good = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned")]
    for args, says in [
        ([*good, "o", "--mask", "xseg"], "--mask xseg needs --xseg MODEL, an XSeg model"),
        ([*good, "o", "--xseg", "xseg"], "--xseg is the XSeg model of the XSeg masks"),
        ([*good, "o", "--mask", "xseg", "--xseg", "nowhere"], "nowhere does not exist: give a trained XSeg"),
    ]:
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, (args, err)
    assert main([*good, "learned", "--color", "none"]) == 0
    assert main([*good, "x", "--mask", "learned*xseg", "--xseg", "xseg", "--color", "none"]) == 0
    masks = [cv2.imread(f"{o}/masks/00001.png", cv2.IMREAD_GRAYSCALE).astype(int) for o in ("learned", "x")]
    # learned's times XSeg's: less, and nowhere more but for bicubic's ringing
    assert masks[1].sum() < 0.9 * masks[0].sum() and (masks[1] > masks[0] + 8).mean() < 0.01
    capsys.readouterr()
    import os
    import shutil

    shutil.copytree("xseg", "xseg_copy")  # the same model elsewhere: kept
    assert main([*good, "x", "--mask", "learned*xseg", "--xseg", "xseg_copy", "--color", "none"]) == 0
    assert "merging all frames again" not in capsys.readouterr().err
    # another XSeg model of the same size and time (found from outside: taken for the one merged with)
    when = os.stat("xseg/XSeg_256.npy").st_mtime_ns
    dfl.write_weights("xseg/XSeg_256.npy", dfl_weights(base=4, seed=6))
    os.utime("xseg/XSeg_256.npy", ns=(when, when))
    assert main([*good, "x", "--mask", "learned*xseg", "--xseg", "xseg", "--color", "none"]) == 0
    assert "merging all frames again" in capsys.readouterr().err
    # export of the run to DeepFaceLive names the face type the faces recorded (found from outside: not said)
    assert main(["export", str(run), "w.dfm"]) == 0
    assert "set its face aligner to face type whole_face" in capsys.readouterr().out


def test_merge_with_super_resolution_runs_dfls_face_enhancer_from_its_weight_file(workflow, capsys):
    from bigbatch.models import dfl
    from bigbatch.models.face_enhancer import FaceEnhancer

    root, run = workflow
    Path("facelib").mkdir()
    torch.manual_seed(0)
    dfl.write_weights("facelib/FaceEnhancer.npy", dfl.export_part(FaceEnhancer(width=0.125)))
    good = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned")]
    for args, says in [
        ([*good, "o", "--super-resolution", "50"], "--super-resolution runs DFL's face enhancer: give --weights"),
        ([*good, "o", "--super-resolution", "50", "--weights", "nowhere"], "--weights nowhere holds no FaceEnhancer"),
        ([*good, "o", "--super-resolution", "101", "--weights", "facelib"], "--super-resolution must be 0 to 100"),
        ([*good, "o", "--video", str(root / "data_dst.mp4")], "is the video it is made from"),  # (it replaced it)
    ]:
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, (args, err)
    assert main([*good, "sr", "--super-resolution", "50", "--weights", "facelib"]) == 0
    assert main([*good, "plain"]) == 0
    a, b = (cv2.imread(f"{o}/00001.png").astype(int) for o in ("sr", "plain"))
    assert a.shape == b.shape and 0 < np.abs(a - b).mean() < 20  # (the same face, with the enhancer's half)
    # Power 0 is DFL's "off" (found from outside: refused with the weights given), said and merged without it.
    capsys.readouterr()
    assert main([*good, "off", "--super-resolution", "0", "--weights", "facelib"]) == 0
    assert "which is 0 (off): merged without it" in capsys.readouterr().err
    assert np.array_equal(cv2.imread("off/00001.png"), cv2.imread("plain/00001.png"))
    # With the XSeg masks of the swap too (an XSeg model that masks everything: the merge of the full mask).
    from test_xseg import dfl_weights

    Path("xseg").mkdir()
    weights = dfl_weights(base=4, seed=5)
    weights["out_conv/bias:0"] = np.full_like(weights["out_conv/bias:0"], 50.0)
    weights["out_conv/weight:0"] = np.zeros_like(weights["out_conv/weight:0"])
    dfl.write_weights("xseg/XSeg_256.npy", weights)
    sr = [*good, "--super-resolution", "50", "--weights", "facelib", "--color", "none"]
    assert main([*sr, "x", "--mask", "xseg", "--xseg", "xseg"]) == 0
    assert main([*sr, "f", "--mask", "full"]) == 0
    assert all(np.array_equal(cv2.imread(f"x/{n}"), cv2.imread(f"f/{n}")) for n in ("00000.png", "00001.png"))


MODEL_GOLDEN = np.load(Path(__file__).parent / "data" / "dfl_model_golden.npz", allow_pickle=False)


def test_a_model_exported_to_dfl_swaps_and_merges_there_as_here(tmp_path):
    """A SAEHD written by bigbatch's DFL exporter and loaded by DFL's own SAEHDModel (TensorFlow) predicts what
    bigbatch's model predicts, and DFL's MergeMasked with that model merges the frame as bigbatch's merge does
    (tests/data/dfl_model_golden.md). The exporter writes NumPy 1's names: DFL's NumPy read the files."""
    import json

    import dfl_golden_model as golden

    from bigbatch.models import dfl
    from bigbatch.tasks.swap.load import load_autoencoder

    model = golden.golden_model()
    dfl.save_model_folder(model, tmp_path, golden.NAME, options={"face_type": "wf"}, iteration=1)
    for path in tmp_path.glob("*.npy"):  # what NumPy 1 can load: no numpy._core in the pickles
        assert b"numpy._core" not in path.read_bytes()
    model = load_autoencoder(tmp_path).pack_for_cpu()  # (back from the DFL folder, as merge loads it)
    faces = torch.from_numpy(MODEL_GOLDEN["faces"][..., ::-1].copy()).permute(0, 3, 1, 2)
    with torch.inference_mode():
        image, mask, dst_mask = model.swap(faces)
    np.testing.assert_allclose(image.permute(0, 2, 3, 1).numpy()[..., ::-1], MODEL_GOLDEN["pred_bgr"], atol=2e-5)
    np.testing.assert_allclose(mask[:, 0].numpy(), MODEL_GOLDEN["pred_mask_src"], atol=2e-5)
    np.testing.assert_allclose(dst_mask[:, 0].numpy(), MODEL_GOLDEN["pred_mask_dst"], atol=2e-5)

    def predictor(face):  # (as merge gives the model's faces to merge_frame)
        return merge_run.predict_faces(model, [face])[0]

    frame = np.ascontiguousarray(GOLDEN["merge_frame"][..., ::-1])
    for case, delta, want_mask in zip(MODEL_GOLDEN["merge_cases"], MODEL_GOLDEN["merge_out_delta"],
                                      MODEL_GOLDEN["merge_mask"], strict=True):  # fmt: skip
        mode, mask_mode, erode, blur, ct = json.loads(str(case))
        s = merge.MergeSettings(mode=mode, mask=DFL_MASKS[mask_mode], erode=erode, blur=blur, color=ct)
        out, got_mask = merge.merge_frame(frame, [GOLDEN["merge_landmarks"]], predictor, golden.RES,
                                          align.FaceType.WHOLE_FACE, s)  # fmt: skip
        want = (GOLDEN["merge_frame"].astype(np.int16) + delta).astype(np.uint8)[..., ::-1]
        diff = np.abs(out.astype(int) - want)
        # (hist-match maps each level through the faces' cumulative histograms, so a face 2e-5 away moves some
        # pixels across a step: 2.3% of this frame by more than 2 levels, at most 6)
        off = 0.03 if mode == "hist-match" else 2e-3
        assert diff.max() <= 8 and diff.mean() < 0.5 and (diff > 2).mean() < off, (case, diff.max(), diff.mean())
        assert np.abs(got_mask.astype(int) - want_mask).max() <= 6, case


def test_a_model_whose_face_type_is_unknown_merges_with_the_aligned_faces_type(workflow, capsys):
    # Found from outside: a run of faces of no known type (--masks alpha) merged with "unknown face type ''" (and
    # then unsaid); the aligned faces' own type crops. Played by the workflow's run, its face type cleared.
    import json

    root, run = workflow
    shutil.copytree(run, "unknown")
    (ckpt,) = [p for p in Path("unknown/checkpoints").iterdir() if p.name[0].isdigit()][-1:]
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "face_type": None}))
    for config in (Path("unknown/config.toml"), ckpt / "config.toml"):
        config.write_text(config.read_text().replace('face_type = "wf"', 'face_type = ""'))
    args = ["merge", "unknown", str(root / "data_dst.mp4"), str(root / "dst_aligned"), "m", "--color", "none"]
    assert main(args) == 0
    assert "unknown's face type is unknown: merging as whole_face, the aligned faces' type" in capsys.readouterr().err
    assert main(["merge", str(run), *args[2:-3], "m_own", "--color", "none"]) == 0
    assert [cv2.imread(f"m/{i + 1:05d}.png").tobytes() for i in range(4)] == [
        cv2.imread(f"m_own/{i + 1:05d}.png").tobytes() for i in range(4)
    ]


def test_a_merge_again_after_its_inputs_changed_merges_every_frame(workflow, capsys):
    # Found from outside: a frame counted as done when its PNG existed and the merge settings were the same, so a
    # merge after more training, or after aligned faces were deleted, kept the old frames (and counted them).
    import os

    root, run = workflow
    shutil.copytree(root / "dst_aligned", "aligned")
    shutil.copytree(run, "run")
    args = ["merge", "run", str(root / "data_dst.mp4"), "aligned", "out", "--color", "none"]

    def merged() -> tuple[str, str, dict]:
        capsys.readouterr()
        assert main(args) == 0
        said = capsys.readouterr()
        return said.out, said.err, {p.name: p.stat().st_mtime_ns for p in Path("out").glob("*.png")}

    out, err, first = merged()
    assert "Merged 4 faces into 4 frames" in out and "again" not in err and len(first) == 4
    out, err, again = merged()  # nothing changed: every frame kept, and said to be kept, not merged
    assert "Merged 0 faces into 0 frames" in out and "kept 4 frames merged before" in out and again == first
    Path("aligned/00002_0.jpg").unlink()
    out, err, after = merged()
    assert "merging all frames again: the aligned faces changed since out was merged" in err
    assert "Merged 3 faces into 4 frames" in out and "kept" not in out
    assert all(after[n] != first[n] for n in first)
    second = video_frames(root / "data_dst.mp4")[1][..., ::-1]
    assert np.array_equal(cv2.imread("out/00002.png"), second)  # its face gone: the frame as it was
    for f in Path("run").rglob("*"):  # (touched, or copied without their times: the same model)
        os.utime(f)
    assert merged()[0].count("kept 4 frames merged before") == 1
    cfg = bigbatch.Config.load("run/config.toml")
    data = {"data.path": str(root / cfg.data.path), "data.dst_path": str(root / cfg.data.dst_path)}  # (the same)
    bigbatch.train(cfg.override({"train.kimg": cfg.train.kimg + 0.004, **data}), run_dir="run", resume=True, quiet=True)
    out, err, last = merged()
    assert "merging all frames again: the model changed since out was merged" in err
    assert "Merged 3 faces into 4 frames" in out and all(last[n] != after[n] for n in after)


def video_frames(path: Path) -> list[np.ndarray]:
    """A video's frames, RGB."""
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_merge_refuses_video_options_without_a_video_and_a_bad_target_before_merging(workflow, capsys):
    # Found from outside: --fps, --audio-from and --preset without --video were ignored; --video naming a folder
    # merged every frame and then failed naming a temporary file; OUT a file said "OUT/masks: Not a directory";
    # a .webm (no H.264 in WebM) failed in PyAV after the merge.
    root, run = workflow
    good = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned")]
    Path("adir.mp4").mkdir()
    Path("afile").write_text("x")
    cases = [
        ([*good, "o", "--fps", "30"], "--fps needs --video"),
        ([*good, "o", "--audio-from", str(root / "data_dst.mp4")], "--audio-from needs --video"),
        ([*good, "o", "--preset", "fast"], "--preset needs --video"),
        ([*good, "o", "--video", "adir.mp4"], "--video adir.mp4 is a folder"),
        ([*good, "o", "--video", "afile/x.mp4"], "afile is a file"),
        ([*good, "o", "--video", "o.webm"], "--video o.webm: give a video file name"),
        ([*good, "afile"], "OUT afile is a file"),
    ]
    for args, says in cases:
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert not Path("o").exists()  # refused before anything was merged
