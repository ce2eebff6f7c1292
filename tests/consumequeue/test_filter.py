"""Tags hash = Java String.hashCode(); RocketMQ subscription expressions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumequeue import matches, parse_tag_expression, tags_hash


@pytest.mark.parametrize(
    ("tags", "java"),
    [
        ("TagA", 2598919),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),  # Java's classic collision
        ("", 0),
        ("😀", 1772899),  # U+1F600 is two UTF-16 units: 0xD83D * 31 + 0xDE00
        ("polygenelubricants", -(2**31)),  # overflows to Integer.MIN_VALUE
        ("é", 233),
    ],
)
def test_tags_hash_is_java_string_hash_code(tags: str, java: int) -> None:
    assert tags_hash(tags) == java


def test_no_tags_hash_to_zero() -> None:
    assert tags_hash(None) == 0


def _reference(s: str) -> int:
    data = s.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
    h = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@given(st.text(max_size=40))
def test_tags_hash_matches_the_polynomial_definition(s: str) -> None:
    assert tags_hash(s) == _reference(s)
    assert -(2**31) <= tags_hash(s) < 2**31


@pytest.mark.parametrize("expr", [None, "", "*", "  *  "])
def test_match_all_expressions(expr: str | None) -> None:
    assert parse_tag_expression(expr) is None
    assert matches(12345, None) and matches(0, None)


def test_tag_expression_is_the_set_of_tag_hashes() -> None:
    hashes = parse_tag_expression("TagA || TagB||  ||TagA")
    assert hashes == frozenset({tags_hash("TagA"), tags_hash("TagB")})
    assert matches(tags_hash("TagB"), hashes)
    assert not matches(tags_hash("TagC"), hashes) and not matches(0, hashes)
    assert matches(tags_hash("BB"), parse_tag_expression("Aa"))  # a candidate, not a proof


def test_an_expression_without_tags_matches_nothing() -> None:
    assert parse_tag_expression("||") == frozenset()
    assert not matches(0, frozenset())
