"""Mixed precision and memory planning through `bigbatch.train`: what a run records, how it stops."""

import json
import re

import pytest
import torch
from test_replicator import classifier

import bigbatch
from bigbatch.cli import main
from bigbatch.engine import memory
from bigbatch.metrics_file import read_metrics


def weights(run, name):
    return {net: (run / "checkpoints" / name / f"{net}.safetensors").read_bytes() for net in ("G", "D", "G_ema")}


def test_fp16_run_logs_skips_and_loss_scales_and_resumes_bit_identically(tiny, tmp_path, capsys):
    cfg = tiny.override({"train.precision": "fp16"})
    whole = bigbatch.train(cfg, run_dir=tmp_path / "whole")
    rows = read_metrics(whole / "metrics.jsonl")
    assert all({"skipped_D", "skipped_G", "loss_scale_D", "loss_scale_G"} <= row.keys() for row in rows)
    assert rows[-1]["loss_scale_D"] <= 65536.0
    # Without a terminal, a line per row shows the losses (not the loss scales), D's first.
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kimg ")]
    assert len(lines) == len(rows)
    assert all("loss_scale" not in line and line.index(" loss_D ") < line.index(" loss_G ") for line in lines)
    # The loss scalers and skip histories are part of the checkpoint.
    parts = tmp_path / "parts"
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=parts, quiet=True)
    bigbatch.train(cfg, run_dir=parts, resume=True, quiet=True)
    assert weights(parts, "000000.512") == weights(whole, "000000.512")


def test_bf16_run_trains(tiny, tmp_path):
    run = bigbatch.train(tiny.override({"train.precision": "bf16"}), run_dir=tmp_path / "bf16", quiet=True)
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["skipped_D"] == 0 and rows[-1]["loss_D"] < 3


def test_a_short_run_of_skipped_steps_stops_too(tiny, tmp_path, capsys):
    # Found from outside: 7 of a run's 8 steps skipped (g_lr 1e30), and it ended "Done" (a sweep listed it
    # finished, with losses): the limit counted skips against the whole window of 50 steps.
    cfg = tiny.override({"train.g_lr": 1e30, "train.kimg": 0.256, "train.batch": 32, "train.micro_batch": 32})
    with pytest.raises(bigbatch.BigbatchError, match=r"of the last \d [GD] steps had a non-finite loss") as stopped:
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    # Before its first checkpoint: said so (found from outside: "the last checkpoint intact", where none was), and
    # the row of the steps since the last one logged, their skips counted (it was lost).
    assert "before its first checkpoint: start it again in another --run-dir" in str(stopped.value)
    assert "with train.grad_clip set, or at a lower learning rate" in str(stopped.value)
    rows, said = read_metrics(tmp_path / "r" / "metrics.jsonl"), capsys.readouterr().err
    count, net = re.search(r"(\d+) of the last \d ([GD]) steps", str(stopped.value)).groups()
    assert sum(r.get(f"skipped_{net}", 0) for r in rows) == int(count) >= 2
    # (the last row, of the iteration that stopped it, numbered as its own: found from outside, the one before's)
    assert [r["step"] for r in rows] == [round(r["kimg"] * 1000 / 32) for r in rows], rows
    said = said.count("skipped: its loss or gradients are not finite")  # (the 1st, 10th, 100th, ... of each)
    assert said == sum(any(r.get(f"skipped_{n}") for r in rows) for n in "GD")
    assert not (tmp_path / "r" / "checkpoints").exists()
    # Clipped already, it is not advised again (found from outside).
    with pytest.raises(bigbatch.BigbatchError, match=r"keeps its config\) at a lower learning rate$"):
        bigbatch.train(cfg.override({"train.grad_clip": 1.0}), run_dir=tmp_path / "clipped", quiet=True)


def test_too_many_skipped_steps_stop_with_the_last_checkpoint_intact(tiny, tmp_path, capsys):
    # A learning rate this large overflows fp16 step after step: training must stop, not go on.
    run = tmp_path / "diverged"
    (tmp_path / "tiny.toml").write_text(tiny.dumps())
    overrides = [
        "train.precision=fp16",
        "train.g_lr=1e4",
        "train.d_lr=1e4",
        "train.kimg=4",
        "checkpoint.every_kimg=0.064",
    ]
    code = main(["train", "--config", str(tmp_path / "tiny.toml"), *overrides, "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2
    assert "had a non-finite loss or gradients and were skipped" in err.splitlines()[-1]
    written = sorted(p.name for p in (run / "checkpoints").glob("0*"))
    assert written and (run / "checkpoints" / "latest").read_text().strip() == written[-1]
    assert len(bigbatch.load_generator(run).state_dict()) > 0


def test_auto_micro_batch_plan_is_printed_and_saved(tiny, tmp_path, capsys):
    cfg = tiny.override({"train.micro_batch": "auto", "train.memory_budget": "600KB", "train.kimg": 0.064})
    run = bigbatch.train(cfg, run_dir=tmp_path / "auto")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["micro_batch"] * plan["accumulation"] * plan["world_size"] == plan["batch"] == 32
    fitting = [p["micro_batch"] for p in plan["probes"] if p["fits"]]
    assert plan["micro_batch"] == max(fitting) < 32
    assert all(p["peak_bytes"] > 600_000 for p in plan["probes"] if not p["fits"])
    out = capsys.readouterr().out
    assert "micro_batch auto, budget" in out
    for probe in plan["probes"]:  # each probe's share of the budget (1.0 MiB of a 1.0 MiB budget did not fit)
        share = round(100 * probe["peak_bytes"] / 600_000)
        assert f"micro_batch {probe['micro_batch']:5d}: peak " in out and f"({share}% of it), " in out


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.precision=fp8", "'train.precision' must be"),
        ("train.memory_budget=lots", "'train.memory_budget' cannot be read"),
        ("train.memory_budget=6", 'a size with its unit, e.g. "6GiB"'),  # (found from outside: the form not said)
        ("train.skip_limit=2", "'train.skip_limit' must be a fraction"),
        ("train.g_lr=1e39", "'train.g_lr' must be below 3.4e38, float32's largest number"),  # (was a traceback)
    ],
)
def test_bad_engine_settings_are_one_line(capsys, override, words):
    assert main(["train", override, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_resumed_auto_run_keeps_its_micro_batch(tiny, tmp_path, monkeypatch):
    cfg = tiny.override({"train.micro_batch": "auto", "train.memory_budget": "600KB"})
    run = bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "auto", quiet=True)
    planned = json.loads((run / "plan.json").read_text())["micro_batch"]

    def no_probing(*args, **kwargs):
        raise AssertionError("a resumed run must not re-plan")

    monkeypatch.setattr(bigbatch.Replicator, "plan_micro_batch", no_probing)
    bigbatch.train(cfg.override({"train.kimg": 0.384}), run_dir=run, resume=True, quiet=True)
    assert json.loads((run / "plan.json").read_text())["micro_batch"] == planned
    # A checkpoint written before the plan was part of the engine's state: plan.json still holds it.
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    state = torch.load(ckpt / "state.pt", weights_only=True)
    del state["engine"]["plan"]
    torch.save(state, ckpt / "state.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"]["state.pt"] = (ckpt / "state.pt").stat().st_size
    (ckpt / "meta.json").write_text(json.dumps(meta))
    bigbatch.train(cfg, run_dir=run, resume=True, quiet=True)
    assert json.loads((run / "plan.json").read_text())["micro_batch"] == planned


def test_a_new_budget_on_resume_plans_again_and_a_fixed_micro_batch_says_it_ignores_one(
    tiny, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (a fixed micro-batch's unread budget: said once a process)
    cfg = tiny.override({"train.micro_batch": "auto", "train.memory_budget": "600KB"})
    run = bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=tmp_path / "auto", quiet=True)
    before = json.loads((run / "plan.json").read_text())
    capsys.readouterr()
    bigbatch.train(cfg.override({"train.memory_budget": "6MB"}), run_dir=run, resume=True, quiet=True)
    after = json.loads((run / "plan.json").read_text())
    assert "train.memory_budget is 5.7 MiB, the checkpoint's plan was made for 585.9 KiB" in capsys.readouterr().err
    assert after["memory_budget_bytes"] == 6_000_000 and after["micro_batch"] > before["micro_batch"]
    bigbatch.train(tiny.override({"train.memory_budget": "6MB"}), run_dir=tmp_path / "fixed", quiet=True)
    assert capsys.readouterr().err.count('train.memory_budget is read by micro_batch "auto" only') == 1
    assert main(["train", "--dry-run", "train.micro_batch=32", "train.memory_budget=4MiB"]) == 0  # (it said nothing)
    assert 'train.memory_budget is read by micro_batch "auto" only' in capsys.readouterr().err


def test_a_resumed_optimizer_keeps_its_own_kernels_and_its_weights_layout():
    # A checkpoint's param groups carry their run's kernels (fused on a GPU), and its moments their weights'
    # layout then: resumed on another device, or after train.channels_last switched, the optimizer keeps what
    # this run made it with (fused kernels refuse a moment laid out unlike its weight).
    from bigbatch.engine.precision import load_optimizer

    def adam(fused, channels_last):
        w = torch.nn.Parameter(torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(0)))
        if channels_last:
            w.data = w.data.to(memory_format=torch.channels_last)
        opt = torch.optim.Adam([w], lr=0.1, fused=fused)
        w.grad = torch.ones_like(w)
        opt.step()
        return w, opt

    _, saved = adam(True, False)  # as a GPU run saves it: fused, NCHW
    w, opt = adam(None, True)
    load_optimizer(opt, saved.state_dict())
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["lr"] == 0.1
    moments = opt.state[w]
    assert all(moments[k].stride() == w.stride() for k in ("exp_avg", "exp_avg_sq"))
    torch.testing.assert_close(moments["exp_avg"], saved.state_dict()["state"][0]["exp_avg"], rtol=0, atol=0)


def test_a_run_that_never_took_a_step_says_so_when_it_stops():
    # Found from outside: fp16 SAEHD skipped every step, and the stop said "5 of the last 21 steps" (those
    # while the loss scale settled are not counted) and "the weights of the last good step" (there was none).
    rep = bigbatch.Replicator(batch=8, micro_batch=8, precision="fp16", device="cpu", skip_limit=0.5, skip_window=4)
    model = rep.prepare(classifier())
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), "clf")
    x = torch.randn(8, 1, 8, 8)

    def step_fn(micro):  # a finite loss (0) whose gradients are not finite at any scale: d sqrt(u) / du at 0
        return torch.sqrt(model(micro).sum() * 0)

    with pytest.raises(bigbatch.BigbatchError) as e:
        for _ in range(40):
            rep.step(step_fn, x, opt)
    said = str(e.value)
    assert "3 of the last 4 clf steps had a non-finite loss" in said and "; 19 of its 19 skipped in all)" in said
    assert 'training stopped with clf\'s first weights: give the Replicator precision="bf16" (in place of' in said


def test_an_fp16_step_interrupted_after_unscaling_is_abandoned_and_the_next_one_runs():
    # Found from outside: a Ctrl-C in an fp16 step between its gradients' unscale_ and the scaler's update (on a GPU,
    # where the host waits to read the step's results) left torch's scaler refusing every later step ("unscale_() has
    # already been called"), and BatchNorm's statistics half updated.
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)
    )
    rep = bigbatch.Replicator(batch=8, micro_batch=4, precision="fp16", device="cpu")
    model = rep.prepare(net)
    opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), "net")
    x, before = torch.randn(8, 1, 8, 8), {k: v.clone() for k, v in net.state_dict().items()}

    def interrupt(*_):
        hook.remove()
        raise KeyboardInterrupt

    hook = opt.register_step_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        rep.step(lambda micro: model(micro).square().mean(), x, opt)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())  # the step left no trace
    rep.step(lambda micro: model(micro).square().mean(), x, opt)
    assert rep.counters()["net"]["steps"] == 1 and rep.counters()["net"]["loss_scale"] == 2.0**16
    assert not torch.equal(net[2].running_mean, before["2.running_mean"])


def test_bf16_is_refused_on_a_gpu_older_than_ampere(monkeypatch):
    # Found by reading: torch.cuda.is_bf16_supported() says yes where bf16 is emulated (a V100, a T4), and
    # asked GPU 0 before a rank of several had set its own.
    from bigbatch.engine import precision

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "Tesla T4")
    with pytest.raises(
        bigbatch.BigbatchError, match=r"this GPU \(Tesla T4\) has no bf16 kernels .* use precision 'fp16'"
    ):
        precision.check("bf16", torch.device("cuda", 3))
    assert asked == [torch.device("cuda", 3)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (9, 0))
    precision.check("bf16", torch.device("cuda", 3))  # an H100


def test_where_augments_sample_is_float32_under_autocast():
    # Found by reading for the GPU: affine_grid and ADA's position einsum ran in bf16 under the step's autocast,
    # so a 512 px face was sampled up to 2.4 px off, with no error (a CPU test shows it: autocast is the same).
    from bigbatch.data.streams import generator
    from bigbatch.tasks.gan import ada
    from bigbatch.tasks.swap import warp

    torch.manual_seed(0)
    faces, draws = torch.rand(2, 4, 256, 256), warp.draw(2, generator(0, 9, 0, 0), True)
    groups = ["blit", "geom", "color", "filter"]
    images, params = torch.rand(2, 3, 64, 64), ada.draw(groups, 1.0, 2, 64, 0, 0, 0)

    def sampled():
        return (*warp.apply(faces, *draws, warp=True), ada.apply(images, params, groups))

    plain = sampled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = sampled()
    assert all(torch.equal(a, b) for a, b in zip(plain, under))


def test_parse_bytes(capsys):
    assert memory.parse_bytes("6GiB") == 6 * 2**30
    assert memory.parse_bytes("512 MiB") == 512 * 2**20
    assert memory.parse_bytes("8GB") == 8 * 10**9
    assert [memory.format_bytes(n) for n in (1024, 3 * 2**20, 2**31)] == [
        "1.0 KiB",
        "3.0 MiB",
        "2.00 GiB",
    ]  # (1KiB: "0.0")
    with pytest.raises(bigbatch.BigbatchError, match="write it like '6GiB'"):
        memory.parse_bytes("six gigs")
    with pytest.raises(bigbatch.BigbatchError, match="memory budget must be positive, got '0GiB'"):
        memory.parse_bytes("0GiB")  # (it said it could not be read)
    from bigbatch.cli import main

    assert main(["train", "--dry-run", "train.memory_budget='0.1B'"]) == 2
    assert "'train.memory_budget' must be positive, got '0.1B'" in capsys.readouterr().err
    # A number without its unit, and a negative size (found from outside: "8" was 8 bytes, refused at the first
    # probe; "-1GiB" "cannot be read")
    assert memory.parse_bytes("1000B") == 1000 and memory.parse_bytes("8589934592") == 2**33  # (bytes, as before)
    for text, words in (("8", "memory budget '8' has no unit: write it like '8GiB' or '8MiB' ('8B': bytes)"),
                        ("-1GiB", "must be positive, got '-1GiB'"), ("-8", "must be positive")):  # fmt: skip
        with pytest.raises(bigbatch.BigbatchError, match=re.escape(words)):
            memory.parse_bytes(text)
    assert main(["train", "--dry-run", "train.memory_budget='8'"]) == 2
    assert "config key 'train.memory_budget' '8' has no unit: write it like '8GiB'" in capsys.readouterr().err


def test_fp16_overflows_in_a_row_after_steps_applied_are_a_divergence_counted_and_said(capsys, monkeypatch):
    # Found from outside: a run that went bad mid-way skipped steps as "settling" until its scale fell to 1, unsaid
    # and uncounted; the scale's fall from its start settles down to 2^8, then each overflow in a row counts.
    from bigbatch.engine.arguments import SkipLimitReached

    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16")
    lin = torch.nn.Linear(4, 2)
    net, opt = rep.prepare(lin), rep.wrap_optimizer(torch.optim.SGD(lin.parameters(), 0.1))
    for _ in range(3):
        rep.step(lambda m: net(m).float().mean(), torch.randn(8, 4), opt)
    assert not rep.skipped(opt)
    with pytest.raises(SkipLimitReached):
        for _ in range(20):
            rep.step(lambda m: net(m).float().sum() * 1e30, torch.randn(8, 4), opt)
    # 8 halvings settling (2^16 .. 2^9), then 3 counted (of 14 steps): stopped at a scale of 2^5, not 1
    assert rep.counters()["opt0"]["skipped"] == 11 and rep.counters()["opt0"]["failed"] == 3 and rep.steps(opt) == 14
    err = capsys.readouterr().err
    assert err.count("fp16 loss scale settling") == 1
    assert err.count("skipped: its loss or gradients are not finite") == 1  # (the first counted: 1st, 10th, ...)
    assert "step 12 skipped: its loss or gradients are not finite; fp16 loss scale now 128\n" in err
    # Nor does a run that overflows every other step below the floor (found by review): only a scale grown since.
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16")
    net, opt = rep.prepare(lin), rep.wrap_optimizer(torch.optim.SGD(lin.parameters(), 0.1))
    with pytest.raises(SkipLimitReached):
        for i in range(40):
            rep.step(lambda m, f=1e30 if i % 2 else 1.0: net(m).float().mean() * f, torch.randn(8, 4), opt)
    assert rep.steps(opt) == 28 and rep.counters()["opt0"]["skipped"] == 14  # (8 settled, 6 counted)
    assert rep.state_dict()["optimizers"]["opt0"]["settled"] == 4  # (kept with a checkpoint)


def test_fp16_overflows_in_a_row_after_the_scale_grew_count_above_the_floor_too(capsys, monkeypatch):
    # Found by review: the floor counted any halving above 2^8 as settling, so a run gone bad at a grown scale
    # (healthy long runs sit above 2^16) skipped a dozen steps unsaid. The floor is the first fall's alone.
    from bigbatch.engine.arguments import SkipLimitReached

    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16", skip_window=10)
    lin = torch.nn.Linear(4, 2)
    net, opt = rep.prepare(lin), rep.wrap_optimizer(torch.optim.SGD(lin.parameters(), 0.01))
    rep._state(opt).scaler.set_growth_interval(2)  # (2000 applied steps, in two)
    for f in (1e30, 1.0, 1.0, 1.0, 1.0):  # settling once, then grown twice: 2^15 -> 2^17
        rep.step(lambda m, f=f: net(m).float().mean() * f, torch.randn(8, 4), opt)
    with pytest.raises(SkipLimitReached):
        for _ in range(10):
            rep.step(lambda m: net(m).float().sum() * 1e30, torch.randn(8, 4), opt)
    assert rep.counters()["opt0"]["skipped"] == 4  # one settling at the start, one after the growth, two counted
    assert rep.state_dict()["optimizers"]["opt0"]["grown"] is True


def test_fp16s_scale_falling_from_its_start_between_applied_steps_is_settling(capsys, monkeypatch):
    # Found from outside: StyleGAN2's paper preset in fp16 stopped at its 5th G step ("2 of the last 5 G steps"):
    # its path length steps overflowed at scales the others took, each fall of the scale counted.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16")
    lin = torch.nn.Linear(4, 2)
    net, opt = rep.prepare(lin), rep.wrap_optimizer(torch.optim.SGD(lin.parameters(), 0.1))
    for i in range(20):  # every other step's weight gradients 192: over fp16's 65504 at a scale of 2^9, not 2^8
        rep.step(lambda m, f=24.0 if i % 2 else 1.0: net(m).float().sum() * f, torch.ones(8, 4), opt)
    err = capsys.readouterr().err
    assert rep.counters()["opt0"]["skipped"] == 8 and not rep.skipped(opt) and rep.steps(opt) == 20
    assert err.count("fp16 loss scale settling") == 1 and "skipped: its loss or gradients are not finite" not in err


def test_fp16s_loss_scale_settling_is_said_once(capsys, monkeypatch):
    # Found from outside: a line for each halving of the scale, which the README calls normal.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    rep = bigbatch.Replicator(batch=8, micro_batch=8, device="cpu", precision="fp16")
    lin = torch.nn.Linear(4, 2)
    net, opt = rep.prepare(lin), rep.wrap_optimizer(torch.optim.SGD(lin.parameters(), 0.1))
    for _ in range(4):  # a finite loss whose scaled gradients overflow fp16: settling
        rep.step(lambda m: net(m).float().sum() * 1e6, torch.randn(8, 4), opt)
    err = capsys.readouterr().err
    assert err.count("opt0: fp16 loss scale settling: a step whose scaled gradients overflow is skipped") == 1
    assert "skipped: its loss or gradients are not finite" not in err and rep.skipped(opt)


def test_weights_a_step_made_infinite_are_never_saved(tiny, tmp_path, capsys):
    # Found from outside: D's first step, its gradients finite, made its weights inf (d_lr 1e38); G's step was then
    # skipped, yet the checkpoint was written with them, and the stop advised resuming from it.
    cfg = tiny.override({"train.d_lr": 1e38, "train.kimg": 0.256, "checkpoint.every_kimg": 0.032})
    with pytest.raises(bigbatch.BigbatchError) as stopped:
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert str(stopped.value) == (
        "before the checkpoint at kimg 0.032, D held weights that are not finite, made so by the last step applied "
        "(lower its rate); nothing was saved (earlier ones stay)"
    )
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_stop_by_signal_saves_no_weights_a_step_made_infinite(tiny, tmp_path):
    # Found from outside: the periodic checkpoint refused them, but a SIGTERM's save wrote them and advised resuming.
    import os
    import signal

    from bigbatch.tasks.gan.task import GANTask

    step = GANTask.step

    def step_then_signal(self, feed):
        out = step(self, feed)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    cfg = tiny.override({"train.d_lr": 1e38, "train.kimg": 0.256, "checkpoint.every_kimg": 0.128})
    with pytest.MonkeyPatch.context() as patch, pytest.raises((bigbatch.BigbatchError, bigbatch.Stopped)) as stopped:
        patch.setattr(GANTask, "step", step_then_signal)
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert "D held weights that are not finite" in str(stopped.value) and "nothing was saved" in str(stopped.value)
    assert not (tmp_path / "r" / "checkpoints").exists()
