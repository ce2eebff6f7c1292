"""The web console's files are served by the node (issue 34, docs/console.md): ``/console``
from the package's ``api/console`` directory with the right content types, open with auth
on (the data it shows is what the API guards), nothing taken from another host; and the
API answers CORS for the cluster's own origins only, so one node's console may ask the
others.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
import pytest

from api.app import CONSOLE_DIR, create_app
from ledgermq.node import add_broker_options, settings_from_args
from tests.api.conftest import node_settings, running_node
from tools.browser import find_chromium

PEER = "http://127.0.0.1:18081"
CONTENT_TYPES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "style.css": "text/css",
}


def test_every_file_is_served_and_nothing_comes_from_elsewhere() -> None:
    files = {p.name for p in CONSOLE_DIR.iterdir()}
    assert files == set(CONTENT_TYPES), "a new console file: give it its content type here"
    for name in files:
        # The SVG namespace names no host the page asks.
        text = (CONSOLE_DIR / name).read_text().replace('"http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(?<![\w/])(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), (
            f"{name} names another host: the console must work with no internet"
        )
    # Each file is package data (pyproject.toml), so an installed node serves it too.
    pyproject = tomllib.loads((CONSOLE_DIR.parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["api"]
    for name in files:
        assert any(fnmatch.fnmatch(f"console/{name}", p) for p in patterns), name
    index = (CONSOLE_DIR / "index.html").read_text()
    for ref in re.findall(r'(?:src|href)="([^"#:]+)"', index):
        assert (CONSOLE_DIR / ref).is_file(), ref
    for name in ("app.js", "api.js"):
        for ref in re.findall(r'from "\./([^"]+)"', (CONSOLE_DIR / name).read_text()):
            assert (CONSOLE_DIR / ref).is_file(), ref


@pytest.mark.asyncio
async def test_console_files_with_their_content_types(tmp_path: Path) -> None:
    async with running_node(node_settings(tmp_path / "n0")) as node:
        r = await node.http.get("/console")
        assert r.status_code == 307 and r.headers["location"] == "/console/"
        r = await node.http.get("/console/")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="app.js">' in r.text
        for name, kind in CONTENT_TYPES.items():
            r = await node.http.get(f"/console/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].split(";")[0] in (
                kind,
                "application/javascript" if kind == "text/javascript" else kind,
            ), (name, r.headers["content-type"])
            assert r.content == (CONSOLE_DIR / name).read_bytes()
            csp = r.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            cache = "no-store" if name.endswith(".html") else "no-cache"
            assert r.headers["cache-control"] == cache, name
        r = await node.http.get("/console/missing.js")
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
        r = await node.http.get("/console/../api/app.py")
        assert r.status_code == 404


@pytest.mark.asyncio
async def test_console_is_open_with_auth_on_and_the_api_is_not(tmp_path: Path) -> None:
    settings = node_settings(tmp_path / "n0")
    async with running_node(settings) as node:
        app = create_app(settings, node.broker, auth_token="s3cret")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            assert (await http.get("/console/")).status_code == 200
            assert (await http.get("/console/app.js")).status_code == 200
            assert (await http.get("/v1/cluster")).status_code == 401
            ok = await http.get("/v1/cluster", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200


@pytest.mark.asyncio
async def test_cors_for_the_cluster_s_origins_only(tmp_path: Path) -> None:
    settings = node_settings(tmp_path / "n0")
    settings.peer_urls["n1"] = PEER + "/"
    async with running_node(settings) as node:
        # The page may talk to the cluster's nodes, and only to them.
        csp = (await node.http.get("/console/")).headers["content-security-policy"]
        connect = next(d for d in csp.split(";") if d.strip().startswith("connect-src"))
        assert set(connect.split()[1:]) == {"'self'", PEER, settings.advertised_url}
        app = create_app(settings, node.broker, auth_token="s3cret")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            preflight = {
                "Origin": PEER,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            }
            r = await http.options("/v1/topics", headers=preflight)
            assert r.status_code == 204
            assert r.headers["access-control-allow-origin"] == PEER
            assert "POST" in r.headers["access-control-allow-methods"]
            assert "authorization" in r.headers["access-control-allow-headers"]
            # An error answered to a peer's console carries CORS, so the page can read it.
            r = await http.get("/v1/cluster", headers={"Origin": PEER})
            assert r.status_code == 401
            assert r.headers["access-control-allow-origin"] == PEER
            r = await http.get(
                "/v1/cluster", headers={"Origin": PEER, "Authorization": "Bearer s3cret"}
            )
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PEER
            # Anyone else: no CORS at all, and a preflight is not answered.
            other = {**preflight, "Origin": "http://evil.example"}
            r = await http.options("/v1/topics", headers=other)
            assert "access-control-allow-origin" not in r.headers
            assert r.status_code != 204
            r = await http.get("/v1/cluster", headers={"Origin": "http://evil.example"})
            assert "access-control-allow-origin" not in r.headers


def test_a_missing_chromium_fails_and_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AssertionError, match=r"Run `make chromium`"):
        find_chromium((str(tmp_path / "chromium"),))


@pytest.mark.asyncio
async def test_console_urls_are_shown_and_admitted_where_browsers_reach_the_nodes(
    tmp_path: Path,
) -> None:
    # compose: the nodes know each other by container names, a browser on the host
    # reaches them at published ports (--console-urls)
    outside = "http://localhost:18081"
    settings = node_settings(tmp_path / "n0")
    settings.peer_urls["n1"] = "http://broker1:8080"
    settings.console_urls.update({"n0": "http://localhost:18080", "n1": outside})
    async with running_node(settings) as node:
        (n0,) = (await node.http.get("/v1/cluster")).json()["nodes"]
        assert n0["http_url"] == settings.advertised_url
        assert n0["console_url"] == "http://localhost:18080"
        csp = (await node.http.get("/console/")).headers["content-security-policy"]
        connect = next(d for d in csp.split(";") if d.strip().startswith("connect-src"))
        assert outside in connect.split()
        r = await node.http.get("/v1/cluster", headers={"Origin": outside})
        assert r.headers["access-control-allow-origin"] == outside


def test_console_urls_option_is_checked() -> None:
    parser = argparse.ArgumentParser()
    add_broker_options(parser)
    urls = "n0=http://localhost:8080,n1=http://localhost:8081"
    settings, _ = settings_from_args(parser.parse_args(["--console-urls", urls]))
    assert settings.console_urls == {"n0": "http://localhost:8080", "n1": "http://localhost:8081"}
    with pytest.raises(ValueError, match="want node=http://host:port"):
        settings_from_args(parser.parse_args(["--console-urls", "n1=localhost:8081"]))
