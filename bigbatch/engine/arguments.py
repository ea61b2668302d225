"""The Replicator's arguments checked, and its errors worded for whoever built it: `bigbatch train` (the config's
keys, a run to resume) or a user's own loop (the Replicator's own arguments, Replicator.save and load)."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import numbers
from collections.abc import Iterator
from typing import Any

import torch

from bigbatch.engine import wrap
from bigbatch.errors import BigbatchError, whole_number

# Set while replicator_for builds a Replicator from a config: its errors name the config's keys (train.micro_batch);
# a Replicator a user builds is told of in its own arguments' names (micro_batch=).
_CONFIG_TERMS = contextvars.ContextVar("bigbatch_config_terms", default=False)
# The config's words for the Replicator's arguments, and what a user of the Replicator has not (a run to resume).
API_TERMS = (
    (" (a resumed run keeps its batch)", ""),
    ("train.precision=bf16", 'precision="bf16"'),
    *((f"train.{k}", k) for k in ("micro_batch", "batch", "memory_budget", "grad_clip", "checkpointing", "sync_bn")),
)


@contextlib.contextmanager
def config_terms() -> Iterator[None]:
    """Replicators built inside name the config's keys in their errors."""
    token = _CONFIG_TERMS.set(True)
    try:
        yield
    finally:
        _CONFIG_TERMS.reset(token)


def in_config_terms() -> bool:
    """Whether a Replicator built now is built from a config (inside config_terms)."""
    return _CONFIG_TERMS.get()


def api_terms(text: str) -> str:
    """An engine error as a user of the Replicator reads it: its arguments' names for the config's keys."""
    for word, instead in API_TERMS:
        text = text.replace(word, instead)
    return text


def check_arguments(
    micro_batch: Any,
    skip_limit: Any,
    skip_window: Any,
    grad_clip: Any,
    sync_bn: Any,
    channels_last: Any,
    checkpointing: Any,
    compile: Any,
) -> int | str:
    """The Replicator's arguments of these kinds, one line for the first that is not; the micro-batch ("auto", or
    an int: NumPy's and torch's integers taken too)."""
    if micro_batch != "auto":
        try:
            micro_batch = whole_number("micro_batch", micro_batch, 1)
        except BigbatchError:
            raise BigbatchError(f"micro_batch must be a positive integer or 'auto', got {micro_batch!r}") from None
    given = isinstance(skip_limit, (int, float)) and not isinstance(skip_limit, bool)
    window = isinstance(skip_window, numbers.Integral) and not isinstance(skip_window, bool)  # (from outside: 2.5,
    if not (given and window and 0 <= skip_limit <= 1 and skip_window >= 1):  # then deque's TypeError)
        raise BigbatchError(
            f"skip_limit must be in [0, 1] and skip_window a whole number >= 1, got {skip_limit!r} and {skip_window!r}"
        )
    if isinstance(grad_clip, bool) or not isinstance(grad_clip, (int, float)) or not grad_clip >= 0:
        raise BigbatchError(f"grad_clip must be a global gradient norm >= 0 (0: off), got {grad_clip!r}")
    for flag, value in (("sync_bn", sync_bn), ("channels_last", channels_last)):
        if not isinstance(value, bool):
            raise BigbatchError(f"{flag} must be True or False, got {value!r}")
    wrap.check_checkpointing(checkpointing)
    if not (isinstance(compile, bool) or compile in wrap.COMPILE_MODES):
        raise BigbatchError(f"compile must be True, False or one of {', '.join(wrap.COMPILE_MODES)}, got {compile!r}")
    return micro_batch


def check_optimizer(opt: Any) -> None:
    """What rep.wrap_optimizer takes: an optimizer that steps once on the gradients rep.step accumulated, not one that
    evaluates the loss again through a closure (found from outside: LBFGS was torch's "missing closure" traceback)."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise BigbatchError(f"wrap_optimizer takes a torch.optim.Optimizer, got {type(opt).__name__}")
    closure = inspect.signature(opt.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise BigbatchError(
            f"{type(opt).__name__} steps through a closure that evaluates the loss again; rep.step takes optimizers "
            "that step once on the accumulated gradients (SGD, Adam, ...)"
        )


def check_prepared(name: str, params: set[int], prepared: set[int], world_size: int, synced: set[int]) -> None:
    """Under several processes, an optimizer (`name`, the ids of its `params`) whose parameters some are of no
    prepared model (`prepared`), or of one prepared with none of them trained (not DDP-wrapped: not in `synced`),
    is refused: their gradients would not be averaged (found from outside: each rank trained weights of its own,
    the averaged loss looking as ever)."""
    if world_size > 1 and params - prepared:
        raise BigbatchError(
            f"{name} updates parameters of no model prepared by this Replicator: under {world_size} processes their "
            "gradients would not be averaged, and each process would train weights of its own; call "
            "rep.prepare(model) on the model holding them, and call what it returns"
        )
    if world_size > 1 and params - synced:
        raise BigbatchError(
            f"{name} updates parameters that did not require grad when rep.prepare took their model (DDP averages "
            f"only those that did): under {world_size} processes their gradients would not be averaged; prepare the "
            "model once its parameters require grad"
        )


class SkipLimitReached(BigbatchError):
    """Training stopped past train.skip_limit; `unsaved`: the message for a run that saved no checkpoint yet."""

    def __init__(self, message: str, unsaved: str = ""):
        super().__init__(message)
        self.unsaved = unsaved or message


def skip_limit_reached(
    state: Any, recent: int, skip_limit: float, config_terms: bool, clipped: bool = False
) -> SkipLimitReached:
    """What stopped training: more than `skip_limit` of an optimizer's recent steps (`state`: its count, history and
    loss scaler) skipped for a non-finite loss or gradients, and what to do (`clipped`: gradients were clipped
    already, which it does not advise again: found from outside)."""
    # (fp16's skips while its scale settles are not counted: all are said, lest "5 of 21" read as 16 good)
    also = f"; {state.skipped} of its {state.steps} skipped in all" if state.skipped > recent else ""
    # (whose: found from outside, "its first weights" said of G's where D's first step had been taken)
    first = state.skipped >= state.steps
    weights = f"{state.name}'s first weights" if first else f"{state.name}'s weights of its last good step"
    said = (
        f"{recent} of the last {len(state.history)} {state.name} steps had a non-finite loss or gradients and were "
        f"skipped (more than skip_limit={skip_limit:g} of them{also}); training stopped with {weights}"
    )
    fp16 = state.scaler.is_enabled()
    if not config_terms:  # (a user's own loop: no run, no checkpoint, no config keys)
        ways = (
            ['precision="bf16" (in place of fp16)'] * fp16 + ["grad_clip"] * (not clipped) + ["a lower learning rate"]
        )
        what = ", or ".join([", ".join(ways[:-1]), ways[-1]] if len(ways) > 1 else ways)
        return SkipLimitReached(
            f"{said}: give the Replicator {what}, and go on from weights saved before the trouble (Replicator.save "
            "and load)"
        )
    ways = ["train.precision=bf16 (in place of fp16)"] * fp16 + ["train.grad_clip set"] * (not clipped)
    what = " or ".join(ways)
    resume = f"Resume it with {what} (a resume may change them), or start" if ways else "Start"
    return SkipLimitReached(
        f"{said} and the last checkpoint intact. {resume} a new run from a checkpoint before the trouble at a lower "
        "learning rate (train.init_from=RUN/checkpoints/NAME)",
        f"{said}, before its first checkpoint: start it again in another --run-dir (this one keeps its config) "
        + (f"with {what}, or " if ways else "")
        + "at a lower learning rate",  # (found from outside: a checkpoint was said to be intact where none was
        # written; and its run dir, which refused the new config, was not said to be in the way)
    )
