"""The few RuntimeErrors of torch that are a user's to mend, as the one line `bigbatch` prints for them (and the
exit status): out of memory, an op without a deterministic kernel, a rate that overflows, a port in use, and a
rank that went away. Any other RuntimeError is a bug, and keeps its traceback. A path that cannot be read or
written (an OSError), named, with its fix. And outputs given as URLs to commands that write
local files, refused as the command line is read."""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import re
from typing import Any, NoReturn

from bigbatch.engine.dist import lost_peer, lost_peer_said
from bigbatch.errors import BigbatchError, printable, say
from bigbatch.urls import file_path, local_path, local_run


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line; an empty path given (an unset variable: Path("") is the
    working folder, found from outside) is one of them. An option is written whole: no abbreviations (found from
    outside: StyleGAN2-ADA's --trunc, its psi, was taken as --truncation, another truncation, without a word)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # (the sub-commands' parsers are made of this class too)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        hint = next((h for (prog, word), h in DFL_HINTS.items() if self.prog.endswith(prog) and word in message), "")
        raise BigbatchError(f"{message} (see '{self.prog} --help'){hint}")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        known, rest = super().parse_known_args(args, namespace)
        for a in self._actions:  # (not the arguments passed through to a script or command: found by review)
            value = getattr(known, a.dest, None)
            if a.option_strings or a.nargs == argparse.REMAINDER:
                continue
            if value == "" or (isinstance(value, list) and "" in value):
                self.error(f"{a.metavar or a.dest} is an empty string (an unset shell variable?): give its value")
        return known, rest


# DFL's names for what bigbatch does otherwise (found from outside: `xseg fetch` had "invalid choice" alone)
DFL_HINTS = {
    ("xseg", "'fetch'"): "; DFL's XSeg fetch copies the labelled faces out: bigbatch prepare FACES OUT.h5 --masks "
    "labels reads them where they are",
}


def say_error(line: str) -> None:
    """`bigbatch: error: LINE` on stderr, once a machine under torchrun: every rank meets a bad command alike, and
    one line says it (a line only some ranks meet, or another one, is said by each that meets it), in one write."""
    if _first_to_say(line):
        say(f"bigbatch: error: {printable(line)}")


def another_rank_said() -> bool:
    """Whether a rank of this torchrun launch on this machine has said an error line: torchrun then stops the
    others with SIGTERM, whose "stopped" line would blame a stop nobody asked for (found from outside)."""
    attempt = _attempt_folder()
    try:  # (a command a rank itself started marks its lines under its own parent: not another rank's)
        return attempt is not None and any(name.startswith(f"{SAID}{os.getppid()}-") for name in os.listdir(attempt))
    except OSError:  # (torchrun removed the folder meanwhile)
        return False


SAID = "bigbatch-said-"


def _attempt_folder() -> str | None:
    """The folder torchrun makes for this attempt of the group (private, removed when it ends); None outside
    torchrun (or where that folder is not there)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    attempt = os.path.dirname(os.path.dirname(error_file))  # (.../attempt_N/RANK/error.json)
    return attempt if error_file and "LOCAL_RANK" in os.environ and os.path.isdir(attempt) else None


def _first_to_say(line: str) -> bool:
    """Whether no other rank of this torchrun launch on this machine has said `line`: each marks it in the
    launch's own folder (_attempt_folder); always, outside torchrun."""
    attempt = _attempt_folder()
    if attempt is None:
        return True
    # (named by the agent's pid too: a command a rank itself starts inherits the folder, and says its own lines)
    said = hashlib.sha256(line.encode(errors="surrogateescape")).hexdigest()[:32]
    mark = os.path.join(attempt, f"{SAID}{os.getppid()}-{said}")
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:  # (nowhere to keep the mark: say it)
        return True
    return True


def os_error_line(e: OSError, resumes: bool = False) -> str:
    """The line for a path that cannot be written (disk full, read-only, not ours) or read: the path (a write's is
    the file it writes: bigbatch.files.atomic_write's and a video's say so), the system's words, and the fix.
    `resumes`: the command trains a run, which --resume continues."""
    where = f"{os.fsdecode(e.filename)}: " if e.filename else ""
    fix = ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        # (found from outside: --resume advised where no checkpoint was yet, and refused)
        resume = " (a run resumes from its latest checkpoint with --resume; --resume=auto also starts one with none)"
        fix = "; free space there" + resume * resumes
    elif e.errno == errno.EROFS:  # (found from outside: a read-only mount named, the fix not)
        fix = "; give a path on storage this user may write to"
    elif e.errno in (errno.EACCES, errno.EPERM):  # (EPERM: a file made immutable; macOS's privacy refusals to read)
        fix = "; give this user access to it (to read it, or to write there)"
    elif e.errno == errno.ENOTDIR:
        fix = "; a part of that path is a file, not a folder: give a path through folders"
    return f"{where}{e.strerror or e}{fix}"


# What frees memory, by command (found from outside: eval's out of memory advised train.micro_batch, which eval
# does not take).
TRAINING_FIX = (
    'lower train.micro_batch or train.memory_budget (with micro_batch "auto"), or turn on train.checkpointing; a run '
    "resumes from its latest checkpoint"
)
OUT_OF_MEMORY_FIX = {command: TRAINING_FIX for command in ("train", "sweep", "launch", "lr-find")}
OUT_OF_MEMORY_FIX["eval"] = "lower --batch-size (the images scored at once)"
OUT_OF_MEMORY_FIX["swap"] = "lower --batch (the faces at once)"
OTHER_FIX = "free the memory other work holds there, or run it where there is more"


def runtime_error_line(e: RuntimeError, command: str = "train") -> tuple[str, int] | None:
    """(the line, the exit status) for `e` where `command` (bigbatch's) ran, or None when it is not one of these."""
    text = str(e)
    if _out_of_memory(e):  # (torch.OutOfMemoryError is a RuntimeError too)
        first = text.strip().splitlines()[0][:200] if text.strip() else type(e).__name__
        return f"out of memory ({first}); {OUT_OF_MEMORY_FIX.get(command, OTHER_FIX)}", 1
    if "does not have a deterministic implementation" in text:  # (train.deterministic on a GPU)
        named = re.search(r"(\S+) does not have a deterministic implementation", text)
        op = named.group(1) if named else "an op"
        return (
            f"{op} has no deterministic kernel on this device, and train.deterministic = true refuses the others: "
            "set train.deterministic = false, or drop what runs it",
            2,
        )
    if "converted to type float without overflow" in text:  # (found from outside: train.d_lr=1e37, Adam's
        # lr / (1 - beta1) past float32's range, a traceback from inside torch.optim)
        return "a learning rate or weight decay overflows float32 in the optimizer's update: give smaller ones", 2
    if "EADDRINUSE" in text or "address already in use" in text.lower():  # (not a peer lost: said so)
        port = os.environ.get("MASTER_PORT", "")
        return (
            f"MASTER_PORT {port} is in use on this machine: give another (torchrun --master-port N, or torchrun "
            "--standalone, which picks a free one)",
            2,
        )
    if not lost_peer(e):
        return None
    # Another rank died: its own error is the one to read; this one's is one line, not a traceback.
    return (
        f"{lost_peer_said(e)}: its own error line says why; once that is mended, --resume "
        "goes on from the latest checkpoint (--resume=auto: or starts the run anew)",
        1,
    )


def _out_of_memory(e: RuntimeError) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, or the CPU allocator's error."""
    return type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


# The commands whose output may be a URL (written there through fsspec); the others write local files.
URL_OUTPUTS = {"prepare"}
# The commands whose run (a run folder, a checkpoint's, a DFL model folder) is read as local files.
RUN_INPUTS = {"sample", "plot", "stop", "merge", "swap", "export-dfl", "predict", "export", "train"}


NOT_PATHS = ("args", "launched", "overrides")  # a sweep file's own arguments, a launched command (its ranks read
# their paths), config overrides (key=value; data paths parsed as the config takes them)


def refuse_url_paths(args: argparse.Namespace, argv: list[str]) -> None:
    """An output given as a URL to a command that writes local files, and a run given as one to a command that reads
    it as local files, refused in one line (found from outside: `export RUN s3://b/x.pt` wrote ./s3:/b/x.pt, and
    `train --run-dir s3://b/run` trained a run there). A file: URL is its local path from here on, whatever names it
    (found from outside: a run, a config, a data set given as file:///abs were each "file:/abs does not exist")."""
    for name, value in vars(args).items():
        if name in NOT_PATHS:
            continue
        if isinstance(value, str):
            setattr(args, name, file_path(value))
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            setattr(args, name, [file_path(v) for v in value])
    runs = [getattr(args, name, None) for name in ("run", "path", "init_from")] if args.command in RUN_INPUTS else []
    for value in [r for run in runs for r in ([run] if isinstance(run, str) else run or ())]:  # (plot's: a list)
        local_run(value)
    if args.command in URL_OUTPUTS:
        return
    out = "--out" if any(a == "--out" or a.startswith("--out=") for a in argv) else "the output"
    for name, flag in (("out", out), ("outdir", "--outdir"), ("run_dir", "--run-dir"), ("video", "--video")):
        value = getattr(args, name, None)
        if isinstance(value, str):
            local_path(value, flag, args.command)


def one_line_warnings() -> None:
    """Pillow's two lines per image over its decompression-bomb guard left out (bigbatch's decode says it in one), and
    what else Pillow warns of as it decodes (a file's damaged metadata: corrupt EXIF, found from outside as two lines
    of Pillow's source from each worker) said in one line, once a kind: in bigbatch's words, the files decoded."""
    import warnings

    from PIL import Image

    from bigbatch.errors import warn

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    shown = warnings.showwarning
    if getattr(shown, "one_line", False):
        return

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if f"{os.sep}PIL{os.sep}" not in filename or not issubclass(category, UserWarning):  # (a deprecation is
            return shown(message, category, filename, lineno, file, line)  # Pillow's own, not a file's: review)
        said = re.sub(r"\d+", "N", " ".join(str(message).split()))
        warn(f"Pillow: {said} (of some image files, decoded all the same)", once=True)

    show.one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = show
