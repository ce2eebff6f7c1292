"""Push consumers' server-managed invisible time (docs/rocketmq.md): ``Liveness`` and
``Renewer``.

A push consumer receives with ``auto_renew`` and no invisible duration: the server
picks the time (``GrpcSettings.auto_renew_ms``) and keeps renewing it while the client
lives, and the handle first given stays current (RocketMQ's proxy,
``DefaultReceiptHandleManager``). Here the receive's flights carry their owner (the
client id) in the replicated POP state (``broker/pop/state.py``), so a renewal needs no
table of its own: the master's ``Renewer`` looks over the in-flight messages every
``renew_period_s``, and for those of a live owner whose time ends within
``renew_ahead_ms`` appends one ``pop.renew`` per group and topic (epoch kept); for those
of an owner that ended (NotifyClientTermination), went idle or was renewed for
``renew_max_s``, a last one that makes them visible ``release_ms`` later. A renewal is a
replicated entry like every change of an invisible time, so a new master goes on from
the renewed deadlines: a failover costs at most the renewal under way.

``Liveness`` is per node and bounded: the clients this node heard from (any RPC; a
slave forwards Heartbeat and NotifyClientTermination to the master, and the consumer
RPCs reach it forwarded anyway). A node that has just become master knows nobody yet:
for ``client_idle_s`` after it does, an owner it has not heard of counts as alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable

from broker import errors
from broker.gate import BrokerRole, WriteGate
from broker.pop.service import PopGroups
from broker.pop.state import Handle

from .settings import GrpcSettings, renew_ahead_ms, renew_period_s

log = logging.getLogger(__name__)


class Liveness:
    """When this node last heard from each client (monotonic s), and which ones said they
    end: at most ``limit`` of each, the oldest forgotten first."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()

    def seen(self, client_id: str) -> None:
        if not client_id:
            return
        self._seen.pop(client_id, None)
        self._seen[client_id] = self.clock()
        self._ended.pop(client_id, None)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def ended(self, client_id: str) -> None:
        self._seen.pop(client_id, None)
        self._ended.pop(client_id, None)
        self._ended[client_id] = None
        while len(self._ended) > self.limit:
            self._ended.popitem(last=False)

    def alive(self, client_id: str, idle_s: float, known_since: float) -> bool:
        """Heard from within ``idle_s``; or never heard of (nor ended) while this node
        has not listened for ``idle_s`` yet (since ``known_since``)."""
        if client_id in self._ended:
            return False
        now = self.clock()
        at = self._seen.get(client_id)
        if at is None:
            return now - known_since < idle_s
        return now - at < idle_s

    def __len__(self) -> int:
        return len(self._seen)


class Renewer:
    """The master's renewal of auto-renewed flights (see the module doc)."""

    def __init__(self, settings: GrpcSettings, gate: WriteGate, pop: PopGroups) -> None:
        self.settings = settings
        self.gate = gate
        self.pop = pop
        self.liveness = Liveness(settings.max_clients)
        self._master_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.renewed = 0  # flights renewed (tests, metrics)
        self.released = 0  # flights let go

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="grpc-renew")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        period = renew_period_s(self.settings)
        while True:
            await asyncio.sleep(period)
            try:
                await self.round()
            except (errors.NotMasterError, errors.NoMasterError):
                pass
            except errors.BrokerError as e:
                log.info("renewal of push consumers' messages: %s", e.message)
            except Exception:
                log.exception("renewal of push consumers' messages failed")

    async def round(self) -> None:
        """One look over the in-flight messages, if this node is the master."""
        if self.gate.role is not BrokerRole.MASTER:
            self._master_since = None
            return
        if self._master_since is None:
            self._master_since = self.liveness.clock()
        s = self.settings
        now = self.pop.clock()
        ahead = renew_ahead_ms(s)
        renew: dict[tuple[str, str], list[Handle]] = defaultdict(list)
        release: dict[tuple[str, str], list[Handle]] = defaultdict(list)
        for (group, topic, q), qs in list(self.pop.state.queues.items()):
            for o, f in list(qs.flights.items()):
                if f.owner is None or f.visible_at - now > ahead:
                    continue
                alive = self.liveness.alive(f.owner, s.client_idle_s, self._master_since)
                if alive and now < f.renew_until:
                    renew[(group, topic)].append((q, o, f.epoch))
                else:
                    release[(group, topic)].append((q, o, f.epoch))
        most = self.pop.settings.limits.max_receipt_handles
        for table, invisible_ms, stop in (
            (renew, s.auto_renew_ms, False),
            (release, s.release_ms, True),
        ):
            for (group, topic), handles in table.items():
                for i in range(0, len(handles), most):
                    held = await self.pop.renew(
                        group, topic, handles[i : i + most], invisible_ms, stop=stop
                    )
                    if stop:
                        self.released += sum(held)
                    else:
                        self.renewed += sum(held)
