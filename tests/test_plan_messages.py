"""What the batch plan and precision say, as a user reads it (each found from outside)."""

import json
import re

import pytest
import torch

import bigbatch
from bigbatch.cli import main
from bigbatch.engine import precision
from bigbatch.engine.running_stats import span_small


def test_fp16_and_emulated_bf16_on_a_cpu_are_said_to_be_slow(capsys, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr("bigbatch.errors._WARNED", set())  # (6 img/s where fp32 ran 729, without a word)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")  # (native bf16)
    precision.check("bf16", cpu)
    assert capsys.readouterr().err == ""
    precision.check("fp16", cpu)
    # (as the config's train.precision and the Replicator's precision= give it: found from outside, the config's name)
    err = capsys.readouterr().err
    assert "fp16 precision on a CPU: PyTorch's CPU fp16 kernels are slow" in err and "bf16 is a CPU's mixed" in err
    # A CPU whose bf16 torch emulates (found from outside: 15x slower than fp32, unsaid; fp16's advice was bf16).
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    precision.check("bf16", cpu)
    assert "bf16 precision on this CPU (torch's kernels for AVX2): it has no native bf16, and torch emulates it " \
           "5-20x slower than fp32" in capsys.readouterr().err  # fmt: skip
    precision.check("fp16", cpu)
    assert "fp32 is this one's fastest (no native bf16 either)" in capsys.readouterr().err


def test_a_batch_of_few_divisors_is_named_as_why_the_micro_batch_is_small():
    said = span_small(1, 1, False, 67, "micro_batch 'auto' planned 1 in 12.0 MiB", False)
    assert "span only 1 image of a step's 67" in said  # (the budget was blamed; checkpointing would not have helped)
    assert "a process's share of 67 has no divisor between 1 and 67: give train.batch a number of more divisors " \
           "(such as 64), or train.checkpointing or a larger train.memory_budget may fit it whole" in said  # fmt: skip
    for micro, share in ((4, 64), (4, 8), (2, 34)):  # (the next divisor near: the budget's to fit, not the batch's)
        assert span_small(micro, 1, False, share, "planned", False).endswith("a larger train.memory_budget fits more")


def test_a_later_phases_smaller_share_is_said_against_the_planned_micro_batch(tmp_path, capsys):
    cfg = bigbatch.preset("digits").override(
        {
            "data.resolution": 16,
            "model.ch": 8,
            "model.dim_z": 16,
            "train.batch": 64,
            "train.micro_batch": "auto",
            "train.memory_budget": "1GiB",
        }  # fmt: skip
    )  # (auto in 1 GiB: the whole share of 64; each later share then its own whole)
    schedule = [{"kimg": 0}, {"kimg": 0.064, "batch": 48}, {"kimg": 0.128, "batch": 16}]
    over = {"data.schedule": schedule, "train.kimg": 0.224, "sample.every_kimg": 0, "checkpoint.every_kimg": 0.224}
    bigbatch.train(cfg.override(over), run_dir=tmp_path / "r", quiet=True)
    err = capsys.readouterr().err  # (the smaller share was "not a multiple", and named against the last phase's 16)
    assert "share of batch 48 (from kimg 0.064) is smaller than micro_batch 64: micro-batches of 48" in err
    assert "share of batch 16 (from kimg 0.16) is smaller than micro_batch 64: micro-batches of 16" in err


def test_a_phase_no_world_size_divides_gives_the_batches_it_does_and_a_dry_run_is_one_ranks(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["train", "--dry-run", "--preset", "digits", "train.micro_batch=auto"]
    assert main([*argv, "data.schedule=[{kimg=0},{kimg=0.1,batch=33}]"]) == 2
    assert "phase from 0.1 kimg has batch 33, not a multiple of the 2 processes: give it 32 or 34" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("RANK", "1")  # (under torchrun, every rank printed the config and the plan)
    assert main(argv) == 0 and capsys.readouterr().out == ""


def test_a_resume_under_another_cpu_thread_count_is_said_not_to_be_bit_for_bit(tmp_path, capsys):
    # Found from outside: a SAEHD run resumed without OMP_NUM_THREADS=1 ended 1.8e-3 apart from the uninterrupted
    # run, without a word (a CPU sums in another order with another count of threads).
    cfg = bigbatch.preset("digits").override({"data.resolution": 16, "model.ch": 8, "model.dim_z": 16})
    cfg = cfg.override({"train.batch": 32, "train.kimg": 0.032, "sample.every_kimg": 0})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
        bigbatch.train(cfg.override({"train.kimg": 0.064}), run_dir=tmp_path / "r", resume=True, quiet=True)
        assert "CPU threads" not in capsys.readouterr().err
        torch.set_num_threads(2)
        bigbatch.train(cfg.override({"train.kimg": 0.096}), run_dir=tmp_path / "r", resume=True, quiet=True)
    finally:
        torch.set_num_threads(threads)
    said = "this process sums with 2 CPU threads, the run's last start with 1: it goes on, but not bit for bit"
    assert said in capsys.readouterr().err
    # Its last start on 2 processes: 2 x 2 micro-batches then summed across the ranks, in another order than one
    # process's 4 (found from outside: unsaid); 2 x 1 is the same order as 1 x 2 (the ranks' sums in rank order).
    plan = tmp_path / "r" / "plan.json"
    for accumulation, kimg, warned in ((2, 0.128, True), (1, 0.16, False)):
        plan.write_text(json.dumps({**json.loads(plan.read_text()), "world_size": 2, "accumulation": accumulation}))
        bigbatch.train(cfg.override({"train.kimg": kimg}), run_dir=tmp_path / "r", resume=True, quiet=True)
        said = "this run has 1 process, its last start 2: it goes on, its gradients summed in another order, so not"
        assert (said in capsys.readouterr().err) is warned


def test_a_cpu_plan_probes_the_smaller_size_first_and_none_twice():
    # Found from outside: 32 and 64 were probed first whatever the budget (a large model's 64 may be OOM-killed
    # before any plan), and 32 again by the bisection below 64.
    from bigbatch.engine import memory

    def plan(budget_mib: int) -> tuple[int, list[int]]:
        probed = []

        def probe(m: int) -> None:  # a step of 1 MiB an image
            probed.append(m)
            torch.empty(m << 20, dtype=torch.uint8).fill_(1)

        sizes = [d for d in range(1, 257) if 256 % d == 0]
        micro, _ = memory.fit_micro_batch(probe, sizes, torch.device("cpu"), budget_mib << 20, 0)
        return micro, probed

    # The two smallest first, then no size their line puts past 1.5x the budget (found from outside: 32 probed first
    # whatever the budget, 12.5x one of 8 MiB, a risk where memory is short)
    assert plan(3) == (2, [1, 2, 4])  # (4 MiB: within 1.5x)
    assert plan(20) == (16, [1, 2, 8, 16])  # (32 and 64 left unprobed: past 30 MiB on the line)
    assert plan(50) == (32, [1, 2, 32, 64])
    assert plan(1000) == (256, [1, 2, 32, 64])  # (above 64, told by the two largest: 1 MiB an image)
    with pytest.raises(bigbatch.BigbatchError, match=r"^even micro_batch=1 needs 1.0 MiB, over the memory budget"):
        step = lambda m: torch.empty(m << 20, dtype=torch.uint8).fill_(1)  # noqa: E731
        memory.fit_micro_batch(step, [1, 2, 4, 8, 16, 32, 64, 128], torch.device("cpu"), 1 << 19, 0)


def test_auto_passes_over_a_micro_batch_of_one_a_batchnorm1d_cannot_train():
    # Found from outside: PyTorch's "Expected more than 1 value per channel" traceback from a probe at 1 (a prime
    # batch, or a tight budget), where 67 fitted; now 1 is passed over, and a budget under 2 said as such.
    from torch import nn

    def plan(batch: int, budget: str) -> str:
        with bigbatch.Replicator(batch=batch, micro_batch="auto", memory_budget=budget, device="cpu") as rep:
            torch.manual_seed(0)
            net = rep.prepare(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Linear(32, 2)))
            opt = rep.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
            data = (torch.randn(batch, 16), torch.randint(0, 2, (batch,)))
            rep.step(lambda b: nn.functional.cross_entropy(net(b[0]), b[1]), data, opt)
            return rep.plan.describe()

    assert plan(67, "64MiB").startswith("batch 67 = micro_batch 67 x accumulation 1")
    with pytest.raises(bigbatch.BigbatchError, match=r"^even micro_batch=2 needs .* over the memory budget of 1.0 KiB"):
        plan(64, "1KiB")


def test_bigbatch_keep_freed_0_leaves_glibcs_policy(monkeypatch):
    # Found from outside: the freed memory a CPU step keeps doubled a conv net's resident memory, with no way out.
    from bigbatch.engine import memory

    calls = []
    monkeypatch.setattr("ctypes.CDLL", lambda name: type("libc", (), {"mallopt": lambda *a: calls.append(a) or 1})())
    monkeypatch.setenv("BIGBATCH_KEEP_FREED", "0")
    assert memory.hold_freed_memory() is False and calls == []
    monkeypatch.delenv("BIGBATCH_KEEP_FREED")
    assert memory.hold_freed_memory() is True and calls  # (glibc's settings made)


def test_a_dry_run_of_a_resume_says_whether_auto_is_probed_again(tiny, tmp_path, capsys):
    # Found from outside: "keeping the micro_batch 32 its run planned" was said of a resume with another budget,
    # precision or checkpointing, each of which the resume probes again.
    auto = {"train.micro_batch": "auto", "train.memory_budget": "20MiB", "train.kimg": 0.032}
    run = bigbatch.train(tiny.override(auto), run_dir=tmp_path / "r", quiet=True)
    kept = json.loads((run / "plan.json").read_text())["micro_batch"]
    capsys.readouterr()
    dry = ["train", "--run-dir", str(run), "--resume", "--dry-run", "train.kimg=0.064"]
    assert main(dry) == 0
    assert f", keeping the micro_batch {kept} its run planned" in capsys.readouterr().out
    for change, words in (
        ("train.memory_budget='10MiB'", "train.memory_budget is 10.0 MiB, the checkpoint's plan was made for 20.0 MiB"),
        ("train.precision=bf16", "the checkpoint's plan was made for fp32, this run is bf16"),
        ("train.checkpointing=true", "train.checkpointing is true since the checkpoint's plan"),
    ):
        assert main([*dry, change]) == 0
        out, err = capsys.readouterr()
        assert f'probing micro_batch "auto" again as it starts (its run planned {kept})' in out and words in err


def test_a_budget_past_the_machines_free_memory_is_said_on_a_cpu(capsys):
    # Found from outside: train.memory_budget "100TiB" (for GiB) was taken without a word; a GPU refuses it.
    rep = bigbatch.Replicator(batch=8, micro_batch="auto", device="cpu", memory_budget="100TiB")
    net = rep.prepare(torch.nn.Linear(4, 1))
    rep.step(lambda m: net(m).square().mean(), torch.ones(8, 4), rep.wrap_optimizer(torch.optim.SGD(net.parameters())))
    assert "memory budget 102400.00 GiB is more than the " in capsys.readouterr().err


def test_a_budget_no_micro_batch_fits_says_the_part_none_lowers_and_the_settings_not_on_yet():
    # Found from outside: bf16 and activation checkpointing were advised to a run that had both on, and a budget
    # under the weights, gradients and optimizer state alone (which no setting lowers) was not told apart.
    from torch import nn

    def plan(net: nn.Module, shape: tuple, budget: str, precision: str) -> None:
        with bigbatch.Replicator(batch=4, micro_batch="auto", memory_budget=budget, precision=precision) as rep:
            net = rep.prepare(net)
            opt = rep.wrap_optimizer(torch.optim.Adam(net.parameters()))
            rep.step(lambda x: net(x).float().square().mean(), torch.randn(4, *shape), opt)

    wide = nn.Linear(1024, 1024)  # 4 MiB of weights, 4 of gradients, 8 of Adam's two moments
    with pytest.raises(bigbatch.BigbatchError) as e:
        plan(wide, (1024,), "12MiB", "fp32")
    assert str(e.value).endswith(
        "over the memory budget of 12.0 MiB: the weights, their gradients and the optimizer's state alone take "
        "16.0 MiB, which no micro-batch, precision or checkpointing lowers; raise memory_budget, or give a smaller "
        "model"
    ), e.value
    conv = nn.Conv2d(3, 64, 3, padding=1)  # 16 MiB of activations an image at 256 px, 7 KiB of weights
    with pytest.raises(bigbatch.BigbatchError) as e:
        plan(conv, (3, 256, 256), "4MiB", "bf16")
    assert re.search(r"over the memory budget of 4.0 MiB, [\d.]+ KiB of it the weights, their gradients and the "
                     r"optimizer's state; raise memory_budget, use activation checkpointing, or give a smaller model$",
                     str(e.value)), e.value  # fmt: skip


def test_info_says_the_probed_peak_of_the_micro_batch_auto_took(tmp_path, capsys):
    # Found from outside: plan.json held it, info said the split alone.
    cfg = bigbatch.preset("digits").override({"data.resolution": 16, "model.ch": 8, "model.dim_z": 16})
    over = {"train.batch": 32, "train.micro_batch": "auto", "train.memory_budget": "1GiB", "train.kimg": 0.032}
    run = bigbatch.train(cfg.override({**over, "sample.every_kimg": 0}), run_dir=tmp_path / "r", quiet=True)
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    assert re.search(r"batch 32 \(micro 32 x 1 accumulated; train.micro_batch auto; probed peak [\d.]+ [KM]iB of its "
                     r"budget 1.00 GiB\)", capsys.readouterr().out)  # fmt: skip


def test_a_dry_run_says_what_no_micro_batch_lowers_and_refuses_a_budget_under_it(capsys):
    # Found from outside: a dry run said nothing of memory, and BigGAN-128's batch 2048 in 2 GiB passed it (the run
    # said so after computing its reference statistics, minutes on ImageNet).
    assert main(["train", "--dry-run", "--preset", "biggan128_bs2048", "train.memory_budget=2GiB"]) == 2
    said = "train.memory_budget 2GiB is less than the weights, their gradients, the optimizer's state and averages "
    said += "take 2.34 GiB, whatever the micro-batch: raise it, or give a smaller model"
    assert said in capsys.readouterr().err
    assert main(["train", "--dry-run", "--preset", "imagenet_resnet50", "train.memory_budget=24GiB"]) == 0
    # ResNet-50's 25.6 M weights, their gradients and SGD's momentum, in fp32, with its BatchNorms' statistics
    assert "averages take 269.5 MiB whatever the micro-batch (activations on top)" in capsys.readouterr().out


def test_a_run_counts_g_ema_as_its_dry_run_does_and_refuses_the_budget_it_refuses(tmp_path, capsys):
    # Found from outside: the dry run's 8.7 MiB of weights, gradients, Adam's moments and G_ema refused 8.6 MiB, which
    # the run took, counting 6.3 MiB without G_ema (a CPU probe counts what the step makes on top of its models).
    assert main(["train", "--dry-run", "--preset", "digits", "train.micro_batch=auto", "train.memory_budget=1GiB"]) == 0
    floor = float(re.search(r"averages take ([\d.]+) MiB whatever", capsys.readouterr().out).group(1))
    budget = [f"train.memory_budget={floor - 0.1:.1f}MiB", "train.micro_batch=auto", "train.kimg=0.064"]
    assert main(["train", "--preset", "digits", *budget, "--dry-run"]) == 2
    assert main(["train", "--preset", "digits", *budget, "--run-dir", str(tmp_path / "r")]) == 2
    said = f"the weights, their gradients, the optimizer's state and averages alone take {floor:.1f} MiB, which no"
    assert said in capsys.readouterr().err


def test_the_floor_holds_one_networks_gradients_at_a_time_under_what_micro_batch_1_measures(tmp_path, capsys):
    # Found from outside: G's and D's gradients were counted as held together (a step holds one optimizer's), so the
    # dry run refused a budget that micro-batch 1 was measured to fit, and the run's line named a part larger than
    # the whole it needed.
    tiny = ["--preset", "digits", "data.resolution=16", "model.ch=8", "train.kimg=0.032", "train.batch=32"]
    tiny += ["train.micro_batch=auto", "sample.every_kimg=0"]
    assert main(["train", *tiny, "train.memory_budget=1GiB", "--dry-run"]) == 0
    floor = float(re.search(r"averages take ([\d.]+) KiB whatever", capsys.readouterr().out).group(1))
    budget = f"train.memory_budget={floor + 1:.1f}KiB"  # (over the floor, under micro-batch 1's activations on it)
    assert main(["train", *tiny, budget, "--run-dir", str(tmp_path / "r")]) == 2
    said = re.search(r"even micro_batch=1 needs ([\d.]+) KiB, over the memory budget of [\d.]+ KiB, ([\d.]+) KiB of it",
                     capsys.readouterr().err)  # fmt: skip
    assert said and float(said.group(2)) == floor < float(said.group(1)), said


def test_a_dry_runs_floor_counts_the_data_files_classes(tmp_path, capsys):
    # Found from outside: 10 classes stood in for the data's, an ImageNet model's 1000-class head went uncounted.
    from PIL import Image

    from bigbatch.data import prepare

    floors = []
    for classes in (2, 60):
        for c in range(classes):
            (tmp_path / f"c{classes}" / f"class{c:02d}").mkdir(parents=True)
            Image.new("RGB", (16, 16), (c, 0, 0)).save(tmp_path / f"c{classes}" / f"class{c:02d}" / "0.png")
        prepare(str(tmp_path / f"c{classes}"), str(tmp_path / f"c{classes}.h5"), 16, workers=0)
        over = [f"data.path={tmp_path / f'c{classes}.h5'}", "data.resolution=16", "model.ch=8", "data.val_fraction=0"]
        assert main(["train", "--dry-run", "--preset", "fashion_resnet", *over]) == 0
        floors.append(float(re.search(r"averages take ([\d.]+) KiB whatever", capsys.readouterr().out).group(1)))
    assert floors[1] > floors[0], floors
