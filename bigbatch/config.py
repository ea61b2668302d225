"""The typed config tree: one dataclass per section, strict loading from dicts/TOML, dotted overrides.

Every field carries a docstring. Types are checked when a section is built (from Python, TOML or
the command line), values in `_validate`; any mistake is a `BigbatchError` that names the key. What
needs the modules a section configures (the model registry, the metric names, the schedule parser)
is checked by those modules, which register their checks with `register_check`: config.py imports none of them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from bigbatch.config_data import DataConfig as DataConfig  # the data's section, in its own file
from bigbatch.config_output import MIN_TRUNCATION as MIN_TRUNCATION  # (sampling's too)
from bigbatch.config_output import CheckpointConfig, EvalConfig, SampleConfig  # what a run writes, in their own file
from bigbatch.config_swap import SwapConfig, XSegConfig  # the face tasks' sections, in their own file
from bigbatch.config_types import Section, at_least_zero, at_most, positive, read_toml, strings
from bigbatch.config_types import parse_override as parse_override  # (the command line's key=value, parsed)
from bigbatch.config_types import register_check as register_check  # modules register their checks here
from bigbatch.errors import BigbatchError, warn
from bigbatch.urls import refuse_credentials

MAX_BATCH = 2**24  # images a step: 256 times the largest batch published (65,536, LARS on ImageNet)


@dataclass
class ModelConfig(Section):
    _name = "model"

    name: str = "dcgan"
    """A registered model family (`bigbatch.models.list_models()`)."""
    ch: int = 64
    """Base channel width; each family multiplies it per resolution as in its paper."""
    dim_z: int = 128
    """Length of the latent vector z."""
    conditional: bool = True
    """Condition G and D on the data set's class labels (False: unconditional, labels ignored)."""
    sn_update: Literal["step", "micro"] = "step"
    """Spectral-norm power iteration once per optimizer step ("step", as with the real big batch) or
    once per micro-batch ("micro", BigGAN-PyTorch's behaviour under accumulation)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Family-specific keyword arguments of the family's builder (e.g. g_sn, d_sn, bn_eps, init)."""

    def _validate(self) -> None:
        positive(self, "ch", "dim_z")
        at_most(self, ch=65536, dim_z=65536)


OPTIMIZER_KEYS = {
    "sgd": ("momentum", "nesterov"),
    "adamw": ("betas", "adam_eps"),
    "lars": ("momentum", "nesterov", "trust_coeff"),
    "lamb": ("betas", "adam_eps"),
}
"""classify: the keys of its own each train.optimizer reads."""


def unread_optimizer_keys(optimizer: str) -> list[str]:
    """The train keys of the other optimizers that `optimizer` does not read."""
    own = OPTIMIZER_KEYS[optimizer]
    return list(dict.fromkeys(k for keys in OPTIMIZER_KEYS.values() for k in keys if k not in own))


@dataclass
class TrainConfig(Section):
    _name = "train"

    kimg: float = 60.0
    """Run length in thousands of real images shown to D."""

    @property
    def penalizes_d_gradient(self) -> bool:
        """Whether D's loss holds a penalty of its gradient (R1, R2, WGAN-GP's), differentiated by a double backward."""
        return bool(self.r1_gamma or self.r2_gamma or self.gp)

    @property
    def images(self) -> int:
        """The run length in images: kimg x 1000, a fraction of an image counting as one (the float's
        own noise does not: a kimg computed as 1.12 + 0.128 = 1.2480000000000002 is 1,248 images)."""
        return math.ceil(round(self.kimg * 1000, 6))

    batch: int = 64
    """Images per optimizer step (the effective batch), = micro_batch x accumulation x world_size."""
    micro_batch: int | Literal["auto"] = 64
    """Images per forward/backward on one process; accumulation = batch / (micro_batch x world_size).
    Above a process's share of the batch it is the share (no accumulation); below, it must divide it.
    "auto": the largest divisor of batch / world_size whose D and G steps fit train.memory_budget."""
    memory_budget: str = ""
    """Memory one process may use, e.g. "6GiB" (for micro_batch "auto", a hard cap on CUDA while it probes);
    "" = the whole GPU, or on CPU this process's share of the available RAM."""
    checkpointing: bool = False
    """Activation checkpointing of the blocks each model lists: recompute them in backward instead of
    storing their activations (less memory, about one more forward of time)."""
    compile: bool | Literal["auto", "reduce-overhead", "max-autotune"] = "auto"
    """torch.compile the models (after checkpointing, before DDP), cached in $BIGBATCH_CACHE/compile for the
    next run. "auto": on where measured to pay, BigGAN on a CUDA GPU without R1 or pl_weight (1.2-1.8x on an
    H200), a graph that fails to compile then running eagerly; off elsewhere (on a CPU it does not pay).
    "reduce-overhead", "max-autotune": torch.compile's modes, which on a GPU replay each step as CUDA graphs."""
    channels_last: bool | Literal["auto"] = "auto"
    """Convolution weights in channels-last (NHWC) memory order, so convolutions run and return NHWC:
    the GAN step 1.16x faster on a CPU, the layout tensor cores want. "auto": on for GANs and classifiers
    (whose images arrive NHWC-strided, so their convolutions ran NHWC already), off for SAEHD. Gradients
    differ from NCHW's within fp32 rounding (bench/channels_last.py)."""
    sync_bn: bool = False
    """With several processes, BatchNorm statistics over the same micro-batch index on all ranks
    (nn.SyncBatchNorm on CUDA, an all-reduce BatchNorm on CPU); False: per micro-batch on each rank."""
    grad_clip: float = 0.0
    """Clip the global gradient norm of each network to this before its step (0 = off)."""
    skip_limit: float = 0.2
    """A step with non-finite gradients is skipped; stop when more than this fraction of the last
    skip_window steps of G or D (of the steps so far while there are fewer, at least 5 counted) were
    skipped; fp16's loss scaler settling at the start does not count."""
    skip_window: int = 50
    """How many recent optimizer steps skip_limit looks at."""
    d_steps: int = 1
    """D steps per G step; each D step consumes `batch` real images."""
    g_lr: float = 2e-4
    """Adam learning rate of G."""
    d_lr: float = 2e-4
    """Adam learning rate of D."""
    betas: tuple[float, float] = (0.0, 0.999)
    """Adam (beta1, beta2) of both G and D (BigGAN's); a classifier's AdamW takes (0.9, 0.999), PyTorch's, where this
    is left at (0.0, 0.999) (so AdamW's beta1 is never exactly 0: give 1e-8)."""
    adam_eps: float = 1e-8
    """Adam epsilon of both G and D."""
    cond_lambda: float = 1.0
    """GAN, D with an auxiliary classifier (model.options.d_cond = "AC"): the weight of its cross-entropy on the real
    images' classes (D's loss) and on the fakes' (G's), StudioGAN's cond_lambda."""
    loss: Literal["hinge", "ns", "ls", "wgan", "rpgan"] = "hinge"
    """GAN loss: "hinge" (SN-GAN, SA-GAN, BigGAN), "ns" (non-saturating, DCGAN; StudioGAN's "vanilla"), "ls" (least
    squares, LSGAN, StudioGAN's "least_square": D pulls its outputs on reals to 1 and on fakes to 0, G its outputs on
    fakes to 1), "wgan" (Wasserstein, StudioGAN's "wasserstein": D's outputs on fakes less those on reals; give D a
    Lipschitz bound, train.gp or spectral norm); or "rpgan" (relativistic pairing, R3GAN's: softplus(D(fake) -
    D(real)) of each fake image and the real one beside it, and for G softplus(D(real) - D(fake)) on the last D
    step's real images)."""
    lr_decay: Literal["none", "linear", "cosine", "step", "plateau"] = "none"
    """Learning-rate schedule over the run (after train.warmup_kimg): constant, "linear" to 0 at
    train.kimg (SN-GAN), and for classifiers also "cosine" to 0 (Loshchilov & Hutter; both to train.lr_min, ending
    train.cooldown_kimg before the end), "step" (times train.lr_gamma at each of train.lr_steps) or "plateau" (times
    train.lr_gamma where the score has not improved for more than train.plateau_patience evaluations)."""
    plateau_patience: int = 10
    """classify, train.lr_decay "plateau": evaluations without a better score that the rate waits through (timm's
    --patience-epochs, 10)."""
    optimizer: Literal["sgd", "adamw", "lars", "lamb"] = "sgd"
    """classify: SGD with momentum (train.momentum, train.nesterov), AdamW (train.betas), or the large-batch LARS
    (SGD's keys, train.trust_coeff) or LAMB (AdamW's), as timm's."""
    trust_coeff: float = 0.001
    """classify, LARS: the trust coefficient of its layer-wise rate (You et al. 2017's eta; timm's 0.001)."""
    lr: float = 0.1
    """classify: peak learning rate at train.lr_batch images per step, scaled to the batch in force: linearly (Goyal
    et al. 2017: a phase of twice the batch steps twice as far) or by its square root (train.lr_scale)."""
    lr_batch: int = 256
    """classify: the batch train.lr (and a phase's lr) is given for; 0 = use the rates as written."""
    lr_scale: Literal["linear", "sqrt"] = "linear"
    """classify: how a rate follows the batch (timm's --lr-base-scale: "sqrt" for Adam's family and LAMB)."""
    warmup_kimg: float = 0.0
    """classify: linear learning-rate warm-up from 0 (or train.warmup_lr) over this many kimg (Goyal et al. 2017: 5
    epochs)."""
    warmup_lr: float = 0.0
    """classify: the rate the warm-up starts at (timm's --warmup-lr), scaled as train.lr; 0: from a step's share."""
    lr_min: float = 0.0
    """classify, train.lr_decay "linear", "cosine" or "plateau": the rate it decays to (timm's --min-lr), scaled as
    train.lr."""
    cooldown_kimg: float = 0.0
    """classify, train.lr_decay "linear" or "cosine": the last kimg of train.kimg held at train.lr_min (timm's
    --cooldown-epochs, which timm adds after --epochs: its run is train.kimg = epochs + cooldown epochs)."""
    lr_steps: list[float] = field(default_factory=list)
    """classify, train.lr_decay="step": the kimg at which the learning rate is multiplied by train.lr_gamma."""
    lr_gamma: float = 0.1
    """classify, train.lr_decay "step": the factor at each of train.lr_steps; "plateau": at each plateau."""
    momentum: float = 0.9
    """classify, SGD: momentum."""
    nesterov: bool = True
    """classify, SGD: Nesterov momentum."""
    weight_decay: float = 5e-5
    """classify: L2 weight decay (SGD) or decoupled weight decay (AdamW)."""
    norm_decay: bool = False
    """classify: decay normalization parameters and biases too (False: only conv and linear weights,
    as fast.ai's ImageNet in 18 minutes: 93.2 -> 93.48% top-5)."""
    label_smoothing: float = 0.0
    """classify: label smoothing of the cross-entropy (Szegedy et al. 2016: 0.1)."""
    mixup: float = 0.0
    """classify: mixup's alpha (Zhang et al. 2018; timm's 0.8), pairs of neighbouring images (0: off)."""
    cutmix: float = 0.0
    """classify: CutMix's alpha (Yun et al. 2019; timm's 1.0); with mixup, each pair takes one of the two."""
    mixup_prob: float = 1.0
    """classify, mixup or CutMix: the probability a pair is mixed at all (timm's --mixup-prob)."""
    mixup_switch_prob: float = 0.5
    """classify, mixup and CutMix: the probability a mixed pair takes CutMix (timm's --mixup-switch-prob)."""
    mixup_off_kimg: float = 0.0
    """classify, mixup or CutMix: none from this kimg on (timm's --mixup-off-epoch; 0: to the end)."""
    bce_loss: bool = False
    """classify: binary cross-entropy against each class's target (smoothed, mixed; timm's --bce-loss), the mean
    over images and classes, where cross-entropy is the default."""
    bce_threshold: float = 0.0
    """classify, train.bce_loss: targets above it made 1, the others 0 (timm's --bce-target-thresh; 0: off)."""
    random_erase: float = 0.0
    """classify: random erasing's probability (Zhong et al. 2020; timm's --reprob, DeiT's 0.25): one
    rectangle of 2% to 1/3 of the image filled with per-pixel noise (timm's pixel mode), after RandAugment."""
    randaugment: str = ""
    """classify: RandAugment (Cubuk et al. 2020) in timm's --aa form, e.g. "rand-m9-mstd0.5-inc1" (ResNet
    strikes back, DeiT): magnitude m of 10 drawn per image with standard deviation mstd (above 100, or inf: uniform
    in [0, m], as timm), the increasing set of operations, n layers (2) each applied with chance p (0.5); on the
    device, after the crop ("": off)."""
    labels: Literal["data", "rotation"] = "data"
    """classify: learn the data set's class labels, or which of four rotations (0, 90, 180, 270 degrees,
    one per image by its global position) each image was given: a label-free task for unlabelled data
    (Gidaris et al. 2018), what the metrics' offline classifier learns on such data."""
    crop_scale: float = 1.0
    """classify: random-resized-crop augmentation, the least fraction of an image's area a crop keeps
    (ImageNet: 0.08; 1.0 = off), cut from the image as stored (whole, or its square) and then resized to the
    phase's resolution, as torchvision's RandomResizedCrop; from an encoded file before decoding, on the CPU or
    the GPU (a JPEG's crop decodes only its own MCUs, at the smallest scale that keeps it at the resolution)."""
    g_ortho: float = 0.0
    """Orthogonal regularization strength beta of G (BigGAN: 1e-4; BigGAN-PyTorch's scripts: 0). Adds
    beta * 2 (W W^T - I off-diagonal) W to the gradient of every weight of >= 2 dims but the shared class
    embedding, as BigGAN-PyTorch's utils.ortho does."""
    d_ortho: float = 0.0
    """Orthogonal regularization strength of D (0 = off), as g_ortho."""
    r1_gamma: float = 0.0
    """R1 regularization of D (Mescheder et al. 2018; StyleGAN2's r1_gamma): gamma / 2 x the mean squared
    norm of D's gradient with respect to the real images (before [augment]'s transforms), added to D's loss
    (0 = off)."""
    r1_every: int = 1
    """Lazy R1 (StyleGAN2: 16): the penalty on every this-many-th D step, times this."""
    r2_gamma: float = 0.0
    """R2 regularization of D (R3GAN's, beside R1 at the same gamma): gamma / 2 x the mean squared norm of D's gradient
    with respect to the fake images (before [augment]'s transforms), on R1's lazy steps (train.r1_every; 0 = off)."""
    gp: float = 0.0
    """WGAN-GP's gradient penalty of D (Gulrajani et al. 2017; StudioGAN's gp_lambda, 10): this times the mean over
    the images of (|grad D(x)| - 1)^2, x a mix a x real + (1 - a) x fake of each real image and the fake one beside
    it, a uniform in [0, 1) per image (drawn per step), judged as they are (no [augment]'s transforms) with the real
    images' labels, as StudioGAN's; every D step (0 = off)."""
    lecam: float = 0.0
    """LeCam regularization of D (Tseng et al. 2021; StudioGAN's lecam_lambda, e.g. 0.3 with DiffAugment on little
    data): this times the mean squares of D's outputs on reals above the moving average of its outputs on fakes
    and on fakes below that of reals (0 = off)."""
    lecam_decay: float = 0.99
    """How much of the moving averages of D's outputs a D step keeps (the authors' and StudioGAN's 0.99)."""
    lecam_start: int = 1000
    """Iterations (G steps) whose D steps' means the averages take as they are, the penalty off, before they move by
    train.lecam_decay and the penalty applies (StudioGAN's lecam_ema_start_iter, 1000)."""
    cr_real: float = 0.0
    """Consistency regularization of D (CR, Zhang et al. 2020; StudioGAN's cr_lambda and bCR's real_lambda, 10): this
    times the mean squared difference of D's outputs on a real image and on a copy flipped and shifted by up to 1/8
    of the side (its border reflected) (0 = off)."""
    cr_fake: float = 0.0
    """bCR (Zhao et al. 2021): the same on generated images (StudioGAN's fake_lambda, 10; 0 = off)."""
    zcr_d: float = 0.0
    """zCR (Zhao et al. 2021): this times the mean squared difference of D's outputs on G(z) and on G(z + n),
    n of standard deviation train.zcr_radius (StudioGAN's d_lambda, 20; 0 = off). ICR is bCR with zCR."""
    zcr_g: float = 0.0
    """zCR: G's loss less this times the mean squared difference of G(z) and G(z + n), the images of nearby latents
    pushed apart (StudioGAN's g_lambda, 0.5; 0 = off)."""
    zcr_radius: float = 0.05
    """zCR: the standard deviation of the latents' nudge n (StudioGAN's radius, 0.05; the paper's sigma_noise, 0.03)."""
    pl_weight: float = 0.0
    """Path length regularization of G (StyleGAN2: 2; needs a G with a mapping network, model.name =
    "stylegan2"): this times the mean of (|J_w^T y| - a)^2 over the images it is computed on, y a
    random image of unit pixel variance, a the running mean of the lengths (0 = off)."""
    pl_every: int = 4
    """Lazy path length regularization (StyleGAN2: 4): on every this-many-th G step, times this."""
    pl_batch_shrink: int = 2
    """Path length regularization on one image in this many of a step (those at global positions that
    are multiples of it; StyleGAN2: 2)."""
    pl_decay: float = 0.01
    """How far the running mean of path lengths moves toward each regularized step's mean length."""
    init_from: str = ""
    """Fine-tune: start G, D and G_ema from this run or checkpoint (fresh optimizers; class embeddings
    of a different number of classes are re-initialised); classify: the network from a classify run or
    a torchvision/timm-layout state dict (.pth, .safetensors), its head new for the data's classes;
    swap: see the README. "" = train from scratch."""
    freeze_d: int = 0
    """FreezeD (Mo et al. 2020): keep D's first this many blocks (from the image side) fixed, and its input layer;
    blocks, where StyleGAN2-ADA's --freezed counts layers (its 3k+1 is k here)."""
    freeze_kimg: float = 0.0
    """classify, fine-tuning (fastai's fine_tune): only the head trains for this many kimg, then all."""
    body_lr_mult: float = 1.0
    """classify: the body trains at train.lr times this, the head at train.lr (e.g. 0.1 to fine-tune)."""
    train_bn: bool = True
    """classify, while train.freeze_kimg lasts: the body's normalization layers (BatchNorm, InstanceNorm,
    LayerNorm) train too, at the body's rate, as fastai's train_bn (its default) has them; false: they stay."""
    model_ema_kimg: float = 0.0
    """classify: half-life in kimg of an average of the model's weights (Polyak; timm's --model-ema), which is what
    validation, checkpoints/best/, eval, predict, export and init_from use; BatchNorm statistics averaged alike
    (copies of the latest would not fit the averaged weights). Capped by train.ema_rampup when set (0 = off)."""
    ema_halflife_kimg: float = 10.0
    """Half-life of the EMA of G's weights, in thousands of images (independent of the batch size)."""
    ema_start_kimg: float = 0.0
    """Until this many kimg, G_ema is a plain copy of G (BigGAN starts its EMA at 20k iterations)."""
    ema_rampup: float = 0.0
    """The EMA's half-life is at most this fraction of the images seen before the step (StyleGAN2-ADA: 0.05), so
    an early G_ema forgets its random start quickly, its first step a copy (0 = off). Off for a pretrained G_ema (a
    fine-tune's, a converted run's), as StyleGAN2-ADA's resume turns it off."""
    ema_buffers: Literal["copy", "average"] = "copy"
    """G_ema's BatchNorm statistics: G's at each step (StyleGAN2-ADA's), or "average": averaged as the weights are,
    theirs (BigGAN-PyTorch's and StudioGAN's; the BigGAN presets'). Spectral-norm vectors are G's either way."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision of forward and backward; weights, optimizer state and losses stay fp32."""
    seed: int = 0
    """Decides everything random: initialisation, data order, z, labels and augmentation."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: "auto" takes CUDA when it is available."""
    deterministic: bool = False
    """Deterministic kernels while training (torch.use_deterministic_algorithms, cuDNN without autotuning,
    CUBLAS_WORKSPACE_CONFIG=:4096:8): on a GPU a resumed run then ends with the bits of the run left alone, as on a
    CPU (some CUDA backward kernels add with atomics, in a changing order). Slower; an op without one stops the run."""
    log_every_kimg: float = 1.0
    """How often a line goes to metrics.jsonl and TensorBoard."""

    def _validate(self) -> None:
        positive(self, "kimg", "batch", "d_steps", "g_lr", "d_lr", "adam_eps", "log_every_kimg")
        if self.batch > MAX_BATCH:
            self._fail("batch", f"must be at most {MAX_BATCH} images a step, got {self.batch}")
        at_least_zero(self, seed="a whole number >= 0")
        if self.micro_batch != "auto":
            positive(self, "micro_batch")  # a micro_batch above a process's share is the share (make_plan)
        at_least_zero(self, grad_clip="a finite number >= 0 (0 = off)")
        if not 0 <= self.skip_limit <= 1:
            self._fail("skip_limit", f"must be a fraction in [0, 1], got {self.skip_limit}")
        positive(self, "skip_window", "r1_every", "pl_every", "pl_batch_shrink")
        weights = ("r1_gamma", "r2_gamma", "gp", "lecam", "cr_real", "cr_fake", "zcr_d", "zcr_g")
        at_least_zero(
            self, lecam_start="a number of iterations >= 0", **dict.fromkeys(weights, "a finite number >= 0 (0 = off)")
        )
        positive(self, "zcr_radius")
        for name in ("g_lr", "d_lr", "lr", *weights):  # (float32 numbers in the step; found from outside: 1e39 was inf)
            if getattr(self, name) > 3.4e38:
                self._fail(name, f"must be below 3.4e38, float32's largest number, got {getattr(self, name):g}")
        if not 0 <= self.lecam_decay < 1:
            self._fail("lecam_decay", f"must be a fraction in [0, 1), got {self.lecam_decay}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            self._fail("betas", f"must be two numbers in [0, 1), got {list(self.betas)}")
        at_least_zero(self, freeze_d="a number of blocks >= 0")
        at_least_zero(self, freeze_kimg="kimg >= 0 (0: no frozen start)", mixup="an alpha >= 0", cutmix="an alpha >= 0")
        for name in ("mixup_prob", "mixup_switch_prob", "bce_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                self._fail(name, f"is a probability, in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.random_erase <= 1:
            self._fail("random_erase", f"is a probability, in [0, 1], got {self.random_erase}")
        if not (math.isfinite(self.body_lr_mult) and self.body_lr_mult > 0):
            self._fail("body_lr_mult", f"must be a factor > 0, got {self.body_lr_mult}")
        at_least_zero(self, lr_batch="a batch >= 0 (0: rates as written)", plateau_patience="evaluations >= 0")
        for name in ("momentum", "label_smoothing"):
            if not 0 <= getattr(self, name) < 1:
                self._fail(name, f"must be in [0, 1), got {getattr(self, name)}")
        if not 0 < self.crop_scale <= 1:
            self._fail("crop_scale", f"must be an area fraction in (0, 1] (1 = off), got {self.crop_scale}")
        if not 0 < self.lr_gamma <= 1:
            self._fail("lr_gamma", f"must be a factor in (0, 1], got {self.lr_gamma}")
        if sorted(self.lr_steps) != self.lr_steps or any(not (math.isfinite(k) and k > 0) for k in self.lr_steps):
            self._fail("lr_steps", f"must be increasing kimg > 0, got {self.lr_steps}")
        if self.lr_decay == "step" and not self.lr_steps:
            self._fail("lr_steps", 'must list at least one kimg when train.lr_decay = "step"')
        positive(self, "lr", "trust_coeff")
        if not 0 < self.pl_decay <= 1:
            self._fail("pl_decay", f"must be a fraction in (0, 1], got {self.pl_decay}")
        names = ("ema_halflife_kimg", "ema_start_kimg", "ema_rampup", "model_ema_kimg", "g_ortho", "d_ortho")
        for name in (*names, "warmup_kimg", "weight_decay", "pl_weight", "warmup_lr", "lr_min", "cooldown_kimg",
                     "mixup_off_kimg", "cond_lambda"):  # fmt: skip
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                self._fail(name, f"must be a finite number >= 0, got {getattr(self, name)}")


# ADA's pipeline names (StyleGAN2-ADA's --augpipe) for its groups; "bgcc" is "bgc" with cutout
ADA_GROUPS = ("blit", "geom", "color", "filter", "noise", "cutout")  # in the order they apply
ADA_SHORTHANDS = {k: ADA_GROUPS[: len(k)] for k in ("bg", "bgc", "bgcf", "bgcfn", "bgcfnc")}  # its --augpipe names
ADA_SHORTHANDS["bgcc"] = ("blit", "geom", "color", "cutout")  # bgc with cutout (not ADA's name)


@dataclass
class AugmentConfig(Section):
    """GANs on limited data: D's inputs, real and generated, through the same differentiable random
    transforms (DiffAugment, Zhao et al. 2020, or ADA's pipeline, Karras et al. 2020), applied with
    probability p, which ADA's heuristic may adjust during training."""

    _name = "augment"

    pipeline: Literal["diffaugment", "ada"] = "diffaugment"
    """Whose transforms augment.policy names: DiffAugment's or ADA's (StyleGAN2-ADA's --augpipe)."""
    policy: str = ""
    """Comma-separated transforms, applied in this order. DiffAugment's: "color" (brightness +-0.5,
    saturation x[0, 2), contrast x[0.5, 1.5)), "translation" (up to 1/8 of the side, zero fill), "cutout"
    (a square of half the side set to 0); its BigGAN and StyleGAN2 setting: "color,translation,cutout".
    ADA's groups: "blit" (x-flip, 90° rotations, integer translation), "geom" (scaling, rotation,
    anisotropic scaling, fractional translation), "color" (brightness, contrast, luma flip, hue,
    saturation), "filter" (four frequency bands' gains), "noise", "cutout", applied in that order however
    written; or its names "bg", "bgc" (its default), "bgcf", "bgcfn", "bgcfnc", and "bgcc" (bgc + cutout).
    "": off."""
    p: float | Literal["auto"] = "auto"
    """Probability that each transform applies to an image. "auto": 0 at the start with augment.target
    (ADA), else 1 (DiffAugment; ADA's pipeline takes a number there, its fixed-p runs use 0.2-0.8)."""
    target: float = 0.0
    """ADA: adjust p so that the mean sign of D's outputs on the real images, r_t = E[sign(D(real))] (from -1
    to 1: 0.6 is 80% of them scored positive), stays at this (ADA: 0.6); 0 = p fixed."""
    speed_kimg: float = 500.0
    """ADA: p moves by at most 1 in this many kimg (ADA's ada_kimg), by a step every 256 real images or
    every D step, whichever is longer (ADA fine-tunes with 100)."""

    def _validate(self) -> None:
        names = self.transforms
        ada = self.pipeline == "ada"
        valid = ADA_GROUPS if ada else ("color", "translation", "cutout")
        for name in names:
            if name not in valid or names.count(name) > 1:
                problem = "twice" if name in valid else f"unknown to augment.pipeline {self.pipeline!r}"
                given = [n.strip() for n in self.policy.split(",") if n.strip()]
                holders = [n for n in given if name in ADA_SHORTHANDS.get(n, ())] if ada else []
                if problem == "twice" and holders:  # (found from outside: "names 'blit' (twice)" of bgc,blit)
                    problem = f"twice: {' and '.join(dict.fromkeys(holders))} hold{'s' * (len(set(holders)) == 1)} it"
                also = f", or {', '.join(ADA_SHORTHANDS)} for them" if ada else ""
                if not ada and name not in valid and (name in ADA_GROUPS or name in ADA_SHORTHANDS):  # (ADA's names)
                    also = f" (StyleGAN2-ADA's --augpipe {name} is augment.pipeline=ada augment.policy={name})"
                self._fail(
                    "policy", f"names {name!r} ({problem}); valid: a comma-separated list of {', '.join(valid)}{also}"
                )
        if self.p != "auto" and not (math.isfinite(self.p) and 0 <= self.p <= 1):
            self._fail("p", f'must be a probability in [0, 1] or "auto", got {self.p}')
        if not (math.isfinite(self.target) and 0 <= self.target < 1):
            self._fail("target", f"must be in [0, 1) (ADA: 0.6; 0 = p fixed), got {self.target}")
        positive(self, "speed_kimg")
        if not names and (self.target or self.p != "auto"):
            key, example = ("target" if self.target else "p"), "bgc" if ada else "color,translation,cutout"
            off = " and ".join(["augment.target=0"] * bool(self.target) + ['augment.p="auto"'] * (self.p != "auto"))
            self._fail(  # (found from outside: an ADA user turning it off was steered back to it)
                key, f'has no transforms to apply: set augment.policy, e.g. "{example}"; or, for no augmentation '
                f"(ADA's --aug noaug), {off}"
            )  # fmt: skip
        if names and ada and self.p == "auto" and not self.target:
            self._fail("p", "is \"auto\", which ADA's pipeline leaks into G's images at 1: set augment.target "
                       "(ADA: 0.6) or a fixed p (ADA's fixed-p runs: 0.2-0.8)")  # fmt: skip

    @property
    def transforms(self) -> list[str]:
        """The policy's names (ADA's shorthands spelt out), in ADA's own order for its pipeline."""
        names = [n.strip() for n in self.policy.split(",") if n.strip()]
        if self.pipeline != "ada":
            return names
        names = [g for n in names for g in ADA_SHORTHANDS.get(n, (n,))]
        return sorted(names, key=lambda n: ADA_GROUPS.index(n) if n in ADA_GROUPS else len(ADA_GROUPS))

    @property
    def start_p(self) -> float:
        """p at the start of a run."""
        return (0.0 if self.target else 1.0) if self.p == "auto" else float(self.p)


def _not_a_section(section: Any, path: list[str]) -> str:
    """Why `path` (dotted, its last part under `section`) names no section: the section meant, where a name is
    close to one, and those there (found from outside: `checkpoints.keep` said only "not a section")."""
    tables = [k for k, v in section.to_dict().items() if isinstance(v, dict)] if isinstance(section, Section) else []
    where = f"[{section._name}]" if isinstance(section, Section) and section._name else "the top level"
    said = f"'{'.'.join(path)}' is not a section"
    close = difflib.get_close_matches(path[-1].lower(), tables, n=1)  # (found from outside: 'TRAIN' unhinted)
    hint = f" (did you mean '{'.'.join([*path[:-1], close[0]])}'?)" if close else ""
    return f"{said}{hint}; sections in {where}: {', '.join(tables)}" if tables else said


@dataclass
class Config(Section):
    name: str = "digits"
    """Name of the recipe; new run directories are named after it."""
    task: str = "gan"
    """What is trained: a registered task (`bigbatch.tasks.list_tasks()`); "gan" is the default, so
    configs written before there were tasks load as they were."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    swap: SwapConfig = field(default_factory=SwapConfig)
    xseg: XSegConfig = field(default_factory=XSegConfig)

    def _validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            self._fail("name", f"must be letters, digits, '_', '.' or '-' (it names run folders), got {self.name!r}")
        for key, value in strings(self.to_dict()):  # data paths, weights, init_from, ...: saved with the run
            refuse_credentials(value, f"config key '{key}'")

    def override(self, updates: dict[str, Any], warn_dropped: bool = False) -> Config:
        """A new config with dotted keys replaced, e.g. {"train.batch": 256}; checked like any other.
        `warn_dropped`: warn of a table given whole (the command line's `model.options={...}`) that drops
        keys the config had."""
        if not isinstance(updates, dict):
            raise BigbatchError(f'override takes a dict of dotted keys, as {{"train.batch": 256}}, got {updates!r:.80}')
        tree = copy.deepcopy(self.to_dict())
        for dotted, value in updates.items():
            *parents, leaf = dotted.split(".")
            node, section = tree, self
            for i, part in enumerate(parents):
                child = node.get(part)
                if not isinstance(child, dict):
                    raise BigbatchError(f"unknown config key '{dotted}': {_not_a_section(section, parents[: i + 1])}")
                node, section = child, getattr(section, part)
            before = node.get(leaf)
            if warn_dropped and isinstance(before, dict) and isinstance(value, dict) and before.keys() - value.keys():
                # A table given whole replaces the table (TOML's meaning); say what that drops, which one key's
                # change (a preset's model.options={archi=...}) silently did.
                dropped = ", ".join(sorted(before.keys() - value.keys()))
                warn(
                    f"{dotted}={{...}} replaces the whole table: {dropped} go back to their defaults; to change one "
                    f"key and keep the others, write {dotted}.KEY=VALUE"
                )
            node[leaf] = value
        given = {k.removeprefix("train.") for k in updates if k.startswith("train.")}
        self._other_optimizers_keys(tree, updates.get("train.optimizer"), given)
        return Config.from_dict(tree)

    def layered(self, tree: dict[str, Any]) -> Config:
        """This config with a TOML file's `tree` laid over it: its sections key by key, a table value (as
        model.options) whole, as TOML and the command line's `model.options={...}` mean; checked like any other."""

        def over(section: Section, part: dict[str, Any], prefix: str = "") -> dict[str, Any]:
            out = section.to_dict()
            for k, v in part.items():
                below = getattr(section, k, None)
                if isinstance(below, dict) and isinstance(v, dict) and below.keys() - v.keys():  # (said, as on the
                    dropped = ", ".join(sorted(below.keys() - v.keys()))  # command line: found by review)
                    warn(
                        f"the file's [{prefix}{k}] replaces the whole table: {dropped} go back to their defaults; to "
                        f"change one key and keep the others, give {prefix}{k}.KEY=VALUE on the command line"
                    )
                out[k] = over(below, v, f"{prefix}{k}.") if isinstance(below, Section) and isinstance(v, dict) else v
            return out

        laid = over(self, tree)
        train = tree.get("train") if isinstance(tree.get("train"), dict) else {}
        self._other_optimizers_keys(laid, train.get("optimizer"), set(train))
        return Config.from_dict(laid)

    def _other_optimizers_keys(self, tree: dict[str, Any], chosen: Any, given: set[str]) -> None:
        """A train.optimizer `chosen` over this config's other one: the keys this config set that it does not read
        back to their defaults in `tree`, said, but those `given` beside it (found from outside: a preset's SGD keys
        refused the command line's train.optimizer=adamw until reset one by one, where timm's --opt ignores them)."""
        if chosen == self.train.optimizer or chosen not in OPTIMIZER_KEYS:
            return
        ours, defaults = self.train.to_dict(), TrainConfig().to_dict()
        reset = [k for k in unread_optimizer_keys(chosen) if k not in given and ours[k] != defaults[k]]
        tree["train"].update({k: defaults[k] for k in reset})
        if reset:
            said = ", ".join(f"train.{k}" for k in reset) + (" goes back to its default" if len(reset) == 1 else
                                                              " go back to their defaults")  # fmt: skip
            warn(f"train.optimizer = {chosen!r}, which does not read {'it' if len(reset) == 1 else 'them'}: {said}")

    def left_out(self, tree: dict[str, Any]) -> list[str]:
        """The dotted keys that this config sets (not None) and a TOML file's `tree` does not."""

        def keys(section: Section, part: Any, prefix: str) -> list[str]:
            out = []
            for f in dataclasses.fields(section):
                value, given = getattr(section, f.name), part.get(f.name) if isinstance(part, dict) else None
                if isinstance(value, Section):
                    out += keys(value, given, f"{prefix}{f.name}.")
                elif value is not None and (not isinstance(part, dict) or f.name not in part):
                    out.append(prefix + f.name)
            return out

        return keys(self, tree, "")

    @staticmethod
    def load(path: str | Path) -> Config:
        """Read a TOML config file (for example a run's config.toml); a run's folder gives its config.toml, the
        run's own (found from outside: a notebook's resume after a restart had no way to a bare --resume's)."""
        return Config.from_dict(read_toml(Path(path)))

    def dumps(self) -> str:
        return tomli_w.dumps(self.to_dict())
