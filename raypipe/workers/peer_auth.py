"""How a consumer and a worker on another node make sure of each other before either reads a pickle.

A ``NodeWorkers`` consumer listens on its node's address for the workers its launchers start
(``raypipe.workers.node``); the requests and answers on such a connection are pickles, which
run code when read. So a connection is used only once both ends have shown they know the secret the
consumer made and handed to the launchers through Ray: each sends a random challenge, and answers the
other's with an HMAC of it under the secret (the secret itself never crosses the connection). A peer
that fails, or has not finished within ``AUTH_TIMEOUT_S`` (one deadline for the whole handshake, so a
peer that trickles a byte at a time is dropped too), is dropped before anything else is read.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time

__all__ = [
    "SECRET_ENV",
    "AUTH_TIMEOUT_S",
    "PeerAuthError",
    "new_secret",
    "prove_server",
    "prove_client",
    "tune_stream_socket",
]

# The environment variable a launcher hands the secret to its workers in (as hex): a process's
# environment is readable by its own user only, where its command line is anyone's. Not one of
# raypipe.settings: a per-run secret for the launcher's own children, never set by users.
SECRET_ENV = "RAYPIPE_NODE_WORKER_SECRET"
AUTH_TIMEOUT_S = 10.0
_NONCE = 32
_DIGEST = hashlib.sha256().digest_size
# Which side a proof is for, so that one side's answer cannot be replayed as the other's.
_WORKER, _CONSUMER = b"raypipe-worker", b"raypipe-consumer"


class PeerAuthError(ConnectionError):
    """The other end of a connection did not show it knows the secret."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def _proof(secret: bytes, side: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, side + nonce, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes, all by ``deadline`` (``time.monotonic()``)."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            more = sock.recv(n - len(data))
        except TimeoutError:
            raise PeerAuthError("the handshake did not finish in time") from None
        if not more:
            raise PeerAuthError("the connection ended during the handshake")
        data += more
    return data


def prove_server(sock: socket.socket, secret: bytes, timeout_s: float | None = None) -> None:
    """The consumer's side, on a connection it accepted: raises ``PeerAuthError`` unless the worker
    answers its challenge (then answers the worker's) within ``timeout_s`` (None: ``AUTH_TIMEOUT_S``)."""
    timeout_s = AUTH_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    sock.settimeout(timeout_s)
    try:
        challenge = secrets.token_bytes(_NONCE)
        sock.sendall(challenge)
        answer = _read(sock, _DIGEST + _NONCE, deadline)
        if not hmac.compare_digest(answer[:_DIGEST], _proof(secret, _WORKER, challenge)):
            raise PeerAuthError("a worker connected without the secret")
        sock.sendall(_proof(secret, _CONSUMER, answer[_DIGEST:]))
    except OSError as exc:
        if isinstance(exc, PeerAuthError):
            raise
        raise PeerAuthError(f"handshake failed: {exc}") from exc
    finally:
        try:
            sock.settimeout(None)
        except OSError:
            pass


def prove_client(sock: socket.socket, secret: bytes, timeout_s: float | None = None) -> None:
    """The worker's side: answers the consumer's challenge, then checks the consumer's answer to its own."""
    deadline = time.monotonic() + (AUTH_TIMEOUT_S if timeout_s is None else timeout_s)
    challenge = _read(sock, _NONCE, deadline)
    mine = secrets.token_bytes(_NONCE)
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    sock.sendall(_proof(secret, _WORKER, challenge) + mine)
    if not hmac.compare_digest(_read(sock, _DIGEST, deadline), _proof(secret, _CONSUMER, mine)):
        raise PeerAuthError("the consumer did not prove it knows the secret")
    sock.settimeout(None)


def tune_stream_socket(sock: socket.socket) -> None:
    """No delay for the small request frames, and a peer that vanishes (its node lost, a cut link)
    noticed within about half a minute, idle or with bytes unacknowledged, instead of TCP's minutes."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 30_000)):
        option = getattr(socket, name, None)
        if option is not None:  # Linux names all four; elsewhere the system's defaults stay
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
