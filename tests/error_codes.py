"""The error codes a node can answer, found once for every test that compares a list of
them (docs/operations.md's table, the client's table): the ``BrokerError`` classes, the
API's included, and the codes the HTTP layer answers for requests the broker never saw."""

from __future__ import annotations

import api.app  # noqa: F401  # loads every error class (api.media adds NOT_ACCEPTABLE)
from broker import errors

# Codes the HTTP layer answers for requests the broker never saw (api/app.py).
HTTP_LAYER_CODES = {"NOT_FOUND", "METHOD_NOT_ALLOWED", "HTTP_ERROR", "CLIENT_DISCONNECT"}


def broker_codes() -> set[str]:
    found, todo = set(), [errors.BrokerError]
    while todo:
        cls = todo.pop()
        found.add(cls.code)
        todo.extend(cls.__subclasses__())
    return found


def node_codes() -> set[str]:
    """Every code a node can answer."""
    return broker_codes() | HTTP_LAYER_CODES
