"""The sans-I/O exchange (h11's way): what an operation asks a driver to do (``Request``,
``Sleep``), what it gets back (``Reply``, ``Unreachable``), and ``Exchange``, which turns
one ``Call`` into a successful ``Reply`` or raises the typed error: master discovery and
its cache, ``307 NOT_MASTER`` redirects, retries with backoff, the deadline and
``max_attempts`` (the rules are in the package's docstring). No sockets here: the
drivers (``ledgermq.client.drivers``, ``ledgermq.spark.pull``) perform the actions."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar
from urllib.parse import urlsplit

import orjson

from .errors import (
    BrokerUnavailableError,
    CorruptEntryError,
    LedgerMQError,
    NoMasterError,
    NotMasterError,
    TopicNotFoundError,
    make_error,
)
from .settings import ClientSettings, parse_brokers

ARROW_STREAM = "application/vnd.apache.arrow.stream"  # api.media's; a test keeps them equal
RECORD_PAGE = "application/vnd.ledgermq.records"  # api.media's RECORDS: a pull's record page
BINARY = frozenset({ARROW_STREAM, RECORD_PAGE})  # answers kept as bytes in ``Reply.content``


@dataclass(frozen=True, slots=True)
class Request:
    """Send this to that URL (the drivers do it)."""

    method: str
    url: str
    params: Mapping[str, str | int] | None
    content: bytes | None
    timeout_s: float
    accept: str | None = None  # the client's default (JSON) unless set
    content_type: str | None = None  # of ``content``: JSON unless set


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: Any  # parsed JSON, or None when the body is empty or not JSON
    text: str = ""
    content: bytes | memoryview = b""  # the raw body of a non-JSON answer (an Arrow stream)


@dataclass(frozen=True, slots=True)
class Unreachable:
    """No HTTP answer: connection refused, reset, timed out."""

    error: str


Action: TypeAlias = Request | Sleep
Outcome: TypeAlias = Reply | Unreachable
T = TypeVar("T")
Gen: TypeAlias = Generator[Action, Outcome | None, T]


@dataclass(frozen=True, slots=True)
class Call:
    """One API request before routing: path relative to a broker's base URL."""

    method: str
    path: str
    params: Mapping[str, str | int] | None = None
    body: Any = None
    write: bool = False  # needs the master
    wait_ms: int = 0  # the server may hold it this long (long polling)
    url: str | None = None  # this node only: no routing, no retries
    accept: str | None = None  # another representation than JSON (errors stay JSON)
    answer_timeout_s: float | None = None  # a node silent this long is skipped (writes)
    # a body sent as it is (``content_type``), in place of ``body`` as JSON
    content: bytes | None = None
    content_type: str | None = None


def _content(call: Call) -> bytes | None:
    """What a call sends: its raw ``content``, else its body as JSON, else nothing."""
    if call.content is not None:
        return call.content
    return orjson.dumps(call.body) if call.body is not None else None


def error_from_reply(reply: Reply) -> LedgerMQError:
    err = reply.body.get("error") if isinstance(reply.body, Mapping) else None
    if isinstance(err, Mapping) and isinstance(err.get("code"), str):
        fields = {k: v for k, v in err.items() if k not in ("code", "message")}
        return make_error(err["code"], str(err.get("message", "")), reply.status, fields)
    snippet = reply.text.strip().replace("\n", " ")[:200]
    return LedgerMQError(f"HTTP_{reply.status}", snippet or "no error body", reply.status)


def retry_after_s(reply: Reply, error: LedgerMQError) -> float:
    """The server's hint: the body's ``retry_after_ms``, else the ``Retry-After``
    header (seconds), else 0."""
    ms = error.fields.get("retry_after_ms")
    if isinstance(ms, int | float) and ms >= 0:
        return float(ms) / 1000
    try:
        return max(0.0, float(reply.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0


def redirect_target(reply: Reply, error: LedgerMQError) -> str | None:
    """The master's base URL from a ``307 NOT_MASTER``: ``leader_url``, else the
    scheme and host of ``Location``."""
    url = error.fields.get("leader_url")
    if isinstance(url, str) and url:
        return url.rstrip("/")
    location = reply.headers.get("location")
    if location:
        parts = urlsplit(location)
        if parts.scheme in ("http", "https") and parts.netloc:
            return f"{parts.scheme}://{parts.netloc}"
    return None


def backoff_delay_s(n: int, settings: ClientSettings, rng: random.Random) -> float:
    """The ``n``-th backoff (0-based): exponential, capped, with "equal jitter" (a
    uniform draw from the upper half) so that clients retrying together spread out."""
    ceiling = min(settings.backoff_cap_s, settings.backoff_base_s * (2 ** min(n, 30)))
    return rng.uniform(ceiling / 2, ceiling)


def master_url_from(asked_url: str, d: Mapping[str, Any]) -> str | None:
    """Where the master is, by one node's ``/v1/cluster``: that node itself when it is
    MASTER (by the URL that reached it), else its ``leader_url`` — unless the leader is
    the node itself, still catching up, which takes no writes yet."""
    if d.get("broker_role") == "MASTER":
        return asked_url
    url = d.get("leader_url")
    if isinstance(url, str) and url and d.get("leader_id") != d.get("node_id"):
        return url.rstrip("/")
    return None


RETRIED = {
    "NO_MASTER",
    "UNKNOWN_OUTCOME",
    "BUSY",
    "DISK_FULL",
    "NODE_FAILED",
    "TOO_MANY_CONNECTIONS",
}
# Retried against the same master: it is the master, only busy, out of disk or of connections.
_SAME_MASTER = {"BUSY", "DISK_FULL", "TOO_MANY_CONNECTIONS"}


def _unavailable(message: str) -> BrokerUnavailableError:
    return BrokerUnavailableError(BrokerUnavailableError.CODE, message)


@dataclass(slots=True)
class _Round:
    """The retry state of one operation."""

    skip: set[str] = field(default_factory=set)  # tried this round, to no avail
    unreachable: dict[str, str] = field(default_factory=dict)  # URL → last error
    last: LedgerMQError | None = None
    attempts: int = 0
    backoffs: int = 0
    redirects: int = 0  # since the last backoff
    silent: set[str] = field(default_factory=set)  # gave no answer this round

    def not_there(self, url: str, error: str) -> None:
        self.skip.add(url)
        self.silent.add(url)
        self.unreachable[url] = error
        if self.last is None or isinstance(self.last, BrokerUnavailableError):
            self.last = _unavailable(f"{url}: {error}")

    def next_round(self) -> None:
        self.backoffs += 1
        self.redirects = 0
        self.skip.clear()
        self.silent.clear()


class Exchange:
    """Routing and retries for one client: the broker list, the cached master, and the
    ``exchange`` generator that turns a ``Call`` into a successful ``Reply`` or raises."""

    def __init__(
        self,
        brokers: str | Sequence[str],
        settings: ClientSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.brokers = parse_brokers(brokers)
        self.settings = settings
        self.master: str | None = None
        self.rng = rng or random.Random()
        self.clock = clock
        self._rotation = 0

    def _request(self, url: str, call: Call, content: bytes | None, deadline: float) -> Request:
        left = max(0.001, deadline - self.clock())
        timeout = min(self.settings.timeout_s, left, call.answer_timeout_s or left)
        timeout += call.wait_ms / 1000
        return Request(
            call.method, url + call.path, call.params, content, timeout, call.accept,
            call.content_type,
        )  # fmt: skip

    @staticmethod
    def _send(request: Request) -> Gen[Outcome]:
        outcome = yield request
        assert outcome is not None, "a driver answers every Request"
        return outcome

    def _pick(self, call: Call, skip: set[str]) -> str | None:
        """The next URL to try: the master if known (always for writes), else the
        brokers in rotation; ``None`` when this round has tried them all."""
        if self.master is not None and self.master not in skip:
            return self.master
        n = len(self.brokers)
        for i in range(n):
            url = self.brokers[(self._rotation + i) % n]
            if url not in skip:
                self._rotation = (self._rotation + i + 1) % n
                return url
        return None

    def exchange(self, call: Call) -> Gen[Reply]:  # noqa: PLR0912  # every routing rule of one call
        """Send ``call`` until a 2xx answer; raise the typed error otherwise."""
        content = _content(call)
        s = self.settings
        deadline = self.clock() + s.deadline_s
        if call.url is not None:  # one node, one try
            outcome = yield from self._send(self._request(call.url, call, content, deadline))
            if isinstance(outcome, Unreachable):
                raise _unavailable(f"{call.url}: {outcome.error}")
            if 200 <= outcome.status < 300:
                return outcome
            raise error_from_reply(outcome)
        r = _Round()
        while True:
            if r.attempts >= s.max_attempts or (r.attempts and self.clock() >= deadline):
                raise r.last or _unavailable(f"gave up after {r.attempts} requests")
            url = self._pick(call, r.skip)
            wait_s = 0.0
            if url is None and isinstance(r.last, TopicNotFoundError):
                raise r.last  # every replica that answered says so
            if url is None or r.redirects > s.max_redirects:
                if r.last is None or isinstance(r.last, BrokerUnavailableError):
                    r.last = _unavailable(
                        "no broker answered: "
                        + "; ".join(f"{u}: {e}" for u, e in r.unreachable.items())
                    )
            elif call.write and self.master is None:
                yield from self._discover(url, r, deadline, call.answer_timeout_s)
                continue
            else:
                r.attempts += 1
                outcome = yield from self._send(self._request(url, call, content, deadline))
                if isinstance(outcome, Unreachable):
                    r.not_there(url, outcome.error)
                    if url == self.master:
                        self.master = None
                    continue
                if 200 <= outcome.status < 300:
                    return outcome
                r.last = err = error_from_reply(outcome)
                if isinstance(err, NotMasterError):
                    r.redirects += 1
                    target = redirect_target(outcome, err)
                    self.master = target if target not in (None, url) else None
                    if self.master is not None and self.master not in r.skip:
                        continue
                    self.master = None
                elif isinstance(err, CorruptEntryError) and not call.write:
                    r.skip.add(url)  # another replica's copy is intact: ask the next one
                    continue
                elif isinstance(err, TopicNotFoundError) and not call.write and url != self.master:
                    # A follower behind the master has not applied the topic's creation
                    # yet (another client just made it): ask the others before believing it.
                    r.skip.add(url)
                    continue
                elif err.code in RETRIED:
                    if err.code not in _SAME_MASTER:
                        self.master = None  # leadership may have moved: rediscover
                    wait_s = retry_after_s(outcome, err)
                else:
                    raise err
            # Back off, then start a new round over every broker.
            delay = max(backoff_delay_s(r.backoffs, s, self.rng), wait_s)
            if self.clock() + delay > deadline:
                assert r.last is not None
                raise r.last
            r.next_round()
            yield Sleep(delay)

    def _discover(
        self, url: str, r: _Round, deadline: float, answer_timeout_s: float | None = None
    ) -> Gen[None]:
        """Master discovery: ask ``url`` who the master is. A master named that gave no
        answer this round (paused, cut off; the others have not noticed yet) is not
        asked again before the next round."""
        r.attempts += 1
        call = Call("GET", "/v1/cluster", answer_timeout_s=answer_timeout_s)
        outcome = yield from self._send(self._request(url, call, None, deadline))
        if isinstance(outcome, Unreachable):
            r.not_there(url, outcome.error)
            return
        r.skip.add(url)
        if outcome.status >= 500:
            r.last = error_from_reply(outcome)
            return
        if outcome.status != 200:
            raise error_from_reply(outcome)  # e.g. 401: no use asking the others
        self.master = master_url_from(url, outcome.body)
        if self.master in r.silent:
            r.last = NoMasterError(
                NoMasterError.CODE, f"{url} names {self.master}, which did not answer", 503
            )
            self.master = None
        elif self.master is None:
            r.last = NoMasterError(NoMasterError.CODE, f"{url} knows no master yet", 503)
        else:
            r.skip.discard(self.master)

    def get(self, path: str, params: Mapping[str, str | int] | None = None) -> Gen[Any]:
        reply = yield from self.exchange(Call("GET", path, params))
        return reply.body

    def write(self, method: str, path: str, body: Any = None) -> Gen[Reply]:
        return (yield from self.exchange(Call(method, path, body=body, write=True)))
