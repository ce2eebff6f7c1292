"""The web console's screenshots in docs/console.md: ``python -m tools.screenshots``.

Starts a 3-node cluster of processes on 127.0.0.1 (free ports, a temporary directory),
puts a little data in it through the HTTP API (a topic, keyed JSON messages, a consumer
group behind by a few messages, a POP group with dead letters, a delay message and a
transaction pending, a leadership transfer for the master's history), opens each page of
``/console`` in headless chromium (``tools.browser``; ``make chromium``), and writes
``docs/console/<page>.png``: the viewport or the whole page, reduced to a 256-colour
palette so that each stays well under 100 KB. The last one is the Cluster page after
``kill -9`` of the master: the new master, the node down, the election in the history.
Every wait is bounded; the cluster and the browser are stopped on the way out.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

from ledgermq.local_cluster import LocalBrokerCluster
from tools.browser import Browser

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "console"
WIDTH, HEIGHT = 1100, 600
TOPIC = "orders"
GROUP = "billing"
POP_GROUP = "mailer"
MAX_PNG_BYTES = 100_000
FAILOVER_S = 45.0


def small_png(png: bytes) -> bytes:
    """``png`` with a 256-colour palette (text and flat colours: no visible loss)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
        out, format="PNG", optimize=True
    )
    return out.getvalue()


def seed(api: str) -> None:
    """A topic, keyed JSON messages, and a group that has read some of them."""

    def ok(r: httpx.Response) -> None:
        if r.status_code >= 300:
            raise RuntimeError(f"{r.request.method} {r.request.url}: {r.status_code} {r.text}")

    ok(httpx.post(f"{api}/v1/topics", json={"name": TOPIC, "queues": 4}, timeout=30))
    ok(httpx.post(f"{api}/v1/topics", json={"name": "audit", "queues": 2}, timeout=30))
    messages = [
        {
            "body": json.dumps({"order": 40 + i, "item": item, "qty": i + 1}),
            "key": f"order-{40 + i}",
            "tags": "created",
            "properties": {"source": "web"},
            "queue_id": i % 4,
        }
        for i, item in enumerate(["book", "lamp", "pen", "desk", "mug", "chair", "plant", "clock"])
    ]
    ok(httpx.post(f"{api}/v1/topics/{TOPIC}/messages", json={"messages": messages}, timeout=30))
    offsets = {"0": 1, "1": 1, "2": 0, "3": 2}
    ok(
        httpx.put(
            f"{api}/v1/groups/{GROUP}/offsets",
            json={"topic": TOPIC, "offsets": offsets},
            timeout=30,
        )
    )
    # A POP group that received the audit messages and dead-lettered two of them.
    audit = [{"body": json.dumps({"event": e}), "key": e} for e in ("login", "logout", "reset")]
    ok(httpx.post(f"{api}/v1/topics/audit/messages", json={"messages": audit}, timeout=30))
    pop = {"mode": "pop", "start": "earliest", "max_delivery_attempts": 5}
    ok(httpx.put(f"{api}/v1/groups/{POP_GROUP}", json=pop, timeout=30))
    r = httpx.post(
        f"{api}/v1/groups/{POP_GROUP}/receive",
        json={"topic": "audit", "max_messages": 3, "invisible_ms": 600_000},
        timeout=30,
    )
    ok(r)
    handles = [m["receipt_handle"] for m in r.json()["messages"][:2]]
    ok(
        httpx.post(
            f"{api}/v1/groups/{POP_GROUP}/dlq",
            json={"topic": "audit", "receipt_handles": handles},
            timeout=30,
        )
    )
    # A delay message and a transaction, pending: the Rates page's backlogs.
    later = [{"body": "remind", "delay_ms": 3_600_000}]
    ok(httpx.post(f"{api}/v1/topics/{TOPIC}/messages", json={"messages": later}, timeout=30))
    half = {"messages": [{"body": "half"}], "transaction": {"producer_group": "checkout"}}
    ok(httpx.post(f"{api}/v1/topics/{TOPIC}/messages", json=half, timeout=30))


def traffic(api: str, browser: Browser, samples: int = 12) -> None:
    """Produce and pull in waves until the Rates page has drawn ``samples`` samples."""
    points = "document.querySelector('#rates polyline')?.points.length || 0"
    wave = 0
    deadline = time.monotonic() + 120
    while browser.evaluate(points) < samples:
        if time.monotonic() > deadline:
            raise RuntimeError("the Rates page drew no samples in 120 s")
        wave += 1
        n = 20 + 15 * (wave % 5)
        msgs = [{"body": json.dumps({"wave": wave, "i": i})} for i in range(n)]
        httpx.post(f"{api}/v1/topics/{TOPIC}/messages", json={"messages": msgs}, timeout=30)
        httpx.get(
            f"{api}/v1/topics/{TOPIC}/queues/{wave % 4}/messages",
            params={"offset": 0, "max_messages": 64},
            timeout=30,
        )
        time.sleep(0.4)  # pacing the load; the loop ends on the page's state


def shoot(browser: Browser, name: str, out: Path, full_page: bool = False) -> Path:
    path = out / f"{name}.png"
    data = small_png(browser.screenshot(full_page))
    if len(data) > MAX_PNG_BYTES:
        raise RuntimeError(f"{path}: {len(data)} bytes, over {MAX_PNG_BYTES}")
    path.write_bytes(data)
    print(f"{path.relative_to(ROOT)}: {len(data) // 1024} KB")
    return path


def pop_group(b: Browser, url: str, out: Path) -> Path:
    """The Groups page of the POP group: its counters, configuration and dead letters."""
    b.open(url + "#/groups")
    b.wait_for(f"!!document.querySelector('tr[data-group={POP_GROUP}]')")
    b.click(f"tr[data-group={POP_GROUP}] button")
    b.wait_for("document.querySelector('#dlq-summary')?.dataset.dead === '2'")
    return shoot(b, "groups-pop", out, full_page=True)


def transfer(cluster: LocalBrokerCluster, first: str) -> str:
    """Leadership from ``first`` to another node (the master's history shows an election
    and a transfer); the new master's id."""
    to = next(n for n in cluster.ids if n != first)
    r = httpx.post(f"{cluster.urls[first]}/v1/cluster/leadership", json={"to": to}, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"leadership transfer: {r.status_code} {r.text}")
    if cluster.wait_ready(timeout_s=90) != to:
        raise RuntimeError(f"{to} is not the master after the transfer")
    return to


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="ledgermq-screenshots-"))
    cluster = LocalBrokerCluster(3, data_dir)
    shots = []
    try:
        cluster.start_all()
        first = cluster.wait_ready(timeout_s=90)
        seed(cluster.urls[first])
        master = transfer(cluster, first)
        watcher = next(n for n in cluster.ids if n != master)
        url = cluster.urls[watcher] + "/console/"
        with Browser(WIDTH, HEIGHT) as b:
            master_shown = "!!document.querySelector('#banner [data-master]')"
            b.open(url + "#/cluster")
            b.wait_for(
                master_shown + " && document.querySelectorAll('#nodes tr[data-state=up]')"
                ".length === 3 && document.querySelectorAll('#history tbody tr').length >= 2"
                " && document.querySelector('#history tbody tr')?.dataset.how === 'transfer'"
                " && document.querySelector('#history tbody tr td:last-child')?.innerText"
                " === 'n0, n1, n2'"
                " && document.querySelectorAll('#members tbody tr').length === 3"
            )
            shots.append(shoot(b, "cluster", out, full_page=True))

            b.open(url + "#/topics")
            b.wait_for(f"!!document.querySelector('tr[data-topic={TOPIC}]')")
            b.click(f"tr[data-topic={TOPIC}] button.secondary")
            b.wait_for("document.querySelectorAll('#queues tbody tr').length === 4")
            shots.append(shoot(b, "topics", out))

            b.open(url + "#/messages")
            b.wait_for(master_shown)
            b.fill("#send input[name=topic]", TOPIC)
            b.fill("#send input[name=sharding_key]", "customer-7")
            b.fill("#send input[name=delay_s]", "30")
            b.fill("#send textarea[name=properties]", "source=console")
            b.fill("#find input[name=topic]", TOPIC)
            b.fill("#find input[name=key]", "order-42")
            b.click("#find button")
            b.wait_for("!!document.querySelector('details[data-key=\"order-42\"]')")
            b.click("details[data-key='order-42'] summary")
            shots.append(shoot(b, "messages", out, full_page=True))

            b.open(url + "#/groups")
            b.wait_for(f"!!document.querySelector('tr[data-group={GROUP}]')")
            b.click(f"tr[data-group={GROUP}] button")
            b.wait_for(
                "!!document.querySelector('#total-lag') && !!document.querySelector('#reset')"
            )
            shots.append(shoot(b, "groups", out, full_page=True))

            shots.append(pop_group(b, url, out))

            b.open(url + "#/rates")
            b.wait_for("!!document.querySelector('#rates figure.chart')")
            traffic(cluster.urls[master], b)
            shots.append(shoot(b, "rates", out, full_page=True))

            b.open(url + "#/cluster")
            b.wait_for(
                f"document.querySelector('#banner [data-master]')?.dataset.master === '{master}'"
            )
            cluster.kill(master)
            b.wait_for(
                "(() => { const m = document.querySelector('#banner [data-master]')"
                "?.dataset.master;"
                f" return !!m && m !== '{master}'"
                f" && document.querySelector('#nodes tr[data-node={master}]')?.dataset.state"
                " === 'down'; })()",
                timeout_s=FAILOVER_S,
            )
            b.wait_for(
                "document.querySelector('#history tbody tr')?.dataset.how === 'election'"
                f" && document.querySelector('#history tbody tr')?.dataset.leader !== '{master}'"
                " && document.querySelector('#history tbody tr td:last-child')?.innerText"
                ".split(', ').length === 2",
                timeout_s=FAILOVER_S,
            )
            shots.append(shoot(b, "cluster-failover", out, full_page=True))
            errors = b.errors()
            # The dead node's refused connections are the point of the last picture.
            unexpected = [e for e in errors if "ERR_CONNECTION_REFUSED" not in e]
            if unexpected:
                raise RuntimeError(f"the console reported errors: {unexpected}")
    finally:
        cluster.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)
    return shots


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=OUT, help="directory (default docs/console)")
    args = parser.parse_args(argv)
    take(args.out)


if __name__ == "__main__":
    main()
