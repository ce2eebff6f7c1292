"""The client's error table (``ledgermq.client.errors``) against the codes a node can answer:
every one has a typed class or is declared untyped, and nothing else is in it but the
client's own codes. A code the broker gains fails here until the client decides."""

from __future__ import annotations

from ledgermq import client
from tests.error_codes import node_codes


def client_table() -> set[str]:
    """The codes the client knows it can be answered: typed or declared untyped."""
    typed = set(client.ERROR_CLASSES) - client.CLIENT_CODES
    assert not typed & client.UNTYPED_CODES, "a code is both typed and untyped"
    return typed | client.UNTYPED_CODES


def test_the_client_error_table_is_the_codes_a_node_answers() -> None:
    assert client_table() == node_codes()


def test_the_client_own_codes_are_no_node_answer() -> None:
    assert set(client.ERROR_CLASSES) >= client.CLIENT_CODES
    assert not client.CLIENT_CODES & node_codes()


def test_an_untyped_code_is_a_plain_error() -> None:
    for code in sorted(client.UNTYPED_CODES):
        assert type(client.make_error(code, "m", 500)) is client.LedgerMQError
