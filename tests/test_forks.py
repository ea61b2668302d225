"""Worker processes forked from a training process: what it left for the garbage collector is not freed in them.
A CUDA tensor freed in a fork aborts it (found on a GPU: a DataLoader worker killed by SIGABRT as a second loader
started). On a CPU a finalizer that writes down its process stands in for the CUDA tensor's."""

import gc
import os
import weakref
from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image

import bigbatch
from bigbatch.batching import replicator_for
from bigbatch.data import BatchLoader, prepare, prepare_pool
from bigbatch.data.load import training_data
from bigbatch.data.schedule import schedule_of
from bigbatch.tasks import Feed


class Left:
    """Left for the collector (it refers to itself); its finalizer writes down the process it runs in."""

    def __init__(self, log):
        self.log, self.me = log, self

    def __del__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


class Collecting:
    """Data whose every read runs the reading process's collector first."""

    resolution = 4

    def get(self, index):
        gc.collect()
        return torch.zeros(len(index), 4, 4, 3, dtype=torch.uint8), torch.zeros(len(index), dtype=torch.long)


@contextmanager
def collector_off():
    """The garbage collector held off: what goes meanwhile goes by reference count alone (or by a collection the
    code itself runs)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def digits_feed(**options):
    """A Feed of the digits at 16 px on the CPU (`options`: Feed's), and its data."""
    cfg = bigbatch.preset("digits").override(
        {"data.resolution": 16, "train.batch": 8, "train.micro_batch": 8, "train.device": "cpu"}
    )
    data = training_data(cfg)
    return Feed(data, schedule_of(cfg), replicator_for(cfg), cfg, **options), data


def finalized_in(log, make_workers):
    """The processes that finalized an object this one left for the collector just before `make_workers()` forked
    its workers (the collector held off until then, as in a process that had not yet run it)."""
    with collector_off():
        Left(log)
        make_workers()
    gc.collect()
    return log.read_text().split()


def test_a_loaders_workers_leave_alone_what_the_training_process_left_for_the_collector(tmp_path):
    def read():
        loader = BatchLoader(Collecting(), [torch.arange(4), torch.arange(4)], workers=2)
        assert [len(b.images) for b in loader] == [4, 4]  # (each worker read a batch, its collector run first)

    assert finalized_in(tmp_path / "log", read) == [str(os.getpid())]


def test_prepares_workers_leave_alone_what_the_calling_process_left_for_the_collector(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    (tmp_path / "photos" / "a").mkdir(parents=True)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "photos" / "a" / f"{i}.png")
    start = prepare_pool._init_worker

    def collecting(*args):  # (the workers are forks: they run this as patched here)
        gc.collect()
        start(*args)

    monkeypatch.setattr(prepare_pool, "_init_worker", collecting)
    out = tmp_path / "d.h5"
    made = finalized_in(tmp_path / "log", lambda: prepare(str(tmp_path / "photos"), str(out), 8, workers=2))
    assert made == [str(os.getpid())]
    assert out.exists()


def test_a_feed_and_what_it_read_ahead_go_with_its_last_reference_not_with_the_collector():
    # (its batches ahead on the device were garbage in a cycle: a fork's collector freed them, and the GPU's memory
    # held them until the training process's ran)
    feed, data = digits_feed()
    read = feed.companion(data)
    assert len(feed.next().images) == len(read().images) == 8
    feed.close()
    gone = weakref.ref(feed)
    with collector_off():
        del feed, read
        assert gone() is None


def test_a_feed_closed_lets_go_of_its_callers_callback():
    # Found by review: a swap task holds its companion's reader (which holds the Feed) and the Feed held the task
    # through on_phase: the task, its models and batches lived on after train() returned, until the collector ran.
    class Task:
        pass

    task = Task()
    feed, data = digits_feed(on_phase=lambda nimg, phase, held=task: held)
    task.read = feed.companion(data)
    feed.next(), task.read()
    feed.close()
    gone = weakref.ref(task)
    with collector_off():
        del feed, task
        assert gone() is None


def test_what_a_run_left_in_cycles_goes_as_train_returns(tiny, tmp_path, monkeypatch):
    # (a sweep's next trial found the GPU's memory taken; a fork after it freed the run's CUDA tensors)
    from bigbatch import loop

    built = []
    build = loop.build_task

    def remembered(*args, **kwargs):
        task = build(*args, **kwargs)
        built.append(weakref.ref(task))
        return task

    monkeypatch.setattr(loop, "build_task", remembered)
    with collector_off():  # (only train's own collection runs)
        Left(tmp_path / "log").task = built  # (a cycle of its own, made before: collected with the run's)
        bigbatch.train(tiny.override({"train.kimg": 0.064}), run_dir=tmp_path / "run", quiet=True)
        assert built and built[0]() is None
        assert (tmp_path / "log").read_text().split() == [str(os.getpid())]


def test_forking_leaves_a_callers_freeze_and_thaws_at_the_last_ones_end():
    from bigbatch.signals import forking

    gc.collect()
    try:
        with forking():
            with forking():
                pass
            assert gc.get_freeze_count() > 0  # (the inner one's end thawed nothing: the outer forks still)
        assert gc.get_freeze_count() == 0
        gc.freeze()  # the caller's own, for copy-on-write in its forks: left as it is
        frozen = gc.get_freeze_count()
        with forking():
            cycle = Left("/dev/null")  # (made after the caller's freeze: not frozen for good by this one)
        assert 0 < gc.get_freeze_count() <= frozen  # (not thawed, nothing more frozen; a frozen object another
        # thread let go of meanwhile is one fewer: seen in the suite)
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
