"""bench/gpu_check.py's wrapper around each command it runs: the command runs in this process, as
`python -m MODULE ARGS...` or `python SCRIPT ARGS...` would run it, and at its exit the peak memory it
used goes to a JSON file:

    python bench/_peak.py PEAK.json -m bigbatch train --preset digits train.device=cuda
    python bench/_peak.py PEAK.json bench/_exported.py --device cuda G.pt

PEAK.json: "rss", the process's peak resident set (getrusage), and where the command used CUDA
"cuda_allocated" and "cuda_reserved": torch.cuda.max_memory_allocated and max_memory_reserved over the
process's life, summed over devices (the tensors' peak and the caching allocator's; the CUDA context and
libraries' own memory are in neither), and "device", the GPU's name.

BIGBATCH_CHECK_NVJPEG_STAND_IN=1 (the CPU dry run): data.decode = "gpu" decodes with OpenCV on the CPU,
nvJPEG being CUDA's, as tests/test_device_decode.py stands it in; everything around the decoder is the GPU's.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys
from pathlib import Path
from typing import Any


def record(out: Path) -> None:
    peak = {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = range(torch.cuda.device_count())
        allocated = sum(torch.cuda.max_memory_allocated(d) for d in devices)
        if allocated:  # (a command that set CUDA up and put nothing there, e.g. ONNX's exporter, used no GPU)
            peak["cuda_allocated"] = allocated
            peak["cuda_reserved"] = sum(torch.cuda.max_memory_reserved(d) for d in devices)
        peak["device"] = torch.cuda.get_device_name()
    out.write_text(json.dumps(peak))


def opencv_decoder(data: list, device: Any) -> list:
    """The CPU's stand-in for nvJPEG (no torchvision on a CPU build): OpenCV's decode, RGB CHW on `device`."""
    import cv2
    import torch

    decoded = (cv2.imdecode(d.numpy(), cv2.IMREAD_COLOR)[:, :, ::-1].copy() for d in data)
    return [torch.from_numpy(image).permute(2, 0, 1).to(device) for image in decoded]


def stand_in_nvjpeg() -> None:
    """data.decode = "gpu" decodes with `opencv_decoder` and is let run on a CPU (check refuses a CPU device)."""
    from bigbatch.data import device_decode

    device_decode.nvjpeg = opencv_decoder
    device_decode.check = lambda *args: None


def main() -> None:
    out, *command = sys.argv[1:]
    atexit.register(record, Path(out))
    if os.environ.get("BIGBATCH_CHECK_NVJPEG_STAND_IN") == "1":
        stand_in_nvjpeg()
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        sys.path[0] = os.getcwd()  # as `python -m` has it (not bench/, whose modules' names are common)
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = command
        sys.path[0] = str(Path(command[0]).resolve().parent)  # as `python SCRIPT` has it
        runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":  # (a spawned worker imports this file again, as __mp_main__)
    main()
