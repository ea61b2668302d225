"""The kinds of op the benchmarks sort time by: torch.profiler's op names ("aten::conv2d", Inductor's fused kernels)
and bench/roofline.py's counted ops alike."""

from __future__ import annotations

KINDS = (  # the first that matches (a fused kernel's name lists the ops it fused: it is matched first)
    ("Inductor's fused kernels", lambda n: "cpp_fused" in n or "compiled:" in n),  # (roofline.py's: "compiled:")
    ("convolutions", lambda n: "conv" in n),
    (
        "matmuls and attention",
        lambda n: n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul") or "attention" in n,
    ),  # fmt: skip
    ("optimizers (multi-tensor)", lambda n: n.startswith(("aten::_foreach_", "aten::_fused_"))),
    ("normalization", lambda n: "_norm" in n),
    ("copies and casts", lambda n: n in ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone")),
    ("other ops (elementwise, reductions, ...)", lambda n: n.startswith("aten::")),
)
OUTSIDE = "outside any op (Python, dispatch, autograd engine)"


def kind_of(name: str) -> str:
    """The kind of the op named `name` (a profiler's key: "aten::mm"), OUTSIDE for what is not an op."""
    return next((kind for kind, test in KINDS if test(name)), OUTSIDE)
