"""D with an auxiliary classifier (model.options.d_cond = "AC", StudioGAN's ACGAN), found missing from outside by a
StudioGAN user (projection was the one way a D here read the class): D's loss adds train.cond_lambda x its
cross-entropy on the real images' classes, G's on its fakes'; resumed bit for bit; refused where it cannot be."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import bigbatch
from bigbatch.cli import main
from bigbatch.sampling import from_uint8

SMALL = ["data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=16", "sample.every_kimg=0"]
AC = [*SMALL, "model.options.d_cond=AC", "train.cond_lambda=0.5", "checkpoint.every_kimg=0.032"]


@pytest.mark.parametrize("d_cond", ["AC", "ADC"])
def test_d_and_g_add_the_classifiers_cross_entropy_on_the_reals_and_on_the_fakes(tmp_path, monkeypatch, d_cond):
    # ADC (ADCGAN, StudioGAN's aux_cls_type "ADC"): 2 x 10 classes, a real image's class c is 2c and a fake's 2c + 1;
    # D learns both, G its fakes' 2c and away from 2c + 1.
    from bigbatch.tasks.gan.task import GANTask

    seen = {"D": [], "G": []}
    d_loss, g_loss = GANTask.d_loss, GANTask.g_loss
    adc = d_cond == "ADC"

    def d_looked(self, micro):
        out = d_loss(self, micro)
        images, labels, z, y_fake = micro[:4]
        with torch.no_grad():  # (D's weights as the loss saw them: the step applies after every micro-batch)
            logits = self.D(from_uint8(images.to(self.rep.device)), labels).float()
            faked = self.D(self._fake(z, y_fake), y_fake).float()
        want = {"ac_real": F.cross_entropy(logits[:, 1:], 2 * labels if adc else labels)}
        want |= {"adc_fake": F.cross_entropy(faked[:, 1:], 2 * y_fake + 1)} if adc else {}
        seen["D"].append((out, want, logits.shape))
        return out

    def g_looked(self, micro):
        out = g_loss(self, micro)
        z, y = micro[0], micro[1]
        with torch.no_grad():
            logits = self.D(self._fake(z, y), y).float()
        want = F.cross_entropy(logits[:, 1:], 2 * y if adc else y)
        want = want - F.cross_entropy(logits[:, 1:], 2 * y + 1) if adc else want
        seen["G"].append((out, {"ac_fake": want}, logits.shape))
        return out

    monkeypatch.setattr(GANTask, "d_loss", d_looked)
    monkeypatch.setattr(GANTask, "g_loss", g_looked)
    argv = [*AC, f"model.options.d_cond={d_cond}", "train.kimg=0.032", "--run-dir", str(tmp_path / "r")]
    assert main(["train", *argv]) == 0
    for net, adversarial in (("D", "loss_D"), ("G", "loss_G")):
        for out, want, shape in seen[net]:
            assert shape == (16, 1 + (20 if adc else 10))  # the logit, then digits' 10 classes (ADC: twice)
            for key, value in want.items():
                torch.testing.assert_close(out[key], value, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(out["loss"].detach(), out[adversarial] + 0.5 * sum(want.values()))
    rows = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert '"ac_real"' in rows and '"ac_fake"' in rows and ('"adc_fake"' in rows) == adc


def test_an_ac_run_resumes_bit_exact_and_a_projection_run_fine_tunes_into_one(tmp_path, capsys):
    def weights(run):
        return load_file(tmp_path / run / "checkpoints" / "000000.064" / "D.safetensors")

    assert main(["train", *AC, "train.kimg=0.064", "--run-dir", str(tmp_path / "straight")]) == 0
    assert main(["train", *AC, "train.kimg=0.032", "--run-dir", str(tmp_path / "resumed")]) == 0
    assert main(["train", *AC, "train.kimg=0.064", "--run-dir", str(tmp_path / "resumed"), "--resume"]) == 0
    a, b = weights("straight"), weights("resumed")
    assert a.keys() == b.keys() and "classify.weight" in a and all(torch.equal(a[k], b[k]) for k in a)
    # A projection D's run fine-tuned with an auxiliary classifier: its head starts anew, said.
    capsys.readouterr()
    argv = [*SMALL, "train.kimg=0.032", "--init-from", str(tmp_path / "projection")]
    assert main(["train", *SMALL, "train.kimg=0.032", "--run-dir", str(tmp_path / "projection")]) == 0
    assert main(["train", *argv, "model.options.d_cond=AC", "--run-dir", str(tmp_path / "tuned")]) == 0
    said = "re-initialised for this run's class head, another than the pretrained run's: D's classify.sn_u"
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, said",
    [
        (["model.name=stylegan2", 'model.options={d_cond="AC"}'], "'stylegan2' has no option 'd_cond'"),
        (["model.options.d_cond=AC", "model.conditional=false"], "d_cond = 'AC' classifies the images by class"),
        (["train.cond_lambda=0.5"], "'train.cond_lambda' weighs an auxiliary classifier's loss"),
    ],
)
def test_where_it_cannot_be_it_is_one_line(extra, said, capsys):
    assert main(["train", *SMALL, *extra, "--dry-run"]) == 2
    assert said in capsys.readouterr().err


def test_an_auxiliary_classifier_of_no_weight_is_said(capsys, monkeypatch):
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    assert main(["train", *SMALL, "model.options.d_cond=AC", "train.cond_lambda=0", "--dry-run"]) == 0
    assert "neither G nor D learns from the class" in capsys.readouterr().err


def test_every_family_with_a_projection_d_offers_it():
    for family in ("biggan", "biggan_deep", "sagan", "sngan", "dcgan"):
        G, D = bigbatch.models.create(family, resolution=32, n_classes=7, ch=8, dim_z=16, d_cond="AC")
        assert D(torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 6])).shape == (3, 8), family
        assert D.embed is None  # (no projection beside it: StudioGAN's AC)
    G, D = bigbatch.models.create("biggan", resolution=32, n_classes=7, ch=8, dim_z=16, d_cond="AC")
    with pytest.raises(bigbatch.BigbatchError, match="has no BigGAN-PyTorch layout"):  # (its Ds project the class)
        bigbatch.models.convert.to_reference(D)
