"""POP groups (docs/consuming.md): a group's configuration, and receive, ack, nack,
changes of the invisible time and dead letters. Every write goes to the master, as a
produce does."""

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker import errors

from .. import group_records, media, models
from ..json_messages import JSONMessages, received_json
from .common import AccessDep, GroupPath, JSONBytes, LongPollDep, MetricsDep, PopDep, error_docs

router = APIRouter(tags=["pop"])


@router.put(
    "/v1/groups/{group}",
    summary="create a POP group or change its configuration (replicated)",
    response_model=models.GroupDescription,
    responses=error_docs(307, 409, 413, 503),
)
async def configure(
    group: GroupPath, body: models.GroupConfig, pop: PopDep, access: AccessDep
) -> Response:
    access.need("admin")
    await pop.configure(group, body.model_dump(exclude_none=True))
    return JSONBytes(pop.describe(group))


@router.get(
    "/v1/groups/{group}",
    summary="a group's mode, configuration and, for a POP group, what is in flight",
    response_model=models.GroupDescription,
    responses=error_docs(404),
)
async def describe(group: GroupPath, pop: PopDep, access: AccessDep) -> Response:
    access.need("consume")
    if group in pop.state.groups:
        return JSONBytes(pop.describe(group))
    if group in pop.meta.offsets:
        return JSONBytes({"group": group, "mode": "offsets", "topics": []})
    raise errors.GroupNotFoundError(f"group {group} does not exist")


@router.post(
    "/v1/groups/{group}/receive",
    summary="receive messages, each invisible to the group until acked or its time ends",
    description=media.RECEIVE_DOC,
    response_model=models.ReceiveResponse,
    responses={200: media.RECORDS_RESPONSE, **error_docs(307, 404, 409, 413, 429, 503)},
)
async def receive(
    *,
    request: Request,
    group: GroupPath,
    body: models.Receive,
    pop: PopDep,
    metrics: MetricsDep,
    access: AccessDep,
    long_poll: LongPollDep,
) -> Response:
    access.need("consume", body.topic)
    if media.pull_format(request.headers.get("accept"), media.RECORDS_ONLY) == media.RECORDS:
        with long_poll(body.wait_ms), metrics.long_polls.track_inprogress():
            return await group_records.receive_response(pop, metrics, group, body)
    make = JSONMessages(pop.settings.group, body.encoding)
    with long_poll(body.wait_ms), metrics.long_polls.track_inprogress():
        got = await group_records.receive(pop, make, group, body)
    metrics.count_pulled(body.topic, len(got), make.body_bytes)
    return Response(received_json(got), media_type=JSONBytes.media_type)


def _results(handles: list[str], held: list[bool]) -> Response:
    return JSONBytes(
        {
            "results": [
                {"receipt_handle": h, "status": "OK" if ok else "INVALID_RECEIPT_HANDLE"}
                for h, ok in zip(handles, held, strict=True)
            ]
        }
    )


@router.post(
    "/v1/groups/{group}/ack",
    summary="acknowledge received messages: done for the group",
    response_model=models.AckResponse,
    responses=error_docs(307, 404, 413, 503),
)
async def ack(group: GroupPath, body: models.Ack, pop: PopDep, access: AccessDep) -> Response:
    access.need("consume", body.topic)
    return _results(body.receipt_handles, await pop.ack(group, body.topic, body.receipt_handles))


@router.post(
    "/v1/groups/{group}/nack",
    summary="give received messages back: delivered again after delay_ms (or the retry delay)",
    response_model=models.AckResponse,
    responses=error_docs(307, 404, 413, 503),
)
async def nack(group: GroupPath, body: models.Nack, pop: PopDep, access: AccessDep) -> Response:
    access.need("consume", body.topic)
    held = await pop.nack(group, body.topic, body.receipt_handles, body.delay_ms)
    return _results(body.receipt_handles, held)


@router.post(
    "/v1/groups/{group}/invisible",
    summary="change a received message's invisible time; answers its new handle",
    response_model=models.ChangeInvisibleResponse,
    responses=error_docs(307, 404, 409, 413, 503),
)
async def change_invisible(
    group: GroupPath, body: models.ChangeInvisible, pop: PopDep, access: AccessDep
) -> Response:
    access.need("consume", body.topic)
    r = await pop.change_invisible(group, body.topic, body.receipt_handle, body.invisible_ms)
    return JSONBytes(
        {
            "receipt_handle": r.receipt_handle,
            "delivery_attempt": r.delivery_attempt,
            "invisible_until": r.invisible_until,
        }
    )


@router.post(
    "/v1/groups/{group}/dlq",
    summary="copy received messages into the group's dead letters at once (%DLQ%<group>)",
    response_model=models.AckResponse,
    responses=error_docs(307, 404, 413, 503),
)
async def dead_letter(
    group: GroupPath, body: models.DeadLetter, pop: PopDep, access: AccessDep
) -> Response:
    access.need("consume", body.topic)
    held = await pop.dead_letter_now(group, body.topic, body.receipt_handles)
    return _results(body.receipt_handles, held)


@router.post(
    "/v1/groups/{group}/dlq/redrive",
    summary="produce the group's dead letters back to their topics, from the first not yet"
    " produced back (exactly once)",
    response_model=models.RedriveResponse,
    responses=error_docs(307, 404, 413, 503),
)
async def redrive(
    group: GroupPath, body: models.Redrive, pop: PopDep, access: AccessDep
) -> Response:
    access.need("admin")
    return JSONBytes(await pop.redrive(group, body.max_messages))
