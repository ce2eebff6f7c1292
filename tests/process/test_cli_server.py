"""The server-side commands through their real entry point: ``ledgermq broker`` (options
from ``LEDGERMQ_*`` variables) and ``ledgermq cluster up`` (foreground until Ctrl-C,
then a clean stop of every child)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.process.nodeproc import LEDGERMQ, ready
from tests.waiting import wait_until


def free_run(n: int) -> int:
    """A base port with ``base .. base+n-1`` and ``base+1000 ..`` free a moment ago."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 40_000)
        socks = []
        try:
            for port in [*range(base, base + n), *range(base + 1000, base + 1000 + n)]:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port run found")


def test_ledgermq_broker_from_environment_variables(tmp_path: Path) -> None:
    base = free_run(1)
    env = {
        **os.environ,
        "LEDGERMQ_HTTP": f"127.0.0.1:{base}",
        "LEDGERMQ_DATA_DIR": str(tmp_path / "data"),
        "LEDGERMQ_DATA_FILE_MB": "8",
        "LEDGERMQ_DEFAULT_QUEUES": "3",
        "LEDGERMQ_LOG_FORMAT": "json",
    }
    p = subprocess.Popen(
        [LEDGERMQ, "broker", "--exit-with-parent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{base}"
        wait_until(lambda: ready(url) or p.poll() is not None, timeout_s=60, what="ready")
        assert p.poll() is None
        r = httpx.post(url + "/v1/topics/env/messages", json={"messages": [{"body": "x"}]})
        assert r.status_code == 200
        assert httpx.get(url + "/v1/topics/env").json()["queues"][2]["queue_id"] == 2
        assert (tmp_path / "data" / "dledger").is_dir()
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err.decode()[-2000:]
    assert b'"node":"n0"' in err and b"stopped" in err  # JSON lines naming the node


def test_ledgermq_cluster_up_until_ctrl_c(tmp_path: Path) -> None:
    base = free_run(3)
    p = subprocess.Popen(
        [
            LEDGERMQ,
            "cluster",
            "up",
            "--nodes",
            "3",
            "--base-port",
            str(base),
            "--data-dir",
            str(tmp_path / "c"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]
    try:
        wait_until(lambda: all(ready(u) for u in urls) or p.poll() is not None, timeout_s=90)
        assert p.poll() is None
        status = subprocess.run(
            [LEDGERMQ, "status", "--brokers", ",".join(urls)],
            capture_output=True,
            timeout=60,
            check=True,
        )
        out = status.stdout.decode()
        assert out.count(" MASTER ") == 1 and out.count(" SLAVE ") == 2, out
        # kill -9 the master: the others go on, and it comes back (--restart-after 3 s)
        master = subprocess.run(
            [LEDGERMQ, "status", "--master", "--brokers", ",".join(urls)],
            capture_output=True,
            timeout=60,
            check=True,
            text=True,
        ).stdout.strip()
        pattern = f"--node-id {master} .*--data-dir {tmp_path / 'c'}/"
        subprocess.run(["pkill", "-9", "-f", "--", pattern], check=True, timeout=30)
        url = urls[int(master[1:])]
        wait_until(lambda: not ready(url), timeout_s=30)
        wait_until(lambda: ready(url) or p.poll() is not None, timeout_s=90)
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-3000:]
    assert b"3 nodes up" in err and b"stopping" in err
    assert f"{master} exited; the others go on".encode() in err
    assert f"restarting {master}".encode() in err
    for u in urls:  # every child is gone
        assert not ready(u)


def test_bench_runs_the_checkouts_comparison_harness_with_its_own_options() -> None:
    """``ledgermq bench ARGS`` is ``bench/peers_bench.py ARGS`` (its options are not
    parsed by ledgermq): --help is the harness's, and a bad option is the harness's
    refusal (exit 2), not ledgermq's."""
    out = subprocess.run(
        [LEDGERMQ, "bench", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "peers_bench.py" in out.stdout and "--quick" in out.stdout
    bad = subprocess.run(
        [LEDGERMQ, "bench", "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "--no-such-option" in bad.stderr


def test_bench_outside_a_checkout_says_where_it_runs(monkeypatch: Any, capsys: Any) -> None:
    from ledgermq.cli import main as cli  # noqa: PLC0415

    monkeypatch.setattr(cli, "PEERS_BENCH", Path("/nonexistent/bench/peers_bench.py"))
    assert cli.main(["bench", "--quick"]) == 2
    assert "source checkout" in capsys.readouterr().err
