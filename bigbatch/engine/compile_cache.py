"""Where torch.compile keeps what it compiles, and how much of a run's compiling came from there.

Inductor caches each graph it compiles on disk (FX graphs with their generated code, AOTAutograd's
forward-backward pairs, autotuning results, Triton's kernels), keyed by the graph, the torch version and
the device; a later process compiling the same graph loads it instead. By default that cache is a folder
in /tmp, which a reboot or a batch job's fresh node empties and which another user of the machine could
have made first (Inductor unpickles what it finds there). bigbatch keeps it in the user's cache instead,
$BIGBATCH_CACHE/compile (~/.cache/bigbatch/compile), made private to the user; a cluster pointing
BIGBATCH_CACHE at shared storage lets a resume on another node start from it. A TORCHINDUCTOR_CACHE_DIR set
by the user is left as it is. Not in the run directory: runs are copied and shared between people, and a
pickle is not to be loaded from another person's folder.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from bigbatch.errors import BigbatchError
from bigbatch.user_cache import cache_dir

ENV = "TORCHINDUCTOR_CACHE_DIR"
_ours: str | None = None  # the folder this module set ENV to (Inductor writes ENV back once it has read it)


# Calls that AOTAutograd's cache refuses by default, and so compiled again on every start, though what they do
# is fixed by the graph that holds them (the cache key): the autocast regions the models open to keep a
# computation in fp32 (spectral norm's sigma, resample's kernel, SAEHD's dense layers, StyleGAN2's mapping).
CACHEABLE = ("torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast")


def use_cache() -> Path:
    """Point Inductor's caches at $BIGBATCH_CACHE/compile, unless the user set TORCHINDUCTOR_CACHE_DIR;
    the folder in use. Call before compiling; a later call follows a changed BIGBATCH_CACHE. Graphs that
    open an autocast region are cached whole (CACHEABLE); a backward is compiled, and its pair cached, at
    the forward."""
    global _ours
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # (imports nothing of Inductor's)

    given = os.environ.get(ENV)
    # Inductor writes the folder it used back into ENV, its own default too: that one is not the user's choice.
    if given and given not in (_ours, os.path.abspath(default_cache_dir())):
        folder = os.path.abspath(given)
    else:
        folder = os.path.abspath(cache_dir() / "compile")
        _make_private(folder)
        os.environ[ENV] = _ours = folder
    import torch
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.utils import clear_caches

    if given and os.path.abspath(given) != folder:  # Inductor derived folders from the old one, and keeps some
        clear_caches()
    for name in CACHEABLE:  # (keyed by the torch version too, as Inductor's own entries are)
        torch._inductor.config.unsafe_marked_cacheable_functions.setdefault(name, torch.__version__)
    # A graph's backward compiled with its forward, so that its cache entry is pickled there, on the calling
    # thread: left to the first backward, a CUDA backward pickles it on autograd's device thread, where pickle
    # crashes the process now and then (SIGSEGV in AOTAutogradCache._pickle_entry, found on an H200 with torch
    # 2.11; pytorch/pytorch#177442). The same graphs compiled, at the forward: a backward that cannot compile
    # fails there (under train.compile "auto": that graph runs eagerly), and a training graph whose backward
    # never runs is compiled whole. A setting of the process's, for every torch.compile after this.
    torch._functorch.config.force_non_lazy_backward_lowering = True
    return Path(folder)


def _make_private(folder: str) -> None:
    """The compile cache made (mode 0700) as a folder of this user's (files.foreign), not a link, in a folder others
    may not write without the sticky bit unless it is this user's (one's own group-writable folder is taken as one's
    private group's): else one line, the folder's parent said before a folder is left there (found from outside:
    under a shared BIGBATCH_CACHE, another user's `compile` folder, or a link to one, was taken, and Inductor
    unpickles what it finds there)."""
    from bigbatch.files import foreign

    parent = os.path.dirname(folder)
    if os.path.isdir(parent):
        st = os.stat(parent)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX and st.st_uid != os.geteuid():
            raise BigbatchError(
                f"the compile cache's folder {parent} may be written by others, who could put their own there: "
                "compiled graphs are unpickled from it; set BIGBATCH_CACHE to a folder of your own"
            )
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if foreign(Path(folder)):
        why = "a link" if os.path.islink(folder) else "not yours"
        raise BigbatchError(
            f"the compile cache {folder} is {why}: compiled graphs are unpickled from it, so it must be a folder of "
            "your own; remove it, or set BIGBATCH_CACHE to a folder of yours"
        )
    os.chmod(folder, 0o700)  # (makedirs leaves an existing folder's mode as it is)


def in_use() -> Path | None:
    """The folder Inductor's caches are in, if `use_cache` or the user chose one."""
    given = os.environ.get(ENV)
    return Path(given) if given else None


@dataclass
class Compiled:
    """What Inductor compiled while a `CompileWatch` looked: graphs (a forward and a backward count as two),
    how many of them were loaded from the cache, and how many forward-backward pairs AOTAutograd could not
    cache (traced again at every start)."""

    graphs: int
    from_cache: int
    seconds: float
    folder: Path | None
    uncached_pairs: int = 0

    def describe(self) -> str:
        where = f" in {self.folder}" if self.folder else ""
        if not self.graphs:
            return f"{self.seconds:.1f} s, no graph compiled by Inductor"
        if self.from_cache == self.graphs:
            cached = f"all {self.graphs} graphs from the compile cache{where}"
        elif self.from_cache:
            cached = f"{self.from_cache} of {self.graphs} graphs from the compile cache{where}, the rest kept there"
        else:
            cached = f"{self.graphs} graphs compiled, none from the cache: kept{where} for the next run of this model"
        if self.uncached_pairs:
            cached += f" ({self.uncached_pairs} of them traced again at every start: AOTAutograd cannot cache them)"
        return f"{self.seconds:.1f} s, {cached}"

    def to_dict(self) -> dict:
        return {
            "graphs": self.graphs,
            "from_cache": self.from_cache,
            "uncached_pairs": self.uncached_pairs,
            "seconds": round(self.seconds, 3),
            "folder": None if self.folder is None else str(self.folder),
        }


class CompileWatch:
    """Counts Inductor's and AOTAutograd's cache hits and misses from its creation on (torch._dynamo's
    counters, process-wide)."""

    def __init__(self) -> None:
        self.before = self._counts()

    @staticmethod
    def _counts() -> tuple[int, int, int]:
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        hits = inductor["fxgraph_cache_hit"]
        graphs = hits + inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"]
        return hits, graphs, counters["aot_autograd"]["autograd_cache_bypass"]

    def compiled(self, seconds: float) -> Compiled:
        hits, graphs, bypassed = (now - then for now, then in zip(self._counts(), self.before))
        return Compiled(graphs, hits, seconds, in_use(), bypassed)
