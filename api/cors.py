"""Cross-origin reads and writes between the nodes of one cluster (the web console).

The console (``/console``, docs/console.md) served by one node asks every node of the
group for its ``/v1/cluster`` and sends writes to the master: requests from one node's
origin to another's. Browsers allow them only when the other node says so, so this
middleware answers CORS for exactly the origins of the cluster's own HTTP URLs
(``--peer-urls``, ``--advertised-url`` and ``--console-urls``, and the URLs of members
added while the cluster runs): a page from anywhere else gets no CORS
headers and the browser keeps it out, as before. It answers a preflight (``OPTIONS``
with ``Access-Control-Request-Method``) from such an origin itself, before the token
check, which a preflight never carries a token for; the request that follows is checked
as any other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.staticfiles import PathLike, StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.settings import BrokerSettings

ALLOW_METHODS = b"GET, POST, PUT, DELETE"
ALLOW_HEADERS = b"authorization, content-type"
EXPOSE_HEADERS = b"retry-after, location"
PREFLIGHT_MAX_AGE_S = 600
PATHS = ("/v1/", "/metrics", "/healthz", "/readyz")


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of an URL, lower-cased, as a browser's ``Origin`` is."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def cluster_origins(settings: BrokerSettings) -> set[str]:
    """The origins of the cluster's nodes' HTTP URLs known to this node, and of the
    URLs a browser reaches them at (``--console-urls``)."""
    urls = [*settings.peer_urls.values(), *settings.console_urls.values()]
    if settings.advertised_url:
        urls.append(settings.advertised_url)
    return {origin_of(u) for u in urls if u}


MemberUrls = Callable[[], Iterable[str]]  # the HTTP URLs in the configuration in force


class ClusterOrigins:
    """The origins of the settings (fixed) and of the configuration's members (a node
    added at run time: ``members`` asked on each look, a handful of URLs)."""

    def __init__(self, settings: BrokerSettings, members: MemberUrls | None = None) -> None:
        self.fixed = cluster_origins(settings)
        self.members = members

    def __contains__(self, origin: str) -> bool:
        if origin in self.fixed:
            return True
        return self.members is not None and any(origin_of(u) == origin for u in self.members())

    def all(self) -> set[str]:
        extra = {origin_of(u) for u in self.members() if u} if self.members is not None else set()
        return self.fixed | extra


class ClusterCORS:
    """CORS for the cluster's own origins on the API's paths; nothing for others."""

    def __init__(
        self, app: ASGIApp, settings: BrokerSettings, members: MemberUrls | None = None
    ) -> None:
        self.app = app
        self.origins = ClusterOrigins(settings, members)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Every request passes here, produces too: a client that is not a browser sends
        # no Origin, and costs one look through the header names.
        raw = None
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"origin":
                    raw = value
                    break
        if raw is None or not scope["path"].startswith(PATHS):
            await self.app(scope, receive, send)
            return
        origin = raw.decode("latin-1").lower()
        if origin not in self.origins:
            await self.app(scope, receive, send)
            return
        allow = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
        preflight = scope["method"] == "OPTIONS" and any(
            name == b"access-control-request-method" for name, _ in scope["headers"]
        )
        if preflight:
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [
                        *allow,
                        (b"access-control-allow-methods", ALLOW_METHODS),
                        (b"access-control-allow-headers", ALLOW_HEADERS),
                        (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_allowed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    *allow,
                    (b"access-control-expose-headers", EXPOSE_HEADERS),
                ]
            await send(message)

        await self.app(scope, receive, send_allowed)


class ConsoleFiles(StaticFiles):
    """The console's files, each with a Content-Security-Policy that lets the page load
    nothing but this node's files and talk to nothing but the cluster's nodes (a
    script injected some day could not send data elsewhere), never be framed (no
    clicking **Make master** through another site's frame), and no MIME sniffing."""

    def __init__(
        self,
        *,
        directory: str | os.PathLike[str],
        settings: BrokerSettings,
        members: MemberUrls | None = None,
    ) -> None:
        super().__init__(directory=directory, html=True)
        self.origins = ClusterOrigins(settings, members)

    @property
    def policy(self) -> str:
        """The policy as of now: a page loaded after a member joined may ask it too."""
        connect = " ".join(["'self'", *sorted(self.origins.all())])
        return (
            f"default-src 'self'; connect-src {connect}; img-src 'self' data:;"
            " frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        )

    def file_response(
        self,
        full_path: PathLike,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["content-security-policy"] = self.policy
        # The page never from a cache: its policy names the members as of now (a member
        # added since must be reachable after a reload). Scripts and styles are checked
        # again each time (a 304 mostly), so an upgraded node's console is the one run.
        html = str(full_path).endswith(".html")
        response.headers["cache-control"] = "no-store" if html else "no-cache"
        response.headers["x-content-type-options"] = "nosniff"
        response.headers["referrer-policy"] = "no-referrer"
        return response
