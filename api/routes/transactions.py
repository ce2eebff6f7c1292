"""Transactions (docs/http.md, "Transactions"): end one, the checks for a producer group
(a long poll), and the pending ones. A produce with ``transaction`` begins one
(``messages.py``). Every call goes to the master, as a produce does."""

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from broker.copies import PROP_REAL_TOPIC
from broker.reads import PulledMessage
from broker.transactions.service import ROUTING_PROPERTIES, Check, transaction_id

from .. import models
from .common import (
    AccessDep,
    JSONBytes,
    LongPollDep,
    TransactionsDep,
    error_docs,
)

router = APIRouter(tags=["transactions"])

TransactionPath = Annotated[str, Path(min_length=1, max_length=64, examples=["tx1:17"])]
GroupQuery = Annotated[str, Query(pattern=models.GROUP_PATTERN, examples=["pg"])]


@router.post(
    "/v1/transactions/{transaction_id}",
    summary="commit or roll back a transaction (a repeat answers the same)",
    response_model=models.TransactionEnded,
    responses=error_docs(307, 404, 409, 503),
)
async def end(
    transaction_id: TransactionPath,
    body: models.EndTransaction,
    transactions: TransactionsDep,
    access: AccessDep,
) -> Response:
    topic = await transactions.topic_of(transaction_id)
    access.need("produce", topic) if topic else access.need("admin")
    state = await transactions.end(transaction_id, body.action)
    return JSONBytes({"transaction_id": transaction_id, "state": state})


def _message(m: PulledMessage) -> dict[str, Any]:
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    return {
        "topic": m.properties.get(PROP_REAL_TOPIC, m.topic),
        "queue_id": None,
        "queue_offset": None,
        "msg_id": m.msg_id,
        "commitlog_offset": m.commitlog_offset,
        "body": body,
        "encoding": encoding,
        "key": m.keys[0] if m.keys else None,
        "keys": m.keys,
        "tags": m.tags,
        "properties": {k: v for k, v in m.properties.items() if k not in ROUTING_PROPERTIES},
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
    }


def _check(c: Check) -> dict[str, Any]:
    t = c.transaction
    return {
        "transaction_id": transaction_id(t.base),
        "topic": t.topic,
        "producer_group": t.group,
        "check_count": t.checks,
        "messages": [_message(m) for m in c.messages],
    }


@router.get(
    "/v1/transactions/checks",
    summary="the checks of a producer group's unresolved transactions (long polling)",
    response_model=models.TransactionChecks,
    responses=error_docs(307, 422, 429, 503),
)
async def checks(
    *,
    producer_group: GroupQuery,
    transactions: TransactionsDep,
    access: AccessDep,
    long_poll: LongPollDep,
    wait_ms: Annotated[int, Query(ge=0, le=60_000)] = 0,
    max_checks: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    with long_poll(wait_ms):
        got = await transactions.checks(producer_group, wait_ms, max_checks)
    return JSONBytes(
        {"checks": [_check(c) for c in got if access.may("produce", c.transaction.topic)]}
    )


@router.get(
    "/v1/transactions",
    summary="the unresolved transactions (of a producer group), oldest first",
    response_model=models.PendingTransactions,
)
async def pending(
    transactions: TransactionsDep,
    access: AccessDep,
    producer_group: Annotated[str | None, Query(pattern=models.GROUP_PATTERN)] = None,
) -> Response:
    access.need("admin")
    return JSONBytes(
        {
            "transactions": [
                {
                    "transaction_id": transaction_id(t.base),
                    "topic": t.topic,
                    "producer_group": t.group,
                    "messages": t.count,
                    "check_count": t.checks,
                    "born": t.born,
                    "next_check": t.next_check,
                }
                for t in transactions.pending(producer_group)
            ]
        }
    )
