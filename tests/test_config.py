import math

import pytest
import torch

import bigbatch
from bigbatch.config import Config, parse_override
from bigbatch.presets import list_presets
from bigbatch.tasks.gan.task import build_models


@pytest.mark.parametrize("name", list(list_presets()))
def test_every_preset_builds_models_for_its_data(name):
    cfg = bigbatch.preset(name)
    n_classes = 0 if not cfg.model.conditional else 1000 if "imagenet" in cfg.data.path else 10
    if cfg.task == "classify":
        with torch.device("meta"):
            net = bigbatch.models.create_classifier(cfg.model.name, n_classes, ch=cfg.model.ch, **cfg.model.options)
        for block in net.checkpoint_blocks:
            net.get_submodule(block)
        assert net.n_classes == n_classes and net.checkpoint_blocks
        assert len((getattr(bigbatch.presets, name).__doc__ or "").split()) > 20
        return
    if cfg.task in ("swap", "xseg"):
        from bigbatch.tasks.swap.task import build_model

        with torch.device("meta"):
            net = (
                build_model(cfg)
                if cfg.task == "swap"
                else bigbatch.models.create_segmenter(cfg.model.name, cfg.data.resolution, **cfg.model.options)
            )
        assert getattr(net, "resolution", 256) == cfg.data.resolution and net.checkpoint_blocks  # (XSeg's: 256)
        for block in net.checkpoint_blocks:
            net.get_submodule(block)
        assert len((getattr(bigbatch.presets, name).__doc__ or "").split()) > 20
        return
    with torch.device("meta"):  # shapes only: full-width models build instantly
        G, D = build_models(cfg, n_classes, 3)  # the loop's builder
    assert G.resolution == D.resolution == cfg.data.resolution and G.n_classes == D.n_classes == n_classes
    for net in (G, D):  # what the engine may activation-checkpoint exists (get_submodule raises if not)
        assert net.checkpoint_blocks
        for block in net.checkpoint_blocks:
            net.get_submodule(block)
    assert len((getattr(bigbatch.presets, name).__doc__ or "").split()) > 20  # says where its numbers come from


def test_dotted_override_is_typed_and_checked():
    cfg = bigbatch.preset("digits").override({"train.batch": 256, "train.micro_batch": 32, "train.betas": [0.5, 0.9]})
    assert cfg.train.batch == 256 and cfg.train.betas == (0.5, 0.9)
    assert isinstance(cfg.override({"train.g_lr": 1}).train.g_lr, float)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("train.batchsize", 3, ["unknown config key 'train.batchsize'", "did you mean 'batch'"]),
        ("augment.augpipe", "bgc", ['StyleGAN2-ADA\'s --augpipe is augment.pipeline = "ada" with augment.policy']),
        ("train.batch", "big", ["'train.batch' must be an integer"]),
        ("train.batch", True, ["'train.batch' must be an integer"]),
        ("train.precision", "fp8", ["'train.precision'", "'fp32'", "'bf16'"]),
        ("train.micro_batch", 0, ["'train.micro_batch' must be a positive"]),
        ("train.kimg", -1, ["'train.kimg' must be a positive number"]),
        ("model.name", "stylegan9", ["'model.name'", "dcgan"]),
        ("model.options", {"colour": 1}, ["'model.options'", "no option 'colour'"]),
        ("data.resolution", 30, ["'data.resolution'", "power of two"]),
        ("nosection.key", 1, ["'nosection.key'"]),
        ("sample.every_kimg", -1, ["'sample.every_kimg' must be >= 0", "no sample grids"]),
        # Found from outside: tracebacks from torch.manual_seed and the data order, or a plan of 2**64 steps.
        ("train.seed", 10**20, ["'train.seed' must be an integer of 64 bits, got 100000000000000000000"]),
        ("train.seed", -1, ["'train.seed' must be a whole number >= 0, got -1"]),
        ("eval.seed", -1, ["'eval.seed' must be a whole number >= 0"]),
        ("train.batch", 2**40, ["'train.batch' must be at most 16777216 images a step"]),
        ("train.grad_clip", float("inf"), ["'train.grad_clip' must be a finite number >= 0 (0 = off), got inf"]),
        ("train.lr_decay", "cosine", ['\'train.lr_decay\' must be "none" or "linear" for the GAN task']),
    ],
)
def test_bad_values_name_the_key(key, value, words):
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.preset("digits").override({key: value})
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_toml_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nbatch = 1")
    with pytest.raises(bigbatch.BigbatchError, match="not valid TOML"):
        Config.load(bad)
    bad.write_bytes(b'\xff\xfename = "x"\n')  # (a file saved as UTF-16 by an editor)
    with pytest.raises(bigbatch.BigbatchError, match=r"is not UTF-8 text \(at byte 0\), which a TOML file must be"):
        Config.load(bad)
    with pytest.raises(bigbatch.BigbatchError, match="does not exist"):
        Config.load(tmp_path / "missing.toml")
    unknown = tmp_path / "u.toml"
    unknown.write_text("[traine]\nbatch = 1\n")
    with pytest.raises(bigbatch.BigbatchError, match="did you mean 'train'"):
        Config.load(unknown)


def test_parse_override_reads_toml_values():
    assert parse_override("train.batch=256") == ("train.batch", 256)
    assert parse_override("train.g_lr=2e-4") == ("train.g_lr", 2e-4)
    assert parse_override("train.precision=bf16") == ("train.precision", "bf16")
    assert parse_override("train.betas=[0.0, 0.9]") == ("train.betas", [0.0, 0.9])
    assert parse_override("sample.truncation=inf")[1] == math.inf
    with pytest.raises(bigbatch.BigbatchError, match="key=value"):
        parse_override("train.batch")


def test_config_file_reproduces_a_run_config(tmp_path):
    cfg = bigbatch.preset("fashion32").override({"train.seed": 7, "model.options": {"d_sn": False}})
    path = tmp_path / "config.toml"
    path.write_text(cfg.dumps())
    assert Config.load(path) == cfg


def test_a_run_length_counts_whole_images_whatever_the_floats_noise():
    cfg = bigbatch.preset("digits")
    assert cfg.override({"train.kimg": 1.12 + 0.128}).train.images == 1248  # 1.2480000000000002
    assert cfg.override({"train.kimg": 0.0005}).train.images == 1  # a part of an image is one
    assert cfg.override({"train.kimg": 0.2561}).train.images == 257


def test_a_table_given_whole_replaces_it_and_says_what_it_drops(capsys):
    # Found from outside: model.options={archi=...} on the saehd_cpu preset dropped its dims without a word
    # (a 279 MB model where the preset's is 13 MB). TOML's meaning stays; the loss is said.
    cfg = bigbatch.preset("saehd_cpu")
    whole = cfg.override({"model.options": {"archi": "liae-u"}}, warn_dropped=True)  # (as the command line does)
    assert whole.model.options == {"archi": "liae-u"}
    err = capsys.readouterr().err
    assert "model.options={...} replaces the whole table: ae_dims, d_dims, d_mask_dims, e_dims go back" in err
    assert "write model.options.KEY=VALUE" in err
    one = cfg.override({"model.options.archi": "liae-u"}, warn_dropped=True)
    assert one.model.options == {**cfg.model.options, "archi": "liae-u"} and not capsys.readouterr().err


def test_fields_set_from_python_are_checked_as_from_toml(tmp_path):
    # Found from outside: cfg.train.kimgg = 50 was kept and ignored; cfg.train.kimg = "abc" failed deep inside
    # training with a TypeError; a value checked only with its section passed until then.
    cfg = bigbatch.preset("digits")
    with pytest.raises(bigbatch.BigbatchError, match=r"unknown config key 'train.kimgg' \(did you mean 'kimg'\?\)"):
        cfg.train.kimgg = 50
    with pytest.raises(bigbatch.BigbatchError, match="config key 'train.kimg' must be a number, got 'abc'"):
        cfg.train.kimg = "abc"
    cfg.train.kimg = 3  # an int where a number goes: taken as it is from TOML
    assert cfg.train.kimg == 3.0 and isinstance(cfg.train.kimg, float)
    cfg.train.lr_decay = "step"  # valid alone; without lr_steps the section is not
    with pytest.raises(bigbatch.BigbatchError, match="train.lr_steps' must list at least one kimg"):
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


def test_a_micro_batch_stylegan2s_d_cannot_group_is_refused_before_the_run_starts(tmp_path, capsys):
    # Found from outside: the dry run printed a plan, and the run made its directory before D refused the batch.
    # (Checked with the plan, at the world size: a config that trained on 4 processes still loads on one.)
    from bigbatch.cli import main

    args = ["train", "--preset", "digits", "model.name=stylegan2", "model.ch=4", "train.micro_batch=32"]
    for extra in (["--dry-run"], ["--run-dir", str(tmp_path / "run")]):
        assert main([*args, "model.options.mbstd_group=3", *extra]) == 2
        said = capsys.readouterr().err
        assert "groups of 3 images, and its micro-batch is 32: set model.options.mbstd_group=2" in said, said
        # (found from outside: "a multiple of 3" was suggested, of which none divides its batch, 64)
        # (and the micro-batch with it: found from outside, the batch alone was refused again)
        assert said.rstrip().endswith("or give a train.batch of 3 x 1 x N and a train.micro_batch of a multiple of 3 "
                                      "dividing its share"), said  # fmt: skip
    assert main([*args, "model.options.mbstd_group=3", "train.batch=48", "train.micro_batch=16", "--dry-run"]) == 2
    assert "or give train.micro_batch=12" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main([*args, "model.options.mbstd_group=8", "--dry-run"]) == 0  # (32 = 4 groups of 8)
    assert main([*args, "model.options.mbstd_group=3", "train.micro_batch=auto", "--dry-run"]) == 0
    # A micro-batch the batch cannot split into is the plan's to refuse, first (found from outside: a group that
    # fits it was offered, then the plan refused the micro-batch).
    assert main([*args, "model.options.mbstd_group=4", "train.micro_batch=6", "--dry-run"]) == 2
    assert "is not a multiple of train.micro_batch x world_size = 6 x 1" in capsys.readouterr().err
    # (a config builds whatever its world size: sample, eval and info load one trained on 4 processes)
    bigbatch.preset("digits").override(
        {"model.name": "stylegan2", "train.micro_batch": 32, "model.options.mbstd_group": 3}
    )
    # A schedule's phase is capped as train.batch is (it passed the dry run as a batch of 2**70).
    assert main(["train", "--dry-run", "data.schedule=0:32:2x,1:32:1180591620717411303424"]) == 2
    err = capsys.readouterr().err
    assert "phase from 1 kimg has batch 1180591620717411303424: at most 16777216 images a step" in err, err


def test_train_takes_a_config_and_says_so_of_anything_else():
    with pytest.raises(bigbatch.BigbatchError, match=r"train takes a Config \(bigbatch.preset\(NAME\).*got dict"):
        bigbatch.train({"name": "x"})  # (an AttributeError from deep inside, found from outside)
    with pytest.raises(bigbatch.BigbatchError, match="run_dir must be a path .a str or a Path., got int 3"):
        bigbatch.train(bigbatch.preset("digits"), run_dir=3)  # (a TypeError from pathlib)


def test_a_config_file_lays_over_a_preset_given_with_it_and_alone_says_what_it_leaves_out(tmp_path, capsys):
    # Found from outside: `[train] batch = 32` alone trained another model than the digits recipe, under its name,
    # and --preset with --config was refused: a file now lays over the preset given with it (timm's yaml and args).
    from bigbatch.cli import main
    from bigbatch.presets import base_config

    (tmp_path / "part.toml").write_text("[train]\nbatch = 32\n[model.options]\nbn_eps = 1e-4\n")
    cfg = base_config("digits", str(tmp_path / "part.toml"))
    want = bigbatch.preset("digits").override({"train.batch": 32, "model.options": {"bn_eps": 1e-4}})
    assert cfg == want and cfg.model.ch == 32 and cfg.train.betas == (0.5, 0.999)
    assert capsys.readouterr().err == ""
    alone = base_config(None, str(tmp_path / "part.toml"))
    assert alone.train.batch == 32 and alone.model.ch == Config().model.ch  # (Config's defaults, as before)
    assert "part.toml leaves out name, task, data.path, data.resolution and " in capsys.readouterr().err
    assert main(["train", "--preset", "digits", "--config", str(tmp_path / "part.toml"), "--dry-run"]) == 0
    assert "batch = 32" in capsys.readouterr().out
    # A whole file (a run's config.toml) leaves nothing out: read as it is, with no word; over a preset it leaves
    # nothing of it, which is said (found from outside: a GAN run's config over a classifier's preset, unsaid).
    (tmp_path / "whole.toml").write_text(bigbatch.preset("stylegan2_256").dumps())
    assert base_config(None, str(tmp_path / "whole.toml")) == bigbatch.preset("stylegan2_256")
    assert capsys.readouterr().err == ""
    assert base_config("digits", str(tmp_path / "whole.toml")) == bigbatch.preset("stylegan2_256")
    assert capsys.readouterr().err == (
        f"bigbatch: warning: {tmp_path / 'whole.toml'} sets every key (as a run's config.toml does): nothing of "
        "--preset digits is left; drop it\n"
    )
    (tmp_path / "opts.toml").write_text("[model.options]\nmap_layers = 2\n")  # (a table whole: said, by review)
    assert base_config("stylegan2_256", str(tmp_path / "opts.toml")).model.options == {"map_layers": 2}
    assert "the file's [model.options] replaces the whole table: mbstd_group go back" in capsys.readouterr().err
    (tmp_path / "typo.toml").write_text("[trian]\nbatch = 32\n")
    with pytest.raises(bigbatch.BigbatchError, match=r"unknown config key 'trian' \(did you mean 'train'\?\)"):
        base_config("digits", str(tmp_path / "typo.toml"))


def test_a_misspelled_section_on_the_command_line_names_the_one_meant():
    # Found from outside: `checkpoints.keep=2` said "'checkpoints' is not a section", and no more.
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.preset("digits").override({"checkpoints.keep": 2})
    assert str(e.value) == (
        "unknown config key 'checkpoints.keep': 'checkpoints' is not a section (did you mean 'checkpoint'?); "
        "sections in the top level: data, model, train, augment, checkpoint, sample, eval, swap, xseg"
    )
    with pytest.raises(bigbatch.BigbatchError, match=r"'model.option' is not a section \(did you mean 'model.opt"):
        bigbatch.preset("digits").override({"model.option.d_sn": False})
    with pytest.raises(bigbatch.BigbatchError, match=r"^unknown config key 'train.batch.x': 'train.batch' is not a s"):
        bigbatch.preset("digits").override({"train.batch.x": 1})


@pytest.mark.parametrize(
    "override, said",
    [  # (found from outside: Python's True and {'a': 1}, no way to a string of digits, a cut list as a type error)
        ("train.seed=true", "config key 'train.seed' must be an integer, got true"),
        ("train.batch={a=1}", "config key 'train.batch' must be an integer, got {a = 1}"),
        ("name=2024", "config key 'name' must be a string (quoted for TOML: name='\"2024\"'), got 2024"),
        (
            "train.betas=[0.0,0.99",
            "cannot read override 'train.betas=[0.0,0.99': its value is not TOML (Unclosed array)",
        ),
        # (found from outside: "a list of a number, got '30,60'", inf as not positive, TRAIN unhinted)
        ("train.lr_steps=30,60", "config key 'train.lr_steps' must be a list of numbers in brackets (train.lr"),
        ("train.kimg=inf", "config key 'train.kimg' must be a finite positive number, got inf"),
        ("TRAIN.batch=32", "unknown config key 'TRAIN.batch': 'TRAIN' is not a section (did you mean 'train'?)"),
    ],
)
def test_a_bad_override_is_said_in_toml(override, said):
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.preset("digits").override(dict([parse_override(override)]))
    assert str(e.value).startswith(said), str(e.value)


def test_an_empty_or_plain_override_value_is_still_a_string():
    # (found by the suite: the check of a list cut short took "" for one, refusing data.val_path= )
    assert parse_override("data.val_path=") == ("data.val_path", "")
    assert parse_override("data.path=my data.h5") == ("data.path", "my data.h5")


def test_a_runs_folder_loads_as_its_own_config(tmp_path, capsys):
    # Found from outside: after a notebook's restart, resuming from Python had no counterpart of a bare --resume
    # (Config.load of the run's folder said "Is a directory"; the mismatch message named command-line fixes only).
    cfg = bigbatch.preset("digits").override({"train.kimg": 0.5})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text(cfg.dumps())
    assert bigbatch.Config.load(tmp_path / "run") == bigbatch.Config.load(tmp_path / "run" / "config.toml") == cfg
    with pytest.raises(bigbatch.BigbatchError, match="is a folder without a config.toml: give a TOML config file"):
        bigbatch.Config.load(tmp_path)
    # ... and so does --config (found from outside: "cannot be read: Is a directory"), as a preset's name in
    # another case is hinted.
    from bigbatch.cli import main

    assert main(["train", "--dry-run", "--config", str(tmp_path / "run"), "--run-dir", str(tmp_path / "x")]) == 0
    assert "kimg = 0.5" in capsys.readouterr().out
    assert main(["train", "--dry-run", "--preset", "Digits"]) == 2
    assert "unknown preset 'Digits' (did you mean 'digits'?)" in capsys.readouterr().err


def test_another_optimizer_takes_its_own_keys_and_a_presets_keys_of_the_other_go(capsys):
    # Found from outside: fashion_resnet's SGD keys refused train.optimizer=adamw until reset one by one (timm's --opt
    # leaves them unread), and fashion_resnet_fast's AdamW betas refused sgd.
    adamw = bigbatch.preset("fashion_resnet").override({"train.optimizer": "adamw"})
    assert adamw.train.nesterov == Config().train.nesterov and adamw.train.momentum == Config().train.momentum
    said = "train.optimizer = 'adamw', which does not read it: train.nesterov goes back to its default"
    assert said in capsys.readouterr().err
    # ... and so does a config file's optimizer laid over the preset (found by review: still refused)
    assert bigbatch.preset("fashion_resnet").layered({"train": {"optimizer": "adamw"}}) == adamw
    assert said in capsys.readouterr().err
    sgd = bigbatch.preset("fashion_resnet_fast").override({"train.optimizer": "sgd", "train.momentum": 0.8})
    assert sgd.train.betas == Config().train.betas and sgd.train.momentum == 0.8  # (given beside it: kept)
    # What the command line gives beside it is the user's own: refused where the optimizer does not read it.
    from bigbatch.cli import main

    argv = ["train", "--dry-run", "--preset", "fashion_resnet", "train.optimizer=adamw", "train.nesterov=false"]
    assert main(argv) == 2 and "'train.nesterov' is not read by train.optimizer = \"adamw\"" in capsys.readouterr().err
