"""The README's Replicator example runs as printed and learns."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_replicator_example_runs_and_learns(tmp_path):
    text = README.read_text()
    section = text[text.index("### The engine on its own") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) < 30  # the promise: a complete example in under 30 lines
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loss = float(out.stdout.split("final loss")[1])
    assert "micro_batch" in out.stdout and loss < 0.3
