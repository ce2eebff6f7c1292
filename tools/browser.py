"""A headless Chromium driven over the DevTools protocol: the web console's tests
(tests/process/test_console.py) and its screenshots (``python -m tools.screenshots``).

Debian's ``chromium`` (``make chromium``) and the ``websockets`` package the node's
uvicorn already brings are all it takes: no chromedriver, no Selenium, no browser
downloaded by a driver package. The protocol hands over what the tests check directly:
every request the page makes (``Network.requestWillBeSent``) and every console error,
uncaught exception and failed load (``Runtime`` and ``Log`` events).

The browser runs with a throw-away profile, its background services (updates, sync,
safe browsing, metrics) off, and is killed on ``close``. Every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
POLL_S = 0.05
FLAGS = (
    "--headless=new",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider",
    "--safebrowsing-disable-auto-update",
    "--metrics-recording-only",
    "--password-store=basic",
    "--use-mock-keychain",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
HINT = (
    "chromium is missing: the web console's browser tests and screenshots need Debian's"
    " chromium. Run `make chromium` (apt-get install --no-install-recommends chromium, as"
    " root), or put a chromium on PATH"
)


class BrowserError(Exception):
    """The browser did not start, or a DevTools call failed."""


def find_chromium(candidates: tuple[str, ...] = ("/usr/bin/chromium",)) -> str:
    """Debian's ``/usr/bin/chromium`` (or the first of ``candidates`` there), else a
    ``chromium`` on ``PATH``; AssertionError with how to get one (a missing browser
    fails a test, it never skips it)."""
    found = [*candidates, shutil.which("chromium"), shutil.which("chromium-browser")]
    for candidate in found:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError(HINT)


class Browser:
    """One headless Chromium with one page, ``width`` x ``height`` CSS pixels."""

    def __init__(self, width: int = 1280, height: int = 800, chromium: str | None = None) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="ledgermq-chromium-"))
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._stack = contextlib.ExitStack()
        args = [chromium or find_chromium(), *FLAGS, f"--user-data-dir={self.profile}"]
        args.append(f"--window-size={width},{height}")
        if os.geteuid() == 0:  # Chromium's sandbox refuses to run as root (CI's containers)
            args.append("--no-sandbox")
        self._log = (self.profile / "chromium.log").open("wb")
        self.proc = subprocess.Popen(
            [*args, "about:blank"], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        try:
            self.ws = self._attach()
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def _attach(self) -> ClientConnection:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium did not start in {START_TIMEOUT_S} s")
            time.sleep(POLL_S)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        return self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=10)
        )

    def log_tail(self, n: int = 2000) -> str:
        self._log.flush()
        return (self.profile / "chromium.log").read_bytes()[-n:].decode(errors="replace")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result. Events that arrive meanwhile are kept."""
        self._next_id += 1
        mine = self._next_id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer in {CALL_TIMEOUT_S} s")
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("id") == mine:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in r:
            details = r["exceptionDetails"]
            raise BrowserError(
                f"{expression[:80]}: {details.get('exception', {}).get('description', details)}"
            )
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0, what: str | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy; its value. AssertionError
        after ``timeout_s``, naming what was waited for and the page's text."""
        return self.wait_until(lambda: self.evaluate(expression), timeout_s, what or expression)

    def wait_until(self, cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''")
                raise AssertionError(f"{what}: not met within {timeout_s} s; the page:\n{text}")
            time.sleep(POLL_S)

    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        """Load ``url`` and wait until ``ready`` holds."""
        self.call("Page.navigate", url=url)
        self.wait_for(ready, what=f"{url} loaded")

    def fill(self, selector: str, value: str) -> None:
        """Set a form field's value as typing would (``input`` and ``change`` events)."""
        self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            f" el.value = {json.dumps(value)};"
            " el.dispatchEvent(new Event('input', {bubbles: true}));"
            " el.dispatchEvent(new Event('change', {bubbles: true})); return true; })()"
        )

    def click(self, selector: str) -> None:
        found = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return false; el.click(); return true; })()"
        )
        if not found:
            raise AssertionError(f"nothing to click at {selector}")

    def text(self, selector: str) -> str:
        value = self.evaluate(
            f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''"
        )
        return str(value)

    def drain(self) -> None:
        """Take in the events that arrived since the last call."""
        self.evaluate("1")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page reported."""
        self.drain()
        found = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                found.append(f"exception: {d.get('exception', {}).get('description', d['text'])}")
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a)) for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                found.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        return found

    def requests(self) -> list[str]:
        """The URL of every request the page made."""
        self.drain()
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def clear(self) -> None:
        """Forget the events so far (the page goes on)."""
        self.drain()
        self.events.clear()

    def reset(self) -> None:
        """Leave the page for ``about:blank`` (its timers and requests stop) and forget
        every event so far: what a test checks next is its own page's."""
        self.open("about:blank", "location.href === 'about:blank'")
        self.clear()

    def screenshot(self, full_page: bool = False) -> bytes:
        """A PNG of the viewport, or of the whole page's height with ``full_page``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            viewport = self.call("Page.getLayoutMetrics")["cssLayoutViewport"]
            height = max(size["height"], viewport["clientHeight"])
            width = viewport["clientWidth"]
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        self._stack.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
