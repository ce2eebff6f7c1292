"""Network namespaces for tests: a lab of hosts on one switch, each with its own
network stack, addresses and ``/etc/hosts`` — what a compose network gives containers,
without an engine. Root only (``available()`` says whether this process may).

Layout of one ``NetLab`` (every name carries the lab's token, unique per test run):

- a hub namespace ``<lab>-hub`` holding the bridge ``br0`` (the switch);
- per host, a namespace ``<lab>-<host>`` whose ``eth0`` is one end of a veth pair, the
  other end (``v<i>``) a port of the bridge; ``lo`` is up, so a host reaches itself on
  127.0.0.1 as a container does;
- optionally the test's own cable: a veth ``lmq<token>h`` in the root namespace with the
  lab subnet's ``.1``, so the test process reaches every host directly;
- ``/etc/netns/<lab>-<host>/hosts`` naming every host (and its aliases), which
  ``ip netns exec`` binds over ``/etc/hosts`` for what it starts there.

Addresses come from 198.18.0.0/15 (RFC 2544: reserved for network tests, routed nowhere),
one /24 per lab, chosen under a lock among the ones this machine does not route yet.

Faults, for chaos tests:

- ``link_down(host)`` / ``link_up(host)``: the host's cable to the switch (its bridge port):
  cut off from everyone, packets silently dropped;
- ``cut(a, b)`` / ``heal(a, b)``: only between two hosts: each side's neighbour entry for
  the other points at a MAC nobody has, so their packets vanish silently, as on a
  partitioned network (no error reaches the sender; TCP just waits); with
  ``one_way=True`` only ``a``'s packets to ``b`` vanish (an asymmetric cut: ``b``'s
  still arrive).

Cleanup never leaks: ``close()`` kills what still runs in the lab's namespaces (only
processes the test started live there), deletes the root-side cable and the namespaces
(which destroys the bridge and every veth pair) and the ``/etc/netns`` directories; it is
idempotent and goes on past a failing step. ``remove_stale()`` does the same for labs
whose creating process is gone (its pid is in the lab's name): a run killed with SIGKILL
leaves nothing behind for long. Use ``NetLab`` as a context manager or from a fixture.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "lmqlab"
NETNS_ETC = Path("/etc/netns")
LOCK_FILE = Path("/run/lock/ledgermq-netlab.lock")
POOL = ipaddress.ip_network("198.18.0.0/15")
BOGUS_MAC = "02:00:00:00:00:01"  # locally administered, never on the switch
COMMAND_TIMEOUT_S = 20.0


def available() -> bool:
    """Root, and ``ip netns`` works here."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    r = subprocess.run(
        ["ip", "netns", "list"], check=False, capture_output=True, timeout=COMMAND_TIMEOUT_S
    )
    return r.returncode == 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["ip", *args], check=False, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    if check and r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    netns: str
    address: str
    port: str  # its bridge port in the hub
    aliases: tuple[str, ...] = ()


@dataclass
class NetLab:
    """One lab. ``add_host`` each host, then ``start()``; ``exec_prefix(host)`` runs a
    command there."""

    host_link: bool = True
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    hosts: dict[str, Host] = field(default_factory=dict)
    started: bool = False

    def __post_init__(self) -> None:
        self.name = f"{PREFIX}-{os.getpid()}-{self.token}"
        self.hub = f"{self.name}-hub"
        self.root_link = f"lmq{self.token}h"  # 12 bytes: interface names have 15
        self.subnet: ipaddress.IPv4Network | None = None
        self.test_address: str | None = None

    # ---- building ------------------------------------------------------------------------

    def add_host(self, name: str, aliases: Sequence[str] = ()) -> None:
        assert not self.started, "add every host before start()"
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name), f"bad host name {name!r}"
        self.hosts[name] = Host(
            name, f"{self.name}-{name}", "", f"v{len(self.hosts)}", tuple(aliases)
        )

    def start(self) -> None:
        """Create everything; on any failure, remove what was created and raise."""
        assert not self.started
        self.started = True
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        with _locked():
            self.subnet = _free_subnet()
            addrs = list(self.subnet.hosts())
            self.test_address = str(addrs[0])
            self.hosts = {
                h.name: Host(h.name, h.netns, str(addrs[10 + i]), h.port, h.aliases)
                for i, h in enumerate(self.hosts.values())
            }
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            if self.host_link:
                # Claimed under the lock: the subnet is routed from now on.
                self._cable(None, self.root_link, "vh")
                _ip("addr", "add", f"{self.test_address}/24", "dev", self.root_link)
                _ip("link", "set", self.root_link, "up")
        for h in self.hosts.values():
            _ip("netns", "add", h.netns)
            _ip("-n", h.netns, "link", "set", "lo", "up")
            self._cable(h.netns, "eth0", h.port)
            _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            etc = NETNS_ETC / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self.hosts_file())

    def _cable(self, netns: str | None, inside: str, port: str) -> None:
        """A veth pair: ``inside`` in ``netns`` (None: the root namespace), ``port`` a
        bridge port in the hub, up."""
        where = ["netns", netns] if netns is not None else []
        _ip(
            "link",
            "add",
            "name",
            inside,
            *where,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            self.hub,
        )
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")

    def hosts_file(self) -> str:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for h in self.hosts.values():
            lines.append("\t".join([h.address, h.name, *h.aliases]))
        return "\n".join(lines) + "\n"

    # ---- using ---------------------------------------------------------------------------

    def exec_prefix(self, host: str) -> list[str]:
        """Prepend to a command to run it in ``host``'s namespace (with its hosts file)."""
        return ["ip", "netns", "exec", self.hosts[host].netns]

    def address(self, host: str) -> str:
        return self.hosts[host].address

    def link_down(self, host: str) -> None:
        _ip("-n", self.hub, "link", "set", self.hosts[host].port, "down")

    def link_up(self, host: str) -> None:
        _ip("-n", self.hub, "link", "set", self.hosts[host].port, "up")

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop every packet between ``a`` and ``b`` (both directions, or only from
        ``a`` to ``b``), silently."""
        for x, y in ((a, b),) if one_way else ((a, b), (b, a)):
            _ip(
                "-n", self.hosts[x].netns, "neigh", "replace", self.hosts[y].address,
                "lladdr", BOGUS_MAC, "dev", "eth0", "nud", "permanent",
            )  # fmt: skip

    def heal(self, a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            _ip(
                "-n",
                self.hosts[x].netns,
                "neigh",
                "del",
                self.hosts[y].address,
                "dev",
                "eth0",
                check=False,
            )

    def pids(self) -> list[int]:
        out: list[int] = []
        for ns in self._namespaces():
            out.extend(_pids_in(ns))
        return out

    # ---- cleanup -------------------------------------------------------------------------

    def _namespaces(self) -> list[str]:
        return [h.netns for h in self.hosts.values()] + [self.hub]

    def close(self) -> None:
        """Remove everything of this lab; never raises for what is already gone."""
        _remove(self.name, self._namespaces(), self.root_link)

    def __enter__(self) -> NetLab:
        if not self.started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pids_in(netns: str) -> list[int]:
    r = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()] if r.returncode == 0 else []


def _remove(lab: str, namespaces: Sequence[str], root_link: str, timeout_s: float = 15.0) -> None:
    """Kill what runs in ``namespaces``, delete the cable and the namespaces, remove the
    hosts files. Each step runs even if an earlier one failed."""
    deadline = time.monotonic() + timeout_s
    existing = set(_netns_list())
    for ns in namespaces:
        if ns not in existing:
            continue
        while pids := _pids_in(ns):  # bounded by the deadline
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    _ip("link", "del", root_link, check=False)
    for ns in namespaces:
        if ns in existing:
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    for d in NETNS_ETC.glob(f"{lab}-*") if NETNS_ETC.is_dir() else ():
        shutil.rmtree(d, ignore_errors=True)


def _netns_list() -> list[str]:
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


_LAB_NS = re.compile(rf"^({PREFIX}-(\d+)-([0-9a-f]{{8}}))-[a-z0-9-]+$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove every lab whose creating process is gone; the labs removed."""
    if not available():
        return []
    labs: dict[str, tuple[int, str, list[str]]] = {}
    names = _netns_list()
    names += [d.name for d in NETNS_ETC.glob(f"{PREFIX}-*")] if NETNS_ETC.is_dir() else []
    for ns in names:
        m = _LAB_NS.match(ns)
        if m:
            lab, pid, token = m.group(1), int(m.group(2)), m.group(3)
            labs.setdefault(lab, (pid, token, []))[2].append(ns)
    removed = []
    for lab, (pid, token, namespaces) in sorted(labs.items()):
        if pid == os.getpid() or _alive(pid):
            continue
        _remove(lab, sorted(set(namespaces)), f"lmq{token}h")
        removed.append(lab)
    return removed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One lab at a time picks its subnet (concurrent test runs on one machine)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of the pool that no address or route of the root namespace touches."""
    used: list[ipaddress.IPv4Network] = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for token in _ip(*args, check=False).stdout.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(token, strict=False))
    candidates = list(POOL.subnets(new_prefix=24))
    start = secrets.randbelow(len(candidates))
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise OSError(f"no free /24 left in {POOL}")
