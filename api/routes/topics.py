"""Topics (docs/http.md): create, list, describe, delete."""

from fastapi import APIRouter
from starlette.responses import Response

from .. import models
from .common import AccessDep, JSONBytes, ReadsDep, TopicPath, TopicsDep, error_docs

router = APIRouter(tags=["topics"])


@router.post(
    "/v1/topics",
    status_code=201,
    response_model=models.TopicInfo,
    responses={200: {"model": models.TopicInfo}, **error_docs(307, 409, 413, 429, 503)},
    summary="create a topic (201); the same again answers 200",
)
async def create_topic(body: models.TopicCreate, topics: TopicsDep, access: AccessDep) -> Response:
    access.need("admin")
    t, created = await topics.create(body.name, body.queues)
    return JSONBytes({"name": t.name, "queues": t.queues}, status_code=201 if created else 200)


@router.get("/v1/topics", response_model=models.TopicList)
async def list_topics(topics: TopicsDep) -> Response:
    return JSONBytes({"topics": [{"name": t.name, "queues": t.queues} for t in topics.users()]})


@router.get(
    "/v1/topics/{topic}",
    response_model=models.TopicDescription,
    responses=error_docs(404),
)
async def describe_topic(topic: TopicPath, reads: ReadsDep, access: AccessDep) -> Response:
    access.need_any(("consume", "produce"), topic)
    return JSONBytes(reads.describe_topic(topic))


@router.delete(
    "/v1/topics/{topic}",
    status_code=204,
    response_class=Response,
    responses=error_docs(307, 404, 503),
)
async def delete_topic(topic: TopicPath, topics: TopicsDep, access: AccessDep) -> Response:
    access.need("admin")
    await topics.delete(topic)
    return Response(status_code=204)
