"""`/jobs`: submit, list, read one, its tasks and its log lines; actions and appended inputs
(design §9).
"""

import dataclasses
import json
import logging
import re
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Header, Query, Response, status
from pydantic import AfterValidator

from services.api import cursor, queries, submission, waiting
from services.api.access import check_visible, owner_filter, visible_job
from services.api.deps import (
    AUTH_RESPONSES,
    QUOTA_RESPONSES,
    AnalysersDep,
    CurrentUser,
    JobIdPath,
    MetricsDep,
    ObjectStoreDep,
    PoolDep,
    SettingsDep,
    SubmittingUser,
    SyntaxCheckDep,
    TaskQuotaDep,
    TaskTypesDep,
)
from services.api.errors import invalid
from services.api.harvest import check_retention
from services.api.schemas.common import TEXT_PATTERN
from services.api.schemas.events import EventPublic, EventsPage
from services.api.schemas.jobs import (
    InputsAdded,
    InputsAppend,
    JobActionRequest,
    JobCreate,
    JobEdit,
    JobErrorPublic,
    JobPublic,
    JobsPage,
    JobSubmitted,
    LogPublic,
    LogsPage,
    TestRequest,
    check_priority,
)
from services.api.schemas.tasks import TaskPublic
from shared.domain.actions import JobAction
from shared.domain.ids import ID_PATTERN
from shared.domain.messages import Severity
from shared.domain.states import JobState, TaskState
from shared.objects import ObjectStoreError
from shared.operations import (
    configuring,
    datasets,
    harvest,
    job_edits,
    pool_status,
    task_actions,
)
from shared.store import event_log, job_errors_repo, jobs_repo, logs_repo, tasks_repo
from shared.task_types.shell import ShellTaskType

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=AUTH_RESPONSES)

_NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {
    404: {"description": "No such job, or it belongs to another user."}
}
_CONFLICT: Final[dict[int | str, dict[str, Any]]] = {
    409: {"description": "The job's state does not allow it; the detail says why."}
}
_RATE_LIMITED: Final[dict[int | str, dict[str, Any]]] = {
    429: {
        "description": "Too many submissions with this token, or tasks created by this user;"
        " `Retry-After` says when to retry."
    }
}
_INT4_MAX: Final = 2**31 - 1
_INT8_MAX: Final = 2**63 - 1

_KEY_RE: Final = re.compile(r"[\x20-\x7e]{1,200}")


def _check_key(key: str | None) -> str | None:
    if key is not None and not _KEY_RE.fullmatch(key):
        raise ValueError("Idempotency-Key must be 1 to 200 printable ASCII characters")
    return key


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retrying a submission with the same key returns the same job (200).",
    ),
    AfterValidator(_check_key),
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": JobPublic, "description": "The job made earlier with this Idempotency-Key."},
        409: {
            "description": "`inputs_from` names a purged job (its outputs are gone), or the job"
            " declares outputs and the user's stored bytes are at their quota."
        },
        413: {"description": "The body is larger than `VIGIL_MAX_BODY_BYTES`."},
        429: _RATE_LIMITED[429],
        503: {"description": "The store cannot be reached to check a file given by URL."},
    },
)
async def submit_job(
    user: SubmittingUser,
    body: JobCreate,
    pool: PoolDep,
    settings: SettingsDep,
    task_types: TaskTypesDep,
    analysers: AnalysersDep,
    metrics: MetricsDep,
    quota: TaskQuotaDep,
    response: Response,
    syntax: SyntaxCheckDep,
    store: ObjectStoreDep,
    idempotency_key: IdempotencyKey = None,
) -> JobSubmitted:
    """Create a job with one `new` task per input: 201 with the job, and `warnings`: a
    `shell` command that `bash -n` cannot parse is accepted and said so there (every task
    would fail with exit 2; a refusal would turn away a script that turns on a parsing option
    such as `shopt -s extglob` before it needs it).

    With `inputs_from` (and no `inputs`) the job gets one task per task of that job instead,
    each waiting for its upstream task to complete, and more as inputs are appended upstream.

    With an `Idempotency-Key` this user already used, nothing is created and the earlier job
    is returned with 200 (the body is not compared). A 422 names the field at fault.
    """
    body.check_against(task_types, settings.max_inputs, analysers)
    check_priority(body.priority, user.is_operator, settings.priority_user_range)
    check_retention(body.retention_s, settings.min_retention_s)
    # a request no live host can hold is refused, or accepted and said so (`warnings`)
    too_large = await submission.too_large(
        pool, body.resources.to_resources(), settings.worker_pool, settings.dead_host_s
    )
    if too_large is not None and settings.refuse_unsatisfiable:
        raise submission.unsatisfiable_refusal(too_large)
    job, created = await submission.submit(
        pool,
        user,
        body,
        idempotency_key,
        quota,
        store,
        settings.store_url,
        settings.store_quota_bytes,
    )
    if created:
        metrics.jobs_submitted.inc()
    else:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/jobs/{job.id}"
    shell = body.type == ShellTaskType.name
    warnings = await syntax.warnings(body.command) if shell and body.command else []
    if too_large is not None:
        warnings.append(submission.unsatisfiable_warning(too_large))
    return JobSubmitted(**dict(JobPublic.from_job(job)), warnings=warnings)


@router.get("")
async def list_jobs(
    user: CurrentUser,
    pool: PoolDep,
    settings: SettingsDep,
    state: JobState | None = None,
    name: Annotated[str | None, Query(max_length=200, pattern=TEXT_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    page: Annotated[str | None, Query(alias="cursor", max_length=cursor.MAX_CURSOR_CHARS)] = None,
) -> JobsPage:
    """The caller's jobs (an operator's: everyone's), newest first, one page at a time."""
    try:
        before = cursor.decode(page) if page is not None else None
    except ValueError as exc:
        raise invalid(("query", "cursor"), str(exc)) from exc
    async with pool.acquire() as conn:
        jobs = await jobs_repo.list_jobs(
            conn,
            owner_id=owner_filter(user),
            state=state,
            name=name,
            limit=limit + 1,
            before=before,
        )
        counts, superseded = await queries.counts_for_jobs(conn, [job.id for job in jobs[:limit]])
        hosts = await pool_status.read(conn, settings.worker_pool, settings.dead_host_s)
    items = [
        dataclasses.replace(
            job, counts=counts.get(job.id, {}), superseded=superseded.get(job.id, 0)
        )
        for job in jobs[:limit]
    ]
    last = items[-1] if len(jobs) > limit else None
    return JobsPage(
        items=[JobPublic.from_job(job, hosts) for job in items],
        next_cursor=cursor.encode(last.created_at, last.id) if last else None,
    )


@router.get("/{job_id}", responses=_NOT_FOUND)
async def get_job(
    user: CurrentUser, job_id: JobIdPath, pool: PoolDep, settings: SettingsDep
) -> JobPublic:
    """One job with its task counts per state, why it waits if it does (`waiting_on`: the
    pool), and why its tasks not yet placed wait (`waiting`: the scheduler's reason)."""
    async with pool.acquire() as conn:
        job = await visible_job(conn, user, job_id)
        hosts = await pool_status.read(conn, settings.worker_pool, settings.dead_host_s)
        waits = await waiting.of_job(conn, job)
    return JobPublic.from_job(job, hosts, waits)


@router.get("/{job_id}/errors", responses=_NOT_FOUND)
async def list_errors(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[JobErrorPublic]:
    """The error-severity log records that failed tasks of the job (`fail_on_log`), oldest
    first, each with the lines that led up to it as its `detail`."""
    async with pool.acquire() as conn:
        await check_visible(conn, user, job_id)
        errors = await job_errors_repo.list_for_job(conn, job_id, limit)
    return [JobErrorPublic.model_validate(e, from_attributes=True) for e in errors]


#: Tasks in one page of `GET /jobs/{id}/tasks` unless `limit` says otherwise, and at most.
TASKS_PAGE: Final = 10_000
TASKS_PAGE_MAX: Final = 100_000


@router.get("/{job_id}/tasks", responses=_NOT_FOUND)
async def list_tasks(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    response: Response,
    after: Annotated[
        int | None,
        Query(ge=-_INT4_MAX, le=_INT4_MAX, description="Only tasks of a higher index."),
    ] = None,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=TASKS_PAGE_MAX,
            description="Most indexes in the page, each with all its tasks (an input's"
            " lineage: a resubmitted clone keeps its original's index).",
        ),
    ] = TASKS_PAGE,
    state: Annotated[
        list[TaskState] | None,
        Query(description="Only tasks in this state; repeated: in any of them."),
    ] = None,
) -> list[TaskPublic]:
    """The job's tasks by index (test tasks, of negative index, first; the tasks of one index,
    an input's lineage, oldest first), each with its prerequisites, the triage's `decision`
    on a failed one and when it ran (`started_at`, `elapsed_s`...), one page of `limit`
    indexes at a time: a full page has a `Link: <...>; rel="next"` header, and the next one
    starts `after` the last index of this one. An unknown `state` is a 422 naming it."""
    states = sorted(set(state or []))
    async with pool.acquire() as conn:
        await check_visible(conn, user, job_id)
        tasks = await tasks_repo.page_for_job(conn, job_id, after=after, limit=limit, states=states)
        found = await queries.prerequisites_of(conn, [task.id for task in tasks])
        decisions = await queries.decisions_of(conn, tasks)
        timings = await queries.timings_of(conn, tasks)
    if len({task.index for task in tasks}) == limit:
        query = f"after={tasks[-1].index}&limit={limit}" + "".join(
            f"&state={s.value}" for s in states
        )
        response.headers["Link"] = f'</jobs/{job_id}/tasks?{query}>; rel="next"'
    return [
        TaskPublic.from_found(
            task,
            found,
            detail=user.is_operator,
            decision=decisions.get(task.id),
            timing=timings.get(task.id),
        )
        for task in tasks
    ]


@router.get("/{job_id}/logs", responses=_NOT_FOUND)
async def list_logs(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    task: Annotated[str | None, Query(pattern=ID_PATTERN, description="A task id.")] = None,
    run: Annotated[int | None, Query(ge=1, le=_INT4_MAX, description="A run number.")] = None,
    severity: Severity | None = None,
    after: Annotated[int, Query(ge=0, le=_INT8_MAX, description="Only lines after this seq.")] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    tail: Annotated[
        int | None,
        Query(
            ge=1,
            le=10_000,
            description="The last this many lines instead (task and run"
            " filters apply; not with `after` or `severity`).",
        ),
    ] = None,
) -> LogsPage:
    """The job's output lines in order; continue with `after=next_after`."""
    if tail is not None and (after or severity is not None):
        raise invalid(
            ("query", "tail"), "tail reads the last lines: give it without after or severity"
        )
    async with pool.acquire() as conn:
        await check_visible(conn, user, job_id)
        if tail is not None:
            found = await logs_repo.tail_of_job(
                conn, job_id, task_id=task, run_number=run, limit=tail
            )
            return LogsPage(
                items=[LogPublic.from_stored(log) for log in found],
                next_after=found[-1].seq if found else None,
            )
        logs = await logs_repo.for_job(
            conn,
            job_id,
            task_id=task,
            run_number=run,
            severity=severity.value if severity else None,
            after=after,
            limit=limit,
        )
    return LogsPage(
        items=[LogPublic.from_stored(log) for log in logs],
        next_after=logs[-1].seq if logs else None,
    )


@router.get("/{job_id}/events", responses=_NOT_FOUND)
async def list_events(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    order: Literal["oldest", "newest"] = "oldest",
    after: Annotated[
        int | None,
        Query(ge=0, le=_INT8_MAX, description="Oldest first: only events after this position."),
    ] = None,
    before: Annotated[
        int | None,
        Query(ge=0, le=_INT8_MAX, description="Newest first: only events before this position."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> EventsPage:
    """The job's events (`job.*`, `task.*`) as the history keeps them, one page at a time by
    position: oldest first (continue with `after=next`) or newest first (`before=next`)."""
    if (order == "oldest" and before is not None) or (order == "newest" and after is not None):
        other = "before" if order == "oldest" else "after"
        raise invalid(
            ("query", other),
            f"{other} pages the other way: use it with order="
            + ("newest" if order == "oldest" else "oldest"),
        )
    async with pool.acquire() as conn:
        await check_visible(conn, user, job_id)
        start = after if order == "oldest" else before
        events = await event_log.of_job(conn, job_id, order=order, start=start, limit=limit)
    return EventsPage(
        items=[
            EventPublic(seq=e.seq, routing_key=e.routing_key, body=json.loads(e.body))
            for e in events
        ],
        next=events[-1].seq if len(events) == limit else None,
    )


@router.post(
    "/{job_id}/actions",
    status_code=status.HTTP_202_ACCEPTED,
    responses=_NOT_FOUND | _CONFLICT | QUOTA_RESPONSES,
)
async def act_on_job(
    user: CurrentUser,
    job_id: JobIdPath,
    body: JobActionRequest,
    pool: PoolDep,
    quota: TaskQuotaDep,
    store: ObjectStoreDep,
) -> JobPublic:
    """Cancel, suspend, resume, recover the failed tasks of, or throttle the job, or activate
    a configuring one (its tasks are made from the held inputs, its test outputs discarded):
    202 with it.

    `cancel` terminates every task not yet at rest. `purge` deletes an ended job's logs, outputs
    (from the object store) and work dirs for good (`purged_at` is then set). 409 names the
    current state and the states that allow the action (or says that no task failed, for
    `recover_failed`, or what still runs, for `purge`); every action but `purge` is 409 on a
    purged job.
    """
    async with pool.acquire() as conn, conn.transaction():
        await check_visible(conn, user, job_id)
        if body.action is JobAction.ACTIVATE:
            job, made = await configuring.activate(conn, job_id, user.name)
            await quota.charge(user, made)
        else:
            job = await task_actions.apply_to_job(
                conn,
                job_id,
                body.action,
                user.name,
                max_in_flight=body.max_in_flight,
                release_per_tick=body.release_per_tick,
            )
    if body.action is JobAction.PURGE:  # marked: its data goes now, in short batches
        try:
            async with pool.acquire() as conn:
                await harvest.clear_purged(conn, job_id, store)
        except ObjectStoreError as exc:  # the scheduler's retention round finishes it
            logger.warning("job %s: purge not finished: %s", job_id, exc)
    logger.info(
        "job %s %s: now %s",
        job_id,
        body.action.value,
        job.state.value,
        extra={"action": body.action.value, "job_id": job_id, "user": user.name},
    )
    return JobPublic.from_job(job)


@router.post(
    "/{job_id}/inputs",
    status_code=status.HTTP_201_CREATED,
    responses=_NOT_FOUND
    | _RATE_LIMITED
    | {
        409: {
            "description": "The job is cancelled, or it declares outputs and the user's stored"
            " bytes are at their quota."
        }
    },
)
async def append_inputs(
    user: SubmittingUser,
    job_id: JobIdPath,
    body: InputsAppend,
    pool: PoolDep,
    settings: SettingsDep,
    quota: TaskQuotaDep,
) -> InputsAdded:
    """Append one `new` task per input (a finished job becomes active again): 201.

    Jobs chained from this one get a promised input for each new task too.
    """
    body.check_against(settings.max_inputs)
    async with pool.acquire() as conn, conn.transaction():
        await check_visible(conn, user, job_id)
        await submission.check_inputs(
            conn, user, body.inputs, ("body", "inputs"), settings.store_url
        )
        task_ids = await datasets.add_inputs(conn, job_id, list(body.inputs))
        await quota.charge(user, len(task_ids))
        job = await jobs_repo.get(conn, job_id)
        assert job is not None  # jobs are never deleted
        if job.outputs:  # its new tasks' outputs would find no room: nothing appended
            await submission.check_room(conn, job.owner_id, settings.store_quota_bytes)
    logger.info(
        "job %s: %d input(s) appended",
        job_id,
        len(task_ids),
        extra={"action": "append", "job_id": job_id, "user": user.name},
    )
    return InputsAdded(job=JobPublic.from_job(job), task_ids=task_ids)


@router.patch("/{job_id}", responses=_NOT_FOUND | _CONFLICT)
async def edit_job(
    user: CurrentUser,
    job_id: JobIdPath,
    body: JobEdit,
    pool: PoolDep,
    settings: SettingsDep,
    task_types: TaskTypesDep,
    analysers: AnalysersDep,
) -> JobPublic:
    """Change some fields of the job; `policy` names only the policy fields that change.

    A configuring job can change name, command, inputs (replacing the held ones), outputs,
    params, policy, `resources`, `priority`, throttle and `retention_s`; once active only the
    priority, the throttle, the retention (null: keep until purged by hand) and the policy's
    budgets, backoff and probing (409 names the fields refused); a cancelled job nothing. The
    edited job is checked like a submission (422; a user's priority within
    VIGIL_PRIORITY_USER_RANGE).
    """
    check_priority(body.priority, user.is_operator, settings.priority_user_range)
    async with pool.acquire() as conn, conn.transaction():
        await visible_job(conn, user, job_id)  # 404 before anything is locked
        current = await job_edits.lock(conn, job_id)
        wanted = body.validated(current, task_types, settings.max_inputs, analysers)
        configuring = current.state is JobState.CONFIGURING  # else a change is refused (409)
        if settings.refuse_unsatisfiable and body.resources is not None and configuring:
            request = body.resources.to_resources()
            if request != current.request:
                await submission.check_satisfiable(
                    conn, request, settings.worker_pool, settings.dead_host_s
                )
        submission.check_network(user, wanted.get("policy") or {})
        if "inputs" in wanted:
            await submission.check_inputs(
                conn, user, wanted["inputs"], ("body", "inputs"), settings.store_url
            )
        check_retention(wanted.get("retention_s"), settings.min_retention_s)
        job = await job_edits.apply(conn, job_id, wanted, user.name)
    logger.info(
        "job %s edited: %s",
        job_id,
        ", ".join(sorted(wanted)),
        extra={"action": "edit", "job_id": job_id, "user": user.name},
    )
    return JobPublic.from_job(job)


@router.post(
    "/{job_id}/tests",
    status_code=status.HTTP_201_CREATED,
    responses=_NOT_FOUND | _RATE_LIMITED | {409: {"description": "The job is not configuring."}},
)
async def start_test(
    user: SubmittingUser,
    job_id: JobIdPath,
    body: TestRequest,
    pool: PoolDep,
    quota: TaskQuotaDep,
    settings: SettingsDep,
) -> TaskPublic:
    """Run a test task of a configuring job on one held input (`input_index`, default 0) or
    on an explicit `input`: 201 with the task (negative index). Its outputs are discarded when
    the job is activated."""
    async with pool.acquire() as conn, conn.transaction():
        await check_visible(conn, user, job_id)
        if body.input is not None:
            await submission.check_inputs(
                conn, user, [body.input], ("body", "input"), settings.store_url
            )
        task = await configuring.start_test(conn, job_id, body.what())
        await quota.charge(user, 1)
        found = await queries.prerequisites_of(conn, [task.id])
    logger.info(
        "job %s: test task %s",
        job_id,
        task.id,
        extra={"action": "test", "job_id": job_id, "user": user.name},
    )
    return TaskPublic.from_found(task, found, detail=user.is_operator)
