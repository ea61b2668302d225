"""A Replicator's own state in a checkpoint (its `state_dict` and `load_state_dict`), and what its first step after
a start or a resume says of it: BatchNorm statistics over fewer images than the step's, or over other ones than
before, and a script resumed at another batch."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.nn.modules.batchnorm import _BatchNorm

from bigbatch.engine import memory, running_stats
from bigbatch.engine.arguments import api_terms
from bigbatch.errors import BigbatchError, warn

COUNTS = ("skipped", "failed", "steps", "settled", "grown")  # an optimizer's counters kept


def state_of(rep: Any) -> dict[str, Any]:
    """Replicator.state_dict."""
    state: dict[str, Any] = {"optimizers": {}, "batch": rep.batch}
    for s in rep.optimizers.values():
        saved = {"scaler": s.scaler.state_dict(), "history": list(s.history)}
        state["optimizers"][s.name] = saved | {key: getattr(s, key) for key in COUNTS}
    if rep._plan is not None and running_stats.has_batchnorm(p for p, _ in rep.models):
        state["batchnorm_images"] = running_stats.span(rep.plan.micro_batch, rep.world_size, rep.sync_bn)
    if rep._auto and rep._plan is not None:
        state["plan"] = {
            "micro_batch": rep._planned_micro,
            "world_size": rep.world_size,
            "memory_budget_bytes": rep.budget,
            "precision": rep.precision,
            "checkpointing": bool(rep.checkpointing),
            "probes": [dataclasses.asdict(p) for p in rep.probes],
        }
    return state


def load_state(rep: Any, state: dict[str, Any]) -> None:
    """Replicator.load_state_dict."""
    if not isinstance(state, dict):
        raise BigbatchError(f"Replicator.load_state_dict takes what state_dict() returned, got {type(state).__name__}")
    # (older checkpoints held the optimizers alone, and a resume adds their plan)
    optimizers = state["optimizers"] if "optimizers" in state else {k: v for k, v in state.items() if k != "plan"}
    known = {"optimizers", "plan", "batchnorm_images", "batch"}
    if "optimizers" in state and set(state) - known:
        raise BigbatchError(f"Replicator state has unknown entries {sorted(set(state) - known)}")
    names = {s.name for s in rep.optimizers.values()}
    if optimizers and names - set(optimizers):  # (a state of more optimizers may restore some of them)
        raise BigbatchError(
            f"the Replicator state holds optimizers {sorted(optimizers)}, and this one has {sorted(names)} "
            "wrapped: wrap_optimizer each under the name it was saved with before loading"
        )
    for s in rep.optimizers.values():
        if s.name in optimizers:
            saved = optimizers[s.name]
            if saved["scaler"] and s.scaler.is_enabled():
                s.scaler.load_state_dict(saved["scaler"])
            s.history.clear()
            s.history.extend(bool(b) for b in saved["history"])
            s.skipped, s.steps = int(saved["skipped"]), int(saved["steps"])
            s.failed = int(saved.get("failed", sum(s.history)))  # (a checkpoint of before it: its window's)
            s.settled = float(saved.get("settled", 0.0))  # (a checkpoint of before it: none)
            s.grown = bool(saved.get("grown", True))  # (one of before it: its first fall taken as over)
    rep._batchnorm_before = state.get("batchnorm_images")
    rep._batch_before = state.get("batch") if not rep._config_terms else None  # (a run's config keeps its batch)
    plan, how = state.get("plan"), (rep.precision, bool(rep.checkpointing))
    speak = (str if rep._config_terms else api_terms) if rep.is_main else None  # (the API's names: from outside)
    if rep._auto and plan and memory.plan_holds(plan, rep.world_size, rep.memory_budget, speak, *how):
        rep.use_micro_batch(int(plan["micro_batch"]))
        rep.budget = plan["memory_budget_bytes"]
        rep.probes = [memory.Probe(**p) for p in plan["probes"]]


def first_step_notes(rep: Any) -> None:
    """At the first step of a start or a resume (its plan made): what its BatchNorm statistics span where a
    micro-batch set by hand spans fewer images than the step (found from outside: micro_batch 4 of a step's 256,
    unsaid), where a resume spans another number than before, and a batch other than the state loaded's."""
    if not rep._given_said:
        rep._given_said = True
        training = any(isinstance(m, _BatchNorm) and m.training for p, _ in rep.models for m in p.modules())
        if rep._batchnorm_before is None and training:  # (a resumed run was told at its start; a frozen BatchNorm,
            # in eval mode, takes no batch's statistics: found by review)
            micro = rep.plan.micro_batch
            how = (rep.world_size, rep.sync_bn, rep.share, f"train.micro_batch {micro}", False)
            rep._say_batchnorm(running_stats.span_small(micro, *how, given=True))
    if rep._batchnorm_before is not None:
        before, rep._batchnorm_before = rep._batchnorm_before, None
        micro = rep.plan.micro_batch
        rep._say_batchnorm(running_stats.span_changed(before, micro, rep.world_size, rep.sync_bn, rep.share))
    if rep._batch_before is not None:  # (found from outside: a script resumed at another batch, unsaid)
        before, rep._batch_before = rep._batch_before, None
        if before != rep.batch and rep.is_main:
            warn(
                f"batch {rep.batch}, {before} in the state loaded: the steps from here are not those the saved run "
                f"would have taken; give batch={before} to go on as it did"
            )
