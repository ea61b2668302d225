"""The Python API used wrongly: one clear line naming the Replicator's own arguments (not the config's keys), and a
user's own errors kept as they are."""

import copy
import warnings

import pytest
import torch
from torch import nn

import bigbatch


def _stepped(step_fn, half=False):
    rep, model = bigbatch.Replicator(4, 4, device="cpu", precision="fp16"), nn.Linear(2, 1)
    net = rep.prepare(model.half() if half else model)
    rep.step(step_fn, torch.ones(4, 2), rep.wrap_optimizer(torch.optim.SGD(net.parameters(), 0.1)))


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: bigbatch.Replicator(64, compile="fast"), "compile must be True, False or one of default"),
        (lambda: bigbatch.Replicator(64, sync_bn="no"), "sync_bn must be True or False, got 'no'"),
        (lambda: bigbatch.Replicator(64, checkpointing="yes"), "checkpointing must be True, False or a list"),
        # (found from outside: a model's own setting was read a letter at a time, "no block named 'h'")
        (lambda: bigbatch.Replicator(64).prepare(nn.Linear(2, 2), "head"), "checkpointing must be True, False or"),
        (  # (its blocks named: found from outside)
            lambda: bigbatch.Replicator(64).prepare(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ["9"]),
            "Sequential has no block named '9' to checkpoint; it has 0, 1",
        ),
        (lambda: bigbatch.Replicator(64).load("/nonexistent/ckpt"), "Replicator.load: /nonexistent/ckpt does not"),
        # The Replicator's own arguments named, not the config's keys (train.micro_batch) nor a resume.
        (lambda: bigbatch.Replicator(64, 24), "give micro_batch=16, or a batch divisible by 24"),
        (lambda: bigbatch.Replicator(64, 16).prepare(lambda x: x), "prepare takes a torch.nn.Module, got function"),
        (lambda: bigbatch.Replicator(64, 16).wrap_optimizer(nn.Linear(2, 2)), "takes a torch.optim.Optimizer"),
        (lambda: bigbatch.preset("digits").override([("train.batch", 1)]), "override takes a dict of dotted keys"),
        (lambda: bigbatch.train(bigbatch.preset("digits"), run_dir="r", resume="yes"), "resume must be True, False"),
        # (found from outside: torch's and Python's own errors at the first step)
        (lambda: _stepped(lambda: 0), "the step function '<lambda>' must take one argument, the micro-batch"),
        (lambda: _stepped(5), "rep.step's first argument is the step function, got int"),
        (lambda: next(bigbatch.Replicator(4, 4).batches([torch.ones(4, 2)])), "takes an input function (ctx -> its"),
        (lambda: _stepped(lambda m: m.sum(), half=True), "weights are float16: keep them float32 (no model.half())"),
        # (found from outside: "'NoneType' is not iterable" for a forgotten yield, torch's "missing closure")
        (lambda: next(bigbatch.Replicator(4, 4).batches(lambda ctx: None)), "the input function returned None: yield"),
        (
            lambda: bigbatch.Replicator(4, 4).wrap_optimizer(torch.optim.LBFGS(nn.Linear(2, 1).parameters())),
            "LBFGS steps through a closure that evaluates the loss again; rep.step takes optimizers that step once",
        ),
    ],
)
def test_misuse_of_the_python_api_is_one_clear_error(make, words):
    with pytest.raises(bigbatch.BigbatchError) as e:
        make()
    assert words in str(e.value) and "train.micro_batch" not in str(e.value) and "resumed" not in str(e.value)


def test_a_custom_loop_stopped_by_skipped_steps_is_told_in_its_own_terms():
    model = nn.Linear(2, 1)
    with bigbatch.Replicator(8, 8, skip_window=5) as rep:
        net = rep.prepare(model)
        opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        x = torch.randn(8, 2)
        with pytest.raises(bigbatch.BigbatchError) as e:
            for _ in range(6):
                rep.step(lambda m: net(m).mean() * float("nan"), x, opt)
    said = str(e.value)
    assert "give the Replicator grad_clip" in said and "Replicator.save" in said and "train." not in said


def test_an_error_of_a_kind_of_its_own_from_a_step_function_keeps_its_kind():
    class MyDataError(bigbatch.BigbatchError):
        pass

    def step_fn(micro):
        raise MyDataError("the user's own")

    with bigbatch.Replicator(8, "auto") as rep:
        net = rep.prepare(nn.Linear(2, 1))
        opt = rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        with pytest.raises(MyDataError, match="the user's own"):
            rep.step(step_fn, torch.randn(8, 2), opt)


def test_a_frozen_param_group_takes_no_step_no_moments_and_no_part_in_the_norm_or_its_clip():
    # Found from outside: a fine-tuning's frozen body (rate 0) counted in train.grad_clip, cutting the head's step
    # 2.3 times more than clipping what trains would, and built AdamW moments it then started from.
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with bigbatch.Replicator(8, 8, grad_clip=0.5) as rep:
        net = rep.prepare(nn.Sequential(body, head))
        groups = [{"params": body.parameters(), "frozen": True, "lr": 0.0}, {"params": head.parameters()}]
        opt = rep.wrap_optimizer(torch.optim.AdamW(groups, lr=0.1))
        before = [p.detach().clone() for p in body.parameters()]
        ref = copy.deepcopy(nn.Sequential(body, head))
        (ref(x) - y).square().mean().backward()  # (what trains: the head alone)
        head_norm = torch.nn.utils.get_total_norm([p.grad for p in ref[1].parameters()])
        rep.step(lambda m: (net(m[0]) - m[1]).square().mean(), (x, y), opt)
        assert rep.grad_norm(opt) == pytest.approx(float(head_norm), rel=1e-6)
    assert all(torch.equal(p, b) for p, b in zip(body.parameters(), before))
    assert not any(p in opt.state for p in body.parameters()) and all(p in opt.state for p in head.parameters())


def test_a_frozen_group_computes_no_gradient_in_one_process_and_trains_the_rest_to_the_same_bits(monkeypatch):
    # fastai freezes by requires_grad, so that backward skips the frozen body's weight gradients (about a third
    # of a fine-tuning's frozen-phase work); computed and dropped, they cost that time for nothing.
    def run(hold: bool) -> tuple[list[torch.Tensor], int, list[bool]]:
        torch.manual_seed(0)
        low, body, head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)  # (low: a norm that trains, as train_bn)
        mine = nn.Parameter(torch.ones(4), requires_grad=False)  # the user's own frozen parameter
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        computed = []
        body.weight.register_hook(lambda g: computed.append(1))
        if not hold:  # as under DDP: computed, then dropped
            monkeypatch.setattr("bigbatch.engine.frozen.hold", lambda *args, **kwargs: None)
        with bigbatch.Replicator(16, 8) as rep:
            net = rep.prepare(nn.Sequential(low, body, head))
            groups = [{"params": [*body.parameters(), mine], "frozen": True}, {"params": low.parameters()}]
            opt = rep.wrap_optimizer(torch.optim.AdamW([*groups, {"params": head.parameters()}], lr=0.1))
            step = lambda m: (net(m[0] * mine) - m[1]).square().mean()  # noqa: E731
            for _ in range(3):
                rep.step(step, (x, y), opt)
            frozen_calls = len(computed)
            opt.param_groups[0]["frozen"] = False  # thawed: the body trains from the next step
            rep.step(step, (x, y), opt)
        monkeypatch.undo()
        states = [body.weight.requires_grad, mine.requires_grad]
        return [p.detach().clone() for p in net.parameters()], frozen_calls, states

    held, calls, states = run(hold=True)
    dropped, dropped_calls, _ = run(hold=False)
    assert calls == 0 and dropped_calls == 3 * 2  # (two micro-batches a step)
    assert all(torch.equal(a, b) for a, b in zip(held, dropped))
    assert states == [True, False]  # thawed; the user's own, though in the frozen group, left as the user set it


def test_a_frozen_body_trains_under_the_next_optimizer_and_requires_grad_once_the_replicator_closes():
    # Found by review: the parameters held frozen stayed so after the Replicator closed, and under a new optimizer
    # (plain PyTorch's way to unfreeze), which then trained nothing of them without a word.
    body, head = nn.Linear(4, 4), nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with bigbatch.Replicator(8, 8) as rep:
        net = rep.prepare(nn.Sequential(body, head))
        step = lambda m: (net(m[0]) - m[1]).square().mean()  # noqa: E731
        frozen = [{"params": body.parameters(), "frozen": True}, {"params": head.parameters()}]
        rep.step(step, (x, y), rep.wrap_optimizer(torch.optim.SGD(frozen, lr=0.1)))
        assert not body.weight.requires_grad
        before = body.weight.detach().clone()
        rep.step(step, (x, y), rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1)))
        assert body.weight.requires_grad and not torch.equal(body.weight, before)
        rep.step(step, (x, y), rep.wrap_optimizer(torch.optim.SGD(frozen, lr=0.1)))
        assert not body.weight.requires_grad
    assert body.weight.requires_grad and body.bias.requires_grad  # (closed: as before the Replicator)


def test_a_batch_computed_with_numpy_is_a_batch():
    # Found from outside: Replicator(batch=np.int64(64)) was refused ("must be an int").
    import numpy as np

    with bigbatch.Replicator(np.int64(64), np.prod([4, 4])) as rep:
        assert rep.batch == 64 and type(rep.batch) is int and rep.plan.accumulation == 4
    with bigbatch.Replicator(torch.tensor(64), torch.tensor(32)) as rep:  # (torch's too, as the Loader takes them)
        assert type(rep.batch) is type(rep.plan.micro_batch) is int and rep.plan.accumulation == 2
        # A dict's None passes to each micro-batch as a tuple's does (found from outside: an AttributeError)
        net = rep.prepare(torch.nn.Linear(2, 1))
        opt = rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        seen = []
        step_fn = lambda m: seen.append(m["meta"]) or net(m["x"]).mean()  # noqa: E731
        rep.step(step_fn, {"x": torch.ones(64, 2), "meta": None}, opt)
        assert seen == [None, None]


def test_what_the_replicator_cannot_honour_is_said(monkeypatch, capsys):
    # Found from outside, both silent: torch's own spectral norm (its power iteration at every forward: each
    # micro-batch, and again under checkpointing) and a memory budget beside a fixed micro-batch.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    for sn in (nn.utils.parametrizations.spectral_norm, nn.utils.spectral_norm):
        bigbatch.Replicator(8, 4, device="cpu").prepare(nn.Sequential(nn.ReLU(), sn(nn.Linear(2, 2))))
        err = capsys.readouterr().err
        assert "Sequential.1 uses torch.nn.utils' spectral norm" in err and "SNConv2d and SNLinear" in err, err
        monkeypatch.setattr("bigbatch.errors._WARNED", set())
    from bigbatch.models.layers import SNLinear

    bigbatch.Replicator(8, 4, device="cpu").prepare(nn.Sequential(SNLinear(2, 2)))
    bigbatch.Replicator(8, "auto", device="cpu", memory_budget="1GiB")
    assert capsys.readouterr().err == ""
    bigbatch.Replicator(8, 4, device="cpu", memory_budget="1GiB")
    assert 'memory_budget is read by micro_batch="auto" only: at micro_batch=4' in capsys.readouterr().err


def test_a_step_function_that_steps_or_backpropagates_itself_is_told_what_rep_step_does():
    # Found from outside (Accelerate habits): backward() in the step function met PyTorch's "retain_graph=True"
    # advice; opt.step() in it stepped once per micro-batch on partial gradients, silently.
    from torch import nn

    rep = bigbatch.Replicator(batch=8, micro_batch=4, device="cpu")
    net = rep.prepare(nn.Linear(4, 1))
    opt = rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1), "sgd")
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)  # (it wraps opt.step on the instance)
    before = net.weight.detach().clone()

    def backward(m):
        loss = net(m).square().mean()
        loss.backward()
        return loss

    itself = r"^the step function computed gradients itself \(backward\(\) on its loss or part of it\): return the"
    with pytest.raises(bigbatch.BigbatchError, match=itself):
        rep.step(backward, torch.randn(8, 4), opt)

    def part(m, retain=False):  # (found from outside: an auxiliary loss's own backward, or the loss's kept, made
        loss = net(m).square().mean()  # weights that depend on the micro-batch, silently)
        (loss if retain else net(m).abs().mean()).backward(retain_graph=True)
        return loss

    for step_fn in (part, lambda m: part(m, retain=True)):
        with pytest.raises(bigbatch.BigbatchError, match=itself):
            rep.step(step_fn, torch.randn(8, 4), opt)
    for call in ("step", "zero_grad"):  # (zero_grad found by review: the gradients before it thrown away)
        with pytest.raises(bigbatch.BigbatchError, match=rf"^the step function called the optimizer's {call}\(\)"):
            rep.step(lambda m, call=call: getattr(opt, call)() or net(m).square().mean(), torch.randn(8, 4), opt)
    assert torch.equal(net.weight, before)  # (none stepped)
    with warnings.catch_warnings():  # its own step, the scheduler's wrapper kept (else: "lr_scheduler.step() before")
        warnings.simplefilter("error")
        rep.step(lambda m: net(m).square().mean(), torch.randn(8, 4), opt)
        scheduler.step()
    assert not torch.equal(net.weight, before) and opt.param_groups[0]["lr"] == 0.05
    # micro_batch "auto" probes the step function first (found by review: the probe met backward() unsaid)
    auto = bigbatch.Replicator(batch=8, device="cpu")
    net = auto.prepare(nn.Linear(4, 1))
    opt = auto.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(bigbatch.BigbatchError, match=itself):
        auto.step(backward, torch.randn(8, 4), opt)
    with pytest.raises(bigbatch.BigbatchError, match=itself):  # (found by review: the probes passed it by)
        auto.step(part, torch.randn(8, 4), opt)
    kept = []  # a tensor of an earlier micro-batch used again: its graph backpropagated twice, said with the causes

    def again(m):
        kept.append(kept[0] if kept else net(m).square().mean())
        return kept[-1]

    twice = r"^a step's graph was backpropagated twice: .* a tensor of an earlier micro-batch or step is used again"
    with pytest.raises(bigbatch.BigbatchError, match=twice):
        auto.step(again, torch.randn(8, 4), opt)
    with pytest.raises(bigbatch.BigbatchError, match=r"^the step function called the optimizer's step\(\)"):
        auto.step(lambda m: opt.step() or net(m).square().mean(), torch.randn(8, 4), opt)


def test_a_numpy_integer_is_a_skip_window():
    # (found by review: the refusal of 2.5 refused numpy's integers too, which were taken before)
    import numpy as np

    assert bigbatch.Replicator(batch=8, micro_batch=4, device="cpu", skip_window=np.int64(10)).batch == 8


def test_a_torch_device_is_taken_as_its_name():
    # Found from outside: torch.device("cpu") was refused (accelerate and Lightning take it); another GPU than the
    # rank's own is still refused, each rank taking GPU LOCAL_RANK.
    rep = bigbatch.Replicator(batch=8, micro_batch=4, device=torch.device("cpu"))
    assert rep.device == torch.device("cpu")
    with pytest.raises(bigbatch.BigbatchError, match=r"must be 'auto', 'cpu' or 'cuda' .* got device\(type='cuda'"):
        bigbatch.Replicator(batch=8, micro_batch=4, device=torch.device("cuda", 1))
