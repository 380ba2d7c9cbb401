"""torchrun, 2 CPU ranks, gloo: timm's loop through the drop-in trains an epoch and evaluates 33 images
exactly once, both ranks taking the same number of eval batches, on one Ray for the node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from raypipe.sample_data import write_sample_data

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data33(root: Path) -> Path:
    write_sample_data(root, classes=3, per_class=11, seed=4)
    assert sum(1 for _ in root.rglob("*.jpg")) == 33
    return root


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_torchrun_two_ranks_train_and_eval_exactly_once(tmp_path):
    data, out = _data33(tmp_path / "data"), tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("RAY_ADDRESS", None)  # the ranks must start their node's Ray themselves
    env["RAY_AUTH_MODE"] = "token"  # as docs/timm.md says to launch: Ray reads it when imported
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(REPO / "tests" / "integrations" / "torchrun_timm.py"),
        str(data),
        str(out),
    ]
    # Its own session: on a timeout the whole tree we started (torchrun, the ranks, the Ray they
    # started) is ended by that group's id, and nothing else.
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in 540 s:\n{log[-6000:]}")
    assert proc.returncode == 0, log[-6000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    # one Ray for the node: both ranks on the same GCS, one node in it
    assert ranks[0]["gcs_address"] == ranks[1]["gcs_address"]
    assert [r["ray_nodes"] for r in ranks] == [1, 1]
    # rank 0 started it, rank 1 joined it: both know it for the node's private Ray (a feeder's backend)
    assert [r["private_cluster"] for r in ranks] == [True, True]
    # training: 33 images over 2 ranks in batches of 8, full batches only: 2 steps each
    assert [(r["train_batches"], r["train_len"]) for r in ranks] == [(2, 2), (2, 2)]
    # eval: 17 rows per rank (timm's OrderedDistributedSampler), 3 batches each, every image once
    assert [(r["eval_batches"], r["eval_len"]) for r in ranks] == [(3, 3), (3, 3)]
    ids = [[i for batch in r["eval_ids"] for i in batch] for r in ranks]
    assert [len(x) for x in ids] == [17, 17]
    real = [i for x in ids for i in x if i >= 0]
    assert sorted(real) == list(range(33))
    assert sum(r["num_valid_samples"] for r in ranks) == 33
    assert ranks[0]["top1"] == ranks[1]["top1"]  # all-reduced per batch: the same on both ranks
