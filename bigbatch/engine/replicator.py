"""The large-batch engine, in the spirit of TF-Replicator: the user writes an input function and a step
function; the Replicator handles devices, DDP, precision, accumulation and memory planning.

    rep = bigbatch.Replicator(batch=2048, micro_batch="auto", precision="bf16")   # reads torchrun's env
    model = rep.prepare(model)
    opt = rep.wrap_optimizer(torch.optim.Adam(model.parameters()))
    for batch in rep.batches(input_fn):         # input_fn(ctx) yields this rank's share of each step
        loss = rep.step(step_fn, batch, opt)    # step_fn(micro) -> mean loss of the micro-batch

One optimizer step sees `batch` examples: `micro_batch x accumulation` on each of `world_size` ranks.
Each micro-batch loss is divided by the accumulation and DDP averages over ranks (on CPU: divided by
accumulation x world size, and the ranks' gradients added in rank order, so that k ranks x 1 micro-batch
equal 1 rank x k bit for bit), so the gradient is the gradient of the mean loss over the whole batch,
whatever the split. DDP reduces only on the last micro-batch. BatchNorm running statistics are replayed
after the micro-batches, every rank's in global order (running_stats.py). Before each micro-batch's
forward the engine calls `before_micro_batch(i)` on every submodule of a prepared model that defines it
(bigbatch's spectral-norm layers run their power iteration there, once per step), then the hooks
registered with `on_micro_batch` (for modules it did not prepare)."""

from __future__ import annotations

import gc
import itertools
import math
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from bigbatch.engine import (
    arguments,
    batch_parts,
    dist,
    frozen,
    memory,
    probing,
    rep_state,
    running_stats,
    saving,
    wrap,
)
from bigbatch.engine import precision as prec
from bigbatch.engine.arguments import api_terms, check_arguments, check_prepared, in_config_terms, skip_limit_reached
from bigbatch.engine.context import InputContext
from bigbatch.engine.plan import Plan, check_batch, make_plan
from bigbatch.errors import BigbatchError, warn


@dataclass
class _Optimizer:
    opt: torch.optim.Optimizer
    name: str
    scaler: torch.amp.GradScaler
    history: deque
    skipped: int = 0
    failed: int = 0  # skipped steps not fp16's settling (said at the 1st, 10th, 100th, ...)
    steps: int = 0
    last_skipped: bool = False
    settled: float = 0.0  # fp16: the loss scale an overflow last halved to (0: none yet)
    grown: bool = False  # fp16: the loss scale has grown past where an overflow left it (its first fall over)
    grad_norm: float = 0.0
    bn_not_finite: int = 0  # steps whose BatchNorm statistics were not finite (said at the 1st, 10th, 100th, ...)
    params: set[int] = field(default_factory=set)
    trained: list[nn.Module] = field(default_factory=list)  # prepared modules holding these params
    trained_of: int = -1  # len(Replicator.models) when `trained` was found


class Replicator:
    """Large-batch training on one process or many (torchrun), with exact accumulation.

    batch: examples per optimizer step over all ranks. micro_batch: examples per forward/backward
    on one rank, or "auto" (the largest that fits `memory_budget`, found by probing the first
    step). precision: "fp32", "bf16" or "fp16" (loss scaling, one GradScaler per optimizer).
    checkpointing: activation-checkpoint the blocks each model lists in `checkpoint_blocks`.
    compile: torch.compile each prepared model (True or a mode). channels_last: convolutions in NHWC order.
    sync_bn: BatchNorm statistics over the same micro-batch index on all ranks (else per rank).
    grad_clip: clip the global gradient norm to this (0: off). A step whose loss or gradients are not
    finite is skipped; more than `skip_limit` of the last `skip_window` steps (at least 5) skipped stops training."""

    def __init__(
        self,
        batch: int,
        micro_batch: int | str = "auto",
        precision: str = "fp32",
        *,
        device: str | torch.device = "auto",
        memory_budget: str | int | None = None,
        checkpointing: bool = False,
        compile: bool | str = False,
        channels_last: bool = False,
        sync_bn: bool = False,
        grad_clip: float = 0.0,
        skip_limit: float = 0.2,
        skip_window: int = 50,
    ):
        self._config_terms = in_config_terms()  # (errors name train.* keys: built by replicator_for)
        self.ctx = dist.context(device)
        prec.check(precision, self.ctx.device)
        if self.ctx.device.type == "cpu":  # a step's freed memory kept for the next (no page faults)
            memory.hold_freed_memory()
        batch = self._said(check_batch, batch, self.ctx.world_size)  # (in the Replicator's terms)
        args = (micro_batch, skip_limit, skip_window, grad_clip, sync_bn, channels_last, checkpointing, compile)
        micro_batch = check_arguments(*args)  # ("auto", or an int)
        self.batch, self.precision = batch, precision
        self.memory_budget = memory.budget_of(memory_budget, micro_batch, self._config_terms, self.ctx.rank)
        self.checkpointing, self.compile, self.sync_bn = checkpointing, compile, sync_bn
        self.channels_last, self._graph_grads = channels_last, set[int]()  # (the step's copies: wrap.new_micro_batch)
        self.grad_clip, self.skip_limit, self.skip_window = grad_clip, skip_limit, skip_window
        self._plan = None if micro_batch == "auto" else self._said(make_plan, batch, micro_batch, precision, self.ctx)
        self._auto = micro_batch == "auto"
        self._given_said = self._auto  # (a micro-batch set: what its BatchNorm statistics span, said at the 1st step)
        self._planned_micro = 0 if self._plan is None else micro_batch  # what set_batch keeps (as asked)
        self.probes, self.budget = list[memory.Probe](), None  # (micro_batch "auto": its probes and budget)
        self.takes_micro: Callable[[int], bool] = lambda m: True  # (the micro-batches "auto" may settle on)
        self.models: list[tuple[nn.Module, nn.Module]] = []  # (plain model, what to call)
        self._micro_hooks: list[Callable[[int], None]] = []
        # Submodules with before_micro_batch, by what runs them: their class's before_micro_batches, or their own.
        self._micro_modules: dict[Callable, list[nn.Module]] = {}
        self.optimizers: dict[int, _Optimizer] = {}
        self._held: list[nn.Parameter] = []  # frozen groups' parameters set not to require grad (frozen.py)
        self._synced: set[int] = set()  # parameters DDP averages: those requiring grad when it wrapped their model
        self._ran: set[int] = set()  # the DDP modules that ran a forward in the step (wrap.check_ran)
        self._bn_list, self._bn_of = list[nn.Module](), 0  # (the BatchNorms, found when there were _bn_of models)
        self._batchnorm_before: int | None = None  # images BatchNorm spanned before a resume (load_state_dict)
        self._batch_before: int | None = None  # the batch of the state a script loaded (said at the next step)
        self._owns_group = dist.init(self.ctx)

    def _said(self, fn: Callable[..., Any], *args: Any) -> Any:  # fn(*args), its errors in this Replicator's terms
        try:
            return fn(*args)
        except BigbatchError as e:
            if self._config_terms or type(e) is not BigbatchError:  # (a kind of its own: a step function's, kept)
                raise
            raise BigbatchError(api_terms(str(e))) from None

    # ---- where we run ------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def is_main(self) -> bool:
        return self.ctx.rank == 0

    @property
    def share(self) -> int:
        return self.batch // self.ctx.world_size

    @property
    def micro_batch_pending(self) -> bool:
        """micro_batch "auto" not yet settled (by plan_micro_batch, use_micro_batch or load_state_dict)."""
        return self._plan is None

    @property
    def planned_micro_batch(self) -> int:
        """The micro-batch asked for or planned ("auto"), which set_batch keeps where a batch allows (0: pending)."""
        return self._planned_micro

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            raise BigbatchError("micro_batch='auto' is decided at the first step (or by plan_micro_batch)")
        return self._plan

    def close(self) -> None:
        """Leave the process group if this Replicator held it, after releasing its DDP wrappers (models, optimizers'
        lists of them): a DDP reducer freed after its gloo group was destroyed frees the group itself, GIL held, and
        can deadlock with the group's worker thread. Frozen groups' parameters require grad again (frozen.py)."""
        frozen.thaw(self._held)
        if self._owns_group:
            for held in (self.models, self.optimizers, self._micro_hooks, self._micro_modules):
                held.clear()
            gc.collect()
        dist.close(self._owns_group)
        self._owns_group = False

    def __enter__(self) -> Replicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- models, optimizers, inputs ------------------------------------------------------------
    def prepare(
        self, model: nn.Module, checkpointing: bool | Iterable[str] | None = None, *, unused_parameters: bool = False
    ) -> nn.Module:
        """Place `model` on this rank's device (its convolution weights channels-last if the Replicator's
        `channels_last`) and wrap it (cross-rank BN → checkpointing → compile → DDP).

        Returns the module to call; the plain model is changed in place and stays what to save.
        `checkpointing` overrides the Replicator's setting for this model (True, False or block names).
        `unused_parameters`: some parameters may get no gradient in a step (a head the loss skips; DDP's
        find_unused_parameters, which costs a pass over the graph each step).
        Submodules that define `before_micro_batch(index)` are called before each micro-batch's forward:
        the protocol for state a training forward updates at a rate of its own (see `on_micro_batch`)."""
        if not isinstance(model, nn.Module):
            raise BigbatchError(f"prepare takes a torch.nn.Module, got {type(model).__name__}")
        wrapped = wrap.prepare(
            model,
            self.device,
            self.world_size,
            sync_bn=self.sync_bn,
            checkpointing=self.checkpointing if checkpointing is None else checkpointing,
            compile=self.compile,
            channels_last=self.channels_last,
            unused_parameters=unused_parameters,
        )
        self.models.append((model, wrapped))
        wrap.note_forwards(wrapped, self._ran)
        if isinstance(wrapped, nn.parallel.DistributedDataParallel):  # (found by review: one unfrozen after, unsynced)
            self._synced.update(id(p) for p in model.parameters() if p.requires_grad)
        known = {id(m) for modules in self._micro_modules.values() for m in modules}
        for m in model.modules():
            if callable(getattr(m, "before_micro_batch", None)) and id(m) not in known:
                self._micro_modules.setdefault(getattr(type(m), "before_micro_batches", _each), []).append(m)
        return wrapped

    def on_micro_batch(self, hook: Callable[[int], None]) -> None:
        """Call `hook(i)` before the forward of micro-batch i of every step (i = 0 for a probe): the place for state a
        model updates in training forwards at a rate of its own (spectral norm's power iteration once per step) when
        the model was not prepared by this Replicator; a prepared model's submodules declare it with a
        `before_micro_batch(i)` method (or their class's static `before_micro_batches(modules, i)`, all at once).
        Such updates must not repeat when a checkpointed block is recomputed in backward: run them here."""
        self._micro_hooks.append(hook)

    def _before_micro_batch(self, index: int) -> None:
        wrap.new_micro_batch(self.compile, self.device, (p for p, _ in self.models), index, self._graph_grads)
        for run, modules in self._micro_modules.items():
            run(modules, index)
        for hook in self._micro_hooks:
            hook(index)

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The plain model behind a prepared module."""
        if (plain := next((p for p, w in self.models if module is w or module is p), None)) is None:
            raise BigbatchError("this module was not prepared by this Replicator")
        return plain

    def wrap_optimizer(self, opt: torch.optim.Optimizer, name: str | None = None) -> torch.optim.Optimizer:
        """Register `opt` (its loss scaler and skip count); returns it unchanged, so its state_dict is the usual one."""
        arguments.check_optimizer(opt)
        prec.check_weights(opt, self.precision)
        params = {id(p) for g in opt.param_groups for p in g["params"]}
        taken = {s.name for key, s in self.optimizers.items() if key != id(opt)}
        if name in taken:  # its loss scaler and skip history would share one entry of state_dict()
            raise BigbatchError(f"an optimizer is already wrapped under the name {name!r}: give each its own")
        if name is None:
            name = next(f"opt{i}" for i in itertools.count(len(self.optimizers)) if f"opt{i}" not in taken)
        scaler = prec.grad_scaler(self.precision, self.device)
        self.optimizers[id(opt)] = _Optimizer(opt, name, scaler, deque(maxlen=self.skip_window), params=params)
        return opt

    def batches(self, input_fn: Callable[[InputContext], Iterable[Any]]) -> Iterator[Any]:
        """Iterate over `input_fn(ctx)`: each item is this rank's share of one step (tensor or tuple, dim 0)."""
        if not callable(input_fn):  # (found from outside: a list of batches given was a TypeError)
            raise BigbatchError(f"batches takes an input function (ctx -> its shares), got {type(input_fn).__name__}")
        shares = input_fn(InputContext(self))
        if shares is None:  # (found from outside: a generator's forgotten yield was "'NoneType' is not iterable")
            raise BigbatchError("the input function returned None: yield each step's share (or return an iterable)")
        steps, shares = 0, iter(shares)
        try:
            for share in shares:
                steps += 1
                yield share
        finally:  # (closed with this one, as `yield from` would: its own `finally` runs now, not at collection)
            if isinstance(shares, types.GeneratorType):
                shares.close()
        if not steps and self.is_main:  # (found from outside: 0 steps, unsaid, then the script's NameError)
            warn(
                f"the input function yielded no step's share (batch {self.batch}): nothing trained (a data set "
                "smaller than the batch yields none from range(0, len(X) - ctx.batch + 1, ctx.batch); a resume past "
                "its last step, none either)"
            )

    # ---- one optimizer step --------------------------------------------------------------------
    def step(self, step_fn: Callable[[Any], Any], batch: Any, opt: torch.optim.Optimizer) -> Any:
        """Run `step_fn` on each micro-batch of this rank's share `batch`, accumulate, sync once, step.

        `step_fn(micro)` returns the mean loss over the micro-batch, or a dict with "loss" and other scalars to
        average. Returns the step's mean loss over all ranks as a float (or the dict of means). If the loss or
        gradients are not finite the step is skipped (`skipped(opt)` says so). A param group with "frozen" true
        takes no part (fine-tuning's frozen body): no step, no moments, not in the norm or clip, and in one process
        no gradient computed (frozen.py)."""
        with dist.peers_said(not self._config_terms):
            return self._step(step_fn, batch, opt)

    def _step(self, step_fn: Callable[[Any], Any], batch: Any, opt: torch.optim.Optimizer) -> Any:
        state = self._state(opt)
        if self._plan is None:
            self._check_share(batch)  # (before probing: a bad batch is one line, not a probe's traceback)
            self.plan_micro_batch(lambda m: self.probe_step(step_fn, batch_parts.cut(batch, 0, m), opt), [opt])
        frozen.hold(opt, self._held, everything=self.world_size > 1)
        plan = self.plan
        rep_state.first_step_notes(self)
        micros = self.split(batch)
        opt.zero_grad(set_to_none=True)  # only this step's micro-batches count
        if state.trained_of != len(self.models):
            state.trained = [w for p, w in self.models if any(id(q) in state.params for q in p.parameters())]
            state.trained_of = len(self.models)
            prepared = {id(q) for p, _ in self.models for q in p.parameters()}
            check_prepared(state.name, state.params, prepared, self.world_size, self._synced)
        totals: torch.Tensor | None = None
        keys: list[str] = []
        # In rank order (CPU): each rank scales by the whole step's micro-batches, the sums are plain ones.
        in_order = self.world_size > 1 and wrap.sums_in_rank_order(self.device)
        divisor = plan.accumulation * (self.world_size if in_order else 1)
        bn = running_stats.StepStatistics(self._bns(), across_ranks=self.sync_bn)
        rng = saving.rng_state(self.device, torch_only=True)  # (put back if the step is abandoned)
        self._ran.clear()
        try:
            for i, micro in enumerate(micros):
                bn.micro_batch()
                self._before_micro_batch(i)
                with self.no_sync(keep=state.trained if i == len(micros) - 1 else ()):
                    with prec.autocast(self.precision, self.device), batch_parts.stepped_by_rep(opt):
                        out = batch_parts.call(step_fn, batch_parts.to_device(micro, self.device))
                    loss, stats = batch_parts.unpack(out)
                    if i == 0:
                        batch_parts.check_no_gradients(opt)
                    batch_parts.backward(state.scaler.scale(loss / divisor))
                keys = ["loss", *stats]
                extra = (
                    torch.as_tensor(v).to(loss.device, non_blocking=True).detach().float().reshape(())
                    for v in stats.values()
                )
                values = torch.stack([loss.detach(), *extra]) / divisor
                totals = values if totals is None else totals + values
            if self.world_size > 1:
                wrap.check_ran(state.name, state.trained, self._ran)
            totals = dist.sum_in_rank_order(totals) if in_order else dist.mean(totals)
            frozen.drop_grads(opt)  # (under DDP, which computed them: no step, no moments, not in the norm or clip)
            if state.scaler.is_enabled():
                state.scaler.unscale_(opt)
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            if not params:
                raise BigbatchError(
                    f"{state.name} has no gradients after the step function: its loss does not depend on the "
                    "parameters it optimizes (or they do not require grad, or their param groups are all frozen)"
                )
            norm = get_total_norm([p.grad for p in params])
            # What the host decides by, read from the device at once (on a GPU, each read waits for its queue):
            # the means, the gradient norm, and whether the BatchNorm updates were finite and how often each ran.
            read = torch.cat([totals.double(), norm.double().reshape(1), *bn.close()]).tolist()
            means, state.grad_norm = read[: len(totals)], read[len(totals)]
            # (all-reduced gradients, the step's mean loss: every rank agrees.) A loss that is not finite (an fp16
            # forward that overflowed) skips the step even when its gradients happen to be finite.
            applied = self._apply(opt, state, params, norm, math.isfinite(means[0]))
        except BaseException as e:  # the step abandoned: statistics and torch's RNGs as before it (found from outside:
            # Dropout's moved on), after a Ctrl-C fp16's scaler ready (torch's, after unscale_, refused all later steps)
            bn.abandon()
            saving.restore_rng(rng, self.device)
            state.scaler = state.scaler if isinstance(e, Exception) else prec.fresh_scaler(state.scaler, self.device)
            if isinstance(e, RuntimeError) and "Expected to have finished reduction" in str(e):
                raise wrap.unused_parameters_error(str(e)) from e  # (DDP's, naming its own find_unused_parameters)
            raise
        if applied and not bn.end(read[len(totals) + 1 :]):  # (every micro-batch's BatchNorm updates, in global order)
            state.bn_not_finite += 1  # (found from outside: a run gone bad said it at every step, its output flooded)
            running_stats.say_not_finite(state.name, state.steps, state.bn_not_finite, self.is_main)
        elif not applied:  # a skipped step leaves the running statistics as they were (its forward may overflow)
            bn.abandon()
            self._skipped(state)
        return dict(zip(keys, means)) if isinstance(out, dict) else means[0]

    def _bns(self) -> list[nn.Module]:
        """The BatchNorms of the prepared models whose running statistics each step replays in order."""
        if self._bn_of != len(self.models):
            self._bn_list, self._bn_of = running_stats.captured(p for p, _ in self.models), len(self.models)
        return self._bn_list

    def split(self, batch: Any) -> list[Any]:
        """This rank's share -> its micro-batches (slices along dim 0 of every tensor)."""
        plan = self.plan
        self._check_share(batch)
        m = plan.micro_batch
        return [batch_parts.cut(batch, j * m, (j + 1) * m) for j in range(plan.accumulation)]

    def _check_share(self, batch: Any) -> None:
        def listed() -> str:  # (found from outside: a list of examples, read as its fields, was "got 1", or "a 0-d
            if isinstance(batch, list) and len(batch) == self.share > 1:  # tensor" of (x, y) pairs)
                return f": a list of {self.share} is read as a batch's fields; torch.stack its examples into tensors"
            return ""

        try:
            n = batch_parts.length(batch)
        except BigbatchError as e:
            if not listed():
                raise
            raise BigbatchError(f"{e}{listed()}") from None
        if n != self.share:
            said = f"a step's batch on this rank must hold batch / world_size = {self.share} examples, got {n}"
            raise BigbatchError(said + listed())

    def no_sync(self, keep: Iterable[nn.Module] = ()) -> ExitStack:
        """Suspend DDP's gradient all-reduce on every prepared DDP module except those in `keep`."""
        stack = ExitStack()
        keep_ids = {id(k) for k in keep}
        for _, wrapped in self.models:
            if isinstance(wrapped, nn.parallel.DistributedDataParallel) and id(wrapped) not in keep_ids:
                stack.enter_context(wrapped.no_sync())
        return stack

    def average_running_stats(self, model: nn.Module) -> None:
        """Average over ranks the BatchNorm statistics `step` does not replay (running_stats.average_the_rest)."""
        running_stats.average_the_rest(self.unwrap(model), replayed=self._bns())

    def _state(self, opt: torch.optim.Optimizer) -> _Optimizer:
        try:
            return self.optimizers[id(opt)]
        except KeyError:
            raise BigbatchError("pass the optimizer through rep.wrap_optimizer(opt) before rep.step") from None

    def _apply(self, opt: torch.optim.Optimizer, state: _Optimizer, params: list, norm: Any, loss_finite: bool) -> bool:
        """Check, clip and apply the accumulated (unscaled) gradients of `params`, whose global norm is `norm`
        (state.grad_norm on the host), then free them; whether they and the loss were finite (and applied)."""
        finite = math.isfinite(state.grad_norm) and loss_finite
        if finite:
            if self.grad_clip > 0:
                clip_grads_with_norm_(params, self.grad_clip, norm)
            opt.step()
        # fp16's scaler starts at 2^16, halves on each overflow and doubles after 2000 steps applied: a finite loss's
        # overflow before any step applied, in the scale's first fall above SETTLING_FLOOR (StyleGAN2's path length
        # steps overflow between others that do not: found from outside), or at a scale grown since the last, is it
        # settling, not counted towards skip_limit (found from outside and by review: runs gone bad skipped 16
        # unsaid). The scale read for a skipped step alone: get_scale() waits for the device (by review).
        scale = state.scaler.get_scale() if state.scaler.is_enabled() and not finite else 0.0
        grown = state.steps == state.skipped or scale > state.settled  # (nothing applied yet, or grown since)
        state.grown |= scale > prec.SCALE_START or (bool(state.settled) and scale > state.settled)
        falling = not state.grown and scale > prec.SETTLING_FLOOR
        settling = not finite and loss_finite and (falling or scale > 1.0 and grown)
        if state.scaler.is_enabled():
            state.scaler.update()
            if not finite:
                state.settled = state.scaler.get_scale()
        opt.zero_grad(set_to_none=True)
        state.steps += 1
        state.last_skipped = not finite
        state.history.append(not finite and not settling)
        return finite

    def _skipped(self, state: _Optimizer) -> None:
        """Count and report a skipped step; stop training past the skip limit."""
        state.skipped += 1
        state.failed += state.history[-1]
        scale = f"; fp16 loss scale now {state.scaler.get_scale():g}" if state.scaler.is_enabled() else ""
        so_far = f" ({state.failed} skipped so far)" if state.failed > 1 else ""
        said = f"{state.name} step {state.steps} skipped: its loss or gradients are not finite{scale}{so_far}"
        # fp16's scale settling said once (found from outside: a line a halving); the others at the 1st, 10th, 100th,
        # ... (found from outside: 31 lines in 1 kimg of a run that skipped its steps)
        if self.is_main and (not state.history[-1] or str(state.failed).strip("0") == "1"):
            warn(prec.SETTLING.format(state.name) if not state.history[-1] else said, once=not state.history[-1])
        # Over the last skip_window steps, or the steps so far while fewer (at least 5 counted): a short run too.
        recent = sum(state.history)
        if recent > self.skip_limit * max(len(state.history), min(5, self.skip_window)):
            raise skip_limit_reached(state, recent, self.skip_limit, self._config_terms, self.grad_clip > 0)

    def skipped(self, opt: torch.optim.Optimizer) -> bool:
        """Whether the last step of `opt` was skipped for non-finite gradients."""
        return self._state(opt).last_skipped

    def grad_norm(self, opt: torch.optim.Optimizer) -> float:
        """The global gradient norm of the last step of `opt` (before clipping; not finite if skipped)."""
        return self._state(opt).grad_norm

    def steps(self, opt: torch.optim.Optimizer) -> int:
        """The steps of `opt` so far, skipped ones included (resumed with the engine's state)."""
        return self._state(opt).steps

    # ---- memory planning -----------------------------------------------------------------------
    def plan_micro_batch(
        self, probe: Callable[[int], None], optimizers: Iterable | None = None, resident: Iterable[nn.Module] = ()
    ) -> Plan:
        """Resolve micro_batch="auto": the largest divisor of this rank's share that `takes_micro` and whose `probe(m)`
        (one forward and backward at m) fits the memory budget. Buffers, RNG and gradients are restored after probing,
        so planning changes nothing that training sees. `optimizers`: those whose gradients the probe leaves (default:
        every registered one); `resident`: models held and not trained (G_ema), counted with the prepared ones."""
        return self._said(self._plan_micro_batch, probe, optimizers, list(resident))

    def _plan_micro_batch(self, probe: Callable[[int], None], optimizers: Iterable | None, resident: list) -> Plan:
        optimizers = [s.opt for s in self.optimizers.values()] if optimizers is None else list(optimizers)
        micro, self.probes, budget = probing.fit(self, probe, optimizers, resident)
        self.budget = budget
        self._plan = make_plan(self.batch, micro, self.precision, self.ctx)
        self._planned_micro = micro
        planned = f"micro_batch 'auto' planned {micro} in {memory.format_bytes(budget)}"
        how = (self.world_size, self.sync_bn, self.share)
        self._say_batchnorm(running_stats.span_small(micro, *how, planned, bool(self.checkpointing)))
        return self._plan

    def use_micro_batch(self, micro_batch: int) -> Plan:
        """Settle micro_batch="auto" on a known value (a resumed run's; a batch it does not divide: as set_batch)."""
        self._planned_micro = micro_batch
        return self._replan(self.batch)

    def set_batch(self, batch: int) -> Plan | None:
        """Change the examples per optimizer step mid-run (a dynamic-batch schedule) without a restart.

        The micro-batch stays, so memory use and BatchNorm statistics do not change, and the accumulation follows
        the batch. With micro_batch "auto", a share it does not divide takes the largest divisor below the planned
        micro-batch (which fits, being smaller), and a later batch it divides again returns to it. With a fixed
        micro_batch, a share below it is one micro-batch, and a larger share must be a multiple of it."""
        batch = self._said(check_batch, batch, self.world_size)
        if self._plan is None:  # "auto" not yet planned: the first step plans for this batch
            self.batch = batch
            return None
        return self._replan(batch)

    def _replan(self, batch: int) -> Plan:
        micro, share = self._planned_micro, batch // self.world_size
        if self._auto and share % micro:
            micro = max(d for d in range(1, micro + 1) if share % d == 0 and (d == 1 or self.takes_micro(d)))
        # (a fixed one above the share: the share)
        self._plan = self._said(make_plan, batch, micro, self.precision, self.ctx)
        self.batch = batch
        return self._plan

    def probe_step(self, step_fn: Callable[[Any], Any], micro: Any, opt: torch.optim.Optimizer | None = None) -> None:
        """One forward and backward of `step_fn` on `micro`, no DDP sync, no optimizer step (what `plan_micro_batch`
        measures; `opt`'s step and gradients of its own refused as rep.step does). Leaves gradients: the caller's."""
        self._before_micro_batch(0)
        with self.no_sync():
            with prec.autocast(self.precision, self.device), batch_parts.stepped_by_rep(opt):
                loss, _ = batch_parts.unpack(batch_parts.call(step_fn, batch_parts.to_device(micro, self.device)))
            if opt is not None:  # (found by review: the probe met them first)
                batch_parts.check_no_gradients(opt)
            batch_parts.backward(loss)

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str | Path, **objects: Any) -> Path:
        """Write a checkpoint folder at `path` (on every rank; the main process writes): models (prepared or not;
        safetensors), optimizers, schedulers, plain values (a step count, ...), this engine's state and the RNG."""
        return saving.save(self, path, objects)

    def load(self, path: str | Path, **objects: Any) -> dict[str, Any]:
        """Restore what `save` wrote into the models, optimizers and schedulers given by the same names (every
        rank); return the plain values saved. A step later is the step the saving run took then, bit for bit."""
        return saving.load(self, path, objects)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs: loss scalers and skip histories by optimizer name, the batch, and the plan
        micro_batch "auto" settled on (a resumed run keeps it: free memory varies, BN statistics must not)."""
        return rep_state.state_of(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s state (optimizers registered under the same names). The plan of
        micro_batch "auto" is taken when this Replicator is "auto" too, on as many processes."""
        rep_state.load_state(self, state)

    def _say_batchnorm(self, said: str | None) -> None:
        """What running_stats `said` of the BatchNorms' statistics, where the models have any (rank 0)."""
        if said and self.is_main and running_stats.has_batchnorm(p for p, _ in self.models):
            warn(said if self._config_terms else api_terms(said))

    def counters(self) -> dict[str, Any]:
        """Per optimizer: steps taken, steps skipped, last gradient norm, fp16 loss scale."""
        out: dict[str, Any] = {}
        for s in self.optimizers.values():
            out[s.name] = {"steps": s.steps, "skipped": s.skipped, "failed": s.failed, "grad_norm": s.grad_norm}
            if s.scaler.is_enabled():
                out[s.name]["loss_scale"] = s.scaler.get_scale()
        return out


def _each(modules: list[nn.Module], index: int) -> None:
    for m in modules:
        m.before_micro_batch(index)
