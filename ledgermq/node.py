"""One LedgerMQ node: the Raft runtime, the broker and the HTTP API on one event loop.

``ledgermq broker`` (and ``python -m ledgermq``) land in ``main``: options → settings →
``serve``. uvicorn serves the app and the broker inside this process's uvloop loop; the
Raft runtime runs on a uvloop loop of its own in a thread of its own (``--raft-thread``,
docs/architecture.md), so no request delays its heartbeats. SIGINT/SIGTERM stop
the HTTP server first (no new requests), then the broker (dispatch checkpoint, log
close), so a stopped node restarts without a rebuild.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import uvicorn

from api.app import create_app
from api.auth import TokenTable
from api.http_protocol import ConnectionLimits, guarded_protocol
from api.metrics import METRICS_CACHE_S
from api.rocketmq.auth import AccessKeys, Authenticator
from api.rocketmq.settings import GrpcSettings, default_grpc_address, parse_grpc_peers
from broker.broker import Broker
from broker.settings import BrokerSettings, Limits
from consumequeue import ConsumeQueueSettings
from dledger.core.settings import CoreSettings
from dledger.runtime.peer_auth import load_peer_secret
from dledger.runtime.transport import TransportSettings, is_loopback, parse_address
from dledger.store import StoreSettings

from .cli.util import add_option, env_name, fail

log = logging.getLogger("ledgermq.node")

EXIT_NODE_FAILED = 70  # EX_SOFTWARE: the node stopped working (crash-only); restart it


class NodeFailedError(RuntimeError):
    """The node stopped working while serving (a dead task, a failed fsync): the process
    exits non-zero so a supervisor restarts it and recovery runs."""


MiB = 1 << 20
# Limits.* exposed as --max-... options (docs/http.md).
LIMIT_OPTIONS = (
    "max_body_bytes",
    "max_properties_bytes",
    "max_messages_per_request",
    "max_request_bytes",
    "max_pull_messages",
    "max_arrow_pull_messages",
    "max_wait_ms",
    "max_small_body_bytes",
    "max_json_strings_per_message",
    "max_response_bytes",
    "max_arrow_page_bytes",
    "max_long_polls",
    "max_long_polls_per_client",
    "max_topics",
    "max_total_queues",
)
# What each of them bounds (``--help`` and docs/reference/configuration.md).
LIMIT_HELP = {
    "max_body_bytes": "bytes of one message body (413 past it)",
    "max_properties_bytes": "bytes of one message's properties (413 past it)",
    "max_messages_per_request": "messages in one produce request (413 past it)",
    "max_request_bytes": "bytes of one produce request body (413 past it)",
    "max_pull_messages": "messages one pull or group pull answers at most",
    "max_arrow_pull_messages": "messages one Arrow pull page answers at most",
    "max_wait_ms": "longest wait_ms of a long poll",
    "max_small_body_bytes": "bytes of a request body other than a produce (413 past it)",
    "max_json_strings_per_message": "JSON strings and scalars per message of a produce body",
    "max_response_bytes": "stored message bytes one pull answers (at least one message)",
    "max_arrow_page_bytes": "record bytes of one Arrow pull page (at least one message)",
    "max_long_polls": "parked long polls on this node (429 BUSY past it)",
    "max_long_polls_per_client": "parked long polls of one client (429 BUSY past it)",
    "max_topics": "topics (429 LIMIT_REACHED for a new one past it)",
    "max_total_queues": "queues of all topics (429 LIMIT_REACHED past it)",
}


GC_THRESHOLDS = (20_000, 20, 100)
"""``--gc-thresholds``' default. With Python's own (700, 10, 10), the master of an HTTP
produce run (100 messages a request, 16 clients, 24k msg/s) spent 1.1 s of 13 in 2,057
collections that freed nothing; with these, one collection of 4 ms. The broker's hot
paths make few reference cycles."""


def tune_gc(thresholds: tuple[int, int, int] | None) -> None:
    """Move what startup built (modules, recovered state) out of the collector's sight
    (``gc.freeze``), then collect young objects less often. Cycles are still collected:
    every ``thresholds[0]`` net allocations in the youngest generation, and so on."""
    if thresholds is None:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    log.info(
        "garbage collector: thresholds %s, %d objects of startup frozen",
        ",".join(map(str, thresholds)),
        gc.get_freeze_count(),
    )


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    # Seconds a stopping node lets in-flight requests (long polls included) finish.
    graceful_shutdown_s: int = 5
    access_log: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    auth_token: str | None = None  # docs/operations.md: every /v1 request needs it when set
    auth_tokens: TokenTable | None = None  # tokens with scopes (--auth-tokens-file)
    # /metrics needs a token too (it names every topic); None: when the node has tokens.
    metrics_need_auth: bool | None = None
    # Open connections, and requests in flight, before a new one is answered 503 (an
    # idle connection gives way first: api/http_protocol.py): each holds a descriptor
    # and buffers. uvicorn's limit_concurrency, for the requests in flight.
    max_connections: int = 2048
    # Per-client connections, header caps and read deadlines (api/http_protocol.py).
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    # A rendered /metrics answers the scrapes of this many seconds (api/metrics.py).
    metrics_cache_s: float = METRICS_CACHE_S
    # Where --auth-token came from: on the command line it shows in ps (a warning).
    auth_token_in_argv: bool = False
    # The cyclic garbage collector's generation thresholds once the node has started
    # (``tune_gc``; the node's command line defaults to GC_THRESHOLDS); None keeps the
    # process's own, as a node served inside another program (a test) should.
    gc_thresholds: tuple[int, int, int] | None = None
    # Peers whose X-Forwarded-For / X-Forwarded-Proto are believed (reverse proxies:
    # comma-separated addresses or networks, "*" for any); none by default, so a client
    # cannot pass for another one (per-client limits count the socket's address).
    forwarded_allow_ips: str = ""

    # The RocketMQ 5 gRPC front (``--grpc``; None: off).
    grpc: GrpcSettings | None = None
    # RocketMQ 5 clients' access keys, secrets and scopes (--access-keys-file).
    access_keys: AccessKeys | None = None

    @property
    def has_tokens(self) -> bool:
        return self.auth_token is not None or self.auth_tokens is not None

    @property
    def grpc_auth(self) -> bool:
        """gRPC calls must be signed: the node has tokens (HTTP needs them, so gRPC must
        not be a way round them) or access keys."""
        return self.has_tokens or self.access_keys is not None


# ---- logging --------------------------------------------------------------------------------


class _NodeFilter(logging.Filter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self.node_id
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "node": getattr(record, "node_id", None),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def setup_logging(node_id: str, level: str = "INFO", fmt: str = "text") -> None:
    """Every line carries the node id: ``... node=n1 broker.role: ...`` or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_NodeFilter(node_id))
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s node=%(node_id)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---- start-up checks ------------------------------------------------------------------------


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit: every queue holds
    descriptors (consume-queue and key-index files), every connection one, and the
    common soft default (1,024) runs out at ~130 topics, which then breaks segment
    creation. Returns (soft, hard) as they are now, and logs them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's nr_open default
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, want, e)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.info("open files limit: %d (hard limit %d)", soft, hard)
    return soft, hard


def exposure_warnings(http: HttpSettings) -> list[str]:
    """What an operator should know about how this node is exposed, said at start."""
    out = []
    if http.auth_token_in_argv:
        out.append(
            "--auth-token on the command line shows in ps and /proc/*/cmdline: set "
            "LEDGERMQ_AUTH_TOKEN instead, or list it in --auth-tokens-file (TOKEN admin)"
        )
    if not http.has_tokens and not is_loopback(http.host):
        out.append(
            f"HTTP on {http.host}:{http.port} without --auth-token or --auth-tokens-file: "
            "anyone who reaches it may produce, consume and delete topics"
        )
    if http.grpc is not None and not http.grpc_auth and not is_loopback(http.grpc.host):
        out.append(
            f"gRPC (RocketMQ 5) on {http.grpc.host}:{http.grpc.port} without tokens or"
            " --access-keys-file: anyone who reaches it may produce and consume"
            " (--grpc off turns it off)"
        )
    if http.grpc is not None and http.grpc_auth and http.access_keys is None:
        out.append(
            "gRPC (RocketMQ 5) refuses every call: this node has tokens but no"
            " --access-keys-file for RocketMQ clients' AK/SK credentials"
        )
    return out


# ---- serving --------------------------------------------------------------------------------


async def _watch_parent(server: uvicorn.Server, parent: int) -> None:
    while not server.should_exit:
        await asyncio.sleep(0.5)
        if os.getppid() != parent:
            log.warning("parent process %d is gone; stopping", parent)
            _request_exit(server)


async def serve(
    settings: BrokerSettings,
    http: HttpSettings,
    *,
    exit_with_parent: bool = False,
    broker: Broker | None = None,
) -> None:
    """Start the broker (``broker``, or one made from ``settings``), serve HTTP until
    SIGINT/SIGTERM (or, with ``exit_with_parent``, until the parent process is gone),
    then stop both cleanly. Raises ``NodeFailedError`` when it stopped because the node
    failed (crash-only: the process exits non-zero)."""
    broker = broker or Broker(settings)
    started = time.monotonic()
    raise_file_limit()
    for warning in exposure_warnings(http):
        log.warning("%s", warning)
    await broker.start()
    tune_gc(http.gc_thresholds)
    app = create_app(
        settings,
        broker,
        auth_token=http.auth_token,
        auth_tokens=http.auth_tokens,
        metrics_need_auth=http.metrics_need_auth,
        metrics_cache_s=http.metrics_cache_s,
    )
    metrics = app.state.metrics
    protocol, connections = guarded_protocol(
        http.connection_limits,
        http.max_connections,
        on_drop=lambda reason: metrics.http_dropped.labels(reason).inc(),
    )
    metrics.http_connections.set_function(lambda: connections.open)
    config = http_config(app, http, protocol)
    server = _Server(config, http.connection_limits.tls_handshake_timeout_s)
    front = None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _request_exit, server)

    def on_failure(e: BaseException) -> None:
        log.critical(
            "node %s failed (%r): stopping, exit %d", settings.node_id, e, EXIT_NODE_FAILED
        )
        server.should_exit = server.force_exit = True  # no grace for long polls

    broker.server.add_failure_handler(on_failure)
    if broker.failed is not None:
        on_failure(broker.failed)
    log.info(
        "node %s of group %s: HTTP on %s:%d, Raft on %s, data in %s (started in %.0f ms)",
        settings.node_id,
        settings.group,
        http.host,
        http.port,
        settings.peer_map[settings.node_id],
        settings.data_dir,
        (time.monotonic() - started) * 1000,
    )
    watchdog = None
    if exit_with_parent:
        watchdog = asyncio.create_task(_watch_parent(server, os.getppid()))
    try:
        auth = None
        if http.grpc is not None and http.grpc_auth:
            auth = Authenticator(http.access_keys, http.grpc.auth_max_skew_s)
        front = await start_rocketmq_front(settings, http.grpc, broker, auth)
        await server.serve()
        if not server.started:
            raise OSError(f"could not serve HTTP on {http.host}:{http.port}")
    finally:
        if watchdog is not None:
            watchdog.cancel()
        log.info("node %s: stopping", settings.node_id)
        if front is not None:
            await front.stop()
        await broker.stop()
        log.info("node %s: stopped", settings.node_id)
    if broker.failed is not None:
        raise NodeFailedError(repr(broker.failed))


async def start_rocketmq_front(
    settings: BrokerSettings,
    grpc: GrpcSettings | None,
    broker: Broker,
    auth: Authenticator | None = None,
) -> Any:
    """The node's RocketMQ 5 gRPC front, serving (``api.rocketmq.server.RocketMQFront``),
    checking every call's signature with ``auth`` (None: none checked);
    None when it is off, or when its generated protocol modules are missing or do not
    load (the node serves HTTP all the same and says why)."""
    if grpc is None:
        return None
    try:
        from api.rocketmq.server import RocketMQFront  # noqa: PLC0415  # needs tools/protos.py
    except Exception as e:  # missing modules, or grpcio/protobuf older than the generated code
        log.warning(
            "no gRPC front (RocketMQ 5 clients): its protocol modules do not load (%s: %s);"
            " run `python tools/protos.py` (make setup does) and restart",
            type(e).__name__,
            e,
        )
        return None
    front = RocketMQFront(settings, grpc, broker, auth)
    try:
        port = await front.start()
    except OSError as e:
        if grpc.required:
            raise
        log.warning("no gRPC front (RocketMQ 5 clients) on its default address: %s", e)
        await front.stop()
        return None
    log.info(
        "node %s: gRPC (RocketMQ 5) on %s:%d%s",
        settings.node_id,
        grpc.host,
        port,
        "" if auth is None else f", {len(auth.keys)} access keys",
    )
    return front


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: it would swap our loop's handlers out
    and re-raise the signal after its shutdown, killing the process before the broker
    stops. The loop's handlers (``_request_exit``) do the same job.

    Its TLS handshakes are bounded by ``tls_handshake_timeout_s``: uvicorn creates its
    server with the loop's default (60 s), and a connection is the protocol's (its
    limits and deadlines) only once its handshake is done, so a client that connects and
    never says hello held a socket for a minute."""

    def __init__(self, config: uvicorn.Config, tls_handshake_timeout_s: float = 5.0) -> None:
        super().__init__(config)
        self.tls_handshake_timeout_s = tls_handshake_timeout_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop: Any = asyncio.get_running_loop()
        create = loop.create_server
        timeout_s = self.tls_handshake_timeout_s

        async def create_server(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout_s)
            return await create(*args, **kwargs)

        loop.create_server = create_server  # (for uvicorn's call alone)
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server


def http_config(app: Any, http: HttpSettings, protocol: Any = "httptools") -> uvicorn.Config:
    """uvicorn's configuration of a node's HTTP server: on the running loop (the
    broker's; the Raft runtime's too with ``--no-raft-thread``), the ``protocol`` class
    (``guarded_protocol``'s: header caps and read deadlines), forwarded headers believed
    only from ``http.forwarded_allow_ips``."""
    return uvicorn.Config(
        app,
        host=http.host,
        port=http.port,
        loop="none",  # this loop: the broker's
        http=protocol,
        lifespan="off",
        log_config=None,
        access_log=http.access_log,
        timeout_graceful_shutdown=http.graceful_shutdown_s,
        ssl_certfile=http.ssl_certfile,
        ssl_keyfile=http.ssl_keyfile,
        limit_concurrency=http.max_connections,
        proxy_headers=bool(http.forwarded_allow_ips),
        forwarded_allow_ips=http.forwarded_allow_ips or None,
    )


def _request_exit(server: uvicorn.Server) -> None:
    if server.should_exit:  # a second Ctrl-C: do not wait for long polls
        server.force_exit = True
    server.should_exit = True


# ---- options --------------------------------------------------------------------------------


def _gc_thresholds(spec: str | tuple[int, int, int]) -> tuple[int, int, int] | None:
    if isinstance(spec, tuple):  # the default
        return spec
    if spec.strip().lower() == "python":
        return None
    try:
        g0, g1, g2 = (int(x) for x in spec.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: want G0,G1,G2 (integers) or python") from None
    if min(g0, g1, g2) < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: every threshold must be at least 1")
    return g0, g1, g2


def _peer_urls(spec: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        node, sep, url = part.partition("=")
        if not sep or not node or not url.startswith(("http://", "https://")):
            raise ValueError(f"{part!r}: want node=http://host:port")
        out[node] = url.rstrip("/")
    return out


def add_broker_options(p: argparse.ArgumentParser) -> None:
    """The options of ``ledgermq broker`` (docs/operations.md), each also ``LEDGERMQ_<NAME>``."""
    _add_membership_options(p)
    _add_data_options(p)
    _add_raft_timing_options(p)
    _add_disk_options(p)
    _add_transaction_options(p)
    add_option(
        p,
        "--join",
        action="store_true",
        help="join a running group as a learner: --peers names its current members and"
        " this node; then run `ledgermq cluster add` (docs/operations.md)",
    )
    add_option(
        p,
        "--raft-thread",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run Raft on a thread and event loop of its own, where no HTTP request can"
        " delay its heartbeats and votes (off: on the HTTP loop)",
    )
    add_option(
        p,
        "--peer-address-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a member's Raft frames must come from its configured host (off behind NAT)",
    )
    _add_limit_options(p)
    _add_logging_options(p)
    _add_security_options(p)
    add_option(
        p,
        "--max-http-connections",
        type=int,
        default=HttpSettings().max_connections,
        help="open HTTP connections and requests in flight before 503 (an idle connection"
        " is closed first to make room)",
    )
    _add_connection_options(p)
    add_option(
        p,
        "--gc-thresholds",
        type=_gc_thresholds,
        default=GC_THRESHOLDS,
        help="the garbage collector's generation thresholds G0,G1,G2 once started "
        "(gc.set_threshold; 'python' keeps Python's own)",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the parent process goes away (local clusters, tests)",
    )


def _add_membership_options(p: argparse.ArgumentParser) -> None:
    """This node, its group, its peers, and the URLs redirects name."""
    add_option(p, "--node-id", default="n0", help="this node's id among --peers")
    add_option(p, "--group", default="g0", help="the DLedger group (broker name)")
    add_option(
        p,
        "--peers",
        default=None,
        help='Raft members, "n0-host:port;n1-host:port" (default: this node alone on '
        "the HTTP port + 1000)",
    )
    add_option(p, "--http", default="127.0.0.1:8080", help="HTTP listen address host:port")
    add_option(
        p,
        "--advertised-url",
        default=None,
        help="this node's URL for clients and redirects (default: http(s)://HOST:PORT of --http,"
        " 127.0.0.1 for a wildcard host: set it on every node other hosts reach)",
    )
    add_option(p, "--peer-urls", default="", help='"n0=http://h0:8080,n1=..." for redirects')
    add_option(
        p,
        "--console-urls",
        default="",
        help='"n0=http://localhost:8080,n1=..." where a browser reaches each node, when that'
        " is not its --peer-urls URL (the web console; default: the --peer-urls ones)",
    )
    add_option(
        p,
        "--grpc",
        default=None,
        help="RocketMQ 5 gRPC listen address host:port, or off (default: the --http host,"
        " its port + 2000)",
    )
    add_option(
        p,
        "--peer-grpc",
        default="",
        help='"n0=h0:10080,n1=..." every node\'s gRPC address, where a slave forwards what'
        " needs the master (default: each --peer-urls host, its port + 2000)",
    )


def _add_data_options(p: argparse.ArgumentParser) -> None:
    """Where the data lives, how appends are synced, and new topics."""
    add_option(
        p,
        "--data-dir",
        type=Path,
        default=Path("ledgermq-data"),
        help="the node's commitlog, consume queues, key index and snapshots",
    )
    add_option(
        p,
        "--flush",
        choices=("sync", "async"),
        default="sync",
        help="sync: an entry is fsynced before it counts towards a commit; async: every 10 ms",
    )
    add_option(
        p,
        "--auto-create-topics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create unknown topics on first produce",
    )
    add_option(p, "--default-queues", type=int, default=8, help="queues of a new topic")
    add_option(
        p,
        "--batch-records",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store a request's messages for one queue as one batch record (one log entry)",
    )


# ConnectionLimits' fields as options (docs/http.md#limits): (field, option, help).
CONNECTION_OPTIONS = (
    (
        "max_connections_per_client",
        "--max-http-connections-per-client",
        "open HTTP connections of one client address (its idle ones give way first)",
    ),
    ("max_header_count", "--max-http-headers", "headers of one request (431 past it)"),
    (
        "max_header_bytes",
        "--max-http-header-bytes",
        "request line and headers of one request, bytes (431 past it)",
    ),
    (
        "first_request_timeout_s",
        "--http-first-request-timeout-s",
        "seconds a new connection may stay silent before it is closed",
    ),
    (
        "tls_handshake_timeout_s",
        "--http-tls-handshake-timeout-s",
        "seconds an HTTPS connection may take to complete its TLS handshake (and a gRPC"
        " one its handshake)",
    ),
    (
        "header_timeout_s",
        "--http-header-timeout-s",
        "seconds from a request's first byte to the end of its headers (408 past it)",
    ),
    (
        "body_timeout_s",
        "--http-body-timeout-s",
        "seconds a request body may go silent (408 past it)",
    ),
    (
        "min_body_rate_bytes_s",
        "--http-min-body-rate",
        "bytes/s a request body must average once past the grace (408 under it; 0: off)",
    ),
    (
        "body_rate_grace_s",
        "--http-body-rate-grace-s",
        "seconds at the start of a body exempt from the minimum rate",
    ),
)


def _add_connection_options(p: argparse.ArgumentParser) -> None:
    """Per-client connections, header caps, read deadlines, the /metrics cache."""
    defaults = ConnectionLimits()
    for name, option, help_text in CONNECTION_OPTIONS:
        default = getattr(defaults, name)
        add_option(p, option, type=type(default), default=default, help=help_text)
    add_option(
        p,
        "--metrics-cache-s",
        type=float,
        default=METRICS_CACHE_S,
        help="seconds a rendered /metrics answers scrapes (0: render every scrape)",
    )
    add_option(
        p,
        "--forwarded-allow-ips",
        default="",
        help="reverse proxies whose X-Forwarded-For/-Proto are believed (comma-separated "
        "addresses or networks, '*': any); default none: the socket's address counts",
    )


def _add_raft_timing_options(p: argparse.ArgumentParser) -> None:
    """Election and heartbeat timing."""
    add_option(
        p,
        "--profile",
        choices=("fast", "dledger"),
        default="fast",
        help="Raft timing: fast (ours: 200 ms heartbeats, pre-vote) or dledger (DLedger's 2 s"
        " heartbeats, 6 s election timeout, no pre-vote nor early pre-vote)",
    )
    add_option(
        p,
        "--heartbeat-ms",
        type=int,
        default=None,
        help="the profile's heartbeat interval, overridden (an election follows 3 missed"
        " heartbeats)",
    )


def _add_disk_options(p: argparse.ArgumentParser) -> None:
    """Commitlog segments, retention by age, and the full-disk guard."""
    add_option(
        p,
        "--data-file-mb",
        type=int,
        default=1024,
        help="commitlog segment size, MiB (its index file: 1/32 of it)",
    )
    add_option(
        p,
        "--file-reserved-hours",
        type=float,
        default=72.0,
        help="retention by age, hours: older commitlog segments are deleted",
    )
    add_option(
        p,
        "--disk-full-ratio",
        type=float,
        default=StoreSettings().disk_full_ratio,
        help="appends are refused (507 DISK_FULL) above this share of the disk in use",
    )
    add_option(
        p,
        "--disk-reserve-mb",
        type=int,
        default=None,
        help="writes are refused while less is free (default: one key-index file and four"
        " consume-queue segments, ~66 MiB)",
    )
    add_option(
        p,
        "--max-open-queues",
        type=int,
        default=ConsumeQueueSettings().max_open_queues,
        help="consume queues whose files are open and mapped at once (two descriptors and a"
        " mapping a segment); past it the least recently used synced ones are closed,"
        " and opened again when used",
    )
    add_option(
        p,
        "--dispatch-checkpoint-interval-ms",
        type=int,
        default=BrokerSettings.__dataclass_fields__["dispatch_checkpoint_interval_ms"].default,
        help="how often the consume queues and the key index are synced and the dispatch"
        " checkpoint written (beside dispatch); a restart replays the entries after it",
    )
    add_option(
        p,
        "--role-history-size",
        type=int,
        default=BrokerSettings.__dataclass_fields__["role_history_size"].default,
        help="role changes kept in memory for GET /v1/cluster/history (the console's"
        " master history): elections, leaders learned, promotions, transfers",
    )
    add_option(
        p,
        "--queue-reserve-units",
        type=int,
        default=ConsumeQueueSettings().max_reserve_units,
        help="a consume queue's disk blocks are allocated ahead of its writes in chunks"
        " doubling from a page up to this many 20-byte units",
    )


# BrokerSettings' transaction check schedule as options (docs/http.md, "Transactions"):
# (field, option, help).
TRANSACTION_OPTIONS = (
    (
        "tx_first_check_ms",
        "--tx-first-check-ms",
        "an unresolved transaction's first check, ms after it was stored",
    ),
    (
        "tx_check_interval_ms",
        "--tx-check-interval-ms",
        "ms between the later checks of an unresolved transaction",
    ),
    ("tx_max_checks", "--tx-max-checks", "checks of an unresolved transaction before its rollback"),
)


def _add_transaction_options(p: argparse.ArgumentParser) -> None:
    """When unresolved transactions are checked, and how often before a rollback; what
    the send window of RocketMQ message ids holds."""
    defaults = BrokerSettings()
    for name, option, help_text in (*TRANSACTION_OPTIONS, *SEND_WINDOW_OPTIONS):
        add_option(p, option, type=int, default=getattr(defaults, name), help=help_text)


# BrokerSettings' send window (broker/sendwindow.py, docs/rocketmq.md) as options: a
# RocketMQ client's message id resent within it is stored once.
SEND_WINDOW_OPTIONS = (
    (
        "send_window_ids",
        "--send-window-ids",
        "RocketMQ message ids remembered so that a resent one is stored once (the same on"
        " every node)",
    ),
    (
        "send_window_ms",
        "--send-window-ms",
        "ms of log time a RocketMQ message id is remembered for (the same on every node)",
    ),
)


def _add_limit_options(p: argparse.ArgumentParser) -> None:
    """The request limits (``Limits``), one option each."""
    limits = Limits()
    for name in LIMIT_OPTIONS:
        add_option(
            p,
            "--" + name.replace("_", "-"),
            type=int,
            default=getattr(limits, name),
            help=LIMIT_HELP[name],
        )


def _add_logging_options(p: argparse.ArgumentParser) -> None:
    """Log level and format."""
    add_option(p, "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    add_option(
        p,
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="lines of text, or a JSON object per line; each names the node",
    )


def _add_security_options(p: argparse.ArgumentParser) -> None:
    """TLS, bearer tokens, the Raft peer secret, and who may read /metrics."""
    add_option(
        p,
        "--ssl-certfile",
        default=None,
        help="serve HTTPS with this certificate (PEM, the chain after it); the advertised"
        " URL is then https",
    )
    add_option(p, "--ssl-keyfile", default=None, help="its private key (PEM)")
    add_option(
        p,
        "--peer-ca-file",
        default=None,
        help="with TLS: the CAs (PEM) this node trusts when it calls its peers (gRPC calls"
        " forwarded to the master); default: $SSL_CERT_FILE, else the system's",
    )
    add_option(p, "--auth-token", default=None, help="require this bearer token on /v1")
    add_option(
        p,
        "--auth-tokens-file",
        type=Path,
        default=None,
        help="tokens with scopes, one per line: TOKEN admin|produce[:TOPIC]|consume[:TOPIC]...",
    )
    add_option(
        p,
        "--access-keys-file",
        type=Path,
        default=None,
        help="RocketMQ 5 clients' credentials, one per line: ACCESS_KEY SECRET_KEY scopes"
        " (as --auth-tokens-file's); with it or with tokens every gRPC call must be signed",
    )
    add_option(
        p,
        "--grpc-auth-max-skew-s",
        type=float,
        default=900.0,
        help="refuse a signed gRPC call whose x-mq-date-time is further than this from the"
        " node's clock (how long a captured signature stays good)",
    )
    add_option(
        p,
        "--peer-secret",
        default=None,
        help="Raft connections authenticate with this shared secret (docs/operations.md); "
        "visible in ps: prefer --peer-secret-file or the environment variable",
    )
    add_option(
        p, "--peer-secret-file", type=Path, default=None, help="read the peer secret from a file"
    )
    add_option(
        p,
        "--metrics-auth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="/metrics needs a token too (default: when the node has tokens; "
        "--no-metrics-auth opens it)",
    )


def settings_from_args(args: argparse.Namespace) -> tuple[BrokerSettings, HttpSettings]:
    host, port = parse_address(args.http)
    scheme = "https" if args.ssl_certfile else "http"  # what redirects and clients need
    advertised = (
        args.advertised_url or f"{scheme}://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    )
    peers = args.peers or f"{args.node_id}-127.0.0.1:{port + 1000}"
    peer_urls = _peer_urls(args.peer_urls)
    peer_urls.setdefault(args.node_id, advertised.rstrip("/"))
    grpc = _grpc_settings(args.grpc, host, port)
    if grpc is not None:
        if not args.grpc_auth_max_skew_s > 0:
            raise ValueError("--grpc-auth-max-skew-s must be > 0")
        grpc = replace(
            grpc,
            auth_max_skew_s=args.grpc_auth_max_skew_s,
            handshake_timeout_s=args.http_tls_handshake_timeout_s,
        )
        if args.ssl_certfile:  # one certificate for HTTPS and gRPC
            grpc = replace(
                grpc,
                certfile=args.ssl_certfile,
                keyfile=args.ssl_keyfile or args.ssl_certfile,
                peer_ca_file=args.peer_ca_file,
            )
    peer_grpc = _peer_grpc(args.peer_grpc, peer_urls)
    if grpc is not None:  # this node's own address: where it listens, unless a wildcard
        own_host = (
            grpc.host
            if not _wildcard(grpc.host)
            else parse_address(advertised.split("://", 1)[-1].rstrip("/"))[0]
        )
        peer_grpc[args.node_id] = f"{own_host}:{grpc.port}"
    core = CoreSettings.dledger() if args.profile == "dledger" else CoreSettings()
    if args.heartbeat_ms is not None:
        core = replace(core, heartbeat_interval_ms=args.heartbeat_ms)
    store = StoreSettings(
        data_file_size=args.data_file_mb * MiB,
        index_file_size=max(1, args.data_file_mb // 32) * MiB,
        file_reserved_hours=args.file_reserved_hours,
        disk_full_ratio=args.disk_full_ratio,
        disk_clean_ratio=min(StoreSettings().disk_clean_ratio, args.disk_full_ratio),
    )
    limits = Limits(**{name: getattr(args, name) for name in LIMIT_OPTIONS})
    settings = BrokerSettings(
        limits=limits,
        node_id=args.node_id,
        group=args.group,
        peers=peers,
        data_dir=args.data_dir,
        flush=args.flush,
        peer_urls=peer_urls,
        console_urls=_peer_urls(args.console_urls),
        peer_grpc=peer_grpc,
        advertised_url=advertised.rstrip("/"),
        auto_create_topics=args.auto_create_topics,
        raft_thread=args.raft_thread,
        join=args.join,
        default_queues=args.default_queues,
        batch_records=args.batch_records,
        core=core,
        store=store,
        transport=TransportSettings(
            peer_secret=load_peer_secret(args.peer_secret, args.peer_secret_file),
            check_peer_address=args.peer_address_check,
        ),
        disk_reserve_bytes=None if args.disk_reserve_mb is None else args.disk_reserve_mb * MiB,
        dispatch_checkpoint_interval_ms=args.dispatch_checkpoint_interval_ms,
        role_history_size=args.role_history_size,
        consume_queue=ConsumeQueueSettings(
            max_open_queues=args.max_open_queues, max_reserve_units=args.queue_reserve_units
        ),
        **{
            name: getattr(args, _dest(option))
            for name, option, _ in (*TRANSACTION_OPTIONS, *SEND_WINDOW_OPTIONS)
        },
    )
    http = HttpSettings(
        host=host,
        port=port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        auth_token=args.auth_token or None,
        auth_tokens=_tokens_file(args.auth_tokens_file),
        metrics_need_auth=args.metrics_auth,
        max_connections=args.max_http_connections,
        connection_limits=ConnectionLimits(
            **{name: getattr(args, _dest(option)) for name, option, _ in CONNECTION_OPTIONS}
        ),
        metrics_cache_s=args.metrics_cache_s,
        forwarded_allow_ips=args.forwarded_allow_ips,
        gc_thresholds=args.gc_thresholds,
        grpc=grpc,
        access_keys=None
        if args.access_keys_file is None
        else AccessKeys.from_file(args.access_keys_file),
        auth_token_in_argv=bool(args.auth_token)
        and args.auth_token != os.environ.get(env_name("--auth-token")),
    )
    return settings, http


def _wildcard(host: str) -> bool:
    return host.strip("[]") in ("0.0.0.0", "::", "")


def _grpc_settings(spec: str | None, http_host: str, http_port: int) -> GrpcSettings | None:
    """``--grpc``: off, an address, or (None) the default next to the HTTP port."""
    if spec is not None and spec.strip().lower() == "off":
        return None
    if spec is None:
        host, port = default_grpc_address(http_host, http_port)
        return GrpcSettings(host=host, port=port) if port <= 65_535 else None
    host, port = parse_address(spec)
    return GrpcSettings(host=host, port=port, required=True)


def _peer_grpc(spec: str, peer_urls: dict[str, str]) -> dict[str, str]:
    """``--peer-grpc``, and for every node it leaves out whose HTTP URL is known, that URL's
    host with its port + 2000 (the default of ``--grpc``)."""
    out = parse_grpc_peers(spec)
    for node, url in peer_urls.items():
        if node not in out:
            hostport = url.split("://", 1)[-1].rstrip("/")
            host, _, port = hostport.rpartition(":")
            if host and port.isdigit():
                grpc_host, grpc_port = default_grpc_address(host, int(port))
                out[node] = f"{grpc_host}:{grpc_port}"
    return out


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _tokens_file(path: Path | None) -> TokenTable | None:
    if path is None:
        return None
    try:
        return TokenTable.from_file(path)
    except OSError as e:
        raise ValueError(f"--auth-tokens-file {path}: {e.strerror or e}") from None


def run_broker(args: argparse.Namespace) -> int:
    try:
        settings, http = settings_from_args(args)
    except ValueError as e:
        fail(str(e))
    setup_logging(settings.node_id, args.log_level, args.log_format)
    try:
        import uvloop  # noqa: PLC0415  # optional on platforms without it

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    try:
        runner(serve(settings, http, exit_with_parent=args.exit_with_parent))
    except NodeFailedError as e:
        log.critical("node %s exits: %s", settings.node_id, e)
        return EXIT_NODE_FAILED
    except OSError as e:
        log.error("node %s: %s", settings.node_id, e)
        return 1
    except KeyboardInterrupt:  # pragma: no cover  # a signal before the loop took over
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ledgermq", description="one LedgerMQ node")
    add_broker_options(parser)
    return run_broker(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    os._exit(130)
