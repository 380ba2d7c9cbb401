"""bench/fields.py on a tiny folder: it writes captioned shards and prints both rows and their ratio."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tarfile

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "fields.py"


@pytest.mark.timeout(240)
def test_the_fields_bench_writes_captioned_shards_and_reports_both_rates(tmp_path):
    from raypipe.sample_data import write_sample_data

    write_sample_data(str(tmp_path / "photos"), classes=2, per_class=8, workers=1)
    cmd = [sys.executable, str(SCRIPT), str(tmp_path / "photos"), str(tmp_path / "shards")]
    proc = subprocess.run(
        [*cmd, "--rounds", "1", "--epochs", "2", "-b", "4", "--img-size", "32"],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "wrote 16 captioned samples" in proc.stdout
    m = re.search(r"without fields\s+(\d+) img/s\s+with txt\+json\s+(\d+) img/s\s+ratio (\d\.\d+)", proc.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    with tarfile.open(next((tmp_path / "shards").glob("*.tar"))) as tar:
        names = tar.getnames()
    assert {n.rsplit(".", 1)[1] for n in names} == {"jpg", "cls", "txt", "json"}
