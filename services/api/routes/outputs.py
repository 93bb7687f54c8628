"""Harvest: `GET /jobs/{job_id}/outputs` lists a job's outputs, and
`GET /tasks/{task_id}/outputs/{name}` downloads one whose bytes are kept.

Work dirs are on the workers' hosts, which the api cannot read: only the bytes the worker kept
when it recorded a small output can be downloaded; a larger one answers 409 saying where it is.
"""

import logging
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Path, Query, Response

from services.api import harvest
from services.api.access import visible_job, visible_task
from services.api.deps import AUTH_RESPONSES, CurrentUser, JobIdPath, PoolDep, TaskIdPath
from services.api.schemas.outputs import OutputPublic, OutputsPage
from shared.domain.errors import Conflict, NotFound
from shared.store import jobs_repo, outputs_repo

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
        items=[OutputPublic.from_stored(output) for output in shown],
        next_cursor=harvest.encode_after(shown[-1]) if len(found) > limit else None,
    )


@router.get(
    "/tasks/{task_id}/outputs/{name}",
    response_class=Response,
    responses=harvest.DOWNLOAD_RESPONSES,
)
async def download_output(
    user: CurrentUser, task_id: TaskIdPath, name: OutputNamePath, pool: PoolDep
) -> Response:
    """The bytes of output `name` of the task's latest run, as an attachment.

    404 for an output the task did not record; 409 when its bytes were not kept (too large:
    the answer says where the file is) or its job was purged.
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
    assert content is not None  # refusal() says why whenever there is none
    logger.info(
        "output %s of task %s downloaded",
        name,
        task_id,
        extra={"action": "download", "task_id": task_id, "user": user.name},
    )
    return Response(
        content,
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": harvest.attachment(name),
            "ETag": f'"{output.sha256}"',
            "X-Content-Type-Options": "nosniff",
        },
    )
