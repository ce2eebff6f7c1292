"""The client-side ``ledgermq`` commands (docs/operations.md), over ``ledgermq.client``:

- ``topic create|list|describe|delete``, ``group list``, ``group lag``, ``group config``
  and ``group show`` (a POP group's configuration), ``dlq show|redrive`` (its dead
  letters);
- ``produce``: messages from arguments, stdin (``-``) or ``--file``, one per line (or
  ``--ndjson`` message objects), sent in batches through one producer session;
- ``consume``: a group's committed offsets (committing as it goes), or ``--from
  earliest|latest`` without a group, or ``--pop`` (received from a POP group, acked once
  printed); ``--follow`` long-polls until Ctrl-C;
- ``status``: every node's roles and indexes, down nodes included;
- ``leader transfer --to n1``.

Every option also comes from ``LEDGERMQ_<NAME>``; ``--brokers`` may name any nodes, the
master is found. Errors are one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from dataclasses import replace as with_fields
from pathlib import Path
from typing import IO, Any

import httpx
import orjson

from ..client import (
    DLQ_PROPERTIES,
    Admin,
    ClientSettings,
    Consumer,
    GroupDescription,
    LedgerMQError,
    Message,
    MessageLike,
    NodeView,
    Pacer,
    PayloadTooLargeError,
    PopConsumer,
    Producer,
    ReceivedMessage,
    TopicNotFoundError,
    dlq_topic,
    encode_message,
)
from .util import add_brokers_option, add_option

Handler = Callable[[argparse.Namespace], int]

# Above this many messages, produce prints a summary instead of one line per message.
PRINT_EACH_MAX = 100
POP_BATCH = 32  # messages per receive of consume --pop


# ---- parser ---------------------------------------------------------------------------------


def _common(
    p: argparse.ArgumentParser,
    handler: Handler,
    *,
    json_output: bool = True,
    timeout_s: float = 10.0,
) -> None:
    add_brokers_option(p)
    add_option(p, "--auth-token", default=None, help="bearer token (docs/operations.md)")
    add_option(p, "--timeout", type=float, default=timeout_s, help="seconds per request")
    add_option(p, "--deadline", type=float, default=30.0, help="seconds per operation")
    add_option(
        p,
        "--ca-file",
        type=Path,
        default=os.environ.get("SSL_CERT_FILE") or None,
        help="CA bundle (PEM) that signed the brokers' TLS certificates, for a private CA "
        "(default: $SSL_CERT_FILE, else the system's)",
    )
    if json_output:
        add_option(p, "--json", action="store_true", help="JSON lines instead of text")
    p.set_defaults(client_handler=handler)


def add_client_commands(sub: Any) -> None:
    """Register the client commands on ``ledgermq``'s subparsers."""
    _add_topic_commands(sub)
    _add_produce_command(sub)
    _add_consume_command(sub)
    _add_status_command(sub)
    _add_group_commands(sub)
    _add_dlq_commands(sub)
    _add_tx_commands(sub)
    _add_leader_commands(sub)


def _add_topic_commands(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, list, describe or delete topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    p = tsub.add_parser("create", help="create a topic (again: no change)")
    p.add_argument("name")
    add_option(p, "--queues", type=int, default=None, help="queue count (broker default: 8)")
    _common(p, _topic_create)
    p = tsub.add_parser("list", help="list topics")
    _common(p, _topic_list)
    p = tsub.add_parser("describe", help="a topic's queues and offsets")
    p.add_argument("name")
    _common(p, _topic_describe)
    p = tsub.add_parser("delete", help="delete a topic")
    p.add_argument("name")
    _common(p, _topic_delete, json_output=False)


def _add_produce_command(sub: Any) -> None:
    p = sub.add_parser("produce", help="send messages (args, stdin '-', or --file)")
    p.add_argument("topic")
    p.add_argument("messages", nargs="*", help="message bodies; '-' reads stdin")
    add_option(p, "--file", type=Path, default=None, help="one message per line")
    add_option(p, "--ndjson", action="store_true", help="lines are JSON message objects")
    add_option(p, "--key", default=None)
    add_option(p, "--tags", default=None)
    add_option(p, "--property", action="append", default=[], metavar="NAME=VALUE")
    add_option(p, "--queue-id", type=int, default=None, help="pin a queue")
    add_option(p, "--sharding-key", default=None, help="hash to a fixed queue (ordered)")
    add_option(
        p, "--delay-ms", type=int, default=None, help="delay messages: delivered this much later"
    )
    add_option(
        p, "--deliver-at-ms", type=int, default=None, help="delay messages: delivered at (ms)"
    )
    add_option(p, "--batch", type=int, default=100, help="messages per request")
    add_option(p, "--producer-id", default=None, help="default: a fresh p-<uuid4>")
    add_option(
        p,
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: for bulk input on a terminal)",
    )
    _common(p, _produce)


def _add_consume_command(sub: Any) -> None:
    p = sub.add_parser("consume", help="receive messages (a group's, --from, or --pop)")
    p.add_argument("topic")
    add_option(p, "--consumer-group", "-g", "--group", default=None, help="commit as this group")
    add_option(
        p,
        "--pop",
        action="store_true",
        help="receive as the POP group -g (shared with its other consumers), ack once printed;"
        " a new group starts at the latest message (group config --start)",
    )
    add_option(
        p,
        "--invisible-ms",
        type=int,
        default=30_000,
        help="--pop: a message received and not acked goes again after this long",
    )
    add_option(
        p,
        "--from",
        dest="start",
        choices=("earliest", "latest"),
        default=None,
        help="without a group: where to start (default earliest)",
    )
    add_option(p, "--queue-id", type=int, action="append", default=[], help="only these")
    add_option(p, "--follow", "-f", action="store_true", help="keep long-polling (Ctrl-C)")
    add_option(p, "--max", type=int, default=None, help="stop after this many")
    add_option(p, "--wait-ms", type=int, default=1000, help="long-poll wait per request")
    add_option(
        p, "--idle", type=float, default=1.0, help="without --follow: stop after idle seconds"
    )
    _common(p, _consume)


def _add_status_command(sub: Any) -> None:
    p = sub.add_parser("status", help="every node: roles, term, indexes, lag")
    p.add_argument(  # no environment variable: a stray LEDGERMQ_MASTER must not change it
        "--master",
        action="store_true",
        help="print only the MASTER's node id (exit 1 when no node says MASTER)",
    )
    _common(p, _status, timeout_s=2.0)


def _add_group_commands(sub: Any) -> None:
    group = sub.add_parser("group", help="consumer groups (offsets, or POP)")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    p = gsub.add_parser("list", help="list consumer groups")
    _common(p, _group_list)
    p = gsub.add_parser("lag", help="committed, max and lag per topic and queue")
    p.add_argument("group")
    add_option(p, "--topic", default=None, help="only this topic")
    _common(p, _group_lag)
    p = gsub.add_parser(
        "config",
        help="create a POP group or set its whole configuration (what is not given: the default)",
    )
    p.add_argument("group")
    add_option(p, "--fifo", action="store_true", help="in queue order, one in flight per queue")
    add_option(p, "--max-delivery-attempts", type=int, default=None, help="default 17")
    retry = p.add_mutually_exclusive_group()
    add_option(
        retry,
        "--retry-list",
        default=None,
        metavar="MS,MS,...",
        help="delays before the 2nd, 3rd, ... delivery (default RocketMQ's, 1 s to 2 h)",
    )
    add_option(
        retry,
        "--retry-exponential",
        default=None,
        metavar="INITIAL_MS[,MULTIPLIER[,MAX_MS]]",
        help="delays growing from INITIAL_MS by MULTIPLIER (2) up to MAX_MS (2 h)",
    )
    add_option(
        p,
        "--start",
        default=None,
        metavar="earliest|latest|MS",
        help="where a queue starts at the group's first receive (default latest)",
    )
    _common(p, _group_config)
    p = gsub.add_parser("show", help="a group's mode, configuration, in flight and offsets")
    p.add_argument("group")
    add_option(p, "--topic", default=None, help="offsets of this topic only")
    _common(p, _group_show)


def _add_dlq_commands(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="a POP group's dead letters (the topic %%DLQ%%<group>)")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("show", help="the dead letters and where each came from")
    p.add_argument("group")
    add_option(p, "--from-offset", type=int, default=None, help="default: the oldest kept")
    add_option(p, "--max", type=int, default=100, help="at most this many")
    _common(p, _dlq_show)
    p = dsub.add_parser(
        "redrive",
        help="produce dead letters back to the topics they came from, from the first not"
        " produced back yet (the broker keeps where it got to: each goes back once)",
    )
    p.add_argument("group")
    add_option(p, "--max", type=int, default=1000, help="at most this many")
    _common(p, _dlq_redrive)


def _add_tx_commands(sub: Any) -> None:
    tx = sub.add_parser("tx", help="unresolved transactions: list, commit or roll back by hand")
    tsub = tx.add_subparsers(dest="tx_command", required=True, metavar="ACTION")
    p = tsub.add_parser("list", help="the unresolved transactions, oldest first")
    add_option(p, "--producer-group", default=None, help="only this producer group's")
    _common(p, _tx_list)
    for action in ("commit", "rollback"):
        p = tsub.add_parser(action, help=f"{action} a transaction (as its producer would)")
        p.add_argument("transaction_id")
        _common(p, _tx_end)


def _add_leader_commands(sub: Any) -> None:
    leader = sub.add_parser("leader", help="Raft leadership")
    lsub = leader.add_subparsers(dest="leader_command", required=True, metavar="ACTION")
    p = lsub.add_parser("transfer", help="make another node the master")
    add_option(p, "--to", required=True, help="the node id, e.g. n1")
    _common(p, _leader_transfer)


def add_member_commands(csub: Any) -> None:
    """``ledgermq cluster members|add|promote|remove|replace`` on the ``cluster``
    subparsers (docs/operations.md "Changing the members")."""
    p = csub.add_parser("members", help="the group's voters and learners")
    _common(p, _members)
    p = csub.add_parser("add", help="add a node as a learner (it receives the log, no vote)")
    _member_node_options(p)
    _common(p, _member_add)
    p = csub.add_parser("promote", help="make a learner a voter once it caught up")
    p.add_argument("node_id")
    _member_wait_option(p)
    _common(p, _member_promote)
    p = csub.add_parser("remove", help="remove a member (the master hands over first)")
    p.add_argument("node_id")
    _member_wait_option(p)
    _common(p, _member_remove)
    p = csub.add_parser(
        "replace", help="add a new node, wait for it to catch up, promote it, remove the old one"
    )
    p.add_argument("old_node_id")
    _member_node_options(p)
    _common(p, _member_replace)


_MEMBER_TIMEOUT_S = 60.0


def _member_wait_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait", type=float, default=_MEMBER_TIMEOUT_S, help="seconds the change may take"
    )


def _member_node_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("node_id", help="the new node's id, e.g. n3")
    p.add_argument("--raft-addr", required=True, help="its Raft host:port")
    p.add_argument("--http-url", default=None, help="its HTTP URL, e.g. http://10.0.0.4:8080")
    _member_wait_option(p)


def _members(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        d = admin.members()
    if args.json:
        _json_line(d)
        return 0
    rows = [
        (
            m["node_id"] + (" *" if m["node_id"] == d.get("leader_id") else ""),
            m["role"],
            m["raft_addr"],
            m.get("http_url"),
            m.get("match_index"),
        )
        for m in d["members"]
    ]
    print(table(("node (* master)", "role", "raft", "http", "match"), rows))
    return 0


def _member_done(args: argparse.Namespace, what: str, index: int) -> int:
    if args.json:
        _json_line({"change": what, "config_index": index})
    else:
        print(f"{what}: committed at index {index}")
    return 0


def _member_admin(args: argparse.Namespace) -> Admin:
    """A client whose requests may take as long as ``--wait`` (a promotion waits for
    its learner to catch up)."""
    settings = with_fields(
        _settings(args),
        timeout_s=max(args.timeout, args.wait + 10),
        deadline_s=max(args.deadline, args.wait + 20),
    )
    return Admin(args.brokers, settings=settings)


def _member_add(args: argparse.Namespace) -> int:
    with _member_admin(args) as admin:
        index = admin.add_member(args.node_id, args.raft_addr, args.http_url, args.wait)
    return _member_done(args, f"{args.node_id} added as a learner", index)


def _member_promote(args: argparse.Namespace) -> int:
    with _member_admin(args) as admin:
        index = admin.promote_member(args.node_id, args.wait)
    return _member_done(args, f"{args.node_id} votes", index)


def _member_remove(args: argparse.Namespace) -> int:
    with _member_admin(args) as admin:
        index = admin.remove_member(args.node_id, args.wait)
    return _member_done(args, f"{args.node_id} removed", index)


def _member_replace(args: argparse.Namespace) -> int:
    """Add, catch up and promote the new node, then remove the old one: each step is
    one change through the log, and the group keeps its size but for the step between."""
    with _member_admin(args) as admin:
        steps = []
        members = {m["node_id"]: m for m in admin.members()["members"]}
        if args.old_node_id not in members:
            print(f"ledgermq cluster replace: {args.old_node_id} is not a member", file=sys.stderr)
            return 1
        if args.node_id not in members:
            index = admin.add_member(args.node_id, args.raft_addr, args.http_url, args.wait)
            steps.append((f"{args.node_id} added as a learner", index))
            if not args.json:
                print(f"{steps[-1][0]}: committed at index {index}", flush=True)
        if members.get(args.node_id, {}).get("role") != "voter":
            index = admin.promote_member(args.node_id, args.wait)
            steps.append((f"{args.node_id} votes", index))
            if not args.json:
                print(f"{steps[-1][0]}: committed at index {index}", flush=True)
        index = admin.remove_member(args.old_node_id, args.wait)
        steps.append((f"{args.old_node_id} removed", index))
    if args.json:
        _json_line({"steps": [{"change": w, "config_index": i} for w, i in steps]})
    else:
        print(f"{steps[-1][0]}: committed at index {index}")
    return 0


def run_client_command(args: argparse.Namespace) -> int:
    """Run a command registered by ``add_client_commands``; the exit code."""
    handler: Handler | None = getattr(args, "client_handler", None)
    if handler is None:
        print(f"ledgermq: {args.command}: not a client command", file=sys.stderr)
        return 2
    name = " ".join(
        str(v)
        for v in (
            args.command,
            getattr(args, "topic_command", None)
            or getattr(args, "group_command", None)
            or getattr(args, "dlq_command", None)
            or getattr(args, "leader_command", None)
            or getattr(args, "cluster_command", None),
        )
        if v
    )
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ledgermq consume ... | head`: quiet, like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except LedgerMQError as e:
        return _error(name, str(e))
    except httpx.HTTPError as e:
        return _error(name, f"{type(e).__name__}: {e}")
    except (OSError, ValueError, TypeError) as e:
        return _error(name, str(e) or type(e).__name__)


def _error(name: str, message: str) -> int:
    line = " ".join(message.split())  # one line, whatever the server said
    print(f"ledgermq {name}: {line}", file=sys.stderr)
    return 1


def _settings(args: argparse.Namespace) -> ClientSettings:
    ca_file: Path | None = args.ca_file
    if ca_file is not None and not ca_file.is_file():
        raise ValueError(f"--ca-file {ca_file}: no such file")
    return ClientSettings(
        timeout_s=args.timeout,
        deadline_s=args.deadline,
        auth_token=args.auth_token,
        verify=True if ca_file is None else str(ca_file),
    )


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.brokers, settings=_settings(args))


def _json_line(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


# ---- topics and groups ----------------------------------------------------------------------


def _topic_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        t = admin.create_topic(args.name, args.queues)
    if args.json:
        _json_line(asdict(t))
    else:
        print(f"topic {t.name}: {t.queues} queues ({'created' if t.created else 'exists'})")
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.list_topics()
    if args.json:
        for t in topics:
            _json_line({"name": t.name, "queues": t.queues})
    else:
        print(table(["TOPIC", "QUEUES"], [(t.name, t.queues) for t in topics]))
    return 0


def _topic_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        d = admin.describe_topic(args.name)
    if args.json:
        _json_line(asdict(d))
        return 0
    rows = [(q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset) for q in d.queues]
    total = sum(r[3] for r in rows)
    print(f"topic {d.name}: {len(rows)} queues, {total} messages retained")
    print(table(["QUEUE", "MIN", "MAX", "MESSAGES"], rows))
    return 0


def _topic_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topic(args.name)
    print(f"topic {args.name}: deleted")
    return 0


def _group_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        groups = admin.groups()
    for g in groups:
        _json_line(g) if args.json else print(g)
    return 0


def _group_lag(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        offsets = admin.group_offsets(args.group, args.topic)
    if args.json:
        for o in offsets:
            _json_line(asdict(o))
        return 0
    rows: list[tuple[object, ...]] = [
        (o.topic, o.queue_id, o.committed_offset, o.max_offset, o.lag) for o in offsets
    ]
    by_topic: dict[str, int] = {}
    for o in offsets:
        by_topic[o.topic] = by_topic.get(o.topic, 0) + o.lag
    if len(by_topic) > 1:
        rows += [(t, "all", "", "", lag) for t, lag in sorted(by_topic.items())]
    rows.append(("TOTAL", "", "", "", sum(o.lag for o in offsets)))
    print(f"group {args.group}")
    print(table(["TOPIC", "QUEUE", "COMMITTED", "MAX", "LAG"], rows))
    return 0


def _numbers(text: str, option: str) -> list[int | float]:
    try:
        return [float(x) if "." in x else int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: want numbers separated by commas") from None


def _retry(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.retry_list is not None:
        return {"policy": "list", "delays_ms": _numbers(args.retry_list, "--retry-list")}
    if args.retry_exponential is not None:
        parts = _numbers(args.retry_exponential, "--retry-exponential")
        if not 1 <= len(parts) <= 3:
            raise ValueError("--retry-exponential: INITIAL_MS[,MULTIPLIER[,MAX_MS]]")
        names = ("initial_ms", "multiplier", "max_ms")
        return {"policy": "exponential", **dict(zip(names, parts, strict=False))}
    return None


def _start(text: str | None) -> str | int | None:
    if text is None or text in ("earliest", "latest"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--start {text!r}: want earliest, latest or a time in ms") from None


def _retry_text(retry: Any) -> str:
    if not isinstance(retry, dict):
        return "-"
    if retry.get("policy") == "list":
        return "list " + ",".join(str(d) for d in retry.get("delays_ms", ()))
    return (
        f"exponential from {retry.get('initial_ms')} ms x{retry.get('multiplier')}"
        f" up to {retry.get('max_ms')} ms"
    )


def _print_group(d: GroupDescription) -> None:
    if d.mode != "pop":
        print(f"group {d.group}: mode {d.mode}")
        return
    print(
        f"group {d.group}: mode pop, fifo {str(d.fifo).lower()},"
        f" max delivery attempts {d.max_delivery_attempts}, start {d.start}"
    )
    print(f"  retry: {_retry_text(d.retry)}")
    if d.topics:
        counts = ("delivered", "redelivered", "acked", "nacked", "expired", "dead_lettered")
        rows = [(t.topic, t.in_flight, *(getattr(t, c) for c in counts)) for t in d.topics]
        print(table(["TOPIC", "IN_FLIGHT", *(c.upper() for c in counts)], rows))


def _group_config(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        d = admin.configure_group(
            args.group,
            fifo=args.fifo or None,
            max_delivery_attempts=args.max_delivery_attempts,
            retry=_retry(args),
            start=_start(args.start),  # type: ignore[arg-type]  # checked by _start
        )
    _json_line(asdict(d)) if args.json else _print_group(d)
    return 0


def _group_show(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        d = admin.describe_group(args.group)
        offsets = admin.group_offsets(args.group, args.topic)
    if args.json:
        _json_line({**asdict(d), "offsets": [asdict(o) for o in offsets]})
        return 0
    _print_group(d)
    pop = d.mode == "pop"
    where = ["NEXT", "IN_FLIGHT"] if pop else ["COMMITTED"]
    rows = [
        (
            o.topic,
            o.queue_id,
            *((o.next_offset, o.in_flight) if pop else (o.committed_offset,)),
            o.max_offset,
            o.lag,
        )
        for o in offsets
    ]
    print(table(["TOPIC", "QUEUE", *where, "MAX", "LAG"], rows))
    return 0


# ---- dead letters ---------------------------------------------------------------------------

DLQ_PAGE = 100  # dead letters per pull


def _dead_letters(
    admin: Admin, group: str, start: int | None, limit: int
) -> Iterator[ReceivedMessage]:
    """Up to ``limit`` dead letters of ``group`` from ``start`` (the oldest kept: None),
    in order; none when the group never dead-lettered anything."""
    if limit < 1:
        raise ValueError("--max must be >= 1")
    topic = dlq_topic(group)
    try:
        [q] = admin.describe_topic(topic).queues
    except TopicNotFoundError:
        return
    offset = q.min_offset if start is None else max(start, q.min_offset)
    while limit > 0 and offset < q.max_offset:  # each pull moves on, or ends the loop
        r = admin.pull(topic, 0, offset, max_messages=min(DLQ_PAGE, limit))
        if not r.messages or r.next_offset <= offset:
            return
        yield from r.messages
        limit -= len(r.messages)
        offset = r.next_offset


def _dlq_show(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        letters = list(_dead_letters(admin, args.group, args.from_offset, args.max))
    if args.json:
        for m in letters:
            _json_line(message_json(m))
        return 0
    if not letters:
        print(f"group {args.group}: no dead letters")
        return 0
    names = DLQ_PROPERTIES[:5]  # the origin and the attempts
    rows = [
        (m.queue_offset, *(m.properties.get(n) for n in names), _escape(m.text)[:80])
        for m in letters
    ]
    print(table(["OFFSET", "TOPIC", "QUEUE", "QUEUE_OFFSET", "MSG_ID", "ATTEMPTS", "BODY"], rows))
    return 0


def _dlq_redrive(args: argparse.Namespace) -> int:
    total = skipped = 0
    next_offset = 0
    with _admin(args) as admin, _Progress(sys.stderr.isatty()) as bar:
        while total + skipped < args.max:  # (each call moves at least one, or ends)
            r = admin.redrive_dead_letters(args.group, min(DLQ_PAGE, args.max - total - skipped))
            total, skipped, next_offset = total + r.redriven, skipped + r.skipped, r.next_offset
            if not r.redriven and not r.skipped:
                break
            bar(r.redriven + r.skipped)
    if args.json:
        _json_line({"redriven": total, "skipped": skipped, "next_offset": next_offset})
    elif not total and not skipped:
        print(f"group {args.group}: no dead letters to redrive (next offset {next_offset})")
    else:
        gone = f"; skipped {_plural(skipped, 'dead letter')} whose topic is gone" if skipped else ""
        print(
            f"redrove {_plural(total, 'dead letter')} of {args.group} to their topics{gone};"
            f" they stay in {dlq_topic(args.group)}, and the next redrive starts at {next_offset}"
        )
    return 0


# ---- cluster --------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        views = admin.cluster_all()
    if args.master:
        masters = [v.status.node_id for v in views if v.status and v.status.broker_role == "MASTER"]
        print("\n".join(masters) or "no node is MASTER", file=sys.stdout if masters else sys.stderr)
        return 0 if masters else 1
    if args.json:
        for v in views:
            _json_line(
                {
                    "node_id": v.node_id,
                    "url": v.url,
                    "up": v.status is not None,
                    "error": v.error,
                    "status": dict(v.status.raw) if v.status else None,
                }
            )
        return 0 if any(v.status for v in views) else 1
    print(status_table(views))
    return 0 if any(v.status for v in views) else 1


def status_table(views: Sequence[NodeView]) -> str:
    """One row per node; ``LAG`` is how many entries its log is behind the master's."""
    master_end = next(
        (
            v.status.ledger_end_index
            for v in views
            if v.status is not None and v.status.broker_role == "MASTER"
        ),
        None,
    )
    learners = {
        n.get("node_id")
        for v in views
        if v.status is not None
        for n in v.status.raw.get("nodes", [])
        if n.get("role") == "learner"
    }
    rows: list[Sequence[object]] = []
    for v in views:
        s = v.status
        if s is None:
            rows.append((v.node_id, v.url, "DOWN", "", "", "", "", "", "", "", v.error))
            continue
        lag = None if master_end is None else max(0, master_end - s.ledger_end_index)
        rows.append(
            (
                s.node_id,
                v.url,
                s.raft_role,
                s.broker_role + (" (learner)" if s.node_id in learners else ""),
                s.term,
                s.leader_id,
                s.ledger_end_index,
                s.committed_index,
                s.dispatched_index,
                lag,
                "",
            )
        )
    headers = ["NODE", "URL", "RAFT", "BROKER", "TERM", "LEADER", "END", "COMMITTED"]
    return table([*headers, "DISPATCHED", "LAG", "NOTE"], rows)


def _tx_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        pending = admin.pending_transactions(args.producer_group)
    if args.json:
        for t in pending:
            _json_line(t)
        return 0
    if not pending:
        print("no unresolved transactions")
        return 0
    names = ("transaction_id", "producer_group", "topic", "messages", "check_count", "born")
    print(table([n.upper() for n in names], [tuple(t[n] for n in names) for t in pending]))
    return 0


def _tx_end(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        state = admin.end_transaction(args.transaction_id, args.tx_command)
    if args.json:
        _json_line({"transaction_id": args.transaction_id, "state": state})
    else:
        print(f"transaction {args.transaction_id}: {state}")
    return 0


def _leader_transfer(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        answer = admin.transfer_leadership(args.to)
    if args.json:
        _json_line(answer)
    else:
        print(f"leader: {answer.get('leader_id', args.to)} (term {answer.get('term', '?')})")
    return 0


# ---- produce --------------------------------------------------------------------------------


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for n, raw in enumerate(stream, 1):
        line = raw.rstrip(b"\r\n")
        if line.strip():
            yield n, line


def _body(line: bytes) -> bytes | str:
    """Text travels as UTF-8, anything else as bytes (base64 on the wire)."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line


def _messages(
    args: argparse.Namespace, lines: Iterator[tuple[int, bytes]] | None
) -> Iterator[MessageLike]:
    properties = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--property {item!r}: want NAME=VALUE")
        properties[name] = value

    def message(body: bytes | str) -> Message:
        return Message(
            body,
            key=args.key,
            tags=args.tags,
            properties=properties,
            queue_id=args.queue_id,
            sharding_key=args.sharding_key,
            deliver_at_ms=args.deliver_at_ms,
            delay_ms=args.delay_ms,
        )

    if lines is None:
        yield from (message(b) for b in args.messages)
        return
    for n, line in lines:
        if not args.ndjson:
            yield message(_body(line))
            continue
        try:
            obj = orjson.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            encode_message(obj)  # checked here, so the error names the line
        except (ValueError, TypeError) as e:
            raise ValueError(f"line {n}: {e}") from None
        yield obj


def _send_within_limits(p: Producer, args: argparse.Namespace, batch: list[Any]) -> list[Any]:
    """Send ``batch``; one the broker refuses as too large (413, nothing written) is
    sent in halves, and ``args.batch`` shrinks for the rest (said once on stderr)."""
    try:
        return p.send(args.topic, batch)
    except PayloadTooLargeError:
        if len(batch) == 1:
            raise
    half = len(batch) // 2
    if half < args.batch:
        print(
            f"ledgermq produce: --batch {args.batch} is over the broker's limits: "
            f"batches of {half} from here",
            file=sys.stderr,
        )
        args.batch = half
    return _send_within_limits(p, args, batch[:half]) + _send_within_limits(p, args, batch[half:])


def _produce(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise ValueError("--batch must be >= 1")
    from_stdin = args.messages == ["-"]
    if args.file is not None and args.messages:
        raise ValueError("give message arguments or --file, not both")
    if "-" in args.messages and not from_stdin:
        raise ValueError("'-' (stdin) goes alone")
    if args.file is None and not args.messages:
        raise ValueError("no messages: give them as arguments, '-' for stdin, or --file")
    bulk = from_stdin or args.file is not None
    stream: IO[bytes] | None = None
    if args.file is not None:
        stream = args.file.open("rb")
    elif from_stdin:
        stream = sys.stdin.buffer
    show_bar = args.progress if args.progress is not None else bulk and sys.stderr.isatty()
    each = not bulk or args.json
    sent = batches = 0
    started = time.monotonic()
    try:
        source = _messages(args, _lines(stream) if stream is not None else None)
        with (
            Producer(args.brokers, producer_id=args.producer_id, settings=_settings(args)) as p,
            _Progress(show_bar) as bar,
        ):
            while batch := list(itertools.islice(source, args.batch)):
                results = _send_within_limits(p, args, batch)
                sent += len(results)
                batches += 1
                bar(len(results))
                for r in results if each else ():
                    if args.json:  # (a delay message's time and handle when it has them)
                        _json_line({k: v for k, v in asdict(r).items() if v is not None})
                    elif r.recall_handle is not None:
                        print(f"delayed\t{r.deliver_at_ms}\t{r.msg_id}\t{r.recall_handle}")
                    else:
                        print(f"{r.queue_id}\t{r.queue_offset}\t{r.msg_id}")
    finally:
        if stream is not None and args.file is not None:
            stream.close()
    if not each or sent > PRINT_EACH_MAX:
        rate = sent / max(time.monotonic() - started, 1e-6)
        print(
            f"sent {_plural(sent, 'message')} to {args.topic} in {_plural(batches, 'batch')}"
            f" ({rate:,.0f} msg/s)",
            file=sys.stdout if not args.json else sys.stderr,
        )
    return 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}{'es' if word.endswith('ch') else 's'}"


class _Progress:
    """A tqdm bar on stderr when wanted; otherwise nothing (CI logs stay clean)."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if self.show:
            from tqdm import tqdm  # noqa: PLC0415  # only bulk produce on a terminal

            self.bar = tqdm(unit="msg", file=sys.stderr, dynamic_ncols=True)
            return self.bar.update  # type: ignore[no-any-return]
        return lambda n: None

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


# ---- consume --------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def format_message(m: ReceivedMessage) -> str:
    """``queue_id <TAB> queue_offset <TAB> key <TAB> body``: text escaped onto one line,
    a body that is not UTF-8 as ``base64:...``."""
    try:
        body = _escape(m.body.decode("utf-8"))
    except UnicodeDecodeError:
        body = "base64:" + base64.b64encode(m.body).decode("ascii")
    return f"{m.queue_id}\t{m.queue_offset}\t{_escape(m.key or '')}\t{body}"


def message_json(m: ReceivedMessage) -> dict[str, Any]:
    d = asdict(m)
    try:
        d["body"], d["encoding"] = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        d["body"], d["encoding"] = base64.b64encode(m.body).decode("ascii"), "base64"
    return d


def _write_message(m: ReceivedMessage, as_json: bool) -> None:
    line = orjson.dumps(message_json(m)).decode() if as_json else format_message(m)
    sys.stdout.write(line + "\n")


def _consume(args: argparse.Namespace) -> int:
    if args.max is not None and args.max < 1:
        raise ValueError("--max must be >= 1")
    count = (_consume_pop if args.pop else _consume_offsets)(args)
    if not args.json and not args.follow and sys.stderr.isatty():
        print(f"{count} messages", file=sys.stderr)
    return 0


def _consume_offsets(args: argparse.Namespace) -> int:
    """Messages by offsets, a group's (committed as printed) or from ``--from``; how
    many were printed."""
    group = args.consumer_group
    if group is not None and args.start is not None:
        raise ValueError(
            "--from is for reading without a group (a group starts where it committed)"
        )
    consumer = Consumer(
        args.brokers,
        group,
        args.topic,
        queue_ids=args.queue_id or None,
        start=args.start or "earliest",
        settings=_settings(args),
    )
    count = 0
    # Leaving the block normally (Ctrl-C included) commits what was printed; an error
    # commits nothing more: those messages come again (at least once).
    with consumer:
        try:
            stream = consumer.messages(
                max_idle_s=None if args.follow else args.idle,
                max_messages=args.max,
                wait_ms=args.wait_ms,
            )
            for m in stream:
                _write_message(m, args.json)
                if args.follow:
                    sys.stdout.flush()
                count += 1
        except KeyboardInterrupt:
            pass
    return count


def _consume_pop(args: argparse.Namespace) -> int:
    """Receive as a POP group, print, ack each batch once printed (what was received and
    not acked, after Ctrl-C or an error, comes again after ``--invisible-ms``); how
    many were printed."""
    if args.consumer_group is None or args.start is not None or args.queue_id:
        raise ValueError("--pop wants -g GROUP, and neither --from nor --queue-id")
    count = 0
    idle = None if args.follow else args.idle
    pacer = Pacer(time.monotonic, idle, args.max, args.wait_ms, POP_BATCH)
    with PopConsumer(args.brokers, args.consumer_group, args.topic, settings=_settings(args)) as c:
        try:
            while (want := pacer.next_fetch()) is not None:
                got = c.receive(want[0], args.invisible_ms, want[1])
                pacer.got(len(got))
                for m in got:
                    _write_message(m, args.json)
                sys.stdout.flush()
                stale = sum(not r.ok for r in (c.ack(got) if got else ()))
                if stale:
                    print(f"{stale} acks too late: those messages come again", file=sys.stderr)
                count += len(got)
        except KeyboardInterrupt:
            pass
    return count
