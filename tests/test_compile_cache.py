"""train.compile keeps what Inductor compiles in the user's cache: a resumed run loads its graphs instead of
compiling them again, and says so; a TORCHINDUCTOR_CACHE_DIR the user set is kept."""

import json
import os
import stat
import subprocess
import sys

from bigbatch.engine import compile_cache

ARGS = [
    "--preset", "digits", "data.resolution=16", "model.ch=8", "model.dim_z=16", "train.batch=32",
    "train.micro_batch=32", "checkpoint.every_kimg=0.032", "sample.every_kimg=0", "train.compile=true",
]  # fmt: skip


def train(tmp_path, *args: str) -> str:
    """`bigbatch train` in a process of its own, as a user's second run or resume is."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # (set by a compile in this process)
    env["BIGBATCH_CACHE"] = str(tmp_path / "cache")
    out = subprocess.run(
        [sys.executable, "-m", "bigbatch", "train", *ARGS, *args], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_resumed_compiled_run_takes_its_graphs_from_the_cache_and_says_so(tmp_path):
    folder = tmp_path / "cache" / "compile"
    first = train(tmp_path, "train.kimg=0.032", "--run-dir", "r")
    assert f"torch.compile, cache {folder}" in first  # the plan line names the cache
    assert "none from the cache" in first
    cold = json.loads((tmp_path / "r" / "plan.json").read_text())["compiled"]
    assert cold["graphs"] >= 4 and cold["from_cache"] == 0 and cold["folder"] == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # Inductor unpickles what it finds there: the user's alone

    resumed = train(tmp_path, "train.kimg=0.064", "--run-dir", "r", "--resume")
    assert f"all {cold['graphs']} graphs from the compile cache in {folder}" in resumed
    warm = json.loads((tmp_path / "r" / "plan.json").read_text())["compiled"]
    assert warm["from_cache"] == warm["graphs"] == cold["graphs"]
    # AOTAutograd's forward-backward pairs come from the cache too: spectral norm's fp32 autocast region in
    # every layer made it refuse them, traced again at every start.
    assert cold["uncached_pairs"] == warm["uncached_pairs"] == 0
    assert warm["seconds"] < cold["seconds"] / 2  # (on this CPU: 25 s -> 3 s)


def test_a_cache_folder_the_user_chose_is_kept(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert compile_cache.use_cache() == mine and compile_cache.in_use() == mine
    assert not (tmp_path / "cache" / "compile").exists()


def test_inductors_own_default_written_back_is_not_the_users_choice(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # (as Inductor leaves it once it has run)
    assert compile_cache.use_cache() == tmp_path / "cache" / "compile"


def test_the_cache_follows_bigbatch_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "a"))
    assert compile_cache.use_cache() == tmp_path / "a" / "compile"
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "b"))  # (a later run in the same process, from Python)
    assert compile_cache.use_cache() == tmp_path / "b" / "compile" == compile_cache.in_use()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "b" / "compile")


def test_a_compile_cache_that_is_not_the_users_own_folder_is_refused(tmp_path, monkeypatch):
    # Found from outside: under a shared BIGBATCH_CACHE, another user's link was taken, and Inductor unpickles there.
    import pytest

    from bigbatch.errors import BigbatchError

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "shared" / "compile").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BigbatchError, match=r"compile is a link: compiled graphs are unpickled from it"):
        compile_cache.use_cache()
    (tmp_path / "shared" / "compile").unlink()
    assert compile_cache.use_cache() == tmp_path / "shared" / "compile"


def test_compile_auto_is_on_for_biggan_on_a_gpu_alone():
    import torch

    import bigbatch
    from bigbatch.batching import compile_mode, compiles
    from bigbatch.engine.wrap import replays

    gpu, cpu = torch.device("cuda"), torch.device("cpu")  # (a device named, none needed)
    biggan = bigbatch.preset("biggan128_bs2048")
    assert biggan.train.compile == "auto" and compiles(biggan, gpu) and not compiles(biggan, cpu)
    assert not compiles(biggan.override({"train.r1_gamma": 1.0}), gpu)  # (R1's double backward does not compile)
    assert not compiles(biggan.override({"train.compile": False}), gpu)
    for name in ("digits", "stylegan2_256", "imagenet_resnet50_fast", "saehd512_df_ud"):  # not measured to pay
        assert not compiles(bigbatch.preset(name), gpu), name
    assert compiles(bigbatch.preset("digits").override({"train.compile": True}), cpu)
    assert not compiles(biggan)  # (the device train.device picks: this CPU)
    # The mode the Replicator compiles with: torch.compile's default, or CUDA graphs where asked for.
    assert compile_mode(biggan, gpu) is True and compile_mode(biggan, cpu) is False
    for mode in ("reduce-overhead", "max-autotune"):
        asked = biggan.override({"train.compile": mode})
        assert compile_mode(asked, gpu) == compile_mode(asked, cpu) == mode
        assert replays(mode, gpu) and not replays(mode, cpu)
    assert not replays(True, gpu)


def test_under_compile_auto_a_graph_that_fails_runs_eagerly_for_the_run_alone(monkeypatch):
    import torch._dynamo

    import bigbatch
    from bigbatch import batching

    monkeypatch.setattr(batching, "compiles", lambda cfg, device=None: True)  # (as on a GPU)
    before = torch._dynamo.config.suppress_errors
    biggan = bigbatch.preset("biggan128_bs2048")
    with batching.eager_fallback(biggan):
        assert torch._dynamo.config.suppress_errors
    assert torch._dynamo.config.suppress_errors == before  # the process's own setting back
    with batching.eager_fallback(biggan.override({"train.compile": True})):  # asked for: its errors are seen
        assert torch._dynamo.config.suppress_errors == before


def test_a_compiled_pair_is_cached_by_its_forward_on_the_calling_thread(tmp_path, monkeypatch):
    # AOTAutograd's forward-backward pair is compiled and pickled into the cache at the forward, in the thread
    # that calls the model: left to the first backward, a CUDA backward did it on autograd's device thread, where
    # pickle crashed the process now and then (an H200's CUDA tests ended by SIGSEGV there).
    import threading

    import torch
    import torch._functorch.config
    from torch._functorch._aot_autograd import autograd_cache

    monkeypatch.setenv("BIGBATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    config = torch._functorch.config  # (the process's setting back after the test)
    monkeypatch.setattr(config, "force_non_lazy_backward_lowering", config.force_non_lazy_backward_lowering)
    compile_cache.use_cache()
    threads = []
    save = autograd_cache.AOTAutogradCache.save

    def saved(*args, **kwargs):  # (where each cache entry is pickled)
        threads.append(threading.current_thread())
        return save(*args, **kwargs)

    monkeypatch.setattr(autograd_cache.AOTAutogradCache, "save", staticmethod(saved))
    torch._dynamo.reset()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)))
    out = model(torch.randn(3, 5)).sum()
    assert threads == [threading.main_thread()]  # saved by the forward, before any backward
    out.backward()
    assert len(threads) == 1
