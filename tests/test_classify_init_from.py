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
