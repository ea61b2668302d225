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
