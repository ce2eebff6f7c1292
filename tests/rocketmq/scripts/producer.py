"""Run by the official RocketMQ 5 Python client's interpreter (tests/rocketmq/client_env.py),
never imported by the suite: a Producer sends what stdin's JSON says, prints one JSON line.

stdin: {"endpoints": "h:p;h:p", "topics": [...], "mode": "sync"|"async",
        "messages": [{"topic", "body", "tag"?, "keys"?, "properties"?, "group"?,
                      "delivery_s"?}]}
stdout (last line): {"receipts": [{"message_id", "offset", "recall_handle"} | {"error"}],
                     "seconds": elapsed sending}
"""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer


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
                try:
                    out.append(receipt(producer.send(build(s))))
                except Exception as e:
                    out.append({"error": f"{type(e).__name__}: {e}"})
        seconds = time.monotonic() - started
    finally:
        producer.shutdown()
    print(json.dumps({"receipts": out, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
