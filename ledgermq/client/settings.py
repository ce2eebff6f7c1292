"""The client's settings: ``ClientSettings`` (every limit of the client: timeouts, the
deadline, attempts, backoff, connections, handles per ack, TLS, the token),
``ClientOptions`` (its fields as constructor keywords) and ``parse_brokers`` (the broker
list a client starts from)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Every limit of the client. One *operation* (a send, a poll, an admin call) makes
    at most ``max_attempts`` requests (discovery and redirects included) within
    ``deadline_s``; one *request* waits ``timeout_s`` beyond any long-poll wait."""

    timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    deadline_s: float = 30.0
    max_attempts: int = 64
    # The first backoff is 20-40 ms, then doubling (equal jitter): a failover completes
    # in well under 100 ms after a crash (issue 18), so a client waits little for it.
    backoff_base_s: float = 0.04
    backoff_cap_s: float = 2.0
    # Redirects followed in a row before backing off (two nodes naming each other).
    max_redirects: int = 5
    # A manual-commit consumer ahead of its committed offsets pulls queue by queue and
    # long-polls one queue at a time for at most this long.
    sweep_wait_ms: int = 200
    auth_token: str | None = None
    verify: bool | str | ssl.SSLContext = True  # TLS: False, a CA bundle path, a context
    max_connections: int = 16
    # Proxies from the environment are ignored unless asked for: brokers are usually near.
    trust_env: bool = False
    # A produce (and the master discovery before it) that gets no answer within this
    # long is given up on that node: the master is looked for again and the batch
    # retried under its producer session (the broker deduplicates, or joins the attempt
    # still running). A commit takes a round trip and an fsync, milliseconds; a paused
    # or cut-off master would otherwise hold the send for all of ``timeout_s``, while a
    # new master is elected in about a second. Capped by ``timeout_s``.
    produce_answer_timeout_s: float = 1.5
    # Receipt handles per ack or nack request (the broker's default limit); more are
    # sent in several requests.
    max_receipt_handles: int = 1024
    # Batches go in RocketMQ's record format (docs/http.md), which the broker stores as
    # they came: no JSON to read, no object per message. False: JSON, as every batch
    # the format cannot say (a delay message, messages for different queues) goes.
    record_format: bool = True
    # Pulls, group pulls and POP receives are answered as record pages (docs/http.md
    # "Pull in the record format"): the stored records, decoded lazily, field by field
    # (``ledgermq.client.fetch``). False: JSON, every message decoded when it arrives.
    record_pull: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.deadline_s <= 0:
            raise ValueError("timeouts and the deadline must be positive")
        if self.max_attempts < 1 or self.max_redirects < 1 or self.max_connections < 1:
            raise ValueError("max_attempts, max_redirects and max_connections must be >= 1")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("want 0 < backoff_base_s <= backoff_cap_s")
        if self.sweep_wait_ms < 0:
            raise ValueError("sweep_wait_ms must be >= 0")
        if self.produce_answer_timeout_s <= 0:
            raise ValueError("produce_answer_timeout_s must be positive")
        if self.max_receipt_handles < 1:
            raise ValueError("max_receipt_handles must be >= 1")


class ClientOptions(TypedDict, total=False):
    """``ClientSettings`` fields as constructor keywords."""

    timeout_s: float
    connect_timeout_s: float
    deadline_s: float
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    max_redirects: int
    sweep_wait_ms: int
    auth_token: str | None
    verify: bool | str | ssl.SSLContext
    max_connections: int
    trust_env: bool
    produce_answer_timeout_s: float
    max_receipt_handles: int
    record_format: bool
    record_pull: bool


def parse_brokers(brokers: str | Sequence[str]) -> list[str]:
    """``"h0:8080, http://h1:8081/"`` → ``["http://h0:8080", "http://h1:8081"]``."""
    raw = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    out: list[str] = []
    for item in raw:
        url = item.strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"invalid broker URL {item.strip()!r}")
        if url not in out:
            out.append(url)
    if not out:
        raise ValueError("no broker URL given")
    return out
