"""bigbatch merge's outputs and what it refuses to merge from (found from outside, a review of `bigbatch merge`):
the file --video names, frames of two sizes into one video, faces extracted from other frames, OUT holding images
no merge wrote, PNGs at the frames' own size with --video too, raw-predict of frames of two faces."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("dlib")
pytest.importorskip("av")
pytest.importorskip("skimage")

import test_faces_merge  # noqa: E402

from bigbatch.cli import main  # noqa: E402
from bigbatch.errors import BigbatchError  # noqa: E402
from bigbatch.faces import merge, merge_record, merge_run, video  # noqa: E402

workflow = test_faces_merge.workflow  # the README's swap from two videos, run on made clips (once in this module)
VIDEO = ["--video", "o.mp4", "--fps", "25", "--preset", "ultrafast"]  # a merge's video, made fast


def refused(capsys, args: list[str], says: str) -> str:
    """`args` exit 2 with one line that says `says`; the line."""
    capsys.readouterr()
    assert main(args) == 2, args
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    return err


def test_merge_video_replaces_no_file_but_one_a_merge_into_out_wrote(workflow, capsys):
    # Found from outside: --video replaced any file of its name (another folder's source video, a typo).
    root, run = workflow
    good = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned")]
    fast = ["--preset", "ultrafast", "--color", "none"]
    Path("precious.mp4").write_bytes(b"another folder's source video")
    refused(capsys, [*good, "o", "--video", "precious.mp4", *fast], "--video precious.mp4 exists: give --overwrite")
    assert Path("precious.mp4").read_bytes() == b"another folder's source video"
    assert not Path("o").exists()  # (refused before merging)
    refused(capsys, [*good, "o", "--overwrite"], "--overwrite needs --video")
    # The same merge again, resumed or with other settings, replaces the video it wrote.
    assert main([*good, "m", "--video", "m.mp4", *fast]) == 0
    assert main([*good, "m", "--video", "m.mp4", *fast[:2], "--color", "rct"]) == 0  # (all merged again)
    assert main([*good, "m", "--video", "m.mp4", *fast[:2], "--color", "rct"]) == 0  # (all kept)
    # (recorded through a merge with other inputs, which rewrites the record: such a merge stopped before its
    # video was written is resumed)
    merge_record.write(Path("m"), {"settings": {"other": True}})
    assert merge_record.wrote_video(Path("m"), "m.mp4") and not merge_record.wrote_video(Path("m"), "n.mp4")
    assert "Wrote m.mp4: 4 frames" in capsys.readouterr().out
    # Another OUT's video is not this merge's; --overwrite replaces it.
    refused(capsys, [*good, "n", "--video", "m.mp4", *fast], "--video m.mp4 exists")
    assert main([*good, "n", "--video", "m.mp4", *fast, "--overwrite"]) == 0
    assert main([*good, "n", "--video", "precious.mp4", *fast, "--overwrite"]) == 0
    assert len(video_frames("precious.mp4")) == 4


def test_merge_video_refuses_frames_of_two_sizes_before_merging(workflow, capsys, monkeypatch):
    # Found from outside: cropped to the first frame's size, or stretched to it by PyAV, without a word.
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "frames"]) == 0
    wide = np.pad(cv2.imread("frames/00003.png"), ((0, 0), (0, 20), (0, 0)), "edge")
    cv2.imwrite("frames/00003.png", wide)
    args = ["merge", str(run), "frames", str(root / "dst_aligned"), "o", *VIDEO]
    refused(capsys, args, "00003.png is 340x240, the frames before it 320x240: give frames of one size")
    assert not any(Path("o").glob("*.png"))  # (from the headers: said before any frame was merged)
    # Frames whose size the headers do not give are refused when the first of another size is read, the frames
    # merged before it left for a rerun.
    monkeypatch.setattr(merge_run, "check_one_size", lambda paths: None)
    refused(capsys, args, "00003.png is 340x240, the frames before it 320x240: give frames of one size")
    assert {p.name for p in Path("o").glob("*.png")} == {"00001.png", "00002.png"}
    assert not Path("o.mp4").exists()
    # and the video's writer takes no frame of another size (it cropped them)
    frames = [np.zeros((240, 320, 3), np.uint8), np.zeros((240, 322, 3), np.uint8)]
    with pytest.raises(BigbatchError, match="frame 2 is 322x240, the frames before it 320x240"):
        video.write_video(iter(frames), "x.mp4", 25)
    assert not Path("x.mp4").exists()


def test_merge_refuses_faces_extracted_from_other_frames(workflow, capsys):
    # Found from outside: faces were matched to frames by name alone, so faces of the frames taken of a video at
    # another rate were pasted on other frames of the video, exit 0.
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "half", "--fps", "12.5"]) == 0
    assert main(["extract", "half", "half_aligned", "--size", "256", "--workers", "1", "--min-face", "32",
                 "--no-debug"]) == 0  # fmt: skip
    args = ["merge", str(run), str(root / "data_dst.mp4"), "half_aligned", "o", "--color", "none"]
    err = refused(capsys, args, f"were extracted from {Path('half').resolve()}, whose frames are not")
    assert "(2 frames there, 4 here)" in err and "or --any-source if they are its frames" in err
    assert main([*args, "--any-source"]) == 0  # (said to be the same frames: merged by name)
    # The same frames elsewhere (the folder of all the video's frames) pass, as do DFL's faces (no journal).
    assert main(["video", "frames", str(root / "data_dst.mp4"), "all"]) == 0
    assert main(["merge", str(run), "all", str(root / "dst_aligned"), "a", "--color", "none"]) == 0
    shutil.copytree("half_aligned", "dfl_aligned")
    Path("dfl_aligned/.extract.jsonl").unlink()
    assert main([*args[:3], "dfl_aligned", "d", "--color", "none"]) == 0
    # A face whose landmarks all lie outside its frame was extracted from other frames (here: ones 16 px wide).
    Path("tiny").mkdir()
    for i in range(4):
        cv2.imwrite(f"tiny/{i + 1:05d}.png", np.zeros((12, 16, 3), np.uint8))
    refused(capsys, [*args[:2], "tiny", str(root / "dst_aligned"), "t"], "of frame 00001 lies outside that frame")


def test_merge_refuses_an_out_holding_images_no_merge_wrote(workflow, capsys):
    # Found from outside: they stayed beside the merged frames, and `video make OUT` mixed them in.
    root, run = workflow
    Path("o").mkdir()
    cv2.imwrite("o/00009.png", np.zeros((8, 8, 3), np.uint8))
    args = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "o", "--color", "none"]
    refused(capsys, args, "OUT o holds 1 image (00009.png) a merge did not record: give an empty folder or remove them")
    assert [p.name for p in Path("o").iterdir()] == ["00009.png"]  # (the user's: not deleted, nothing written)
    Path("o/00009.png").unlink()
    assert main(args) == 0
    assert main(args) == 0  # (its own frames: kept)
    # Found from outside: merged again with other settings, the merge deleted every PNG in OUT, the user's too.
    cv2.imwrite("o/my_photo.png", np.zeros((8, 8, 3), np.uint8))
    refused(capsys, [*args[:-1], "lct"], "OUT o holds 1 image (my_photo.png) a merge did not record")
    assert Path("o/my_photo.png").exists()


def test_an_older_records_merged_frames_are_known_by_frames_names_or_numbers(tmp_path):
    # (found by review: an OUT merged by an older bigbatch, whose record lists no names, from frames named other
    # than by numbers, was refused as holding images no merge wrote)
    (tmp_path / merge_record.RECORD).write_text('{"settings": {}}')
    ours = merge_record.merged_here(tmp_path, ["frame_a.png", "frame_b.png"])
    assert ours("frame_a") and ours("00012") and not ours("my_photo")
    (tmp_path / merge_record.RECORD).write_text('{"settings": {}, "names": ["frame_a"]}')
    ours = merge_record.merged_here(tmp_path, ["frame_a.png", "frame_b.png"])
    assert ours("frame_a") and not ours("frame_b") and not ours("00012")
    assert not merge_record.merged_here(tmp_path / "none", ["frame_a.png"])("frame_a")  # (no record: none is)


def test_merge_video_writes_pngs_of_odd_frames_whole(workflow, capsys):
    # Found from outside: with --video the PNGs were cut to even sides, without it not, so that a resumed merge
    # mixed sizes; README says OUT/{frame}.png are written whole.
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "frames"]) == 0
    Path("odd").mkdir()
    for i in range(1, 5):
        cv2.imwrite(f"odd/{i:05d}.png", np.pad(cv2.imread(f"frames/{i:05d}.png"), ((0, 1), (0, 1), (0, 0)), "edge"))
    args = ["merge", str(run), "odd", str(root / "dst_aligned"), "o", *VIDEO]
    capsys.readouterr()
    assert main(args) == 0
    assert "frames of 321x241: o.mp4 is 320x240, its last column and row cut" in capsys.readouterr().err
    assert {cv2.imread(f"o/{i:05d}.png").shape for i in range(1, 5)} == {(241, 321, 3)}
    assert {f.shape for f in video_frames("o.mp4")} == {(240, 320, 3)}


def test_raw_predict_says_it_writes_one_face_of_a_frame_of_two(workflow, capsys):
    root, run = workflow
    shutil.copytree(root / "dst_aligned", "two")
    shutil.copy("two/00002_0.jpg", "two/00002_1.jpg")  # (a second face of frame 00002)
    capsys.readouterr()
    assert main(["merge", str(run), str(root / "data_dst.mp4"), "two", "o", "--mode", "raw-predict"]) == 0
    said = capsys.readouterr()
    assert (
        "raw-predict writes the first face of a frame alone; 1 of the frames have more than one (such as 00002)"
        in said.err
    )
    faces = len(list(Path(root / "dst_aligned").glob("*.jpg")))  # (one a frame, 00002's second not written)
    assert f"Merged {faces} faces into " in said.out


def test_some_of_the_frames_merge_under_any_source_the_other_frames_faces_left_out(workflow, capsys):
    # Found from outside: refused under --any-source too, where DFL's merger merges the frames it is given.
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "some"]) == 0
    Path("some/00004.png").unlink()
    args = ["merge", str(run), "some", str(root / "dst_aligned"), "o", "--color", "none"]
    err = refused(capsys, args, "1 frame the aligned faces were extracted from is not in some (such as 00004)")
    assert err.endswith("or --any-source to merge the frames given alone")
    assert main([*args, "--any-source"]) == 0
    said = capsys.readouterr()
    assert "their faces are left out" in said.err and "Merged 3 faces into 3 frames" in said.out
    assert sorted(p.name for p in Path("o").glob("*.png")) == ["00001.png", "00002.png", "00003.png"]


def test_extract_into_the_working_folder_and_not_over_faces_it_did_not_write(workflow, capsys, monkeypatch):
    # Found from outside: OUT "." was a traceback, and faces without a journal (DFL's aligned folder, faces mended
    # by hand) were replaced unsaid.
    root, _ = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "f"]) == 0
    small = ["--size", "256", "--workers", "1", "--min-face", "32"]
    Path("faces").mkdir()
    monkeypatch.chdir("faces")
    assert main(["extract", "../f/00001.png", ".", *small]) == 0
    assert Path("00001_0.jpg").is_file() and Path("../faces_debug/00001.jpg").is_file()
    monkeypatch.chdir("..")
    Path("mine").mkdir()
    shutil.copy(root / "dst_aligned" / "00001_0.jpg", "mine/00001_0.jpg")
    before = Path("mine/00001_0.jpg").read_bytes()
    refused(capsys, ["extract", "f", "mine", *small], "OUT mine holds 1 image (00001_0.jpg) no extract recorded")
    assert Path("mine/00001_0.jpg").read_bytes() == before


def test_odd_inputs_of_video_xseg_and_merge_settings_are_named(workflow, capsys):
    root, run = workflow
    assert main(["video", "frames", str(root / "data_dst.mp4"), "f"]) == 0
    # Found from outside: a model folder that is not one left out the DFL model folders merge takes; two frames of
    # one name were said to collide as extract's faces, not as the merged frames.
    Path("empty").mkdir()
    merging = ["merge", "empty", "f", str(root / "dst_aligned"), "o", "--color", "none"]
    refused(capsys, merging, "empty is neither a swap run, a checkpoint folder nor a DeepFaceLab SAEHD model folder")
    shutil.copy("f/00001.png", "f/00001.jpg")
    refused(capsys, [*merging[:1], str(run), *merging[2:]], "the merged frames (o/00001.png) would collide")
    Path("f/00001.jpg").unlink()
    refused(capsys, ["video", "frames", "f/00001.png", "v"], "f/00001.png is an image, not a video")
    refused(capsys, ["video", "frames", "none.mp4", "v"], "none.mp4 does not exist: give a video file")
    refused(capsys, ["xseg", "remove", "f"], "holds no aligned faces")  # (PNG frames)
    cv2.imwrite("f/plain.jpg", np.zeros((8, 8, 3), np.uint8))
    refused(capsys, ["xseg", "remove", "f"], "no file in f is an aligned face")  # (was: removed of 0 faces)
    # DFL's names of its mask modes (found from outside: refused)
    assert merge.MergeSettings(mask="dst").mask == "hull"
    assert merge.MergeSettings(mask="XSeg-prd*XSeg-dst").mask == "xseg"
    assert merge.MergeSettings(mask="learned-prd*learned-dst*XSeg-prd*XSeg-dst").mask == "learned*xseg"


def video_frames(path: str | Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_a_merge_goes_on_after_its_video_was_touched_or_recorded_by_an_older_bigbatch(workflow, capsys):
    # Found from outside: a touched video (and, by review, a record of before the video's checksum) merged every
    # frame again.
    import json
    import os

    root, run = workflow
    shutil.copy(root / "data_dst.mp4", "dst.mp4")
    args = ["merge", str(run), "dst.mp4", str(root / "dst_aligned"), "out", "--color", "none", "--any-source"]
    assert main(args) == 0
    os.utime("dst.mp4", ns=(1, 1))
    record = json.loads(Path("out/.merge.json").read_text())
    old = {k: v for k, v in record["frames"].items() if k != "checksum"} | {"mtime_ns": 1}
    Path("out/.merge.json").write_text(json.dumps({**record, "frames": old}))  # (as an older bigbatch wrote it)
    capsys.readouterr()
    assert main(args) == 0
    assert "kept 4 frames merged before" in capsys.readouterr().out
    assert "checksum" in json.loads(Path("out/.merge.json").read_text())["frames"]
    os.utime("dst.mp4", ns=(2, 2))  # touched again: known by its bytes now
    assert main(args) == 0 and "kept 4 frames merged before" in capsys.readouterr().out


def test_merge_refuses_another_video_of_as_many_frames_but_a_copy_of_the_one_extracted(workflow, capsys):
    # Found from outside: dst's faces merged onto src.mp4 (4 frames each: DFL's classic mix-up), exit 0.
    root, run = workflow
    args = ["merge", str(run), str(root / "data_src.mp4"), str(root / "dst_aligned"), "o", "--color", "none"]
    err = refused(capsys, args, "and " + str(root / "data_src.mp4") + " is another video (its bytes differ)")
    assert f"give {(root / 'data_dst.mp4').resolve()} as FRAMES, or --any-source" in err
    assert main([*args, "--any-source"]) == 0
    shutil.copy(root / "data_dst.mp4", "copy.mp4")  # the same video elsewhere: known by its bytes
    assert main([*args[:2], "copy.mp4", *args[3:]]) == 0


def test_settings_a_mode_does_not_read_are_said_and_keep_the_frames_merged(workflow, capsys):
    # Found from outside: --erode and --color with raw-rgb changed nothing, unsaid, yet merged every frame again.
    root, run = workflow
    args = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "raw", "--mode", "raw-rgb"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--erode", "100", "--color", "lct", "--hist-threshold", "200"]) == 0
    captured = capsys.readouterr()
    said = "--mode raw-rgb reads no --erode, --color, --hist-threshold: merged without them"
    assert said in captured.err and "merging all frames again" not in captured.err
    assert "kept 4 frames merged before" in captured.out
    assert merge.MergeSettings(mode="seamless", masked_hist=False).unread() == ["--no-masked-hist"]
    assert merge.MergeSettings(mode="hist-match", masked_hist=False, color="lct").unread() == []
    # A mask so eroded that no frame keeps a pixel of it: merged, and said to have changed nothing.
    capsys.readouterr()
    assert main([*args[:4], "gone", "--erode", "400", "--color", "none"]) == 0
    err = capsys.readouterr().err
    assert "4 of the 4 frames with faces merged kept no pixel of their mask (e.g. 00001)" in err, err


def test_an_fps_other_than_the_sounds_video_is_said_and_ntsc_rates_are_theirs(workflow, capsys):
    root, run = workflow
    args = ["merge", str(run), str(root / "data_dst.mp4"), str(root / "dst_aligned"), "f", "--color", "none"]
    assert main([*args, "--video", "f.mp4", "--fps", "12", "--preset", "ultrafast"]) == 0
    err = capsys.readouterr().err
    assert "--fps 12 with the sound of" in err and "whose frames are 25 a second: the video plays at" in err
    assert main([*args, "--video", "g.mp4", "--fps", "25", "--preset", "ultrafast"]) == 0
    assert "plays at another speed" not in capsys.readouterr().err  # (its own rate, given)
    # Frames `video frames` took at 10 a second: --fps keeps their video's sound (found from outside: dropped, unsaid),
    # and is said only where it is not the frames' own rate (found by review: 10 was said to be out of step).
    import av

    assert main(["video", "frames", str(root / "data_dst.mp4"), "ten", "--fps", "10"]) == 0
    merge_ten = ["merge", str(run), "ten", str(root / "dst_aligned"), "t", "--color", "none", "--any-source"]
    capsys.readouterr()
    assert main([*merge_ten, "--video", "t.mp4", "--fps", "10", "--preset", "ultrafast"]) == 0
    assert "plays at another speed" not in capsys.readouterr().err
    with av.open("t.mp4") as c:
        assert len(c.streams.audio) == 1
    assert main([*merge_ten, "--video", "u.mp4", "--fps", "20", "--preset", "ultrafast"]) == 0
    assert "its frames taken 10 a second: the video plays at another speed" in capsys.readouterr().err
    assert video.frame_rate(29.97) == video.frame_rate(29.970029) == video.Fraction(30000, 1001)
    assert video.frame_rate(23.976) == video.Fraction(24000, 1001) and video.frame_rate(29.5) == 29.5


def test_video_make_of_a_merges_out_takes_the_rate_and_sound_of_the_video_its_frames_came_from(workflow, capsys):
    # Found from outside: `video make merged/ out.mp4`, DFL's "merged to mp4" step, wrote 25 fps and no sound, unsaid.
    root, run = workflow
    clip = root / "data_dst.mp4"
    assert main(["merge", str(run), str(clip), str(root / "dst_aligned"), "m", "--color", "none"]) == 0
    assert main(["video", "frames", str(clip), "ten", "--fps", "10"]) == 0
    assert main(["merge", str(run), "ten", str(root / "dst_aligned"), "t", "--color", "none", "--any-source"]) == 0
    capsys.readouterr()
    for out, rate in (("m", video.video_rate(clip)), ("t", 10)):
        assert main(["video", "make", out, f"{out}.mp4", "--preset", "ultrafast"]) == 0
        said = capsys.readouterr()
        assert f"at {float(rate):g} fps with the audio of {clip}" in said.out and not said.err, said
        assert video.video_rate(f"{out}.mp4") == rate
    shutil.copytree("m", "plain", ignore=shutil.ignore_patterns(".*"))
    assert main(["video", "make", "plain", "plain.mp4", "--preset", "ultrafast"]) == 0
    assert "plain: no video its frames came from is known here, and neither --fps nor" in capsys.readouterr().err
