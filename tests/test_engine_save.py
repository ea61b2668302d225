"""The engine on its own saves and resumes (`Replicator.save` / `Replicator.load`): a script stopped and
started again takes the steps it would have taken, bit for bit."""

import numpy as np
import pytest
import torch
from torch import nn

import bigbatch

TINY_RUN = {"train.kimg": 0.016, "train.batch": 16, "model.ch": 4, "data.resolution": 16, "train.device": "cpu"}
X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(1))


def setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    rep = bigbatch.Replicator(batch=16, micro_batch="auto", device="cpu", memory_budget="1GiB")
    net = rep.prepare(model)
    return rep, model, net, rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))


def steps(rep, net, opt, first, last):
    for step in range(first, last):
        rows = slice(step * 16 % 64, step * 16 % 64 + 16)
        rep.step(lambda m: nn.functional.cross_entropy(net(m[0]), m[1]), (X[rows], Y[rows]), opt)


def test_a_script_saved_and_loaded_takes_the_steps_it_would_have_taken(tmp_path, capsys):
    rep, model, net, opt = setup()
    steps(rep, net, opt, 0, 6)
    whole = {k: v.clone() for k, v in model.state_dict().items()}

    rep, model, net, opt = setup()
    steps(rep, net, opt, 0, 3)
    (tmp_path / ".tmp-build-999999").mkdir()  # (another program's: found by review, swept as a save's leftover)
    assert rep.save(tmp_path / "ckpt", model=net, opt=opt, step=3, note={"lr": [1e-2]}) == tmp_path / "ckpt"
    rep.save(tmp_path / "ckpt", model=net, opt=opt, step=3, note={"lr": [np.float64(1e-2)]})  # (replaced whole)
    assert (tmp_path / ".tmp-build-999999").is_dir()
    from bigbatch.cli import main  # (found from outside: info called it "not written by this bigbatch version")

    assert main(["info", str(tmp_path / "ckpt")]) == 2
    assert (
        "is a Replicator.save checkpoint of a loop of your own, not a run's: rep.load reads it"
        in capsys.readouterr().err
    )

    (tmp_path / "ckpt").rename(tmp_path / ".ckpt-old")  # as a crash between the renames of a third save leaves it
    rep, model, net, opt = setup(seed=5)  # other weights, other RNG: all restored
    torch.manual_seed(99)
    values = rep.load(tmp_path / "ckpt", model=model, opt=opt)
    assert values == {"step": 3, "note": {"lr": [1e-2]}} and rep.plan.micro_batch == 16
    steps(rep, net, opt, values["step"], 6)
    assert all(torch.equal(v, whole[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("cut_short", [False, True])
def test_a_step_cut_short_and_python_s_and_numpy_s_draws_resume_to_the_bit(tmp_path, cut_short):
    # Found from outside: a Ctrl-C inside rep.step left Dropout's RNG moved on by the step abandoned (torch's RNGs are
    # put back), and a step function's np.random and random draws were not kept in checkpoints (Accelerate's
    # save_state keeps all of them). A step cut short puts torch's back alone (NumPy's and Python's state took 45 us
    # a step to keep: found by review), so the step function cut short here draws from torch's alone.
    import random

    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
        rep = bigbatch.Replicator(batch=16, micro_batch=4, device="cpu")
        net = rep.prepare(model)
        return rep, model, net, rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    def step_fn(m, cut=None):
        if cut is not None and cut.pop() == 1:  # (the step's second micro-batch)
            raise KeyboardInterrupt
        noise = 0 if cut else torch.from_numpy(np.random.randn(*m[0].shape).astype(np.float32)) * random.random()
        return nn.functional.cross_entropy(net(m[0] + noise), m[1])

    def steps(first, last, cut=None):
        for step in range(first, last):
            rows = slice(step * 16 % 64, step * 16 % 64 + 16)
            rep.step(lambda m: step_fn(m, cut), (X[rows], Y[rows]), opt)

    np.random.seed(1)
    random.seed(2)
    rep, model, net, opt = setup()
    steps(0, 5)
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    np.random.seed(1)
    random.seed(2)
    rep, model, net, opt = setup()
    steps(0, 3)
    if cut_short:
        with pytest.raises(KeyboardInterrupt):
            steps(3, 4, cut=[3, 2, 1, 0])
    rep.save(tmp_path / "ckpt", model=net, opt=opt, step=3)
    np.random.seed(7)
    random.seed(7)
    rep, model, net, opt = setup()
    rep.load(tmp_path / "ckpt", model=model, opt=opt)
    steps(3, 5)
    assert all(torch.equal(v, whole[k]) for k, v in model.state_dict().items())


def test_what_cannot_be_saved_or_loaded_is_one_line(tmp_path):
    rep, model, net, opt = setup()
    steps(rep, net, opt, 0, 1)
    (tmp_path / "mine").mkdir()
    with pytest.raises(bigbatch.BigbatchError, match="exists and is not a checkpoint; give a new path"):
        rep.save(tmp_path / "mine", model=model)
    with pytest.raises(bigbatch.BigbatchError, match="'data' holds a Generator object; give models, optimizers, "):
        rep.save(tmp_path / "c", model=model, data=torch.Generator())

    class Holder:  # (an object of state_dict() whose state load could not read back)
        def state_dict(self):
            return {"generator": torch.Generator()}

        def load_state_dict(self, state):
            pass

    with pytest.raises(bigbatch.BigbatchError, match="the state_dict\\(\\) of 'held' is not plain data; give models"):
        rep.save(tmp_path / "c", model=model, held=Holder())
    rep.save(tmp_path / "c", model=model, opt=opt)
    with pytest.raises(bigbatch.BigbatchError, match=r"holds no model 'ema'; it holds models \['model'\], optimizers"):
        rep.load(tmp_path / "c", model=model, ema=model)
    with pytest.raises(bigbatch.BigbatchError, match=r"objects of load_state_dict\(\), not 'step' \(int\)"):
        rep.load(tmp_path / "c", model=model, step=3)
    with pytest.raises(bigbatch.BigbatchError, match="not a complete checkpoint written by Replicator.save"):
        rep.load(tmp_path / "mine", model=model)
    with pytest.raises(bigbatch.BigbatchError, match="holds no model 'opt'"):
        rep.load(tmp_path / "c", opt=model)  # (a name of the other kind: found by review, a KeyError)
    with pytest.raises(bigbatch.BigbatchError, match="model.safetensors does not fit the model given as 'model': "):
        rep.load(tmp_path / "c", model=torch.nn.Linear(2, 2))  # (it said "built from its config": there is none)
    run = bigbatch.train(bigbatch.preset("digits").override(TINY_RUN), run_dir=tmp_path / "run", quiet=True)
    with pytest.raises(bigbatch.BigbatchError, match="is a checkpoint of a bigbatch run, not one Replicator.save"):
        rep.load(run / "checkpoints" / "000000.016", model=model)
    state = tmp_path / "c" / "state.pt"
    state.write_bytes(state.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(bigbatch.BigbatchError, match="state.pt"):
        rep.load(tmp_path / "c", model=model, opt=opt)


def test_a_resumed_engine_plans_auto_as_a_fresh_one_would():
    # Found from outside: on a CPU a resumed run's probes left out the optimizer state it had loaded (made
    # before probing, so not seen made), and settled on a micro-batch over the budget.
    def peaks(resumed):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 512), nn.ReLU(), nn.Linear(512, 3))
        rep = bigbatch.Replicator(batch=16, micro_batch="auto", device="cpu", memory_budget="1GiB")
        net = rep.prepare(model)
        opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
        if resumed:  # (its moments, as a loaded checkpoint has them)
            nn.functional.cross_entropy(net(X[:16]), Y[:16]).backward()
            opt.step()

        def step_fn(micro):
            return nn.functional.cross_entropy(net(micro[0]), micro[1])

        rep.plan_micro_batch(lambda m: rep.probe_step(step_fn, (X[:m], Y[:m])))
        return [p.peak_bytes for p in rep.probes]

    fresh, resumed = peaks(False), peaks(True)
    assert resumed == pytest.approx(fresh, rel=1e-3)  # (Adam's step counts: a few bytes the estimate leaves out)


def test_a_plan_of_auto_made_for_another_precision_is_probed_again(capsys):
    # Found by review: a resume may change train.precision, and kept the micro-batch probed for the old one
    # (bf16 to fp32 doubles the activations).
    rep, model, net, opt = setup()
    steps(rep, net, opt, 0, 1)
    state = rep.state_dict()
    for precision, checkpointing, kept in (("fp32", False, True), ("bf16", False, False), ("fp32", True, False)):
        again = bigbatch.Replicator(
            batch=16,
            micro_batch="auto",
            precision=precision,
            device="cpu",
            memory_budget="1GiB",
            checkpointing=checkpointing,
        )
        again.prepare(setup()[1])
        again.load_state_dict(state)
        assert again.micro_batch_pending is not kept
    again = bigbatch.Replicator(batch=16, micro_batch="auto", device="cpu", memory_budget="2GiB")
    again.prepare(setup()[1])
    again.load_state_dict(state)
    err = capsys.readouterr().err
    assert "the checkpoint's plan was made for fp32, this run is bf16" in err and "\nbigbatch: warning: checkp" in err
    assert "checkpointing is true since" in err and "memory_budget is 2.00 GiB, the checkpoint's plan" in err
    assert "train." not in err  # (the Replicator's arguments' names, not the config's: found from outside)
    # and one made at another world size (an elastic resume): said too, where it was silent (found from outside)
    again = bigbatch.Replicator(batch=16, micro_batch="auto", device="cpu", memory_budget="1GiB")
    again.prepare(setup()[1])
    again.load_state_dict({**state, "plan": {**state["plan"], "world_size": 2}})
    assert again.micro_batch_pending
    assert 'plan was made for 2 processes, this run has 1 process: micro_batch "auto" is probed again' in (
        capsys.readouterr().err
    )


def test_a_read_only_run_directory_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    # Found from outside: a run on a read-only file system said only "RUN/.lock: Read-only file system".
    import builtins
    import errno

    from bigbatch.files import lock_folder

    real_open = builtins.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", read_only)
    with pytest.raises(bigbatch.BigbatchError, match=r"cannot write in .* \(Read-only file system\): give a folder"):
        lock_folder(tmp_path, ".lock", lambda *a: "busy")


def test_a_run_whose_checkpoints_cannot_be_written_is_refused_at_its_start(tiny, tmp_path, monkeypatch):
    # Found from outside: a read-only checkpoints/ (a bind mount) was found at the first save, what the resumed run
    # had trained lost; and a killed run's half-written sample PNGs were kept in samples/ for ever.
    import errno
    import os

    run = bigbatch.train(tiny.override({"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    (run / "samples" / ".grid-000000.128.png.tmp-999999999").write_bytes(b"half a png")
    real_open = os.open

    def read_only(path, flags, *args):  # (checkpoints/ as a read-only mount is to files made in it)
        if flags & os.O_CREAT and f"{os.sep}checkpoints{os.sep}" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(bigbatch.BigbatchError, match=r"cannot write in .*checkpoints \(Read-only file system\)"):
        bigbatch.train(tiny.override({"train.kimg": 0.512}), run_dir=run, resume=True, quiet=True)
    assert not list((run / "samples").glob(".*.tmp-*"))  # (no such process: removed)
    assert [c.name for c in bigbatch.checkpoints.complete_checkpoints(run)] == ["000000.256"]


def test_each_optimizers_engine_state_comes_back_by_the_name_it_was_saved_under(tmp_path, capsys):
    # Found from outside: the loss scalers and skip histories were saved by wrap order, so a script that wrapped
    # its two optimizers in the other order swapped them; one loaded before it was wrapped dropped its own.
    def pair():
        torch.manual_seed(0)
        a, b = nn.Linear(4, 2), nn.Linear(4, 2)
        rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16")
        return (
            rep,
            rep.prepare(a),
            rep.prepare(b),
            torch.optim.SGD(a.parameters(), 0.1),
            torch.optim.SGD(b.parameters(), 0.1),
        )

    rep, a, b, oa, ob = pair()
    rep.wrap_optimizer(oa), rep.wrap_optimizer(ob)
    x = torch.randn(8, 4)
    for _ in range(3):  # A's scale settles (its loss overflows fp16), B's stays
        rep.step(lambda m: a(m).float().sum() * 1e6, x, oa)
        rep.step(lambda m: b(m).float().sum() * 1e-6, x, ob)
    scales = {n: s.scaler.get_scale() for n, s in zip("AB", rep.optimizers.values())}
    assert scales["A"] != scales["B"]
    rep.save(tmp_path / "ckpt", A=a, B=b, optA=oa, optB=ob)

    rep, a, b, oa, ob = pair()
    rep.wrap_optimizer(ob), rep.wrap_optimizer(oa)  # (the other order)
    rep.load(tmp_path / "ckpt", A=a, B=b, optA=oa, optB=ob)
    assert "not restored" not in capsys.readouterr().err
    assert (
        rep.optimizers[id(oa)].scaler.get_scale() == scales["A"]
        and rep.optimizers[id(ob)].scaler.get_scale() == scales["B"]
    )
    rep, a, b, oa, ob = pair()
    rep.wrap_optimizer(oa)
    rep.load(tmp_path / "ckpt", A=a, optA=oa)  # (a part: what is left out is said)
    assert "ckpt also holds 'B', 'optB', not restored (not given to load)" in capsys.readouterr().err
    with pytest.raises(
        bigbatch.BigbatchError, match="the optimizer given as 'optB' is not wrapped: rep.wrap_optimizer"
    ):
        rep.load(tmp_path / "ckpt", A=a, B=b, optA=oa, optB=ob)
    # Another kind of optimizer, or other parameter groups: one line, before anything is restored.
    rep, a, b, oa, ob = pair()
    adam = rep.wrap_optimizer(torch.optim.Adam(a.parameters()))
    rep.wrap_optimizer(ob)
    before = a.weight.detach().clone()
    with pytest.raises(bigbatch.BigbatchError, match="'optA' was saved as a SGD, and is given as a Adam"):
        rep.load(tmp_path / "ckpt", A=a, B=b, optA=adam, optB=ob)
    assert torch.equal(a.weight, before)
    rep, a, b, oa, ob = pair()
    one = rep.wrap_optimizer(torch.optim.SGD([a.weight], 0.1))
    rep.wrap_optimizer(ob)
    with pytest.raises(bigbatch.BigbatchError, match=r"'optA' was saved over parameter groups of \[2\] tensors"):
        rep.load(tmp_path / "ckpt", A=a, B=b, optA=one, optB=ob)


def test_a_scheduler_is_saved_by_its_state_dict_and_restored_by_load(tmp_path):
    # Found from outside: refused (give sched.state_dict()), where Accelerate and Lightning keep a scheduler.
    def trained(first, last, rep, net, opt, sched):
        for step in range(first, last):
            steps(rep, net, opt, step, step + 1)
            sched.step()

    rep, model, net, opt = setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    trained(0, 6, rep, net, opt, sched)
    whole, lr = {k: v.clone() for k, v in model.state_dict().items()}, sched.get_last_lr()

    rep, model, net, opt = setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    trained(0, 3, rep, net, opt, sched)
    rep.save(tmp_path / "ckpt", model=net, opt=opt, sched=sched, step=3)
    rep, model, net, opt = setup(seed=5)
    with pytest.raises(bigbatch.BigbatchError, match="'sched' was saved as a StepLR, and is given as a ExponentialLR"):
        rep.load(tmp_path / "ckpt", model=model, opt=opt, sched=torch.optim.lr_scheduler.ExponentialLR(opt, 0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    assert rep.load(tmp_path / "ckpt", model=model, opt=opt, sched=sched) == {"step": 3}
    assert sched.last_epoch == 3
    trained(3, 6, rep, net, opt, sched)
    assert sched.get_last_lr() == lr and all(torch.equal(v, whole[k]) for k, v in model.state_dict().items())
    # Its state saved as a plain value (as this engine asked before it kept schedulers): said how to take it.
    rep.save(tmp_path / "old", model=net, opt=opt, sched=sched.state_dict())
    with pytest.raises(bigbatch.BigbatchError, match=r"'sched' as a plain value: .*load_state_dict\(values"):
        rep.load(tmp_path / "old", model=model, opt=opt, sched=sched)
