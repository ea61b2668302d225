"""The line a CPU benchmark's table starts with: when, on what and with which code it was measured (found from
outside: the CPU tables said none of it, and README's claims depend on the CPU's instructions and its load)."""

from __future__ import annotations

import datetime
import os

import torch
from _gpu_report import device_name, provenance


def measured_on(device: str | torch.device = "cpu", threads: int | None = None) -> str:
    """ "Measured DATE on DEVICE (a CPU's threads and torch's kernels for it: their ISA); commit ...; load average L
    on C cores" as a Markdown note: a CPU figure taken where other processes share the cores is the slower for it.
    `threads`: those of the processes measured, where they are not this one (a side-by-side's workers)."""
    device = torch.device(device)
    where = device_name(device, threads)
    if device.type == "cpu":
        where += f", torch's CPU kernels for {torch.backends.cpu.get_cpu_capability()}"
    load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" if hasattr(os, "getloadavg") else ""
    return f"_Measured {datetime.date.today().isoformat()} on {where}; {provenance()}{load}_\n"
