"""Run by the official RocketMQ 5 Python client's interpreter (``bench/grpc_bench.py``
starts it from the venv of ``tests/rocketmq/client_env.py``), never imported: a
Producer (``sync``: ``send`` in a loop; ``async``: ``send_async`` with ``inflight``
futures outstanding) or a PushConsumer (``push``) as fast as it goes.

stdin: {"endpoints", "topic", "mode", "seconds", "warmup", "inflight", "body_size",
        "group", "expect"}
stdout: ``START`` when the measured window begins, ``END`` when it ends (the bench
samples the master's CPU at both), then one JSON line: {"messages", "errors",
"seconds", "p50_ms", "p99_ms", "startup_s", "first_error"}. Progress on stderr.
"""

import json
import os
import sys
import threading
import time
from concurrent.futures import wait

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
)


def mark(word):
    print(word, flush=True)


def progress(mode, n, t0):
    dt = time.monotonic() - t0
    sys.stderr.write(f"\r  grpc {mode}: {n:,} messages, {n / dt if dt else 0:,.0f} msg/s   ")
    sys.stderr.flush()


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def produce(a, config):
    producer = Producer(config, (a["topic"],))
    t = time.monotonic()
    producer.startup()
    startup_s = time.monotonic() - t
    body = os.urandom(a["body_size"] // 2).hex().encode()[: a["body_size"]]
    lat, errors, first_error = [], 0, None
    lock = threading.Lock()

    def message():
        m = Message()
        m.topic = a["topic"]
        m.body = body
        return m

    def run(seconds, measured):
        nonlocal errors, first_error
        n, t0, shown = 0, time.monotonic(), time.monotonic()
        stop = t0 + seconds
        if a["mode"] == "sync":
            while time.monotonic() < stop:
                s = time.monotonic()
                try:
                    producer.send(message())
                    if measured:
                        lat.append(time.monotonic() - s)
                    n += 1
                except Exception as e:
                    errors += measured
                    first_error = first_error or f"{type(e).__name__}: {e}"
                if measured and time.monotonic() - shown > 1:
                    progress("sync", n, t0)
                    shown = time.monotonic()
        else:
            pending = set()
            while time.monotonic() < stop:
                while len(pending) < a["inflight"]:
                    s = time.monotonic()
                    f = producer.send_async(message())
                    f.started = s
                    pending.add(f)
                done, pending = wait(pending, timeout=1, return_when="FIRST_COMPLETED")
                for f in done:
                    try:
                        f.result()
                        with lock:
                            if measured:
                                lat.append(time.monotonic() - f.started)
                        n += 1
                    except Exception as e:
                        errors += measured
                        first_error = first_error or f"{type(e).__name__}: {e}"
                if measured and time.monotonic() - shown > 1:
                    progress("async", n, t0)
                    shown = time.monotonic()
            wait(pending, timeout=30)
            n += sum(1 for f in pending if f.done() and f.exception() is None)
        return n, time.monotonic() - t0

    try:
        run(a["warmup"], False)
        mark("START")
        n, seconds = run(a["seconds"], True)
        mark("END")
        sys.stderr.write("\n")
    finally:
        producer.shutdown()
    return {
        "messages": n,
        "errors": errors,
        "seconds": seconds,
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "startup_s": startup_s,
        "first_error": first_error,
    }


class Counter(MessageListener):
    def __init__(self):
        self.lock = threading.Lock()
        self.n = 0
        self.first = None
        self.last = None

    def consume(self, message):
        with self.lock:
            now = time.monotonic()
            if self.first is None:
                self.first = now
                mark("START")
            self.n += 1
            self.last = now
        return ConsumeResult.SUCCESS


def push(a, config):
    listener = Counter()
    c = PushConsumer(config, a["group"], listener, {a["topic"]: FilterExpression()})
    t = time.monotonic()
    c.startup()
    startup_s = time.monotonic() - t
    deadline = time.monotonic() + a["seconds"]
    shown = time.monotonic()
    try:
        while time.monotonic() < deadline:
            with listener.lock:
                n = listener.n
            if n >= a["expect"]:
                break
            if listener.first is not None and time.monotonic() - shown > 1:
                progress("push", n, listener.first)
                shown = time.monotonic()
            time.sleep(0.02)
        mark("END")
        sys.stderr.write("\n")
    finally:
        c.shutdown()
    first, last = listener.first, listener.last
    return {
        "messages": listener.n,
        "errors": 0,
        "seconds": (last - first) if first is not None and last is not None else None,
        "p50_ms": None,
        "p99_ms": None,
        "startup_s": startup_s,
        "first_error": None,
    }


def main():
    a = json.loads(sys.stdin.read())
    config = ClientConfiguration(a["endpoints"], Credentials(), request_timeout=10)
    out = push(a, config) if a["mode"] == "push" else produce(a, config)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
