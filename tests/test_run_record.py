"""RUN/plan.json across resumes: the phases begun before the checkpoint kept, and what each resume changed."""

import json

import bigbatch


def test_plan_json_keeps_the_phases_before_a_resume_and_says_what_it_changed(tiny, tmp_path):
    # Found from outside: a resume rewrote plan.json (its earlier phases dropped, the phase resumed inside dated to
    # the resume), and config.toml and plan.json said a precision changed on resume as if the run had had it
    # throughout.
    cfg = tiny.override({"train.kimg": 0.128, "data.schedule": "0:16:32,0.032:16:48", "checkpoint.every_kimg": 0.032})
    straight = bigbatch.train(cfg, run_dir=tmp_path / "straight", quiet=True)
    phases = json.loads((straight / "plan.json").read_text())["phases"]
    assert [(p["from_kimg"], p["batch"]) for p in phases] == [(0.032, 48)]  # (a later phase, from where it began)
    stopped = bigbatch.train(cfg.override({"train.kimg": 0.08}), run_dir=tmp_path / "r", quiet=True)
    bigbatch.train(cfg.override({"train.precision": "bf16"}), run_dir=stopped, resume=True, quiet=True)
    record = json.loads((stopped / "plan.json").read_text())
    assert record["phases"] == phases and record["precision"] == "bf16"
    assert record["resumes"] == [
        {"at_kimg": 0.08, "changed": {"train.kimg": [0.08, 0.128], "train.precision": ["fp32", "bf16"]}}
    ]
    bigbatch.train(cfg.override({"train.kimg": 0.16}), run_dir=stopped, resume=True, quiet=True)  # (and again)
    resumes = json.loads((stopped / "plan.json").read_text())["resumes"]
    assert [r["at_kimg"] for r in resumes] == [0.08, 0.128] and resumes[1]["changed"]["train.precision"][1] == "fp32"
    # A micro-batch "auto" settled otherwise on resume (another budget): the split it trained by, kept (found from
    # outside: plan.json held the last alone, which README says to give to reproduce a BatchNorm network's run); with
    # a schedule, the phase resumed inside is recorded again with it.
    auto = {"train.micro_batch": "auto", "train.memory_budget": "5MiB"}
    bigbatch.train(cfg.override({**auto, "train.kimg": 0.224}), run_dir=stopped, resume=True, quiet=True)
    record = json.loads((stopped / "plan.json").read_text())
    assert "micro_batch" not in record["resumes"][-1]["changed"] and record["phases"][-1]["micro_batch"] != 16
    single = tiny.override({"train.kimg": 0.064, "checkpoint.every_kimg": 0.032})
    run = bigbatch.train(single, run_dir=tmp_path / "single", quiet=True)
    bigbatch.train(single.override({**auto, "train.kimg": 0.128}), run_dir=run, resume=True, quiet=True)
    (resumed,) = json.loads((run / "plan.json").read_text())["resumes"]
    assert resumed["changed"]["micro_batch"][0] == 16 and resumed["changed"]["train.micro_batch"] == [16, "auto"]


def test_a_later_phase_of_the_same_split_is_recorded_too(tmp_path):
    # Found by review: phases told apart by their split alone, one that changed the rate alone went unrecorded.
    from test_classify import tiny as tiny_classifier

    lr = "0:16:32:0.1:0.1,0.032:16:32:0.05:0.05,0.064:16:32:0.02:0.02"
    over = {"data.schedule": lr, "train.kimg": 0.096, "train.warmup_kimg": 0}
    run = bigbatch.train(tiny_classifier(**over, **{"train.lr_decay": "none"}), run_dir=tmp_path / "r", quiet=True)
    phases = json.loads((run / "plan.json").read_text())["phases"]
    assert [(p["from_kimg"], p["batch"]) for p in phases] == [(0.032, 32), (0.064, 32)]
