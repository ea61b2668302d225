"""`bigbatch convert`: BigGAN-PyTorch's weight files (or StyleGAN2-ADA's state dicts, for model.name =
"stylegan2") as a bigbatch run (one checkpoint at 0 kimg), to sample from, evaluate or fine-tune. The name
mappings are bigbatch.models.convert's and convert_ada's."""

from __future__ import annotations

from pathlib import Path

from bigbatch import checkpoints
from bigbatch.config import Config
from bigbatch.engine.ema import make_ema
from bigbatch.errors import BigbatchError, warn
from bigbatch.files import atomic_write
from bigbatch.models import convert, convert_ada
from bigbatch.tasks.gan.task import build_models


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
    source = "StyleGAN2-ADA's state dicts (G.pth, G_ema.pth, D.pth)" if ada else "BigGAN-PyTorch's weight files"
    if src.is_dir():
        files = {net: src / f"{net}.pth" for net in ("G", "G_ema", "D") if (src / f"{net}.pth").exists()}
        if "G" not in files and "G_ema" not in files:
            raise BigbatchError(
                f"{src} holds neither G.pth nor G_ema.pth ({source}) nor a DeepFaceLab SAEHD model "
                "(<name>_SAEHD_data.dat): convert reads one of those"
            )
    elif src.exists():
        files = {"G_ema": src}
    else:
        raise BigbatchError(
            f"{src} does not exist; give a folder of {source}, a G .pth file, or a DeepFaceLab SAEHD model (its "
            "folder, or its <name>_SAEHD_data.dat)"
        )
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
    if n_classes is None and ada:
        n_classes = convert_ada.classes_of(next(iter(ref.values())))
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
    G, D = build_models(cfg, n_classes, convert_ada.channels_of(next(iter(ref.values()))) if ada else 3)
    for net, model in (("G_ema", G), ("G", G)):
        if net in ref:  # G carries G_ema's weights while G.pth is read, so G_ema is never empty
            model.load_state_dict(convert.from_reference(model, ref[net], f"the weights in {files[net]}"))
    G_ema = make_ema(G)
    if "G_ema" in ref:
        G_ema.load_state_dict(convert.from_reference(G_ema, ref["G_ema"], f"the weights in {files['G_ema']}"))
    if "D" in ref:
        D.load_state_dict(convert.from_reference(D, ref["D"], f"the weights in {files['D']}"))
    else:
        where = Path(src).parent if Path(src).is_file() else src  # (found from outside: "no D.pth in .../G.pth")
        warn(f"no D.pth in {where}: D is freshly initialised (fine-tuning will train it from scratch)")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.toml", cfg.dumps())
    info = {
        "n_classes": n_classes,
        "img_channels": G.img_channels,
        "class_names": [str(i) for i in range(n_classes)],
        "converted_from": str(src),
    }
    nets = {"G": G, "D": D, "G_ema": G_ema}
    return checkpoints.save_checkpoint(out, 0, nets, {"converted_from": str(src)}, cfg.dumps(), 1, info)
