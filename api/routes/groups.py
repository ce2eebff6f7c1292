"""Consumer groups (docs/http.md): offsets (replicated, they survive failover exactly),
resets and group pulls."""

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from broker import errors
from broker.jsonint import decimal

from .. import group_records, media, models
from ..json_messages import JSONMessages, group_pull_json
from .common import (
    AccessDep,
    GroupPath,
    GroupsDep,
    JSONBytes,
    LongPollDep,
    MetricsDep,
    PopDep,
    error_docs,
)


def queue_ids(offsets: dict[str, int]) -> dict[int, int]:
    """A body's ``{"0": 12}`` as ``{0: 12}``; a key that is not a queue id is refused."""
    out = {}
    for k, v in offsets.items():
        q = decimal(k, 5)
        if q is None or q > 65_535:
            raise errors.InvalidArgumentError(f"offsets: {k!r} is not a queue id")
        out[q] = v
    return out


def offsets_out(offsets: dict[int, int]) -> dict[str, int]:
    """``{0: 12}`` as a body's ``{"0": 12}``, by queue id."""
    return {str(q): o for q, o in sorted(offsets.items())}


router = APIRouter(tags=["groups"])

# The groups and their committed offsets: list, read, commit, reset.


@router.get("/v1/groups", response_model=models.GroupList)
async def list_groups(groups: GroupsDep, access: AccessDep) -> Response:
    access.need("consume")
    return JSONBytes({"groups": groups.list_groups()})


@router.get(
    "/v1/groups/{group}/offsets",
    response_model=models.GroupOffsets,
    responses=error_docs(404),
)
async def group_offsets(
    group: GroupPath,
    groups: GroupsDep,
    pop: PopDep,
    access: AccessDep,
    topic: Annotated[str | None, Query(pattern=models.TOPIC_PATTERN)] = None,
) -> Response:
    access.need("consume", topic)
    if group in groups.meta.pop.groups:  # a POP group's: handed out, in flight, lag
        return JSONBytes({"offsets": pop.offsets(group, topic)})
    return JSONBytes({"offsets": groups.group_offsets(group, topic)})


@router.put(
    "/v1/groups/{group}/offsets",
    summary="commit a group's offsets (replicated; an offset behind the committed one"
    " leaves it: the answer says where each queue stands)",
    response_model=models.OffsetsAnswer,
    responses=error_docs(307, 404, 413, 503),
)
async def commit_offsets(
    group: GroupPath, body: models.CommitOffsets, groups: GroupsDep, access: AccessDep
) -> Response:
    access.need("consume", body.topic)
    offsets = await groups.commit_offsets(group, body.topic, queue_ids(body.offsets))
    return JSONBytes({"offsets": offsets_out(offsets)})


@router.post(
    "/v1/groups/{group}/offsets/reset",
    summary="move a group's offsets to earliest, latest or a store timestamp",
    response_model=models.OffsetsAnswer,
    responses=error_docs(307, 404, 413, 503),
)
async def reset_offsets(
    group: GroupPath, body: models.ResetOffsets, groups: GroupsDep, access: AccessDep
) -> Response:
    access.need("consume", body.topic)
    access.need_group(group)
    offsets = await groups.reset_offsets(group, body.topic, body.to)
    return JSONBytes({"offsets": offsets_out(offsets)})


# ``POST /v1/groups/{group}/pull``: from the group's committed offsets.
@router.post(
    "/v1/groups/{group}/pull",
    summary="pull from the group's committed offsets (long polling with wait_ms)",
    description=media.GROUP_PULL_DOC,
    response_model=models.GroupPullResponse,
    responses={200: media.RECORDS_RESPONSE, **error_docs(307, 404, 413, 429, 503)},
)
async def group_pull(
    *,
    request: Request,
    group: GroupPath,
    body: models.GroupPull,
    groups: GroupsDep,
    metrics: MetricsDep,
    access: AccessDep,
    long_poll: LongPollDep,
) -> Response:
    access.need("consume", body.topic)
    if media.pull_format(request.headers.get("accept"), media.RECORDS_ONLY) == media.RECORDS:
        with long_poll(body.wait_ms), metrics.long_polls.track_inprogress():
            return await group_records.group_pull_response(groups, metrics, group, body)
    make = JSONMessages(groups.settings.group, body.encoding)
    with long_poll(body.wait_ms), metrics.long_polls.track_inprogress():
        r = await groups.group_pull(
            make,
            group,
            body.topic,
            max_messages=body.max_messages,
            wait_ms=body.wait_ms,
            queue_ids=body.queue_ids,
            auto_commit=body.auto_commit,
        )
    metrics.count_pulled(body.topic, len(r.messages), make.body_bytes)
    content = group_pull_json(r.messages, offsets_out(r.next_offsets))
    return Response(content, media_type=JSONBytes.media_type)
