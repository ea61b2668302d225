"""`bigbatch convert`: BigGAN-PyTorch's weight files (or StyleGAN2-ADA's state dicts, for model.name =
"stylegan2") as a bigbatch run (one checkpoint at 0 kimg), to sample from, evaluate or fine-tune. The name
mappings are bigbatch.models.convert's and convert_ada's."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from bigbatch import checkpoints
from bigbatch.checkpoint_find import holds_checkpoints, network_pickle
from bigbatch.config import Config
from bigbatch.engine.ema import make_ema
from bigbatch.errors import BigbatchError, warn, warnings_off
from bigbatch.files import atomic_write
from bigbatch.models import convert, convert_ada
from bigbatch.tasks.gan.task import build_models

# BigGAN-PyTorch's utils.save_weights: G, G_ema and D, each `{net}{suffix}.pth` (suffix "" or as _best0, _copy1)
WEIGHT_FILE = re.compile(r"(G_ema|G|D)(_(?!optim|ema)\w+)?\.(pth|safetensors)")


def weight_files(src: Path, ada: bool) -> dict[str, Path]:
    """The weight files `src` names ({"G", "G_ema", "D"}: path): a folder's G.pth, G_ema.pth and D.pth, or those of
    one file's suffix beside it (found from outside: given G_ema.pth, D.pth beside it was said to be missing; given
    BigGAN-PyTorch's G_ema_best0.pth, D_best0.pth was not read); a file of another name is a generator."""
    source = "StyleGAN2-ADA's state dicts (G.pth, G_ema.pth, D.pth)" if ada else "BigGAN-PyTorch's weight files"
    if not src.exists():
        raise BigbatchError(
            f"{src} does not exist; give a folder of {source}, a G .pth file, or a DeepFaceLab SAEHD model (its "
            "folder, or its <name>_SAEHD_data.dat)"
        )
    # (found from outside: a checkpoint's G_ema.safetensors was "not a PyTorch file"; a file's folder is a
    # checkpoint only with its meta.json: a project folder with a config.toml is not one, found by review)
    if holds_checkpoints(src) if src.is_dir() else (src.parent / "meta.json").is_file():
        raise BigbatchError(
            f"{src} is a bigbatch run's already: sample, eval, export or fine-tune it (--init-from) as it is"
        )
    pickles = [src] if src.suffix == ".pkl" else sorted(src.glob("*.pkl")) if src.is_dir() else []
    named = WEIGHT_FILE.fullmatch(src.name)
    if src.is_file() and not named and not pickles:  # a generator file of another name, and the D beside it (found
        return {"G_ema": src} | _weight_files(src.parent, ("D",), "")  # from outside: read not, said to be missing)
    folder, suffix = (src.parent, named.group(2) or "") if src.is_file() and named else (src, "")
    files = _weight_files(folder, ("G", "G_ema", "D"), suffix)
    if "G" in files or "G_ema" in files:
        return files
    if pickles:  # (found from outside: a snapshot was called not a weights file, with no way on)
        raise BigbatchError(network_pickle(pickles[0]))
    if suffixed := sorted(p.name for p in folder.glob("G*.pth") if WEIGHT_FILE.fullmatch(p.name)):
        raise BigbatchError(
            f"{folder} holds no G{suffix}.pth nor G_ema{suffix}.pth, but {', '.join(suffixed[:4])}: give one of those "
            "files, and convert reads the G, G_ema and D of its suffix beside it"
        )
    raise BigbatchError(
        f"{folder} holds neither G.pth nor G_ema.pth ({source}) nor a DeepFaceLab SAEHD model "
        "(<name>_SAEHD_data.dat): convert reads one of those"
    )


def _weight_files(folder: Path, nets: tuple[str, ...], suffix: str) -> dict[str, Path]:
    """Each of `nets` whose `{net}{suffix}` file is in `folder`: its .pth (BigGAN-PyTorch's), else its .safetensors
    (found by review: a folder of them was refused)."""
    found = {
        n: [p for p in (folder / f"{n}{suffix}.pth", folder / f"{n}{suffix}.safetensors") if p.is_file()] for n in nets
    }
    return {n: paths[0] for n, paths in found.items() if paths}


def convert_reference(src: str | Path, out: str | Path, cfg: Config, n_classes: int | None = None) -> Path:
    """Write a run directory (one checkpoint at 0 kimg) holding BigGAN-PyTorch weights: `src` is its
    weights folder (G.pth, G_ema.pth and D.pth; G_ema or G suffices) or a single generator .pth.
    The model is the one `cfg` describes; the name mapping is in bigbatch.models.convert."""
    src, out = Path(src), Path(out)
    if cfg.model.name not in convert.FAMILIES:
        raise BigbatchError(
            f"BigGAN-PyTorch weights convert into {', '.join(convert.FAMILIES[:-1])} (StyleGAN2-ADA's into "
            f"stylegan2); model.name is {cfg.model.name}"
        )
    ada = cfg.model.name == "stylegan2"
    files = weight_files(src, ada)
    if out.exists() and any(out.iterdir()):
        raise BigbatchError(f"{out} exists and is not empty; choose a new folder for the converted run")
    ref = {net: convert.load_reference_file(str(path)) for net, path in files.items()}
    keys = [k for sd in ref.values() for k in sd]  # (each layout known by its own keys; another is left to the
    looks_ada = any(k.startswith(("mapping.", "synthesis.")) for k in keys)  # reader's own message)
    looks_biggan = any(k == "shared.weight" or k.startswith("blocks.") for k in keys) and not looks_ada
    if (looks_ada and not ada) or (looks_biggan and ada):  # (found from outside: ADA's under a BigGAN preset
        kind, want = (  # were asked their class count)
            ("StyleGAN2-ADA's", "a stylegan2 preset (--preset stylegan2_256)")
            if looks_ada
            else ("BigGAN-PyTorch's", "a BigGAN preset (--preset biggan128_bs2048)")
        )
        raise BigbatchError(f"{src} holds {kind} weights, and model.name is {cfg.model.name}: give {want}")
    if not looks_ada and not looks_biggan:  # (found from outside: asked for --classes, or listed 208 problems)
        first = ", ".join(sorted(keys)[:3])
        studiogan = (
            " (StudioGAN's layout, whose weights convert does not read)"
            if any(k.endswith("weight_orig") for k in keys)
            else ""
        )
        raise BigbatchError(
            f"{src} holds no weights in BigGAN-PyTorch's layout (shared.weight, blocks.0.0.*) nor in StyleGAN2-ADA's "
            f"(mapping.*, synthesis.*): its names begin {first}{studiogan}"
        )
    if n_classes is None and ada:
        n_classes = convert_ada.classes_of(next(iter(ref.values())))
    if ada and convert_ada.classes_of(next(iter(ref.values()))) and not cfg.model.conditional:
        # (found from outside: a conditional snapshot under a paper preset listed 3 problems, none naming this key)
        warn(f"{src} holds a class-conditional StyleGAN2-ADA model: converted with model.conditional=true")
        cfg = cfg.override({"model.conditional": True})
    if n_classes is None:
        found = [sd[k].shape[0] for sd in ref.values() for k in ("shared.weight", "embed.weight") if k in sd]
        # A G without a shared embedding (the CIFAR script's): each conditional BN's gain is an embedding, (classes,
        # channels), where a shared one's is a spectrally normalised linear map with its u0 (found from outside).
        found += [
            sd[k].shape[0]
            for sd in ref.values()
            for k in sd
            if k.endswith(".gain.weight") and sd[k].dim() == 2 and k.removesuffix("weight") + "u0" not in sd
        ]
        if not found:
            raise BigbatchError("cannot tell the number of classes from the weights; pass --classes N")
        n_classes = int(found[0])
    channels = convert_ada.channels_of(next(iter(ref.values()))) if ada else 3
    if ada:
        convert_ada.check_architectures(ref, files, bool(cfg.model.options.get("d_resnet", True)))
    _check_resolution(cfg, ref, files, n_classes, channels)
    G, D = build_models(cfg, n_classes, channels)
    for net, model in (("G_ema", G), ("G", G)):
        if net in ref:  # G carries G_ema's weights while G.pth is read, so G_ema is never empty
            model.load_state_dict(convert.from_reference(model, ref[net], f"the weights in {files[net]}"))
    G_ema = make_ema(G)
    if "G_ema" in ref:
        G_ema.load_state_dict(convert.from_reference(G_ema, ref["G_ema"], f"the weights in {files['G_ema']}"))
    else:  # (found from outside: unsaid, where a missing D was said; BigGAN-PyTorch writes G_ema only with --ema)
        named = WEIGHT_FILE.fullmatch(files["G"].name)
        warn(
            f"no G_ema{named.group(2) or '' if named else ''}{files['G'].suffix} in {files['G'].parent}: G_ema starts "
            "as a copy of G (sample and export draw G's own weights until training averages them)"
        )
    if "D" in ref:
        D.load_state_dict(convert.from_reference(D, ref["D"], f"the weights in {files['D']}"))
    else:
        gen = files.get("G_ema") or files["G"]  # (found from outside: "no D.pth in .../G.pth")
        named = WEIGHT_FILE.fullmatch(gen.name)
        d = f"D{named.group(2) or ''}.pth" if named else "D.pth"
        warn(f"no {d} in {gen.parent}: D is freshly initialised (fine-tuning will train it from scratch)")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.toml", cfg.dumps())
    info = {
        "n_classes": n_classes,
        "img_channels": G.img_channels,
        "class_names": [str(i) for i in range(n_classes)],
        "converted_from": str(src),
    }
    nets = {"G": G, "D": D, "G_ema": G_ema}
    # A checkpoint at 0 images that `bigbatch train --run-dir OUT --resume` continues: fresh optimizers (the source's
    # moments are not converted), G_ema blended on from its first step (GANTask.ema_pretrained)
    rng = torch.Generator().manual_seed(cfg.train.seed).get_state()
    state = {"converted_from": str(src), "nimg": 0, "seconds": 0.0, "g_steps": 0, "engine": {}, "rng_cpu": rng}
    state["ema_pretrained"] = True
    return checkpoints.save_checkpoint(out, 0, nets, state, cfg.dumps(), 1, info)


def _names(cfg: Config, n_classes: int, channels: int, resolution: int) -> dict[str, set[str]] | None:
    """The reference layout's names of G's and D's entries as `cfg` describes them at `resolution` (built on the
    meta device: no memory, no time), or None where the model refuses that resolution."""
    try:
        with warnings_off(), torch.device("meta"):  # (its warnings are of sizes no one gave)
            G, D = build_models(cfg.override({"data.resolution": resolution}), n_classes, channels)
    except BigbatchError:
        return None
    return {net: set(convert.to_reference(m)) for net, m in (("G", G), ("D", D))}


def _check_resolution(cfg: Config, ref: dict, files: dict[str, Path], n_classes: int, channels: int) -> None:
    """BigbatchError naming the weights' resolution where they are another than data.resolution (found from
    outside: 16 missing entries and "check the options" said it, after a warning of dim_z)."""

    def kept(sd: dict) -> set[str]:
        return {k for k in sd if k.rsplit(".", 1)[-1] not in convert.IGNORED}

    def fits(names: dict[str, set[str]] | None) -> bool:
        return names is not None and all(kept(sd) == kept(names["D" if net == "D" else "G"]) for net, sd in ref.items())

    if fits(_names(cfg, n_classes, channels, cfg.data.resolution)):
        return
    for size in (16, 32, 64, 128, 256, 512, 1024):
        if size != cfg.data.resolution and fits(_names(cfg, n_classes, channels, size)):
            where = files.get("G_ema") or files.get("G") or files["D"]
            raise BigbatchError(
                f"the weights in {where} are of a {size} px {cfg.model.name}, and data.resolution is "
                f"{cfg.data.resolution}: give data.resolution={size}"
            )
