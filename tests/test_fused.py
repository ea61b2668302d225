"""bigbatch/models/fused.py: StyleGAN2's compiled kernels where they cannot compile or must not run (their gradients of
every order, and the weights a training step gives, are tests/test_stylegan2.py's)."""

import os
import subprocess
import sys

import torch

from bigbatch import errors
from bigbatch.models import fused


def test_a_kernel_that_cannot_be_compiled_runs_its_plain_ops_said_once(monkeypatch, capsys):
    import torch._dynamo.exc

    class Failed(torch._dynamo.exc.TorchDynamoException):  # (as Dynamo wraps Inductor's and Triton's failures)
        pass

    def no_compiler(fn, **kw):
        def run(*args):
            raise Failed("InductorError: no working C++ compiler found\n(the traceback's lines)")

        return run

    monkeypatch.setattr(fused, "ON", ("cpu",))
    monkeypatch.setattr(fused, "_COMPILED", {})
    monkeypatch.setattr(errors, "_WARNED", set())
    monkeypatch.setattr(torch, "compile", no_compiler)
    x, b = torch.randn(2, 3, 5, 5, requires_grad=True), torch.randn(3, requires_grad=True)
    for _ in range(2):
        y = fused.bias_act(x, b, 2**0.5)
        torch.testing.assert_close(y, fused.bias_act_plain(x, b, 2**0.5), rtol=0, atol=0)
        y.sum().backward()  # (its slope's kernel: the same)
    assert capsys.readouterr().err.splitlines() == [
        "bigbatch: warning: StyleGAN2's kernel bias_act_plain could not be compiled (InductorError: no working C++ "
        "compiler found): its plain ops run",
        "bigbatch: warning: StyleGAN2's kernel _slope_times could not be compiled (InductorError: no working C++ "
        "compiler found): its plain ops run",
    ]
    assert fused._COMPILED == {fused.bias_act_plain: fused.bias_act_plain, fused._slope_times: fused._slope_times}
    torch.testing.assert_close(x.grad, 2 * torch.where(y > 0, 2**0.5, 0.2 * 2**0.5))


def test_functorchs_transforms_take_the_plain_ops(monkeypatch):
    # (the Functions define no vmap or jvp rule: under torch.func the kernels would raise)
    monkeypatch.setattr(fused, "ON", ("cpu",))
    x, b = torch.randn(4, 3, 5, 5), torch.randn(3)
    per_image = torch.func.vmap(lambda t: fused.bias_act(t[None], b, 2.0)[0])(x)
    torch.testing.assert_close(per_image, fused.bias_act_plain(x, b, 2.0))
    grad = torch.func.grad(lambda t: fused.bias_act(t, b, 2.0).sum())(x)
    torch.testing.assert_close(grad, torch.where(fused.bias_act_plain(x, b, 2.0) > 0, 2.0, 0.4))


def test_bias_act_compiled_passes_gradcheck_and_gradgradcheck_with_each_input(monkeypatch):
    monkeypatch.setattr(fused, "ON", ("cpu",))
    monkeypatch.setattr(fused, "_COMPILED", {})
    torch.manual_seed(0)
    x, b = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    scale, noise = torch.rand(2, 3, 1, 1, dtype=torch.float64) + 0.5, torch.randn(2, 1, 4, 4, dtype=torch.float64)
    for inputs in ((x, b), (x, b, scale, noise)):
        inputs = tuple(t.clone().requires_grad_() for t in inputs)

        def f(*t):
            return fused.bias_act(t[0], t[1], 2**0.5, *t[2:])

        assert torch.autograd.gradcheck(f, inputs) and torch.autograd.gradgradcheck(f, inputs)
    compiled = [fused._COMPILED.get(fn) for fn in (fused.bias_act_plain, fused._slope_times)]
    assert None not in compiled and fused.bias_act_plain not in compiled  # (compiled, not fallen back to plain ops)


def test_what_the_kernels_compile_is_kept_in_the_users_cache_not_in_tmp(tmp_path):
    # (as train.compile's graphs: Inductor unpickles what it finds in its cache, and /tmp's may be another user's)
    code = (
        "import os, torch\n"
        "from bigbatch.models import fused\n"
        "fused.ON = ('cpu',)\n"
        "fused.bias_act(torch.randn(2, 3, 4, 4), torch.randn(3), 2.0)\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["BIGBATCH_CACHE"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "cache" / "compile"
    assert out.stdout.strip() == str(folder) and any(p.is_file() for p in folder.rglob("*"))
