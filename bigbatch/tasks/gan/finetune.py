"""Fine-tuning a GAN: G, D and G_ema from a pretrained run or checkpoint (train.init_from), and FreezeD."""

from __future__ import annotations

from torch import nn

from bigbatch import checkpoint_find, checkpoints
from bigbatch.config import Config
from bigbatch.errors import BigbatchError, warn


def load_pretrained(net: nn.Module, weights: dict, what: str) -> list[str]:
    """Load pretrained `weights` into `net`. Class embeddings (and D's projection) whose shape differs,
    because the number of classes does, keep their fresh initialisation; return their names."""
    ours = net.state_dict()
    class_keys = {
        f"{name}.{k}" if name else k
        for name, m in net.named_modules()
        if isinstance(m, nn.Embedding) or getattr(m, "holds_classes", False)  # (StyleGAN2's mapping: a linear layer)
        for k in m.state_dict()
    }
    take, fresh = {}, []
    for key, value in ours.items():
        w = weights.get(key)
        if w is not None and w.shape == value.shape:
            take[key] = w
        elif key in class_keys:
            fresh.append(key)
        else:
            found = "is missing" if w is None else f"has shape {tuple(w.shape)}, this model needs {tuple(value.shape)}"
            raise BigbatchError(
                f"cannot fine-tune from {what}: {key} {found}; model.name, ch, dim_z, options, model.conditional and "
                "data.resolution must match the pretrained run's (and, for dcgan, the number of classes)"
            )
    checkpoints.refuse_not_finite(take, net, f"cannot fine-tune from {what}")
    net.load_state_dict(take, strict=False)
    return fresh


def init_from(path: str, G: nn.Module, D: nn.Module, family: str, main: bool, quiet: bool) -> dict:
    """Load G and D of model family `family` from the run or checkpoint at `path` (the optimizers start afresh);
    return its G_ema weights, to load once G_ema exists. Said on the `main` process: where from (not `quiet`), and
    the weights re-initialised for another number of classes, as a warning (under --quiet too: found from outside)."""

    def read(ckpt):
        cfg = Config.load(ckpt / "config.toml")
        if cfg.task != "gan":  # (its weights would be "missing": a checkpoint of another task has no G)
            raise BigbatchError(f"train.init_from {path} is a {cfg.task} run; a GAN fine-tunes from a GAN run")
        if cfg.model.name != family:  # (found from outside: "w_avg is missing", a buffer of one family's G)
            raise BigbatchError(
                f"train.init_from {path} is a {cfg.model.name} run, and this one trains {family}: fine-tuning takes "
                f"the weights of the same model family (model.name={cfg.model.name})"
            )
        return ckpt, checkpoints.load_checkpoint(ckpt, nets=("G", "D", "G_ema"))

    ckpt, (weights, _) = checkpoint_find.read_newest(path, read)
    was = (checkpoints.read_meta(ckpt) or {}).get("n_classes")
    if family == "dcgan" and was is not None and was != G.n_classes:  # (found from outside: a tensor's shape said)
        unconditional = "unconditional (model.conditional = false, or data without classes)"
        if was and G.n_classes:
            said = f"was trained on {was} classes and this data set has {G.n_classes}"
            fix = "onto data of as many classes"
        else:  # (found from outside: "this data set has 0" of data of 10, where model.conditional differed)
            ran = f"on {was} classes" if was else unconditional
            now = f"conditional on the data's {G.n_classes}" if G.n_classes else unconditional
            said, fix = f"was trained {ran} and this run is {now}", f"with model.conditional = {str(bool(was)).lower()}"
        raise BigbatchError(
            f"train.init_from {path} {said}: dcgan feeds the class to G's first layer with z, so it fine-tunes "
            f"{fix} only (biggan, sagan, sngan and stylegan2 re-initialise their class embeddings)"
        )
    fresh = {k: load_pretrained(net, weights[k], f"{k} of {ckpt}") for k, net in (("G", G), ("D", D))}
    if main and not quiet:
        print(f"Fine-tuning from {ckpt}", flush=True)
    if main and (named := [f"{k}'s {', '.join(sorted(set(v)))}" for k, v in fresh.items() if v]):
        # (as many classes, or a head the pretrained run had not: D's class head of another d_cond, found by review)
        head = was == G.n_classes or any(key not in weights[k] for k, v in fresh.items() for key in v)
        what = "this run's class head, another than the pretrained run's" if head else "this data set's classes"
        warn(f"train.init_from {ckpt}: re-initialised for {what}: {'; '.join(named)}")
    return weights["G_ema"]


def freeze_d_blocks(D: nn.Module, n: int) -> None:
    """FreezeD (Mo et al. 2020): stop training D's first `n` blocks (and its input layer and any
    attention among them)."""
    if n == 0:
        return
    blocks = getattr(D, "blocks", None)
    if blocks is None or n > len(blocks):
        raise BigbatchError(f"train.freeze_d={n}, but this D has {len(blocks or [])} blocks")
    for block in list(blocks)[:n]:
        block.requires_grad_(False)
    for name in ("input_conv", "fromrgb"):  # (BigGAN's and StyleGAN2's input layer, which feeds the blocks)
        if getattr(D, name, None) is not None:
            getattr(D, name).requires_grad_(False)
    if getattr(D, "attention", None) is not None and D.attn_after < n:
        D.attention.requires_grad_(False)
