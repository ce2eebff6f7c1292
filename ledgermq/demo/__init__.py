"""``ledgermq demo`` (``make demo``): the 3-broker failover demonstration, for real.

With no ``--brokers``, three ``ledgermq broker`` processes start on 127.0.0.1
(``LocalBrokerCluster``, as ``cluster up``); a producer with a producer session and a
consumer group run over HTTP with the project's client (``ledgermq.demo.load``); the view
(``ledgermq.demo.view``) shows every node's role, term, commit and dispatch index and lag,
and messages per second. Then, ``--kills`` times: kill -9 the MASTER, wait for the
election and the new MASTER, measure how long writes were unavailable (the kill → the
next batch acknowledged by another master), restart the old node and watch it catch up
as a SLAVE. Last, the books: the producer stops, the consumer drains every queue, every
node's queues are read over HTTP and the replicas' commitlog and consume-queue files
compared byte for byte, and the accounting is printed. The exit code is 0 only when it
is clean: nothing lost, duplicated, misplaced or unexpected, and every replica identical.

With ``--brokers URL,...`` the same workload, view and accounting run against a cluster
that is already running (the compose demo): the demo cannot kill a container, so it
says which node is master and the command to kill it, reports every failover it sees
(the gap in acknowledged writes), and ends with the accounting on Ctrl-C / SIGTERM or
after ``--duration``.

Every wait is bounded (``--failover-timeout``, ``--catch-up-timeout``, ``--drain-timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from ..cli.util import add_option
from ..client import AsyncAdmin, ClientSettings, LedgerMQError, parse_brokers
from ..local_cluster import LocalBrokerCluster
from ..replicas import QueueImage, compare_commitlogs, compare_consume_queues, read_queues
from .load import Ack, LoadSettings, Workload, ensure_topic, percentile, topic_ends
from .view import Figures, Monitor, NodeRow, Rates, View, make_view

GROUP = "g0"  # the local cluster's DLedger group
REFRESH_S = 0.25  # the view is redrawn this often


def add_demo_options(p: argparse.ArgumentParser) -> None:
    """The options of ``ledgermq demo``. ``--brokers`` and ``--data-dir`` do not come from
    the environment: ``LEDGERMQ_BROKERS`` or ``LEDGERMQ_DATA_DIR`` set for other commands
    must not turn ``make demo`` into something else."""
    d = LoadSettings()
    p.add_argument("--brokers", default=None, help="run against this cluster (no kills)")
    p.add_argument("--data-dir", type=Path, default=None, help="local cluster data (default: temp)")
    p.add_argument("--kills", type=int, default=1, help="kill -9 the master this many times")
    p.add_argument(
        "--keep-running", action="store_true", help="leave the local cluster up until Ctrl-C"
    )
    p.add_argument(
        "--duration", type=float, default=0.0, help="with --brokers: stop after this many seconds"
    )
    p.add_argument("--phase", type=float, default=4.0, help="seconds between the story's steps")
    p.add_argument("--topic", default=d.topic, help="created if missing")
    p.add_argument("--queues", type=int, default=d.queues, help="of a topic it creates")
    p.add_argument(
        "--group", default=None, help="the consumer group (default: ledgermq-demo-<run id>)"
    )
    p.add_argument("--batch", type=int, default=d.batch, help="messages per produce request")
    p.add_argument("--body-bytes", type=int, default=d.body_bytes, help="message body size")
    p.add_argument("--rate", type=int, default=d.rate_per_s, help="messages/s (0: unpaced)")
    p.add_argument(
        "--max-messages",
        type=int,
        default=d.max_messages,
        help="the producer stops here (the books keep 9 bytes per message)",
    )
    p.add_argument("--failover-timeout", type=float, default=30.0, help="seconds")
    p.add_argument("--catch-up-timeout", type=float, default=60.0, help="seconds")
    p.add_argument("--drain-timeout", type=float, default=60.0, help="seconds")
    p.add_argument("--plain", action="store_true", help="lines instead of the live table")
    add_option(p, "--auth-token", default=None, help="bearer token, with --brokers")


# ---- the story's record ---------------------------------------------------------------------


@dataclass(slots=True)
class Failover:
    """One kill (local) or one change of master seen (``--brokers``)."""

    old: str
    new: str | None = None
    master_after_ms: float | None = None  # kill → the new MASTER seen by the monitor
    window_ms: float | None = None  # kill → next acknowledged produce (local)
    gap_ms: float | None = None  # last ack by the old master → first by the new
    catch_up_entries: int | None = None
    catch_up_ms: float | None = None


@dataclass(slots=True)
class Books:
    """The accounting, as printed; ``clean`` decides the exit code."""

    acknowledged: int = 0
    consumed: int = 0
    lost: int = 0
    duplicated: int = 0
    misplaced: int = 0
    unexpected: int = 0
    in_doubt: int = 0
    recovered: int = 0
    foreign: int = 0
    drained: bool = False
    replica_lines: list[str] = field(default_factory=list)
    replicas_identical: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            self.drained
            and self.replicas_identical
            and not self.problems
            and self.lost == self.duplicated == self.misplaced == self.unexpected == 0
        )


class Story:
    """Ties the workload, the monitor and the view together for one run."""

    def __init__(self, args: argparse.Namespace, view: View, figures: Figures) -> None:
        self.args = args
        self.view = view
        self.figures = figures
        self.failovers: list[Failover] = []
        self.monitor: Monitor | None = None
        self.workload: Workload | None = None
        self.stop_requested = asyncio.Event()
        self._acks: list[Ack] = []  # the last ack per master change (--brokers gaps)
        self._tasks: list[asyncio.Task[None]] = []
        self.kept_running = False  # the books are printed; the cluster stays up
        self.run = secrets.token_hex(4)  # names the run's messages and its group

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.workload is not None:
            await self.workload.close()
        if self.monitor is not None:
            await self.monitor.close()

    def say(self, text: str) -> None:
        self.view.event(text)

    # ---- shared steps ------------------------------------------------------------------------

    def load_settings(self, client: ClientSettings) -> LoadSettings:
        a = self.args
        return LoadSettings(
            topic=a.topic,
            queues=a.queues,
            # A group of its own per run: two demos at once (one in `docker compose up`,
            # one in `docker compose run`) would otherwise split each other's messages.
            group=a.group or f"ledgermq-demo-{self.run}",
            batch=a.batch,
            body_bytes=a.body_bytes,
            rate_per_s=a.rate,
            max_messages=a.max_messages,
            client=client,
        )

    async def start(self, urls: Mapping[str, str], brokers: list[str]) -> dict[int, int]:
        """Monitor, topic, group reset to the topic's end, then producer and consumer;
        the queues' start offsets (this run's messages lie after them)."""
        client = replace(LoadSettings().client, auth_token=self.args.auth_token)
        self.monitor = Monitor(
            urls,
            on_event=self.say,
            # A local story measures its restarts itself; against a running cluster the
            # monitor is the one to notice a node back and caught up.
            report_catch_up=self.args.brokers is not None,
            settings=ClientSettings(
                timeout_s=1.0,
                connect_timeout_s=0.5,
                deadline_s=1.5,
                max_attempts=1,
                auth_token=self.args.auth_token,
            ),
        )
        await self.monitor.poll_once()  # the view's first rows are answers, not blanks
        self._tasks.append(asyncio.create_task(self.monitor.run(), name="demo-monitor"))
        self._tasks.append(asyncio.create_task(self._refresh(), name="demo-view"))
        settings = self.load_settings(client)
        queues = await ensure_topic(brokers, settings.topic, settings.queues, client)
        master_url = urls[await self.wait_master(None)]
        starts = await topic_ends(master_url, settings.topic, client)
        async with AsyncAdmin(brokers, settings=client) as admin:
            await admin.reset_offsets(settings.group, settings.topic, "latest")
        self.workload = Workload(
            brokers, settings, run=self.run, on_event=self.say, on_ack=self._on_ack
        )
        self.workload.start()
        rate = f"~{settings.rate_per_s:,} msg/s" if settings.rate_per_s else "as fast as acked"
        self.say(
            f"topic '{settings.topic}' ({queues} queues): producing {rate} in batches of "
            f"{settings.batch} (session {self.workload.producer.producer_id}), "
            f"group '{settings.group}' consuming"
        )
        return starts

    def _on_ack(self, ack: Ack) -> None:
        """Writes moving from one master to another: the gap the producer saw."""
        prev = self._acks[-1] if self._acks else None
        if prev is not None and prev.master == ack.master:
            self._acks[-1] = ack
            return
        self._acks.append(ack)
        del self._acks[:-2]
        if prev is None or self.args.brokers is None:
            return
        gap_ms = (ack.at - prev.at) * 1000
        new = self._node_of(ack.master)
        f = Failover(self._node_of(prev.master) or "?", new, gap_ms=gap_ms)
        self.failovers.append(f)
        self.say(f"writes moved from {f.old} to {new}: no acknowledged write for {gap_ms:,.0f} ms")

    def _node_of(self, url: str | None) -> str | None:
        if self.monitor is None or url is None:
            return url
        for r in self.monitor.rows.values():
            if r.url == url:
                return r.node_id
        return url

    async def _refresh(self) -> None:
        produced, consumed = Rates(), Rates()
        while True:
            w, f = self.workload, self.figures
            if w is not None:
                h = w.history
                f.acknowledged, f.consumed, f.in_doubt = h.acknowledged, h.consumed, h.in_doubt
                f.produced_per_s = produced.sample(h.acknowledged)
                f.consumed_per_s = consumed.sample(h.consumed)
            if self.monitor is not None:
                self.view.refresh(self.monitor.rows, self.monitor.lag)
            await asyncio.sleep(REFRESH_S)

    async def wait_master(self, not_node: str | None, timeout_s: float | None = None) -> str:
        assert self.monitor is not None
        m = self.monitor

        def master(_rows: Mapping[str, NodeRow]) -> str | None:
            node = m.master()
            return node if node is not None and node != not_node else None

        return await m.until(master, timeout_s or self.args.failover_timeout, "a MASTER")

    async def wait_idle(self, nodes: list[str], timeout_s: float) -> int:
        """Every node answers with the same log end, all of it committed and dispatched;
        that index."""
        assert self.monitor is not None

        def idle(rows: Mapping[str, NodeRow]) -> int | None:
            ss = [rows[n].status for n in nodes]
            if any(s is None for s in ss):
                return None
            ends = {(s.ledger_end_index, s.committed_index, s.dispatched_index) for s in ss if s}
            if len(ends) != 1:
                return None
            end, committed, dispatched = ends.pop()
            return end if end == committed == dispatched else None

        return await self.monitor.until(idle, timeout_s, "every node at the same committed end")

    async def run_for(self, seconds: float) -> None:
        """Let the workload run (the view keeps moving); stops early on Ctrl-C."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_requested.wait(), seconds)
        self.check_workload()

    def check_workload(self) -> None:
        assert self.workload is not None
        err = self.workload.failed()
        if err is not None:
            raise RuntimeError(f"the workload failed: {err!r}") from err

    # ---- the books ---------------------------------------------------------------------------

    async def settle(self, urls: Mapping[str, str], starts: dict[int, int]) -> Books:
        """Stop producing, drain, read every node's queues, count."""
        assert self.workload is not None and self.monitor is not None
        w, books = self.workload, Books()
        await w.stop_producing()
        self.check_workload()
        master = await self.wait_master(None)
        ends = await topic_ends(urls[master], w.settings.topic, w.settings.client)
        self.say(f"producer stopped at {w.history.sent:,} messages; draining the group")
        books.drained = await w.drain(ends, self.args.drain_timeout)
        if not books.drained:
            books.problems.append(f"the consumer did not drain within {self.args.drain_timeout} s")
        else:
            self.say(f"group drained: {w.history.consumed:,} messages consumed")
        end = await self.wait_idle(list(urls), self.args.catch_up_timeout)
        ranges = {q: (starts.get(q, 0), end) for q, end in ends.items()}
        images: dict[str, dict[int, QueueImage]] = {}
        for node, url in urls.items():
            self.say(f"every node at index {end:,}; reading {len(ranges)} queues on {node}")
            images[node] = await read_queues(url, w.settings.topic, ranges, w.settings.client)
        first = next(iter(images))
        same = all(images[n] == images[first] for n in images)
        count = sum(i.count for i in images[first].values())
        want = sum(end - start for start, end in ranges.values())
        books.replicas_identical = same and count == want
        books.replica_lines.append(
            f"queues over HTTP: {len(ranges)} queues x {len(images)} nodes, "
            + (f"identical ({count:,} messages each)" if same else "DIFFERENT")
            + ("" if count == want else f", {count:,} read of {want:,}")
        )
        h = w.history
        books.acknowledged, books.consumed = h.acknowledged, h.consumed
        books.lost, books.duplicated = h.lost_count(), h.duplicated
        books.misplaced, books.unexpected = h.misplaced, h.unexpected
        books.in_doubt, books.recovered, books.foreign = h.in_doubt, h.recovered(), h.foreign
        if books.lost:
            books.problems.append(f"lost message numbers (first ones): {h.lost()[:10]}")
        return books

    def compare_files(self, data_dirs: Mapping[str, Path], books: Books) -> None:
        self.say("comparing the replicas' commitlog and consume-queue files byte for byte")
        for cmp in (
            compare_commitlogs(data_dirs, GROUP),
            compare_consume_queues(data_dirs, GROUP),
        ):
            if cmp.identical:
                books.replica_lines.append(
                    f"{cmp.what} files: identical on {len(cmp.nodes)} nodes "
                    f"({cmp.files} files, {cmp.total_bytes:,} bytes each)"
                )
            else:
                books.replicas_identical = False
                books.replica_lines.append(
                    f"{cmp.what} files: DIFFERENT: " + "; ".join(cmp.differences or ("no files",))
                )

    def report(self, books: Books, out: TextIO | None = None) -> None:
        p = _printer(out)
        p("")
        p("==== accounting " + "=" * 56)
        p(
            f"acknowledged {books.acknowledged:,}, consumed {books.consumed:,}, "
            f"lost {books.lost}, duplicated {books.duplicated}"
        )
        p(
            f"  misplaced {books.misplaced}, unexpected {books.unexpected}, "
            f"in doubt {books.in_doubt} (of which read once: {books.recovered})"
            + (f", other producers' messages {books.foreign:,}" if books.foreign else "")
        )
        windows = [f.window_ms for f in self.failovers if f.window_ms is not None]
        gaps = [f.gap_ms for f in self.failovers if f.gap_ms is not None]
        if windows:
            p(_spread("unavailability window (kill -9 → next acknowledged produce)", windows))
            masters = [f.master_after_ms for f in self.failovers if f.master_after_ms is not None]
            p(_spread("  new MASTER seen after the kill", masters))
            ups = [f.catch_up_ms for f in self.failovers if f.catch_up_ms is not None]
            if ups:
                p(_spread("  restarted node caught up in", ups))
        elif gaps:
            p(_spread("write gap at a change of master (last ack → first ack)", gaps))
        else:
            p("no failover during the run")
        for line in books.replica_lines:
            p(f"replicas: {line}")
        for line in books.problems:
            p(f"PROBLEM: {line}")
        p("result: " + ("CLEAN" if books.clean else "NOT CLEAN"))


def _printer(out: TextIO | None) -> Callable[[str], None]:
    stream = out if out is not None else sys.stdout

    def p(line: str) -> None:
        print(line, file=stream, flush=True)

    return p


def _spread(what: str, values_ms: list[float]) -> str:
    if len(values_ms) == 1:
        return f"{what}: {values_ms[0]:,.0f} ms"
    return (
        f"{what}: p50 {percentile(values_ms, 0.5):,.0f} ms, max {max(values_ms):,.0f} ms "
        f"over {len(values_ms)} ({', '.join(f'{v:,.0f}' for v in values_ms)})"
    )


# ---- the local story: three processes, kill -9, restart -----------------------------------


async def local_story(story: Story, cluster: LocalBrokerCluster) -> Books:
    a = story.args
    story.say(
        f"starting 3 brokers (ledgermq broker processes) on 127.0.0.1, data in {cluster.data_dir}"
    )
    cluster.start_all()
    master = await asyncio.to_thread(cluster.wait_ready, None, a.failover_timeout * 2)
    pids = ", ".join(f"{n} pid {cluster.procs[n].pid}" for n in cluster.ids)
    story.say(f"cluster ready ({pids}); {master} is MASTER")
    starts = await story.start(cluster.urls, list(cluster.urls.values()))
    await story.run_for(a.phase)
    for k in range(a.kills):
        if story.stop_requested.is_set():
            break
        await kill_and_restart(story, cluster, k)
    return await finish(story, cluster, starts)


async def kill_and_restart(story: Story, cluster: LocalBrokerCluster, k: int) -> None:
    """One failover, measured: kill -9 the MASTER, wait for the new one and the first
    write it acknowledges, let the two survivors work, restart the old node and wait for
    it to catch up as a SLAVE."""
    a, monitor, workload = story.args, story.monitor, story.workload
    assert monitor is not None and workload is not None
    victim = await story.wait_master(None)
    label = f"kill {k + 1} of {a.kills}: " if a.kills > 1 else ""
    f = Failover(victim)
    story.failovers.append(f)

    # Step 1 — SIGKILL: no flush, no goodbye, no leadership transfer. Everything the old
    # master acknowledged was committed on a quorum, so it must survive this.
    pid = cluster.procs[victim].pid
    killed_at = time.monotonic()
    cluster.kill(victim)
    monitor.note(victim, "killed (kill -9)")
    story.say(f"{label}kill -9 {victim} (pid {pid}), the MASTER")

    # Step 2 — the survivors elect a leader, which becomes MASTER once its own-term NOOP
    # is committed and dispatch has caught up (RoleChangeHandler).
    f.new = await story.wait_master(victim)
    f.master_after_ms = (time.monotonic() - killed_at) * 1000
    story.say(f"new MASTER {f.new}, seen {f.master_after_ms:,.0f} ms after the kill")

    # Step 3 — the producer's next acknowledged batch from a master other than the dead
    # one ends the unavailability window (an answer the old master sent just before it
    # died does not count).
    ack = await workload.next_ack(killed_at, cluster.urls[victim], a.failover_timeout)
    f.window_ms = (ack.at - killed_at) * 1000
    story.say(f"writes unavailable for {f.window_ms:,.0f} ms (kill → next acknowledged produce)")
    await story.run_for(a.phase / 2)

    # Step 4 — restart the old node: it recovers its log (a torn tail is cut), rejoins as
    # a follower, is brought up to date by the master, and dispatches what it missed.
    restarted_at = time.monotonic()
    cluster.start(victim)
    monitor.note(victim, "restarted")
    story.say(f"restarting {victim} (pid {cluster.procs[victim].pid})")

    def rejoined(rows: Mapping[str, NodeRow]) -> int | None:
        # A SLAVE that knows the current term's leader (a restarted node first answers
        # with the term it had on disk, before it has heard from anyone).
        s, m = rows[victim].status, rows[f.new or ""].status if f.new else None
        if s is None or m is None or s.broker_role != "SLAVE" or s.term < m.term:
            return None
        return monitor.max_committed() if s.leader_id is not None else None

    target = await monitor.until(rejoined, a.catch_up_timeout, f"{victim} rejoins as SLAVE")
    behind = max(0, target - (monitor.rows[victim].status.dispatched_index))  # type: ignore[union-attr]
    story.say(f"{victim} is back as SLAVE, {behind:,} entries behind")

    def caught_up(rows: Mapping[str, NodeRow]) -> bool:
        s = rows[victim].status
        return s is not None and s.dispatched_index >= target

    await monitor.until(caught_up, a.catch_up_timeout, f"{victim} catches up")
    f.catch_up_ms = (time.monotonic() - restarted_at) * 1000
    f.catch_up_entries = behind
    monitor.note(victim, "")
    story.say(f"{victim} caught up with index {target:,}, {f.catch_up_ms:,.0f} ms after restart")
    await story.run_for(a.phase / 2)


async def finish(story: Story, cluster: LocalBrokerCluster, starts: dict[int, int]) -> Books:
    books = await story.settle(cluster.urls, starts)
    # Every node is idle at one committed end (settle waited for it): the files rest.
    story.compare_files({n: cluster.data_dir / n for n in cluster.ids}, books)
    return books


# ---- against a running cluster -----------------------------------------------------------


async def remote_story(story: Story) -> Books:
    a = story.args
    brokers = parse_brokers(a.brokers)
    settings = ClientSettings(timeout_s=2.0, connect_timeout_s=1.0, auth_token=a.auth_token)
    urls = await discover(brokers, settings, a.failover_timeout * 2)
    story.say(f"cluster of {len(urls)}: " + ", ".join(f"{n} {u}" for n, u in urls.items()))
    starts = await story.start(urls, brokers)
    master = await story.wait_master(None)
    story.say(
        f"{master} is MASTER. To see a failover, kill it (the compose demo: "
        f"`docker compose kill {master}`), watch, then `docker compose start {master}`; "
        "Ctrl-C (or SIGTERM) ends the run with the accounting"
    )
    deadline = time.monotonic() + a.duration if a.duration > 0 else None
    while not story.stop_requested.is_set():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        await story.run_for(min(1.0, left) if left is not None else 1.0)
    story.say("stopping: the books follow")
    return await story.settle(urls, starts)


async def discover(
    brokers: list[str], settings: ClientSettings, timeout_s: float
) -> dict[str, str]:
    """Node id → URL of every node, from whichever brokers answer (bounded). A node's
    own advertised URL is used only where ``--brokers`` does not name it."""
    deadline = time.monotonic() + timeout_s
    async with AsyncAdmin(brokers, settings=settings) as admin:
        while True:
            views = await admin.cluster_all()
            urls = {v.node_id: v.url for v in views if v.node_id and v.url}
            up = sum(v.status is not None for v in views)
            if up and any(v.status and v.status.broker_role == "MASTER" for v in views):
                return dict(sorted(urls.items()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no MASTER among {', '.join(brokers)} within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)


# ---- entry point ---------------------------------------------------------------------------


async def _main(args: argparse.Namespace, view: View, figures: Figures) -> int:
    story = Story(args, view, figures)
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_signal() -> None:
        # The first Ctrl-C/SIGTERM ends a --brokers run with its books (or stops a
        # --keep-running cluster); a local story in progress is abandoned; a second one
        # abandons anything.
        if story.stop_requested.is_set() or (args.brokers is None and not story.kept_running):
            main_task.cancel()
        story.stop_requested.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    cluster: LocalBrokerCluster | None = None
    own_dir = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="ledgermq-demo-")) if own_dir else args.data_dir
    keep_data = not own_dir
    try:
        if args.brokers is not None:
            books = await remote_story(story)
        else:
            cluster = LocalBrokerCluster(
                3, root, extra_args=["--data-file-mb", "64", "--log-level", "INFO"], group=GROUP
            )
            books = await local_story(story, cluster)
        view.close()
        story.report(books)
        if cluster is not None and args.keep_running:
            story.kept_running = True
            print(
                f"\ncluster left running: --brokers {cluster.brokers}; Ctrl-C stops it", flush=True
            )
            story.stop_requested.clear()
            await story.stop_requested.wait()
        return 0 if books.clean else 1
    except (TimeoutError, RuntimeError, LedgerMQError, OSError) as e:
        view.close()
        print(f"ledgermq demo: {e}", file=sys.stderr)
        if cluster is not None:
            keep_data = True
            for n in cluster.ids:
                print(
                    f"---- {n}'s log (last lines) ----\n{cluster.log_tail(n, 15)}", file=sys.stderr
                )
            print(f"data and logs kept in {root}", file=sys.stderr)
        return 1
    finally:
        await story.close()
        if cluster is not None:
            await asyncio.to_thread(cluster.stop_all)
        if own_dir and not keep_data:
            shutil.rmtree(root, ignore_errors=True)


def run_demo(args: argparse.Namespace) -> int:
    """``ledgermq demo``: 0 when the accounting is clean, 1 when not (or on an error),
    130 when interrupted."""
    if args.kills < 0 or args.phase < 0:
        print("ledgermq demo: --kills and --phase must be >= 0", file=sys.stderr)
        return 2
    figures = Figures(title="LedgerMQ failover demo")
    view = make_view(figures, plain=True if args.plain else None)
    try:
        return asyncio.run(_main(args, view, figures))
    except (KeyboardInterrupt, asyncio.CancelledError):
        view.close()
        print("ledgermq demo: interrupted", file=sys.stderr)
        return 130
