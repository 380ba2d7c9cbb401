"""Whole objects of an ``s3://`` root, and ranges of them (tar shards' members), read with one request each.

pyarrow's S3 client opens an object with a ``HEAD`` (its size) before the ``GET`` that reads it, and its
Python API has no way to pass a size the listing already knows. For a folder of images that is two
requests per image: twice the request charges, and the client's CPU for both (about 1 ms per object
here, against ~1.8 ms to decode and augment it). obstore (Rust's ``object_store``) reads an object with
a single ``GET`` at about half the client CPU (``python bench/profiles.py s3-requests`` prints both).

The store is built from the root's pyarrow ``S3FileSystem`` options (region, endpoint, scheme, explicit
or anonymous credentials, timeouts), and otherwise from the environment as obstore reads it (``AWS_*``
variables, web identity, container and instance credentials). Roots whose credentials come from where
obstore does not look (a profile: ``AWS_PROFILE``, ``~/.aws/config`` or ``~/.aws/credentials``), or
with options it cannot reproduce (an assumed role, a proxy, a CA file), stay with pyarrow. It is a fast
path, never the only one: any failure of a single-GET read is answered by reading the object through
pyarrow as before (so a setting the two clients do not share costs speed, never data), and after a run
of such failures with no success a reader stops trying it.
"""

from __future__ import annotations

import os
import threading

import pyarrow.fs as pafs

__all__ = ["SingleGet", "single_get_for"]

# Failures in a row, with no success yet, after which a reader stops trying single GETs: the store
# cannot be reached this way (credentials obstore does not find, a setting it does not share).
GIVE_UP_AFTER = 8


class SingleGet:
    """``read(path)``: the bytes of ``bucket/key`` with one GET; ``read_range``: a range of them, with
    one GET; both raise on any failure."""

    def __init__(self, options: dict):
        self._options = options
        self._stores: dict[str, object] = {}
        self._lock = threading.Lock()
        self.failures = 0  # in a row
        self.successes = 0

    @property
    def usable(self) -> bool:
        return self.successes > 0 or self.failures < GIVE_UP_AFTER

    def _store(self, bucket: str):
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                from obstore.store import S3Store

                store = self._stores[bucket] = S3Store(bucket, **self._options)
            return store

    def read(self, path: str) -> bytes:
        import obstore

        bucket, _, key = path.partition("/")
        return self._counted(lambda: bytes(obstore.get(self._store(bucket), key).bytes()))

    def read_range(self, path: str, start: int, length: int) -> memoryview:
        """``length`` bytes of ``bucket/key`` from ``start``, with one ranged GET (fewer where the
        object ends first, as a ranged read of pyarrow's returns them), without a copy."""
        import obstore

        bucket, _, key = path.partition("/")
        return self._counted(
            lambda: memoryview(obstore.get_range(self._store(bucket), key, start=start, length=length))
        )

    def _counted(self, request):
        try:
            data = request()
        except Exception:
            with self._lock:
                self.failures += 1
            raise
        with self._lock:
            self.failures = 0
            self.successes += 1
        return data


def single_get_for(filesystem: pafs.FileSystem | None) -> SingleGet | None:
    """A ``SingleGet`` reading what ``filesystem`` reads, or None (not S3, obstore not installed, or an
    option obstore cannot reproduce)."""
    if filesystem is None or filesystem.type_name != "s3" or not _obstore_installed():
        return None
    try:
        opts = filesystem.__reduce__()[1][0]
    except Exception:  # noqa: BLE001 - options not readable: leave the root to pyarrow
        return None
    if (
        not isinstance(opts, dict)
        or opts.get("role_arn")
        or opts.get("tls_ca_file_path")
        or (opts.get("proxy_options") or {}).get("host")
        or not _credentials_shared(opts)
    ):
        return None
    config: dict = {}
    if opts.get("region"):
        config["region"] = opts["region"]
    endpoint = (
        opts.get("endpoint_override")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or ""
    )
    scheme = opts.get("scheme") or "https"
    if endpoint:
        if "://" not in endpoint:
            endpoint = f"{scheme}://{endpoint}"
        config["endpoint"] = endpoint
        config["allow_http"] = endpoint.startswith("http://")
    if opts.get("force_virtual_addressing"):
        config["virtual_hosted_style_request"] = True
    elif endpoint:
        config["virtual_hosted_style_request"] = False  # pyarrow's default with an endpoint: path style
    if opts.get("anonymous"):
        config["skip_signature"] = True
    elif opts.get("access_key") and opts.get("secret_key"):
        config["access_key_id"] = opts["access_key"]
        config["secret_access_key"] = opts["secret_key"]
        if opts.get("session_token"):
            config["session_token"] = opts["session_token"]
    client: dict = {}
    if (opts.get("connect_timeout") or -1) > 0:
        client["connect_timeout"] = f"{opts['connect_timeout']:g}s"
    if (opts.get("request_timeout") or -1) > 0:
        client["timeout"] = f"{opts['request_timeout']:g}s"
    # No retries of its own: a failed single GET is read again through pyarrow, with raypipe's retries.
    return SingleGet({"config": config, "client_options": client, "retry_config": {"max_retries": 0}})


def _credentials_shared(opts: dict) -> bool:
    """Whether obstore finds the credentials pyarrow uses: given explicitly, none (anonymous), or from
    the environment, a web identity, a container or the instance; not from a profile."""
    env = os.environ
    if opts.get("anonymous") or (opts.get("access_key") and opts.get("secret_key")):
        return True
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return True  # the environment comes before any profile in both clients' chains
    if env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE"):
        return False
    if any(
        env.get(k)
        for k in (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    ):
        return True
    home = os.path.expanduser("~")
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
        env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"),
    )
    return not any(os.path.exists(f) for f in files)  # else: the default profile (pyarrow only)


def _obstore_installed() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True
