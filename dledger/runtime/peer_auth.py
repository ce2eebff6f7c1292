"""Peer authentication of Raft connections: a mutual HMAC-SHA256 challenge-response
(docs/operations.md, ``--peer-secret``).

Bytes in, bytes out: this module does no network I/O (the transport reads and writes,
see ``transport.accept_peer`` and ``transport.authenticate_to``). With ``S`` the node
that listens, ``C`` the peer or client that connects, ``K`` the shared secret and
``id`` the node id ``C`` means to reach (``len16`` its byte length as a u16)::

    S -> C  HELLO         MAGIC | Ns                                            8+32 bytes
    C -> S  CLIENT_PROOF  MAGIC | Nc | HMAC(K, "ledgermq-raft-v1|client|"
                                            | len16(id) | id | Ns | Nc)      8+32+32 bytes
    S -> C  SERVER_PROOF  HMAC(K, "ledgermq-raft-v1|server|" | len16(id) | id | Nc | Ns)
                                                                                  32 bytes

then DLedger frames exactly as without a secret. Every message has a fixed size, so a
side reads exactly that many bytes and never looks at a frame before the other side is
authenticated. Why each piece:

- Fresh random nonces from both sides: a recorded proof never verifies again, and each
  MAC covers the other side's nonce, so neither side alone chooses what the other signs.
- Mutual: ``C`` proves itself first, so ``S`` decodes nothing from a stranger; ``S``
  proves itself second, so ``C`` never sends votes, entries or a client's appends to a
  process that merely listens on a peer's address.
- Domain separation (the ``client``/``server`` labels, and the nonces in opposite
  order): a MAC made for one direction never verifies in the other, so an impostor
  cannot hand ``C`` its own proof back (reflection), nor replay a node's server proof
  as a client proof.
- The node id in both MACs: a proof obtained by posing as one node (say, on a dead
  peer's address) does not open a connection to another node.
- The magic (with the protocol version in its last byte) only tells the two common
  misconfigurations apart in the logs: a peer with no secret sends a frame where the
  magic should be.

What it is not: encryption, or integrity of the bytes after the handshake. An attacker
on the network path can read the stream and take over an authenticated TCP connection;
Raft ports belong on a private network, or behind a tunnel, for that.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MAGIC: Final = b"LMQAUTH\x02"
NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32  # SHA-256
HELLO_BYTES: Final = len(MAGIC) + NONCE_BYTES
CLIENT_PROOF_BYTES: Final = len(MAGIC) + NONCE_BYTES + MAC_BYTES
SERVER_PROOF_BYTES: Final = MAC_BYTES

_CLIENT_LABEL: Final = b"ledgermq-raft-v1|client|"
_SERVER_LABEL: Final = b"ledgermq-raft-v1|server|"
MAX_NODE_ID_BYTES: Final = 0xFFFF

# The environment variables of the secret, for ``python -m dledger`` and local clusters
# (``ledgermq broker`` derives the same names from its options).
PEER_SECRET_ENV: Final = "LEDGERMQ_PEER_SECRET"
PEER_SECRET_FILE_ENV: Final = "LEDGERMQ_PEER_SECRET_FILE"


class PeerAuthError(ConnectionError):
    """A handshake failed (wrong or missing secret, wrong magic, short read, timeout).

    A ``ConnectionError``, so whoever retries a failed connect retries this too."""


def _mac(secret: bytes, label: bytes, node_id: str, first: bytes, second: bytes) -> bytes:
    ident = node_id.encode()
    if len(ident) > MAX_NODE_ID_BYTES:
        raise ValueError(f"node id of {len(ident)} bytes is too long")
    msg = b"".join((label, len(ident).to_bytes(2, "big"), ident, first, second))
    return hmac.digest(secret, msg, hashlib.sha256)


def client_mac(secret: bytes, node_id: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(secret, _CLIENT_LABEL, node_id, server_nonce, client_nonce)


def server_mac(secret: bytes, node_id: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(secret, _SERVER_LABEL, node_id, client_nonce, server_nonce)


def check_magic(data: bytes, who: str) -> None:
    """Raise ``PeerAuthError`` unless ``data`` (the first bytes ``who`` sent) is MAGIC."""
    if data != MAGIC:
        if len(data) == len(MAGIC) and data[:-1] == MAGIC[:-1]:
            raise PeerAuthError(
                f"{who} speaks Raft protocol version {data[-1]}, this node {MAGIC[-1]}"
                " (a LedgerMQ release of another series?)"
            )
        raise PeerAuthError(f"{who} sent no handshake (no peer secret there?)")


def _check_size(data: bytes, size: int, what: str) -> None:
    if len(data) != size:
        raise PeerAuthError(f"{what} of {len(data)} bytes, want {size}")


@dataclass(slots=True)
class ServerHandshake:
    """The listening side: ``hello()``, then ``check_client_proof(proof)`` returns the
    server proof to send back (or raises ``PeerAuthError``)."""

    secret: bytes = field(repr=False)
    node_id: str  # this node
    nonce: bytes = field(default_factory=lambda: secrets.token_bytes(NONCE_BYTES))

    def hello(self) -> bytes:
        return MAGIC + self.nonce

    def check_client_proof(self, data: bytes) -> bytes:
        _check_size(data, CLIENT_PROOF_BYTES, "client proof")
        check_magic(data[: len(MAGIC)], "client")
        client_nonce = data[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
        got = data[len(MAGIC) + NONCE_BYTES :]
        want = client_mac(self.secret, self.node_id, self.nonce, client_nonce)
        if not hmac.compare_digest(got, want):
            raise PeerAuthError("client proof does not verify (wrong peer secret?)")
        return server_mac(self.secret, self.node_id, self.nonce, client_nonce)


@dataclass(slots=True)
class ClientHandshake:
    """The connecting side: ``answer(hello)`` returns the client proof to send;
    ``check_server_proof(proof)`` raises ``PeerAuthError`` unless the server holds the
    secret too. ``node_id`` is the node this side means to reach."""

    secret: bytes = field(repr=False)
    node_id: str
    nonce: bytes = field(default_factory=lambda: secrets.token_bytes(NONCE_BYTES))
    _server_nonce: bytes | None = field(default=None, init=False, repr=False)

    def answer(self, hello: bytes) -> bytes:
        _check_size(hello, HELLO_BYTES, "server hello")
        check_magic(hello[: len(MAGIC)], "server")
        self._server_nonce = hello[len(MAGIC) :]
        mac = client_mac(self.secret, self.node_id, self._server_nonce, self.nonce)
        return MAGIC + self.nonce + mac

    def check_server_proof(self, data: bytes) -> None:
        assert self._server_nonce is not None, "answer() the hello first"
        _check_size(data, SERVER_PROOF_BYTES, "server proof")
        want = server_mac(self.secret, self.node_id, self._server_nonce, self.nonce)
        if not hmac.compare_digest(data, want):
            raise PeerAuthError("server proof does not verify (wrong peer secret?)")


def load_peer_secret(value: str | None, path: str | Path | None) -> bytes | None:
    """The secret of ``--peer-secret VALUE`` or ``--peer-secret-file PATH`` (None when
    neither is given). The file's trailing newline is not part of the secret. A string
    becomes bytes the way the OS gave it to us (``os.fsencode``), so any byte string
    passes through an environment variable unchanged. ``ValueError`` for both at once,
    an unreadable file or an empty secret."""
    if value is not None and path is not None:
        raise ValueError("give --peer-secret or --peer-secret-file, not both")
    if path is not None:
        try:
            secret = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as e:
            raise ValueError(f"--peer-secret-file {path}: {e.strerror or e}") from None
        if not secret:
            raise ValueError(f"--peer-secret-file {path} is empty")
        return secret
    if value is not None:
        if not value:
            raise ValueError("--peer-secret is empty")
        return os.fsencode(value)
    return None
