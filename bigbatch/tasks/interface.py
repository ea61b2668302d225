"""The task interface: what the training loop sees of what it trains (a GAN today; a classifier and an
autoencoder next). The loop never branches on the task.

A task is registered by name (`@register("gan")`, `Config.task`) and built by `build_task(cfg, rep, data)`
from the config, the data set and the Replicator; the loop, the benchmarks and the tests all build it
that way. Once built, a task

- owns its models, optimizers and averages (the GAN's G, D, G_ema, opt_G, opt_D), prepared and
  registered with the Replicator, which runs every optimizer step (accumulation, precision, DDP);
- `step(feed) -> {name: float}` runs one iteration (`steps` counts them, checkpointed with the task),
  taking this rank's share of each step's real images from the `Feed` (which follows data.schedule);
  the loop counts progress by what the feed handed out, so the images an iteration consumes are what
  it took (a GAN with d_steps=2: two batches);
- gives and takes its checkpoint state: `nets()` (plain modules, saved as safetensors, in a fixed
  order) and `state_dict()`/`load_state_dict()` (optimizer moments and counters, saved through
  torch.save and read with weights_only=True); `model_info()` is what meta.json records so that the
  nets can be rebuilt without the data (class count, channels, class names);
- `probe(m)` runs one forward and backward of every optimizer's loss at micro-batch m, for
  micro_batch="auto" (Replicator.plan_micro_batch);
- `previews(at_checkpoint)` draws its pictures ({file prefix: image}, e.g. a GAN's sample grid, and
  at checkpoints its class and interpolation sheets), written by the loop under RUN/samples/;
- `batch_sheet(nimg)` draws the first images of the step at `nimg` exactly as its models receive
  them (after the loader's crops and flips and the task's own augmentation), labelled; the loop writes
  it as RUN/samples/batch-*.png when a run starts and when each data.schedule phase begins, and
  `bigbatch show-batch` draws it without training (`peek` reads those images as the Feed would);
- `scorer` scores it during training (FID/IS/KID for a GAN), or is None when eval.every_kimg is 0;
- optionally, for `bigbatch lr-find` (bigbatch.lr_find): `lr_key` (the config key of its rate),
  `set_lr(rate)` (hold that rate for the steps that follow) and `range_loss` (the logged losses whose
  sum the range test follows);
- `usage` says what to do with the finished run ("Sample with: bigbatch sample {run}").

To add a task: write a module under bigbatch/tasks/ with a class that does the above and a builder
decorated with `@register("name")` (its `check` of any config read, its `new_run` check of a new run's alone),
import it in bigbatch/tasks/__init__.py, and give it config keys.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from PIL import Image
from torch import nn

from bigbatch import models
from bigbatch.config import Config, register_check
from bigbatch.data import Batch, BatchLoader, Phase, RankSampler, Schedule, device_decode
from bigbatch.data.loader import Order, Step, read_batch
from bigbatch.data.streams import ORDER, ORDER_B, GlobalOrder
from bigbatch.engine.determinism import seed_micro_batches
from bigbatch.engine.replicator import Replicator
from bigbatch.errors import BigbatchError, warn


class Scorer(Protocol):
    """Scores a task during training and tracks the best value (restored from RUN/checkpoints/best/)."""

    def __call__(self) -> dict[str, float]: ...

    def improved(self, scores: dict[str, float]) -> bool:
        """Whether `scores` beat the best so far (and then become it)."""
        ...

    def best_record(self) -> dict[str, Any]:
        """What meta.json of checkpoints/best/ records of the best score and the settings it was taken with."""
        ...


class Task(Protocol):
    scorer: Scorer | None
    steps: int
    usage: str  # what to do with a finished run, said when it ends; "{run}" stands for the run directory

    def step(self, feed: Feed) -> dict[str, float]: ...

    def nets(self) -> dict[str, nn.Module]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def model_info(self) -> dict[str, Any]: ...

    def probe(self, micro_batch: int) -> None: ...

    def previews(self, at_checkpoint: bool) -> dict[str, Image.Image]: ...

    def batch_sheet(self, nimg: int) -> Image.Image: ...


BATCH_SHEET = 32  # images a batch sheet shows (the step's first ones)


def peek(
    data: Any, schedule: Schedule, cfg: Config, nimg: int, n: int, stream: int = ORDER, xflip: bool | None = None,
    crop_scale: float = 0.0, order: Order | None = None,
) -> Batch:  # fmt: skip
    """The images at global positions nimg .. nimg + n - 1 of the step at `nimg` (at most its batch), read
    as a Feed reads them for that step (the same order, resolution, flips and loader crops), whatever
    the world size: what a batch sheet shows. `stream`: the data set's order (ORDER_B for a second one);
    `order`: the task's own order of it instead (the swap task's by yaw)."""
    phase = schedule.phase_at(nimg)
    order = order or GlobalOrder(len(data), cfg.train.seed, stream)
    request = Step(nimg, phase.batch, phase.resolution, 0, order.indices(nimg, min(n, phase.batch)))
    flip = cfg.data.xflip if xflip is None else xflip
    return read_batch(data, request, flip, cfg.train.seed, crop_scale)


def _weakly(method: Callable[[], bool]) -> Callable[[], bool]:
    """A Feed's `method` called through a weak reference: the batches a Feed reads ahead (on the device) go with it,
    not with the garbage collector's next pass (a cycle: a Feed -> its reader ahead -> the Feed's method)."""
    ref = weakref.WeakMethod(method)
    return lambda: ref()()  # type: ignore[misc]


class Feed:
    """The real images, step after step: this rank's share of the images at each optimizer step's global
    positions, read ahead in data.workers processes. The batch follows data.schedule: at a phase boundary
    the Replicator's batch changes with it (its micro-batch stays, its accumulation follows).
    `crop_scale` > 0: random-resized crops cut by the loader from the images as stored (the task's
    `loader_crop_scale`). `order`: the task's order of the data (its `data_order`), else GlobalOrder's."""

    def __init__(
        self,
        data: Any,
        schedule: Schedule,
        rep: Replicator,
        cfg: Config,
        start: int = 0,
        on_phase: Callable[[int, Phase], None] | None = None,
        crop_scale: float = 0.0,
        order: Order | None = None,
    ):
        self.rep, self.schedule, self.nimg, self.on_phase, self.cfg = rep, schedule, start, on_phase, cfg
        self._phase: Phase | None = None
        self.order = order or GlobalOrder(len(data), cfg.train.seed)
        sampler = RankSampler(self.order, schedule, rep.rank, rep.world_size, start=start)
        pin = rep.device.type == "cuda"
        on_device = cfg.data.decode != "cpu"  # the loader hands over encoded batches, decoded on the device
        self.loader = BatchLoader(
            data, sampler, cfg.data.workers, cfg.data.xflip, cfg.train.seed, pin_memory=pin, crop_scale=crop_scale,
            on_device=on_device,
        )  # fmt: skip
        # Decoded on the device (data.decode "gpu", "nvimgcodec") in a thread, the next batch while a step trains.
        self.batches: Any = self.loader
        if on_device:
            decoder = device_decode.decoder_of(cfg.data.decode)
            self.batches = device_decode.DecodeAhead(self.loader, rep.device, decoder, _weakly(self._more))
        elif pin:  # decoded by the CPU: copied to the GPU a batch ahead, beside the step before
            self.batches = device_decode.CopyAhead(self.loader, rep.device, _weakly(self._more))
        self._companions: list[device_decode.CopyAhead] = []

    def _more(self) -> bool:
        """Whether a step after the one at self.nimg takes a batch (a run ends at train.kimg)."""
        return self.nimg + self.schedule.phase_at(self.nimg).batch < self.cfg.train.images

    def _more_companion(self) -> bool:
        """Whether the step at self.nimg takes a batch: a companion's, read after next() (self.nimg is then the next
        step's, which takes one if the run has not ended there)."""
        return self.nimg < self.cfg.train.images

    def companion(self, data: Any, order: Order | None = None) -> Callable[[], Batch]:
        """A second data set read in step with this one (the swap task's dst faces beside its src):
        each call after `next()` returns this rank's share of the same step from `data`, in an order of
        its own (`order`, else GlobalOrder's of stream ORDER_B), the same positions, batch and phase; read
        ahead like the first."""
        order = order or GlobalOrder(len(data), self.cfg.train.seed, ORDER_B)
        sampler = RankSampler(order, self.schedule, self.rep.rank, self.rep.world_size, start=self.nimg)
        pin = self.rep.device.type == "cuda"
        loader = BatchLoader(data, sampler, self.cfg.data.workers, False, self.cfg.train.seed, pin_memory=pin)
        ahead = device_decode.CopyAhead(loader, self.rep.device, _weakly(self._more_companion))
        self._companions.append(ahead)

        def read() -> Batch:
            batch = next(ahead)
            if batch.nimg != self.nimg - self.rep.batch:
                raise BigbatchError(
                    f"the second data set's batch is for step {batch.nimg}, not {self.nimg - self.rep.batch}"
                )
            return batch

        return read

    def next(self) -> Batch:
        """This rank's share of the next optimizer step's real images (uint8 NHWC, labels)."""
        phase = self.schedule.phase_at(self.nimg)
        batch = phase.batch
        if batch != self.rep.batch:
            micro, plan = self.rep.planned_micro_batch, self.rep.set_batch(batch)
            if plan is not None and micro and plan.micro_batch < micro and self.rep.is_main:
                # (found from outside: a smaller share said not to be a multiple, and against the last phase's own)
                share = batch // self.rep.world_size
                why = "is smaller than" if share < micro else "is not a multiple of"
                warn(
                    f"data.schedule: a process's share of batch {batch} (from kimg {self.nimg / 1000:g}) {why} "
                    f"micro_batch {micro}: micro-batches of {plan.micro_batch} from here (BatchNorm statistics over "
                    f"{plan.micro_batch} images, not {micro}); a batch of a multiple of {micro * self.rep.world_size} "
                    "keeps it"
                )
        if phase != self._phase:
            # A phase begins (or a resumed run starts inside one past the first): the caller says so.
            later = self._phase is not None or phase != self.schedule.phases[0]
            if later and self.on_phase is not None:
                self.on_phase(self.nimg, phase)
            self._phase = phase
        real = next(self.batches)
        if real.nimg != self.nimg or len(real.images) != self.rep.share:
            raise BigbatchError(
                f"the loader's batch is for step {real.nimg} ({len(real.images)} images), not for step {self.nimg} "
                f"({self.rep.share} images per rank)"
            )
        self.nimg += batch
        return real

    def close(self) -> None:
        for loader in (self.batches, *self._companions):  # (a DecodeAhead closes the loader it reads)
            loader.close()
        # (the caller's callback let go: a task that holds a companion's reader, which holds this Feed, and is held
        # by it through on_phase, was a cycle, found by review: a swap run's task lived on after train() returned)
        self.on_phase = None


Builder = Callable[..., Task]
_TASKS: dict[str, Builder] = {}
_NEW_RUN_CHECKS: dict[str, Callable[[Config], None]] = {}
_CONFIG_CHECKS: dict[str, Callable[[Config], None]] = {}
_NEW_RUN_SAYS: dict[str, Callable[[Config, bool], None]] = {}


def register(
    name: str,
    check: Callable[[Config], None] | None = None,
    new_run: Callable[[Config], None] | None = None,
    says: Callable[[Config, bool], None] | None = None,
) -> Callable[[Builder], Builder]:
    """Register a task builder `fn(cfg, rep, data, *, run, resumed_at, quiet) -> Task` under `name`;
    `check(cfg)` validates what the task makes of the config (its model family, its options) wherever a config is
    read; `new_run(cfg)` what it refuses as a new run starts alone (see check_new_run); `says(cfg, trains)` what it
    warns of a new run's settings (see say_new_run)."""

    def add(fn: Builder) -> Builder:
        _TASKS[name] = fn
        for hooks, hook in ((_CONFIG_CHECKS, check), (_NEW_RUN_CHECKS, new_run), (_NEW_RUN_SAYS, says)):
            if hook is not None:
                hooks[name] = hook
        return fn

    return add


def check_new_run(cfg: Config) -> None:
    """What the task refuses of a new run's config (its build, and the dry run of one): settings once taken and
    now refused, so that a saved run that holds one still loads, resumes, is scored and exported (found by review:
    refused on every load, such runs could not)."""
    if cfg.task in _NEW_RUN_CHECKS:
        _NEW_RUN_CHECKS[cfg.task](cfg)


def say_new_run(cfg: Config, trains: bool = True) -> None:
    """What the task warns of a new run's settings as it starts (once its data and models are taken, so a refusal is
    said alone), and the dry run of one (found from outside: the dry run said none of it). `trains`: a run's, not
    lr-find's or show-batch's, whose length is none of theirs."""
    if cfg.task in _NEW_RUN_SAYS:
        _NEW_RUN_SAYS[cfg.task](cfg, trains)


def _builder(name: str) -> Builder:
    if name not in _TASKS:
        raise BigbatchError(f"config key 'task' names no registered task '{name}'; valid: {', '.join(list_tasks())}")
    return _TASKS[name]


@register_check("")
def _check_task(cfg: Config) -> None:
    _builder(cfg.task)
    if cfg.eval.resolution and cfg.task != "classify":
        cfg.eval._fail(
            "resolution", f"is the side a classifier is scored at; a {cfg.task} run's is data.resolution: leave it 0"
        )
    if cfg.eval.tta and cfg.task != "classify":
        cfg.eval._fail("tta", f"averages a classifier's predictions with its mirror image's; a {cfg.task} run has none")
    if cfg.task in _CONFIG_CHECKS:
        _CONFIG_CHECKS[cfg.task](cfg)


def check_family(cfg: Config, task: str, kind: str) -> None:
    """model.name must be a registered family of `task` (a `kind`, in the message) and model.options
    options it takes, of the right types."""
    m = cfg.model
    families = models.list_models(task=task)
    if m.name not in families:
        valid = f'valid for task = "{task}": {", ".join(families)}'
        m._fail("name", f"names no {kind} family '{m.name}'; {valid}{models.registry.USER_FAMILY}")
    try:
        models.registry.check_options(m.name, m.options)
    except BigbatchError as e:
        raise BigbatchError(f"config key 'model.options': {e}") from None


def refuse_face_sets(data: Any, task: str) -> None:
    """Images of 1 (gray) or 3 (RGB) channels only: a face set's fourth and fifth (`prepare --masks`: the
    face mask, eyes and mouth) are not image channels to `task`."""
    if data.channels not in (1, 3):
        raise BigbatchError(
            f"data set {data.source} holds {data.channels} channels an image (a face set: RGB with the masks of "
            f"`prepare --masks`), and {task} trains on 1 (gray) or 3 (RGB): prepare the images without --masks, or "
            'train a face swap on it (task = "swap", e.g. --preset saehd128)'
        )


# Config sections that one task reads, and which.
SECTION_OWNERS = {"swap": "swap", "xseg": "xseg", "augment": "gan"}


def refuse_sections(cfg: Config, task: str, *sections: str) -> None:
    """Keys of `sections` ([swap], [xseg], [augment]) are read by one task each: set in another task's config
    (`task` says which, for the message), they would do nothing."""
    for section in sections:
        if foreign := getattr(cfg, section).changed():
            owner = f'task = "{SECTION_OWNERS[section]}"'
            raise BigbatchError(f"config key '{foreign[0]}' is read by {owner} only, not by {task}; remove it")


def list_tasks() -> list[str]:
    return sorted(_TASKS)


def build_task(
    cfg: Config,
    rep: Replicator,
    data: Any,
    *,
    run: Path | None = None,
    resumed_at: int | None = None,
    quiet: bool = True,
) -> Task:
    """The task `cfg.task` names, on `rep` and `data`: models built and initialised from train.seed
    (the caller's global RNG is left as it was), prepared by `rep`, optimizers registered. `run`
    (the run directory) and `resumed_at` (images seen at the checkpoint resumed) let its scorer pick up
    the run's best checkpoint; without `run` nothing is scored. From then on, each micro-batch of a training step
    seeds the global generators, torch's, NumPy's and Python's (`seed_micro_batches`): its callers put theirs back
    after (`global_rngs_kept`)."""
    builder = _builder(cfg.task)
    if resumed_at is None:
        check_new_run(cfg)
    if cfg.data.decode != "cpu":
        device_decode.check(data, rep.device, cfg.data.decode)
    with torch.random.fork_rng(devices=[rep.device] if rep.device.type == "cuda" else []):  # (manual_seed seeds
        torch.manual_seed(cfg.train.seed)  # the GPU's too, which fork_rng restores only when given)
        task = builder(cfg, rep, data, run=run, resumed_at=resumed_at, quiet=quiet)
    seed_micro_batches(rep, cfg.train.seed)
    if resumed_at is None and rep.is_main:
        say_new_run(cfg, trains=run is not None)
    return task
