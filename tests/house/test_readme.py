"""The README's Python example runs as it stands (on sample data the test writes)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_python_example_trains_two_epochs(tmp_path):
    from raypipe.sample_data import write_sample_data

    write_sample_data(tmp_path / "sample_data", classes=3, per_class=12, seed=1)
    code = _python_example()
    assert '"sample_data"' in code
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
        env={**__import__("os").environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1"]
    assert all("36 images, skipped {}" in line for line in lines), lines
