"""Memory planning: parse budgets, measure the peak memory of a probe, find the largest micro-batch that fits.

On CUDA the probe runs under the caching allocator capped at the budget's CUDA_HEADROOM share, beside a
block the size of the optimizer state still to come, so that it meets the memory pressure of training (an
OOM means "does not fit"); its peak is what the allocator held then (`max_memory_reserved`). On CPU there
is no allocator to ask, so the peak is counted by a dispatch mode that adds the bytes of every new tensor
storage and subtracts them when the storage is freed (written here: torch has no CPU counterpart of
`max_memory_allocated`). A CPU probe is a whole forward and backward at its size, eager and counted op by op:
at ImageNet's batch of 4,096 the bisection's probes (64, 512, 2,048, 4,096 images) took minutes before the first
step. So on CPU only micro-batches up to CPU_MEASURED are probed, and the peaks of larger ones are extrapolated
along the line through the two largest probed (a CPU step's memory grows linearly with its micro-batch: the
activations it saves and their gradients, beside the weights' and the optimizer's, which do not grow). Nothing
holds a CPU probe to the budget, so the two smallest sizes go first, and no size the line through them puts past
CPU_SLACK times the budget is probed.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bigbatch.engine.determinism import cudnn_autotuning
from bigbatch.errors import BigbatchError, counted, warn

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """'6GiB', '512MiB', '8GB', '1.5gib', '1000000B' (a size with its unit) or an int of bytes -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise BigbatchError(f"memory budget must be positive, got {text}")
        return text
    match = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise BigbatchError(f"cannot read memory budget {text!r}; write it like '6GiB', '512MiB' or '8GB'")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:  # (a negative one too: found from outside, "cannot be read")
        raise BigbatchError(f"memory budget must be positive, got {text!r}")
    if not match.group(2) and size < 2**20:  # (found from outside: "8", meant as GiB, was 8 bytes, refused only at
        n = match.group(1)  # the first probe; a number of bytes a MiB or more is taken as such, as it always was)
        raise BigbatchError(f"memory budget {text!r} has no unit: write it like '{n}GiB' or '{n}MiB' ('{n}B': bytes)")
    return size


def format_bytes(n: float) -> str:
    if n < 2**20:  # (a budget of 1KiB read "0.0 MiB")
        return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n:.0f} bytes"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class CPUPeak(TorchDispatchMode):
    """Counts the bytes of CPU tensor storages created while active; `peak` is the high-water mark.

    Views, in-place results and aliases of inputs allocate nothing and are not counted; storages
    that existed before (weights) are not counted either.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t._is_view():
                continue
            storage = t.untyped_storage()
            key, size = storage._cdata, storage.nbytes()
            if size == 0 or key in self.live or storage.data_ptr() in inputs:
                continue
            self.live[key] = size
            self.now += size
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._free, key)
        return out


# Share of a CUDA budget that the caching allocator may hold while probing: the rest is for the CUDA context
# (cuDNN's and cuBLAS's handles and kernels), which is not the allocator's.
CUDA_HEADROOM = 0.92


def trained_bytes(optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """Bytes of the gradients a step holds whatever its micro-batch: those of the optimizer's parameters whose are the
    most, as bigbatch's tasks hold them, rep.step making one optimizer's and freeing them as it ends (a loop of one's
    own that backpropagates through another optimizer's net unfrozen holds both: counted low). Found from outside:
    counted by requires_grad, a GAN's G had none while its D step was probed, 1.2 MiB of 8.7 unsaid; G's and D's counted
    together, a budget that micro-batch 1 fitted was said to be under this floor."""
    each = (_params_bytes(p for group in opt.param_groups for p in group["params"]) for opt in optimizers)
    return max(each, default=0)


def grad_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Bytes of the gradients a step holds whatever its micro-batch, of one of `modules` (each its own optimizer's:
    a GAN's G and D) at a time: the most of their trained parameters'."""
    return max((_params_bytes(p for p in m.parameters() if p.requires_grad) for m in modules), default=0)


def _params_bytes(params: Iterable[torch.Tensor]) -> int:
    held = {id(p): p for p in params}
    return sum(p.numel() * p.element_size() for p in held.values())


def state_bytes(
    modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer], existing: bool = False
) -> int:
    """Bytes that live through a whole step: weights and buffers, plus optimizer state not yet created
    (and, when `existing`, the state there is: a resumed run's, which a CPU probe does not see made).

    Optimizer state appears at the first step, after any probe: it is estimated as two tensors per
    parameter for Adam-like optimizers, one for SGD with momentum.
    """
    total = 0
    seen: set[int] = set()
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    for opt in optimizers:
        per_param = (1 if opt.defaults.get("momentum") else 0) if isinstance(opt, torch.optim.SGD) else 2
        for group in opt.param_groups:
            for p in group["params"]:
                if not opt.state.get(p):
                    total += per_param * p.numel() * p.element_size()
                elif existing:
                    total += sum(t.numel() * t.element_size() for t in opt.state[p].values() if torch.is_tensor(t))
    return total


def zero_grads(holders: Iterable[torch.nn.Module | torch.optim.Optimizer]) -> None:
    """Free the gradients of modules and optimizers (set to None, as `zero_grad(set_to_none=True)`)."""
    for holder in holders:
        holder.zero_grad(set_to_none=True)


@dataclass
class Probe:
    micro_batch: int
    fits: bool
    peak_bytes: int  # CUDA: the allocator's peak hold; CPU: the counted peak plus `baseline`
    measured: bool = True  # False: extrapolated from the probes below it (CPU, above CPU_MEASURED)


def measure(probe: Callable[[int], None], m: int, device: torch.device, budget: int, baseline: int) -> Probe:
    """Run `probe(m)` once and return its peak, with `baseline` bytes (state that training holds and the
    probe does not make) counted in; on CUDA an out-of-memory error means it does not fit.

    On CUDA the caller caps the allocator (CUDA_HEADROOM of `budget`), and `baseline` is held as one block
    while the probe runs, so it meets the cap as training will. Counting the allocator's reserve on top of
    its allocations without that pressure over-counted: an H200 probe of SAEHD 512 at micro-batch 8 held
    4.90 GiB for 3.57 allocated, cached blocks that an allocator at its cap frees and reuses first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            held = torch.empty(baseline, dtype=torch.uint8, device=device)
            # Eagerly, as on CPU: compiled, each size probed would be a compile of minutes (BigGAN-128 on an
            # H200), the second a dynamic-shape graph that training would then run; compile's peak is no larger.
            # Without cuDNN's autotuning: its trials' workspaces would count in the probe's peak.
            with torch.compiler.set_stance("force_eager"), cudnn_autotuning(False):
                probe(m)
            torch.cuda.synchronize(device)
        except torch.OutOfMemoryError:
            return Probe(m, False, budget + 1)
        finally:
            held = None  # noqa: F841 -- freed before the cache is emptied
            torch.cuda.empty_cache()
        peak = torch.cuda.max_memory_reserved(device)
        return Probe(m, peak <= CUDA_HEADROOM * budget, peak)
    # Eagerly: a compiled model called under a dispatch mode stops compiling for the whole process
    # (torch 2.13), so the probe counts the eager step's memory (compile's is no larger).
    with torch.compiler.set_stance("force_eager"), CPUPeak() as counter:
        probe(m)
    peak = counter.peak + baseline
    return Probe(m, peak <= budget, peak)


# The largest micro-batch a CPU plan probes (module docstring): a probe of 64 images of ResNet-50 at 64 px
# takes seconds on 2 cores; a cost that grows by a fixed amount an image is told by two sizes well apart.
CPU_MEASURED = 64


def fit_micro_batch(
    probe: Callable[[int], None],
    candidates: list[int],
    device: torch.device,
    budget: int,
    baseline: int,
    agree: Callable[[bool], bool] = lambda fits: fits,
) -> tuple[int, list[Probe]]:
    """The largest of `candidates` (ascending) whose probe fits `budget`, by bisection (on CPU, above
    CPU_MEASURED, by extrapolation: the module's docstring); with the probes, ascending.

    `agree` makes all ranks take the same branch (fits only if it fits everywhere).
    Raises BigbatchError if even the smallest does not fit, or if there is none to try.
    """
    if not candidates:  # (found from outside: min() of no probes, a traceback)
        raise BigbatchError(
            "no micro-batch to try: no divisor of this rank's share of the batch is one the Replicator's "
            "takes_micro accepts; accept one (1 always divides), or give micro_batch a number"
        )

    def probed(m: int) -> Probe:  # (a probe, its fit agreed by every rank)
        result = measure(probe, m, device, budget, baseline)
        result.fits = agree(result.fits)
        return result

    measurable = [c for c in candidates if c <= CPU_MEASURED]
    if device.type == "cpu" and 2 <= len(measurable) < len(candidates):
        # The two smallest first, and a line through them: no size it puts past CPU_SLACK x the budget is probed
        # (found from outside: 32 probed first whatever the budget, 12.5x one of 8 MiB; a CPU probe past it takes
        # the memory all the same, and where that is short the kernel kills the process).
        scouts = [probed(candidates[0])]
        if not scouts[0].fits:
            raise OverBudget(candidates[0], scouts[0].peak_bytes, budget)
        scouts.append(probed(candidates[1]))
        if not scouts[1].fits:
            return candidates[0], scouts
        (m0, p0), (m1, p1) = ((s.micro_batch, s.peak_bytes) for s in scouts)
        line = max(0.0, (p1 - p0) / (m1 - m0))
        if p1 + line * (measurable[-2] - m1) > CPU_SLACK * budget:  # (the sizes the line keeps within, bisected)
            best, probes = _bisect(probed, [m for m in measurable[2:] if p1 + line * (m - m1) <= CPU_SLACK * budget])
            return best or m1, sorted([*scouts, *probes], key=lambda p: p.micro_batch)
        # The smaller of the two largest measured, and the larger only where it fits (found from outside: 64
        # probed first, and 32 measured again by the bisection below it).
        a = probed(measurable[-2])
        if not a.fits:  # (bisect below it, above the scouts)
            best, probes = _bisect(probed, measurable[2:-2])
            return best or m1, sorted([*scouts, *probes, a], key=lambda p: p.micro_batch)
        b = probed(measurable[-1])
        if not b.fits:  # (the largest that fits: the one below it)
            return a.micro_batch, [*scouts, a, b]
        slope = max(0.0, (b.peak_bytes - a.peak_bytes) / (b.micro_batch - a.micro_batch))
        probes, micro = [*scouts, a, b], b.micro_batch
        for m in reversed(candidates[len(measurable) :]):  # the largest first, until one fits on every rank
            peak = b.peak_bytes + round(slope * (m - b.micro_batch))
            probes.append(Probe(m, agree(peak <= budget), peak, measured=False))
            if probes[-1].fits:
                micro = m
                break
        return micro, sorted(probes, key=lambda p: p.micro_batch)
    best, probes = _bisect(probed, candidates)
    if best is None:
        raise OverBudget(candidates[0], min(probes, key=lambda p: p.micro_batch).peak_bytes, budget)
    return best, sorted(probes, key=lambda p: p.micro_batch)


# How far past the budget a CPU plan's line through its two smallest probes may put a size it probes (its line is an
# estimate: a step's memory per image is not quite constant at the smallest sizes).
CPU_SLACK = 1.5


def _bisect(probed: Callable[[int], Probe], candidates: list[int]) -> tuple[int | None, list[Probe]]:
    """The largest of `candidates` (ascending) whose probe (`probed`) fits, by bisection (None: none does, or none
    given), and the probes."""
    lo, hi = 0, len(candidates) - 1
    best: int | None = None
    probes: list[Probe] = []
    while lo <= hi:
        mid = (lo + hi) // 2
        probes.append(probed(candidates[mid]))
        if probes[-1].fits:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return (None if best is None else candidates[best]), probes


class OverBudget(BigbatchError):
    """Even the `smallest` micro-batch does not fit `budget`: its probe peaked at `peak` bytes."""

    def __init__(self, smallest: int, peak: int, budget: int) -> None:
        self.smallest, self.peak, self.budget = smallest, peak, budget
        super().__init__(f"even micro_batch={smallest} needs {format_bytes(peak)}, over the memory budget of "
                         f"{format_bytes(budget)}")  # fmt: skip


def default_budget(device: torch.device, local_world: int = 1) -> int:
    """The memory a process may use when no budget is given: the GPU's total, or its share of free RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)  # (the driver counts this process's cached blocks as used)
        return free + torch.cuda.memory_reserved(device)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = 8 * 2**30
    return available // max(1, local_world)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


OFF = ("0", "false", "no", "off")  # BIGBATCH_KEEP_FREED's values that turn it off


def hold_freed_memory() -> bool:
    """Keep the memory a CPU training step frees for the next step (glibc's malloc; elsewhere nothing).

    By default glibc maps every block over its mmap threshold (at most 32 MiB) afresh and unmaps it
    when freed, and gives freed heap back to the system: a training step's activations are faulted in
    page by page, and zeroed by the kernel, every step. Measured on one core with a SAEHD step (fp32,
    batch 8): 2.2 million page faults and 3 s of system time a step at 256 px (17 % of the step), 0.3
    million and 0.45 s at 128 px; with the blocks taken from the heap and the heap kept (these three
    settings) both go to nothing. The cost is resident memory, which the heap's fragments add to: about
    9 % for that SAEHD step, but 1.5x for a 3-layer conv net in fp32 at micro-batch 256 (537 MiB against
    348: bench/cpu_resident.py; found from outside, the 9 % taken for every net). Process-wide and
    inherited by forked workers; torch has no CPU caching allocator to ask instead. BIGBATCH_KEEP_FREED=0
    leaves glibc's policy as it is. Returns whether the settings took."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or os.environ.get("BIGBATCH_KEEP_FREED", "").lower() in OFF:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl): it keeps its own policy
        return False
    settings = ((_M_MMAP_THRESHOLD, 2**31 - 1), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 2**30))
    return all(mallopt(param, value) == 1 for param, value in settings)


def plan_holds(
    plan: dict,
    world_size: int,
    budget: int | None,
    speak: Callable[[str], str] | None,
    precision: str = "",
    checkpointing: bool = False,
) -> bool:
    """Whether a resumed micro_batch "auto" run keeps the plan its checkpoint holds: one made for this world
    size, this precision (a resume may change it: bf16 to fp32 doubles the activations) and, where a budget is
    given, for this budget (else it probes again, and `speak`s of a new budget or precision: a warning, its words the
    config's or the Replicator's arguments' as `speak` puts them)."""
    if plan["world_size"] != world_size:
        if speak:  # (found from outside: a resume at another world size probed again without a word)
            was, now = (counted(n, "process") for n in (plan["world_size"], world_size))
            warn(f'the checkpoint\'s plan was made for {was}, this run has {now}: micro_batch "auto" is probed again')
        return False
    if precision and plan.get("precision", precision) != precision:
        if speak:
            warn(speak(f'the checkpoint\'s plan was made for {plan["precision"]}, this run is {precision}: '
                       'micro_batch "auto" is probed again'))  # fmt: skip
        return False
    if plan.get("checkpointing", checkpointing) != checkpointing:  # (a resume may switch it: memory changes)
        if speak:
            warn(speak(f"train.checkpointing is {str(checkpointing).lower()} since the checkpoint's plan: "
                       'micro_batch "auto" is probed again'))  # fmt: skip
        return False
    if budget is not None and budget != plan["memory_budget_bytes"]:
        if speak:
            before = format_bytes(plan["memory_budget_bytes"])
            warn(speak(f'train.memory_budget is {format_bytes(budget)}, the checkpoint\'s plan was made for {before}: '
                       'micro_batch "auto" is probed again'))  # fmt: skip
        return False
    return True


def local_world() -> int:
    """Processes on this machine (torchrun's LOCAL_WORLD_SIZE): what share of free RAM one may plan for."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def save_buffers(models: list[nn.Module]) -> list[tuple[nn.Module, str, torch.Tensor]]:
    """Copies of the models' buffers, which a probe's training forwards move (BatchNorm statistics)."""
    return [(m, k, b.clone()) for net in models for m in net.modules() for k, b in m._buffers.items() if b is not None]


def restore_buffers(saved: list[tuple[nn.Module, str, torch.Tensor]]) -> None:
    for m, k, b in saved:
        m._buffers[k] = b


def budget_of(memory_budget: str | int | None, micro_batch: int | str, config_terms: bool, rank: int) -> int | None:
    """`memory_budget` in bytes (None: none given); given with a fixed micro_batch, which reads none, said (found from
    outside: said nothing; replicator_for's config says it in its own terms)."""
    budget = None if memory_budget in (None, "") else parse_bytes(memory_budget)
    if budget is not None and micro_batch != "auto" and not config_terms and rank == 0:
        warn(f'memory_budget is read by micro_batch="auto" only: at micro_batch={micro_batch} nothing holds the step')
    return budget
