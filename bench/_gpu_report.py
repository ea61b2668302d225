"""bench/gpu.py's report: the table of its parts' rows, the digest of the sources it measured, and the
section appended to bench/RESULTS.md; the device's name and the provenance line bench/gpu_check.py's
section shares."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _digest import source_digest as source_digest  # (its scripts put bench/ on the path)

from bigbatch.engine.memory import format_bytes
from bigbatch.files import atomic_write

REPO = Path(__file__).resolve().parent.parent


def device_name(device: torch.device, threads: int | None = None) -> str:
    """The GPU's name, or the CPU's with the threads torch uses (`threads`: those of the processes measured)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or "CPU"
    try:
        cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()).group(1).strip()
    except (OSError, AttributeError):
        pass
    threads = threads or torch.get_num_threads()
    return f"{cpu}, {threads} thread{'s' * (threads != 1)}"


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else format_bytes(value) if fmt == "bytes" else format(value, fmt)


def table(rows: dict[str, dict]) -> str:
    lines = [
        "| part | setting | micro × accumulation | img/s | s/iteration | peak memory | part s | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        note = f"**{r['error']}**" if "error" in r else r.get("note", "")
        cells = [name, r.get("setting", "-"), r.get("plan", "-"), cell(r, "img_per_s", ".1f")]
        cells += [cell(r, "s_per_iter", ".3f"), cell(r, "peak", "bytes"), cell(r, "seconds", ".0f"), note]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def results_file(out: Path | None, dry_run: bool) -> Path | None:
    """Where a table is appended: --out, else bench/RESULTS.md; a dry run's, --out alone (found from outside: a toy
    run appended to the repository's own results)."""
    return out if out is not None or dry_run else Path(__file__).parent / "RESULTS.md"


def keep_section(out: Path | None, text: str, said: str = "") -> None:
    """`text` appended to `out` (append_section) and said so on stderr (with `said`); None: said where it is not."""
    if out is None:
        print("a dry run's table appends to no file unless --out names one", file=sys.stderr)
    else:
        append_section(out, text)
        print(f"appended to {out}{said}", file=sys.stderr)


def append_section(path: Path, text: str) -> None:
    """Append `text` to `path` (created if missing) by writing the whole through a temporary file beside it
    and a rename (bigbatch.files.atomic_write): a reader never sees half a table, and what the file holds
    now is kept, its permissions too."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write(path, old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    os.chmod(path, mode)


def provenance() -> str:
    """What names the code a table measured: the commit (and whether the checkout had changes), the digest of
    the sources, torch's version and CUDA's."""
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "-uno"], capture_output=True, text=True)
    commit = (git.stdout.strip() or "unknown") + (" with uncommitted changes" if dirty.stdout.strip() else "")
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return (
        f"commit {commit}, sources {source_digest()} (`python bench/gpu.py --digest` prints a checkout's); "
        f"torch {torch.__version__}{cuda}"
    )


def section(rows: dict[str, dict], args: Any, seconds: float, steps: int, compile_warmup: int) -> str:
    """The dated section the run appends: heading (device; dry run), command, commit and sources, the table,
    and what each kind of part measured (`steps` timed iterations; `compile_warmup` untimed under compile)."""
    device = next((r["device_name"] for r in rows.values() if "device_name" in r), f"unknown {args.device} device")
    title = f"## GPU proof, {datetime.date.today().isoformat()}, {device}"
    if args.dry_run:
        title += " (dry run: toy sizes, not a measurement)"
    allocator = os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF")) or "default"
    command = shlex.join(["python", *sys.argv])
    failed = sum("error" in r for r in rows.values())
    made = " (`make bench-gpu`)" if command == "python bench/gpu.py" else ""
    tf32 = (
        f"cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}, matmul allow_tf32 {torch.backends.cuda.matmul.allow_tf32}"
    )
    notes = [
        f"`{command}`{made} at {provenance()}; {seconds / 60:.1f} minutes in all; "
        f"{len(rows) - failed} of {len(rows)} parts succeeded.",
        "",
        table(rows),
        "",
        "- Each part ran in a process of its own; part s counts its start-up (building the models included)"
        + (
            ", not its imports: on a CPU each part's process is a fork of one that had imported torch and bigbatch."
            if args.device == "cpu"
            else "."
        ),
        "- BigGAN: the biggan128_bs2048 preset at the batch shown, bench/throughput.py's measure: one D and one G "
        f"step per iteration, {steps} timed after warm-up; plain loop: the same steps without the Replicator. Under "
        f"train.compile: torch.compile's {args.compile_backend} backend, {compile_warmup} untimed iterations first "
        "(their time in the note), no FLOP count and no plain loop. The compile parts ran at once, each in its own "
        "process: they built, compiled and ran their untimed iterations side by side, then were timed one at a "
        "time while the others waited; part s counts from their common start.",
        '- Plan rows: what micro_batch "auto" picks at the preset\'s batch (each micro-batch probed, whether it fit), '
        "then one iteration at that plan, timed after one untimed.",
        "- SAEHD: bench/throughput.py's measure_swap (plan, 2 untimed iterations, then timed ones).",
        f"- StyleGAN2: the stylegan2_256 preset (ADA at its starting p, 0) at the micro-batch shown, "
        f"measured as BigGAN (no plain loop); its lazy penalties fall among the {steps} timed iterations as they "
        "fall in training.",
        "- resample: bench/resample.py's layers (in = out channels) at the px shown (D: the conv's input; G: its "
        "output), median of 5 after 2 untimed; above 1 the one op is faster.",
        "- fir: bench/fir.py's layers (D's blur and stride-2 conv at the px of its input, G's transposed conv and "
        "blur at the px of its output; in = out channels), median of 5 after 2 untimed, each way of filtering, "
        "then fused+act: the fused filter with the layer's bias and activation one compiled kernel more.",
        "- waits: the ops of an iteration that synchronize the host with the GPU (torch.cuda.set_sync_debug_mode "
        '"warn"; mean of 4 iterations after 2, each a D and a G step for the GANs), with the lines that called the '
        "most; the engine's one read of each optimizer step's results is expected (2 for a GAN, 1 for ResNet-50).",
        "- The profile rows (BigGAN, SAEHD, ResNet-50, StyleGAN2): busy is the kernels' time over the wall time "
        "(below 100%, the GPU waited on the CPU); the kinds and ops: the device time of the kernels each op launched "
        "itself.",
        f"- fp32 is PyTorch's default: {tf32}; cudnn.benchmark {torch.backends.cudnn.benchmark}; CUDA allocator "
        f"settings: {allocator}.",
        "- Peak memory: max_memory_allocated over the timed iterations on a GPU; on CPU counted by CPUPeak.",
    ]
    return f"{title}\n\n" + "\n".join(notes) + "\n"
