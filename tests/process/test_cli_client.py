"""The client commands of ``ledgermq`` (docs/operations.md) through the installed entry point,
as a user runs them, against three broker processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledgermq.client import Admin, Consumer, PopConsumer, Producer, TransactionProducer
from ledgermq.local_cluster import LocalBrokerCluster

LEDGERMQ = Path(sys.executable).with_name("ledgermq")
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens there


def env(**extra: str) -> dict[str, str]:
    """The environment without the caller's LEDGERMQ_* settings, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERMQ_")}
    return {**base, **{f"LEDGERMQ_{k.upper()}": v for k, v in extra.items()}}


def ledgermq(
    *args: str, stdin: str | None = None, rc: int = 0, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [str(LEDGERMQ), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env(**env_vars),
        check=False,
    )
    assert p.returncode == rc, f"rc {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr
    return p


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def brokers(cluster3: LocalBrokerCluster) -> str:
    assert LEDGERMQ.exists(), f"{LEDGERMQ}: the project is not installed in this venv"
    return cluster3.brokers


def test_topic_commands(brokers: str) -> None:
    out = ledgermq("topic", "create", "cli-t", "--queues", "3", "--brokers", brokers).stdout
    assert out.strip() == "topic cli-t: 3 queues (created)"
    # The brokers from the environment this time.
    out = ledgermq("topic", "create", "cli-t", "--queues", "3", brokers=brokers).stdout
    assert "(exists)" in out
    listed = [
        json.loads(line)
        for line in ledgermq("topic", "list", "--json", brokers=brokers).stdout.splitlines()
    ]
    assert {"name": "cli-t", "queues": 3} in listed
    assert "cli-t" in ledgermq("topic", "list", brokers=brokers).stdout
    described = ledgermq("topic", "describe", "cli-t", brokers=brokers).stdout.splitlines()
    assert described[0] == "topic cli-t: 3 queues, 0 messages retained"
    assert described[1].split() == ["QUEUE", "MIN", "MAX", "MESSAGES"]
    assert [r.split() for r in described[2:]] == [[str(q), "0", "0", "0"] for q in range(3)]
    assert (
        ledgermq("topic", "delete", "cli-t", brokers=brokers).stdout.strip()
        == "topic cli-t: deleted"
    )
    err = one_error_line(ledgermq("topic", "describe", "cli-t", rc=1, brokers=brokers))
    assert err.startswith("ledgermq topic describe: TOPIC_NOT_FOUND")
    err = one_error_line(ledgermq("topic", "create", "bad name", rc=1, brokers=brokers))
    assert "INVALID_ARGUMENT" in err


def test_errors_are_one_line_without_a_traceback() -> None:
    p = ledgermq("topic", "list", "--brokers", DEAD, "--deadline", "0.5", rc=1)
    assert "BROKER_UNAVAILABLE" in one_error_line(p) and DEAD in p.stderr
    p = ledgermq("produce", "t", "x", "--batch", "0", "--brokers", DEAD, rc=1)
    assert one_error_line(p) == "ledgermq produce: --batch must be >= 1"
    p = ledgermq("produce", "t", "--brokers", DEAD, rc=1)
    assert "no messages" in one_error_line(p)
    p = ledgermq("consume", "t", "--brokers", DEAD, rc=2, **{"from": "sideways"})
    assert "LEDGERMQ_FROM" in p.stderr  # a bad environment value is named


def test_global_options_before_the_command_and_a_queue_that_is_not_there(brokers: str) -> None:
    """Issue 32: ``ledgermq --brokers URL topic list`` failed ("invalid choice"), and
    ``consume --queue-id 99`` of a 4-queue topic printed nothing and exited 0."""
    out = ledgermq("--brokers", brokers, "topic", "create", "cli-q", "--queues", "4").stdout
    assert "(created)" in out
    assert "cli-q" in ledgermq(f"--brokers={brokers}", "--json", "topic", "list").stdout
    for args in (["--queue-id", "99"], ["--queue-id", "1", "--queue-id", "4"]):
        p = ledgermq("consume", "cli-q", *args, "--brokers", brokers, rc=1)
        assert "INVALID_ARGUMENT" in one_error_line(p) and "0..3" in p.stderr
        p = ledgermq("consume", "cli-q", "-g", "qg", *args, "--brokers", brokers, rc=1)
        assert "INVALID_ARGUMENT" in one_error_line(p)
    assert ledgermq("--version").stdout.startswith("ledgermq ")


def test_produce_from_arguments_stdin_and_files(brokers: str, tmp_path: Path) -> None:
    topic = "cli-p"
    out = ledgermq("produce", topic, "one", "two", "--key", "k", "--tags", "T", brokers=brokers)
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r) == 3 for r in rows)  # queue, offset, msg id

    lines = "".join(f"line-{i}\n" for i in range(250)) + "\n"  # a blank line is skipped
    out = ledgermq("produce", topic, "-", "--batch", "100", stdin=lines, brokers=brokers)
    assert out.stdout.startswith(f"sent 250 messages to {topic} in 3 batches")
    assert out.stderr == ""  # no progress bar: stderr is not a terminal

    ndjson = tmp_path / "m.ndjson"
    ndjson.write_text(
        json.dumps({"body": "aGk=", "encoding": "base64", "key": "nd"})
        + "\n"
        + json.dumps({"body": "plain", "properties": {"p": "1"}})
        + "\n"
    )
    out = ledgermq("produce", topic, "--file", str(ndjson), "--ndjson", "--json", brokers=brokers)
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [sorted(r) for r in results] == [["msg_id", "queue_id", "queue_offset"]] * 2

    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"body": "ok"}\n[1, 2]\n')
    p = ledgermq("produce", topic, "--file", str(bad), "--ndjson", rc=1, brokers=brokers)
    assert "line 2" in one_error_line(p)

    with Admin(brokers) as admin:
        total = sum(q.max_offset for q in admin.describe_topic(topic).queues)
        found = admin.query_by_key(topic, "nd")
    assert total == 2 + 250 + 2
    assert [m.body for m in found] == [b"hi"]


def test_consume_with_a_group_commits_and_group_lag_shows_it(brokers: str) -> None:
    topic, group = "cli-c", "cli-g"
    with Producer(brokers) as p:
        p.send(topic, [f"c{i:02}" for i in range(12)] + ["multi\nline"])
    first = ledgermq("consume", topic, "-g", group, "--max", "5", brokers=brokers).stdout
    rest = ledgermq("consume", topic, "--idle", "0.5", consumer_group=group, brokers=brokers).stdout
    rows = [line.split("\t") for line in (first + rest).splitlines()]
    assert len(first.splitlines()) == 5
    assert all(len(r) == 4 for r in rows)  # queue, offset, key, body: one line each
    assert sorted(r[3] for r in rows) == sorted([f"c{i:02}" for i in range(12)] + ["multi\\nline"])

    lag = ledgermq("group", "lag", group, "--topic", topic, brokers=brokers).stdout.splitlines()
    assert lag[0] == f"group {group}"
    assert lag[1].split() == ["TOPIC", "QUEUE", "COMMITTED", "MAX", "LAG"]
    assert lag[-1].split() == ["TOTAL", "0"]
    assert group in ledgermq("group", "list", brokers=brokers).stdout.split()

    # Without a group: from the earliest, nothing committed, JSON lines.
    out = ledgermq("consume", topic, "--from", "earliest", "--json", "--max", "3", brokers=brokers)
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(msgs) == 3 and all(m["topic"] == topic and m["encoding"] == "utf-8" for m in msgs)


def test_a_pop_group_configured_consumed_and_shown(brokers: str) -> None:
    topic, group = "cli-pop", "cli-pop-g"
    with Admin(brokers) as admin:
        admin.create_topic(topic, 2)
    out = ledgermq(
        "group", "config", group, "--start", "earliest", "--max-delivery-attempts", "3",
        "--retry-list", "0,500", "--json", brokers=brokers,
    ).stdout  # fmt: skip
    assert json.loads(out) == {
        "group": group,
        "mode": "pop",
        "fifo": False,
        "max_delivery_attempts": 3,
        "retry": {"policy": "list", "delays_ms": [0, 500]},
        "start": "earliest",
        "topics": [],
        "redrive_next_offset": 0,
    }
    with Producer(brokers) as p:
        p.send(topic, [f"p{i}" for i in range(6)])
    out = ledgermq("consume", topic, "-g", group, "--pop", "--max", "4", "--json", brokers=brokers)
    first = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(first) == 4 and {m["delivery_attempt"] for m in first} == {1}
    rest = ledgermq(
        "consume", topic, "--pop", "--idle", "0.5", consumer_group=group, brokers=brokers
    )
    rows = [line.split("\t") for line in rest.stdout.splitlines()]
    assert sorted([m["body"] for m in first] + [r[3] for r in rows]) == [f"p{i}" for i in range(6)]

    shown = ledgermq("group", "show", group, brokers=brokers).stdout.splitlines()
    assert shown[0].startswith(f"group {group}: mode pop, fifo false, max delivery attempts 3")
    assert shown[1].split() == ["retry:", "list", "0,500"]
    rows = [r.split() for r in shown]
    header = rows.index(["TOPIC", "QUEUE", "NEXT", "IN_FLIGHT", "MAX", "LAG"])
    queues = rows[header + 1 :]
    assert sum(int(q[2]) for q in queues) == 6 and {(q[3], q[5]) for q in queues} == {("0", "0")}
    assert (
        ledgermq("dlq", "show", group, brokers=brokers).stdout
        == f"group {group}: no dead letters\n"
    )
    # A consumer dead-letters a message; the CLI produces it back, once.
    with Producer(brokers) as p:
        p.send(topic, ["poison"])
    with PopConsumer(brokers, group, topic) as c:
        [m] = c.receive(wait_ms=5000)
        assert [r.status for r in c.dead_letter([m])] == ["OK"]
    assert "poison" in ledgermq("dlq", "show", group, brokers=brokers).stdout
    out = ledgermq("dlq", "redrive", group, "--json", brokers=brokers).stdout
    assert json.loads(out) == {"redriven": 1, "skipped": 0, "next_offset": 1}
    out = ledgermq("dlq", "redrive", group, brokers=brokers).stdout
    assert out == f"group {group}: no dead letters to redrive (next offset 1)\n"
    with PopConsumer(brokers, group, topic) as c:
        [again] = c.receive(wait_ms=5000)
        assert again.body == b"poison" and again.delivery_attempt == 1
        c.ack([again])
    # A group that committed offsets is no POP group.
    ledgermq("consume", topic, "-g", "cli-offsets-g", "--max", "1", brokers=brokers)
    err = one_error_line(ledgermq("group", "config", "cli-offsets-g", rc=1, brokers=brokers))
    assert "GROUP_MODE_CONFLICT" in err


def test_consume_follow_until_ctrl_c_commits_what_it_printed(brokers: str) -> None:
    topic, group = "cli-f", "cli-fg"
    with Producer(brokers) as p:
        p.send(topic, ["before"])
    with subprocess.Popen(
        [str(LEDGERMQ), "consume", topic, "-g", group, "--follow", "--wait-ms", "500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(brokers=brokers),
    ) as proc:
        try:
            assert read_line(proc, 20).endswith("\tbefore")
            with Producer(brokers) as p:
                p.send(topic, ["after"])
            assert read_line(proc, 20).endswith("\tafter")  # a long poll woke up for it
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
            assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    with Admin(brokers) as admin:
        assert sum(o.lag for o in admin.group_offsets(group, topic)) == 0


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output within {timeout_s} s"
    return proc.stdout.readline().rstrip("\n")


def test_status_shows_every_node_and_a_down_one(brokers: str, cluster3: LocalBrokerCluster) -> None:
    master = cluster3.wait_ready(timeout_s=30)
    out = ledgermq("status", "--brokers", f"{brokers},{DEAD}").stdout.splitlines()
    header = out[0].split()
    assert header == [
        "NODE",
        "URL",
        "RAFT",
        "BROKER",
        "TERM",
        "LEADER",
        "END",
        "COMMITTED",
        "DISPATCHED",
        "LAG",
        "NOTE",
    ]
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert set(rows) == {*cluster3.ids, "-"}
    assert rows[master][2:4] == ["LEADER", "MASTER"]
    assert all(rows[n][5] == master for n in cluster3.ids)
    assert rows["-"][1:3] == [DEAD, "DOWN"] and "BROKER_UNAVAILABLE" in out[-1]
    parsed = [
        json.loads(line)
        for line in ledgermq("status", "--json", brokers=brokers).stdout.splitlines()
    ]
    assert [(d["node_id"], d["up"]) for d in parsed] == [(n, True) for n in cluster3.ids]
    p = ledgermq("status", "--brokers", DEAD, rc=1)
    assert "DOWN" in p.stdout
    assert ledgermq("status", "--master", brokers=brokers).stdout == f"{master}\n"
    p = ledgermq("status", "--master", "--brokers", DEAD, rc=1)
    assert p.stdout == "" and one_error_line(p) == "no node is MASTER"


def test_leader_transfer(brokers: str, cluster3: LocalBrokerCluster) -> None:
    master = cluster3.wait_ready(timeout_s=30)
    target = next(n for n in cluster3.ids if n != master)
    out = ledgermq("leader", "transfer", "--to", target, brokers=brokers).stdout
    assert out.startswith(f"leader: {target} (term ")
    assert cluster3.wait_ready(timeout_s=30) == target
    p = ledgermq("leader", "transfer", "--to", "n9", rc=1, brokers=brokers)
    assert "n9" in one_error_line(p)


def test_delay_messages_and_transactions_by_hand(brokers: str) -> None:
    topic = "cli-later"
    with Admin(brokers) as admin:
        admin.create_topic(topic, 1)
    out = ledgermq("produce", topic, "soon", "--delay-ms", "300", brokers=brokers).stdout
    kind, deliver_at, _msg_id, handle = out.strip().split("\t")
    assert kind == "delayed" and int(deliver_at) > 0 and handle.startswith("t1:")
    with TransactionProducer(brokers, "cli-pg") as p:
        kept = p.begin(topic, ["kept"]).transaction_id
        dropped = p.begin(topic, ["dropped"]).transaction_id
    listed = ledgermq("tx", "list", "--producer-group", "cli-pg", "--json", brokers=brokers)
    assert [json.loads(line)["transaction_id"] for line in listed.stdout.splitlines()] == [
        kept,
        dropped,
    ]
    out = ledgermq("tx", "commit", kept, brokers=brokers).stdout
    assert out == f"transaction {kept}: committed\n"
    ledgermq("tx", "rollback", dropped, brokers=brokers)
    err = one_error_line(ledgermq("tx", "commit", dropped, rc=1, brokers=brokers))
    assert "TRANSACTION_RESOLVED" in err
    assert ledgermq("tx", "list", brokers=brokers).stdout == "no unresolved transactions\n"
    with Consumer(brokers, group="cli-later-g", topic=topic) as c:
        got: list[str] = []
        for _ in range(50):  # bounded: the delay message comes within its 300 ms
            got += [m.body.decode() for m in c.poll(wait_ms=500)]
            if len(got) >= 2:
                break
    assert sorted(got) == ["kept", "soon"]
