"""Harvest: `GET /jobs/{job_id}/outputs` lists a job's outputs (size, sha256), and
`GET /tasks/{task_id}/outputs/{name}` downloads one, of any size, from the object store the
worker put it in before its task completed: a redirect to a short-lived link (S3), or its
bytes streamed (a directory store).
"""

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from fastapi.responses import RedirectResponse, StreamingResponse

from services.api import harvest
from services.api.access import visible_job, visible_task
from services.api.deps import (
    AUTH_RESPONSES,
    CurrentUser,
    JobIdPath,
    ObjectStoreDep,
    PoolDep,
    SettingsDep,
    TaskIdPath,
)
from services.api.schemas.outputs import OutputPublic, OutputsPage
from shared.domain.errors import Conflict, NotFound
from shared.objects import ObjectNotFound, ObjectStore
from shared.store import jobs_repo, outputs_repo
from shared.store.outputs_repo import StoredOutput

logger = logging.getLogger(__name__)

router = APIRouter(tags=["outputs"], responses=AUTH_RESPONSES)

_JOB_NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {
    404: {"description": "No such job, or it belongs to another user."}
}


async def _name(
    name: Annotated[str, Path(description="An output's file name, as in `outputs`.")],
) -> str:
    return harvest.check_name(name)


#: An `{name}` path segment that is a plain output file name (422 naming it otherwise).
OutputNamePath = Annotated[str, Depends(_name)]


@router.get("/jobs/{job_id}/outputs", responses=_JOB_NOT_FOUND)
async def list_outputs(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    page: Annotated[
        str | None, Query(alias="cursor", max_length=harvest.MAX_OUTPUT_CURSOR_CHARS)
    ] = None,
) -> OutputsPage:
    """The outputs of the latest run of each task that is not superseded, by task index and
    name, one page at a time; `downloadable` says whether the bytes can be downloaded. A
    purged job has none: `items` is empty and `purged` says who purged it, when and why."""
    after = harvest.decode_after(page) if page is not None else None
    async with pool.acquire() as conn:
        job = await visible_job(conn, user, job_id)
        if job.purged_at is not None:  # their bytes and work dirs are gone (records stay)
            return OutputsPage.of_purged(job)
        found = await outputs_repo.for_job(conn, job_id, after=after, limit=limit + 1)
    shown = found[:limit]
    return OutputsPage(
        items=[OutputPublic.from_stored(output, settings.store_url) for output in shown],
        next_cursor=harvest.encode_after(shown[-1]) if len(found) > limit else None,
    )


@router.get(
    "/tasks/{task_id}/outputs/{name}",
    response_class=Response,
    responses=harvest.DOWNLOAD_RESPONSES,
)
async def download_output(
    user: CurrentUser,
    task_id: TaskIdPath,
    name: OutputNamePath,
    pool: PoolDep,
    store: ObjectStoreDep,
    settings: SettingsDep,
    range_: Annotated[str | None, Header(alias="Range", max_length=100)] = None,
) -> Response:
    """Output `name` of the task's latest run, any size: from an S3 store, a redirect (307) to
    a link good for `VIGIL_DOWNLOAD_LINK_S` seconds; from a directory store, its bytes as an
    attachment, streamed (`Range: bytes=N-` resumes a cut download: 206).

    404 for an output the task did not record; 409 when its job was purged (or the output
    was recorded before outputs went to the store); 503 when the store fails to answer.
    """
    async with pool.acquire() as conn:
        task = await visible_task(conn, user, task_id)
        found = await outputs_repo.one(conn, task_id, name)
        job = await jobs_repo.get(conn, task.job_id, with_counts=False)
    if found is None:
        raise NotFound(f"task {task_id} recorded no output {name!r}")
    assert job is not None  # jobs are never deleted
    output, content = found
    refused = harvest.refusal(output, job, content)
    if refused is not None:
        raise Conflict.of(refused)
    logger.info(
        "output %s of task %s downloaded",
        name,
        task_id,
        extra={"action": "download", "task_id": task_id, "user": user.name},
    )
    headers = {
        "Content-Disposition": harvest.attachment(name),
        "ETag": f'"{output.sha256}"',
        "X-Content-Type-Options": "nosniff",
        "Accept-Ranges": "bytes",
    }
    if output.object_key is None:  # recorded before the store: its kept bytes
        assert content is not None  # refusal() says why whenever there is none
        return Response(content, media_type="application/octet-stream", headers=headers)
    link = await store.presigned_get(output.object_key, settings.download_link_s)
    if link is not None:
        return RedirectResponse(link, status_code=307)
    return await _streamed(store, output, range_, headers)


async def _streamed(
    store: ObjectStore, output: StoredOutput, range_: str | None, headers: dict[str, str]
) -> Response:
    """The object's bytes (from the offset `range_` asks for), its first chunk read before
    answering: a missing object is a 409, not a cut 200."""
    assert output.object_key is not None
    try:
        offset = harvest.byte_range(range_, output.size)
    except ValueError as exc:
        return Response(
            status_code=416, headers={"Content-Range": f"bytes */{output.size}"}, content=str(exc)
        )
    chunks = store.read(output.object_key, offset=offset or 0)
    try:
        first = await anext(chunks, b"")
    except ObjectNotFound:
        raise Conflict.of(harvest.missing(output)) from None

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    headers = {**headers, "Content-Length": str(output.size - (offset or 0))}
    if offset is None:
        return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)
    headers["Content-Range"] = f"bytes {offset}-{output.size - 1}/{output.size}"
    return StreamingResponse(
        body(), status_code=206, media_type="application/octet-stream", headers=headers
    )
