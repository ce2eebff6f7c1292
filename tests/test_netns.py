"""``tests.netns``: hosts reach each other by name in their own namespaces; a host's
link down cuts it from everyone and back up restores it; ``cut`` separates exactly two
hosts; ``close`` leaves no namespace, interface, hosts file or process behind; and a lab
whose test process was killed with SIGKILL is removed by ``remove_stale``. Root only:
CI runs as root, and without root there are no namespaces to test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.lines import Lines
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(
    not netns.available(), reason="network namespaces need root and iproute2"
)
PORT = 7070
# A one-line TCP echo server on the host's address (killed by lab.close at the latest).
SERVER = (
    "import socket, sys; s = socket.create_server((sys.argv[1], int(sys.argv[2]))); "
    "print('listening', flush=True)\n"
    "while True:\n c, _ = s.accept(); c.sendall(c.recv(64)); c.close()"
)
# Connect by name; exit 0 on an echo, 1 on a refusal or a timeout.
CLIENT = textwrap.dedent(
    """
    import socket, sys
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5) as c:
            c.sendall(b"ping"); c.settimeout(1.5); sys.exit(0 if c.recv(64) == b"ping" else 1)
    except OSError:
        sys.exit(1)
    """
)


@pytest.fixture
def lab() -> Iterator[netns.NetLab]:
    lab = netns.NetLab()
    for name in ("a", "b", "c"):
        lab.add_host(name, aliases=[f"{name}.lab"])
    with lab:
        servers = []
        for name in ("a", "b", "c"):
            p = subprocess.Popen(
                [
                    *lab.exec_prefix(name),
                    sys.executable,
                    "-c",
                    SERVER,
                    lab.address(name),
                    str(PORT),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            servers.append((p, Lines(p)))
        for _, out in servers:
            out.wait_for("listening", 30)
        yield lab
        for p, _ in servers:
            p.kill()
            p.wait(timeout=10)


def reaches(lab: netns.NetLab, src: str, dst: str) -> bool:
    r = subprocess.run(
        [*lab.exec_prefix(src), sys.executable, "-c", CLIENT, dst, str(PORT)],
        check=False,
        timeout=30,
    )
    return r.returncode == 0


def test_hosts_reach_each_other_by_name_and_the_test_reaches_them(lab: netns.NetLab) -> None:
    assert reaches(lab, "a", "b") and reaches(lab, "b", "c.lab") and reaches(lab, "c", "a")
    assert reaches(lab, "a", "a")  # itself, as a container reaches its own name
    hosts = Path(f"/etc/netns/{lab.hosts['a'].netns}/hosts").read_text()
    assert f"{lab.address('b')}\tb\tb.lab" in hosts
    r = subprocess.run(
        [sys.executable, "-c", CLIENT, lab.address("b"), str(PORT)], check=False, timeout=30
    )
    assert r.returncode == 0, "the test's own link reaches the hosts"
    assert lab.address("a").startswith("198.1")


def test_link_down_cuts_a_host_from_everyone_until_link_up(lab: netns.NetLab) -> None:
    lab.link_down("b")
    assert not reaches(lab, "a", "b") and not reaches(lab, "b", "c")
    assert reaches(lab, "a", "c")
    lab.link_up("b")
    assert reaches(lab, "a", "b") and reaches(lab, "b", "c")


def test_cut_separates_exactly_two_hosts_until_healed(lab: netns.NetLab) -> None:
    lab.cut("a", "b")
    assert not reaches(lab, "a", "b") and not reaches(lab, "b", "a")
    assert reaches(lab, "a", "c") and reaches(lab, "b", "c")
    lab.heal("a", "b")
    assert reaches(lab, "a", "b") and reaches(lab, "b", "a")


def _leftovers(name: str, token: str) -> list[str]:
    found = [n for n in netns._netns_list() if n.startswith(name)]
    links = subprocess.run(["ip", "-o", "link"], check=True, capture_output=True, text=True)
    found += [f"link {token}" for line in links.stdout.splitlines() if f"lmq{token}h" in line]
    found += [str(d) for d in netns.NETNS_ETC.glob(f"{name}-*")]
    return found


def test_close_leaves_nothing_behind_even_with_processes_inside() -> None:
    lab = netns.NetLab()
    lab.add_host("x")
    lab.start()
    p = subprocess.Popen([*lab.exec_prefix("x"), "sleep", "600"])
    try:
        # `ip netns exec` enters the namespace after the fork: wait for it to be inside.
        wait_until(lambda: lab.pids() == [p.pid], 10, "the child inside the namespace")
    except AssertionError:
        p.kill()
        p.wait(timeout=10)
        raise
    finally:
        lab.close()
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert _leftovers(lab.name, lab.token) == []
    lab.close()  # idempotent


def test_a_lab_of_a_killed_run_is_removed_as_stale() -> None:
    code = (
        "from tests.netns import NetLab; import time\n"
        "lab = NetLab(); lab.add_host('y'); lab.start()\n"
        "print(lab.name, lab.token, flush=True); time.sleep(600)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    out = Lines(p)
    name, token = out.wait_for(r"^(\S+) (\S+)$", 60).groups()
    try:
        assert _leftovers(name, token), "the child's lab exists while it runs"
        assert name not in netns.remove_stale(), "a live run's lab is never touched"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert name in netns.remove_stale()
        assert _leftovers(name, token) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
