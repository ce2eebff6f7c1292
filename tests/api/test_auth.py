"""Tokens files and scopes (docs/operations.md); the HTTP side is in test_app.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from api.auth import TokenTable
from ledgermq.node import add_broker_options, settings_from_args


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no tokens"),
        ("tok\n", "at least one scope"),
        ("tok write\n", "unknown scope"),
        ("tok produce:bad/topic\n", "unknown scope"),
        ("tok admin\ntok consume\n", "twice"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_its_line(tmp_path: Path, text: str, why: str) -> None:
    f = tmp_path / "tokens"
    f.write_text(text)
    with pytest.raises(ValueError, match=why):
        TokenTable.from_file(f)


def test_scopes_cover_what_they_name() -> None:
    t = TokenTable([("a", ["admin"]), ("p", ["produce:orders", "consume"]), ("c", ["consume:x"])])
    admin, p, c = t.lookup("a"), t.lookup("p"), t.lookup("c")
    assert admin is not None and p is not None and c is not None
    assert admin.admin and admin.allows("produce", "anything")
    assert p.allows("produce", "orders") and not p.allows("produce", "other")
    assert not p.allows("produce") and p.allows("consume") and p.allows("consume", "other")
    assert not p.admin and not c.allows("consume") and c.allows("consume", "x")
    assert t.lookup("A") is None and t.lookup("") is None
    g = TokenTable([("g", ["consume:x", "group:billing"])]).lookup("g")
    assert g is not None and g.owns_group("billing") and not g.owns_group("other")
    assert admin.owns_group("any") and not p.owns_group("billing")


def test_ledgermq_broker_reads_its_tokens_file(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_broker_options(p)
    f = tmp_path / "tokens"
    f.write_text("writer produce:orders\nboss admin\n")
    _, http = settings_from_args(p.parse_args(["--auth-tokens-file", str(f)]))
    assert http.auth_tokens is not None and len(http.auth_tokens) == 2
    grant = http.auth_tokens.lookup("writer")
    assert grant is not None and grant.allows("produce", "orders")
    with pytest.raises(ValueError, match="No such file"):
        settings_from_args(p.parse_args(["--auth-tokens-file", str(tmp_path / "missing")]))
