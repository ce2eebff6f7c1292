"""Counting a produce body before it is parsed (issue 17, HTTP): ``check_json_shape``
counts exactly on valid JSON (hypothesis, against the parsed document), never raises
anything but a 413 on any bytes, stays linear on the bodies built to make a scanner
backtrack, and the produce route refuses a body of empty messages without building it."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.json_shape import check_json_shape, ndjson_lines
from broker import errors
from tests.api.conftest import TEST_LIMITS, Node
from tests.fuzz.targets_api import true_shape

MiB = 1 << 20

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(doc=json_values, indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_counts_are_exact_on_valid_json(doc: Any, indent: int | None, ascii_only: bool) -> None:
    body = json.dumps({"messages": doc}, indent=indent, ensure_ascii=ascii_only).encode()
    items, values = true_shape({"messages": doc})
    per = values  # the most any count can need
    assert check_json_shape(body, items, per) == items
    if items:
        with pytest.raises(errors.PayloadTooLargeError, match="messages"):
            check_json_shape(body, items - 1, per)
    tight = -(-values // max(1, items))  # values fit exactly at this many per message
    check_json_shape(body, items, tight)
    if tight > 1 and values > (tight - 1) * max(1, items):
        with pytest.raises(errors.PayloadTooLargeError):
            check_json_shape(body, items, tight - 1)


@settings(max_examples=2000, deadline=None)
@given(
    body=st.binary(max_size=200)
    | st.text(alphabet='{}[],:"\\ \n1atx', max_size=200).map(str.encode)
)
def test_any_bytes_give_a_count_or_a_413(body: bytes) -> None:
    try:
        assert check_json_shape(body, 10, 4) >= 0
    except errors.PayloadTooLargeError as e:
        assert e.http_status == 413
    with contextlib.suppress(errors.PayloadTooLargeError):
        assert len(ndjson_lines(body, 10)) <= 10


ADVERSARIAL = {
    "empty messages": b'{"messages":[' + b"{}," * (16 * MiB // 3 - 10) + b"{}]}",
    "nested arrays": b"[" * (16 * MiB),
    "an unterminated string of escaped quotes": b'"' + b'\\"' * (8 * MiB - 1),
    "backslashes": b"\\" * (16 * MiB),
    "quotes": b'"' * (16 * MiB),
    "scalars": b"1," * (8 * MiB),
    "blank lines": b"\n" * (16 * MiB),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_a_16_mib_adversarial_body_is_counted_in_linear_time(name: str) -> None:
    """Old path: the empty-messages body took 44 s and 2.6 GiB to parse into errors;
    counted, ~0.2-0.6 s here on a loaded 2-core machine. The bound is loose (CI noise),
    a quadratic scan of 16 MiB would not finish within it."""
    body = ADVERSARIAL[name]
    started = time.monotonic()
    try:
        check_json_shape(body, 1000, 256)
        ndjson_lines(body, 1000)
    except errors.PayloadTooLargeError:
        pass
    assert time.monotonic() - started < 10


def test_ndjson_lines_skip_blank_ones_and_stop_past_the_limit() -> None:
    body = b"\n\n  \n" + b'{"body": "a"}\r\n' + b" \n" * 1000 + b'  {"body": "b"}'
    assert ndjson_lines(body, 2) == [b'{"body": "a"}\r', b'{"body": "b"}']
    with pytest.raises(errors.PayloadTooLargeError):
        ndjson_lines(body, 1)
    with pytest.raises(errors.PayloadTooLargeError):
        ndjson_lines(b"{}\n" * (4 * MiB), 1000)


def test_a_string_that_looks_like_structure_counts_as_one() -> None:
    body = json.dumps({"messages": [{"body": '[{"a": [1, 2]}, {}]\\"'}]}).encode()
    assert check_json_shape(body, 1, 4) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("ndjson", [False, True])
async def test_produce_refuses_a_body_of_empty_messages_unbuilt(node: Node, ndjson: bool) -> None:
    """A body under the byte cap holding ~87,000 empty messages: 413 from the count, where
    the parse used to build every one (then answer 422 for their missing bodies)."""
    n = TEST_LIMITS.max_request_bytes // 3 - 10
    if ndjson:
        body, ctype = b"{}\n" * n, "application/x-ndjson"
    else:
        body, ctype = b'{"messages": [' + b"{}," * (n - 1) + b"{}]}", "application/json"
    before = node.log_state()
    r = await node.http.post(
        "/v1/topics/shape/messages", content=body, headers={"content-type": ctype}
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "more than 100 messages" in r.json()["error"]["message"]
    many_keys = {"messages": [{"body": "x", "properties": {f"p{i}": "v" for i in range(300)}}]}
    r = await node.http.post("/v1/topics/shape/messages", json=many_keys)
    assert r.status_code == 413 and "strings" in r.json()["error"]["message"], r.text
    assert node.log_state() == before
