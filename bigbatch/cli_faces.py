"""The face pipeline's commands: `bigbatch extract` (video or photos -> DFL's aligned faces) and `bigbatch video
frames|make` (a video to numbered PNGs and back, with the source's audio)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from bigbatch.cli_tools import device_named
from bigbatch.config_types import MAX_PROCESSES
from bigbatch.errors import BigbatchError, counted, warn


def _positive(name: str, value: int, low: int = 1, high: int | None = None) -> int:
    if value < low:
        raise BigbatchError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise BigbatchError(f"{name} must be at most {high}, got {value}")
    return value


def _extract(args: argparse.Namespace) -> None:
    from bigbatch.data.align import face_type
    from bigbatch.faces.extract import Settings, debug_folder, extract
    from bigbatch.faces.extract_journal import JOURNAL
    from bigbatch.files import atomic_write

    kind = face_type(args.face_type)
    if not 1 <= args.jpeg_quality <= 100:
        raise BigbatchError(f"--jpeg-quality must be 1 to 100, got {args.jpeg_quality}")
    size = args.size if args.size is not None else 768 if kind.dfl_name == "head" else 512  # DFL's defaults
    if not 256 <= size <= 2048:  # DFL's extractor's range
        raise BigbatchError(f"--size must be 256 to 2048 pixels (DFL's range), got {size}")
    settings = Settings(
        face_type=kind.dfl_name,
        size=size,
        jpeg_quality=args.jpeg_quality,
        min_face=_positive("--min-face", args.min_face, 12),
        max_faces=_positive("--max-faces", args.max_faces, 0),
        second_pass=not args.no_second_pass,
        detector="dfl" if args.weights else "mtcnn+dlib",
    )
    if args.weights and args.landmarks_model:
        raise BigbatchError("--weights (DFL's S3FD and FAN) and --landmarks-model (dlib's) exclude each other")
    given = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)
    workers = _positive("--workers", given, high=MAX_PROCESSES)
    # (what a refusal removes: the folders it makes, the debug folder, OUT and those above, nearest first)
    made = [p for p in (debug_folder(Path(args.out)), Path(args.out), *Path(args.out).parents) if not p.exists()]
    done = extract(
        args.src,
        args.out,
        settings,
        workers,
        device_named(args.device),
        args.landmarks_model,
        debug=not args.no_debug,
        dfl_weights=args.weights,
    )
    out = Path(args.out)
    faces = sum(n or 0 for n in done.values())
    none = sorted(name for name, n in done.items() if n == 0)
    broken = sorted(name for name, n in done.items() if n is None)
    if broken and len(broken) == len(done):  # (found from outside: nothing extracted, and exit status 0)
        if out in made:  # (found from outside: the folders it made were left, holding its journal alone)
            (out / JOURNAL).unlink(missing_ok=True)
        for folder in made:
            with contextlib.suppress(OSError):  # (not empty: kept)
                folder.rmdir()
        raise BigbatchError(
            f"{args.src}: {'it does not decode' if len(done) == 1 else f'none of its {len(done)} images decodes'} as "
            "an image; give photos or frames (png, jpg, ...)"
        )
    listed = out / "no_face.txt"
    if none or broken:
        atomic_write(listed, "".join(f"{n}\n" for n in none) + "".join(f"{n}\tdoes not decode\n" for n in broken))
    else:
        listed.unlink(missing_ok=True)
    # (counted, not looked up by name: `bigbatch sort` renames the faces, found from outside to be "deleted")
    gone = max(0, faces - sum(1 for p in out.glob("*.jpg") if not p.name.startswith(".")))
    deleted = f"; {gone} of them deleted from it since, which stay deleted" if gone else ""
    print(
        f"Extracted {faces} face{'s' * (faces != 1)} from {len(done)} frame{'s' * (len(done) != 1)} into {out} "
        f"({settings.face_type}, {settings.size} px)"
        f"{deleted}"
    )
    if none:
        print(f"{len(none)} frame{'s' * (len(none) != 1)} without a face: listed in {listed}")
    if not faces and none:  # (found from outside: said only by the next command, as a folder of no files)
        warn(
            f"no face found in {'its frame' if len(done) == 1 else f'any of its {len(done)} frames'}: {out} holds "
            f"none for prepare or merge; faces of {settings.min_face} px or more are looked for (--min-face)"
        )
    if broken:
        names = ", ".join(broken[:5]) + " ..." * (len(broken) > 5)
        print(f"{len(broken)} file{'s' * (len(broken) != 1)} did not decode ({names}): in {listed}")


def _merge(args: argparse.Namespace) -> None:
    from bigbatch.faces import merge_record, video
    from bigbatch.faces.merge import MergeSettings, merge_threads
    from bigbatch.faces.merge_run import merge_folder
    from bigbatch.faces.video_audio import audio_said

    settings = MergeSettings(
        mode=args.mode,
        mask=args.mask,
        erode=args.erode,
        blur=args.blur,
        color=args.color,
        scale=args.scale,
        hist_threshold=args.hist_threshold,
        masked_hist=not args.no_masked_hist,
        super_resolution=args.super_resolution,
        motion_blur=args.motion_blur,
        sharpen=args.sharpen,
        blursharpen=args.blursharpen,
        denoise=args.denoise,
        bicubic_degrade=args.bicubic_degrade,
        color_degrade=args.color_degrade,
    )
    # (frames `video frames` took: that video, and the --fps it took)
    recorded = video.recorded_video(args.frames, said=args.fps is None and args.audio_from is None and bool(args.video))
    if args.video:
        video.check_video_out(args.video, "--video", args.frames, args.audio_from, recorded[0])
        # (found from outside: any file of its name was replaced, such as another folder's source video; as
        # `video make`, but a video an earlier merge into OUT wrote is this merge's again, run or resumed)
        if (
            os.path.lexists(args.video)
            and not args.overwrite
            and not merge_record.wrote_video(Path(args.out), args.video)
        ):
            raise BigbatchError(f"--video {args.video} exists: give --overwrite to replace it, or another name")
    if args.video and args.mode == "raw-predict":  # (found from outside: the faceless frames' corners filled it)
        raise BigbatchError(
            "--mode raw-predict writes the model's faces, each its size, and frames without a face as they are: "
            "they make no video; drop --video (or merge with another --mode)"
        )
    video_options = [(args.fps, "--fps"), (args.audio_from, "--audio-from"), (args.preset, "--preset")]
    video_options += [(args.bitrate, "--bitrate"), (args.lossless or None, "--lossless")]
    for given, name in [*video_options, (args.overwrite or None, "--overwrite")]:
        if given is not None and not args.video:
            raise BigbatchError(
                f"{name} needs --video (a setting of the merged video): add --video OUT.mp4, or drop {name}"
            )
    video.check_fps(args.fps)
    encoding = _encoding(args)
    if args.audio_from is not None and not Path(args.audio_from).is_file():
        raise BigbatchError(f"--audio-from {args.audio_from}: no such file")
    writer = None
    with contextlib.ExitStack() as stack:
        if args.video:  # encoded as the frames are merged (on a thread of its own), not read back from their PNGs
            src_is_video = Path(args.frames).is_file() and video.is_video(Path(args.frames))
            # The sound of --audio-from, FRAMES's if a video, or of the video `video frames` took them from (with
            # --fps too: found from outside, dropped unsaid); the rate of --fps, else of the frames as taken.
            audio = args.audio_from or (args.frames if src_is_video else recorded[0])
            taken = recorded[1] if not (src_is_video or args.audio_from) else None  # (None: the video's own)
            fps = args.fps if args.fps is not None else taken
            rate = video.frame_rate(fps, args.frames if src_is_video else audio)
            video.check_sound_fits(args.video, audio)
            video.say_speed(args.fps, rate, audio, taken)
            frames_given = Path(args.frames).is_dir() or any(c in args.frames for c in "*?[")  # (not a file: from
            if audio is None and fps is None and frames_given:  # outside, said of a video missing; unsaid before)
                warn(
                    f"--video of a frames folder, with neither --fps nor --audio-from: {float(rate):g} fps and no "
                    "sound; give --audio-from DST.mp4 (the video the frames came from: its rate and its sound)"
                )
            Path(args.video).parent.mkdir(parents=True, exist_ok=True)
            # x264 on the cores the merge's threads leave (at least one): on two cores one thread, which spends
            # less CPU time than x264's own choice of three.
            threads = max(1, (os.cpu_count() or 1) - merge_threads())
            writer = stack.enter_context(video.VideoWriter(args.video, rate, audio, encoding, threads))
        frames, faces, kept = merge_folder(
            args.run, args.frames, args.aligned, args.out, settings, device_named(args.device), args.face_type,
            writer=writer, xseg=args.xseg, weights=args.weights, any_source=args.any_source,
        )  # fmt: skip
        n = writer.close() if writer is not None else 0
    if writer is not None:
        merge_record.add_video(Path(args.out), args.video)
    before = f"; kept {counted(kept, 'frame')} merged before" if kept else ""
    merged = f"Merged {counted(faces, 'face')} into {counted(frames, 'frame')}"
    print(f"{merged}: {args.out} (masks in {Path(args.out) / 'masks'}){before}")
    if writer is not None:
        print(f"Wrote {args.video}: {n} frames at {float(rate):g} fps{audio_said(audio)}")


def _video(args: argparse.Namespace) -> None:
    from bigbatch.faces import video, video_make
    from bigbatch.faces.video_audio import audio_said

    if args.action == "frames":
        n = video.frames_to_folder(args.src, args.out, args.fps)
        print(f"Wrote {counted(n, 'frame')} to {args.out} (00001.png on)")
        return
    n, rate, audio = video_make.folder_to_video(
        args.src, args.out, args.fps, args.audio_from, _encoding(args), overwrite=args.overwrite
    )
    print(f"Wrote {args.out}: {counted(n, 'frame')} at {float(rate):g} fps{audio_said(audio)}")


def _sort(args: argparse.Namespace) -> None:
    from bigbatch.faces.sort import restore_names, sort_folder, trash_said

    if args.by == "restore-names":
        if args.target is not None:
            raise BigbatchError("--target is the number of faces `--by final` keeps; restore-names renames them all")
        restored, dfl = restore_names(Path(args.folder).absolute())
        also = f"; {counted(dfl, 'face')} it did not hold, DFL's name of it (FRAME_INDEX.jpg)" if dfl else ""
        print(f"Gave {counted(restored, 'face')} of {args.folder} the name sort's record held{also}")
        return
    kept, bin_, moved = sort_folder(args.folder, args.by, args.target)
    said = f" ({trash_said(moved)})" if moved else ""  # (found from outside: which files, and why, unsaid)
    if not kept:  # (found from outside: "Sorted 0 faces ...: 00000.jpg on" of a folder left empty)
        print(f"Sorted {args.folder} by {args.by}: no face kept{f'; all moved to {bin_}{said}' if bin_ else ''}")
        return
    rest = f"; the rest moved to {bin_}{said}" if bin_ else ""
    print(f"Sorted {counted(kept, 'face')} of {args.folder} by {args.by}: 00000.jpg on{rest}")


def _xseg(args: argparse.Namespace) -> None:
    from bigbatch.faces.xseg import apply_xseg, remove_xseg, said_skipped

    if args.action == "remove":
        print(f"Removed the XSeg masks of {remove_xseg(args.faces)} faces in {args.faces}")
        return
    device = device_named(args.device)
    done, skipped = apply_xseg(args.model, args.faces, args.face_type, device, args.batch)
    if not done and skipped:
        raise BigbatchError(f"no face in {args.faces} was masked: {said_skipped(skipped)}")
    print(f"Applied XSeg to {done} faces in {args.faces}: prepare --masks dfl takes their masks")
    if skipped:
        print(f"bigbatch: {said_skipped(skipped)}", file=sys.stderr)


def _enhance(args: argparse.Namespace) -> None:
    from bigbatch.faces.enhance import enhance_folder
    from bigbatch.faces.xseg import said_skipped

    result = enhance_folder(args.faces, args.weights, args.out, args.in_place, device_named(args.device))
    if not result.done and not result.moved and result.skipped:
        raise BigbatchError(f"no face in {args.faces} was enhanced: {said_skipped(result.skipped)}")
    if result.done:
        where = "in place" if args.in_place else f"into {result.where}"
        # (found from outside: a rerun that did nothing said it had enhanced them all)
        kept = f" ({result.kept} of them kept from an earlier run)" if result.kept else ""
        print(f"Enhanced {result.done} faces of {args.faces} {where}{kept}")
    else:  # (a rerun of an in-place run stopped while moving its faces back)
        print(f"Moved the {result.moved} enhanced faces left over those of {args.faces}")
    if result.left:
        print(
            f"bigbatch: {result.left} enhanced faces were left in {result.where}: their originals were renamed, "
            "changed or deleted since (sort renames them); enhance those again if you want them",
            file=sys.stderr,
        )
    if result.skipped:
        print(f"bigbatch: {said_skipped(result.skipped)}", file=sys.stderr)


def _encoding_arguments(parser: argparse.ArgumentParser) -> None:
    from bigbatch.faces.video import PRESETS

    parser.add_argument(
        "--preset",
        choices=PRESETS,
        metavar="PRESET",
        help="x264's speed preset, ultrafast to veryslow (medium, FFmpeg's and so DFL's; at 16 Mbit/s veryfast "
        "encodes in half medium's CPU time, 0.4 dB below it on bench/faces.py's clip)",
    )
    parser.add_argument("--bitrate", type=float, metavar="MBIT", help="the video's bit rate, Mbit/s (DFL's 16)")
    parser.add_argument(
        "--lossless", action="store_true", help="DFL's lossless: x264 at quantizer 0, yuv420p (a far larger file)"
    )


def _encoding(args: argparse.Namespace) -> Any:
    """The video's Encoding, from --preset, --bitrate and --lossless (refused together)."""
    from bigbatch.faces.video import Encoding

    if args.lossless and args.bitrate is not None:
        raise BigbatchError("--lossless sets no bit rate (x264 at quantizer 0): give --lossless or --bitrate, not both")
    given = {"preset": args.preset, "mbit": args.bitrate}  # (those left out: Encoding's defaults, DFL's)
    return Encoding(**{k: v for k, v in given.items() if v is not None}, lossless=args.lossless)


def add_face_commands(sub: Any) -> None:
    """Add extract and video to the CLI's subcommands."""
    ex = sub.add_parser(
        "extract", help="find, landmark and align the faces of a video or photos, written as DFL's aligned faces"
    )
    ex.add_argument("src", metavar="SRC", help="a video file, a folder of images, a quoted glob, or one image")
    ex.add_argument("out", metavar="OUT", help="folder for the aligned faces ({frame}_{i}.jpg); OUT_debug/ beside it")
    ex.add_argument(
        "--face-type", default="wf", help="h, mf, f, wf (whole face, the default) or head, as DFL's (or its long names)"
    )
    ex.add_argument(
        "--size", type=int, help="side of the aligned faces in pixels, 256..2048 (default 512; head: 768, as DFL's)"
    )
    ex.add_argument("--jpeg-quality", type=int, default=90, help="JPEG quality of the faces (DFL's: 90)")
    ex.add_argument("--min-face", type=int, default=40, help="smallest face side looked for, frame pixels (40)")
    ex.add_argument("--max-faces", type=int, default=0, help="keep at most this many faces a frame, largest first")
    ex.add_argument("--workers", type=int, help="processes (default: the CPU count, at most 8)")
    ex.add_argument("--device", default="auto", help="where the detector runs: auto (CUDA if there is one), cpu, cuda")
    ex.add_argument("--landmarks-model", metavar="PATH", help="a dlib 68-point shape predictor .dat of your own")
    ex.add_argument(
        "--weights",
        metavar="DFL/facelib",
        help="a DeepFaceLab install's facelib folder: its S3FD.npy and 2DFAN.npy find and landmark faces, as DFL's",
    )
    ex.add_argument("--no-debug", action="store_true", help="do not write OUT_debug/ (frames with faces drawn)")
    ex.add_argument(
        "--no-second-pass", action="store_true", help="landmark once (faster; DFL's second pass is sub-pixel)"
    )
    ex.set_defaults(func=_extract, goes_on=True)

    mg = sub.add_parser(
        "merge", help="swap the faces of frames with a swap run's model and merge them, as DFL's merger"
    )
    mg.add_argument("run", metavar="RUN", help="swap run, checkpoint folder or DFL SAEHD model folder")
    mg.add_argument("frames", metavar="FRAMES", help="the frames the faces were extracted from: a folder or the video")
    mg.add_argument("aligned", metavar="ALIGNED", help="their aligned faces (bigbatch extract's or DFL's)")
    mg.add_argument("out", metavar="OUT", help="folder for the merged frames ({frame}.png) and masks/")
    mg.add_argument(
        "--mode",
        default="overlay",
        help="overlay (default), hist-match, seamless, seamless-hist-match, raw-rgb, raw-predict or original (DFL's)",
    )
    mg.add_argument(
        "--mask",
        default="learned",
        help="learned (the model's src x dst masks, DFL's default), learned-prd, learned-dst, learned-sum, hull (the "
        "landmarks'), hull*learned, full, or with --xseg: xseg-prd, xseg-dst, xseg (both), learned*xseg (all four); "
        "DFL's names (dst, learned-prd*learned-dst, XSeg-prd*XSeg-dst, ...) are taken too",
    )
    mg.add_argument(
        "--super-resolution",
        type=int,
        default=0,
        metavar="POWER",
        help="DFL's face enhancer's 4x swap mixed in, percent 0..100 (needs --weights DFL/facelib)",
    )
    mg.add_argument("--weights", metavar="DFL/facelib", help="a DeepFaceLab install's facelib folder: its FaceEnhancer")
    mg.add_argument(
        "--xseg", metavar="MODEL", help="an XSeg model (DFL's folder or XSeg_256.npy, or an xseg run), for its masks"
    )
    mg.add_argument("--erode", type=int, default=0, help="erode the mask (negative: dilate), -400..400")
    mg.add_argument("--blur", type=int, default=0, help="feather the mask, 0..400")
    mg.add_argument(
        "--color",
        default="rct",
        help="colour transfer to the dst face: rct (default), lct, mkl, mkl-m, idt, idt-m, sot-m or none",
    )
    mg.add_argument("--scale", type=int, default=0, help="output face scale, percent, -50..50")
    mg.add_argument("--hist-threshold", type=int, default=238, help="hist-match's threshold, 0..255 (238)")
    mg.add_argument("--no-masked-hist", action="store_true", help="hist-match over the whole square, not the mask")
    finish = mg.add_argument_group("DFL's finishing filters (0: off, as DFL's defaults)")
    finish.add_argument("--motion-blur", type=int, default=0, help="blur the face along its motion, 0..100")
    finish.add_argument("--sharpen", default="none", help="the face's sharpening filter: box or gaussian")
    finish.add_argument("--blursharpen", type=int, default=0, help="sharpen by (--sharpen), or blur below 0, -100..100")
    finish.add_argument("--denoise", type=int, default=0, help="median-blur the frame under the face, 0..500")
    finish.add_argument("--bicubic-degrade", type=int, default=0, help="shrink and enlarge the frame, 0..100")
    finish.add_argument("--color-degrade", type=int, default=0, help="mix in the frame in 256 colours, 0..100")
    mg.add_argument("--face-type", help="the model's face type where the run does not record it (h, mf, f, wf, head)")
    mg.add_argument("--device", default="auto", help="auto (CUDA if there is one), cpu or cuda")
    mg.add_argument("--video", metavar="OUT.mp4", help="also write the merged frames as a video")
    mg.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --video's file if it exists (else refused, but for a video an earlier merge into OUT wrote)",
    )
    mg.add_argument(
        "--any-source",
        action="store_true",
        help="merge faces extracted from other frames than FRAMES (as ALIGNED's journal says) by frame name all "
        "the same, and the frames given where ALIGNED has faces of frames FRAMES lacks (refused without it)",
    )
    mg.add_argument(
        "--fps", type=float, help="the video's frame rate (default: FRAMES's if a video, else --audio-from's, else 25)"
    )
    mg.add_argument("--audio-from", metavar="VIDEO", help="the video's audio (default: FRAMES's, if a video)")
    _encoding_arguments(mg)
    mg.set_defaults(func=_merge, goes_on=True)

    so = sub.add_parser(
        "sort",
        help="sort a folder of aligned faces as DFL's sort tool (renamed 00000.jpg on; the unwanted to FOLDER_trash)",
    )
    so.add_argument("folder", metavar="FOLDER", help="aligned faces (bigbatch extract's or DFL's)")
    so.add_argument(
        "--by",
        required=True,
        metavar="METHOD",
        help="DFL's: blur, motion-blur, face-yaw, face-pitch, face-source-rect-size, hist, hist-dissim, brightness, "
        "hue, black, origname, oneface (frames of more than one face to the trash) or final (the best --target faces "
        "over the yaws; final-fast: the same); restore-names: each face back under its name before the first sort "
        "(DFL's util: recover original filename)",
    )
    so.add_argument("--target", type=int, help="final: how many faces to keep (DFL's default 2000)")
    so.set_defaults(func=_sort)

    xs = sub.add_parser("xseg", help="DFL's XSeg masks: apply a trained XSeg model to aligned faces, or remove them")
    xa = xs.add_subparsers(dest="action", metavar="ACTION", required=True)
    ap = xa.add_parser("apply", help="bigbatch xseg apply MODEL FACES: each face's mask into its metadata, as DFL's")
    ap.add_argument(
        "model", metavar="MODEL", help="a DFL XSeg model's folder (its XSeg_256.npy), that file, or an xseg run"
    )
    ap.add_argument("faces", metavar="FACES", help="a folder of aligned faces (bigbatch extract's or DFL's)")
    ap.add_argument(
        "--face-type",
        help="the face type the model was trained on, where its XSeg_data.dat does not say (h, mf, f, wf, head; "
        "default: the faces' own)",
    )
    ap.add_argument("--device", default="auto", help="auto (CUDA if there is one), cpu or cuda")
    ap.add_argument("--batch", type=int, default=8, help="faces per forward (8)")
    rm = xa.add_parser("remove", help="bigbatch xseg remove FACES: take the applied masks out again")
    rm.add_argument("faces", metavar="FACES")
    for p in (ap, rm):
        p.set_defaults(func=_xseg)

    en = sub.add_parser("enhance", help="DFL's faceset enhancer: sharpen aligned faces with its FaceEnhancer, kept")
    en.add_argument("faces", metavar="FACES", help="a folder of aligned faces (bigbatch extract's or DFL's)")
    en.add_argument("--weights", required=True, metavar="DFL/facelib", help="a DeepFaceLab install's facelib folder")
    en.add_argument("--out", metavar="DIR", help="where the enhanced faces go (default: FACES_enhanced, as DFL's)")
    en.add_argument("--in-place", action="store_true", help="then move each over its original (DFL's merge answer)")
    en.add_argument("--device", default="auto", help="auto (CUDA if there is one), cpu or cuda")
    en.set_defaults(func=_enhance, goes_on=True)

    vi = sub.add_parser("video", help="a video to numbered frames (video frames), or frames to a video (video make)")
    actions = vi.add_subparsers(dest="action", metavar="ACTION", required=True)
    fr = actions.add_parser("frames", help="bigbatch video frames VIDEO DIR: every frame as DIR/00001.png, ...")
    fr.add_argument("src", metavar="VIDEO")
    fr.add_argument("out", metavar="DIR")
    fr.add_argument("--fps", type=float, help="take this many frames a second (default: every frame)")
    fr.set_defaults(goes_on=True)
    mk = actions.add_parser("make", help="bigbatch video make DIR OUT.mp4: the frames as H.264 (libx264, yuv420p)")
    mk.add_argument("src", metavar="DIR", help="folder of frames (png or jpg), in name order (2.png before 10.png)")
    mk.add_argument("out", metavar="OUT.mp4")
    mk.add_argument("--fps", type=float, help="frame rate (default: --audio-from's, else 25)")
    mk.add_argument("--audio-from", metavar="VIDEO", help="copy this file's audio (AAC 192 kbit/s)")
    mk.add_argument("--overwrite", action="store_true", help="replace OUT.mp4 if it exists")
    _encoding_arguments(mk)
    for p in (fr, mk):
        p.set_defaults(func=_video)
