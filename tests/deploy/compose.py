"""Run ``docker-compose.yml``'s services as local processes, where no Docker engine runs.

The compose file stays the single source of the topology: it is resolved by a real
compose implementation (``podman-compose --dry-run config``: anchors, merge keys and
defaults as compose applies them), and the image's side comes from the ``Dockerfile``
(``dockerfile-parse``; the final stage's ENTRYPOINT, CMD, ENV, USER, HEALTHCHECK,
EXPOSE, VOLUME). Each service then becomes the process its container would run:

- argv: the service's ``entrypoint`` (else the image's) and ``command`` (else the
  image's CMD, unless the entrypoint was overridden: compose resets it then), the
  executable taken from this venv, where pip installed the project as in the image;
- environment: the image's ENV, the service's ``env_file`` files, then its
  ``environment`` (compose's precedence), on an empty base (the test's own
  ``LEDGERMQ_*`` variables never leak in);
- volumes: a directory per named volume; a path under a volume's mount point (the data
  directory) is rewritten to it;
- the image's USER, where this process may switch to it (root);
- the network, by a ``Placement``: ``NetnsPlacement`` puts every service in its own
  network namespace (``tests.netns``) whose hosts file resolves the service names, so
  environment and arguments run unchanged; ``LoopbackPlacement`` (not root) rewrites
  every ``service:port`` in them to 127.0.0.1 and the published port, or to a loopback
  address of the service's own (127.0.0.x) for ports compose does not publish.

Every process dies with the test (``setpriv --pdeathsig KILL``); ``close()`` kills them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from dockerfile_parse import DockerfileParser

from tests.netns import NetLab

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 60.0


def venv_tool(name: str) -> str:
    path = VENV_BIN / name
    assert path.exists(), f"{name} is not installed in {VENV_BIN} (make setup)"
    return str(path)


# ---- the image ------------------------------------------------------------------------------


def _exec_form(value: str) -> list[str]:
    """A Dockerfile instruction's argument: the JSON (exec) form, else the shell form."""
    value = value.strip()
    if value.startswith("["):
        return list(yaml.safe_load(value))
    return ["/bin/sh", "-c", value]


@dataclass(frozen=True, slots=True)
class Image:
    """What the test can take from the Dockerfile's final stage."""

    base: str
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    user: str | None
    workdir: str | None
    volumes: list[str]
    expose: list[int]
    healthcheck: list[str]  # the HEALTHCHECK's CMD, exec form
    healthcheck_options: dict[str, str]
    runs: list[str]  # the final stage's RUN commands

    @classmethod
    def from_dockerfile(cls, path: Path) -> Image:
        parser = DockerfileParser(str(path))
        stages: list[list[dict[str, Any]]] = []
        for ins in parser.structure:
            if ins["instruction"] == "FROM":
                stages.append([])
            if stages:
                stages[-1].append(ins)
        final = stages[-1]
        base = final[0]["value"].split()[0]
        entrypoint: list[str] = []
        cmd: list[str] = []
        user = workdir = None
        volumes: list[str] = []
        expose: list[int] = []
        health: list[str] = []
        options: dict[str, str] = {}
        runs: list[str] = []
        for ins in final:
            name, value = ins["instruction"], ins["value"]
            if name == "ENTRYPOINT":
                entrypoint = _exec_form(value)
            elif name == "CMD":
                cmd = _exec_form(value)
            elif name == "USER":
                user = value.strip()
            elif name == "WORKDIR":
                workdir = value.strip()
            elif name == "VOLUME":
                v = value.strip()
                volumes.extend(yaml.safe_load(v) if v.startswith("[") else v.split())
            elif name == "EXPOSE":
                expose.extend(int(p.split("/")[0]) for p in value.split())
            elif name == "RUN":
                runs.append(value)
            elif name == "HEALTHCHECK":
                m = re.fullmatch(r"((?:--[a-z-]+=\S+\s+)*)CMD\s+(.*)", value.strip(), re.S)
                assert m, f"HEALTHCHECK not understood: {value!r}"
                for opt in m.group(1).split():
                    k, _, v = opt.removeprefix("--").partition("=")
                    options[k] = v
                health = _exec_form(m.group(2))
        env = dict(parser.envs)  # dockerfile-parse follows ENV through the stages
        return cls(
            base, entrypoint, cmd, env, user, workdir, volumes, expose, health, options, runs
        )


# ---- the compose file ------------------------------------------------------------------------


def validate_compose(path: Path) -> subprocess.CompletedProcess[str]:
    """The compose specification's JSON schema, as ``check-jsonschema`` ships it."""
    return subprocess.run(
        [venv_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def resolve_compose(path: Path, profiles: Sequence[str] = ()) -> dict[str, Any]:
    """The compose file as a compose implementation resolves it (no engine needed), with
    the services of ``profiles`` too."""
    chosen = [w for p in profiles for w in ("--profile", p)]
    r = subprocess.run(
        [venv_tool("podman-compose"), *chosen, "--dry-run", "-f", str(path), "config"],
        check=False,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=path.parent,
    )
    assert r.returncode == 0, f"podman-compose config failed:\n{r.stderr}"
    doc = yaml.safe_load(r.stdout)
    assert isinstance(doc, dict) and "services" in doc, r.stdout
    return doc


def published_ports(service: Mapping[str, Any]) -> dict[int, int]:
    """Container port → host port, from ``ports`` in short ("8081:8080") or long form."""
    out = {}
    for p in service.get("ports") or ():
        if isinstance(p, Mapping):
            out[int(p["target"])] = int(p.get("published") or p["target"])
        else:
            host, _, container = str(p).rpartition(":")
            out[int(container.split("/")[0])] = int(host.rpartition(":")[2] or container)
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (compose's env-file format: comments, blank lines, quotes)."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


# ---- where each service runs -------------------------------------------------------------------


class Placement(Protocol):
    mode: str

    def prefix(self, service: str) -> list[str]: ...
    def rewrite(self, service: str, value: str) -> str: ...
    def address(self, service: str, port: int) -> tuple[str, int]: ...
    def url(self, service: str, port: int) -> str: ...
    def can_switch_user(self) -> bool: ...


class NetnsPlacement:
    """One network namespace per service; names resolve through its hosts file, so
    nothing in the environment changes."""

    mode = "network namespaces"

    def __init__(self, lab: NetLab) -> None:
        self.lab = lab

    def prefix(self, service: str) -> list[str]:
        return self.lab.exec_prefix(service)

    def rewrite(self, service: str, value: str) -> str:
        return value

    def address(self, service: str, port: int) -> tuple[str, int]:
        return self.lab.address(service), port

    def url(self, service: str, port: int) -> str:
        return f"http://{self.lab.address(service)}:{port}"

    def can_switch_user(self) -> bool:
        return True


class LoopbackPlacement:
    """No namespaces (not root): every service on this host's loopback. A published
    port is reached where compose publishes it, 127.0.0.1:<host port>; any other port
    on 127.0.0.<10 + i>, an address of the service's own."""

    mode = "loopback addresses (not root: no network namespaces)"

    def __init__(self, services: Mapping[str, Mapping[str, Any]]) -> None:
        self.addresses = {name: f"127.0.0.{10 + i}" for i, name in enumerate(services)}
        self.published = {name: published_ports(s) for name, s in services.items()}
        names = "|".join(re.escape(n) for n in sorted(services, key=len, reverse=True))
        self._host_port = re.compile(rf"\b({names}|0\.0\.0\.0):(\d+)\b")

    def address(self, service: str, port: int) -> tuple[str, int]:
        host_port = self.published[service].get(port)
        if host_port is not None:
            return "127.0.0.1", host_port
        return self.addresses[service], port

    def _where(self, service: str, port: int) -> str:
        host, p = self.address(service, port)
        return f"{host}:{p}"

    def prefix(self, service: str) -> list[str]:
        return []

    def rewrite(self, service: str, value: str) -> str:
        def sub(m: re.Match[str]) -> str:
            host = service if m.group(1) == "0.0.0.0" else m.group(1)
            return self._where(host, int(m.group(2)))

        return self._host_port.sub(sub, value)

    def url(self, service: str, port: int) -> str:
        return f"http://{self._where(service, port)}"

    def can_switch_user(self) -> bool:
        return False


# ---- the services as processes --------------------------------------------------------------


@dataclass
class Topology:
    """The compose services, run as processes by a ``Placement``."""

    compose: dict[str, Any]
    image: Image
    placement: Placement
    work_dir: Path  # volumes and logs
    project_dir: Path = REPO  # where relative paths of the compose file point
    procs: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    # Run as the image's USER (root and a namespace placement only); see probe_user.
    switch_user: bool = True

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return dict(self.compose["services"])

    def volume_dirs(self, service: str) -> dict[str, Path]:
        """Mount point → this test's directory for the service's named volumes."""
        out = {}
        for v in self.services[service].get("volumes") or ():
            source, target = (
                (v["source"], v["target"]) if isinstance(v, Mapping) else v.split(":")[:2]
            )
            d = self.work_dir / "volumes" / source
            d.mkdir(parents=True, exist_ok=True)
            out[target] = d
        return out

    def argv(self, service: str) -> list[str]:
        s = self.services[service]
        entrypoint = s.get("entrypoint")
        command = s.get("command")
        if isinstance(entrypoint, str):
            entrypoint = ["/bin/sh", "-c", entrypoint]
        if isinstance(command, str):
            command = ["/bin/sh", "-c", command]
        words = list(entrypoint if entrypoint is not None else self.image.entrypoint)
        if command is not None:
            words += list(command)
        elif entrypoint is None:
            words += self.image.cmd
        assert words, f"{service} has no command"
        return [self.executable(words[0])] + [self.placement.rewrite(service, w) for w in words[1:]]

    @staticmethod
    def executable(word: str) -> str:
        """A word of a command as the image's PATH would find it: here, in this venv
        (``python`` is this interpreter, ``ledgermq`` the script pip installed)."""
        if "/" in word:
            return word
        found = shutil.which(word, path=str(VENV_BIN))
        assert found is not None, f"{word} not found in {VENV_BIN}"
        return found

    def env(self, service: str) -> dict[str, str]:
        s = self.services[service]
        env = {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env.update(self.image.env)
        for item in s.get("env_file") or ():
            spec = item if isinstance(item, Mapping) else {"path": item, "required": True}
            path = (self.project_dir / spec["path"]).resolve()
            if path.exists():
                env.update(read_env_file(path))
            else:
                assert not spec.get("required", True), f"{service}: {path} is required"
        environment = s.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(e.partition("=")[::2] for e in environment)
        env.update({k: str(v) for k, v in environment.items() if v is not None})
        volumes = self.volume_dirs(service)
        out = {}
        for key, value in env.items():
            for target, local in volumes.items():
                if value == target or value.startswith(target + "/"):
                    value = str(local) + value[len(target) :]  # noqa: PLW2901
            out[key] = self.placement.rewrite(service, value)
        return out

    def _uid_gid(self) -> tuple[int, int] | None:
        user = self.image.user
        if not (user and self.switch_user and self.placement.can_switch_user()):
            return None
        if os.geteuid() != 0:
            return None
        uid, _, gid = user.partition(":")
        assert uid.isdigit() and (not gid or gid.isdigit()), f"USER {user} is not numeric"
        return int(uid), int(gid or uid)

    def probe_user(self, service: str) -> str | None:
        """Can the image's user run ``service``'s entry point from this venv? (In the
        image it can: pip installed it world-readable. Here the venv or its interpreter
        may sit in a directory private to root.) None if so, else why not; then the
        services run as this process's user and ``user`` is False."""
        if self._uid_gid() is None:
            self.switch_user = False
            return f"USER {self.image.user} not applied: needs root and network namespaces"
        argv = [*self.argv(service), "--help"]
        r = subprocess.run(
            self.wrap(service, argv),
            check=False,
            env=self.env(service),
            cwd="/",
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if r.returncode == 0:
            return None
        self.switch_user = False
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"USER {self.image.user} cannot run {argv[0]} here ({why}); running as root"

    def wrap(self, service: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run in ``service``'s place: its namespace, the image's user, and
        killed with this process (``--pdeathsig``)."""
        ids = self._uid_gid()
        switch = (
            [f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"] if ids is not None else []
        )
        return [
            *self.placement.prefix(service),
            "setpriv",
            "--pdeathsig",
            "KILL",
            *switch,
            "--",
            *argv,
        ]

    def cwd(self, service: str) -> Path:
        volumes = self.volume_dirs(service)
        workdir = self.image.workdir
        return volumes.get(workdir, self.work_dir) if workdir else self.work_dir

    def prepare_volumes(self) -> None:
        """The image makes its volume directory the user's (RUN ... chown): so here."""
        ids = self._uid_gid()
        for name in self.services:
            for d in self.volume_dirs(name).values():
                if ids is not None:
                    os.chown(d, *ids)

    def start(self, service: str, *, stdout: Any = None) -> subprocess.Popen[Any]:
        assert service not in self.procs or self.procs[service].poll() is not None
        log = None
        if stdout is None:
            log = (self.work_dir / f"{service}.log").open("ab")
            stdout = log
        try:
            p = subprocess.Popen(
                self.wrap(service, self.argv(service)),
                env=self.env(service),
                cwd=self.cwd(service),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                text=stdout is subprocess.PIPE,
            )
        finally:
            if log is not None:
                log.close()
        self.procs[service] = p
        return p

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[service]
        if p.poll() is None:
            os.kill(p.pid, sig)
            p.wait(timeout=30)

    def healthcheck(self, service: str, timeout_s: float = 10.0) -> int:
        """The image's HEALTHCHECK command, run where the service runs: its exit code
        (0 healthy), as the engine would read it."""
        s = self.services[service]
        test = (s.get("healthcheck") or {}).get("test") or ["CMD", *self.image.healthcheck]
        assert test[0] == "CMD", f"{service}: healthcheck {test} is not the CMD form"
        argv = [self.executable(test[1]), *test[2:]]
        try:
            r = subprocess.run(
                self.wrap(service, argv),
                check=False,
                env=self.env(service),
                cwd=self.cwd(service),
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return 124
        return r.returncode

    def log_tail(self, service: str, lines: int = 30) -> str:
        path = self.work_dir / f"{service}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
