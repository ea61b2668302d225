"""bench/gpu_check.py's check of `bigbatch export`'s files as a user deploys them: each loaded as its format
is loaded (TorchScript: torch.jit.load; pt2: torch.export.load; ONNX: onnxruntime), run on the device on
inputs of the shape its metadata (bigbatch.json) says, and compared with the same file run on the CPU.

    python bench/_exported.py --device cuda classifier.pt G.pt G.pt2 swap.pt classifier.onnx

One line per file ("exported: ..."); the exit status is 1 if a file failed to load or run, or its outputs
on the device strayed from the CPU's (beyond TF32's and the kernels' rounding: see TOLERANCE).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

# Mean absolute difference allowed between the device's and the CPU's outputs: probabilities (classify) and
# 0-255 pixel levels (gan, swap; a level flips where a value sits at a rounding edge, more under TF32).
TOLERANCE = {"classify": 0.01, "gan": 1.5, "swap": 1.5}


def load(path: Path, device: str):
    """(callable, metadata, format) of an exported file, its weights on `device`."""
    if path.suffix == ".onnx":
        import onnx
        import onnxruntime as ort

        meta = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}["bigbatch"])
        gpu = device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers()
        session = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"] * gpu + ["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run(*inputs: torch.Tensor):
            outs = session.run(None, {n: x.cpu().numpy() for n, x in zip(names, inputs)})
            return tuple(torch.from_numpy(o) for o in outs)

        return run, meta, "onnx, onnxruntime " + ("CUDA" if gpu else "CPU: no CUDA provider installed")
    extra = {"bigbatch.json": ""}
    if path.suffix == ".pt2":  # an ExportedProgram names its devices: torch.export's own pass moves them all
        from torch.export.passes import move_to_device_pass

        module = move_to_device_pass(torch.export.load(str(path), extra_files=extra), device).module()
        fmt = "pt2, move_to_device_pass"
    else:
        module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        fmt = "torchscript"
    return module, json.loads(extra["bigbatch.json"]), fmt


def inputs(meta: dict) -> tuple[torch.Tensor, ...]:
    """Inputs of the shapes the file takes (exported runs: classify, gan, swap), the same on every call."""
    g = torch.Generator().manual_seed(0)
    if meta["task"] == "classify":  # a batch of two images of a size it was not trained at (every format takes one)
        side = meta["resolution"]
        return (torch.randint(0, 256, (2, side + 7, side + 19, 3), dtype=torch.uint8, generator=g),)
    if meta["task"] == "gan":
        z = torch.randn(4, meta["dim_z"], generator=g)
        classes = len(meta["class_names"])
        return (z, torch.arange(4) % classes) if classes else (z,)
    side = meta["resolution"]
    return (torch.randint(0, 256, (2, side, side, 3), dtype=torch.uint8, generator=g),)


def outputs(result) -> list[torch.Tensor]:
    return [r.detach().cpu() for r in (result if isinstance(result, (tuple, list)) else (result,))]


def check(path: Path, device: str) -> str:
    if not path.exists():
        raise FileNotFoundError(f"{path} was not written (its export failed)")
    model, meta, fmt = load(path, device)
    x = inputs(meta)
    with torch.no_grad():
        model(*(t.to(device) for t in x))  # (the first call compiles or autotunes)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        result = model(*(t.to(device) for t in x))
        if device == "cuda":
            torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t)
        # Outputs on the inputs' device (found from outside: a TorchScript G copied its images to the host).
        strayed = {r.device.type for r in (result if isinstance(result, (tuple, list)) else (result,))} - {device}
        if strayed and not fmt.startswith("onnx"):  # (onnxruntime answers host arrays)
            raise RuntimeError(f"{path.name} ({fmt}): outputs on {', '.join(sorted(strayed))}, not on {device}")
        on_device = outputs(result)
        on_cpu = outputs(load(path, "cpu")[0](*x))
    shapes = ", ".join(f"{tuple(o.shape)} {str(o.dtype).removeprefix('torch.')}" for o in on_device)
    diffs = [(a.double() - b.double()).abs() for a, b in zip(on_device, on_cpu)]
    mean = max(d.mean().item() for d in diffs)
    worst = max(d.max().item() for d in diffs)
    where = {p.device.type for p in getattr(model, "parameters", lambda: [])()} or {"-"}
    line = (
        f"{path.name} ({fmt}, {meta['task']}): on {device} (weights on {', '.join(sorted(where))}) -> {shapes} "
        f"in {ms:.1f} ms; |{device} - cpu| mean {mean:.2g}, max {worst:.2g}"
    )
    if [o.shape for o in on_device] != [o.shape for o in on_cpu] or not mean <= TOLERANCE[meta["task"]]:
        raise RuntimeError(f"outputs differ from the CPU's beyond {TOLERANCE[meta['task']]}: {line}")
    if not all(np.isfinite(o.double().numpy()).all() for o in on_device):
        raise RuntimeError(f"non-finite outputs: {line}")
    return line


def main() -> None:
    p = argparse.ArgumentParser(description="Load exported files, run them on a device, compare with the CPU.")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("files", nargs="+", type=Path)
    args = p.parse_args()
    failed = 0
    for path in args.files:
        try:
            print(f"exported: {check(path, args.device)}", flush=True)
        except Exception as e:  # noqa: BLE001 -- each file's failure is its own line
            traceback.print_exc()
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}" if str(e).strip() else type(e).__name__
            print(f"exported: {path.name} FAILED: {why}", flush=True)
            failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
