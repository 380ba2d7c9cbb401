"""No hangs: an object store without credentials, an endpoint that accepts and never answers, and a
RAY_ADDRESS that is unreachable or is no Ray (an HTTP server, a service that answers something else)
each end in seconds with a one-line error (raypipe.timeouts), through ``raypipe run`` or the training
job in a subprocess with a 60 s limit."""

import http.server
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raypipe import settings, timeouts
from raypipe.runtime import check_ray_address
from raypipe.sources.transport.paths import open_root

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
RUN = "from raypipe.cli.main import console_main; console_main()"


def _raypipe_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHONPATH=str(REPO), RAYPIPE_NO_PROGRESS="1", **env)
    return subprocess.run(
        [sys.executable, "-c", RUN, "run", *args], capture_output=True, text=True, timeout=60, env=environ, cwd=REPO
    )


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


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>a dashboard</html>")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_endpoint():
    """An HTTP server on 127.0.0.1 (what a dashboard's or a proxy's port is): ``host:port``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def garbage_endpoint():
    """A TCP server on 127.0.0.1 that answers each connection with a line of text and closes it."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            with conn:
                conn.sendall(b"220 not a Ray cluster\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    server.close()


def test_gcs_without_credentials_fails_fast_and_clearly():
    line = _one_line_error(_raypipe_run("gs://raypipe-no-such-bucket/data", GOOGLE_APPLICATION_CREDENTIALS=""))
    assert "gs://raypipe-no-such-bucket/data" in line and "credentials" in line


def test_s3_endpoint_that_never_answers_fails_fast_and_clearly(silent_endpoint):
    env = dict(
        AWS_ENDPOINT_URL=silent_endpoint,
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
        AWS_EC2_METADATA_DISABLED="true",
    )
    line = _one_line_error(_raypipe_run("s3://bucket/data", **env))
    assert "s3://bucket/data" in line and "AWS_ENDPOINT_URL" in line


def test_unreachable_ray_address_fails_fast_with_one_line(sample_dir):
    line = _one_line_error(_raypipe_run(str(sample_dir), RAY_ADDRESS="127.0.0.1:1"))
    assert "RAY_ADDRESS='127.0.0.1:1'" in line and "ray start" in line


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "http://127.0.0.1:1/", "[::1]:1"])
def test_ray_address_forms_are_probed(address):
    with pytest.raises(ConnectionError, match="no Ray cluster at"):
        check_ray_address(address, timeout_s=2)


def test_a_ray_address_that_answers_http_fails_fast_with_one_line(http_endpoint, sample_dir):
    t0 = time.monotonic()
    line = _one_line_error(_raypipe_run(str(sample_dir), RAY_ADDRESS=http_endpoint))
    assert time.monotonic() - t0 < 30  # a hang guard; ray.init alone retries such an address for minutes
    assert f"RAY_ADDRESS='{http_endpoint}'" in line and "answers HTTP" in line and "GCS" in line, line


def test_the_training_job_reports_a_ray_address_that_is_no_ray_in_one_line(garbage_endpoint, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), RAYPIPE_NO_PROGRESS="1", RAY_ADDRESS=garbage_endpoint)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "train.py"), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    line = _one_line_error(proc)
    assert time.monotonic() - t0 < 30  # a hang guard, as above
    assert line.startswith(f"train.py: error: RAY_ADDRESS='{garbage_endpoint}': ")
    assert "something other than gRPC" in line and "GCS" in line, line
    assert not (tmp_path / "sample_data").exists()  # it stopped before doing anything else


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_what_accepts_but_is_not_a_grpc_server_is_named(scheme, http_endpoint, garbage_endpoint, silent_endpoint):
    silent = silent_endpoint.removeprefix("http://")
    for endpoint, why in (
        (http_endpoint, "answers HTTP"),
        (garbage_endpoint, "something other than gRPC"),
        (silent, "sent nothing in 0.5 s"),
    ):
        with pytest.raises(ConnectionError, match=why):
            check_ray_address(scheme + endpoint, timeout_s=0.5)


def test_a_grpc_server_passes_the_probe():
    """Ray's GCS and Ray Client server are gRPC servers: a bare one (grpcio, which Ray depends on) passes."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check_ray_address(f"127.0.0.1:{port}", timeout_s=5)
        check_ray_address(f"ray://127.0.0.1:{port}", timeout_s=5)
    finally:
        server.stop(0)


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
    assert options["connect_timeout"] == settings.current().store_connect_s
    assert options["request_timeout"] == settings.current().store_request_s
    assert options["endpoint_override"] == "http://127.0.0.1:9"  # what from_uri resolved is kept
    gcs = pickle.loads(pickle.dumps(open_root("gs://bucket/prefix").filesystem))
    assert gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == settings.current().gcs_retry_s
    assert open_root("file:///tmp").is_local  # a local URI keeps the fast local path


def test_a_call_that_timed_out_is_known_to_be_left_behind_until_it_returns():
    # in a fresh interpreter: this one may hold threads that earlier tests' deadlines left behind
    code = """
import threading, time
from raypipe import timeouts
release = threading.Event()
try:
    timeouts.call_with_deadline(release.wait, 0.05, lambda: "stuck")
except TimeoutError as e:
    assert str(e) == "stuck"
assert timeouts.threads_left_behind()
release.set()
deadline = time.monotonic() + 10
while timeouts.threads_left_behind() and time.monotonic() < deadline:
    time.sleep(0.01)
assert not timeouts.threads_left_behind()
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.ray
def test_the_training_job_ends_at_once_after_a_listing_that_timed_out(silent_endpoint, tmp_path):
    """A remote listing that timed out leaves its thread in the S3 client, in a request to an endpoint
    that never answers (here one the client would wait 300 s for): the job prints its one-line error
    and ends then, its Ray shut down, rather than in an interpreter shutdown that waits for that request
    (or crashes under it, as a GCS client's did)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RAYPIPE_NO_PROGRESS="1",
        AWS_ENDPOINT_URL=silent_endpoint,
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
        AWS_EC2_METADATA_DISABLED="true",
        RAYPIPE_FIRST_ANSWER_S="2",
        RAYPIPE_STORE_REQUEST_S="300",
    )
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "jobs" / "train.py"), "--data", "s3://bucket/data", "--epochs", "1"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        try:
            errors = []
            for line in proc.stderr:  # up to its error line
                if "error:" in line:
                    errors.append(line)
                    break
            proc.wait(timeout=30)  # a hang guard: from its error line, not the 300 s the request may wait
            errors += [line for line in proc.stderr.read().splitlines() if "error:" in line]
        finally:
            if proc.poll() is None:  # SIGTERM first: Ray's handler shuts the local Ray down
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, errors)
    assert errors[0].startswith("train.py: error: listing s3://bucket/data did not answer in 2 s")
    deadline = time.monotonic() + 10  # and nothing it started is left (a local Ray's agents)
    while (left := _processes_in(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left


def _processes_in(folder: Path) -> list[str]:
    """The command lines of the processes whose working directory is ``folder``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80])
        except OSError:
            continue
    return found
