"""Leadership transfers that go wrong, as a client sees them (issue 26).

Three ``python -m ledgermq`` processes (``ledgermq.local_cluster.LocalBrokerCluster``,
127.0.0.1, the default timers) and one writer thread of this process
(``ledgermq.client.Producer``, one message per request, back to back, under a producer
session). Each trial asks the
master to hand leadership to a slave (``POST /v1/cluster/leadership``) and, by kind:

- ``healthy``: nothing else;
- ``killed``: SIGKILL of the target ``--fault-delay-ms`` after the request (the issue's
  reproduction: it dies before or just after it campaigns); restarted after the trial;
- ``paused``: SIGSTOP of the target as ``killed`` does (silent: no connection closes);
  SIGCONT after the trial;
- ``restarted``: the target is killed and started again, and the request is sent as
  soon as its HTTP port answers (it has not heard from the leader yet, or just has).

Per trial: the answer (HTTP status and, on a failure, its ``reason``) and its time,
``ack_ms`` (from the request to the writer's first acknowledged produce after the answer)
and ``pause_ms`` (the longest gap between two acknowledged produces from just before the
request to that ack: how long writes stopped). Before the next trial every node runs and
has caught up. The trial logic is shared with ``tests/process/test_transfer_faults.py``.

    .venv/bin/python bench/transfer_bench.py --trials 20          # ~5 min
    .venv/bin/python bench/transfer_bench.py --kinds killed,paused --trials 5
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from peerbench.procs import wait_until

from ledgermq.client import ClientSettings, LedgerMQError, Producer
from ledgermq.local_cluster import LocalBrokerCluster

KINDS = ("healthy", "killed", "paused", "restarted")
TOPIC = "xfer"
ACK_BOUND_S = 10.0  # a trial fails when no produce is acknowledged this long after the answer
ANSWER_BOUND_S = 15.0  # the transfer endpoint must answer within this
READY_BOUND_S = 60.0  # every node running and caught up between trials
POLL_S = 0.005


@dataclass
class Trial:
    kind: str
    master: str
    target: str
    status: int  # the transfer's HTTP status (0: no answer)
    reason: str  # TRANSFER_FAILED's reason, the error code, or "" on success
    answer_ms: float  # from the request to its answer
    ack_ms: float  # from the request to the first produce acknowledged after the answer
    pause_ms: float  # the longest gap between acknowledged produces around the transfer
    leader_after: str | None  # who leads once the produce was acknowledged


class Writer:
    """One producer thread, single messages back to back; each ack's monotonic time."""

    def __init__(self, brokers: str, settings: ClientSettings | None = None) -> None:
        self.settings = settings or ClientSettings(timeout_s=5.0, deadline_s=30.0)
        self.brokers = brokers
        self.acks: list[float] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="transfer-writer", daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def _run(self) -> None:
        with Producer(self.brokers, settings=self.settings) as p:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    p.send(TOPIC, [{"body": f"m{n}"}])
                except LedgerMQError as e:  # gave up within its deadline: say so, go on
                    with self.lock:
                        self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                with self.lock:
                    self.acks.append(time.monotonic())

    def first_ack_after(self, t: float) -> float | None:
        with self.lock:
            i = bisect.bisect_right(self.acks, t)  # acks are in time order
            return self.acks[i] if i < len(self.acks) else None

    def longest_gap(self, since: float, until: float) -> float:
        """The longest gap between consecutive acks that overlaps [since, until]."""
        with self.lock:
            acks = list(self.acks)
        prev = max((a for a in acks if a <= since), default=since)
        gap = 0.0
        for a in acks:
            if a <= prev:
                continue
            if a > until:
                break
            gap, prev = max(gap, a - prev), a
        return gap


def _wait(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    return wait_until(cond, timeout_s, what, POLL_S)


def caught_up(c: LocalBrokerCluster, timeout_s: float = READY_BOUND_S) -> str:
    """Every node runs, one is MASTER and every node dispatched what it had committed."""
    master = c.wait_ready(timeout_s=timeout_s)
    target = (c.cluster_info(master) or {}).get("committed_index", 0)
    for n in c.ids:
        _wait(
            lambda n=n: (c.cluster_info(n) or {}).get("dispatched_index", -1) >= target,
            timeout_s,
            f"{n} catches up to {target}",
        )
    return master


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run_trial(
    c: LocalBrokerCluster,
    w: Writer,
    kind: str,
    rng: random.Random,
    *,
    fault_delay_ms: float = 20.0,
) -> Trial:
    """One transfer of ``kind`` (see the module docstring); restores the cluster after."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: want one of {KINDS}")
    master = caught_up(c)
    _wait(lambda: w.first_ack_after(time.monotonic() - 0.5), ACK_BOUND_S, "the writer writes")
    target = rng.choice([n for n in c.ids if n != master])
    if kind == "restarted":
        c.kill(target)
        c.start(target)
        _wait(lambda: _answers(c.urls[target]), READY_BOUND_S, f"{target} answers again")
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            r = httpx.post(
                c.urls[master] + "/v1/cluster/leadership",
                json={"to": target},
                timeout=ANSWER_BOUND_S,
            )
            answer["status"] = r.status_code
            answer["body"] = r.json() if r.content else {}
        except (httpx.HTTPError, ValueError) as e:
            answer["status"], answer["body"] = 0, {"error": {"code": type(e).__name__}}
        answer["at"] = time.monotonic()

    t0 = time.monotonic()
    asker = threading.Thread(target=ask, name="transfer-ask", daemon=True)
    asker.start()
    if kind in ("killed", "paused"):
        time.sleep(fault_delay_ms / 1000)  # the fault's moment is the point of the trial
        os.kill(c.procs[target].pid, signal.SIGKILL if kind == "killed" else signal.SIGSTOP)
    try:
        asker.join(ANSWER_BOUND_S + 5)
        if asker.is_alive() or "at" not in answer:
            raise TimeoutError(f"the transfer to {target} got no answer in {ANSWER_BOUND_S} s")
        acked = _wait(
            lambda: w.first_ack_after(answer["at"]), ACK_BOUND_S, "a produce after the transfer"
        )
    finally:
        if kind == "paused" and c.alive(target):
            os.kill(c.procs[target].pid, signal.SIGCONT)
        elif kind == "killed":
            c.procs[target].wait(timeout=30)
            c.start(target)
    body = answer["body"]
    err = body.get("error", {}) if isinstance(body, dict) else {}
    leader = c.master()
    return Trial(
        kind=kind,
        master=master,
        target=target,
        status=answer["status"],
        reason=str(err.get("reason") or err.get("code") or ""),
        answer_ms=(answer["at"] - t0) * 1000,
        ack_ms=(acked - t0) * 1000,
        pause_ms=w.longest_gap(t0, acked) * 1000,
        leader_after=leader,
    )


def summarize(trials: Sequence[Trial]) -> list[str]:
    lines = []
    for kind in KINDS:
        ts = [t for t in trials if t.kind == kind]
        if not ts:
            continue
        outcomes: dict[str, int] = {}
        for t in ts:
            o = "moved" if t.status == 200 else f"{t.status} {t.reason}".strip()
            outcomes[o] = outcomes.get(o, 0) + 1
        pauses = sorted(t.pause_ms for t in ts)
        answers = sorted(t.answer_ms for t in ts)
        lines.append(
            f"{kind:<10} n={len(ts):<3} pause ms min/median/max "
            f"{pauses[0]:7.1f} {statistics.median(pauses):7.1f} {pauses[-1]:7.1f}   "
            f"answer ms median/max {statistics.median(answers):7.1f} {answers[-1]:7.1f}   "
            f"{outcomes}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="per kind (default 10)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ",".join(KINDS))
    ap.add_argument("--fault-delay-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--json", type=Path, help="also write every trial here")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix="ledgermq-transfer-"))
    trials: list[Trial] = []
    try:
        with LocalBrokerCluster(3, root, extra_args=("--log-level", "INFO")) as c:
            c.start_all()
            master = c.wait_ready(timeout_s=READY_BOUND_S)
            r = httpx.post(c.urls[master] + "/v1/topics", json={"name": TOPIC, "queues": 4})
            assert r.status_code in (200, 201), r.text
            with Writer(c.brokers) as w:
                order = [k for _ in range(a.trials) for k in kinds]
                for i, kind in enumerate(order, 1):
                    t = run_trial(c, w, kind, rng, fault_delay_ms=a.fault_delay_ms)
                    trials.append(t)
                    print(
                        f"[{i}/{len(order)}] {t.kind:<9} {t.master}->{t.target} "
                        f"status={t.status} {t.reason:<22} answer={t.answer_ms:7.1f} ms "
                        f"ack={t.ack_ms:7.1f} ms pause={t.pause_ms:7.1f} ms "
                        f"leader={t.leader_after}",
                        flush=True,
                    )
                print(f"writer: {len(w.acks)} acks, {len(w.errors)} gave up", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    for line in summarize(trials):
        print(line)
    if a.json:
        a.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
