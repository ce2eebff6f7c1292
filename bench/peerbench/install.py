"""The peers, installed from the package registries if they are missing.

- ``nats``: Debian's ``nats-server`` (``apt-get install -y nats-server``; 2.9 in
  bookworm) and ``nats-py`` from PyPI;
- ``etcd``: Debian's ``etcd-server`` (3.4 in bookworm; the ``etcd`` binary);
- ``pysyncobj``: ``pysyncobj`` from PyPI;
- charts: ``matplotlib`` from PyPI.

The Python packages are the project's ``bench`` extra (``make bench-peers`` installs it
first); this module only installs what is still missing, with pip into the running
interpreter. apt-get needs root (or sudo without a password). Everything it runs is
printed. A peer that cannot be installed is reported and left out of the run; the rest
goes on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys

# peer -> (binaries, Debian packages, Python modules, PyPI distributions)
NEEDS: dict[str, tuple[list[str], list[str], list[str], list[str]]] = {
    "nats": (["nats-server"], ["nats-server"], ["nats"], ["nats-py>=2.6"]),
    "etcd": (["etcd"], ["etcd-server"], [], []),
    "pysyncobj": ([], [], ["pysyncobj"], ["pysyncobj>=0.3.17"]),
    "floor": ([], [], [], []),
}
CHARTS = (["matplotlib"], ["matplotlib>=3.7"])


def _say(msg: str) -> None:
    print(f"install: {msg}", file=sys.stderr)


def _run(cmd: list[str], env: dict[str, str] | None = None) -> bool:
    _say("$ " + " ".join(cmd))
    try:
        r = subprocess.run(cmd, env=env, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        _say(f"failed: {e}")
        return False
    return r.returncode == 0


def _apt(packages: list[str]) -> bool:
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            _say("apt-get needs root: run as root or install " + " ".join(packages))
            return False
        prefix = ["sudo", "-n"]
    if shutil.which("apt-get") is None:
        _say("no apt-get here: install " + " ".join(packages) + " with your package manager")
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Only an update if the install cannot find the package (a fresh image has no lists).
    if _run([*prefix, "apt-get", "install", "-y", "--no-install-recommends", *packages], env):
        return True
    return _run([*prefix, "apt-get", "update"], env) and _run(
        [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *packages], env
    )


def _pip(dists: list[str]) -> bool:
    ok = _run([sys.executable, "-m", "pip", "install", "--quiet", *dists])
    importlib.invalidate_caches()
    return ok


def missing_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def missing_binaries(binaries: list[str]) -> list[str]:
    return [b for b in binaries if shutil.which(b) is None]


def ensure(peers: list[str], install: bool = True, charts: bool = True) -> dict[str, str]:
    """peer -> "ok" or why it is not available (after installing what is missing)."""
    status: dict[str, str] = {}
    for peer in peers:
        binaries, debs, modules, dists = NEEDS[peer]
        if install and missing_binaries(binaries):
            _say(f"{peer}: installing {' '.join(debs)} (apt-get)")
            _apt(debs)
        if install and missing_modules(modules):
            _say(f"{peer}: installing {' '.join(dists)} (pip)")
            _pip(dists)
        gone = missing_binaries(binaries) + missing_modules(modules)
        status[peer] = "ok" if not gone else "not installed: " + ", ".join(gone)
        if gone:
            _say(f"{peer}: {status[peer]}; the run goes on without it")
    if charts and install and missing_modules(CHARTS[0]):
        _say("charts: installing matplotlib (pip)")
        _pip(CHARTS[1])
    return status


def versions() -> dict[str, str]:
    """The versions of what this run measured (for the report)."""
    out = {"python": sys.version.split()[0]}
    for name, cmd in (
        ("nats-server", ["nats-server", "--version"]),
        ("etcd", ["etcd", "--version"]),
    ):
        if shutil.which(cmd[0]):
            try:
                text = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=10, check=False
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            out[name] = text.split("\n")[0].split()[-1].lstrip("v")
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    for dist in ("nats-py", "pysyncobj", "uvicorn", "fastapi", "matplotlib"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out
