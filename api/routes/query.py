"""Query messages (docs/http.md): by key within a topic, by message id."""

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from broker import errors

from .. import models
from ..json_messages import JSONMessages, messages_json
from .common import (
    AccessDep,
    EncodingQuery,
    JSONBytes,
    LimitsDep,
    MetricsDep,
    NodeMaximum,
    ReadsDep,
    TopicPath,
    check_maxima,
    error_docs,
)

router = APIRouter(tags=["query"])

KEY_QUERY_MAX = NodeMaximum("max", ("max_key_query_results",))


@router.get(
    "/v1/topics/{topic}/messages",
    summary="messages carrying a key (or a UNIQ_KEY)",
    response_model=models.MessageList,
    responses=error_docs(404, 429, 503),
)
async def query_by_key(
    *,
    topic: TopicPath,
    key: Annotated[str, Query(min_length=1, max_length=1024)],
    reads: ReadsDep,
    limits: LimitsDep,
    metrics: MetricsDep,
    access: AccessDep,
    max: Annotated[int, KEY_QUERY_MAX.query(ge=1)] = 64,
    encoding: EncodingQuery = "utf-8",
) -> Response:
    check_maxima(limits, (KEY_QUERY_MAX, max))
    access.need("consume", topic)
    make = JSONMessages(reads.settings.group, encoding)
    found = reads.query_by_key(make, topic, key, max)
    metrics.count_pulled(topic, len(found), make.body_bytes)
    return Response(messages_json(found), media_type=JSONBytes.media_type)


@router.get(
    "/v1/messages/{msg_id}",
    response_model=models.MessageOut,
    responses=error_docs(404, 429, 503),
)
async def get_message(
    msg_id: Annotated[str, Path(max_length=256)],
    reads: ReadsDep,
    access: AccessDep,
    encoding: EncodingQuery = "utf-8",
) -> Response:
    topic, content = reads.get_message(
        JSONMessages(reads.settings.group, encoding).with_topic, msg_id
    )
    if not access.may("consume", topic):
        # Not the topic's name: the token may not learn what this id belongs to.
        raise errors.ForbiddenError("this token may not read this message", needs="consume")
    return Response(content, media_type=JSONBytes.media_type)
