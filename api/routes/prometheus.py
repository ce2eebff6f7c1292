"""``/metrics`` (docs/http.md), the Prometheus text exposition: open on a node without
tokens; on one with tokens it names every topic, so ``create_app`` includes this router
behind the token check unless the node opens it (``metrics_need_auth=False``). A router
of its own, apart from the probes, for that per-app choice."""

from fastapi import APIRouter
from starlette.responses import Response

from .common import MetricsDep

router = APIRouter(tags=["cluster"])


@router.get("/metrics", summary="Prometheus text exposition")
async def prometheus(metrics: MetricsDep) -> Response:
    # Rendered off the loop, once for concurrent scrapes, cached briefly (api.metrics).
    text = await metrics.render()
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")
