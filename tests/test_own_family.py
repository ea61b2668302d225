"""A user's own model family through bigbatch's loop: what breaks the registry's contract is said in one line as the
task builds it, before anything is written (found from outside: a G that took class labels alone died at its first
checkpoint's previews, and every resume with it; a D's logits of another count were blamed on the learning rate)."""

import pytest
import torch
from torch import nn

import bigbatch


class _G(nn.Module):
    def __init__(self, resolution, n_classes, dim_z, img_channels, weights_too):
        super().__init__()
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.embed, self.weights_too = nn.Embedding(max(n_classes, 1), dim_z), weights_too
        self.fc = nn.Linear(dim_z, img_channels * resolution * resolution)

    def forward(self, z, y=None):
        if y is not None:  # labels; class weights only where it takes them
            z = z + (y @ self.embed.weight if self.weights_too and y.dim() == 2 else self.embed(y))
        return torch.tanh(self.fc(z)).view(len(z), self.img_channels, self.resolution, self.resolution)


class _D(nn.Module):
    def __init__(self, resolution, img_channels, halved, wide=1):
        super().__init__()
        self.fc, self.halved = nn.Linear(img_channels * resolution * resolution, wide), halved

    def forward(self, x, y=None):
        out = self.fc(x.flatten(1))
        out = out.flatten() if out.shape[1] == 1 else out  # (a head of several: (N, 3))
        return out[: len(out) // 2] if self.halved else out


def labels_only_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
    return _G(resolution, n_classes, dim_z, img_channels, False), _D(resolution, img_channels, False)


def half_logits_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
    return _G(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, True)


def three_logits_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
    return _G(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, False, wide=3)


class _DoubleG(_G):
    def forward(self, z, y=None):
        return super().forward(z, y).double()


def double_images_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
    return _DoubleG(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, False)


class _Classifier(nn.Module):
    def __init__(self, n_classes, img_channels):
        super().__init__()
        self.n_classes, self.img_channels, self.feature_dim = n_classes, img_channels, 8
        self.body, self.head = nn.Conv2d(img_channels, 8, 3), nn.Linear(8, 5)  # 5 logits, whatever n_classes

    def features(self, x):
        return self.body(x).mean((2, 3))

    def forward(self, x):
        return self.head(self.features(x))


def five_logits(*, n_classes: int, ch: int = 8, img_channels: int = 3):
    return _Classifier(n_classes, img_channels)


@pytest.fixture(autouse=True)
def families(monkeypatch):
    """These tests' families, in a registry of their own (the other tests list the families)."""
    from bigbatch.models import registry

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    for fn, init, task in (
        (labels_only_gan, "N02", "gan"),
        (half_logits_gan, "N02", "gan"),
        (three_logits_gan, "N02", "gan"),
        (double_images_gan, "N02", "gan"),
    ):
        registry.register(init=init, task=task)(fn)
    registry.register(init="kaiming", task="classify")(five_logits)


@pytest.mark.parametrize(
    "task, family, said",
    [
        ("gan", "labels_only_gan", "labels_only_gan's G(z, y) failed on class weights (N, n_classes) (RuntimeError: "),
        ("gan", "half_logits_gan", "half_logits_gan's D(x, y) returned (1,) for 2 inputs, not (2,): D returns one"),
        # (found from outside: a head of classes' logits trained on their mean without a word)
        ("gan", "three_logits_gan", "three_logits_gan's D(x, y) returned (2, 3) for 2 inputs, not (2,): D returns"),
        # (found from outside: torch's dtype error out of the user's D)
        ("gan", "double_images_gan", "double_images_gan's G(z, y) returned float64 images for float32 z: G returns"),
        ("classify", "five_logits", "five_logits's forward(x) returned (2, 5) for 2 inputs, not (2, 10): a classifier"),
    ],
)
def test_a_family_that_breaks_the_contract_is_one_line_before_anything_is_written(tmp_path, task, family, said):
    cfg = bigbatch.preset("digits" if task == "gan" else "fashion_resnet").override(
        {"model.name": family, "model.options": {}, "data.path": "builtin:digits", "data.resolution": 16}
    )
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    assert str(e.value).startswith(said), e.value
    assert not (tmp_path / "r").exists()


def test_the_registry_takes_a_notebooks_reload_lists_for_tuples_and_says_what_an_option_lacks():
    from bigbatch.models.registry import options

    def family(widths):  # the same module's family again, as importlib.reload registers it
        @bigbatch.models.register(init="N02")
        def reloaded_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3,
                         widths: tuple = widths, depth: int):  # fmt: skip
            assert isinstance(widths, tuple)
            return _G(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, False)

    family((8, 8))
    family((4, 4))  # (found from outside: "registered already", and a notebook had to restart)
    assert options("reloaded_gan")["widths"] == (4, 4)
    with pytest.raises(bigbatch.BigbatchError, match="^'reloaded_gan' has no default for depth: give model.options"):
        bigbatch.models.create("reloaded_gan", 16)
    bigbatch.models.create("reloaded_gan", 16, widths=[8, 16], depth=2)  # (a TOML list: "must be tuple")
    with pytest.raises(TypeError, match="^dcgan is one of bigbatch's own model families: give yours another name"):

        @bigbatch.models.register(init="N02")
        def dcgan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
            return _G(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, False)


# A user's module that registers a family (imported by name: BIGBATCH_IMPORT, a launcher's ranks).
OWN = """
import torch
from torch import nn

import bigbatch


class G(nn.Module):
    def __init__(self, resolution, n_classes, dim_z, img_channels):
        super().__init__()
        self.resolution, self.n_classes, self.dim_z, self.img_channels = resolution, n_classes, dim_z, img_channels
        self.embed = nn.Embedding(max(n_classes, 1), dim_z)
        self.fc = nn.Linear(dim_z, img_channels * resolution * resolution)

    def forward(self, z, y=None):
        if y is not None:
            z = z + (y @ self.embed.weight if y.dim() == 2 else self.embed(y))
        return torch.tanh(self.fc(z)).view(len(z), self.img_channels, self.resolution, self.resolution)


class D(nn.Module):
    def __init__(self, resolution, img_channels):
        super().__init__()
        self.fc = nn.Linear(img_channels * resolution * resolution, 1)

    def forward(self, x, y=None):
        return self.fc(x.flatten(1)).flatten()


@bigbatch.models.register(init="N02", task="gan")
def module_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
    return G(resolution, n_classes, dim_z, img_channels), D(resolution, img_channels)
"""


def own_module(tmp_path, monkeypatch) -> str:
    """own_gan_module.py in a folder of its own, imported here (forgotten after the test); the folder."""
    import importlib
    import sys

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "own_gan_module.py").write_text(OWN)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "own_gan_module", raising=False)  # (an earlier test's: imported anew)
    importlib.import_module("own_gan_module")
    return str(folder)


def test_the_command_line_knows_a_family_whose_module_bigbatch_import_names(tmp_path, capsys, monkeypatch):
    # Found from outside: sample, eval, export, info and a resume of a run of one's own family were refused.
    import os
    import subprocess
    import sys

    folder = own_module(tmp_path, monkeypatch)
    cfg = bigbatch.preset("digits").override(
        {"model.name": "module_gan", "model.options": {}, "data.resolution": 16, "train.kimg": 0.032}
    )
    run = bigbatch.train(cfg.override({"sample.every_kimg": 0}), run_dir=tmp_path / "r")
    assert f"Sample with: BIGBATCH_IMPORT=own_gan_module bigbatch sample {run}" in capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": "1"}
    said = {"": "names no GAN model family 'module_gan'; valid: ", "own_gan_module": "state       done"}
    for given, words in said.items():
        out = subprocess.run([sys.executable, "-m", "bigbatch", "info", str(run)], capture_output=True, text=True,
                             env={**env, "BIGBATCH_IMPORT": given})  # fmt: skip
        assert words in out.stdout + out.stderr, out.stderr
        assert given or "is imported: BIGBATCH_IMPORT=MODULE bigbatch ..." in out.stderr


def test_a_launchers_ranks_import_the_module_of_a_family_and_one_a_script_registered_is_refused(tmp_path, monkeypatch):
    # Found from outside: a sweep's runs through Dask each refused a family of one's own, once started.
    import os

    from bigbatch.launch import local

    for name in ("BIGBATCH_IMPORT", "BIGBATCH_IMPORT_PATH"):  # (set by the run: put back after)
        monkeypatch.setenv(name, "")
    own_module(tmp_path, monkeypatch)  # (its folder, which the ranks are given, as the launcher finds it)
    cfg = bigbatch.preset("digits").override({"model.name": "module_gan", "model.options": {}, "train.kimg": 0.032})
    handle = local.run(cfg.override({"data.resolution": 16, "sample.every_kimg": 0}), tmp_path / "r")
    result = handle.result(timeout=120)
    assert result.status == 0 and not result.stopped and os.environ["BIGBATCH_IMPORT"] == "own_gan_module", result

    def script_gan(*, resolution: int, n_classes: int, ch: int = 8, dim_z: int = 8, img_channels: int = 3):
        return _G(resolution, n_classes, dim_z, img_channels, True), _D(resolution, img_channels, False)

    script_gan.__module__ = "__main__"
    bigbatch.models.register(init="N02")(script_gan)
    with pytest.raises(bigbatch.BigbatchError, match="^model family 'script_gan' is registered in the script that"):
        local.run(cfg.override({"model.name": "script_gan"}), tmp_path / "s")
