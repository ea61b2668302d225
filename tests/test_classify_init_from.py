"""Fine-tuning from a state dict that is not a run's (torchvision's, timm's): what the file leaves to assumption is
said under --quiet too, and a width that is not the file's names model.ch."""

import pytest
import torch
from test_classify import tiny

import bigbatch
from bigbatch.errors import BigbatchError
from bigbatch.tasks.classify.finetune import load_pretrained


def test_a_files_input_scale_is_said_under_quiet_and_a_width_not_the_files_names_model_ch(tmp_path, capsys):
    body = bigbatch.models.create_classifier("resnet18", 1000, ch=8).state_dict()
    torch.save(body, tmp_path / "r18.pth")
    over = {"model.name": "resnet18", "model.options": {}, "train.init_from": str(tmp_path / "r18.pth")}
    bigbatch.train(tiny(**over, **{"train.kimg": 0.064, "eval.every_kimg": 0}), run_dir=tmp_path / "r", quiet=True)
    said = capsys.readouterr()
    assert 'want model.options.input_stats = "imagenet"' in said.err and "init_from" not in said.out
    # The preset's width kept for another family (found from outside: fashion_resnet_fast's ch 16 for resnet18)
    narrow = bigbatch.models.create_classifier("resnet18", 10, ch=4)
    with pytest.raises(
        BigbatchError, match=r"\(4, 3, 7, 7\): model.ch sets this model's width, the file's is model.ch=8"
    ):
        load_pretrained(narrow, str(tmp_path / "r18.pth"), [str(i) for i in range(10)], "resnet18")


def test_old_and_ema_only_state_dicts_load_as_pytorch_loads_them(tmp_path):
    """Found from outside: a state dict saved before PyTorch 0.4 (no BatchNorm num_batches_tracked) was "another
    network's", a timm checkpoint holding only its EMA's weights held "no state dict", and one holding both gave its
    trained weights, not their average (timm's load_checkpoint takes the average), without saying which."""
    from bigbatch.tasks.classify.finetune import load_pretrained

    source = bigbatch.models.create_classifier("resnet18", 10, ch=16)
    old = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(old, tmp_path / "old.pth")
    torch.save({"state_dict": {k: v + 1 for k, v in old.items()}, "state_dict_ema": old}, tmp_path / "ema.pth")
    for name in ("old.pth", "ema.pth"):
        net = bigbatch.models.create_classifier("resnet18", 10, ch=16)
        said = load_pretrained(net, str(tmp_path / name), [str(i) for i in range(10)])
        assert all(torch.equal(net.state_dict()[k], v) for k, v in old.items())
        assert (" of its 'state_dict_ema' (the average of the weights)" in said) == (name == "ema.pth"), said
        assert int(net.state_dict()["bn1.num_batches_tracked"]) == 0
