"""No hangs: an object store without credentials, an endpoint that accepts and never answers, and an
unreachable RAY_ADDRESS each end in seconds with a one-line error (raypipe.timeouts), through
``raypipe run`` in a subprocess with a 60 s limit."""

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raypipe import timeouts
from raypipe.runtime import check_ray_address
from raypipe.sources.paths import open_root

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parent.parent
RUN = "import sys; from raypipe.cli.main import main; sys.exit(main())"


def _raypipe_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHONPATH=str(REPO), RAYPIPE_NO_PROGRESS="1", **env)
    return subprocess.run([sys.executable, "-c", RUN, "run", *args], capture_output=True, text=True,
                          timeout=60, env=environ, cwd=REPO)  # fmt: skip


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


@pytest.fixture
def silent_endpoint():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_gcs_without_credentials_fails_fast_and_clearly():
    line = _one_line_error(_raypipe_run("gs://raypipe-no-such-bucket/data", GOOGLE_APPLICATION_CREDENTIALS=""))
    assert "gs://raypipe-no-such-bucket/data" in line and "credentials" in line


def test_s3_endpoint_that_never_answers_fails_fast_and_clearly(silent_endpoint):
    env = dict(AWS_ENDPOINT_URL=silent_endpoint, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y",
               AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    line = _one_line_error(_raypipe_run("s3://bucket/data", **env))
    assert "s3://bucket/data" in line and "AWS_ENDPOINT_URL" in line


def test_unreachable_ray_address_fails_fast_with_one_line(sample_dir):
    line = _one_line_error(_raypipe_run(str(sample_dir), RAY_ADDRESS="127.0.0.1:1"))
    assert "RAY_ADDRESS='127.0.0.1:1'" in line and "ray start" in line


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "http://127.0.0.1:1/", "[::1]:1"])
def test_ray_address_forms_are_probed(address):
    with pytest.raises(ConnectionError, match="no Ray cluster at"):
        check_ray_address(address, timeout_s=2)


def test_auto_and_local_are_left_to_ray():
    check_ray_address("auto", timeout_s=0.01)
    check_ray_address("local", timeout_s=0.01)


def test_call_with_deadline():
    assert timeouts.call_with_deadline(lambda: 3, 5, lambda: "never") == 3
    with pytest.raises(KeyError):
        timeouts.call_with_deadline(lambda: {}["x"], 5, lambda: "never")
    with pytest.raises(TimeoutError, match="slow thing"):
        timeouts.call_with_deadline(lambda: time.sleep(30), 0.2, lambda: "slow thing")


def test_filesystems_from_uris_carry_the_timeouts_to_the_workers(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    s3 = pickle.loads(pickle.dumps(open_root("s3://bucket/prefix").filesystem))
    options = s3.__reduce__()[1][0]
    assert options["connect_timeout"] == timeouts.STORE_CONNECT_S
    assert options["request_timeout"] == timeouts.STORE_REQUEST_S
    assert options["endpoint_override"] == "http://127.0.0.1:9"  # what from_uri resolved is kept
    gcs = pickle.loads(pickle.dumps(open_root("gs://bucket/prefix").filesystem))
    assert gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == timeouts.GCS_RETRY_S
    assert open_root("file:///tmp").is_local  # a local URI keeps the fast local path
