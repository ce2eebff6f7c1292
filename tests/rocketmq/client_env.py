"""The official RocketMQ 5 Python client, in a virtualenv of its own, for tests.

``official_python()`` makes (once, then reuses) a virtualenv with
``rocketmq-python-client==5.1.2`` from PyPI and returns its interpreter. Not the
project's venv: the client pins protobuf >= 6.33.5 and pulls opentelemetry, and it
spawns threads and an event loop of its own; the tests run it in subprocesses
(``run_script``), which also keeps its descriptor pool apart from ours.

The venv lives under ``$LEDGERMQ_TEST_CACHE`` (default ``~/.cache/ledgermq-tests``),
named by the client's version and this interpreter's; a stamp file marks a finished
install, so an interrupted one is redone. Every step is bounded and says what it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLIENT = "rocketmq-python-client==5.1.2"
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
