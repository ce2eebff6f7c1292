"""What the failover demo shows while it runs: the cluster as polled, and the story.

- ``Monitor`` asks every node for ``GET /v1/cluster`` every ``interval_s`` (each node
  through its own ``AsyncAdmin`` holding only its URL: one try, short timeouts, so a
  dead node costs one connect timeout, never a retry loop) and keeps the last answer
  per node. It tells what changed — a node stops answering or answers again (and, if
  asked, when such a node has caught up), a leader is elected for a new term, a node
  becomes MASTER — and lets the story wait for a condition on the rows, bounded by a
  timeout.
- Two views of the same state: ``LiveView`` (a ``rich`` table redrawn in place, the
  story's latest lines beneath) when stdout is a terminal, ``PlainView`` (one line per
  event and a status line every few seconds) when it is not — a pipe, a CI log, a
  compose log. The story prints its accounting after ``close``.

A node's *lag* is the highest committed index any node reports minus the node's own
dispatched index: how many committed entries it has yet to serve to consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, TextIO, TypeVar

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..client import AsyncAdmin, ClientSettings, ClusterStatus, LedgerMQError

T = TypeVar("T")
EVENTS_SHOWN = 12  # lines of the story under the live table


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node as last polled; ``note`` is what the story did to it ("killed")."""

    node_id: str
    url: str
    status: ClusterStatus | None = None
    error: str | None = None
    note: str = ""
    # Asked at least once: the first answer (or silence) of a node is no news.
    polled: bool = False

    @property
    def up(self) -> bool:
        return self.status is not None

    @property
    def is_master(self) -> bool:
        return self.status is not None and self.status.broker_role == "MASTER"


class Monitor:
    """Polls every node; ``rows`` is the latest view, ``until`` waits on it."""

    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        interval_s: float = 0.2,
        settings: ClientSettings | None = None,
        on_event: Callable[[str], None] = lambda _line: None,
        report_catch_up: bool = False,
    ) -> None:
        self.interval_s = interval_s
        self.report_catch_up = report_catch_up
        # node → (when it answered again, the committed index then, entries behind)
        self._returning: dict[str, tuple[float, int, int]] = {}
        self.settings = settings or ClientSettings(
            timeout_s=1.0, connect_timeout_s=0.5, deadline_s=1.5, max_attempts=1
        )
        self.on_event = on_event
        self.rows = {n: NodeRow(n, u) for n, u in sorted(urls.items())}
        self._admins = {n: AsyncAdmin([u], settings=self.settings) for n, u in urls.items()}
        self._terms_seen: set[int] = set()
        self._changed = asyncio.Condition()
        self.polls = 0

    def note(self, node: str, text: str) -> None:
        self.rows[node] = replace(self.rows[node], note=text)

    def master(self) -> str | None:
        """The MASTER of the highest term among the answers, if any."""
        masters = [r for r in self.rows.values() if r.is_master and r.status is not None]
        if not masters:
            return None
        return max(masters, key=lambda r: r.status.term if r.status else -1).node_id

    def max_committed(self) -> int:
        return max((r.status.committed_index for r in self.rows.values() if r.status), default=-1)

    def lag(self, node: str) -> int | None:
        s = self.rows[node].status
        return None if s is None else max(0, self.max_committed() - s.dispatched_index)

    async def _ask(self, node: str) -> NodeRow:
        row = self.rows[node]
        try:
            status = await self._admins[node].cluster(row.url)
        except LedgerMQError as e:
            return replace(row, status=None, error=e.message or e.code, polled=True)
        return replace(row, status=status, error=None, polled=True)

    async def poll_once(self) -> None:
        new = await asyncio.gather(*(self._ask(n) for n in self.rows))
        back = []
        for row in new:
            old = self.rows[row.node_id]
            self._tell(old, row)
            if row.up and not old.up and old.polled:
                back.append(row.node_id)
            self.rows[row.node_id] = replace(row, note=old.note)
        if self.report_catch_up:
            self._follow_catch_up(back)
        self.polls += 1
        async with self._changed:
            self._changed.notify_all()

    def _follow_catch_up(self, back: list[str]) -> None:
        """A node answering again has the highest committed index of that moment to
        dispatch before it serves what the others do: say when it has."""
        now = time.monotonic()
        for node in back:
            s = self.rows[node].status
            assert s is not None
            target = self.max_committed()
            self._returning[node] = (now, target, max(0, target - s.dispatched_index))
        for node, (since, target, behind) in list(self._returning.items()):
            s = self.rows[node].status
            if s is None:
                del self._returning[node]
            elif s.dispatched_index >= target:
                del self._returning[node]
                self.on_event(
                    f"{node} caught up: {behind:,} entries behind when it answered again, "
                    f"dispatched up to {target:,} {(now - since) * 1000:,.0f} ms later"
                )

    def _tell(self, old: NodeRow, new: NodeRow) -> None:
        s = new.status
        if old.up and s is None and old.polled:
            self.on_event(f"{new.node_id} does not answer")
        if s is None:
            return
        if not old.up and old.polled:
            self.on_event(f"{new.node_id} answers again: {s.broker_role}, term {s.term}")
        if s.raft_role == "LEADER" and s.term not in self._terms_seen:
            self._terms_seen.add(s.term)
            self.on_event(f"{new.node_id} is elected LEADER of term {s.term}")
        was = old.status
        if s.broker_role == "MASTER" and (
            was is None or was.broker_role != "MASTER" or was.term != s.term
        ):
            self.on_event(f"{new.node_id} is MASTER (term {s.term}): writes go there")

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def until(
        self, predicate: Callable[[Mapping[str, NodeRow]], T | None], timeout_s: float, what: str
    ) -> T:
        """The first non-empty ``predicate(rows)`` after a poll; ``TimeoutError`` naming
        ``what`` and the last rows after ``timeout_s``."""
        result: list[T] = []

        def check() -> bool:
            value = predicate(self.rows)
            if value is not None and value is not False:
                result.append(value)
                return True
            return False

        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(check), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s; {self.describe()}") from None
        return result[0]

    def describe(self) -> str:
        parts = []
        for r in self.rows.values():
            s = r.status
            parts.append(
                f"{r.node_id} " + (f"{s.broker_role} t{s.term}" if s else f"down ({r.error})")
            )
        return ", ".join(parts)

    async def close(self) -> None:
        for admin in self._admins.values():
            with contextlib.suppress(Exception):
                await admin.close()


class Rates:
    """Messages per second of a growing counter, over the last ``window_s``."""

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque(maxlen=256)

    def sample(self, count: int) -> float:
        now = self.clock()
        self.samples.append((now, count))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        t0, c0 = self.samples[0]
        return (count - c0) / (now - t0) if now > t0 else 0.0


@dataclass(slots=True)
class Figures:
    """What the views show beside the nodes."""

    title: str = ""
    acknowledged: int = 0
    consumed: int = 0
    produced_per_s: float = 0.0
    consumed_per_s: float = 0.0
    in_doubt: int = 0


class View(Protocol):
    def event(self, text: str) -> None: ...
    def refresh(self, rows: Mapping[str, NodeRow], lag: Callable[[str], int | None]) -> None: ...
    def close(self) -> None: ...


def _elapsed(started: float) -> str:
    return f"{time.monotonic() - started:6.1f}s"


def _role(row: NodeRow) -> str:
    s = row.status
    if s is None:
        return "down"
    return s.broker_role if s.raft_role in ("LEADER", "FOLLOWER") else s.raft_role


class PlainView:
    """Lines: each event as it happens, the nodes every ``status_interval_s``."""

    def __init__(
        self, figures: Figures, out: TextIO | None = None, status_interval_s: float = 2.0
    ) -> None:
        self.figures = figures
        self.out = out or sys.stdout
        self.status_interval_s = status_interval_s
        self.started = time.monotonic()
        self._next_status = self.started + status_interval_s

    def _line(self, text: str) -> None:
        print(f"[{_elapsed(self.started)}] {text}", file=self.out, flush=True)

    def event(self, text: str) -> None:
        self._line(text)

    def refresh(self, rows: Mapping[str, NodeRow], lag: Callable[[str], int | None]) -> None:
        if time.monotonic() < self._next_status:
            return
        self._next_status = time.monotonic() + self.status_interval_s
        nodes = []
        for r in rows.values():
            s = r.status
            if s is None:
                nodes.append(f"{r.node_id} {r.note or 'down'}")
            else:
                nodes.append(
                    f"{r.node_id} {_role(r)} t{s.term} commit {s.committed_index} "
                    f"dispatch {s.dispatched_index} lag {lag(r.node_id)}"
                )
        f = self.figures
        self._line(
            " | ".join(nodes)
            + f" | produced {f.produced_per_s:,.0f}/s, consumed {f.consumed_per_s:,.0f}/s"
        )

    def close(self) -> None:
        pass


class LiveView:
    """A table redrawn in place (``rich.live``), driven by the story's refresh calls
    (no background thread reading state the event loop is changing)."""

    def __init__(self, figures: Figures, console: Console | None = None) -> None:
        self.figures = figures
        self.console = console or Console()
        self.started = time.monotonic()
        self.events: deque[str] = deque(maxlen=EVENTS_SHOWN)
        self._rows: Mapping[str, NodeRow] = {}
        self._lag: Callable[[str], int | None] = lambda _n: None
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def event(self, text: str) -> None:
        self.events.append(f"[{_elapsed(self.started)}] {text}")
        self._draw()

    def refresh(self, rows: Mapping[str, NodeRow], lag: Callable[[str], int | None]) -> None:
        self._rows, self._lag = rows, lag
        self._draw()

    def _draw(self) -> None:
        self.live.update(self.render(), refresh=True)

    def render(self) -> Group:
        f = self.figures
        table = Table(title=f.title, title_justify="left", expand=False)
        for name, justify in (
            ("node", "left"),
            ("role", "left"),
            ("term", "right"),
            ("commit", "right"),
            ("dispatch", "right"),
            ("lag", "right"),
            ("note", "left"),
        ):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for r in self._rows.values():
            s = r.status
            style = "bold green" if r.is_master else ("red" if s is None else "")
            if s is None:
                table.add_row(r.node_id, "down", "", "", "", "", r.note, style=style)
                continue
            lag = self._lag(r.node_id)
            table.add_row(
                r.node_id,
                _role(r),
                str(s.term),
                f"{s.committed_index:,}",
                f"{s.dispatched_index:,}",
                "" if lag is None else f"{lag:,}",
                r.note,
                style=style,
            )
        flow = Text(
            f"produced {f.produced_per_s:7,.0f}/s   consumed {f.consumed_per_s:7,.0f}/s   "
            f"acknowledged {f.acknowledged:,}   consumed {f.consumed:,}"
            + (f"   in doubt {f.in_doubt:,}" if f.in_doubt else "")
        )
        return Group(table, flow, Text("\n".join(self.events), style="dim"))

    def close(self) -> None:
        self._draw()
        self.live.stop()


def make_view(figures: Figures, plain: bool | None = None) -> View:
    """``LiveView`` on a terminal, ``PlainView`` otherwise (or as asked)."""
    if plain is None:
        plain = not sys.stdout.isatty()
    return PlainView(figures) if plain else LiveView(figures)
