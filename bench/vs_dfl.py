"""CPU seconds per SAEHD training iteration, side by side: DeepFaceLab's own TensorFlow code against
bigbatch's swap task, the same model options, one thread a side.

    .venv/bin/python bench/vs_dfl.py --dfl /tmp/dflcheck/DeepFaceLab --dfl-python /tmp/dflcheck/venv/bin/python
    .venv/bin/python bench/vs_dfl.py --dfl /tmp/dflcheck/DeepFaceLab --dfl-python /tmp/dflcheck/venv/bin/python \
        --res 256 --archi df-ud --steps 3

Each row is its own worker process (DFL's in DFL's Python, bigbatch's in this one), OMP_NUM_THREADS=1,
TF intra_op/inter_op parallelism 1, torch.set_num_threads(1). The workers are built (model build not
timed) and take --warmup untimed iterations; then the rows take one iteration each in turn, round
after round (A, B, A, B ...), so machine load falls on all alike. Counted: the process's CPU time
(time.process_time: all its threads) over one iteration. The default options are the preset
saehd128's (liae-ud, 256/64/64/22, batch 8, fp32, AdaBelief, masked training, random warp, no lr
dropout, no eyes/mouth priority, GAN/true-face/style powers 0, ct_mode none, clipgrad off).

DFL: its SAEHDModel unchanged, imported from --dfl; its option prompts answered in code and its
SampleGeneratorFace replaced by ready random faces (its loader, warp and flips included, runs in
other processes in DFL, so nothing of it is timed). Its iteration is `train_one_iter` (src_dst_train).
bigbatch: `task.step(feed)` on synthetic faces (bench/_swap.py), which reads the faces and does the
random affine, warp and dst flip in the training process: timed. Hence the row with
swap.random_warp=false (its affine and flip still timed).
A liae model trains no inter_AB without random warp (both sides), so for liae DFL also has that row.

TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX-512 VNNI/BF16 or AMX; elsewhere
(an AVX2 CPU) DFL as shipped runs Eigen's convolutions, about half as fast. So DFL also runs with
TF_ENABLE_ONEDNN_OPTS=1 (its code unchanged; the header says which kernels its default took), and each
bigbatch row gets a ratio against both; --no-onednn-row leaves that row out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _args import DFL_CHECKOUT, positive_int  # noqa: E402
from _procs import BEFORE_HELP, Rows, become_worker, before_command, serve  # noqa: E402


def dfl_worker(a: argparse.Namespace) -> None:
    sys.path.insert(0, a.dfl)
    import numpy as np
    from core.interact import interact as io
    from core.leras import nn

    ae, e, d, dm = a.dims
    answers = {  # prompt prefix -> answer; a prompt not here stops the worker
        "Autobackup every N hour": 0, "Write preview history": False, "Target iteration": 0,
        "Flip SRC faces randomly": False, "Flip DST faces randomly": True, "Batch_size": a.batch,
        "Resolution": a.res, "Face type": "f", "AE architecture": a.archi, "AutoEncoder dimensions": ae,
        "Encoder dimensions": e, "Decoder dimensions": d, "Decoder mask dimensions": dm,
        "Eyes and mouth priority": False, "Uniform yaw": False, "Blur out mask": False,
        "Place models and optimizer on GPU": False, "Use AdaBelief optimizer?": True,
        "Use learning rate dropout": "n", "Enable random warp of samples": a.random_warp == "y",
        "Random hue/saturation/light intensity": 0.0, "GAN power": 0.0, "'True face' power.": 0.0,
        "Face style power": 0.0, "Background style power": 0.0, "Color transfer for src faceset": "none",
        "Enable gradient clipping": a.clipgrad, "Enable pretraining mode": False,
    }  # fmt: skip

    def answer(prompt, default_value=None, *args, **kw):
        for key, value in answers.items():
            if prompt.startswith(key):
                return value
        raise SystemExit(f"unanswered DFL prompt {prompt!r} (default {default_value!r})")

    io.input_str = io.input_int = io.input_bool = io.input_number = answer
    io.input_in_time = lambda *args, **kw: False
    io.input_skip_pending = lambda *args, **kw: None

    import models
    from samplelib import SampleGeneratorBase

    rng = np.random.RandomState(0)

    class RandomFaces(SampleGeneratorBase):
        """[warped, target, mask, eyes/mouth mask] of random faces, NHWC (DFL's CPU layout), made once."""

        def __init__(self, path, batch_size=1, output_sample_types=None, **kw):
            super().__init__(batch_size=batch_size)
            shape = (batch_size, output_sample_types[0]["resolution"], output_sample_types[0]["resolution"])
            self.sets = [
                [rng.rand(*shape, 3).astype(np.float32) for _ in range(2)]
                + [(rng.rand(*shape, 1) > 0.3).astype(np.float32) for _ in range(2)]
                for _ in range(2)
            ]
            self.n = 0

        def __next__(self):
            self.n += 1
            return self.sets[self.n % 2]

    saehd = models.import_model("SAEHD")
    sys.modules["models.Model_SAEHD.Model"].SampleGeneratorFace = RandomFaces
    nn.tf_sess = "later"  # DFL's CPU session config without its session (TF sizes its pools by the first one)
    nn.initialize(nn.DeviceConfig.CPU())
    nn.tf_sess_config.intra_op_parallelism_threads = nn.tf_sess_config.inter_op_parallelism_threads = 1
    nn.tf_sess = nn.tf.Session(config=nn.tf_sess_config)  # then the session, as nn.initialize makes it
    with tempfile.TemporaryDirectory(prefix="vs-dfl-") as tmp:
        model = saehd(
            is_training=True, saved_models_path=Path(tmp), training_data_src_path=Path(tmp) / "src",
            training_data_dst_path=Path(tmp) / "dst", force_model_name="bench", cpu_only=True, no_preview=True,
        )  # fmt: skip
        config = nn.tf_sess._config
        print(f"DFL options {model.options}; TF threads intra {config.intra_op_parallelism_threads} "
              f"inter {config.inter_op_parallelism_threads}", file=sys.stderr)  # fmt: skip
        from tensorflow.python.util import _pywrap_util_port

        serve(model.train_one_iter, a.warmup, ready={"onednn": _pywrap_util_port.IsMklEnabled()})


def bigbatch_worker(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from contextlib import closing

    from _swap import swap_feed, swap_task, synthetic_faces

    import bigbatch

    ae, e, d, dm = a.dims
    cfg = bigbatch.preset("saehd128").override({
        "data.resolution": a.res, "train.batch": a.batch, "train.micro_batch": a.batch,
        "train.precision": "fp32", "train.checkpointing": False, "train.device": "cpu",
        "train.grad_clip": 1.0 if a.clipgrad else 0.0, "swap.random_warp": a.random_warp == "y",
        "model.options": {"archi": a.archi, "ae_dims": ae, "e_dims": e, "d_dims": d, "d_mask_dims": dm},
    })  # fmt: skip
    torch.manual_seed(0)
    with synthetic_faces(cfg) as faces:
        task, rep = swap_task(faces)
        print(f"bigbatch {faces.model}\n{faces.swap}\nthreads {torch.get_num_threads()}", file=sys.stderr)
        with closing(swap_feed(task, rep)) as feed:
            serve(lambda: task.step(feed), a.warmup)
        rep.close()


ROWS = {  # (side, random warp): label
    ("dfl", "y"): "DFL (warp in its loader: not timed)",
    ("dfl", "n"): "DFL, random warp off (no inter_AB update)",
    ("dfl-onednn", "y"): "DFL, TF_ENABLE_ONEDNN_OPTS=1",
    ("bigbatch", "y"): "bigbatch, swap.random_warp=true (warp timed)",
    ("bigbatch", "n"): "bigbatch, swap.random_warp=false",
    ("before", "y"): "bigbatch --before checkout, swap.random_warp=true",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dfl", required=True, type=DFL_CHECKOUT, help="DeepFaceLab's source folder")
    p.add_argument("--dfl-python", default=sys.executable, help="a Python with DFL's requirements (TensorFlow)")
    p.add_argument("--res", type=positive_int, default=128)
    p.add_argument("--archi", default="liae-ud")
    p.add_argument("--dims", default="256,64,64,22", help="ae, e, d, d_mask dims")
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=4, help="timed iterations a row")
    p.add_argument(
        "--warmup",
        type=positive_int,
        default=3,
        help="untimed iterations a row first (bigbatch's process reuses its freed memory from about the third "
        "step: its first steps fault pages in, 0.6, 0.2 and 0.04 million at 256 px)",
    )
    p.add_argument("--clipgrad", action="store_true", help="gradient clipping on both sides (the preset: off)")
    p.add_argument("--logs", default="", help="folder for the workers' logs (default: a temporary one)")
    p.add_argument("--no-onednn-row", action="store_true", help="no DFL row with TF_ENABLE_ONEDNN_OPTS=1")
    p.add_argument("--before", default="", help=BEFORE_HELP + " (one row: with random warp)")
    p.add_argument("--worker", choices=["dfl", "bigbatch"], help=argparse.SUPPRESS)
    p.add_argument("--random-warp", choices=["y", "n"], default="y", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.dims = [int(x) for x in a.dims.split(",")]
    if a.worker:  # replies to the original stdout, everything else printed (DFL's logs, TF's) to stderr
        become_worker()
        return (dfl_worker if a.worker == "dfl" else bigbatch_worker)(a)

    start = time.perf_counter()
    rows = [("dfl", "y")] + [("dfl", "n")] * a.archi.startswith("liae") + [("dfl-onednn", "y")] * (not a.no_onednn_row)
    rows += [("bigbatch", "y"), ("bigbatch", "n")]
    rows += [("before", "y")] * bool(a.before)
    logs = Path(a.logs or tempfile.mkdtemp(prefix="vs-dfl-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    common = [f"--{k}={v}" for k, v in (("dfl", a.dfl), ("res", a.res), ("archi", a.archi), ("batch", a.batch))]
    common += [f"--dims={','.join(map(str, a.dims))}", f"--warmup={a.warmup}"] + ["--clipgrad"] * a.clipgrad
    commands = {}
    for side, rw in rows:
        dfl = side.startswith("dfl")
        worker = [f"--worker={'dfl' if dfl else 'bigbatch'}", f"--random-warp={rw}", *common]
        cmd = [a.dfl_python if dfl else sys.executable, __file__, *worker]
        if side == "dfl-onednn":
            cmd = ["env", "TF_ENABLE_ONEDNN_OPTS=1", *cmd]
        elif side == "before":
            cmd = before_command(a.before, "bench/vs_dfl.py", worker)
        commands[side, rw] = (cmd, logs / f"{side}-warp-{rw}.log")
    with Rows(commands, env) as workers:
        ready = {key: workers.ask(key) for key in rows}
        print(f"built and warmed up in {time.perf_counter() - start:.0f} s; logs in {logs}", file=sys.stderr)
        workers.rounds(a.steps)
        workers.close()
    stats, times = workers.stats, workers.times

    from _env import measured_on

    print(measured_on("cpu", threads=1))
    print(f"# SAEHD {a.archi} {a.res}px, ae/e/d/d_mask dims {','.join(map(str, a.dims))}, batch {a.batch}, fp32, "
          f"AdaBelief, masked training, clipgrad {'on' if a.clipgrad else 'off'}; one thread a side; "
          f"{a.steps} timed iterations a row after {a.warmup} warm-up, rows alternating; DFL as shipped ran "
          f"TensorFlow's {'oneDNN' if ready['dfl', 'y'].get('onednn') else 'Eigen'} kernels on this CPU\n")  # fmt: skip
    print("| side | res/archi | CPU s/iteration min | median | DFL/bigbatch (min, median) "
          "| DFL with oneDNN/bigbatch | CPU/wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for side, rw in rows:
        lo, med, load = stats((side, rw))
        ratios = ["-", "-"]
        if side in ("bigbatch", "before"):
            # df: DFL's graph is the same with or without random warp; liae: not (no inter_AB update)
            same_graph = rw == "y" or not a.archi.startswith("liae")
            refs = [("dfl", rw) if ("dfl", rw) in times else ("dfl", "y")]
            refs += [("dfl-onednn", "y")] if ("dfl-onednn", "y") in times and same_graph else []
            ratios[: len(refs)] = [f"{stats(r)[0] / lo:.2f}, {stats(r)[1] / med:.2f}" for r in refs]
        print(f"| {ROWS[side, rw]} | {a.res}/{a.archi} | {lo:.2f} | {med:.2f} | {' | '.join(ratios)} | {load:.2f} |")
    print(f"\nwall time {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
