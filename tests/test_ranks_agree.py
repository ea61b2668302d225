"""What every rank of a run must agree on as it starts (bigbatch.ranks_agree), here their code; and where they meet."""

import pytest

import bigbatch
from bigbatch import ranks_agree


def test_a_rank_running_other_code_is_refused_as_it_starts(monkeypatch, tmp_path):
    # Found from outside: a node's stale install (another loss) trained beside rank 0's without a word; its summed
    # gradients kept the replicas alike, so no later check could see it.
    other = "bigbatch 0.0.1+000000000000, torch 2.13.0"
    monkeypatch.setattr(ranks_agree.dist, "active", lambda: True)
    monkeypatch.setattr(ranks_agree.dist, "gather", lambda mine: [mine, (*mine[:2], other)])
    said = rf"^rank 1 runs {other.replace('+', '.')}, rank 0 bigbatch .+, torch .+: install the same bigbatch and torch"
    with pytest.raises(bigbatch.BigbatchError, match=said):
        ranks_agree.same_on_every_rank(bigbatch.Config(), "0" * 64, tmp_path / "lock")
    monkeypatch.setattr(ranks_agree.dist, "gather", lambda mine: [mine, mine])  # (alike: on to the run folder)
    monkeypatch.setattr(ranks_agree, "_sees_run_folder", lambda lock: None)
    ranks_agree.same_on_every_rank(bigbatch.Config(), "0" * 64, tmp_path / "lock")


@pytest.mark.parametrize(
    "addr, port, said",
    [
        ("127.0.0.1", "notaport", "MASTER_PORT='notaport' is not a port: give a number from 1 to 65535"),
        ("no.such.host.invalid", "29500", "MASTER_ADDR='no.such.host.invalid' does not resolve ("),
    ],
)
def test_a_master_that_can_never_be_met_is_one_line_at_once(monkeypatch, tmp_path, capsys, addr, port, said):
    # Found from outside: a port of letters was torch's traceback; a name that resolves nowhere was waited on for
    # torch's 30 minutes, the log filling with its C++ stack frames.
    from bigbatch.cli import main

    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": addr, "MASTER_PORT": port}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "--run-dir", str(tmp_path / "run"), "train.device=cpu", "train.kimg=0.032"]) == 2
    assert said in capsys.readouterr().err


def _rank_of_its_own_start(rank, world, init_file, out, cfg, starts):
    import os

    import torch

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="1")  # (the group is made here; Replicator finds it)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        bigbatch.train(cfg.override({"train.init_from": starts[rank]}), run_dir=out / "run", quiet=True)
    except bigbatch.BigbatchError as e:
        (out / f"rank{rank}.txt").write_text(str(e))


def test_ranks_given_other_weights_to_start_from_stop_before_training(tiny, tmp_path):
    # Found from outside: a rank given another train.init_from (a path of each node's own) trained beside rank 0,
    # to be refused at the first checkpoint as "a nondeterministic kernel or a failing device", all of it lost.
    import torch

    short = tiny.override({"train.kimg": 0.032, "checkpoint.every_kimg": 0.032})
    starts = [
        str(bigbatch.train(short.override({"train.seed": s}), run_dir=tmp_path / f"s{s}", quiet=True)) for s in (1, 2)
    ]
    torch.multiprocessing.start_processes(
        _rank_of_its_own_start, (2, str(tmp_path / "init"), tmp_path, short, starts), 2, join=True, start_method="fork"
    )
    for r in (0, 1):  # (each rank names its own start)
        assert (tmp_path / f"rank{r}.txt").read_text() == (
            f"rank 1 starts from other weights than rank 0 (this rank's: of train.init_from {starts[r]}): give every "
            "rank the same files (a path of each node's own must hold the same weights)"
        )
    assert not (tmp_path / "run" / "checkpoints").exists()
