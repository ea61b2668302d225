"""After a classify run: `bigbatch eval` (the held-out split or other data, a report per data set and
checkpoint), `predict` and `export` (TorchScript, ONNX, pt2) giving the classes eval gives, and fine-tuning
from it or from a state dict (train.init_from)."""

import csv
import json
import math
import shlex
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from test_classify import tiny

import bigbatch
from bigbatch.cli import main
from bigbatch.config import Config
from bigbatch.data.load import training_data, validation_data
from bigbatch.data.sources import to_rgb
from bigbatch.errors import BigbatchError
from bigbatch.tasks.classify.validation import val_transform


def test_eval_scores_a_classify_run_with_its_confusion_matrix_and_top_losses(tmp_path, capsys, monkeypatch):
    run = bigbatch.train(tiny(), run_dir=tmp_path / "run", quiet=True)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if "val_top1" in r][-1]
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "confusion.png" in out
    folder = run / "eval" / "heldout-000000.512"
    metrics = json.loads((folder / "metrics.json").read_text())
    # The held-out split at the resolution last trained at: what the run itself logged at its end.
    assert metrics["top1"] == pytest.approx(last["val_top1"]) and metrics["loss"] == pytest.approx(last["val_loss"])
    assert metrics["n"] == 360 and metrics["resolution"] == 16
    confusion = [[int(v) for v in row[1:]] for row in csv.reader((folder / "confusion.csv").open())][1:]
    assert sum(map(sum, confusion)) == 360
    assert 100 * sum(confusion[i][i] for i in range(10)) / 360 == pytest.approx(metrics["top1"])
    per_class = list(csv.reader((folder / "per_class.csv").open()))
    assert [r[0] for r in per_class[1:]] == [str(i) for i in range(10)]
    # fastai's most_confused: the off-diagonal cells, largest first (found from outside: missing).
    pairs = sorted((-confusion[i][j], i, j) for i in range(10) for j in range(10) if i != j and confusion[i][j])
    assert metrics["most_confused"] == [[str(i), str(j), -n] for n, i, j in pairs[:20]]
    t, p, n = metrics["most_confused"][0]
    assert f"most confused: {t} as {p} ({n})" in out
    assert Image.open(folder / "top_losses.png").size == (4 * 98, 4 * (98 + 38))  # 16 images, 4 a row, 3 lines
    assert Image.open(folder / "confusion.png").size
    # --tta (fastai's test-time augmentation): each image's probabilities averaged with its mirror image's,
    # in a report of its own; predict takes it too.
    assert main(["eval", str(run), "--tta"]) == 0
    tta = json.loads((run / "eval" / "heldout-tta-000000.512" / "metrics.json").read_text())
    assert tta["tta"] is True and tta["n"] == 360 and tta["loss"] != metrics["loss"]
    net = bigbatch.load_classifier(run)
    held = validation_data(Config.load(run / "config.toml"))
    images, labels = held.get(torch.arange(len(held)))
    x = val_transform(images, 16, Config.load(run / "config.toml").data.val_crop, False)
    with torch.no_grad():
        p = (net(x).softmax(1) + net(x.flip(-1)).softmax(1)) / 2
    assert tta["loss"] == pytest.approx(float(-p.gather(1, labels[:, None]).log().mean()), rel=1e-4)
    # Other data of the same classes; another checkpoint; data of other classes is one line.
    monkeypatch.setattr("bigbatch.images_done.LINE_EVERY_S", 0.0)  # off a terminal: a progress line a batch
    assert main(["eval", str(run), "builtin:digits", "--checkpoint", "best"]) == 0
    err = capsys.readouterr().err
    assert "eval: predictions: " in err and "/1797 images" in err
    (best,) = (run / "eval").glob("digits-best-0*")  # named by its kimg: a later best gets a folder of its own
    assert json.loads((best / "metrics.json").read_text())["n"] == 1797
    # Found from outside: two data files of one name in two folders crashed the second report (hashing the name).
    for side, side_px in (("a", "16"), ("b", "12")):  # (other images: the same ones are one data set, one report)
        assert main(["prepare", "builtin:digits", str(tmp_path / side / "d.h5"), "--resolution", side_px]) == 0
        assert main(["eval", str(run), str(tmp_path / side / "d.h5")]) == 0
    assert len(list((run / "eval").glob("d-*"))) == 2
    # Found from outside: every checkpoint's report, and a file named val.h5's, went to eval/val/, each
    # replacing the one before. One folder per data set and checkpoint now.
    assert main(["eval", str(run), "--checkpoint", "000000.256"]) == 0
    assert json.loads((run / "eval" / "heldout-000000.256" / "metrics.json").read_text())["checkpoint"].endswith("256")
    assert json.loads((folder / "metrics.json").read_text()) == metrics
    for c in ("cat", "dog"):
        (tmp_path / "pets" / c).mkdir(parents=True) or Image.new("RGB", (16, 16)).save(tmp_path / "pets" / c / "a.png")
    bigbatch.data.prepare(str(tmp_path / "pets"), str(tmp_path / "pets.h5"), 16, workers=0)
    capsys.readouterr()
    assert main(["eval", str(run), str(tmp_path / "pets.h5")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has other classes than the run (2 against 10; the first that differs" in err
    # (no class of the run's: not to be prepared again with the run's classes, found from outside)
    assert "is number 0: 'cat' here, '0' in the run); none of its classes is one of the run's: give images of" in err
    for c in ("0", "1"):  # some of the run's classes: prepared again with the run's, they score
        (tmp_path / "part" / c).mkdir(parents=True) or Image.new("RGB", (16, 16)).save(tmp_path / "part" / c / "a.png")
    bigbatch.data.prepare(str(tmp_path / "part"), str(tmp_path / "part.h5"), 16, workers=0)
    assert main(["eval", str(run), str(tmp_path / "part.h5")]) == 2
    assert "none here, '2' in the run); prepare it again with --classes builtin:digits" in capsys.readouterr().err
    assert not list((run / "eval").glob("pets*"))
    # A folder of class folders (found from outside: "cannot open data set") is named, with the command that
    # prepares it in the run's class order; that command's file scores.
    for c in ("3", "7"):
        (tmp_path / "digits" / c).mkdir(parents=True)
        Image.fromarray(np.full((20, 16, 3), 200, np.uint8)).save(tmp_path / "digits" / c / "a.png")
    assert main(["eval", str(run), str(tmp_path / "digits")]) == 2
    said = capsys.readouterr().err.split("write one with: ")[1].split(", then")[0]
    assert "--classes builtin:digits" in said and "--codec png" in said  # (lossless: predict's score)
    argv = shlex.split(said.replace("scored.h5", str(tmp_path / "scored.h5")))[1:]
    assert main(argv) == 0 and main(["eval", str(run), str(tmp_path / "scored.h5")]) == 0
    assert main(["eval", str(run), "--checkpoint", "000099.000"]) == 2
    assert "no complete checkpoint '000099.000'" in capsys.readouterr().err
    assert main(["eval", str(run), "--metrics", "fid", "--n", "50"]) == 2  # not ignored without a word
    assert "--metrics and --n are for scoring a GAN's samples or images; a classify run's eval reports top-1" in (
        capsys.readouterr().err
    )
    ckpt = next(p for p in (run / "checkpoints").iterdir() if p.name[0].isdigit())
    assert main(["eval", str(ckpt), "--checkpoint", "best"]) == 2  # a checkpoint is one already
    assert "is a checkpoint already" in capsys.readouterr().err
    for command in (["eval", str(ckpt)], ["predict", str(ckpt), str(tmp_path / "pets")], ["export", str(ckpt), "m.pt"]):
        assert main([*command, "--checkpoint", "latest"]) == 2  # (found from outside: the folder's own, unsaid)
        assert "is a checkpoint already: --checkpoint latest names one of a run directory" in capsys.readouterr().err
    for which in ("best", "latest"):  # (latest, the default's name: found from outside, taken without a word)
        assert main(["eval", str(tmp_path / "pets"), "--checkpoint", which]) == 2
        assert "--checkpoint picks a checkpoint of a run" in capsys.readouterr().err


def predict_p(module, image):
    """predict's probabilities of one image, in class order."""
    from bigbatch.tasks.classify.inference import predict

    (row,) = predict(module, [("x", image)], topk=len(module.class_names))
    return torch.tensor([t["p"] for t in sorted(row["top"], key=lambda t: module.class_names.index(t["class"]))])


def test_predict_and_export_give_the_classes_eval_gives(tmp_path, capsys):
    run = bigbatch.train(tiny(**{"train.kimg": 0.256}), run_dir=tmp_path / "run", quiet=True)
    held = validation_data(Config.load(run / "config.toml"))
    images, labels = held.get(torch.arange(6))
    (tmp_path / "imgs").mkdir()
    for i, img in enumerate(images):
        Image.fromarray(img.numpy()).save(tmp_path / "imgs" / f"{i}.png")
    (broken := tmp_path / "imgs" / "broken.png").write_bytes(b"not a png")
    (tmp_path / "imgs" / "sub").mkdir()  # a sub-folder: its images and those beside it are all predicted
    Image.fromarray(images[0].numpy()).save(tmp_path / "imgs" / "sub" / "again.png")
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path / "imgs"), "--json", "--topk", "3"]) == 0
    out, err = capsys.readouterr()
    listed = json.loads(out)
    rows = [r for r in listed if "top" in r]
    assert "broken.png: not an image" in err and [r["file"] for r in listed if "error" in r] == [str(broken)]
    assert [r["file"].rsplit("/", 1)[1] for r in rows] == [f"{i}.png" for i in range(6)] + ["again.png"]
    assert rows[-1]["top"] == rows[0]["top"]
    # Found from outside: a quoted pattern (for a list too long for the shell) "did not exist".
    assert main(["predict", str(run), str(tmp_path / "imgs" / "[0-5].png"), "--json"]) == 0
    assert [r["file"] for r in json.loads(capsys.readouterr().out)] == [
        str(tmp_path / f"imgs/{i}.png") for i in range(6)
    ]
    # A tar of them (WebDataset's shard, or a tar of a folder): the same classes as the files.
    subprocess.run(["tar", "cf", tmp_path / "imgs.tar", "-C", tmp_path, "imgs"], check=True)
    assert main(["predict", str(run), str(tmp_path / "imgs.tar"), "--json", "--topk", "3"]) == 0
    tarred = [r for r in json.loads(capsys.readouterr().out) if "top" in r]
    names = [f"{tmp_path}/imgs.tar/imgs/{n}.png" for n in [*range(6), "sub/again"]]  # (the members' own names)
    assert [r["file"] for r in tarred] == names and [r["top"] for r in tarred] == [r["top"] for r in rows]
    shutil.make_archive(str(tmp_path / "imgs"), "zip", tmp_path, "imgs")  # (a zip: found from outside, unsaid)
    for archive in ("imgs.tar", "imgs.zip"):  # (and predict's loss differs: found from outside)
        assert main(["eval", str(run), str(tmp_path / archive)]) == 2
        said = capsys.readouterr().err
        assert f"{archive} holds images: a classifier scores a prepared" in said and "not equal to, predict's" in said
    assert main(["predict", str(run), str(tmp_path / "imgs" / "*.jpeg")]) == 2
    assert "*.jpeg matches no file" in capsys.readouterr().err
    assert main(["predict", str(run), str(tmp_path / "imgs" / "0.png"), "--json", "--tta", "--topk", "10"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    inference = bigbatch.tasks.classify.inference
    module, net = inference.inference_of(run), bigbatch.load_classifier(run)
    for crop in (1.0, 1.2):  # eval's --tta: the network's input mirrored, after the crop (found from outside: the
        # image mirrored before it, the crop moved a pixel where its margin is odd: 19 - 16 here)
        x = val_transform(images[:1], 16, crop, False)
        with torch.no_grad():
            p = (net(x).softmax(1)[0] + net(x.flip(-1)).softmax(1)[0]) / 2
        if crop == 1.0:
            assert {t["class"]: t["p"] for t in row["top"]} == pytest.approx(
                {c: float(v) for c, v in zip(module.class_names, p)}
            )
        other = inference.Inference(net, 16, crop, module.class_names)
        (top,) = inference.predict(other, [("x", images[0])], topk=10, tta=True)
        assert {t["class"]: t["p"] for t in top["top"]} == pytest.approx(
            {c: float(v) for c, v in zip(module.class_names, p)}, abs=1e-6
        )
    rows = rows[:6]
    assert all(len(r["top"]) == 3 and r["top"][0]["p"] >= r["top"][1]["p"] for r in rows)
    # The classifier on the validation transform of the same images (what eval scores): the same probabilities.
    net = bigbatch.load_classifier(run)
    with torch.no_grad():
        want = net(val_transform(images, 16, 1.0, False)).softmax(1)
    for r, p in zip(rows, want):
        assert r["top"][0]["class"] == net.class_names[int(p.argmax())] and r["top"][0]["p"] == pytest.approx(
            float(p.max()), abs=1e-6
        )
    # One file with its preprocessing and class names, loadable with torch alone (or onnxruntime), equal to
    # predict: an image at the data's size, one to shrink, one to enlarge, odd sizes (center square, resized).
    import onnxruntime

    # the folders the output names are made, as by every command that writes a file (sample --out, prepare, ...)
    assert main(["export", str(run), str(tmp_path / "new" / "deep" / "model.pt")]) == 0
    (tmp_path / "new" / "deep" / "model.pt").rename(tmp_path / "model.pt")
    assert main(["export", str(run), str(tmp_path / "model.onnx")]) == 0  # the format its name says (was TorchScript)
    for extra in ([], ["--overwrite"]):  # a folder named as OUT: one line saying so (--overwrite was suggested)
        capsys.readouterr()
        assert main(["export", str(run), str(tmp_path / "new"), *extra]) == 2
        assert "is a folder; export writes one file" in capsys.readouterr().err
    model = torch.jit.load(str(tmp_path / "model.pt"))
    assert list(model.class_names) == [str(i) for i in range(10)]
    assert main(["export", str(run), str(tmp_path / "model.pt2")]) == 0  # torch.export's
    exported = torch.export.load(str(tmp_path / "model.pt2")).module()
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    props = json.loads(session.get_modelmeta().custom_metadata_map["bigbatch"])
    assert props["class_names"] == [str(i) for i in range(10)] and props["resolution"] == 16
    from bigbatch.tasks.classify.inference import inference_of, predict

    module = inference_of(run)
    odd = [torch.randint(0, 256, size, dtype=torch.uint8) for size in ((41, 29, 3), (9, 13, 3), (300, 200, 3))]
    for image in (images[0], *odd):
        (row,) = predict(module, [("x", image)], topk=10)
        p = torch.tensor([t["p"] for t in sorted(row["top"], key=lambda t: int(t["class"]))])
        # TorchScript takes one image or a batch; the graph formats (ONNX, pt2) a batch (found from outside: they
        # took one image and refused batches, and RGBA, which the README promised).
        assert torch.allclose(model(image), p, atol=1e-5) and torch.allclose(exported(image[None])[0], p, atol=1e-5)
        two = torch.stack([image, image.flip(0)])
        (onnx_p,) = session.run(None, {"images": two.numpy()})
        assert onnx_p.shape == (2, 10) and np.abs(onnx_p[0] - p.numpy()).max() < 1e-5
        assert np.abs(onnx_p[1] - exported(two)[1].numpy()).max() < 1e-5
        opaque = torch.cat([two, torch.full_like(two[..., :1], 255)], dim=-1)
        (onnx_opaque,) = session.run(None, {"images": opaque.numpy()})
        assert np.abs(onnx_opaque - onnx_p).max() < 1e-6 and torch.allclose(exported(opaque), exported(two))
        # Transparency composited onto white, as predict decodes a transparent PNG (found from outside: the
        # alpha was dropped, and the class changed)
        alpha = torch.randint(
            0, 256, (*two.shape[:3], 1), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
        )
        rgba = torch.cat([two, alpha], dim=-1)
        on_white = [torch.from_numpy(np.asarray(to_rgb(Image.fromarray(im.numpy(), "RGBA")))) for im in rgba]
        want_rgba = torch.stack([predict_p(module, im) for im in on_white])
        (onnx_rgba,) = session.run(None, {"images": rgba.numpy()})
        assert np.abs(onnx_rgba - want_rgba.numpy()).max() < 1e-5 and torch.allclose(
            exported(rgba), want_rgba, atol=1e-5
        )
        assert torch.allclose(model(rgba[0]), want_rgba[0], atol=1e-5)
    assert model(images[0]).shape == (10,) and torch.allclose(model(images[0]), want[0], atol=1e-5)
    # Found from outside: a float image in [0, 1] (torchvision's habit) gave other probabilities without a word,
    # and the pt2's usage named class_names it has not.
    for wrong in (images[0].float() / 255, images[0][..., 0]):
        with pytest.raises(torch.jit.Error, match="images must be"):
            model(wrong)
    assert torch.allclose(model(torch.stack([images[0], images[0]]))[1], want[0], atol=1e-5)  # (a batch)
    # An NCHW batch (torchvision's layout; not an image of 3 rows) and a grayscale one refused (found from outside).
    nchw = torch.stack([images[0], images[0]]).permute(0, 3, 1, 2).contiguous()
    for wrong, words in ((nchw, "an NCHW tensor is permute"), (images[0][..., :1], r"grayscale one \(H, W, 1\) expa")):
        with pytest.raises(torch.jit.Error, match=words):
            model(wrong)
    with pytest.raises(Exception, match=r"images.size\(\)\[3\] <= 4"):
        exported(nchw)
    extra = {"bigbatch.json": ""}
    torch.export.load(str(tmp_path / "model.pt2"), extra_files=extra)
    assert json.loads(extra["bigbatch.json"])["class_names"] == [str(i) for i in range(10)]
    # A GAN run: its EMA generator, z and classes in, the images `bigbatch sample` makes out.
    gan = tmp_path / "gan"
    argv = ["train", "--run-dir", str(gan), "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.kimg=0.064"]
    assert main(argv) == 0
    assert main(["export", str(gan), str(tmp_path / "g.pt")]) == 0
    assert main(["export", str(gan), str(tmp_path / "g.onnx"), "--format", "onnx"]) == 0
    from bigbatch.sampling import generate

    G = bigbatch.load_generator(gan)
    z, y = torch.randn(5, 16), torch.tensor([0, 3, 9, 9, 1])
    want = generate(G, z, y)
    assert torch.equal(torch.jit.load(str(tmp_path / "g.pt"))(z, y), want)
    assert main(["export", str(gan), str(tmp_path / "g.pt2"), "--format", "pt2"]) == 0
    assert torch.equal(torch.export.load(str(tmp_path / "g.pt2")).module()(z, y), want)
    # An existing file is replaced only when asked (as prepare and export-dfl refuse theirs).
    capsys.readouterr()
    assert main(["export", str(gan), str(tmp_path / "g.pt2")]) == 2
    assert "g.pt2 exists: give --overwrite to replace it" in capsys.readouterr().err
    assert main(["export", str(gan), str(tmp_path / "g.pt2"), "--overwrite"]) == 0
    (got,) = onnxruntime.InferenceSession(str(tmp_path / "g.onnx")).run(None, {"z": z.numpy(), "y": y.numpy()})
    assert np.abs(got.astype(int) - want.numpy().astype(int)).max() <= 1  # float32 sums in another order
    # predict takes a classifier; a run of another task is one line, nothing written.
    capsys.readouterr()
    assert main(["predict", str(gan), str(tmp_path / "imgs" / "0.png")]) == 2
    assert "is a gan run: predict takes a classify run's classifier" in capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "m.xyz"), "--format", "tflite"]) == 2
    assert "--format 'tflite' is not one of torchscript, onnx, pt2" in capsys.readouterr().err
    assert not (tmp_path / "m.xyz").exists()
    (tmp_path / "none").mkdir()  # what predict takes, not what eval takes (.npz)
    (tmp_path / "notes.zip").write_text("not a zip")
    assert main(["predict", str(run), str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "holds no image files" in err and "give image files, folders, .zip or .tar" in err
    assert main(["predict", str(run), str(tmp_path / "notes.zip")]) == 2
    assert "notes.zip is not a readable zip archive (damaged, or another kind of file)" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not an image")  # nothing to predict: one line (a "skipped" line came first)
    assert main(["predict", str(run), str(tmp_path / "notes.txt")]) == 2
    assert (err := capsys.readouterr().err).count("\n") == 1 and "no image to predict: " in err and "notes.txt" in err
    # --json lists a file skipped too, in its place (found from outside: only its stderr line said it).
    assert main(["predict", str(run), str(tmp_path / "notes.txt"), str(tmp_path / "imgs" / "0.png"), "--json"]) == 0
    skipped, predicted = json.loads(capsys.readouterr().out)
    assert skipped["file"].endswith("notes.txt") and skipped["error"] and "top" not in skipped and predicted["top"]


def test_predict_resizes_on_the_device_the_classifier_is_on():
    # Found by bench/gpu_check.py on a GPU: `bigbatch predict` built its resize matrices on the host and met a
    # CUDA image with them ("Expected all tensors to be on the same device"). tests/device_guard.py stands in
    # for the GPU: a host tensor meeting the image's is an error.
    from device_guard import DeviceGuard

    from bigbatch import models
    from bigbatch.tasks.classify.inference import Inference, predict

    net = models.create_classifier("resnet_cifar", 3, ch=4, depth=8).eval()
    module = Inference(net, 16, 1.14, ["a", "b", "c"]).eval()
    image = torch.randint(0, 256, (21, 30, 3), dtype=torch.uint8)
    (want,) = predict(module, [("x", image)], topk=3)
    with DeviceGuard():
        module.to(torch.device("cpu"))  # (the guard counts a device passed on as the step's: here, "the GPU")
        (got,) = predict(module, [("x", image)], topk=3)
    assert got == want


def test_eval_refuses_a_held_out_split_of_data_changed_since_training(tmp_path, capsys):
    data = tmp_path / "d.h5"
    assert main(["prepare", "builtin:digits", str(data), "--resolution", "16", "--limit", "300"]) == 0
    cfg = tiny(**{"data.path": str(data), "train.kimg": 0.128, "checkpoint.every_kimg": 0.128})
    run = bigbatch.train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert main(["eval", str(run)]) == 0
    # Found from outside: the file prepared again from fewer images, its "held-out" split (which now holds
    # images the run trained on) was scored without a word.
    assert main(["prepare", "builtin:digits", str(data), "--resolution", "16", "--limit", "200", "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds other images than the run was trained on" in err and "DATA" in err
    assert main(["eval", str(run), str(data)]) == 0  # scored as data given: the user's call
    # Data without images of most classes: those have no accuracy (they were 0%, the "hardest" classes).
    (tmp_path / "few").mkdir()
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(tmp_path / "few" / f"{i}.png")
    (tmp_path / "few.csv").write_text("0.png,1\n1.png,2\n2.png,2\n")
    argv = ["prepare", str(tmp_path / "few"), str(tmp_path / "few.h5"), "--resolution", "16", "--labels"]
    assert main([*argv, str(tmp_path / "few.csv"), "--classes", str(data)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), str(tmp_path / "few.h5")]) == 0
    out = capsys.readouterr().out
    assert "no images of 8 classes (0, 3, 4, 5, 6, ...)" in out
    hardest = next(line for line in out.splitlines() if line.startswith("hardest classes:"))
    assert not any(f" {c} " in hardest.split(";")[0] for c in "03456789")
    (folder,) = (run / "eval").glob("few-*")
    rows = {r[0]: r[1:] for r in csv.reader((folder / "per_class.csv").open())}
    assert rows["0"] == ["0", "", "", ""] and rows["2"][0] == "2"
    assert json.loads((folder / "metrics.json").read_text())["per_class"]["0"] is None
    # Data stored smaller than the run scores at: upscaled, and said (training says it too).
    assert main(["prepare", "builtin:digits", str(tmp_path / "d8.h5"), "--resolution", "8"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), str(tmp_path / "d8.h5")]) == 0
    assert "holds 8px images, and the run scores at 16px, where it last trained: they are upscaled" in (
        capsys.readouterr().err
    )


def test_fine_tuning_from_a_run_of_other_classes_of_the_same_count_gives_a_new_head(tmp_path):
    # Found from outside: a head of the same shape was kept whatever its classes (5 Fashion classes onto 5 digit
    # classes), so the "new" head started as the old task's and the frozen phase trained it as such.
    from bigbatch.tasks.classify.finetune import load_pretrained

    run = bigbatch.train(tiny(**{"train.kimg": 0.128}), run_dir=tmp_path / "run", quiet=True)
    trained, file = bigbatch.load_classifier(run).state_dict(), max(run.glob("checkpoints/0*")) / "model.safetensors"
    for names, kept in (([str(i) for i in range(10)], True), ([f"c{i}" for i in range(10)], False)):
        for given in (run, file):  # (found from outside: a checkpoint's network file took any classes, in order)
            net = bigbatch.models.create_classifier("resnet_cifar", 10, ch=8, depth=8)
            said = load_pretrained(net, str(given), names)
            assert torch.equal(net.state_dict()["fc.weight"], trained["fc.weight"]) is kept
            assert torch.equal(net.state_dict()["conv1.weight"], trained["conv1.weight"]) and "ImageNet" not in said
            assert ("new for the data's 10 classes (the run's classes are others)" in said) is not kept
    # A run of another family is named as one (found from outside: "another network's state dict").
    with pytest.raises(BigbatchError, match=r"is a resnet_cifar run, and this config's model.name is convnet: give"):
        load_pretrained(bigbatch.models.create_classifier("convnet", 10, ch=8), str(run), names, "convnet")


def test_tta_is_refused_for_rotations_and_said_for_a_run_trained_without_mirrors(tmp_path, capsys, monkeypatch):
    """Found from outside: --tta mirrored the images of a run that never saw a mirror image, and of one that
    learned rotations (a mirror swaps 90 and 270 degrees), without a word."""
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    run = bigbatch.train(tiny(**{"train.kimg": 0.064, "data.xflip": False}), run_dir=tmp_path / "run", quiet=True)
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "x.png")
    capsys.readouterr()
    for argv in (["eval", str(run), "--tta"], ["predict", str(run), str(tmp_path / "x.png"), "--tta"]):
        monkeypatch.setattr("bigbatch.errors._WARNED", set())
        assert main(argv) == 0
        assert "trained without mirrored images (data.xflip = false)" in capsys.readouterr().err
    assert main(["predict", str(run), str(tmp_path / "x.png")]) == 0 and "mirror" not in capsys.readouterr().err
    cfg = Config.load(run / "config.toml").override({"train.labels": "rotation"})
    from bigbatch.tasks.classify.inference import check_tta

    with pytest.raises(BigbatchError, match="learned rotations .* drop --tta"):
        check_tta(cfg, "rot")


def test_fine_tuning_loads_the_body_freezes_it_then_trains_it_at_its_own_rate(tmp_path, capsys):
    from safetensors.torch import save_file

    from bigbatch.tasks.classify.finetune import load_pretrained

    # A state dict in torchvision's resnet18 layout (1000 classes), randomly initialised: no download.
    source = bigbatch.models.create_classifier("resnet18", 1000, ch=16)
    body = {k: v.clone() for k, v in source.state_dict().items()}
    torch.save({"state_dict": {f"module.{k}": v for k, v in body.items()}}, tmp_path / "r18.pth")  # DDP, wrapped
    save_file(body, str(tmp_path / "r18.safetensors"))
    over = {"model.name": "resnet18", "model.ch": 16, "model.options": {}, "data.resolution": 32, "train.kimg": 0.128}
    over.update({"train.init_from": str(tmp_path / "r18.pth"), "train.freeze_kimg": 0.128, "train.body_lr_mult": 0.1})
    frozen = bigbatch.train(tiny(**over), run_dir=tmp_path / "frozen", quiet=True)
    trained = load_file(frozen / "checkpoints" / "000000.128" / "model.safetensors")
    fed = bigbatch.models.create_classifier("resnet18", 10, ch=16, input_stats="imagenet")  # (review)
    with pytest.raises(BigbatchError, match=r"images in \[-1, 1\] .*set model.options.input_stats = ''"):
        load_pretrained(fed, str(frozen), ["0"])
    params = dict(source.named_parameters())
    norms = {k for k in params if ".bn" in k or k.startswith("bn1.") or ".downsample.1." in k}
    assert len(norms) == 40 and all(k.endswith((".weight", ".bias")) for k in norms)
    # Frozen: the body unmoved but for its BatchNorms, which train as fastai's train_bn (its default) has them.
    assert all(torch.equal(trained[k], body[k]) for k in params if not k.startswith("fc.") and k not in norms)
    assert all(not torch.equal(trained[k], body[k]) for k in norms)
    # train.train_bn = false: all of the body stays; a run frozen before train_bn was a key resumes as it began.
    over["train.train_bn"] = False
    still = bigbatch.train(tiny(**over), run_dir=tmp_path / "still", quiet=True)
    kept = load_file(still / "checkpoints" / "000000.128" / "model.safetensors")
    assert all(torch.equal(kept[k], body[k]) for k in params if not k.startswith("fc."))
    from bigbatch.rundir import resume_config

    older = tmp_path / "older.toml"  # (a config saved before train_bn was a key: its groups, its frozen norms)
    older.write_text((still / "config.toml").read_text().replace("train_bn = false\n", ""))
    assert "train_bn" in (still / "config.toml").read_text() and "train_bn" not in older.read_text()
    del over["train.train_bn"]
    assert not resume_config(older, tiny(**over), "an older run").train.train_bn
    assert resume_config(frozen / "config.toml", tiny(**over), "a run").train.train_bn
    from bigbatch.batching import replicator_for
    from bigbatch.tasks import build_task

    cfg = tiny(**over)
    start = build_task(cfg, replicator_for(cfg), training_data(cfg)).nets()["model"].state_dict()
    assert trained["fc.weight"].shape == (10, 16 * 8) and not torch.equal(trained["fc.weight"], start["fc.weight"])
    assert torch.equal(start["conv1.weight"], body["conv1.weight"])  # the body as the file has it
    # Past freeze_kimg the body trains too (here from the safetensors file).
    over.update({"train.kimg": 0.256, "train.init_from": str(tmp_path / "r18.safetensors")})
    thawed_run = bigbatch.train(tiny(**over), run_dir=tmp_path / "thawed", quiet=False)
    thawed = load_file(thawed_run / "checkpoints" / "000000.256" / "model.safetensors")
    assert "loaded 120 tensors; new for the data's 10 classes: fc.weight, fc.bias" in capsys.readouterr().err
    assert not torch.equal(thawed["conv1.weight"], body["conv1.weight"])
    # Another layout is one line naming what does not fit; the GAN task does not take these keys.
    torch.save(bigbatch.models.create_classifier("resnet50", 1000, ch=16).state_dict(), tmp_path / "r50.pth")
    bad = tiny(**{**over, "train.init_from": str(tmp_path / "r50.pth")})
    (tmp_path / "bad.toml").write_text(bad.dumps())
    argv = ["train", "--config", str(tmp_path / "bad.toml"), "--run-dir", str(tmp_path / "bad")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "is another network's state dict: its layer1.0.conv1.weight is (16, 16, 1, 1)" in err
    )
    with pytest.raises(BigbatchError, match="'train.freeze_kimg' is not read by the GAN task"):
        bigbatch.preset("digits").override({"train.freeze_kimg": 1.0})
    # A GAN fine-tuned from this classify run: named as such, not "corrupt" for want of a G.
    argv = ["train", "--preset", "digits", "--init-from", str(frozen), "--run-dir", str(tmp_path / "gan")]
    assert main(argv) == 2
    assert f"train.init_from {frozen} is a classify run; a GAN fine-tunes from a GAN run" in capsys.readouterr().err


def test_held_out_images_stored_smaller_than_training_reads_are_said(tmp_path, capsys):
    """Found from outside: data.val_path's 8 px images were scored upscaled to 16 px without a word."""
    for side in (8, 16):
        bigbatch.data.prepare("builtin:digits", str(tmp_path / f"d{side}.h5"), side, limit=100, workers=0)
    over = {"data.path": str(tmp_path / "d16.h5"), "data.val_path": str(tmp_path / "d8.h5"), "train.kimg": 0.064}
    bigbatch.train(tiny(**over, **{"data.val_fraction": 0.0}), run_dir=tmp_path / "val", quiet=True)
    err = capsys.readouterr().err
    assert "d8.h5 holds 8px images, and the run scores its held-out images at up to 16px" in err
    assert "d16.h5" not in err


def test_a_run_of_a_family_registered_in_the_script_says_how_to_load_it_not_a_command_that_cannot(
    tmp_path, capsys, monkeypatch
):
    from bigbatch.models import registry
    from bigbatch.models.convnet import ConvNet

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))  # (the others' tests list the families)

    def script_net(*, n_classes: int, ch: int = 8, img_channels: int = 3):
        return ConvNet(n_classes, ch, img_channels)

    script_net.__module__ = "__main__"  # (a script's own: no command line imports it; a module's, BIGBATCH_IMPORT)
    registry.register(init="kaiming", task="classify")(script_net)
    assert registry.is_own("resnet_cifar") and not registry.is_own("script_net")
    over = {"model.name": "script_net", "model.options": {}, "train.kimg": 0.128, "eval.every_kimg": 0.128}
    bigbatch.train(tiny(**over), run_dir=tmp_path / "r", quiet=True)
    said = capsys.readouterr().out
    assert "Load it from Python" in said and "'script_net' is registered" in said and "bigbatch train" not in said


def test_init_from_takes_a_reference_script_checkpoint_and_refuses_weights_that_are_not_finite(tmp_path):
    import argparse

    from bigbatch.tasks.classify.finetune import load_pretrained

    net = bigbatch.models.create_classifier("resnet18", 10, ch=16)
    body = {k: v.clone() for k, v in bigbatch.models.create_classifier("resnet18", 1000, ch=16).state_dict().items()}
    # timm's and torchvision's training scripts save their argparse arguments beside the weights.
    torch.save({"model": body, "epoch": 3, "args": argparse.Namespace(lr=0.1, model="resnet18")}, tmp_path / "c.pth")
    said = load_pretrained(net, str(tmp_path / "c.pth"), [str(i) for i in range(10)])  # (ImageNet's statistics: said)
    assert "loaded 120 tensors" in said and 'want model.options.input_stats = "imagenet"' in said
    assert torch.equal(net.state_dict()["conv1.weight"], body["conv1.weight"])
    body["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(body, tmp_path / "nan.pth")
    with pytest.raises(BigbatchError, match="its layer1.0.conv1.weight holds NaN or infinite values"):
        load_pretrained(net, str(tmp_path / "nan.pth"), [str(i) for i in range(10)])


def test_a_fine_tuning_resumed_inside_its_frozen_phase_ends_with_the_weights_of_one_left_alone(tmp_path):
    from safetensors.torch import save_file as save

    save(bigbatch.models.create_classifier("resnet18", 1000, ch=16).state_dict(), str(tmp_path / "r18.safetensors"))
    over = {"model.name": "resnet18", "model.ch": 16, "model.options": {}, "data.resolution": 32, "train.kimg": 0.256}
    over.update({"train.init_from": str(tmp_path / "r18.safetensors"), "train.freeze_kimg": 0.192,
                 "train.optimizer": "adamw", "train.grad_clip": 1.0, "checkpoint.every_kimg": 0.128})  # fmt: skip
    whole = bigbatch.train(tiny(**over), run_dir=tmp_path / "whole", quiet=True)
    half = bigbatch.train(tiny(**{**over, "train.kimg": 0.128}), run_dir=tmp_path / "half", quiet=True)
    bigbatch.train(tiny(**over), run_dir=half, resume=True, quiet=True)
    end = "checkpoints/000000.256/model.safetensors"
    assert (half / end).read_bytes() == (whole / end).read_bytes()


def test_rectangular_validation_of_images_of_one_shape_is_said_to_change_nothing(tmp_path, capsys, monkeypatch):
    # Found from outside: data.val_rect on square images (digits) was taken without a word.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    bigbatch.train(tiny(**{"data.val_rect": True, "train.kimg": 0.064}), run_dir=tmp_path / "r", quiet=True)
    assert "data.val_rect keeps each image's aspect ratio, and builtin:digits (val) holds images of one shape" in (
        capsys.readouterr().err
    )


def test_a_resume_to_a_longer_run_says_its_decay_stretches_with_it(tmp_path, capsys, monkeypatch):
    # Found from outside: the rate rose sixfold where the run resumed, said as "the run trains on" alone.
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    over = {"train.lr_decay": "linear", "train.kimg": 0.128, "eval.every_kimg": 0, "checkpoint.every_kimg": 0.128}
    cfg = tiny(**over)
    run = bigbatch.train(cfg, run_dir=tmp_path / "r", quiet=True)
    capsys.readouterr()
    bigbatch.train(cfg.override({"train.kimg": 0.256}), run_dir=run, resume=True, quiet=True)
    # The shorter run's rate after its last step: 0.2 x (1 - 128/128); the longer one's there: 0.2 x (1 - 128/256).
    said = "train.kimg 0.128 -> 0.256: the run trains on to 0.256 kimg (its learning rate's schedule with it: 0.1 "
    assert said + "from here, where the shorter run had 0)" in capsys.readouterr().err


def test_validation_resizes_as_training_does():
    # Found from outside: validation shrank bilinearly and training bicubically (0.7 points lower at 16 px).
    from bigbatch.data.schedule import resize_batch, resize_stored

    images = torch.randint(0, 256, (4, 28, 28, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    scored = val_transform(images, 16, 1.0, False)
    for resize, mean, most in ((resize_batch, 0.3, 0.5), (resize_stored, 0.35, 2.5)):  # (the loader's: uint8, as
        levels = (scored - resize(images, 16).permute(0, 3, 1, 2).float() / 127.5 + 1).abs() * 127.5  # Pillow's)
        assert float(levels.mean()) < mean and float(levels.max()) <= most + 1e-4  # (bilinear: 5.6 levels, max 26)


def test_lr_find_plots_as_fastai_and_bounds_its_steps(tmp_path, capsys, monkeypatch):
    # Found from outside: the plot kept the diverged tail (fastai leaves out its last 5 points) and marked the
    # minimum at a tenth of its rate; --steps 10^8 built its rates for minutes, then ran out of memory.
    import matplotlib.axes

    from bigbatch.lr_find import plot, suggestions

    drawn, original = [], matplotlib.axes.Axes.plot
    recorded = lambda self, *a, **kw: drawn.append(a) or original(self, *a, **kw)  # noqa: E731
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recorded)
    lrs = [10 ** (-6 + 6 * i / 59) for i in range(60)]
    losses = [1 + (math.log10(lr) + 2) ** 2 for lr in lrs]
    result = {"lr": lrs, "loss": losses, "key": "train.lr", "lr_batch": 256, "loss_name": "loss"}
    plot(result | suggestions(lrs, losses), tmp_path / "lr.png")
    assert len(drawn[0][0]) == 55 and drawn[3][0] == [lrs[losses.index(min(losses))]]  # (the curve, then 3 marks)
    assert main(["lr-find", "--steps", "100000000"]) == 2
    assert "5 to 10,000 steps" in capsys.readouterr().err
    # Found from outside: a config without a held-out split was refused for its eval.every_kimg (nothing validates).
    argv = ["lr-find", "data.path=builtin:digits", "data.resolution=16", "data.schedule=", "model.ch=8"]
    assert main([*argv, "model.options.depth=8", "data.val_path=", "data.val_fraction=0", "--steps", "5"]) == 0
