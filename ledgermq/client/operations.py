"""The operations, each written once as a generator over an ``Exchange`` and run by every
driver: ``AdminOps`` (topics, groups, cluster status, queries, pulls) and ``ProducerOps``
(a producer session). Each builds its request and reads its answer; routing and retries
are the exchange's. The consumers' are in ``ledgermq.client.consuming`` and
``ledgermq.client.popping``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import quote

from .errors import LedgerMQError
from .exchange import ARROW_STREAM, Call, Exchange, Gen
from .fetch import MEDIA_TYPE as RECORD_PAGE
from .fetch import decode_page
from .records import MEDIA_TYPE as RECORDS
from .records import record_request
from .types import (
    ArrowPage,
    ClusterStatus,
    GroupDescription,
    GroupOffset,
    Message,
    MessageLike,
    NodeView,
    PullResult,
    QueueInfo,
    ReceivedMessage,
    Redriven,
    SendResult,
    TopicDescription,
    TopicInfo,
    decode_message,
    encode_message,
    parse_cluster,
    parse_group,
)

# The broker's PRODUCER_ID (broker/metadata.py); a test keeps the two equal.
PRODUCER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def api_path(*parts: str | int) -> str:
    """``/v1/topics/a%25b``: names may hold ``%`` and ``|``, so every part is quoted."""
    return "/v1/" + "/".join(quote(str(p), safe="") for p in parts)


def queue_map(d: Mapping[str, Any]) -> dict[int, int]:
    return {int(q): int(o) for q, o in d.items()}


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


class AdminOps:
    """Topic, group, cluster and query operations."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex

    def create_topic(self, name: str, queues: int | None = None) -> Gen[TopicInfo]:
        body: dict[str, Any] = {"name": name}
        if queues is not None:
            body["queues"] = queues
        reply = yield from self.ex.write("POST", "/v1/topics", body)
        d = reply.body
        return TopicInfo(str(d["name"]), int(d["queues"]), created=reply.status == 201)

    def list_topics(self) -> Gen[list[TopicInfo]]:
        d = yield from self.ex.get("/v1/topics")
        return [TopicInfo(str(t["name"]), int(t["queues"])) for t in d["topics"]]

    def describe_topic(self, name: str) -> Gen[TopicDescription]:
        d = yield from self.ex.get(api_path("topics", name))
        queues = [
            QueueInfo(int(q["queue_id"]), int(q["min_offset"]), int(q["max_offset"]))
            for q in d["queues"]
        ]
        return TopicDescription(str(d["name"]), queues)

    def delete_topic(self, name: str) -> Gen[None]:
        yield from self.ex.write("DELETE", api_path("topics", name))

    def cluster(self, url: str | None = None) -> Gen[ClusterStatus]:
        """One node's view: ``url``'s (no retries), or any broker's."""
        reply = yield from self.ex.exchange(Call("GET", "/v1/cluster", url=url))
        return parse_cluster(reply.body)

    def cluster_all(self) -> Gen[list[NodeView]]:
        """Every node: each broker URL, then each ``nodes[].http_url`` they report, asked
        once each. A node that does not answer comes back with ``error`` set."""
        answered: dict[str, NodeView] = {}  # node id → view
        failed: dict[str, str] = {}  # URL → why
        reported: dict[str, str | None] = {}  # node id → http_url, as the nodes say
        todo = list(self.ex.brokers)
        asked: set[str] = set()
        while todo:  # bounded: each URL once, and the membership is finite
            url = todo.pop(0)
            if url in asked:
                continue
            asked.add(url)
            try:
                st = yield from self.cluster(url)
            except LedgerMQError as e:
                failed[url] = str(e)
                continue
            answered.setdefault(st.node_id, NodeView(st.node_id, url, st))
            for n in st.nodes:
                if n.http_url:
                    reported[n.node_id] = n.http_url.rstrip("/")
                    todo.append(n.http_url.rstrip("/"))
                else:
                    reported.setdefault(n.node_id, None)
        views = dict(answered)
        for node_id, node_url in reported.items():
            if node_id not in views:
                why = failed.get(node_url, "did not answer") if node_url else "no HTTP URL known"
                views[node_id] = NodeView(node_id, node_url, None, why)
        claimed = {v.url for v in views.values()}
        strays = [NodeView(None, u, None, e) for u, e in failed.items() if u not in claimed]
        return [views[k] for k in sorted(views)] + strays

    def transfer_leadership(self, to: str) -> Gen[dict[str, Any]]:
        reply = yield from self.ex.write("POST", "/v1/cluster/leadership", {"to": to})
        self.ex.master = None  # it moved: rediscover
        return dict(reply.body or {})

    # ---- membership (docs/operations.md "Changing the members") ----------------------------

    def members(self) -> Gen[dict[str, Any]]:
        """The group's configuration as the master has it: ``members`` (node id, role
        ``voter`` or ``learner``, addresses, ``match_index``), ``leader_id``. Asked of
        the master: a removed member is told nothing more, so its own view is stale."""
        reply = yield from self.ex.exchange(Call("GET", "/v1/cluster/members", write=True))
        return dict(reply.body or {})

    def add_member(
        self, node_id: str, raft_addr: str, http_url: str | None = None, timeout_s: float = 30.0
    ) -> Gen[int]:
        """Add a learner (it receives the log, does not vote); the configuration's
        committed entry."""
        body = {"node_id": node_id, "raft_addr": raft_addr, "http_url": http_url}
        return (yield from self._member_change("POST", "/v1/cluster/members", body, timeout_s))

    def promote_member(self, node_id: str, timeout_s: float = 30.0) -> Gen[int]:
        """Make a learner a voter; the master waits (up to ``timeout_s``) for it to
        catch up first."""
        path = api_path("cluster", "members", node_id, "promote")
        return (yield from self._member_change("POST", path, None, timeout_s))

    def remove_member(self, node_id: str, timeout_s: float = 30.0) -> Gen[int]:
        """Remove a member, a dead one too; the master itself hands leadership over
        first (the call follows it to the new master)."""
        path = api_path("cluster", "members", node_id)
        return (yield from self._member_change("DELETE", path, None, timeout_s))

    def _member_change(self, method: str, path: str, body: Any, timeout_s: float) -> Gen[int]:
        call = Call(method, path, {"timeout_s": f"{timeout_s:g}"}, body=body, write=True)
        reply = yield from self.ex.exchange(call)
        self.ex.master = None  # a removed master moved leadership: rediscover
        return int((reply.body or {})["config_index"])

    def groups(self) -> Gen[list[str]]:
        d = yield from self.ex.get("/v1/groups")
        return [str(g) for g in d["groups"]]

    def group_offsets(self, group: str, topic: str | None = None) -> Gen[list[GroupOffset]]:
        params = {"topic": topic} if topic is not None else None
        d = yield from self.ex.get(api_path("groups", group, "offsets"), params)
        return [
            GroupOffset(
                str(o["topic"]),
                int(o["queue_id"]),
                _int_or_none(o.get("committed_offset")),
                int(o["max_offset"]),
                int(o["lag"]),
                _int_or_none(o.get("next_offset")),
                _int_or_none(o.get("in_flight")),
            )
            for o in d["offsets"]
        ]

    def configure_group(
        self,
        group: str,
        *,
        fifo: bool | None = None,
        max_delivery_attempts: int | None = None,
        retry: Mapping[str, Any] | None = None,
        start: Literal["earliest", "latest"] | int | None = None,
    ) -> Gen[GroupDescription]:
        """Create the POP group ``group`` or set its whole configuration: what is not
        given takes the broker's default (not the group's current value). ``retry``:
        ``{"policy": "list", "delays_ms": [...]}`` or ``{"policy": "exponential",
        "initial_ms", "multiplier", "max_ms"}``. ``GroupModeConflictError`` for a group
        that commits offsets."""
        given = {
            "fifo": fifo,
            "max_delivery_attempts": max_delivery_attempts,
            "retry": None if retry is None else dict(retry),
            "start": start,
        }
        body = {"mode": "pop", **{k: v for k, v in given.items() if v is not None}}
        reply = yield from self.ex.write("PUT", api_path("groups", group), body)
        return parse_group(reply.body)

    def describe_group(self, group: str) -> Gen[GroupDescription]:
        """A group's mode and, for a POP group, its configuration and what is in flight."""
        d = yield from self.ex.get(api_path("groups", group))
        return parse_group(d)

    def redrive_dead_letters(self, group: str, max_messages: int | None = None) -> Gen[Redriven]:
        """Produce up to ``max_messages`` (default: the broker's most per pull) of a POP
        group's dead letters back to the topics they came from, from the first not
        produced back yet (the broker keeps where it got to: exactly once, also across
        failovers). Call until ``redriven`` and ``skipped`` are both 0 to move them all."""
        body = {} if max_messages is None else {"max_messages": max_messages}
        reply = yield from self.ex.write("POST", api_path("groups", group, "dlq", "redrive"), body)
        d = reply.body
        return Redriven(int(d["redriven"]), int(d["skipped"]), int(d["next_offset"]))

    def pending_transactions(self, producer_group: str | None = None) -> Gen[list[dict[str, Any]]]:
        """The unresolved transactions (of a producer group), oldest first: each with its
        ``transaction_id``, ``topic``, ``producer_group``, ``messages``, ``check_count``,
        ``born`` and ``next_check``."""
        params = {} if producer_group is None else {"producer_group": producer_group}
        d = yield from self.ex.get(api_path("transactions"), params)
        return list(d["transactions"])

    def end_transaction(
        self, transaction_id: str, action: Literal["commit", "rollback"]
    ) -> Gen[str]:
        """Resolve a transaction by hand; its state."""
        path = api_path("transactions", transaction_id)
        reply = yield from self.ex.write("POST", path, {"action": action})
        return str(reply.body["state"])

    def commit_offsets(
        self, group: str, topic: str, offsets: Mapping[int, int]
    ) -> Gen[dict[int, int]]:
        """Commit a group's offsets; where each of those queues stands after, as the
        broker answered (an offset behind the committed one leaves it there)."""
        body = {"topic": topic, "offsets": {str(q): o for q, o in sorted(offsets.items())}}
        reply = yield from self.ex.write("PUT", api_path("groups", group, "offsets"), body)
        return queue_map((reply.body or {}).get("offsets") or {})

    def reset_offsets(
        self, group: str, topic: str, to: Literal["earliest", "latest"] | int
    ) -> Gen[dict[int, int]]:
        """Move a group to ``earliest``, ``latest`` or a store timestamp (ms)."""
        body = {"topic": topic, "to": to}
        reply = yield from self.ex.write(
            "POST", api_path("groups", group, "offsets", "reset"), body
        )
        return queue_map((reply.body or {}).get("offsets") or {})

    def get_message(self, msg_id: str) -> Gen[ReceivedMessage]:
        d = yield from self.ex.get(api_path("messages", msg_id))
        return decode_message(d)

    def query_by_key(
        self, topic: str, key: str, max_results: int = 64
    ) -> Gen[list[ReceivedMessage]]:
        d = yield from self.ex.get(
            api_path("topics", topic, "messages"), {"key": key, "max": max_results}
        )
        return [decode_message(m) for m in d["messages"]]

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> Gen[int]:
        path = api_path("topics", topic, "queues", queue_id, "offset")
        d = yield from self.ex.get(path, {"timestamp": timestamp_ms})
        return int(d["offset"])

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        tags: str | None = None,
    ) -> Gen[PullResult]:
        """One queue from ``offset`` (RocketMQ's pull: ``status`` says what was found)."""
        params: dict[str, str | int] = {
            "offset": offset,
            "max_messages": max_messages,
            "wait_ms": wait_ms,
        }
        if tags is not None:
            params["tags"] = tags
        path = api_path("topics", topic, "queues", queue_id, "messages")
        if self.ex.settings.record_pull:
            call = Call("GET", path, params, wait_ms=wait_ms, accept=RECORD_PAGE)
            reply = yield from self.ex.exchange(call)
            if reply.headers.get("content-type") == RECORD_PAGE:
                return decode_page(reply.content).result
            if reply.body is None:
                raise LedgerMQError(
                    "BAD_RECORD_PAGE", f"{path}: answered {reply.headers.get('content-type')}"
                )
            # (a node that does not make record pages answers JSON: read it)
        else:
            reply = yield from self.ex.exchange(Call("GET", path, params, wait_ms=wait_ms))
        d = reply.body
        return PullResult(
            status=str(d["status"]),
            messages=[decode_message(m) for m in d["messages"]],
            next_offset=int(d["next_offset"]),
            min_offset=int(d["min_offset"]),
            max_offset=int(d["max_offset"]),
        )

    def pull_arrow(
        self, topic: str, queue_id: int, offset: int, *, max_messages: int = 32, wait_ms: int = 0
    ) -> Gen[ArrowPage]:
        """``pull`` answered as an Arrow IPC stream (docs/spark.md): the stream's bytes, as
        they came, with the status and offsets (decode them with ``pyarrow.ipc``)."""
        params: dict[str, str | int] = {
            "offset": offset,
            "max_messages": max_messages,
            "wait_ms": wait_ms,
        }
        path = api_path("topics", topic, "queues", queue_id, "messages")
        call = Call("GET", path, params, wait_ms=wait_ms, accept=ARROW_STREAM)
        reply = yield from self.ex.exchange(call)
        h = reply.headers
        try:
            return ArrowPage(
                status=h["ledgermq-pull-status"],
                next_offset=int(h["ledgermq-next-offset"]),
                min_offset=int(h["ledgermq-min-offset"]),
                max_offset=int(h["ledgermq-max-offset"]),
                count=int(h["ledgermq-message-count"]),
                content=reply.content,
            )
        except (KeyError, ValueError):
            raise LedgerMQError(
                "NOT_ARROW", f"{path}: the answer is not an Arrow pull ({h.get('content-type')})"
            ) from None


def parse_send_result(r: Mapping[str, Any]) -> SendResult:
    q, o = r.get("queue_id"), r.get("queue_offset")
    return SendResult(
        str(r["msg_id"]),
        -1 if q is None else int(q),  # (a delay message: no queue until delivered)
        -1 if o is None else int(o),
        r.get("deliver_at_ms"),
        r.get("recall_handle"),
    )


def send_results_of_runs(body: Mapping[str, Any]) -> list[SendResult]:
    """The results of a compact produce answer (``results=runs``, docs/http.md): message
    ``i`` of a run ``[queue_id, queue_offset, address, count]`` lies at offset + ``i``,
    its id the prefix and its address + ``i`` in 16 hex digits."""
    prefix = str(body["msg_id_prefix"])
    return [
        SendResult(f"{prefix}{address + i:016X}", int(q), int(offset) + i)
        for q, offset, address, count in body["runs"]
        for i in range(int(count))
    ]


def new_producer_id() -> str:
    return f"p-{uuid.uuid4().hex}"


class ProducerOps:
    """A producer session: ``producer_id`` and a ``sequence`` that grows by one per
    batch. Retries of one batch resend the same (id, sequence): the broker answers them
    with the original results instead of appending again."""

    def __init__(self, ex: Exchange, producer_id: str | None, first_sequence: int) -> None:
        self.ex = ex
        self.producer_id = producer_id if producer_id is not None else new_producer_id()
        if not PRODUCER_ID.fullmatch(self.producer_id):
            raise ValueError(
                f"invalid producer_id {self.producer_id!r}: want {PRODUCER_ID.pattern}"
            )
        if first_sequence < 0:
            raise ValueError("first_sequence must be >= 0")
        self.sequence = first_sequence  # the next batch's

    def send(self, topic: str, messages: Iterable[MessageLike]) -> Gen[list[SendResult]]:
        """Send one batch; results in batch order, after quorum commit."""
        listed = list(messages)
        if not listed:
            raise ValueError("no messages to send")
        records = record_request(listed) if self.ex.settings.record_format else None
        sequence = self.sequence
        self.sequence += 1
        path = api_path("topics", topic, "messages")
        answer_s = self.ex.settings.produce_answer_timeout_s
        if records is not None:
            content, query = records
            params = {
                **query, "producer_id": self.producer_id, "sequence": sequence, "results": "runs",
            }  # fmt: skip
            call = Call(
                "POST", path, params, write=True, answer_timeout_s=answer_s,
                content=content, content_type=RECORDS,
            )  # fmt: skip
        else:
            batch = [encode_message(m) for m in listed]
            body = {"messages": batch, "producer_id": self.producer_id, "sequence": sequence}
            call = Call("POST", path, body=body, write=True, answer_timeout_s=answer_s)
        reply = yield from self.ex.exchange(call)
        if "runs" in reply.body:
            sent = send_results_of_runs(reply.body)
        else:
            sent = [parse_send_result(r) for r in reply.body["results"]]
        assert len(sent) == len(listed), f"{len(sent)} results for {len(listed)} messages"
        return sent

    def recall(self, recall_handle: str) -> Gen[None]:
        """Cancel a delay message before its time (``SendResult.recall_handle``):
        ``AlreadyDeliveredError`` once it was delivered; a repeat is fine."""
        path = api_path("delayed", recall_handle)
        yield from self.ex.write("DELETE", path, None)

    def send_one(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        deliver_at_ms: int | None = None,
        delay_ms: int | None = None,
    ) -> Gen[SendResult]:
        m = (
            body
            if isinstance(body, Message)
            else Message(
                body,
                key=key,
                tags=tags,
                properties=properties or {},
                queue_id=queue_id,
                sharding_key=sharding_key,
                deliver_at_ms=deliver_at_ms,
                delay_ms=delay_ms,
            )
        )
        results = yield from self.send(topic, [m])
        return results[0]
