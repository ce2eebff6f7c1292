"""Bearer tokens and what each may do (docs/operations.md).

A node takes one ``--auth-token`` (allowed everything) and/or a ``--auth-tokens-file``
with one token per line and its scopes::

    # token                  scopes
    3c1f...admin-token       admin
    9a7e...orders-writer     produce:orders
    51b0...analytics         consume:orders consume:clicks

- ``admin``: everything, including topic create/delete, any group's offset resets and
  leadership transfer;
- ``produce`` / ``produce:<topic>``: produce to every topic / to that topic (a produce
  may auto-create its topic when the node allows it);
- ``consume`` / ``consume:<topic>``: pull, query messages, read and commit group
  offsets, group pulls, for every topic / that topic;
- ``group:<group>``: with ``consume`` of the topic, reset that group's offsets (a
  commit only moves a group forward; a reset may move it anywhere, so a token that may
  read a topic may not rewind or skip every group's place in it).

Any valid token may read the cluster status and the topic list. Tokens are kept only as
SHA-256 digests, looked up by digest: no comparison that leaks how much of a guess
matched, and a dump of the process does not show them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ACTIONS = ("produce", "consume")
_TOPIC = re.compile(r"[A-Za-z0-9_%|-]{1,127}")


@dataclass(frozen=True, slots=True)
class Grant:
    """The scopes of one token."""

    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    def owns_group(self, group: str) -> bool:
        """May this token reset ``group``'s offsets (with ``consume`` of the topic)?"""
        return "admin" in self.scopes or f"group:{group}" in self.scopes

    def allows(self, action: str, topic: str | None = None) -> bool:
        """May this token ``action`` (produce/consume) ``topic`` (None: every topic)?"""
        s = self.scopes
        return "admin" in s or action in s or (topic is not None and f"{action}:{topic}" in s)


def parse_scope(scope: str) -> str:
    """A scope as written in a tokens file; ``ValueError`` says what is wrong."""
    if scope == "admin" or scope in ACTIONS:
        return scope
    action, sep, topic = scope.partition(":")
    if sep and action in (*ACTIONS, "group") and _TOPIC.fullmatch(topic):
        return scope
    raise ValueError(
        f"unknown scope {scope!r}: want admin, produce, consume, produce:<topic>,"
        " consume:<topic> or group:<group>"
    )


def config_lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """The words of each line of a tokens or access-keys file that has any, with its
    number: a word led by ``#`` starts a comment to the end of the line."""
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        comment = next((i for i, w in enumerate(words) if w.startswith("#")), len(words))
        if comment:
            yield number, words[:comment]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """Tokens (as digests) → their grants."""

    def __init__(self, entries: Iterable[tuple[str, Iterable[str]]] = ()) -> None:
        self._grants: dict[bytes, Grant] = {}
        for token, scopes in entries:
            self.add(token, scopes)

    def add(self, token: str, scopes: Iterable[str]) -> None:
        if not token or token.startswith("#") or any(c.isspace() for c in token):
            raise ValueError("a token is a non-empty string without whitespace, not led by #")
        grant = Grant(frozenset(parse_scope(s) for s in scopes))
        if not grant.scopes:
            raise ValueError("a token needs at least one scope")
        digest = _digest(token)
        if digest in self._grants:
            raise ValueError("the same token is listed twice")
        self._grants[digest] = grant

    @classmethod
    def from_file(cls, path: Path) -> TokenTable:
        """Read a tokens file (format above); ``ValueError`` names the bad line."""
        table = cls()
        for number, words in config_lines(path.read_text()):
            try:
                table.add(words[0], words[1:])
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
        if not table._grants:
            raise ValueError(f"{path}: no tokens")
        return table

    def copy(self) -> TokenTable:
        other = TokenTable()
        other._grants = dict(self._grants)
        return other

    def lookup(self, token: str) -> Grant | None:
        return self._grants.get(_digest(token))

    def __len__(self) -> int:
        return len(self._grants)
