"""WebDataset shards labelled in another field than .cls: said, not taken unsaid as unlabelled data."""

import tarfile

from test_prepare_tar import _add, _solid

from bigbatch.data import prepare


def test_shards_labelled_in_json_fields_alone_are_said_to_be_unlabelled(tmp_path, capsys):
    # Found from outside: each sample's {"cls": ...} in its .json went unsaid, and the data prepared unconditional.
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(3):
            _add(tar, f"k{i}.png", _solid(10 * i))
            _add(tar, f"k{i}.json", b'{"cls": 1}')
    report = prepare(str(tmp_path / "a.tar"), "a.h5", workers=0)
    assert report.count == 3 and report.class_names == []
    err = capsys.readouterr().err
    assert "the shards' samples hold .json fields and no .cls" in err and "write it as KEY.cls" in err, err
    assert "unlabelled" in err


def test_imagenets_training_tar_given_whole_says_to_unpack_it_once(tmp_path, capsys):
    # Found from outside: "holds no usable images; ... n01679215.tar: not an image Pillow can read", no way out said.
    import io

    from test_prepare_tar import one_line

    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tar:
        for i in range(2):
            _add(tar, f"n01440764_{i}.JPEG", _solid(10 * i))
    with tarfile.open(tmp_path / "ILSVRC2012_img_train.tar", "w") as tar:  # a tar a class, in one tar
        _add(tar, "n01440764.tar", inner.getvalue())
    said = "it holds archives, as ImageNet's training tar holds a tar a class: unpack it once (tar xf) and give the"
    one_line(capsys, ["prepare", str(tmp_path / "ILSVRC2012_img_train.tar"), "x.h5"], said)
