"""Fuzz targets of ``api``: every request body. ``api_models`` gives the pydantic models
of ``api/models.py`` bytes straight; ``http_bodies`` sends a body (JSON, or NDJSON for
produce) and path parameters to each of the endpoints that take one, through the
real app (``create_app``), to a broker that runs every check and encodes every record
but appends nothing: any answer but a 500 is fine, a 500 is an exception the API did not
turn into its error body. And two answers, as the Python client decodes them
(``ledgermq.client.fetch``): ``record_page``, a pull's record page, and
``record_answers``, a group pull's or a POP receive's pages of many queues."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import orjson
from pydantic import BaseModel, ValidationError

from api import fetch, group_records, models
from api.app import create_app
from api.json_shape import check_json_shape, ndjson_lines
from api.routes.common import NDJSON
from api.routes.messages import to_broker_message
from broker import errors
from broker.batch import encode_batch_record, set_queue_base
from broker.broker import Broker
from broker.commitlog import OutgoingMessage, PutResult
from broker.dispatch.appliers import state_appliers
from broker.gate import BrokerRole
from broker.message import encode_message, set_physical_offset
from broker.metadata import POP_OP_PREFIX, TIMER_OP_PREFIX, TX_OP_PREFIX, TopicMeta
from broker.pages import RawPage
from broker.pop.service import Received
from broker.pop.state import PopState
from broker.properties import encode_properties, inner_properties, message_properties
from broker.settings import BrokerSettings, Limits
from broker.status import BrokerStatus
from broker.timers.state import TimerState
from broker.transactions.state import TransactionState
from consumequeue.queue import UNIT
from dledger.store import FileStore
from ledgermq.client.fetch import RecordPageError, decode_group, decode_page, decode_received

from ..asgi import http_scope
from .reader import Reader, Writer
from .registry import _scratch_root, target

REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    models.ProduceRequest,
    models.ProduceMessage,
    models.TopicCreate,
    models.CommitOffsets,
    models.ResetOffsets,
    models.GroupPull,
    models.LeadershipRequest,
    models.GroupConfig,
    models.Receive,
    models.Ack,
    models.Nack,
    models.ChangeInvisible,
    models.DeadLetter,
    models.Redrive,
    models.TransactionSpec,
    models.EndTransaction,
)

_PRODUCE = orjson.dumps(
    {
        "messages": [
            {"body": "hello", "key": "k", "tags": "TagA", "properties": {"a": "b"}},
            {"body": "aGk=", "encoding": "base64", "queue_id": 1, "keys": ["x", "y"]},
        ],
        "producer_id": "p-1",
        "sequence": 3,
    }
)
_BODIES = (
    _PRODUCE,
    b'{"body": "a"}\n{"body": "b", "sharding_key": "s"}\n',
    b'{"name": "orders", "queues": 4}',
    b'{"topic": "t", "offsets": {"0": 5, "3": 1}}',
    b'{"topic": "t", "to": "earliest"}',
    b'{"topic": "t", "max_messages": 5, "queue_ids": [0, 1]}',
    b'{"to": "n0"}',
    b'{"mode": "pop", "fifo": true, "max_delivery_attempts": 3, "start": "earliest",'
    b' "retry": {"policy": "exponential", "initial_ms": 10, "multiplier": 2, "max_ms": 100}}',
    b'{"topic": "t", "max_messages": 4, "invisible_ms": 1000, "tags": "A||B", "attempt_id": "x"}',
    b'{"topic": "t", "receipt_handles": ["v1:0:0:1", "v1:1:2:3"]}',
    b'{"topic": "t", "receipt_handles": ["v1:0:0:1"], "delay_ms": 5}',
    b'{"topic": "t", "receipt_handle": "v1:0:0:1", "invisible_ms": 500}',
    b'{"topic": "t", "receipt_handles": ["v1:0:0:1"]}',
    b'{"max_messages": 3}',
    b'{"action": "commit"}',
    b'{"messages": [{"body": "a"}], "transaction": {"producer_group": "pg"}}',
    b'{"messages": [{"body": "a", "delay_ms": 5}, {"body": "b", "deliver_at_ms": 1}]}',
)


def _model_seeds() -> list[bytes]:
    return [Writer().uint(i, 1).raw(body).done() for i, body in enumerate(_BODIES)]


@target("api_models", max_len=2048, seeds=_model_seeds)
def api_models(data: bytes) -> None:
    """A request body for one of the pydantic request models: a model or
    ``ValidationError``; a produce body's messages become broker messages or
    ``InvalidArgumentError`` (bad base64)."""
    r = Reader(data)
    model = REQUEST_MODELS[r.uint(1) % len(REQUEST_MODELS)]
    try:
        parsed = model.model_validate_json(r.rest())
    except ValidationError:
        return
    messages: Sequence[models.ProduceMessage] = ()
    if isinstance(parsed, models.ProduceRequest):
        messages = parsed.messages
    elif isinstance(parsed, models.ProduceMessage):
        messages = [parsed]
    for i, m in enumerate(messages):
        with contextlib.suppress(errors.InvalidArgumentError):
            to_broker_message(i, vars(m))


def true_shape(doc: Any, in_array: bool = False) -> tuple[int, int]:
    """(containers that are array elements, strings and scalars) of a parsed document,
    a member's name being a string: what ``check_json_shape`` counts."""
    if isinstance(doc, dict):
        items, values = int(in_array), len(doc)
        for v in doc.values():
            i, n = true_shape(v)
            items, values = items + i, values + n
        return items, values
    if isinstance(doc, list):
        items, values = int(in_array), 0
        for v in doc:
            i, n = true_shape(v, in_array=True)
            items, values = items + i, values + n
        return items, values
    return 0, 1


@target("json_shape", max_len=4096, seeds=lambda: list(_BODIES))
def json_shape(data: bytes) -> None:
    """``check_json_shape`` and ``ndjson_lines`` on any bytes: a count or a 413; on
    valid JSON the count is the parsed document's, exactly."""
    with contextlib.suppress(errors.PayloadTooLargeError):
        ndjson_lines(data, 8)
    counted = check_json_shape(data, 1 << 20, 1 << 20)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    assert counted == true_shape(doc)[0], (data, counted)
    items, values = true_shape(doc)
    if values > max(1, items):
        with contextlib.suppress(errors.PayloadTooLargeError):
            check_json_shape(data, max(1, items), 1)
            raise AssertionError(f"{values} values passed a limit of {max(1, items)}")


# ---- through the app ------------------------------------------------------------------------


class _NoDispatch:
    """The dispatcher, as the request paths see it: nothing to wait for."""

    state: list[Any]

    installing = False
    stall = None
    dispatched_index = -1

    async def wait_dispatched(self, index: int, timeout_s: float) -> bool:
        return True

    async def wait_queue(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        return False


class _EmptyLog:
    """The log, as the request paths see it: empty, nothing in flight."""

    ledger_end_index = -1
    committed_index = -1
    ledger_begin_pos = committed_pos = 0  # (no record to read at any address)


class _FuzzBroker(Broker):
    """A broker that checks and encodes like the real one but appends nothing: it is the
    master of a log that takes every write at once. Its collaborators are the real
    ones, built over an empty log and a dispatcher with nothing to wait for."""

    def __init__(self, settings: BrokerSettings) -> None:
        super().__init__(settings)
        log = cast(FileStore, _EmptyLog())
        self.server.store = log
        self._assemble(log)
        self.gate.role = BrokerRole.MASTER  # no Raft here: the role the handler would set
        self.commitlog.put_messages = self._put_messages  # type: ignore[method-assign]
        self.metalog.append = self._append_meta  # type: ignore[method-assign]
        self.leadership.transfer = self._transfer  # type: ignore[method-assign]
        self.reset()

    def _dispatcher_over(self, store: Any) -> Any:
        d = _NoDispatch()
        d.state = state_appliers(self.meta)  # the POP routes read their applier's outcomes
        return d

    def reset(self) -> None:
        self.meta.topics = {"t": TopicMeta("t", 4, -1)}
        self.meta.offsets = {}
        self.meta.sessions.clear()
        self.meta.pop = PopState()
        self.meta.timers = TimerState()
        self.meta.transactions = TransactionState()

    async def _put_messages(
        self, topic: TopicMeta, batch: Sequence[OutgoingMessage]
    ) -> list[PutResult]:
        """The log: takes the encoded records (the broker's own code made them) at once."""
        return [PutResult(0, i, 48 + 100 * i, i) for i in range(len(batch))]

    async def _append_meta(self, op: dict[str, Any]) -> int:
        index = self.meta.applied_index + 1
        self.meta.apply_op(index, orjson.dumps(op))
        kind, parsed = op["op"], orjson.loads(orjson.dumps(op))
        # (the appliers' outcomes, which their routes answer from)
        if kind.startswith(POP_OP_PREFIX):
            self.pop.applier.apply_operation(index, 0, kind, parsed)
        elif kind.startswith(TIMER_OP_PREFIX):
            self.timers.applier.apply_operation(index, kind, parsed)
        elif kind.startswith(TX_OP_PREFIX):
            self.transactions.applier.apply_operation(index, 0, kind, parsed)
        return self.meta.applied_index

    async def _transfer(self, to: str, timeout_s: float = 5.0) -> None:
        if to not in self.settings.peer_map:
            raise errors.UnknownNodeError(f"{to} is not a member")

    def status(self) -> BrokerStatus:
        return BrokerStatus(
            group=self.settings.group,
            node_id=self.settings.node_id,
            raft_role="LEADER",
            broker_role="MASTER",
            term=1,
            leader_id=self.settings.node_id,
            leader_url=None,
            ledger_begin_index=0,
            ledger_end_index=-1,
            committed_index=-1,
            dispatched_index=-1,
            snapshot_index=-1,
            snapshots_installed=0,
            peers={},
            stats={},
            dispatch_stall=None,
            failed=None,
            diverged=None,
            refused={},
        )


_LIMITS = Limits(
    max_body_bytes=4096,
    max_properties_bytes=1024,
    max_messages_per_request=16,
    max_request_bytes=16 * 1024,
    max_pull_messages=16,
    max_wait_ms=0,
)
_APP: Any = None
_BROKER: _FuzzBroker | None = None
_LOOP: asyncio.AbstractEventLoop | None = None


def _app() -> tuple[Any, _FuzzBroker, asyncio.AbstractEventLoop]:
    global _APP, _BROKER, _LOOP  # noqa: PLW0603  # one app per fuzzing process
    if _APP is None:
        data_dir: Path = _scratch_root() / "node"
        settings = BrokerSettings(data_dir=data_dir, limits=_LIMITS, disk_reserve_bytes=0)
        _BROKER = _FuzzBroker(settings)
        _APP = create_app(settings, _BROKER)
        _LOOP = asyncio.new_event_loop()
    assert _BROKER is not None and _LOOP is not None
    return _APP, _BROKER, _LOOP


# (method, path with {name} for a fuzzed name, content type)
_ROUTES = (
    ("POST", "/v1/topics/{name}/messages", "application/json"),
    ("POST", "/v1/topics/{name}/messages", NDJSON),
    ("POST", "/v1/topics", "application/json"),
    ("PUT", "/v1/groups/{name}/offsets", "application/json"),
    ("POST", "/v1/groups/{name}/offsets/reset", "application/json"),
    ("POST", "/v1/groups/{name}/pull", "application/json"),
    ("POST", "/v1/cluster/leadership", "application/json"),
    ("PUT", "/v1/groups/{name}", "application/json"),
    ("POST", "/v1/groups/{name}/receive", "application/json"),
    ("POST", "/v1/groups/{name}/ack", "application/json"),
    ("POST", "/v1/groups/{name}/nack", "application/json"),
    ("POST", "/v1/groups/{name}/invisible", "application/json"),
    ("POST", "/v1/groups/{name}/dlq", "application/json"),
    ("POST", "/v1/groups/{name}/dlq/redrive", "application/json"),
    ("POST", "/v1/transactions/{name}", "application/json"),
    ("POST", "/v1/topics/{name}/messages", "application/json"),
    ("POST", "/v1/topics/{name}/messages", "application/json"),
)


async def _call(app: Any, method: str, path: str, query: bytes, ctype: str, body: bytes) -> int:
    """One request through the ASGI app; the status it answered."""
    headers = [(b"content-type", ctype.encode())]
    scope = http_scope(method, path, query=query, headers=headers, host=b"fuzz")
    sent = False
    answer: dict[str, Any] = {"status": 0, "body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    status: int = answer["status"]
    if status >= 500:
        code = orjson.loads(answer["body"])["error"]["code"]
        assert code != "INTERNAL", (method, path, query, body, answer["body"])
    return status


def _http_seeds() -> list[bytes]:
    out = []
    for i, body in enumerate(_BODIES):
        name = b"t" if i != 2 else b"g"
        query = b"producer_id=p-1&sequence=4" if i == 1 else b""
        out.append(Writer().uint(i, 1).chunk(name).chunk(query).raw(body).done())
    return out


@target("http_bodies", max_len=4096, seeds=_http_seeds)
def http_bodies(data: bytes) -> None:
    """A body and path parameters for each endpoint that takes a body, through the real
    app: any typed answer, never a 500 (an unhandled exception)."""
    r = Reader(data)
    method, path, ctype = _ROUTES[r.uint(1) % len(_ROUTES)]
    name = quote(r.chunk(200).decode("latin-1"), safe="")
    query = r.chunk(200)
    body = r.rest()
    app, broker, loop = _app()
    broker.reset()
    status = loop.run_until_complete(_call(app, method, path.format(name=name), query, ctype, body))
    assert status > 0


def record_page_of(records: list[tuple[bytearray, list[int]]]) -> bytes:
    """A record page (``api.fetch``) of records laid back to back from commitlog offset
    0, each with the queue offsets of its messages, as a node answers it."""
    log = bytearray()
    units, offsets = b"", []
    for record, queue_offsets in records:
        set_physical_offset(record, len(log))
        units += b"".join(UNIT.pack(len(log), len(record), 0) for _ in queue_offsets)
        offsets += queue_offsets
        log += record

    @contextlib.contextmanager
    def view(start: int, size: int) -> Any:
        with memoryview(log) as v:
            yield v[start : start + size]

    page = RawPage(units, view, segment_bytes=1 << 20, queue_offsets=offsets)
    content, _, _ = fetch.encode_page(
        page, status="FOUND", next_offset=9, min_offset=0, max_offset=9, prefix="6730"
    )
    return bytes(content)


def _page_seeds() -> list[bytes]:
    plain = encode_message(
        topic="t",
        body=b"\x00\xffbody",
        properties=message_properties({"p": "1"}, tags="T", keys=["k1", "k2"], uniq_key="U"),
        queue_id=1,
        queue_offset=0,
        born_timestamp=1,
        store_timestamp=2,
    )
    inner = [
        (b"a", encode_properties(inner_properties({}, tags="A", keys=["x"]))),
        (b"", encode_properties(inner_properties({"q": "2"}, tags=None, keys=[]))),
        (b"ccc", encode_properties(inner_properties({}, tags="B", keys=[]))),
    ]
    batch = encode_batch_record("t", inner, session=None, timestamp=3, store_host=("127.0.0.1", 1))
    set_queue_base(batch, 1)
    whole = record_page_of([(plain, [0]), (batch, [1, 2, 3])])
    empty = fetch.HEADER.pack(fetch.MAGIC, fetch.VERSION, 1, 0, 9, 0, 9, 0, 0)
    return [whole, record_page_of([(batch, [2, 3])]), empty]


@target("record_page", max_len=4096, seeds=_page_seeds)
def record_page(data: bytes) -> None:
    """A pull answered as a record page (``decode_page``, the client's): a pull result
    or ``RecordPageError``; then every field of every message reads, or raises
    ``RecordPageError`` (properties that are not UTF-8 pairs), never anything else; TAGS
    and KEYS read alone (found in the block) are what the whole block's parse says."""
    try:
        page = decode_page(data)
    except RecordPageError:
        return
    r = page.result
    assert r.status in fetch.STATUSES and page.records_bytes <= len(data)
    for m in r.messages:
        alone: list[Any] = []
        for name in ("tags", "keys", "key", "body", "msg_id", "topic", "store_timestamp"):
            try:
                alone.append(getattr(m, name))
            except RecordPageError:
                alone.append(RecordPageError)
        try:
            m.fields()
        except RecordPageError:
            continue
        assert alone[:3] == [m.tags, m.keys, m.key], (alone[:3], m.properties)


def _answer_seeds() -> list[bytes]:
    """A group answer (two queues' pages, one of them empty) and a POP answer (two
    queues, a batch record's messages), each behind the byte that picks the decoder."""
    plain = encode_message(
        topic="t", body=b"\xffp", properties=b"TAGS\x01T\x02", queue_id=1, born_timestamp=1
    )
    inner = [(b"a", encode_properties(inner_properties({}, tags="A", keys=["x"]))), (b"bb", b"")]
    batch = encode_batch_record("t", inner, session=None, timestamp=3, store_host=("127.0.0.1", 1))
    set_queue_base(batch, 4)
    set_physical_offset(batch, 500)
    page = record_page_of([(plain, [0])])
    empty = fetch.HEADER.pack(fetch.MAGIC, fetch.VERSION, 1, 0, 9, 0, 9, 0, 0)
    group = (
        group_records.GROUP_HEADER.pack(group_records.GROUP_MAGIC, 1, 2, 1)
        + group_records.PAGE_FRAME.pack(1, len(page))
        + page
        + group_records.PAGE_FRAME.pack(0, len(empty))
        + empty
    )
    set_physical_offset(plain, 0)
    refs = [(1, 0, 0, 0), (0, 4, 500, 0), (0, 5, 500, 1)]
    received = [Received(r, f"v1:{r[0]}:{r[1]}:9", 2, 77) for r in refs]
    pop = group_records.encode_received(
        received, {0: bytes(plain), 500: bytes(batch)}, prefix="6730"
    )
    return [b"\x00" + group, b"\x01" + pop]


@target("record_answers", max_len=4096, seeds=_answer_seeds)
def record_answers(data: bytes) -> None:
    """A group pull's answer (first byte even) or a POP receive's (odd) in the record
    format, as the client decodes them (``decode_group``, ``decode_received``): pages or
    ``RecordPageError``, never anything else; every page's messages are its queue's, a
    POP message's receipt reads, and every field of every message reads or raises
    ``RecordPageError``."""
    if not data:
        return
    try:
        if data[0] % 2 == 0:
            pages = decode_group(data[1:])
            messages = [m for p in pages for m in p.result.messages]
            assert all(m.queue_id == p.queue_id for p in pages for m in p.result.messages)
        else:
            popped = decode_received(data[1:])
            assert all(isinstance(m.receipt_handle, str) for m in popped)
            assert all(m.delivery_attempt >= 0 for m in popped)
            messages = list(popped)
    except RecordPageError:
        return
    for m in messages:
        try:
            cast(Any, m).fields()
        except RecordPageError:
            continue
