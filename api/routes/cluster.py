"""``/v1/cluster`` (this node's view of its group), its role history, and leadership
transfer."""

from fastapi import APIRouter, Query
from starlette.responses import Response

from .. import models
from ..version import VERSION
from .common import (
    AccessDep,
    BrokerDep,
    JSONBytes,
    LeadershipDep,
    MembershipDep,
    NodeIdPath,
    SettingsDep,
    error_docs,
)

# How long a membership change may take (a promotion waits for its learner to catch up)
ChangeTimeout = Query(
    default=30.0, gt=0, le=600, description="seconds to wait for the change to commit"
)

router = APIRouter(tags=["cluster"])


@router.get("/v1/cluster", response_model=models.ClusterInfo)
async def cluster(broker: BrokerDep, settings: SettingsDep) -> Response:
    st = broker.status()
    nodes = []
    voters = broker.membership.voters()
    for node_id, addr in sorted(broker.membership.addresses().items()):
        url = broker.membership.url_of(node_id)
        if node_id == settings.node_id and settings.advertised_url:
            url = settings.advertised_url
        peer = st.peers.get(node_id)
        match = peer.match_index if peer else None
        if node_id == settings.node_id and st.raft_role == "LEADER":
            match = st.ledger_end_index
        nodes.append(
            {
                "node_id": node_id,
                "role": "voter" if node_id in voters else "learner",
                "raft_addr": addr,
                "http_url": url,
                "console_url": settings.console_urls.get(node_id, url),
                "grpc_addr": settings.peer_grpc.get(node_id),
                "match_index": match,
            }
        )
    leader_url = st.leader_url
    if st.leader_id == settings.node_id and settings.advertised_url:
        leader_url = settings.advertised_url
    return JSONBytes(
        {
            "group": st.group,
            "node_id": st.node_id,
            "raft_role": st.raft_role,
            "broker_role": st.broker_role,
            "term": st.term,
            "leader_id": st.leader_id,
            "leader_url": leader_url,
            "nodes": nodes,
            "ledger_begin_index": st.ledger_begin_index,
            "ledger_end_index": st.ledger_end_index,
            "committed_index": st.committed_index,
            "dispatched_index": st.dispatched_index,
            "snapshot_index": st.snapshot_index,
            "snapshots_installed": st.snapshots_installed,
            "diverged": st.diverged,
            "version": VERSION,
            "disk": broker.disk(),
        }
    )


@router.get(
    "/v1/cluster/history",
    summary="the last role changes this node saw (elections, leaders, transfers)",
    response_model=models.ClusterHistory,
)
async def cluster_history(broker: BrokerDep, settings: SettingsDep) -> Response:
    h = broker.history
    return JSONBytes(
        {
            "node_id": settings.node_id,
            "size": h.size,
            "recorded": h.recorded,
            "events": [e.to_dict() for e in h.entries()],
        }
    )


@router.post(
    "/v1/cluster/leadership",
    summary="transfer leadership; answers once the target leads",
    response_model=models.LeadershipResult,
    responses=error_docs(307, 409, 413, 503),
)
async def leadership(
    body: models.LeadershipRequest,
    leadership: LeadershipDep,
    broker: BrokerDep,
    access: AccessDep,
) -> Response:
    access.need("admin")
    await leadership.transfer(body.to)
    st = broker.status()
    return JSONBytes({"leader_id": st.leader_id or body.to, "term": st.term})


# ---- membership (issue 33; docs/operations.md "Changing the members") -----------------------


@router.get("/v1/cluster/members", response_model=models.Members)
async def members(membership: MembershipDep) -> Response:
    return JSONBytes(membership.members())


@router.post(
    "/v1/cluster/members",
    summary="add a learner: it receives the log and does not vote",
    response_model=models.MembershipResult,
    responses=error_docs(307, 409, 429, 503),
)
async def add_member(
    body: models.MemberAdd,
    membership: MembershipDep,
    access: AccessDep,
    timeout_s: float = ChangeTimeout,
) -> Response:
    access.need("admin")
    index = await membership.add(body.node_id, body.raft_addr, body.http_url, timeout_s)
    return JSONBytes({"config_index": index})


@router.post(
    "/v1/cluster/members/{node_id}/promote",
    summary="make a learner a voter once it caught up",
    response_model=models.MembershipResult,
    responses=error_docs(307, 409, 429, 503),
)
async def promote_member(
    node_id: NodeIdPath,
    membership: MembershipDep,
    access: AccessDep,
    timeout_s: float = ChangeTimeout,
) -> Response:
    access.need("admin")
    return JSONBytes({"config_index": await membership.promote(node_id, timeout_s)})


@router.delete(
    "/v1/cluster/members/{node_id}",
    summary="remove a member (the master hands leadership over first)",
    response_model=models.MembershipResult,
    responses=error_docs(307, 409, 429, 503),
)
async def remove_member(
    node_id: NodeIdPath,
    membership: MembershipDep,
    access: AccessDep,
    timeout_s: float = ChangeTimeout,
) -> Response:
    access.need("admin")
    return JSONBytes({"config_index": await membership.remove(node_id, timeout_s)})
