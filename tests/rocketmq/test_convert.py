"""The gRPC front's pure parts: RocketMQ messages checked and mapped onto ours
(``api/rocketmq/convert.py``), stored ones rendered (``consume.ProtoMessages``), the
Settings replies (``settings_reply``), the node's ``--grpc`` options."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from api.rocketmq.auth import AccessKeys
from api.rocketmq.codes import broker_error_code
from api.rocketmq.consume import ConsumeRefusedError, ProtoMessages, tags_of
from api.rocketmq.convert import (
    SHARDING_KEY_PROPERTY,
    SendRefusedError,
    to_send_batch,
)
from api.rocketmq.protocol import definition_pb2 as pb
from api.rocketmq.service import settings_reply
from api.rocketmq.settings import GrpcSettings, parse_grpc_peers
from broker import errors
from broker.message import decode_head, encode_message
from broker.pop.state import PopConfig, RetryPolicy
from broker.properties import encode_properties
from broker.settings import BrokerSettings, Limits
from ledgermq.node import (
    HttpSettings,
    add_broker_options,
    exposure_warnings,
    settings_from_args,
    start_rocketmq_front,
)

NOW_MS = 1_700_000_000_000
LIMITS = Limits(max_body_bytes=1024, max_delay_ms=60_000)


def message(**sp: object) -> pb.Message:
    body = sp.pop("body", b"hello")
    topic = sp.pop("topic", "T")
    props = sp.pop("props", {})
    system = {"message_id": "01ABC", "message_type": pb.NORMAL, **sp}
    return pb.Message(
        topic=pb.Resource(name=str(topic)),
        body=body,  # type: ignore[arg-type]
        user_properties=props,  # type: ignore[arg-type]
        system_properties=pb.SystemProperties(**system),  # type: ignore[arg-type]
    )


def refused(*messages: pb.Message) -> int:
    with pytest.raises(SendRefusedError) as e:
        to_send_batch(messages, LIMITS, NOW_MS)
    return e.value.code


def test_a_normal_message_keeps_the_clients_id_tag_keys_and_properties() -> None:
    m = message(tag="TagA", keys=["k1", "k2"], props={"a": "b"})
    batch = to_send_batch([m], LIMITS, NOW_MS)
    assert batch.topic == "T" and not batch.delayed
    (nm,) = batch.messages
    assert nm.uniq_key == "01ABC" and nm.tags == "TagA" and list(nm.keys) == ["k1", "k2"]
    assert dict(nm.properties) == {"a": "b"} and nm.sharding_key is None
    assert nm.deliver_at_ms is None and nm.queue_id is None  # the server picks the queue


def test_fifo_maps_the_message_group_to_the_sharding_key() -> None:
    (nm,) = to_send_batch(
        [message(message_type=pb.FIFO, message_group="g1")], LIMITS, NOW_MS
    ).messages
    assert nm.sharding_key == "g1" and nm.properties[SHARDING_KEY_PROPERTY] == "g1"


def test_delay_maps_the_delivery_timestamp_to_deliver_at_ms() -> None:
    at = Timestamp(seconds=NOW_MS // 1000 + 10, nanos=5_000_000)
    batch = to_send_batch([message(message_type=pb.DELAY, delivery_timestamp=at)], LIMITS, NOW_MS)
    assert batch.delayed and batch.messages[0].deliver_at_ms == NOW_MS + 10_005


def test_a_transactional_message_is_marked_as_rocketmq_marks_it() -> None:
    batch = to_send_batch([message(message_type=pb.TRANSACTION)], LIMITS, NOW_MS)
    assert batch.transactional and not batch.delayed and batch.message_id == "01ABC"
    (nm,) = batch.messages
    assert dict(nm.properties) == {"TRAN_MSG": "true"} and nm.uniq_key == "01ABC"
    assert not to_send_batch([message()], LIMITS, NOW_MS).transactional


def test_bad_input_gets_the_protocols_codes() -> None:
    assert refused(message(message_id="")) == pb.ILLEGAL_MESSAGE_ID
    assert refused(message(body=b"")) == pb.MESSAGE_BODY_EMPTY
    assert refused(message(body=b"x" * 1025)) == pb.MESSAGE_BODY_TOO_LARGE
    assert refused(message(tag="a|b")) == pb.ILLEGAL_MESSAGE_TAG
    assert refused(message(keys=["has space"])) == pb.ILLEGAL_MESSAGE_KEY
    assert refused(message(props={"UNIQ_KEY": "x"})) == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert refused(message(props={"bad\x01name": "x"})) == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert refused(message(props={"a": "v\x02"})) == pb.BAD_REQUEST
    assert refused(message(message_type=pb.FIFO)) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert refused(message(message_group="g")) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert refused(message(message_type=pb.DELAY)) == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert refused(message(message_type=pb.LITE)) == pb.UNSUPPORTED
    assert (
        refused(message(message_type=pb.TRANSACTION, message_group="g"))
        == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    )
    assert refused(message(), message(message_type=pb.TRANSACTION)) == pb.BAD_REQUEST
    # an id that could not key the send window (broker/sendwindow.py)
    assert refused(message(message_id=" 01ABC")) == pb.ILLEGAL_MESSAGE_ID
    assert refused(message(message_id="01\u2028ABC")) == pb.ILLEGAL_MESSAGE_ID
    assert refused(message(topic="")) == pb.ILLEGAL_TOPIC
    assert refused(message(), message(topic="U")) == pb.BAD_REQUEST
    assert refused() == pb.BAD_REQUEST


def test_a_delivery_time_in_milliseconds_or_too_far_is_illegal() -> None:
    # The Python client puts the user's value into seconds as it is: milliseconds land
    # ~55,000 years ahead (docs/rocketmq.md).
    ms = Timestamp(seconds=NOW_MS + 10_000)
    assert (
        refused(message(message_type=pb.DELAY, delivery_timestamp=ms)) == pb.ILLEGAL_DELIVERY_TIME
    )
    far = Timestamp(seconds=NOW_MS // 1000 + 61)
    assert (
        refused(message(message_type=pb.DELAY, delivery_timestamp=far)) == pb.ILLEGAL_DELIVERY_TIME
    )


def test_producer_settings_carry_the_body_limit_and_an_exponential_backoff() -> None:
    client = pb.Settings(
        client_type=pb.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name="T")], max_body_size=128 << 20),
        metric=pb.Metric(on=True),
    )
    reply = settings_reply(client, 4 << 20)
    assert reply is not None
    assert reply.publishing.max_body_size == 4 << 20 and reply.publishing.validate_message_type
    assert [t.name for t in reply.publishing.topics] == ["T"]  # the client's, echoed
    assert reply.backoff_policy.max_attempts == 3
    assert reply.backoff_policy.HasField("exponential_backoff")  # Node crashes without
    assert not reply.metric.on


def test_consumer_settings_carry_what_push_and_simple_consumers_read() -> None:
    for t in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
        reply = settings_reply(pb.Settings(client_type=t, subscription=pb.Subscription()), 1)
        assert reply is not None
        sub = reply.subscription
        assert sub.HasField("fifo") and sub.receive_batch_size == 32
        assert sub.long_polling_timeout.seconds == 20
        assert reply.backoff_policy.max_attempts == 17
        assert len(reply.backoff_policy.customized_backoff.next) == 18
    assert settings_reply(pb.Settings(client_type=pb.PULL_CONSUMER), 1) is None


def test_broker_errors_map_to_status_codes() -> None:
    assert broker_error_code(errors.TopicNotFoundError("x")) == pb.TOPIC_NOT_FOUND
    assert broker_error_code(errors.PayloadTooLargeError("x")) == pb.PAYLOAD_TOO_LARGE
    assert broker_error_code(errors.BusyError("x")) == pb.TOO_MANY_REQUESTS
    assert broker_error_code(errors.NoMasterError("x")) == pb.HA_NOT_AVAILABLE
    assert broker_error_code(errors.DiskFullError("x")) == pb.INTERNAL_SERVER_ERROR


def test_peer_grpc_addresses_parse() -> None:
    assert parse_grpc_peers("n0=h0:1,n1=h1:2") == {"n0": "h0:1", "n1": "h1:2"}
    for bad in ("n0", "n0=h0", "=h:1", "n0=h:x"):
        with pytest.raises(ValueError):
            parse_grpc_peers(bad)


def test_tag_filters_map_to_our_tags_and_sql_is_refused() -> None:
    assert tags_of(pb.FilterExpression(type=pb.TAG, expression="*")) is None
    assert tags_of(pb.FilterExpression(type=pb.TAG, expression="")) is None
    assert tags_of(pb.FilterExpression(type=pb.TAG, expression="a || b")) == "a||b"
    for bad in (
        pb.FilterExpression(type=pb.SQL, expression="a > 1"),
        pb.FilterExpression(type=pb.TAG, expression="a||"),
    ):
        with pytest.raises(ConsumeRefusedError) as e:
            tags_of(bad)
        assert e.value.code == pb.ILLEGAL_FILTER_EXPRESSION


def test_consumer_settings_follow_the_groups_replicated_config() -> None:
    cfg = PopConfig(
        fifo=True, max_delivery_attempts=4, retry=RetryPolicy(policy="exponential", initial_ms=500)
    )
    reply = settings_reply(
        pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription()), 1, cfg
    )
    assert reply is not None and reply.subscription.fifo
    assert reply.backoff_policy.max_attempts == 4
    assert reply.backoff_policy.exponential_backoff.initial.nanos == 500_000_000


def test_a_node_client_gets_a_list_of_delays_as_an_exponential_backoff() -> None:
    """Node's client (1.0.8) reads no customized backoff: without one it dead-letters a
    FIFO message after its first failure. Python's gets the list as it is."""
    cfg = PopConfig(fifo=True, max_delivery_attempts=5, retry=RetryPolicy(delays_ms=(1000, 8000)))

    def policy(language: int, group: PopConfig | None = cfg) -> pb.RetryPolicy:
        client = pb.Settings(
            client_type=pb.PUSH_CONSUMER,
            subscription=pb.Subscription(),
            user_agent=pb.UA(language=language),
        )
        reply = settings_reply(client, 1, group)
        assert reply is not None
        return reply.backoff_policy

    python, node = policy(pb.PYTHON), policy(pb.NODE_JS)
    assert [d.seconds for d in python.customized_backoff.next] == [1, 8]
    assert node.max_attempts == python.max_attempts == 5
    exp = node.exponential_backoff
    assert (exp.initial.seconds, exp.max.seconds, exp.multiplier) == (1, 8, 8.0)
    default = policy(pb.NODE_JS, None).exponential_backoff  # RocketMQ's 1 s ... 2 h
    assert (default.initial.seconds, default.max.seconds) == (1, 7200)
    assert 1 < default.multiplier < 2


def test_a_stored_message_renders_as_both_clients_decode_it() -> None:
    raw = encode_message(
        topic="T",
        body=b"hello",
        properties=encode_properties(
            {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "01AB", "__SHARDINGKEY": "g", "u": "v"}
        ),
        born_timestamp=NOW_MS,
        store_timestamp=NOW_MS + 1,
        store_host=("127.0.0.1", 1),
    )
    h = decode_head(raw)
    body = memoryview(raw)[h.body_at : h.body_at + h.body_len]
    props = memoryview(raw)[h.props_at : h.props_at + h.props_len]
    m = ProtoMessages("g0", "127.0.0.1:10080")(h, 7, 1234, body, props)
    sp = m.system_properties
    assert m.body == b"hello" and dict(m.user_properties) == {"u": "v"}
    assert sp.message_id == "01AB" and sp.tag == "A" and list(sp.keys) == ["k1", "k2"]
    assert sp.body_encoding == pb.IDENTITY and sp.body_digest.type == pb.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert sp.message_type == pb.FIFO and sp.message_group == "g" and sp.queue_offset == 7


def _node(*args: str) -> tuple[BrokerSettings, HttpSettings]:
    p = argparse.ArgumentParser()
    add_broker_options(p)
    return settings_from_args(p.parse_args(list(args)))


def test_grpc_listens_next_to_http_unless_told() -> None:
    settings, http = _node("--http", "127.0.0.1:8081", "--peer-urls", "n1=http://h1:8082")
    assert http.grpc is not None and (http.grpc.host, http.grpc.port) == ("127.0.0.1", 10081)
    assert not http.grpc.required  # a default that is taken: the node goes on without
    assert settings.peer_grpc == {"n0": "127.0.0.1:10081", "n1": "h1:10082"}
    _, http = _node("--grpc", "127.0.0.1:7000")
    assert http.grpc is not None and http.grpc.port == 7000 and http.grpc.required
    assert _node("--grpc", "off")[1].grpc is None
    settings, _ = _node("--peer-grpc", "n1=h1:1", "--peer-urls", "n1=http://h1:8082")
    assert settings.peer_grpc["n1"] == "h1:1"
    settings, _ = _node("--http", "0.0.0.0:8080", "--advertised-url", "http://me:8080")
    assert settings.peer_grpc["n0"] == "me:10080"  # a wildcard listener: the advertised host


def test_a_public_grpc_port_without_tokens_is_warned_about() -> None:
    (warning,) = exposure_warnings(HttpSettings(grpc=GrpcSettings(host="0.0.0.0")))
    assert "gRPC" in warning
    assert exposure_warnings(HttpSettings(grpc=GrpcSettings())) == []
    # with tokens every call must be signed; without access keys every one is refused
    (warning,) = exposure_warnings(HttpSettings(auth_token="t", grpc=GrpcSettings()))
    assert "--access-keys-file" in warning
    keys = AccessKeys([("ak", "sk", ["admin"])])
    assert exposure_warnings(HttpSettings(access_keys=keys, grpc=GrpcSettings("0.0.0.0"))) == []


def test_access_keys_and_the_date_window_are_options(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("app sk produce:orders\n")
    _, http = _node("--access-keys-file", str(f), "--grpc-auth-max-skew-s", "60")
    assert http.grpc_auth and http.access_keys is not None and len(http.access_keys) == 1
    assert http.grpc is not None and http.grpc.auth_max_skew_s == 60
    _, http = _node()
    assert not http.grpc_auth and http.grpc is not None and http.grpc.auth_max_skew_s == 900


def test_a_node_without_the_generated_modules_starts_without_grpc_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "api.rocketmq.server", None)  # import fails
    broker: Any = None  # not reached
    with caplog.at_level(logging.WARNING, logger="ledgermq.node"):
        front = asyncio.run(start_rocketmq_front(BrokerSettings(), GrpcSettings(), broker))
    assert front is None
    assert "tools/protos.py" in caplog.text and "no gRPC front" in caplog.text
