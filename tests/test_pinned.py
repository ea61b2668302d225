"""Results pinned across refactors: the SHA-256 of G_ema's safetensors after short runs. A change of code
structure must leave every result bit for bit. Taken on main before the task-interface redesign;
re-pinned four times since, each time for the same function computed in another order:
- when D began to read real and fake images as one batch (BigGAN-PyTorch's G_D: the same arithmetic per
  image, D's weight gradients summed over one batch of 2B instead of two of B);
- when the BigGAN blocks began to run a 3x3 conv and the 2x resampling next to it as one conv from 32 px
  on, and their shortcut's 1x1 conv on the low-resolution side (models/resample.py; test_models checks
  both against BigGAN-PyTorch's order in float64). After the "biggan" run below, G_ema then differed
  from the one before by 1.0e-4 relative L2 ("sngan": 4.6e-5); the same run before, channels-last
  against NCHW, differed by 1.3e-4.
- when BatchNorm running statistics began to be replayed in global micro-batch order by the engine
  (engine/running_stats.py), so that k processes and one train them bit for bit alike: the weights of G, D
  and G_ema stayed bit for bit (every parameter of all four runs compared), the running statistics moved
  by rounding (at most 9.2e-8 relative L2), the counts not at all.
- when each micro-batch's BatchNorm updates began to be captured from the statistics before the step
  instead of from zero (inside a step they read zero before: a forward in eval mode there was wrong):
  again every parameter of G, D and G_ema of all four runs bit for bit, the running statistics moved by
  rounding (at most 2.7e-7 relative L2), the counts not at all.

Floating-point results depend on the CPU's vector unit (AVX2 vs AVX-512 kernels sum in another order),
so the pins hold on the capability they were taken on, AVX2. A CPU with more (AVX-512) runs the AVX2
kernels for them: PyTorch's (ATEN_CPU_CAPABILITY) and oneDNN's (ONEDNN_MAX_CPU_ISA); a CPU without AVX2
skips. Kernels are still picked by vendor and model below that: an Intel AVX-512 CPU gave other bits
than the AMD ones the pins were taken on; MKL's matmuls are one cause (MKL_CBWR=COMPATIBLE, AVX2 or
AVX2,STRICT and MKL_ENABLE_INSTRUCTIONS=AVX2 each changed the bits there, none to AMD's), and oneDNN
sizes its blocks by the caches. So each vendor has its own pins: AMD's (AVX2 and AVX-512 CPUs alike) and
Intel AVX-512's (taken 2026-11-28 on an Intel Xeon with AVX-512 BF16 and AMX, from the same code as
AMD's). A CPU of neither kind skips, naming the command that prints its hashes. The runs are NCHW
(train.channels_last = false), as pinned; "biggan-nhwc" pins the channels-last default of GANs and
classifiers (taken later, on an AVX-512 CPU running AVX2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

PINNED_ON = "AVX2"
AMD, INTEL = "AuthenticAMD", "GenuineIntel/AVX512"
KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # what runs the pins on a larger CPU

BIGGAN = {
    "model.name": "biggan",
    "model.ch": 8,
    "model.dim_z": 16,
    "model.options": {"shared_dim": 8, "g_attn": 16, "d_attn": 16},
    "data.resolution": 32,
    "train.kimg": 0.256,
    "train.batch": 32,
    "train.micro_batch": 16,
    "train.g_ortho": 1e-4,
    "sample.n": 8,
}

# name -> (overrides of the digits preset, {platform: SHA-256 of the final checkpoint's G_ema.safetensors})
RUNS = {
    "digits": (
        {"train.kimg": 2},
        {
            AMD: "2541794fc26f762747cae572f280096fb03ea7a65f709fcb086c12d0873a03fb",
            INTEL: "0be4890912f5494997a035a11d823c66f147ed56ef6425d1c955482f41074ed3",
        },
    ),
    "biggan": (
        BIGGAN,
        {
            AMD: "7fcd4496a767f1a7c61d8f95af72ef89b51877ac3c7b61130ffa49be5ad9e053",
            INTEL: "9ad02b82388a07aac8591b2a46e64b565856d52f3140790f2340224078bc954c",
        },
    ),
    "biggan-nhwc": (
        {**BIGGAN, "train.channels_last": True},
        {
            AMD: "867fe3456972e40ab02a4b96923d705789f30cf73672fe17d378540b36c2f4b1",
            INTEL: "68000e721b67aac1e8861330c5bbbffe0eb30e3fc1c0379c4e5846b2584f559f",
        },
    ),
    "sngan": (
        {
            "model.name": "sngan",
            "model.ch": 8,
            "model.dim_z": 16,
            "data.resolution": 32,
            "train.kimg": 0.256,
            "train.batch": 32,
            "train.micro_batch": 8,
            "train.d_steps": 2,
            "train.lr_decay": "linear",
            "sample.n": 8,
        },
        {
            AMD: "57ecd3bec071f121a0f607705340e10ca63c7f37fce6f56b65ec18ae8c200fb1",
            INTEL: "1d1acc6d18779612fe3e1f923dbdf1a63e71b0a3f4a8c5797aa60d1bc5985ebb",
        },
    ),
}

SCRIPT = """
import hashlib, json, sys
import torch
import bigbatch
torch.set_num_threads(1)
overrides = {"train.channels_last": False, **json.loads(sys.argv[1])}  # the pins are NCHW's
run = bigbatch.train(bigbatch.preset("digits").override(overrides), run_dir=sys.argv[2], quiet=True)
latest = (run / "checkpoints" / "latest").read_text().strip()
print(hashlib.sha256((run / "checkpoints" / latest / "G_ema.safetensors").read_bytes()).hexdigest())
"""


def platform() -> str:
    """The CPU's vendor, and for Intel its capability: whose pins apply (see the module's docstring)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    vendor = next((v for v in ("AuthenticAMD", "GenuineIntel") if v in info), "unknown")
    return f"{vendor}/{torch.backends.cpu.get_cpu_capability()}" if vendor == "GenuineIntel" else vendor


def g_ema_hash(overrides: dict, run_dir: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **KERNELS}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(overrides), run_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_g_ema_bit_for_bit(name, tmp_path):
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in (PINNED_ON, "AVX512"):
        pytest.skip(f"hashes pinned on {PINNED_ON}; this CPU has {capability} kernels only")
    overrides, pinned = RUNS[name]
    if platform() not in pinned:
        pytest.skip(
            f"hashes pinned on {', '.join(pinned)}; this CPU is {platform()}: "
            "`python tests/test_pinned.py` prints its own"
        )
    assert g_ema_hash(overrides, str(tmp_path / name)) == pinned[platform()]


if __name__ == "__main__":  # print the current hashes (to pin them)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, (overrides, _) in sorted(RUNS.items()):
            print(platform(), name, g_ema_hash(overrides, os.path.join(tmp, name)), flush=True)
