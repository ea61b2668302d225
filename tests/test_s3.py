"""S3 through s3fs against a local moto server: prepare from and to s3://, and training reads."""

import io
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

import bigbatch
from bigbatch.cli import main
from bigbatch.data import BatchLoader, H5Data, describe_data, load_data, prepare, read_meta
from bigbatch.data.streams import GlobalOrder

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

KEY, SECRET = "bigbatch-test-key", "sEcReT-never-logged"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free local port; credentials and endpoint in the environment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            mp.setenv(name, value)
        import s3fs

        fs = s3fs.S3FileSystem()
        fs.mkdir("bkt")
        yield fs, endpoint
    server.stop()


@pytest.fixture(scope="module")
def photos(s3, tmp_path_factory):
    """The same class folder locally and under s3://bkt/photos, with one corrupt file."""
    fs, _ = s3
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (root / c).mkdir()
        for i in range(12):
            Image.fromarray(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)).save(root / c / f"{i:02d}.png")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    fs.put(str(root), "bkt/photos", recursive=True)
    return root


def test_prepare_from_s3_matches_the_local_folder(s3, photos, tmp_path):
    remote = prepare("s3://bkt/photos", str(tmp_path / "remote.h5"), resolution=8, workers=2)
    local = prepare(str(photos), str(tmp_path / "local.h5"), resolution=8, workers=0)
    assert remote.count == local.count == 24 and remote.class_names == ["cat", "dog"]
    assert remote.content_hash == local.content_hash
    assert [name for name, _ in remote.skipped] == ["dog/broken.png"]
    assert read_meta(tmp_path / "remote.h5")["source"] == "s3://bkt/photos"


def test_zip_on_s3(s3, photos, tmp_path):
    fs, _ = s3
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as z:
        for p in sorted(photos.rglob("*.png")):
            z.write(p, p.relative_to(photos).as_posix())
    fs.put(str(tmp_path / "p.zip"), "bkt/zips/p.zip")
    report = prepare("s3://bkt/zips/p.zip", str(tmp_path / "z.h5"), resolution=8, workers=0)
    assert report.count == 24 and report.content_hash == prepare(str(photos), str(tmp_path / "l.h5"), 8).content_hash


def test_tar_shards_on_s3_by_pattern_and_by_prefix(s3, photos, tmp_path):
    fs, _ = s3
    for i, c in enumerate(("cat", "dog")):  # a shard a class folder, with its folder inside: cat/00.png ...
        subprocess.run(["tar", "cf", tmp_path / f"shard-{i}.tar", "-C", photos, c], check=True)
        fs.put(str(tmp_path / f"shard-{i}.tar"), f"bkt/shards/shard-{i}.tar")
    local = prepare(str(photos), str(tmp_path / "l.h5"), resolution=8, workers=0)
    for src in ("s3://bkt/shards/shard-{0..1}.tar", "s3://bkt/shards"):
        report = prepare(src, str(tmp_path / "t.h5"), resolution=8, workers=2, overwrite=True)
        assert (report.count, report.class_names) == (24, ["cat", "dog"]) and report.content_hash == local.content_hash
        # (the member of one of several shards named with it, as the listing's own skips are)
        assert [name for name, _ in report.skipped] == ["s3://bkt/shards/shard-1.tar/dog/broken.png"]


def test_training_reads_straight_from_s3(s3, photos, tmp_path):
    fs, _ = s3
    url = "s3://bkt/data/photos.h5"
    report = prepare(str(photos), url, resolution=8, workers=0)
    assert fs.exists("bkt/data/photos.h5") and report.out == url
    assert not any(".partial" in p for p in os.listdir(tmp_path))
    prepare(str(photos), str(tmp_path / "local.h5"), resolution=8, workers=0)
    local, remote = H5Data(tmp_path / "local.h5"), load_data(url, 8)
    assert (len(remote), remote.resolution, remote.class_names) == (24, 8, ["cat", "dog"])
    assert remote.content_hash == local.content_hash
    idx = torch.tensor([23, 0, 5, 5, 6, 7, 11])
    for a, b in zip(remote.get(idx), local.get(idx)):
        assert torch.equal(a, b)
    requests = [GlobalOrder(24, seed=2).indices(8 * k, 8) for k in range(5)]
    want = [local.get(r)[0] for r in requests]
    for data, workers in ((remote, 2), (load_data(url, 8, in_ram=True), 0)):
        got = [b.images for b in BatchLoader(data, requests, workers=workers)]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert "24 uint8 NHWC" in describe_data(url)


def test_explicit_storage_options_and_errors(s3, photos, tmp_path, monkeypatch, capfd):
    _, endpoint = s3
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)
    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    report = prepare("s3://bkt/photos", str(tmp_path / "o.h5"), resolution=8, workers=0, storage_options=options)
    data = H5Data(tmp_path / "o.h5")
    with pytest.raises(bigbatch.BigbatchError, match="does not exist") as e:
        prepare("s3://bkt/nothing-here", str(tmp_path / "n.h5"), storage_options=options)
    missing = r"cannot open data set 's3://bkt/nope.h5': it does not exist \(check the URL, "
    with pytest.raises(bigbatch.BigbatchError, match=missing) as e2:
        load_data("s3://bkt/nope.h5", 8, storage_options=options)
    remote = prepare(str(photos), "s3://bkt/o.h5", resolution=8, storage_options=options)
    assert not [p for p in s3[0].ls("bkt", refresh=True) if "probe" in p]  # (the write check leaves nothing)
    # An option of the wrong type: the error points at them (found from outside: a bare "'int' object is not
    # iterable" for endpoint_url=5), never showing their values (the secret).
    with pytest.raises(bigbatch.BigbatchError, match=r"took data.storage_options \[.*'endpoint_url'.*check") as e3:
        load_data("s3://bkt/o.h5", 8, storage_options={**options, "endpoint_url": 5})
    assert SECRET not in str(e3.value)
    # A bucket that does not exist is said before anything is decoded (it was said after the whole decode).
    stage = sys.modules["bigbatch.data.prepare"]  # (bigbatch.data.prepare is also the function's name)
    monkeypatch.setattr(stage, "decoded", lambda *a: pytest.fail("decoded before the bucket check"))
    with pytest.raises(bigbatch.BigbatchError, match=r"cannot write output s3://nobkt/o.h5: .*check the bucket"):
        prepare(str(photos), "s3://nobkt/o.h5", resolution=8, storage_options=options)
    shown = [report.summary(), remote.summary(), describe_data(tmp_path / "o.h5"), repr(data), str(e.value)]
    shown += [str(e2.value), repr(H5Data("s3://bkt/o.h5", storage_options=options)), str(read_meta(tmp_path / "o.h5"))]
    out, err = capfd.readouterr()
    assert report.count == 24 and SECRET not in "\n".join([*shown, out, err])


def test_training_from_s3_with_the_endpoint_in_the_config(s3, photos, tmp_path, monkeypatch, tiny, capfd):
    # Credentials stay in the environment; the endpoint comes from data.storage_options; two workers
    # read byte ranges of the remote file, and the weights equal those trained on a local copy.
    # The command prepare's hint gives trains on it (found from outside: the hint dropped --endpoint-url).
    import shlex

    _, endpoint = s3
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    url = "s3://bkt/train/photos.h5"
    capfd.readouterr()
    assert main(["prepare", str(photos), url, "--resolution", "16", "--workers", "0", "--endpoint-url", endpoint]) == 0
    (hint,) = [line for line in capfd.readouterr().out.splitlines() if line.startswith("train on it with: ")]
    command = shlex.split(hint.removeprefix("train on it with: "))
    assert command == [
        "bigbatch",
        "train",
        f"data.path={url}",
        f'data.storage_options={{endpoint_url="{endpoint}"}}',
        "data.resolution=16",
    ]
    # A dry run reads the file's metadata from the store, as training does (found from outside: one it could not
    # read passed).
    assert main(["train", *command[2:], "--dry-run"]) == 0
    assert main(["train", "data.path=s3://bkt/train/nosuch.h5", *command[3:], "--dry-run"]) == 2
    assert "s3://bkt/train/nosuch.h5" in (said := capfd.readouterr().err) and "Traceback" not in said, said
    prepare(str(photos), str(tmp_path / "photos.h5"), resolution=16, workers=0)
    cfg = tiny.override({"train.kimg": 0.064, "train.batch": 16, "data.xflip": True})
    (tmp_path / "tiny.toml").write_text(cfg.dumps())
    a = tmp_path / "remote"
    assert (
        main(["train", "--config", str(tmp_path / "tiny.toml"), "--run-dir", str(a), "data.workers=2", *command[2:]])
        == 0
    )
    b = bigbatch.train(cfg.override({"data.path": str(tmp_path / "photos.h5")}), run_dir=tmp_path / "local", quiet=True)
    for net in ("G", "D"):
        ckpt = "checkpoints/000000.064"
        assert (a / ckpt / f"{net}.safetensors").read_bytes() == (b / ckpt / f"{net}.safetensors").read_bytes()
    assert SECRET not in (a / "config.toml").read_text()
    # The other commands that read a data URL take --endpoint-url too, and eval reads a B on the run's store with the
    # run's data.storage_options (found from outside: only prepare's took one; eval's B was read without them). In
    # processes of their own: this one's s3fs keeps a file system made with the environment's endpoint.
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"} | {"AWS_MAX_ATTEMPTS": "1"}

    def cli(*argv):
        done = subprocess.run([sys.executable, "-m", "bigbatch", *argv], env=env, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    code, said = cli("info", url, "--endpoint-url", endpoint, "--verify")
    assert code == 0 and "images      24 uint8 NHWC" in said, said
    code, said = cli("eval", str(a), url, "--metrics", "pr", "--n", "2")  # (refused once B is open)
    assert code == 2 and "got 2 generated and 24 real" in said, said
    code, said = cli(
        "eval", url, str(tmp_path / "photos.h5"), "--metrics", "pr", "--n", "2", "--endpoint-url", endpoint
    )
    assert code == 2 and "got 2 generated and 24 real" in said, said


def _seed(bucket: str, files: dict[str, bytes]) -> None:
    """Objects straight into the in-process moto server's store, as PUTs leave them (hundreds of PUTs
    through HTTP would take seconds)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, data in files.items():
        backend.put_object(bucket, key, data)


def _pngs(n: int, seed: int) -> dict[str, bytes]:
    """n small PNGs in two class folders, by relative name."""
    rng, out = np.random.default_rng(seed), {}
    for i in range(n):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buffer, "PNG")
        out[f"{'ab'[i % 2]}/{i:04d}.png"] = buffer.getvalue()
    return out


def _local_copy(files: dict[str, bytes], root):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_a_listing_of_many_pages_is_read_whole_with_one_get_a_file(s3, photos, tmp_path, monkeypatch):
    # S3 answers ListObjectsV2 with at most 1,000 keys a page; moto here with 7, so the 25 files take 4 pages
    # (a listing a folder would take 5: the top, then 2 pages each for cat/ and dog/).
    fs, _ = s3
    monkeypatch.setenv("MOTO_S3_DEFAULT_MAX_KEYS", "7")
    fs.invalidate_cache()
    calls: Counter[tuple[str, int | None]] = Counter()

    def count(params, model, **_):
        calls[model.name, params.get("MaxKeys")] += 1

    fs.s3.meta.events.register("before-parameter-build.s3", count)  # (prepare gets this filesystem: fsspec caches it)
    try:
        remote = prepare("s3://bkt/photos", str(tmp_path / "remote.h5"), resolution=8, workers=2)
    finally:
        fs.s3.meta.events.unregister("before-parameter-build.s3", count)
    local = prepare(str(photos), str(tmp_path / "local.h5"), resolution=8, workers=0)
    assert remote.count == 24 and remote.content_hash == local.content_hash
    assert calls["ListObjectsV2", None] == 4  # the pages (and a one-key listing or two: is the prefix a file?)
    assert calls["GetObject", None] == 25 and calls["HeadObject", None] <= 2  # one request a file: no HEAD first


def test_object_names_are_taken_as_they_are_and_folder_markers_are_not_files(s3, tmp_path):
    # fsspec's cat globs a name holding [ ] * ? ("a[1].png" read "a1.png", or nothing); S3 consoles'
    # "Create folder" leaves an empty key ending in "/".
    pngs = _pngs(3, seed=6)
    files = {"c/a[1].png": pngs["a/0000.png"], "c/a1.png": pngs["b/0001.png"], "c/b*.png": pngs["a/0002.png"]}
    _seed("bkt", {f"names/{rel}": data for rel, data in {**files, "c/": b""}.items()})
    remote = prepare("s3://bkt/names", str(tmp_path / "remote.h5"), resolution=8, workers=0)
    local = prepare(str(_local_copy(files, tmp_path / "local")), str(tmp_path / "local.h5"), resolution=8, workers=0)
    assert remote.count == 3 and not remote.skipped and remote.content_hash == local.content_hash


# Parts of 16 files, not 256, so that a hundred files make six parts (each a GET from moto, milliseconds of CPU).
SMALL_PARTS = "import sys, bigbatch.data.prepare_pool; bigbatch.data.prepare_pool.PART = 16; "


def _small_parts(monkeypatch):
    import importlib

    import bigbatch.data.prepare_pool

    monkeypatch.setattr(bigbatch.data.prepare_pool, "PART", 16)
    return importlib.import_module("bigbatch.data.prepare")  # (bigbatch.data.prepare is also the function)


def test_a_killed_prepare_from_s3_resumes_and_ends_with_the_local_copys_content_hash(s3, tmp_path, monkeypatch):
    _small_parts(monkeypatch)
    files = _pngs(96, seed=3)
    _seed("bkt", {f"killed/{rel}": data for rel, data in files.items()})
    out, parts = tmp_path / "out.h5", tmp_path / ".out.h5.parts"
    argv = ["prepare", "s3://bkt/killed", str(out), "--resolution", "8", "--workers", "2"]
    code = SMALL_PARTS + "from bigbatch.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and not list(parts.glob("part-*.npz")):
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)  # no clean-up of any kind
    p.wait()
    assert p.returncode == -signal.SIGKILL, "prepare ended before it could be killed: give it more files"
    kept = len(list(parts.glob("part-*.npz")))
    resumed = prepare("s3://bkt/killed", str(out), resolution=8, workers=2)
    local = prepare(str(_local_copy(files, tmp_path / "local")), str(tmp_path / "local.h5"), resolution=8, workers=0)
    assert kept >= 1 and resumed.resumed >= kept * 16 and resumed.count == 96 and not parts.exists()
    assert resumed.content_hash == local.content_hash


def test_an_object_replaced_since_an_interrupted_prepare_is_not_taken_from_its_parts(s3, tmp_path, monkeypatch):
    preparing = _small_parts(monkeypatch)
    files = _pngs(40, seed=4)
    _seed("bkt", {f"changed/{rel}": data for rel, data in files.items()})
    add, calls = preparing.H5Writer.add, [0]

    def add_then_interrupt(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 20:  # Ctrl-C inside the second part: the first was kept
            raise KeyboardInterrupt
        return add(self, *args, **kwargs)

    monkeypatch.setattr(preparing.H5Writer, "add", add_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare("s3://bkt/changed", str(tmp_path / "out.h5"), 8, workers=0)
    monkeypatch.setattr(preparing.H5Writer, "add", add)
    assert list((tmp_path / ".out.h5.parts").glob("part-*.npz"))
    files["a/0002.png"] = _pngs(1, seed=5)["a/0000.png"]  # replaced meanwhile: same name, same size
    _seed("bkt", {"changed/a/0002.png": files["a/0002.png"]})
    changed = prepare("s3://bkt/changed", str(tmp_path / "out.h5"), 8, workers=0)
    local = prepare(str(_local_copy(files, tmp_path / "local")), str(tmp_path / "local.h5"), 8, workers=0)
    assert changed.resumed == 0 and changed.content_hash == local.content_hash


def test_a_source_that_stops_answering_stops_prepare_in_one_line_and_it_resumes(s3, tmp_path, monkeypatch, capsys):
    # Found from outside: a server gone half way through a prepare made its files "unreadable", skipped; the
    # prepare ended with exit 0, a data file missing them, and no parts left to resume from.
    from bigbatch.cli import main
    from bigbatch.data.parts import Parts

    _small_parts(monkeypatch)
    files = _pngs(208, seed=6)  # (13 chunks of 16: more than are fetched ahead)
    _seed("bkt", {f"outage/{rel}": data for rel, data in files.items()})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()  # (a server of its own, stopped half way; the objects are the shared one's too)
    save = Parts.save

    def save_then_outage(self, k, results):
        save(self, k, results)
        server.stop()

    monkeypatch.setattr(Parts, "save", save_then_outage)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # (botocore's retries of a refused connection: seconds)
    out = tmp_path / "out.h5"
    argv = ["prepare", "s3://bkt/outage", str(out), "--resolution", "8", "--workers", "0"]
    assert main([*argv, "--endpoint-url", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reading bkt/outage/" in err and "run the same command" in err, err
    assert "it resumes where it stopped" in err and not out.exists()
    monkeypatch.setattr(Parts, "save", save)
    resumed = prepare("s3://bkt/outage", str(out), 8, workers=0)  # (through the shared server: the same objects)
    local = prepare(str(_local_copy(files, tmp_path / "local")), str(tmp_path / "local.h5"), 8, workers=0)
    assert resumed.resumed >= 16 and resumed.count == 208 and resumed.content_hash == local.content_hash


def test_an_object_refused_alone_is_skipped_and_a_batch_all_refused_stops_prepare():
    # Found by review: a 403 on one object (its own ACL or KMS key) stopped every rerun of the prepare; one object's
    # refusal is its own (skipped, said), every object of a batch refused is the credentials' (a stop, resumable).
    from bigbatch.data.listing import SourceFailed, fetched_all

    class Answer(Exception):
        status = 403

    got = fetched_all([b"png", PermissionError("Access Denied"), Answer("Forbidden")], ["a", "b", "c"])
    assert got[0] == b"png" and got[1:] == [
        "unreadable (refused: PermissionError: Access Denied)",
        "unreadable (refused: Answer: Forbidden)",
    ]
    with pytest.raises(SourceFailed, match=r"reading a and the 1 read with it was refused .*once the credentials"):
        fetched_all([PermissionError("Access Denied"), PermissionError("Access Denied")], ["a", "b"])
    with pytest.raises(SourceFailed, match="once the source answers again"):  # (a timeout is not the object's)
        fetched_all([b"png", TimeoutError("timed out")], ["a", "b"])
    # fsspec's HTTP says "not found" of a server that stopped answering too: its cause tells the two apart.
    assert fetched_all([FileNotFoundError("b")], ["b"]) == ["unreadable (gone since it was listed: b)"]
    down = FileNotFoundError("http://h/b.png")
    down.__cause__ = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(SourceFailed, match="once the source answers again"):
        fetched_all([b"png", down], ["a", "b"])


def test_an_endpoint_that_does_not_answer_is_told_with_its_fix(tmp_path, monkeypatch, capsys):
    # Found from outside: botocore's EndpointConnectionError alone, with no fix (and the listing's: check credentials).
    with socket.socket() as s:  # (a port no one listens on)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import s3fs

    monkeypatch.chdir(tmp_path)
    s3fs.S3FileSystem.clear_instance_cache()  # (one made for the moto server above would be taken again)
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    for argv in (["info", "s3://bkt/o.h5"], ["prepare", "s3://bkt/photos", "o.h5", "--resolution", "8"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "EndpointConnectionError" in err, err
        assert "(check the endpoint and the network: AWS_ENDPOINT_URL, --endpoint-url" in err, err
    # Without credentials, the fix names them; a data file over HTTP whose server does not answer is said so, not
    # called missing with `prepare` into it for the fix (both found from outside).
    s3fs.S3FileSystem.clear_instance_cache()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    assert main(["info", "s3://bkt/o.h5"]) == 2
    assert (
        "NoCredentialsError: Unable to locate credentials (give the object store's credentials: AWS_ACCESS_KEY_ID"
        in (capsys.readouterr().err)
    )
    assert main(["info", f"http://127.0.0.1:{port}/o.h5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bigbatch: error: cannot reach data set 'http://127.0.0.1:{port}/o.h5' (") and (
        err.endswith("): is its server up?\n")
    ), err
    s3fs.S3FileSystem.clear_instance_cache()


def test_a_killed_prepares_local_copy_goes_and_a_full_temporary_folder_is_named(s3, photos, tmp_path, monkeypatch):
    # Found from outside: a prepare to s3:// killed by SIGKILL left its whole file in /tmp for good; and a full /tmp
    # was said as "cannot write s3://...", the bucket's fault.
    from conftest import bigbatch_limited

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    killed = tmp / f"bigbatch-prepare-x1y2-{host}-{gone.pid}"
    running = tmp / f"bigbatch-prepare-a1b2-{host}-{os.getpid()}"
    elsewhere = tmp / f"bigbatch-prepare-c3d4-another-host-{gone.pid}"  # (its processes are not this host's to see)
    elsewhere.mkdir()
    killed.mkdir()
    (killed / "data.h5").write_bytes(b"of a prepare killed while writing")
    running.mkdir()
    said = bigbatch_limited(8192, "prepare", str(photos), "s3://bkt/full.h5", "--resolution", "8", cwd=tmp_path)
    assert said.returncode == 2, said.stderr
    assert f"cannot write s3://bkt/full.h5's local copy in {tmp}: " in said.stderr and "set TMPDIR" in said.stderr
    assert sorted(p.name for p in tmp.iterdir()) == sorted([running.name, elsewhere.name])  # the killed one's gone


def test_an_object_replaced_while_it_is_read_is_said_not_read_on(s3, photos, tmp_path, monkeypatch):
    # Found from outside: a prepare --overwrite onto an s3:// data.path as a run trained had it read the new images
    # beside the old file's labels, its checkpoints naming the old content hash, without a word.
    from bigbatch.data import h5stamp

    fs, _ = s3
    url = "s3://bkt/data/replaced.h5"
    prepare(str(photos), url, resolution=8, workers=0)
    data, idx = load_data(url, 8), torch.tensor([0, 1])
    data.get(idx)
    prepare(str(photos), str(tmp_path / "other.h5"), resolution=12, workers=0)
    fs.put(str(tmp_path / "other.h5"), "bkt/data/replaced.h5")
    monkeypatch.setattr(h5stamp, "CHECK_EVERY_S", 0.0)  # (a look every 30 s; every read here)
    with pytest.raises(bigbatch.BigbatchError, match=r"data file \S*replaced.h5 was replaced since it was opened"):
        data.get(idx)
    with pytest.raises(bigbatch.BigbatchError, match="was replaced since it was opened"):  # (a new reader's too)
        next(iter(BatchLoader(data, [idx], workers=1)))


def test_an_endpoint_given_on_the_command_line_keeps_the_runs_other_storage_options():
    # Found by review: --endpoint-url replaced a run's data.storage_options whole (its anon, profile, client_kwargs).
    from bigbatch.urls import endpoint_options

    run = {"anon": False, "endpoint_url": "http://old", "client_kwargs": {"region_name": "eu-west-1"}}
    assert endpoint_options("http://new:9000", run) == {
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1", "endpoint_url": "http://new:9000"},
    }
    assert endpoint_options(None, run) is run and endpoint_options(None, {}) is None


def test_stats_of_an_s3_folder_are_its_images(s3, photos, tmp_path, monkeypatch, capsys):
    # Found from outside: stats refused a URL folder ("not an HDF5 file") that eval and prepare read.
    from test_shard_sources import STANDIN, evaluate_module

    from bigbatch.metrics import load_stats

    fs, _ = s3
    monkeypatch.setattr(evaluate_module, "get_extractor", lambda name, **kw: STANDIN)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    files = [p for p in sorted(photos.rglob("*.png")) if p.name != "broken.png"]
    for p in files:
        (tmp_path / "local" / p.relative_to(photos)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "local" / p.relative_to(photos)).write_bytes(p.read_bytes())
    fs.put(str(tmp_path / "local"), "bkt/stats_images", recursive=True)
    said = []
    for source in ("s3://bkt/stats_images", str(tmp_path / "local")):
        assert main(["stats", source, "--extractor", "standin"]) == 0, capsys.readouterr().err
        said.append(load_stats(capsys.readouterr().out.split(" in ", 1)[1].split(" (give it")[0]))
    assert said[0].n == said[1].n == 24 and np.allclose(said[0].mu, said[1].mu, atol=1e-6)
