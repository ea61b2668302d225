"""micro_batch "auto" of a swap run with both of DFL's discriminators: its probes hold one optimizer's gradients at a
time, as its steps do and as a dry run's floor counts them (found by review: the autoencoder's were kept through the
discriminators' probes)."""

import re

import bigbatch
from bigbatch.cli import main


def test_a_swap_with_discriminators_plans_auto_and_its_probes_count_one_optimizers_gradients(
    faces, tmp_path, capsys, monkeypatch
):
    from test_swap import swap_config

    from bigbatch.engine.replicator import Replicator

    probe, held = Replicator.probe_step, []

    def probe_step(self, step_fn, micro, opt=None):  # which optimizers' gradients are held as each probe begins
        held.append([s.name for s in self.optimizers.values() if any(p.grad is not None for g in s.opt.param_groups
                                                                     for p in g["params"])])  # fmt: skip
        return probe(self, step_fn, micro, opt)

    monkeypatch.setattr(Replicator, "probe_step", probe_step)

    cfg = swap_config(*faces, **{"train.micro_batch": "auto", "train.memory_budget": "4GiB", "train.kimg": 0.004})
    (tmp_path / "c.toml").write_text(cfg.dumps())
    assert main(["train", "--dry-run", "--config", str(tmp_path / "c.toml")]) == 0
    floor = float(re.search(r"averages take ([\d.]+) MiB whatever", capsys.readouterr().out).group(1))
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    plan = (run / "plan.json").read_text()
    probes = [float(m) for m in re.findall(r'"peak_bytes": (\d+)', plan)]
    assert probes and floor * 2**20 < min(probes), (floor, plan)  # (a floor under what each probe measured)
    assert len(held) == 3 * len(probes) and not any(held), held  # (the autoencoder's and both discriminators')
