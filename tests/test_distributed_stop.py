"""A stop asked for on one rank of several just before an evaluation is due: every rank leaves the evaluation to the
resumed run (found from outside: the ranks made the whole evaluation first, minutes at eval.n 50,000, past a
scheduler's grace period; the stop vote answers an iteration late)."""

import json
import os
import subprocess
import sys

from test_distributed import ARGS, EVAL

# torchrun's program: bigbatch train, its rank 1 signalled (SIGTERM, as a scheduler's) after the step that ends at
# 96 images; the evaluation is due at the end of the next one, at 128.
SIGNALLED = """
import os, signal, sys
from bigbatch.cli import main
from bigbatch.tasks.gan.task import GANTask

step = GANTask.step

def step_then_signal(self, feed):
    out = step(self, feed)
    if os.environ["RANK"] == "1" and feed.nimg == 96:
        os.kill(os.getpid(), signal.SIGTERM)
    return out

GANTask.step = step_then_signal
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_on_one_rank_before_an_evaluation_leaves_it_to_the_resumed_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env |= {"OMP_NUM_THREADS": "1", "BIGBATCH_CACHE": str(tmp_path / "cache")}
    (tmp_path / "signalled.py").write_text(SIGNALLED)
    settings = [*ARGS, *EVAL, "train.batch=32", "train.micro_batch=8", "eval.every_kimg=0.128", "train.kimg=0.128"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(tmp_path / "signalled.py"), "train", *settings, "--run-dir", str(tmp_path / "r")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"Stopped by signal; saved {tmp_path / 'r' / 'checkpoints' / '000000.128'}" in out.stdout, out.stdout

    def scored(run):
        return [
            row["kimg"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "fcd" in row
        ]

    assert scored(tmp_path / "r") == []  # not evaluated: left to the resumed run, which makes it
    resume = [sys.executable, "-m", "bigbatch", "train", "--run-dir", str(tmp_path / "r"), "--resume", "--quiet"]
    out = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert scored(tmp_path / "r") == [0.128]
