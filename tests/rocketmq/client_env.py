"""The official RocketMQ 5 clients, Python and Node.js, each in a cache of its own, for
tests.

``official_python()`` makes (once, then reuses) a virtualenv with
``rocketmq-python-client==5.1.2`` from PyPI and returns its interpreter. Not the
project's venv: the client pins protobuf >= 6.33.5 and pulls opentelemetry, and it
spawns threads and an event loop of its own; the tests run it in subprocesses
(``run_script``), which also keeps its descriptor pool apart from ours.

The venv lives under ``$LEDGERMQ_TEST_CACHE`` (default ``~/.cache/ledgermq-tests``),
named by the client's version and this interpreter's; a stamp file marks a finished
install, so an interrupted one is redone. Every step is bounded and says what it does.

``official_node()`` does the same for ``rocketmq-client-nodejs@1.0.8`` from npm: ``npm
install`` into ``<cache>/rocketmq-client-nodejs-1.0.8-node<major>`` (no install scripts:
the client needs none), and returns that ``node_modules``; ``run_node_script`` runs
``scripts/node/<script>`` with it on ``NODE_PATH``. Node.js (18.17 or later) and npm
must be on ``PATH`` (CI has them): a missing one fails the test, naming what to install,
never skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLIENT = "rocketmq-python-client==5.1.2"
NODE_CLIENT = "rocketmq-client-nodejs@1.0.8"
NODE_MIN = (18, 17)
INSTALL_TIMEOUT_S = 600
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def cache_dir() -> Path:
    root = os.environ.get("LEDGERMQ_TEST_CACHE") or Path.home() / ".cache" / "ledgermq-tests"
    return Path(root)


def _say(text: str) -> None:
    print(f"[rocketmq client] {text}", file=sys.stderr, flush=True)


def official_python() -> Path:
    """The interpreter of a venv holding the official client (made on first use)."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    venv = cache_dir() / f"{CLIENT.replace('==', '-')}-{tag}"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.is_file() and python.is_file():
        return python
    started = time.monotonic()
    _say(f"installing {CLIENT} into {venv} (once; later runs reuse it)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--progress-bar", "off", CLIENT],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    stamp.write_text(CLIENT + "\n")
    _say(f"installed in {time.monotonic() - started:.1f} s")
    return python


def run_script(
    python: Path, script: str, args: dict[str, Any], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Run ``scripts/<script>`` with the official client, ``args`` as JSON on stdin; its
    JSON answer (the last line of stdout). The script's stderr is shown on failure."""
    p = subprocess.run(
        [str(python), str(SCRIPTS / script)],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert p.returncode == 0 and lines, (
        f"{script} exited {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-8000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _node_tool(name: str) -> str:
    path = shutil.which(name)
    assert path, (
        f"{name} is not on PATH: the tests of the official Node.js client need Node.js"
        f" >= {NODE_MIN[0]}.{NODE_MIN[1]} and npm (Debian/Ubuntu: apt-get install nodejs npm)"
    )
    return path


def node_version(node: str) -> tuple[int, int]:
    out = subprocess.run(
        [node, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()
    major, minor, *_ = out.lstrip("v").split(".")
    return int(major), int(minor)


def official_node() -> Path:
    """The ``node_modules`` holding the official Node.js client (installed on first use)."""
    node = _node_tool("node")
    version = node_version(node)
    assert version >= NODE_MIN, f"Node.js {version} is too old for {NODE_CLIENT}: want {NODE_MIN}"
    npm = _node_tool("npm")
    prefix = cache_dir() / f"{NODE_CLIENT.replace('@', '-')}-node{version[0]}"
    modules = prefix / "node_modules"
    stamp = prefix / ".installed"
    if stamp.is_file() and (modules / "rocketmq-client-nodejs" / "package.json").is_file():
        return modules
    started = time.monotonic()
    _say(f"installing {NODE_CLIENT} into {prefix} with npm (once; later runs reuse it)")
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--omit=dev",
            "--ignore-scripts",
            "--loglevel=http",  # one line per download: the progress
            NODE_CLIENT,
        ],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=prefix,
    )
    stamp.write_text(NODE_CLIENT + "\n")
    _say(f"installed in {time.monotonic() - started:.1f} s")
    return modules


def run_node_script(
    modules: Path,
    script: str,
    args: dict[str, Any],
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``run_script`` for ``scripts/node/<script>``, run by ``node`` with the client's
    ``node_modules`` on ``NODE_PATH`` (and ``env`` besides)."""
    p = subprocess.run(
        [_node_tool("node"), str(SCRIPTS / "node" / script)],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, "NODE_PATH": str(modules), **(env or {})},
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert p.returncode == 0 and lines, (
        f"{script} exited {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-8000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-1])
    return result
