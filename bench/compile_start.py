"""How long a compiled GAN's first iteration takes in a new process, from an empty compile cache and then from
the one the first left (as a second run or a resume of the model finds it): one table row per start.

    python bench/compile_start.py                                         # BigGAN-128 (ch 96), batch 2, fp32, CPU
    python bench/compile_start.py --device cuda --precision bf16 train.batch=256

Each start is a process of its own (bench/throughput.py's `measure`, one iteration: its first compiles),
with BIGBATCH_CACHE pointed at a fresh folder for the whole table and TORCHINDUCTOR_CACHE_DIR unset, so the
first start is cold whatever the user's cache holds. Inductor graphs (a forward and a backward are two),
how many came from the cache, and forward-backward pairs that AOTAutograd could not cache (traced again at
every start): bigbatch.engine.compile_cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import device_arg, one_line_errors, positive_int  # noqa: E402
from _env import measured_on  # noqa: E402


def configured(args: argparse.Namespace):  # noqa: ANN201 (bigbatch's Config, imported late: a start's import time)
    """The preset with the overrides, compiled, on --device."""
    import bigbatch
    from bigbatch.config import parse_override

    given = dict(parse_override(o) for o in args.overrides)
    cfg = bigbatch.preset(args.preset).override({"train.batch": 2, **given, "train.compile": True})
    return cfg.override({"train.device": args.device})


def child(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    from throughput import measure

    from bigbatch.engine import compile_cache

    cfg = configured(args)
    imported = time.perf_counter() - began
    watch = compile_cache.CompileWatch()
    r = measure(cfg, args.precision, False, cfg.train.batch, 1, 1000, warmup=1, flops=False, plain=False)
    compiled = watch.compiled(r["first_s"])
    print(json.dumps({"imports_s": imported, **compiled.to_dict()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--preset", default="biggan128_bs2048")
    p.add_argument("--device", default="cpu", type=device_arg)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument(
        "--starts", type=positive_int, default=2, help="starts in a row on the same cache (the first is cold)"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # (a config the model refuses, said once by the first start: one line, not its traceback)
        with one_line_errors():
            return child(args)
    with one_line_errors():  # (an unknown preset or key, a bad value: one line here, not each start's traceback)
        configured(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bigbatch-compile-start-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        env["BIGBATCH_CACHE"] = cache
        for start in range(args.starts):
            cmd = [sys.executable, __file__, "--child", "--preset", args.preset, "--device", args.device]
            out = subprocess.run([*cmd, "--precision", args.precision, *args.overrides], env=env, capture_output=True,
                                 text=True)  # fmt: skip
            if out.returncode == 2:  # (its one line, and bad input's status)
                print(out.stderr.strip().splitlines()[-1], file=sys.stderr)
                sys.exit(2)
            if out.returncode:
                sys.exit(f"start {start + 1} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[compile_start] start {start + 1}: {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    given = " ".join(["train.batch=2", *args.overrides])
    print(measured_on(args.device))
    print(f"# {args.preset} ({given}), {args.precision}, {args.device}: the first iteration in a new process")
    print("| start | first iteration s | Inductor graphs | from the cache | pairs left uncached | imports s |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        what = "cold (empty cache)" if i == 0 else "warm"
        cells = f"{r['seconds']:.1f} | {r['graphs']} | {r['from_cache']} | {r['uncached_pairs']} | {r['imports_s']:.1f}"
        print(f"| {i + 1}, {what} | {cells} |")


if __name__ == "__main__":
    main()
