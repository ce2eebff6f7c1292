"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a transactional Producer, one JSON line of what it did.

stdin: {"endpoints", "http", "topic",
        "transactions": [{"body", "end": "commit"|"rollback"|"open"}],
        "checker": {body: "commit"|"rollback"}, "wait_checks_s"}

Each transaction holds one message; "open" ones are neither committed nor rolled back:
the server's check asks this producer's checker, which answers as "checker" says (and
"unknown" for a body it does not list). The script waits until every open transaction
was checked and none of the topic's is pending any more (asked of LedgerMQ's HTTP API at
``http``), or ``wait_checks_s``: the producer answers a check with an asynchronous
EndTransaction, which must reach the server before the producer shuts down.
stdout (last line): {"sent": [{"message_id", "transaction_id", "end"} | {"error"}],
                     "checked": [{"message_id", "body", "topic", "answer"}]}
"""

import json
import sys
import threading
import time
import urllib.parse
import urllib.request

from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)

ANSWERS = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK}


class Checker(TransactionChecker):
    def __init__(self, answers):
        self.answers = answers
        self.checked = []
        self.lock = threading.Lock()

    def check(self, message):
        body = message.body.decode()
        answer = self.answers.get(body, "unknown")
        with self.lock:
            self.checked.append(
                {
                    "message_id": message.message_id,
                    "body": body,
                    "topic": message.topic,
                    "answer": answer,
                }
            )
        return ANSWERS.get(answer, TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)


def pending(http, topic):
    query = urllib.parse.urlencode({"producer_group": topic})
    with urllib.request.urlopen(f"{http}/v1/transactions?{query}", timeout=5) as r:
        return json.loads(r.read())["transactions"]


def main():
    args = json.loads(sys.stdin.read())
    config = ClientConfiguration(args["endpoints"], Credentials(), request_timeout=5)
    checker = Checker(args.get("checker") or {})
    producer = Producer(config, (args["topic"],), checker)
    producer.startup()
    sent = []
    try:
        for spec in args["transactions"]:
            try:
                tx = producer.begin_transaction()
                m = Message()
                m.topic = args["topic"]
                m.body = spec["body"].encode()
                receipt = producer.send(m, tx)
                if spec["end"] == "commit":
                    tx.commit()
                elif spec["end"] == "rollback":
                    tx.rollback()
                sent.append(
                    {
                        "message_id": receipt.message_id,
                        "transaction_id": receipt.transaction_id,
                        "end": spec["end"],
                    }
                )
            except Exception as e:
                sent.append({"error": f"{type(e).__name__}: {e}"})
        open_bodies = {s["body"] for s in args["transactions"] if s["end"] == "open"}
        deadline = time.monotonic() + args.get("wait_checks_s", 30)
        while time.monotonic() < deadline:  # bounded: until every open one was resolved
            with checker.lock:
                seen = {c["body"] for c in checker.checked}
            if open_bodies <= seen and not pending(args["http"], args["topic"]):
                break
            time.sleep(0.1)
    finally:
        producer.shutdown()
    with checker.lock:
        checked = list(checker.checked)
    print(json.dumps({"sent": sent, "checked": checked}), flush=True)


if __name__ == "__main__":
    main()
