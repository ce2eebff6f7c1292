"""The README's five-minute tour runs as written: its shell blocks, joined in order, in
one ``bash -e -o pipefail`` from the repository root, against the local cluster the tour
itself starts (HTTP 8080-8082, Raft 9080-9082), with Spark for its last step."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PORTS = (8080, 8081, 8082, 9080, 9081, 9082)
TOUR_TIMEOUT_S = 600

pytestmark = pytest.mark.spark


def tour_script(readme: str) -> str:
    section = readme[readme.index("## A five-minute tour") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 5, "the tour lost its shell blocks"
    return "\n".join(blocks)


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    taken = [p for p in PORTS if port_taken(p)]
    if taken:
        pytest.skip(f"the tour's ports are in use here: {taken}")
    script = tmp_path / "tour.sh"
    script.write_text(tour_script((ROOT / "README.md").read_text(encoding="utf-8")))
    subprocess.run(["rm", "-rf", "/tmp/ledgermq-tour"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERMQ_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    p = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", str(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the tour's background cluster goes with its group
    )
    try:
        out, _ = p.communicate(timeout=TOUR_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the tour stopped its own cluster
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == 0, out[-4000:]
    assert "topic orders: 4 queues (created)" in out
    assert '{"customer": "c1", "amount": 7}' in out  # produced and consumed after the kill
    assert "wrote 2 customer totals to order-totals" in out
    assert '"customer":"c1","total":19.5,"orders":2' in out
