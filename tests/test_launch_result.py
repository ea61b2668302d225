"""A launched run (bigbatch launch, and its handles): its numbers checked before a cluster starts; its result,
stopped only where its last launch stopped."""

from bigbatch.errors import STOPPED_BY_SIGNAL
from bigbatch.launch import RankResult
from bigbatch.launch.handle import RunHandle


def test_a_run_restarted_after_a_rank_stopped_and_then_trained_to_its_end_is_not_stopped():
    # Found from outside: a lost Dask worker's rank saved and stopped, the handle restarted every rank, the run
    # trained to train.kimg, and its result said stopped=True (a "resume while stopped" loop trains it again).
    launches = iter(
        [
            ([f"{STOPPED_BY_SIGNAL}; saved runs/x/checkpoints/000002.368\n"], [(0, -15, True), (1, -9, False)]),
            (["Done: runs/x (6.400 kimg)\n"], [(0, 0, False), (1, 0, False)]),
        ]
    )

    def session(sink, stop):
        lines, ranks = next(launches)
        sink([("out", line) for line in lines])
        return [RankResult(rank, f"tcp://h:{rank}", rc, "", 0.0, stopped) for rank, rc, stopped in ranks]

    done = RunHandle("runs/x", session, restarts=1).result(timeout=30)
    assert done.status == 0 and not done.stopped
    # A launch that stopped as its last is stopped.
    launches = iter([([f"{STOPPED_BY_SIGNAL}; saved runs/x/checkpoints/000002.368\n"], [(0, 0, True), (1, 0, True)])])
    assert RunHandle("runs/x", session).result(timeout=30).stopped


def test_launchs_numbers_are_checked_before_a_cluster_starts(capsys):
    # Found from outside: --nprocs 0 was said once a Dask cluster had started, 13 s on, as "the cluster has 2 workers".
    import time

    from bigbatch.cli import main

    for argv, said in [
        (["dask", "--local", "2", "--nprocs", "0"], "--nprocs must be a number of ranks, 1 or more, got 0"),
        (["dask", "--local", "2", "--nprocs", "3"], "--nprocs 3 is more than the 2 processes --local starts"),
        (["ray", "--local", "2", "--nprocs", "-1"], "--nprocs must be a number of ranks, 1 or more, got -1"),
    ]:
        start = time.perf_counter()
        assert main(["launch", *argv, "--", "train", "--preset", "digits"]) == 2
        assert said in capsys.readouterr().err and time.perf_counter() - start < 5, said
