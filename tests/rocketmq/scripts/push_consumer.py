"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a PushConsumer scenario, one JSON line of what it saw.

stdin: {"endpoints", "group", "topic", "until": n, "fail": [bodies], "fail_all": bool,
"fail_always": [bodies],
"sleep_s": s, "max_s": s, "linger_s": s, "dead_url": url, "dead": n}

The listener records every delivery (message id, body, attempt, message group, time);
it answers FAILURE for a body in ``fail`` on its first delivery, for every delivery
with ``fail_all`` or of a body in ``fail_always``, after sleeping ``sleep_s``; SUCCESS
otherwise. The consumer runs until ``until`` deliveries were seen (or ``max_s``), then
``linger_s`` more (late duplicates would show), and with ``dead_url`` (a group's
``GET /v1/groups/{group}``) until the group counts ``dead`` dead letters (they are
written by a receive), then shuts down.
"""

import json
import sys
import threading
import time
import urllib.request

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
)


class Listener(MessageListener):
    def __init__(self, a):
        self.a = a
        self.lock = threading.Lock()
        self.deliveries = []
        self.failed = set()

    def consume(self, message):
        body = message.body.decode()
        if self.a.get("sleep_s"):
            time.sleep(self.a["sleep_s"])
        fail = (
            self.a.get("fail_all")
            or body in self.a.get("fail_always", [])
            or (body in self.a.get("fail", []) and body not in self.failed)
        )
        with self.lock:
            if fail:
                self.failed.add(body)
            self.deliveries.append(
                {
                    "message_id": message.message_id,
                    "body": body,
                    "attempt": message.delivery_attempt,
                    "message_group": message.message_group,
                    "corrupted": message.corrupted,
                    "result": "failure" if fail else "success",
                    "t": time.time(),
                }
            )
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def main():
    a = json.loads(sys.stdin.read())
    config = ClientConfiguration(a["endpoints"], Credentials(), request_timeout=5)
    listener = Listener(a)
    c = PushConsumer(config, a["group"], listener, {a["topic"]: FilterExpression()})
    started = time.monotonic()
    c.startup()
    report = {"startup_s": time.monotonic() - started}
    try:
        deadline = time.monotonic() + a.get("max_s", 60)
        while time.monotonic() < deadline:
            with listener.lock:
                if len(listener.deliveries) >= a["until"]:
                    break
            time.sleep(0.05)
        time.sleep(a.get("linger_s", 0))
        while a.get("dead_url") and time.monotonic() < deadline:
            with urllib.request.urlopen(a["dead_url"], timeout=5) as r:
                doc = json.loads(r.read())
            report["dead_lettered"] = sum(t["dead_lettered"] for t in doc["topics"])
            if report["dead_lettered"] >= a["dead"]:
                break
            time.sleep(0.1)
    finally:
        c.shutdown()
    with listener.lock:
        report["deliveries"] = list(listener.deliveries)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
