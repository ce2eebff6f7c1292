"""The produce body's fast read (``plain_produce``): for every body it takes, the same
messages as ``ProduceRequest``'s validation; every other body goes to the model."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api import models
from api.routes.messages import ParsedProduce, parse_produce, plain_produce, to_broker_message
from broker import errors
from broker.settings import Limits

SHORT = st.text(max_size=20)
MESSAGE = st.fixed_dictionaries(
    {"body": st.text(max_size=50)},
    optional={
        "encoding": st.just("utf-8"),
        "key": st.none() | SHORT,
        "keys": st.none() | st.lists(SHORT, max_size=3),
        "tags": st.none() | SHORT,
        "properties": st.none() | st.dictionaries(SHORT, SHORT, max_size=3),
        "queue_id": st.none() | st.integers(0, 65_535),
        "sharding_key": st.none() | SHORT,
        "born_timestamp": st.none() | st.integers(0, 2**62),
    },
)
REQUEST = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, min_size=1, max_size=5)},
    optional={"producer_id": st.none() | SHORT, "sequence": st.none() | st.integers(0, 2**62)},
)


def _both(doc: dict[str, Any]) -> tuple[ParsedProduce | None, ParsedProduce]:
    raw = orjson.dumps(doc)
    return plain_produce(raw), ParsedProduce.of(models.ProduceRequest.model_validate_json(raw))


@settings(max_examples=300)
@given(doc=REQUEST)
def test_a_plain_body_reads_as_the_model_reads_it(doc: dict[str, Any]) -> None:
    plain, model = _both(doc)
    assert plain is not None
    assert (plain.producer_id, plain.sequence) == (model.producer_id, model.sequence)
    assert [to_broker_message(i, m) for i, m in enumerate(plain.messages)] == [
        to_broker_message(i, m) for i, m in enumerate(model.messages)
    ]


@pytest.mark.parametrize(
    "message",
    [
        {"body": "x", "queue_id": "3"},  # the model coerces it
        {"body": "x", "queue_id": True},
        {"body": "x", "born_timestamp": 1.0},
        {"body": "x", "encoding": None},
        {"body": "x", "tags": "t" * 1025},
        {"body": "x", "keys": ["k", 1]},
        {"body": "x", "properties": {"a": 1}},
        {"body": "x", "extra": 1},
        {"body": 1},
        {"keys": []},
    ],
)
def test_anything_else_goes_to_the_model_with_its_answer(message: dict[str, Any]) -> None:
    raw = orjson.dumps({"messages": [message]})
    assert plain_produce(raw) is None
    try:
        want = ParsedProduce.of(models.ProduceRequest.model_validate_json(raw))
    except ValidationError:
        with pytest.raises(errors.InvalidArgumentError):
            parse_produce(raw, "application/json", {}, Limits())
    else:
        assert parse_produce(raw, "application/json", {}, Limits()) == want


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'{"messages": []}', b'{"messages": [{"body": "x"}], "sequence": -1}', b"{"],
)
def test_bodies_the_model_refuses_are_not_plain(raw: bytes) -> None:
    assert plain_produce(raw) is None
    with pytest.raises(errors.InvalidArgumentError):
        parse_produce(raw, "application/json", {}, Limits())
