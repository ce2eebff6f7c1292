"""``docker-compose.yml`` and the ``Dockerfile``, tested where no Docker engine runs.

- The compose file follows the compose specification (its JSON schema, as
  check-jsonschema ships it; a broken copy is refused, so the check bites).
- Its topology is consistent as a compose implementation resolves it (podman-compose):
  node ids are the service names, peers, peer URLs and advertised URLs name the services,
  ports 8080-8082 (and gRPC's 10080-10082) are published, each broker has its own volume
  on the image's data directory, the restart policy leaves a killed broker down, the
  demo waits for healthy brokers and names them all, and the healthcheck is the image's.
- The Dockerfile: python:3.11-slim, a numeric non-root user made by useradd, the
  project pip-installed from a wheel (not editable), ``ledgermq broker`` as the entry
  point, ports 8080/9080/10080, the data volume; hadolint finds nothing.
- The services run: each broker service's command and environment as a process in its
  own network namespace (``tests.netns``; the service names resolve through each
  namespace's hosts file) as the image's user, healthy by the image's HEALTHCHECK
  command, a peer secret from the optional env file in force; the demo service's
  command rides through a kill -9 of the master and a restart, and its books balance.
  Not root: the same on 127.0.0.x with the published ports (said in the output); as
  root (CI) the namespace path is taken, never the fallback.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import netns
from tests.deploy.compose import (
    REPO,
    Image,
    LoopbackPlacement,
    NetnsPlacement,
    Topology,
    published_ports,
    resolve_compose,
    validate_compose,
    venv_tool,
)
from tests.lines import Lines
from tests.waiting import wait_until

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
NUMBER = r"([\d,]+)"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return resolve_compose(COMPOSE)


@pytest.fixture(scope="module")
def image() -> Image:
    return Image.from_dockerfile(DOCKERFILE)


def brokers_of(compose: dict[str, Any], image: Image) -> list[str]:
    """The services that run the image's entry point unchanged: the brokers."""
    return sorted(n for n, s in compose["services"].items() if s.get("entrypoint") is None)


# ---- static checks ----------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification(tmp_path: Path) -> None:
    r = validate_compose(COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("  healthcheck:\n", "  helthcheck:\n", 1))
    r = validate_compose(broken)
    assert r.returncode != 0 and "helthcheck" in r.stdout + r.stderr, r.stdout


def test_compose_topology_is_wired_by_service_names(compose: dict[str, Any], image: Image) -> None:
    services = compose["services"]
    brokers = brokers_of(compose, image)
    assert brokers == ["broker0", "broker1", "broker2"]
    envs = {b: services[b]["environment"] for b in brokers}
    peers = {f"{b}-{b}:9080" for b in brokers}
    http_port = int(image.env["LEDGERMQ_HTTP"].rpartition(":")[2])
    grpc_port = http_port + 2000  # the default of --grpc
    assert set(image.expose) == {http_port, 9080, grpc_port}
    host_ports = []
    for b in brokers:
        env = envs[b]
        assert env["LEDGERMQ_NODE_ID"] == b and services[b].get("hostname", b) == b
        assert set(env["LEDGERMQ_PEERS"].split(";")) == peers
        assert env["LEDGERMQ_PEER_URLS"] == ",".join(f"{x}=http://{x}:{http_port}" for x in brokers)
        assert env["LEDGERMQ_ADVERTISED_URL"] == f"http://{b}:{http_port}"
        ports = published_ports(services[b])
        assert list(ports) == [http_port, grpc_port], "HTTP and gRPC published; Raft stays inside"
        host_ports.append(ports[http_port])
        assert ports[grpc_port] == ports[http_port] + 2000
        volumes = services[b]["volumes"]
        assert len(volumes) == 1 and volumes[0].split(":")[1] == env["LEDGERMQ_DATA_DIR"]
        assert env["LEDGERMQ_DATA_DIR"] in image.volumes
        # docker compose kill marks a container as stopped by hand; unless-stopped then
        # leaves it down until `docker compose start` (always would not: a daemon restart
        # brings it back; on-failure ignores the mark only in older engines).
        assert services[b]["restart"] == "unless-stopped"
        test = services[b]["healthcheck"]["test"]
        assert test == ["CMD", *image.healthcheck], "compose and Dockerfile healthchecks differ"
        assert services[b]["env_file"] == [{"path": "./ledgermq.env", "required": False}]
    assert host_ports == [8080, 8081, 8082]
    # the console on the host reaches every broker where its HTTP port is published
    console = ",".join(
        f"{b}=http://localhost:{p}" for b, p in zip(brokers, host_ports, strict=True)
    )
    assert {envs[b]["LEDGERMQ_CONSOLE_URLS"] for b in brokers} == {console}
    assert len({services[b]["volumes"][0].split(":")[0] for b in brokers}) == 3
    assert set(compose["volumes"]) >= {services[b]["volumes"][0].split(":")[0] for b in brokers}

    demo = services["demo"]
    assert demo["entrypoint"] == ["ledgermq", "demo"]
    assert {b: d["condition"] for b, d in demo["depends_on"].items()} == dict.fromkeys(
        brokers, "service_healthy"
    )
    urls = demo["command"][demo["command"].index("--brokers") + 1].split(",")
    assert urls == [f"http://{b}:{http_port}" for b in brokers]
    assert demo["restart"] == "no"


def test_dockerfile_builds_a_non_root_broker_image(image: Image) -> None:
    assert image.base == "python:3.11-slim"
    assert image.entrypoint == ["ledgermq", "broker"]
    assert image.user is not None
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    assert any("useradd" in r and f"--uid {uid}" in r for r in image.runs), image.runs
    installs = [r for r in image.runs if "pip install" in r]
    assert installs and not any(re.search(r"(^|\s)(-e|--editable)\s", r) for r in installs)
    assert all(".whl" in r for r in installs), "install the built wheel"
    assert image.env["LEDGERMQ_DATA_DIR"] in image.volumes
    assert any(f"chown {uid}" in r or "chown ledgermq" in r for r in image.runs)
    assert image.healthcheck[:2] == ["python", "-c"] and "/readyz" in image.healthcheck[2]
    assert {"interval", "timeout", "start-period", "retries"} <= set(image.healthcheck_options)
    lint = subprocess.run(
        [venv_tool("hadolint"), "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


# ---- the services as processes ------------------------------------------------------------------


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """Volumes and logs where the image's (unprivileged) user can reach them: pytest's
    own temporary directories are private to root."""
    d = Path(tempfile.mkdtemp(prefix="ledgermq-compose-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _lab(compose: dict[str, Any]) -> Iterator[netns.NetLab | None]:
    # LEDGERMQ_TEST_NETNS=0 tries the loopback fallback as root (never set in CI).
    if os.geteuid() != 0 or os.environ.get("LEDGERMQ_TEST_NETNS") == "0":
        yield None
        return
    assert netns.available(), "running as root, but `ip netns` does not work here"
    netns.remove_stale()
    lab = netns.NetLab()
    for name, s in compose["services"].items():
        hostname = s.get("hostname")
        lab.add_host(name, [hostname] if hostname and hostname != name else [])
    try:
        lab.start()
        yield lab
    finally:
        lab.close()


@pytest.fixture
def lab(compose: dict[str, Any]) -> Iterator[netns.NetLab | None]:
    yield from _lab(compose)


def _raft_refuses_a_stranger(host: str, port: int) -> None:
    """Write garbage to a Raft port; with a peer secret the node closes the connection
    in its handshake (and counts it)."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(secrets.token_bytes(64))
        s.settimeout(10)
        for _ in range(100):  # bounded: a closing peer sends at most a nonce first
            if not s.recv(4096):
                return


def _auth_failures(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(r"^ledgermq_raft_auth_failures_total (\S+)$", text, re.M)
    assert m, "no auth failure counter in /metrics"
    return float(m.group(1))


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert m
    return int(m.group(1))


def test_compose_demo_rides_through_a_kill_9_of_the_master(
    compose: dict[str, Any], image: Image, lab: netns.NetLab | None, work_dir: Path
) -> None:
    placement: NetnsPlacement | LoopbackPlacement = (
        NetnsPlacement(lab) if lab is not None else LoopbackPlacement(compose["services"])
    )
    print(f"compose services run in {placement.mode}")
    project = work_dir / "project"  # where docker-compose.yml's ./ledgermq.env is looked for
    project.mkdir()
    (project / "ledgermq.env").write_text(f"LEDGERMQ_PEER_SECRET={secrets.token_hex(16)}\n")
    topo = Topology(compose, image, placement, work_dir, project_dir=project)
    brokers = brokers_of(compose, image)
    demo: subprocess.Popen[str] | None = None
    try:
        why_not = topo.probe_user(brokers[0])
        print(f"services run as {image.user}" if why_not is None else why_not)
        topo.prepare_volumes()
        for b in brokers:
            topo.start(b)
        wait_until(
            lambda: all(topo.healthcheck(b) == 0 for b in brokers),
            120,
            "every broker healthy by the image's HEALTHCHECK",
        )
        if topo.switch_user:  # the image's user, not root
            uid = int(str(image.user).partition(":")[0])
            assert {b: _uid(topo.procs[b].pid) for b in brokers} == dict.fromkeys(brokers, uid)
        url = {b: placement.url(b, 8080) for b in brokers}
        before = _auth_failures(url["broker1"])
        _raft_refuses_a_stranger(*placement.address("broker1", 9080))
        wait_until(
            lambda: _auth_failures(url["broker1"]) > before,
            30,
            "the peer secret from ledgermq.env refuses a stranger",
        )

        demo = topo.start("demo", stdout=subprocess.PIPE)
        out = Lines(demo)
        master = out.wait_for(r"(\S+) is MASTER\. To see a failover", 90).group(1)
        assert master in brokers
        out.wait_for(r"produced [1-9][\d,]*/s", 60)
        topo.kill(master)  # what `docker compose kill` sends
        assert topo.healthcheck(master) != 0
        moved = out.wait_for(
            rf"writes moved from {master} to (\S+): no acknowledged write for {NUMBER} ms", 90
        )
        assert moved.group(1) in brokers and moved.group(1) != master
        topo.start(master)  # `docker compose start`
        out.wait_for(rf"{master} answers again", 90)
        out.wait_for(rf"{master} caught up: [\d,]+ entries behind", 120)
        wait_until(lambda: topo.healthcheck(master) == 0, 120, f"{master} healthy again")
        out.wait_for(r"produced [1-9][\d,]*/s", 60)

        demo.send_signal(signal.SIGTERM)  # `docker compose stop demo`
        assert demo.wait(timeout=180) == 0, out.text
        books = out.wait_for(
            rf"acknowledged {NUMBER}, consumed {NUMBER}, lost (\d+), duplicated (\d+)", 10
        )
        acknowledged = int(books.group(1).replace(",", ""))
        assert acknowledged > 0 and books.group(1) == books.group(2), books.group(0)
        assert (books.group(3), books.group(4)) == ("0", "0"), books.group(0)
        out.wait_for(r"write gap at a change of master .*: [\d,]+ ms", 10)
        out.wait_for(rf"queues over HTTP: \d+ queues x 3 nodes, identical \({books.group(1)} ", 10)
        out.wait_for(r"^result: CLEAN$", 10)
    except BaseException:
        for b in brokers:
            print(f"---- {b} ----\n{topo.log_tail(b)}")
        raise
    finally:
        topo.close()


# ---- a fourth broker joins (issue 33) -------------------------------------------------------


@pytest.fixture(scope="module")
def compose_grow() -> dict[str, Any]:
    return resolve_compose(COMPOSE, profiles=("grow",))


@pytest.fixture
def lab_grow(compose_grow: dict[str, Any]) -> Iterator[netns.NetLab | None]:
    yield from _lab(compose_grow)


def _exec(topo: Topology, service: str, *args: str) -> str:
    """``docker compose exec <service> ledgermq ...``: the CLI in the service's place,
    with its environment (``LEDGERMQ_BROKERS`` names the brokers)."""
    argv = [topo.executable("ledgermq"), *(topo.placement.rewrite(service, a) for a in args)]
    r = subprocess.run(
        topo.wrap(service, argv),
        env=topo.env(service),
        cwd=str(topo.cwd(service)),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert r.returncode == 0, f"ledgermq {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout


def test_compose_grows_by_a_fourth_broker_while_it_runs(
    compose_grow: dict[str, Any], image: Image, lab_grow: netns.NetLab | None, work_dir: Path
) -> None:
    """The "grow" profile's broker3, as the compose file's comment says to run it: up
    (it waits as a learner), `cluster add`, `cluster promote`, from inside broker0."""
    services = compose_grow["services"]
    env = services["broker3"]["environment"]
    first = ["broker0", "broker1", "broker2"]
    assert env["LEDGERMQ_JOIN"] == "1" and env["LEDGERMQ_NODE_ID"] == "broker3"
    assert set(env["LEDGERMQ_PEERS"].split(";")) == {f"{b}-{b}:9080" for b in [*first, "broker3"]}
    assert published_ports(services["broker3"]) == {8080: 8083, 10080: 10083}
    assert env["LEDGERMQ_CONSOLE_URLS"].endswith(",broker3=http://localhost:8083")
    assert services["broker3"]["profiles"] == ["grow"]
    placement: NetnsPlacement | LoopbackPlacement = (
        NetnsPlacement(lab_grow) if lab_grow is not None else LoopbackPlacement(services)
    )
    project = work_dir / "project"
    project.mkdir()
    topo = Topology(compose_grow, image, placement, work_dir, project_dir=project)
    try:
        topo.probe_user(first[0])
        topo.prepare_volumes()
        for b in first:
            topo.start(b)
        wait_until(lambda: all(topo.healthcheck(b) == 0 for b in first), 120, "three healthy")
        topo.start("broker3")
        _exec(
            topo,
            "broker0",
            "cluster",
            "add",
            "broker3",
            "--raft-addr",
            "broker3:9080",
            "--http-url",
            "http://broker3:8080",
        )
        _exec(topo, "broker0", "cluster", "promote", "broker3")
        members = _exec(topo, "broker0", "cluster", "members", "--json")
        roles = {m["node_id"]: m["role"] for m in json.loads(members)["members"]}
        assert roles == dict.fromkeys([*first, "broker3"], "voter"), roles
        wait_until(lambda: topo.healthcheck("broker3") == 0, 120, "broker3 healthy")
    except BaseException:
        for b in [*first, "broker3"]:
            print(f"---- {b} ----\n{topo.log_tail(b)}")
        raise
    finally:
        topo.close()
