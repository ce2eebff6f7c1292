"""Transactional producers (docs/client.md, "Transactions"): ``TransactionOps`` (begin,
commit, rollback, poll and answer checks), written once for the sync and async fronts.

A transaction is one batch: ``begin`` stores its messages as half messages, visible to
no consumer, and answers its id; ``commit`` delivers them (once), ``rollback`` drops
them. If the producer goes quiet, the broker checks it: ``answer_checks`` polls the
checks of the producer group and answers each with what the checker says (``"commit"``,
``"rollback"``, or ``None``: not known yet, asked again later; after the broker's last
check it rolls back). Commits and rollbacks are idempotent, so answering a check twice,
or from two producers of the group, is fine.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .exchange import Call, Exchange, Gen
from .operations import ProducerOps, api_path, parse_send_result
from .types import MessageLike, SendResult, encode_message

Resolution = Literal["commit", "rollback"]


@dataclass(frozen=True, slots=True)
class TransactionMessage:
    """A half message as a check shows it."""

    topic: str
    body: bytes
    key: str | None
    tags: str | None
    properties: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """The broker asks: commit or roll back ``transaction_id``?"""

    transaction_id: str
    topic: str
    producer_group: str
    check_count: int
    messages: list[TransactionMessage]


@dataclass(frozen=True, slots=True)
class Begun:
    transaction_id: str
    results: list[SendResult]


Checker = Callable[[TransactionCheck], Resolution | None]


def _decode(m: Mapping[str, Any]) -> TransactionMessage:
    raw = m["body"]
    body = base64.b64decode(raw) if m.get("encoding") == "base64" else str(raw).encode()
    return TransactionMessage(
        str(m["topic"]), body, m.get("key"), m.get("tags"), dict(m.get("properties") or {})
    )


def _check(d: Mapping[str, Any]) -> TransactionCheck:
    return TransactionCheck(
        str(d["transaction_id"]),
        str(d["topic"]),
        str(d["producer_group"]),
        int(d["check_count"]),
        [_decode(m) for m in d["messages"]],
    )


class TransactionOps:
    def __init__(self, ex: Exchange, producer_group: str, producer: ProducerOps) -> None:
        self.ex = ex
        self.producer_group = producer_group
        self.producer = producer

    def begin(self, topic: str, messages: Iterable[MessageLike]) -> Gen[Begun]:
        """Store ``messages`` as one transaction's half messages (retried under the
        producer's session: stored once)."""
        batch = [encode_message(m) for m in messages]
        if not batch:
            raise ValueError("no messages to send")
        p = self.producer
        sequence = p.sequence
        p.sequence += 1
        body = {
            "messages": batch,
            "producer_id": p.producer_id,
            "sequence": sequence,
            "transaction": {"producer_group": self.producer_group},
        }
        call = Call("POST", api_path("topics", topic, "messages"), body=body, write=True)
        reply = yield from self.ex.exchange(call)
        d = reply.body
        return Begun(str(d["transaction_id"]), [parse_send_result(r) for r in d["results"]])

    def end(self, transaction_id: str, action: Resolution) -> Gen[str]:
        """Commit or roll back; the transaction's state (``TransactionResolvedError``
        when it was resolved the other way)."""
        path = api_path("transactions", transaction_id)
        reply = yield from self.ex.write("POST", path, {"action": action})
        return str(reply.body["state"])

    def commit(self, transaction_id: str) -> Gen[str]:
        return (yield from self.end(transaction_id, "commit"))

    def rollback(self, transaction_id: str) -> Gen[str]:
        return (yield from self.end(transaction_id, "rollback"))

    def checks(self, wait_ms: int = 0, max_checks: int = 100) -> Gen[list[TransactionCheck]]:
        """The broker's checks for this producer group, waiting up to ``wait_ms``."""
        params: dict[str, str | int] = {
            "producer_group": self.producer_group,
            "wait_ms": wait_ms,
            "max_checks": max_checks,
        }
        path = api_path("transactions", "checks")
        call = Call("GET", path, params=params, write=True, wait_ms=wait_ms)  # (the master's)
        reply = yield from self.ex.exchange(call)
        return [_check(c) for c in reply.body["checks"]]

    def answer_checks(self, checker: Checker, wait_ms: int = 0) -> Gen[int]:
        """Poll the checks once and answer each as ``checker`` says; how many were
        answered (a ``None`` from the checker leaves one for the broker's next check)."""
        answered = 0
        for c in (yield from self.checks(wait_ms)):
            action = checker(c)
            if action is not None:
                yield from self.end(c.transaction_id, action)
                answered += 1
        return answered
