"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a Producer sends what stdin's JSON says, prints one JSON line.

stdin: {"endpoints": "h:p;h:p", "topics": [...], "mode": "sync"|"async",
        "messages": [{"topic", "body", "tag"?, "keys"?, "properties"?, "group"?,
                      "delivery_s"?, "message_id"?}],
        "recall": [recall handles]?}

A "message_id" is the id the client gives the message instead of a new one (its id
generator patched for that send, sync only): what a resend after a timeout looks like.
"recall": RecallMessage of each handle after the sends (in the first of "topics").
stdout (last line): {"receipts": [{"message_id", "offset", "recall_handle"} | {"error"}],
                     "seconds": elapsed sending, "recalled": [message id | {"error"}]}
"""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.v5.util import MessageIdCodec

NEW_ID = MessageIdCodec.next_message_id


def given_id(message_id):
    """The client's id generator, answering ``message_id`` (None: its own ids)."""
    if message_id is None:
        MessageIdCodec.next_message_id = NEW_ID
    else:
        MessageIdCodec.next_message_id = lambda self: message_id


def build(spec):
    m = Message()
    m.topic = spec["topic"]
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    if spec.get("keys"):
        m.keys = spec["keys"][0]
        for k in spec["keys"][1:]:
            m.keys = k
    for k, v in (spec.get("properties") or {}).items():
        m.add_property(k, v)
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("delivery_s"):
        m.delivery_timestamp = spec["delivery_s"]
    return m


def receipt(r):
    return {"message_id": r.message_id, "offset": r.offset, "recall_handle": r.recall_handle}


def main():
    args = json.loads(sys.stdin.read())
    config = ClientConfiguration(
        args["endpoints"], Credentials(), request_timeout=args.get("timeout_s", 5)
    )
    producer = Producer(config, tuple(args["topics"]))
    producer.startup()
    out = []
    recalled = []
    started = time.monotonic()
    try:
        if args.get("mode") == "async":
            futures = [producer.send_async(build(s)) for s in args["messages"]]
            for f in futures:
                try:
                    out.append(receipt(f.result(timeout=30)))
                except Exception as e:
                    out.append({"error": f"{type(e).__name__}: {e}"})
        else:
            for s in args["messages"]:
                given_id(s.get("message_id"))
                try:
                    out.append(receipt(producer.send(build(s))))
                except Exception as e:
                    out.append({"error": f"{type(e).__name__}: {e}"})
                finally:
                    given_id(None)
        seconds = time.monotonic() - started
        for handle in args.get("recall") or ():
            try:
                recalled.append(producer.recall_message(args["topics"][0], handle))
            except Exception as e:
                recalled.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        producer.shutdown()
    print(json.dumps({"receipts": out, "seconds": seconds, "recalled": recalled}), flush=True)


if __name__ == "__main__":
    main()
