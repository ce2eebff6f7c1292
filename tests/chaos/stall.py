"""Stalls: stretches of a chaos run's load with no produce acknowledged while the
cluster should have taken writes.

A fault costs produce a few seconds (an election after a kill or a pause, a client
finding the new master), and the nemesis holds each fault for seconds. A stretch of
``STALL_S`` without one acknowledged produce is no fault's cost: the cluster stopped
taking writes (no master elected, a master that commits nothing). The run is then
INVALID, each stall named: when it began, how long it lasted, what the nodes said of
themselves meanwhile.

- ``stalls(ops, start_s, end_s, bound_s)`` is pure, over a history
  (``tests/chaos/history.py``): the gaps between acknowledged produces, from the load's
  start to its end, longer than ``bound_s``; the time a ``disk-full-master`` fault was
  on does not count (the master refuses writes then, by design: 507 ``DISK_FULL``).
- ``StallWatcher`` looks once a second while the load runs. After ``dump_after_s``
  without an acknowledgement, every node's ``/v1/cluster`` and ``/metrics`` go to
  ``logs/stall-<t>-<node>.txt`` (``t``: seconds into the load; again every
  ``dump_after_s`` while it lasts) and the nodes' roles are kept (``snapshots``). Once
  ``stalls`` finds the stall under way longer than ``bound_s``, ``on_stall`` runs, once
  (the run stops its schedule: it is INVALID already).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import httpx

from .history import History, Op

STALL_S = 60.0  # this long without an acknowledged produce: the run is INVALID
STALL_DUMP_S = 8.0  # this long: the nodes' state is saved (logs/stall-*)
REFUSING = ("disk-full-master",)  # fault kinds during which writes are refused by design
LOOK_S = 1.0

# A URL → its status (None: no answer) and its text (the body, or why no answer).
Fetch = Callable[[str], Awaitable[tuple[int | None, str]]]


@dataclass(frozen=True, slots=True)
class Stall:
    start_s: float  # the last acknowledgement before it (or the load's start)
    length_s: float  # to the next one (or the load's end)
    writable_s: float  # of which the cluster should have taken writes
    ended: bool  # an acknowledgement ended it (else it lasted to the load's end)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The nodes as one stall dump recorded them."""

    time_s: float
    roles: dict[str, str]  # node → "LEADER/MASTER term 3 leader n1", or why none
    files: str  # the dump's files, relative to the run's workdir


def _acks(ops: Sequence[Op], start_s: float, end_s: float) -> list[float]:
    return sorted(
        op.time_s
        for op in ops
        if op.f == "send" and op.type == "ok" and start_s < op.time_s < end_s
    )


def refusing_windows(ops: Sequence[Op], end_s: float) -> list[tuple[float, float]]:
    """The (fault, heal) times of each fault of a ``REFUSING`` kind (to ``end_s`` if it
    was not healed)."""
    out, since = [], None
    for op in ops:
        if op.process != "nemesis" or op.value is None or op.value.get("kind") not in REFUSING:
            continue
        if op.f == "fault" and since is None:
            since = op.time_s
        elif op.f == "heal" and since is not None:
            out.append((since, op.time_s))
            since = None
    if since is not None:
        out.append((since, end_s))
    return out


def stalls(
    ops: Sequence[Op], start_s: float, end_s: float, bound_s: float = STALL_S
) -> list[Stall]:
    """Each stretch of ``[start_s, end_s]`` between acknowledged produces in which the
    cluster should have taken writes for longer than ``bound_s``."""
    refusing = refusing_windows(ops, end_s)
    marks = [start_s, *_acks(ops, start_s, end_s), end_s]
    out = []
    for i, (a, b) in enumerate(pairwise(marks)):
        refused = sum(max(0.0, min(b, y) - max(a, x)) for x, y in refusing)
        if b - a - refused > bound_s:
            out.append(Stall(a, b - a, b - a - refused, ended=i + 2 < len(marks)))
    return out


def describe(stall: Stall, snapshots: Sequence[Snapshot], load_start_s: float,
             wall_start: float, bound_s: float = STALL_S) -> str:  # fmt: skip
    """One line for the report: when, how long, and the nodes' roles as the last stall
    dump within it recorded them."""
    into = stall.start_s - load_start_s
    at = time.strftime("%H:%M:%S", time.localtime(wall_start + into))
    how = "until the load ended" if not stall.ended else "until the next one"
    line = (
        f"no produce acknowledged for {stall.length_s:.1f} s from {at} ({into:+.1f} s into "
        f"the load), {how}; {stall.writable_s:.1f} s of it writable (bound {bound_s:g} s)"
    )
    within = [s for s in snapshots if stall.start_s <= s.time_s <= stall.start_s + stall.length_s]
    if not within:
        return line + "; no dump of the nodes' state"
    last = within[-1]
    roles = ", ".join(f"{n} {r}" for n, r in sorted(last.roles.items()))
    return (
        f"{line}; the nodes at {last.time_s - load_start_s:+.1f} s: {roles} "
        f"({len(within)} dumps, the last {last.files})"
    )


def role(status: int | None, text: str, state: str | None = None) -> str:
    """A node's role from its ``/v1/cluster`` answer, or why there is none; ``state``
    is what the run knows of its process ("paused", "not running")."""
    if status is None:
        said = f"no answer ({text[:80]})"
    elif status != 200:
        said = f"HTTP {status}"
    else:
        try:
            d = json.loads(text)
            said = (
                f"{d['raft_role']}/{d['broker_role']} term {d['term']} "
                f"leader {d.get('leader_id') or '-'}"
            )
        except (ValueError, KeyError, TypeError):
            said = "an unreadable /v1/cluster"
    return f"{said} ({state})" if state else said


class StallWatcher:
    """Watches ``history`` for a stall while the load runs (see the module)."""

    def __init__(self, history: History, urls: Mapping[str, str], log_dir: Path, *,
                 start_s: float, fetch: Fetch,
                 node_state: Callable[[str], str | None] = lambda _n: None,
                 on_stall: Callable[[Stall], None] = lambda _s: None,
                 say: Callable[[str], None] = lambda _s: None, bound_s: float = STALL_S,
                 dump_after_s: float = STALL_DUMP_S) -> None:  # fmt: skip
        self.h = history
        self.urls = dict(urls)
        self.log_dir = log_dir
        self.start_s = start_s
        self.fetch = fetch
        self.node_state = node_state
        self.on_stall = on_stall
        self.say = say
        self.bound_s = bound_s
        self.dump_after_s = dump_after_s
        self.snapshots: list[Snapshot] = []
        self.flagged: Stall | None = None  # the stall that made the run INVALID, once
        self._last_dump_s = float("-inf")

    def _last_ack_s(self) -> float:
        for op in reversed(self.h.ops):  # the newest first: an ack is usually near the end
            if op.time_s <= self.start_s:
                break
            if op.f == "send" and op.type == "ok":
                return op.time_s
        return self.start_s

    async def look(self) -> None:
        """One look: a dump if one is due; ``on_stall`` if the stall passed its bound."""
        now = self.h.clock()
        gap_s = now - self._last_ack_s()
        if gap_s >= self.dump_after_s and now - self._last_dump_s >= self.dump_after_s:
            self._last_dump_s = now
            await self._dump(now)
            self.say(f"no produce acknowledged for {gap_s:.0f} s: nodes' state in logs/stall-*")
        if gap_s > self.bound_s and self.flagged is None:
            found = stalls(self.h.ops, self.start_s, now, self.bound_s)
            if found and not found[-1].ended:
                self.flagged = found[-1]
                self.say(f"STALL: no produce acknowledged for {gap_s:.0f} s: the run is INVALID")
                self.on_stall(found[-1])

    async def _dump(self, now: float) -> None:
        """Every node's answers, asked all at once (a paused node takes its timeout)."""
        into = now - self.start_s
        nodes, paths = sorted(self.urls), ("/v1/cluster", "/metrics")
        answers = await asyncio.gather(
            *(self.fetch(self.urls[n] + p) for n in nodes for p in paths)
        )
        roles = {}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, node in enumerate(nodes):
            mine = answers[i * len(paths) : (i + 1) * len(paths)]
            roles[node] = role(*mine[0], self.node_state(node))
            texts = [
                t if status is not None else f"{p}: {t}"
                for p, (status, t) in zip(paths, mine, strict=True)
            ]
            head = f"# {node} {into:+.1f} s into the load: {roles[node]}\n"
            (self.log_dir / f"stall-{into:.0f}-{node}.txt").write_text(head + "\n".join(texts))
        self.snapshots.append(Snapshot(now, roles, f"{self.log_dir.name}/stall-{into:.0f}-*.txt"))

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Look every ``LOOK_S`` until ``stopping()`` (the load's end)."""
        while not stopping():  # bounded by the load, which is bounded by its deadline
            await asyncio.sleep(LOOK_S)
            await self.look()


def http_fetch(client: httpx.AsyncClient) -> Fetch:
    async def fetch(url: str) -> tuple[int | None, str]:
        try:
            r = await client.get(url)
        except httpx.HTTPError as e:
            return None, repr(e)
        return r.status_code, r.text

    return fetch
