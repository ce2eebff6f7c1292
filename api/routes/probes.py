"""``/healthz`` and ``/readyz`` (docs/http.md): open even with tokens on the node."""

from fastapi import APIRouter
from starlette.responses import Response

from .. import models
from .common import BrokerDep, JSONBytes, SettingsDep

router = APIRouter(tags=["cluster"])


@router.get("/healthz", summary="the process is up and working (503 once it failed: it is exiting)")
async def healthz(broker: BrokerDep) -> Response:
    if broker.failed is not None:
        return JSONBytes({"status": "failed", "reason": repr(broker.failed)}, status_code=503)
    return JSONBytes({"status": "ok"})


@router.get(
    "/readyz",
    summary="a master is known and dispatch has caught up with commit",
    response_model=models.Readiness,
    responses={503: {"model": models.Readiness}},
)
async def readyz(broker: BrokerDep, settings: SettingsDep) -> Response:
    st = broker.status()
    reason = None
    if st.failed is not None:
        reason = f"node failed: {st.failed}"
    elif st.diverged is not None:
        reason = f"diverged: {st.diverged}"
    elif st.dispatch_stall is not None:
        reason = f"dispatch stalled: {st.dispatch_stall}"
    elif st.leader_id is None:
        reason = "no master known"
    elif st.dispatched_index < st.committed_index:
        reason = f"dispatch at {st.dispatched_index} of {st.committed_index}"
    elif st.leader_id == settings.node_id and not broker.is_master:
        reason = "leader still catching up"
    if reason:
        return JSONBytes({"ready": False, "reason": reason}, status_code=503)
    return JSONBytes({"ready": True, "reason": None})
