"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a Producer or a SimpleConsumer with the given credentials,
one JSON line of what happened.

stdin: {"endpoints", "ak"?, "sk"?, "tls"?, "ca_file"?, "op": "send"|"receive", "topic",
        "bodies": [...] (send), "group", "expect", "await_s" (receive)}
stdout (last line): {"sent": [message ids]} | {"received": [bodies]} (acked) |
                    {"error": "Type: text", "stage": "startup"|"send"|"receive"}
"""

import json
import os
import sys
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)


def failed(stage, e):
    return {"error": f"{type(e).__name__}: {e}", "stage": stage}


def send(a, config):
    producer = Producer(config, (a["topic"],), tls_enable=a.get("tls", False))
    try:
        producer.startup()
    except Exception as e:
        return failed("startup", e)
    try:
        sent = []
        for body in a["bodies"]:
            m = Message()
            m.topic = a["topic"]
            m.body = body.encode()
            try:
                sent.append(producer.send(m).message_id)
            except Exception as e:
                return {**failed("send", e), "sent": sent}
        return {"sent": sent}
    finally:
        producer.shutdown()


def receive(a, config):
    c = SimpleConsumer(
        config,
        a["group"],
        {a["topic"]: FilterExpression()},
        await_duration=a["await_s"],
        tls_enable=a.get("tls", False),
    )
    try:
        c.startup()
    except Exception as e:
        return failed("startup", e)
    try:
        got, deadline = [], time.monotonic() + 20
        while len(got) < a["expect"] and time.monotonic() < deadline:
            try:
                messages = c.receive(16, 30)
            except Exception as e:
                return {**failed("receive", e), "received": got}
            for m in messages:
                c.ack(m)
                got.append(m.body.decode())
        return {"received": got}
    finally:
        c.shutdown()


def main():
    a = json.loads(sys.stdin.read())
    if a.get("ca_file"):  # the roots gRPC trusts (its client takes the system's)
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = a["ca_file"]
    credentials = Credentials(a["ak"], a["sk"]) if a.get("ak") else Credentials()
    config = ClientConfiguration(a["endpoints"], credentials, request_timeout=5)
    out = send(a, config) if a["op"] == "send" else receive(a, config)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
