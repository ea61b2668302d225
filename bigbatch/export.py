"""`bigbatch export RUN OUT [--format torchscript|onnx|pt2]`: a trained run as one file to deploy,
loadable with torch alone (torch.jit.load; torch.export.load for pt2, TorchScript's successor) or with
onnxruntime, its settings inside (JSON: the extra file `bigbatch.json` of a TorchScript or pt2 file,
the metadata property `bigbatch` of an ONNX model). Written on the CPU, each runs on a GPU too:
torch.jit.load(OUT, map_location="cuda"); a pt2 program names its devices, so it moves with
torch.export.passes.move_to_device_pass(program, "cuda") (bench/gpu_check.py runs each so).

- classify: uint8 RGB image (H, W, 3) of any size -> class probabilities (1, classes), the
  preprocessing of `bigbatch predict` included (tasks/classify/inference.py); class names inside.
- gan: the EMA generator, z (N, dim_z) float32 [and class y (N,) int64 when conditional] -> uint8
  images (N, H, W, C), what `bigbatch sample` writes for the same z and classes (a StyleGAN2's at
  `--psi`, its truncation of w toward w_avg, built in: ADA's `truncation_psi`).
- swap: aligned faces uint8 RGB (N, R, R, 3) at the model's resolution -> the src->dst swap: swapped
  faces uint8 (N, R, R, 3) and its mask uint8 (N, R, R) (the src-path mask times the dst path's, the
  mask DFL's merger blends with), what `bigbatch swap` writes.

ONNX goes through torch.onnx's dynamo exporter (onnx and onnxscript installed: the `onnx` extra);
the sizes that vary (the image's sides, the batch) stay free in the graph.

--format dfm (or OUT named *.dfm): a swap run, or a DeepFaceLab SAEHD model folder, as DeepFaceLive's model
file (tasks/swap/dfm.py), the ONNX graph DFL's own `exportdfm` writes.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from bigbatch import checkpoints
from bigbatch.checkpoint_find import read_picked
from bigbatch.config import Config
from bigbatch.errors import BigbatchError
from bigbatch.files import atomic_write, json_loads
from bigbatch.provenance import code_version
from bigbatch.sampling import uint8_nhwc

FORMATS = ("torchscript", "onnx", "pt2", "dfm")
SETTINGS_MAX = 1 << 20  # bytes of an export's settings (bigbatch.json) read_settings reads


def read_settings(path: Path) -> dict[str, Any] | None:
    """The settings a file `bigbatch export` wrote holds (a TorchScript or pt2 archive's extra file bigbatch.json, an
    ONNX model's property `bigbatch`), read without loading its code; None for another file."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith(("/extra/bigbatch.json", "extra_files/bigbatch.json"))]
                # (a few KB as written; found from outside, one that inflated to 6.7 GB was read whole)
                names = [n for n in names if z.getinfo(n).file_size <= SETTINGS_MAX]
                settings = json_loads(z.read(names[0])) if names else None
            return settings if isinstance(settings, dict) else None
        if path.suffix.lower() not in (".onnx", ".dfm"):
            return None
        import onnx

        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        settings = json_loads(props["bigbatch"]) if "bigbatch" in props else None
        return settings if isinstance(settings, dict) else None
    except (ImportError, OSError, ValueError, zipfile.BadZipFile):
        return None
    except Exception as e:  # noqa: BLE001 (onnx's parser raises its own errors of a file that is not ONNX)
        if type(e).__module__.startswith(("onnx", "google")):
            return None
        raise


LEAST = {"C": 3}  # a free size's least value, where not 1: an image's channels (RGB, or RGBA's alpha left out)
MOST = {"C": 4}  # ... and most (found from outside: an NCHW batch was taken as 28 "channels" of 3 rows)


class Deployable(NamedTuple):
    module: nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[str]
    outputs: list[str]
    free: dict[str, dict[int, str]]
    """Input name -> {dimension: name} of the sizes that vary."""
    meta: dict[str, Any]
    usage: str
    """Its call's arguments and what it gives, "(...) gives ...", after the caller ("model", an ONNX session's)."""


class GeneratorOut(nn.Module):
    """G(z, y) -> uint8 NHWC images."""

    def __init__(self, G: nn.Module, conditional: bool):
        super().__init__()
        self.G, self.conditional, self.classes = G, conditional, len(getattr(G, "class_names", None) or ())
        self.register_buffer("class_table", torch.arange(self.classes), persistent=False)  # (a buffer: it moves with
        # the module to a GPU, where a traced arange would name the CPU it was traced on)

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if self.conditional and y is not None and self.classes:  # a class out of range refused by every format: looked
            # up in a table of the classes (ONNX's one-hot of one gave zeros, its embedding of -1 the last class's: a
            # mix of two classes' images, found from outside; a one-hot's G, StyleGAN2's, found by review)
            y = self.class_table[torch.where(y < 0, self.classes, y)]
        return uint8_nhwc(self.G(z, y if self.conditional else None))


class SwapOut(nn.Module):
    """Aligned faces uint8 NHWC -> (swapped uint8 NHWC, mask uint8 NHW)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = faces[..., :3].permute(0, 3, 1, 2).float() / 255
        image, mask, dst_mask = self.model.swap(x)
        swapped = (image.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        both = ((mask * dst_mask).float().clamp(0, 1) * 255).round().to(torch.uint8)[:, 0]
        return swapped, both


def deployable(run: str | Path, which: str = "latest", psi: float | None = None) -> Deployable:
    """What `export` writes for the run (or checkpoint) `run` at the checkpoint `which` names (a run's latest
    that its training prunes meanwhile: its newest). `psi`: a StyleGAN2's truncation of w (1 or None: off)."""
    if psi is not None and not math.isfinite(psi):
        raise BigbatchError(f"--psi must be a number (1 = off, 0.7 typical), got {psi}")
    return read_picked(run, which, lambda ckpt: _deployable(ckpt, psi))


def origin(ckpt: Path) -> str:
    """Which checkpoint a deployed file came from, as its metadata says it: RUN/checkpoints/KIMG by the run folder's
    name, not its absolute path (found from outside: a .dfm, shared as DeepFaceLive's are, said its maker's home
    folder; as typed, a relative path named nothing once deployed)."""
    ckpt = Path(ckpt).resolve()
    return f"{ckpt.parent.parent.name}/checkpoints/{ckpt.name}" if ckpt.parent.name == "checkpoints" else ckpt.name


def _deployable(ckpt: Path, psi: float | None) -> Deployable:
    cfg = Config.load(ckpt / "config.toml")
    # Where it came from: the checkpoint (origin's name of it), the model family and the images it had trained on
    # (found from outside: a deployed file did not say them)
    kimg = int((checkpoints.read_meta(ckpt) or {}).get("nimg", 0)) / 1000
    base = {"task": cfg.task, "model": cfg.model.name, "checkpoint": origin(ckpt), "kimg": kimg}
    base["bigbatch"] = code_version()  # (the code that exported it, as a checkpoint names its: found from outside)
    if psi is not None and (cfg.task != "gan" or cfg.model.name != "stylegan2"):
        what = f"a {cfg.task} run" if cfg.task != "gan" else f"a {cfg.model.name} generator"
        raise BigbatchError(
            f'--psi is StyleGAN2\'s truncation of w (model.name = "stylegan2"); {ckpt} is {what}'
            + (": draw z truncated for BigGAN's trick (bigbatch.sampling.draw_latents)" if cfg.task == "gan" else "")
        )
    if cfg.task == "classify":
        from bigbatch.tasks.classify.inference import inference_of

        module = inference_of(ckpt, "latest", "cpu")
        meta = base | {"class_names": module.class_names, "resolution": module.resolution}
        # Traced on a batch: the graph formats (ONNX, pt2) fix the rank, and take (N, H, W, C) of any N, size and
        # C >= 3 (RGBA's alpha left out); TorchScript's scripted wrapper takes one image (H, W, C) as well.
        example = (torch.zeros(2, module.side + 3, module.side + 5, 4, dtype=torch.uint8),)  # (4 planes: C not 3 only)
        usage = "(uint8 RGB images (N, H, W, 3) of any size) gives class probabilities (N, classes)"
        free = {"images": {0: "N", 1: "H", 2: "W", 3: "C"}}
        return Deployable(module, example, ["images"], ["probabilities"], free, meta, usage)
    if cfg.task == "gan":
        from bigbatch.tasks.gan.load import load_generator

        G = load_generator(ckpt, as_trained=False)  # (traced NCHW, as the formats run it)
        conditional = bool(cfg.model.conditional and G.class_names)
        if psi is not None:
            G.truncation_psi = psi  # (a constant of the traced graph)
        module = GeneratorOut(G, conditional).eval()
        meta = base | {"resolution": cfg.data.resolution, "dim_z": G.dim_z}
        meta |= {"class_names": list(G.class_names) if conditional else []}
        meta |= {"psi": psi} if psi is not None else {}
        example = (torch.randn(2, G.dim_z),) + ((torch.tensor([0, 1]) % len(G.class_names),) if conditional else ())
        inputs = ["z", "y"][: len(example)]
        n = len(G.class_names) if conditional else 0
        classes = f", classes (N,) int64 in 0..{n - 1}" if conditional else ""
        usage = f"(z of shape (N, {G.dim_z}){classes}) gives uint8 NHWC images"
        return Deployable(module, example, inputs, ["images"], {k: {0: "N"} for k in inputs}, meta, usage)
    if cfg.task == "swap":
        from bigbatch.tasks.swap.load import load_autoencoder

        model = load_autoencoder(ckpt)
        r = model.resolution
        meta = base | {"resolution": r, "face_type": _recorded_face_type(ckpt, cfg)}
        example = (torch.zeros(2, r, r, 3, dtype=torch.uint8),)
        usage = f"(aligned faces uint8 (N, {r}, {r}, 3)) gives the swapped faces and their masks"
        module = SwapOut(model).eval()
        return Deployable(module, example, ["faces"], ["swapped", "mask"], {"faces": {0: "N"}}, meta, usage)
    raise BigbatchError(f"{ckpt} is a {cfg.task} run: export takes classify, gan and swap runs")


def export(
    run: str | Path,
    out: str | Path,
    which: str = "latest",
    fmt: str = "torchscript",
    psi: float | None = None,
    overwrite: bool = True,
) -> tuple[Path, str]:
    """Write the run's `deployable` to `out` as one file; returns (out, how to call it). `overwrite` False: a file at
    `out`, there before or come meanwhile, stays (one line)."""
    if fmt not in FORMATS:
        raise BigbatchError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "dfm":
        if psi is not None:
            raise BigbatchError("--psi is a StyleGAN2's truncation; a .dfm is a face swap: leave --psi out")
        data, usage = _dfm(run, which)
    else:
        d = deployable(run, which, psi)
        data = {"onnx": _onnx, "pt2": _pt2, "torchscript": _torchscript}[fmt](d)
        # (an ONNX session is run by its inputs' names, not called: found from outside, "model(...)")
        named = ", ".join(f"{name!r}: ..." for name in d.inputs)
        usage = (f"session.run(None, {{{named}}}) of " if fmt == "onnx" else "model") + d.usage
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # (every command makes the folders its output names)
    except (FileExistsError, NotADirectoryError):  # (found from outside: "cls.pt: File exists")
        raise BigbatchError(f"cannot write {out}: a file is in the way of its folder {out.parent}") from None
    try:
        atomic_write(out, data, replace=overwrite)
    except FileExistsError:  # (came while the export ran: found from outside, replaced)
        raise BigbatchError(f"{out} exists: give --overwrite to replace it, or another name") from None
    return out, usage


def _recorded_face_type(ckpt: Path, cfg: Config) -> str | None:
    """The face type a swap checkpoint trained on: its meta.json's (from the faces), else swap.face_type (found
    from outside: the config's alone, empty when the faces said it)."""
    from bigbatch.checkpoints import model_info

    return model_info(ckpt).get("face_type") or cfg.swap.face_type or None


def _dfm(run: str | Path, which: str) -> tuple[bytes, str]:
    """DeepFaceLive's .dfm of a swap run, or of a DeepFaceLab SAEHD model folder (tasks/swap/dfm.py)."""
    from bigbatch.data.align import face_type
    from bigbatch.models import dfl
    from bigbatch.tasks.swap.dfm import dfm_bytes
    from bigbatch.tasks.swap.load import dfl_model, load_autoencoder

    def from_run(ckpt: Path) -> tuple[nn.Module, str, dict[str, Any]]:
        cfg = Config.load(ckpt / "config.toml")
        if cfg.task != "swap":
            raise BigbatchError(
                f"{ckpt} is a {cfg.task} run: a .dfm is DeepFaceLive's face-swap model; give a swap run or a "
                "DeepFaceLab SAEHD model folder"
            )
        return load_autoencoder(ckpt), _recorded_face_type(ckpt, cfg) or "", {"checkpoint": origin(ckpt)}

    if (named := dfl_model(run)) is not None:
        if which != "latest":  # (found by review: taken, and nothing done with it)
            raise BigbatchError(f"--checkpoint picks a checkpoint of a run; {run} is a DeepFaceLab model folder")
        model, data = dfl.load_model_folder(*named)
        kind, meta = str(data["options"].get("face_type", "")), {"dfl_model": str(run)}
    else:
        model, kind, meta = read_picked(run, which, from_run)
    r = model.resolution
    aligner = f"face type {face_type(kind).dfl_name}" if kind else "the face type the faces were extracted with"
    usage = (
        f"DeepFaceLive: put it in its dfm_models folder and pick it in the face swapper; set its face aligner to "
        f"{aligner} (it swaps {r} px faces)"
    )
    return dfm_bytes(model, {"task": "swap", "resolution": r, "face_type": kind or None, **meta}), usage


def _torchscript(d: Deployable) -> bytes:
    module = d.module
    try:
        with torch.no_grad():
            if d.meta["task"] == "classify":
                # The network always sees resolution x resolution: traced there (any family); the wrapper,
                # which takes any image size, scripted.
                r = module.resolution
                module.net = torch.jit.trace(module.net, torch.zeros(1, 3, r, r))
                scripted = torch.jit.script(module)
            else:
                scripted = torch.jit.trace(module, d.example, check_trace=False)
    except Exception as e:  # noqa: BLE001 -- TorchScript raises many types for what it cannot compile
        raise BigbatchError(f"this model cannot be exported to TorchScript ({type(e).__name__}: {e})") from None
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer, _extra_files={"bigbatch.json": json.dumps(d.meta)})
    return buffer.getvalue()


def _dynamic(d: Deployable) -> dict[str, dict[int, Any]]:
    """torch.export's dynamic_shapes for the sizes that vary."""
    names = {name for sizes in d.free.values() for name in sizes.values()}
    dims = {name: torch.export.Dim(name, min=LEAST.get(name, 1), max=MOST.get(name)) for name in names}
    return {k: {i: dims[n] for i, n in d.free[k].items()} for k in d.inputs}


def _pt2(d: Deployable) -> bytes:
    """torch.export's ExportedProgram (TorchScript's successor): torch.export.load(OUT).module()."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(d.module, d.example, dynamic_shapes=_dynamic(d))
    except Exception as e:  # noqa: BLE001 -- torch.export raises many types for what it cannot trace
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BigbatchError(f"this model cannot be exported with torch.export ({type(e).__name__}: {why})") from None
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={"bigbatch.json": json.dumps(d.meta)})
    return buffer.getvalue()


def _onnx(d: Deployable) -> bytes:
    try:
        import onnx
        import onnxscript  # noqa: F401  -- torch.onnx's dynamo exporter needs it
    except ImportError:
        raise BigbatchError(
            "--format onnx needs the onnx and onnxscript packages: pip install onnx onnxscript (bigbatch's extra "
            "[onnx], with onnxruntime, which runs the file)"
        ) from None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's notes on its own internals
                torch.onnx.export(
                    d.module,
                    d.example,
                    str(path),
                    dynamo=True,
                    input_names=d.inputs,
                    output_names=d.outputs,
                    dynamic_shapes=_dynamic(d),
                    external_data=False,
                    verbose=False,
                )
        except Exception as e:  # noqa: BLE001 -- the exporter raises many types for what it cannot convert
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BigbatchError(f"this model cannot be exported to ONNX ({type(e).__name__}: {why})") from None
        model = onnx.load(str(path))
    _drop_where_traced(model.graph)
    for function in model.functions:
        _drop_where_traced(function)
    onnx.helper.set_model_props(model, {"bigbatch": json.dumps(d.meta)})
    return model.SerializeToString()


# What the exporter notes of each node's tracing: the Python stack (this machine's paths) and the FX node (objects'
# addresses); found from outside, no two exports of one checkpoint were the same bytes. The module hierarchy stays.
_TRACED = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node")


def _drop_where_traced(graph: Any) -> None:
    """Drop _TRACED from the nodes of an ONNX graph or function, and of the graphs inside them (If, Loop)."""
    for node in graph.node:
        kept = [p for p in node.metadata_props if p.key not in _TRACED]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
        for attribute in node.attribute:
            for sub in (attribute.g, *attribute.graphs):
                _drop_where_traced(sub)
