"""What a resumed run may change of the config it was trained with (a checkpoint's, or its run's), and what it
says of the changes it takes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bigbatch.config import Config, EvalConfig, SampleConfig
from bigbatch.config_types import read_toml
from bigbatch.data.schedule import PHASES_REPLACE, schedule_of
from bigbatch.errors import BigbatchError, counted, warn

# What a resumed run may change: its length, its output and how it runs, never what it trains.
RESUMABLE_CHANGES = {
    "train.kimg",
    "train.micro_batch",
    "train.memory_budget",
    "train.checkpointing",
    "train.compile",
    "train.channels_last",
    "train.device",
    "train.deterministic",
    "train.log_every_kimg",
    "checkpoint.every_kimg",
    "checkpoint.every_minutes",
    "checkpoint.keep",
    *(f"sample.{f.name}" for f in dataclasses.fields(SampleConfig)),  # (previews: found from outside, refused)
    "data.path",  # the same images at another path (the content hash is checked)
    "data.dst_path",  # (the swap and xseg tasks' dst faces: the same, checked by the task)
    "data.workers",
    "data.in_ram",
    "data.storage_options",
    *(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)),
}
# ... and, said when changed (not in a sweep, whose runs keep their base's): what rescues a run that diverged,
# and the SAEHD options DFL asks again at each restart, which its users switch between sessions (random warp off
# late, then lr dropout); those that add or remove a discriminator are not among them.
_SAEHD_RECOVERY = ("random_warp", "lr_dropout", "lr", "src_flip", "dst_flip", "masked_training", "eyes_mouth_prio")
# G_ema's statistics averaged or copied (train.ema_buffers) train nothing: a run of before the key (copy) goes on
# with its BigGAN preset's average, said (found by review: refused its preset's --resume).
RECOVERY_CHANGES = {f"train.{k}" for k in ("precision", "grad_clip", "skip_limit", "skip_window", "ema_buffers")} | {
    f"swap.{k}" for k in (*_SAEHD_RECOVERY, "ct_mode", "random_hsv_power", "face_style_power", "bg_style_power",
                          "blur_out_mask", "uniform_yaw")
} | {"xseg.lr", "xseg.lr_dropout"}  # fmt: skip
POWERS = ("swap.gan_power", "swap.true_face_power")
POWERS_SAID = ", and swap.gan_power and swap.true_face_power from one value above 0 to another"


def as_begun(saved_config: Path, loaded: Config, saved: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """What of the given config yields to the run's own: train.train_bn given at its default (fastai's True) where
    the run froze without it (runs frozen before the key had none, and their checkpoints since carry false: found by
    review, refused at their second resume); and model.options as the run began where the given ones differ in
    `init` alone, which a resumed run does not use (found by review: a preset's run of before biggan_deep128 took
    init "none" was refused its own preset's --resume), or in SA-GAN's `shared`, which its checkpoint's weights
    decide (sagan128's runs of before it was an option shared one embedding, the preset now sets false), or in a
    ResNet's `input_stats` where the run began before it (finetune_resnet50's, fed [-1, 1], which the preset no more
    is); and the rates a classifier's data.schedule phases leave unread (train.lr, lr_steps, lr_gamma: found from
    outside, a job's `--preset imagenet_resnet50_fast --resume=auto` refused after an upgrade whose preset no longer
    set train.lr)."""
    raw, begun = read_toml(saved_config).get("train", {}), {}
    if loaded.task == "classify" and schedule_of(loaded).phases[0].lr is not None:
        unread = (f"train.{k}" for k in PHASES_REPLACE)
        begun |= {k: saved[k] for k in unread if given.get(k) != saved.get(k)}
    if saved.get("train.freeze_kimg", 0) > 0 and not raw.get("train_bn", False) and given.get("train.train_bn"):
        begun["train.train_bn"] = False
    old, new = saved.get("model.options") or {}, given.get("model.options") or {}
    begun_as = ("init", "shared") if saved.get("model.name") == "sagan" else ("init",)
    begun_as += ("input_stats",) if "input_stats" not in old else ()
    if old != new and {k: v for k, v in old.items() if k not in begun_as} == {
        k: v for k, v in new.items() if k not in begun_as
    }:
        begun["model.options"] = old
    return begun


def _compare(saved_config: Path, cfg: Config, recovery: bool) -> tuple[Config, dict, dict, list, set, list]:
    """(cfg as begun, the saved and given configs flattened, the keys changed, those a resume may change, those it
    may not) of a resume of the run saved with `saved_config` under `cfg`."""
    loaded = Config.load(saved_config)
    saved, given = flatten(loaded.to_dict()), flatten(cfg.to_dict())
    if begun := as_begun(saved_config, loaded, saved, given):  # (a key added since the run was saved: resumed as begun)
        cfg, given = cfg.override(begun), {**given, **begun}
        saved.update(begun)
    changed = [k for k in given if given[k] != saved.get(k)]
    allowed = RESUMABLE_CHANGES | (RECOVERY_CHANGES if recovery else set())
    # DFL asks a discriminator's power again at each restart (found from outside: refused here): its weight may
    # change, not whether there is one.
    allowed |= {k for k in POWERS if recovery and k in changed and saved.get(k) and given[k]}
    fixed = [k for k in changed if not any(k == r or k.startswith(r + ".") for r in allowed)]
    return cfg, saved, given, changed, allowed, fixed


def unresumable_changes(saved_config: Path, cfg: Config, recovery: bool = True) -> str:
    """What a resume of the run saved with `saved_config` under `cfg` may not change, as "key (old -> new), ...", or
    "" (a sweep's refusal of another base: found from outside, resume's advice ran past 1,000 characters)."""
    _, saved, given, _, _, fixed = _compare(saved_config, cfg, recovery)
    return _shown(fixed, saved, given)


def resume_changes(saved_config: Path, cfg: Config) -> dict[str, list]:
    """What a resume under `cfg` changes of the run saved with `saved_config`: {key: [before, after]} (keys added
    since it was saved taken as it began: found by review, an old run's every resume said one changed)."""
    _, saved, given, changed, _, _ = _compare(saved_config, cfg, True)
    return {k: [saved.get(k), given[k]] for k in sorted(changed)}


def _shown(fixed: list[str], saved: dict, given: dict) -> str:
    more = f" and {len(fixed) - 4} more" if len(fixed) > 4 else ""
    return ", ".join(f"{k} ({saved.get(k)!r} -> {given[k]!r})" for k in fixed[:4]) + more if fixed else ""


def resume_config(saved_config: Path, cfg: Config, what: str, recovery: bool = True) -> Config:
    """On resume the config must be the one `what` (a checkpoint, or a run without one) was trained
    with, `saved_config`; only the run length, output cadences and how it runs may change, and (`recovery`)
    the precision and what guards against divergence."""
    cfg, saved, given, changed, allowed, fixed = _compare(saved_config, cfg, recovery)
    if "task" in fixed:  # (found from outside: of a checkpoint copied in from another task's run, "drop the
        # override" was advised where none was given)
        was = f"{what} was trained as a {saved['task']} run"
        ckpts = saved_config.parent.parent  # (a checkpoint's config.toml: RUN/checkpoints/NAME/config.toml)
        if ckpts.name == "checkpoints" and _task_of(ckpts.parent / "config.toml") == given["task"]:  # (the run's)
            raise BigbatchError(f"{was}, and this run is a {given['task']} one: it was copied in from another run; "
                                "remove it from this run's checkpoints")  # fmt: skip
        raise BigbatchError(
            f"{was}, and the config given is a {given['task']} one: resume with the run's own (a bare --resume "
            "takes it; in Python, bigbatch.Config.load(RUN))"
        )
    if fixed:
        shown = _shown(fixed, saved, given)
        # (the face tasks' own sections named only for them: found from outside, a GAN's line ran past 1,000 chars)
        own = {"swap", "xseg"} - {cfg.task}
        listed = ", ".join(sorted(k for k in allowed - set(POWERS) if k.split(".", 1)[0] not in own))
        listed += POWERS_SAID if cfg.task == "swap" and recovery else ""
        raise BigbatchError(  # (the fix before the list of what may change: found from outside, after 1,500 chars)
            f"the config differs from the one {what} was trained with in {shown}: drop the override (or the "
            "--preset or --config that sets it: a bare --resume takes the run's own; in Python, "
            "bigbatch.Config.load(RUN) is it), or undo "
            "the edit of the run's config.toml (its checkpoints keep their own copy); to change that, start a new "
            f"run from this one's weights with train.init_from=RUN. A resumed run may change only {listed}"
        )
    if saving := [k for k in changed if k.startswith("checkpoint.")]:  # (found from outside: a job's --resume=auto with
        # its --preset took the preset's cadence, the run's timed checkpoints gone unsaid)
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {given[k]!r}" for k in saving)
        own = " ".join(f"{k}={saved.get(k)!r}" for k in saving)  # (found from outside: "come so" said nothing)
        warn(f"resuming with {shown}: the run saves and keeps its checkpoints so from here (give {own} for its own)",
             once=True)  # fmt: skip
    rescued = [k for k in changed if k in RECOVERY_CHANGES or k in POWERS]
    if rescued:
        shown = ", ".join(f"{k} {saved.get(k)!r} -> {given[k]!r}" for k in rescued)
        warn(f"resuming with {shown}: from here the run computes otherwise than it began", once=True)
    return cfg


def _task_of(config: Path) -> str | None:
    """The task a run's config.toml names (None: no such file, or one that does not read)."""
    try:
        return read_toml(config).get("task", Config.task)
    except BigbatchError:
        return None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and k != "options":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def say_sums_reordered(before: dict[str, Any], now: dict[str, Any]) -> None:
    """Where a resumed run sums its gradients in another order than its last start (plan.json's record `before`; `now`
    this start's), it goes on, but not bit for bit as the run would have: said, with how to keep the order."""
    threads, was = now.get("cpu_threads"), before.get("cpu_threads")
    if threads and isinstance(was, int) and was != threads:  # (found from outside: SAEHD's resume, silently not bit
        warn(  # for bit under another thread count)
            f"this process sums with {threads} CPU threads, the run's last start with {was}: it goes on, but not "
            f"bit for bit as the run would have (run it with OMP_NUM_THREADS={was} for that)"
        )
    ranks, was = now.get("world_size"), before.get("world_size")
    if not isinstance(was, int) or was == ranks:
        return
    # On a CPU the ranks' sums are added in rank order: the same as one process's while each rank sums one micro-batch
    # (found from outside: 2 processes x 2 micro-batches resumed as 1 x 4, its weights 5e-3 apart, unsaid).
    plans = ((ranks, now.get("accumulation", 1)), (was, before.get("accumulation", 1)))
    if not threads or any(n > 1 and k > 1 for n, k in plans):
        warn(
            f"this run has {counted(ranks, 'process')}, its last start {was}: it goes on, its "
            f"gradients summed in another order, so not bit for bit as the run would have (resume it on {was} for that)"
        )
