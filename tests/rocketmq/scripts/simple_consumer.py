"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a SimpleConsumer scenario, one JSON line of what it saw.

stdin: {"endpoints", "group", "topic", "expect": n, "invisible_s", "await_s"}

1. receive until ``expect`` messages came (or a deadline);
2. change the first one's invisible time to 1 s (its handle is replaced), then try to
   ack it with its old handle (refused);
3. ack all the others;
4. receive until the first comes again (its new invisible time ran out): its attempt;
   ack it;
5. one more receive: nothing is left.
"""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer


def seen(m):
    return {
        "message_id": m.message_id,
        "body": m.body.decode(),
        "tag": m.tag,
        "keys": sorted(m.keys),
        "properties": dict(m.properties),
        "message_group": m.message_group,
        "delivery_attempt": m.delivery_attempt,
        "corrupted": m.corrupted,
        "topic": m.topic,
    }


def main():
    a = json.loads(sys.stdin.read())
    config = ClientConfiguration(a["endpoints"], Credentials(), request_timeout=5)
    c = SimpleConsumer(
        config, a["group"], {a["topic"]: FilterExpression()}, await_duration=a["await_s"]
    )
    c.startup()
    report = {}
    try:
        got, deadline = [], time.monotonic() + 30
        while len(got) < a["expect"] and time.monotonic() < deadline:
            got.extend(c.receive(16, a["invisible_s"]))
        report["received"] = [seen(m) for m in got]
        first, rest = got[0], got[1:]
        old = first.receipt_handle
        c.change_invisible_duration(first, 1)
        report["handle_replaced"] = first.receipt_handle != old
        new = first.receipt_handle
        first.receipt_handle = old
        try:
            c.ack(first)
            report["old_handle_ack"] = "accepted"
        except Exception as e:
            report["old_handle_ack"] = f"refused: {type(e).__name__}: {e}"
        first.receipt_handle = new
        for m in rest:
            c.ack(m)
        again, deadline = [], time.monotonic() + 30
        while not again and time.monotonic() < deadline:
            again = [m for m in c.receive(16, a["invisible_s"]) if m.message_id == first.message_id]
        report["again"] = [seen(m) for m in again]
        for m in again:
            c.ack(m)
        report["left"] = [seen(m) for m in c.receive(16, a["invisible_s"])]
    finally:
        c.shutdown()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
