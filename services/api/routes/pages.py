"""The operator dashboard (`GET /`, `/ui/...`): server-rendered pages, live over `/events`.

Pages are plain HTML from `templates/`; `static/dashboard.js` follows the page's topics with
`EventSource` and swaps in row fragments (`/ui/.../row`) rendered by the same templates, so all
markup and all escaping happen here. Controls call the JSON api with `fetch()`. A browser signs
in once (`/login`) and is then known by its session cookie (`services.api.session`).
"""

import dataclasses
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, FastAPI, Query, Request, status
from fastapi.responses import RedirectResponse, Response
from fastapi.security.utils import get_authorization_scheme_param
from fastapi.staticfiles import StaticFiles
from pydantic import StringConstraints

from services.api import cursor, dashboard, hosts, queries, session, waiting
from services.api.access import owner_filter, visible_job, visible_task
from services.api.deps import (
    CredentialsDep,
    CurrentUser,
    JobIdPath,
    OperatorUser,
    PoolDep,
    RedisDep,
    TaskIdPath,
)
from services.api.templates import STATIC_DIR, Pages
from shared.domain.actions import TaskAction
from shared.domain.errors import NotFound
from shared.domain.ids import ID_PATTERN
from shared.domain.states import FailureClass, JobState, TaskState
from shared.domain.topics import MAX_TOPICS
from shared.domain.waiting import JobWaiting, Why
from shared.messaging.redis_keys import RedisKeys
from shared.store import (
    attempts_repo,
    bulk_repo,
    job_errors_repo,
    jobs_repo,
    outputs_repo,
    tasks_repo,
    users_repo,
)
from shared.store.db import Connection
from shared.store.jobs_repo import Job
from shared.store.tasks_repo import Task
from shared.store.users_repo import User

logger = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

#: Jobs per page of the jobs list (at most; the default is smaller).
MAX_JOBS_PER_PAGE: Final = 100
_MAX_TOKEN_CHARS: Final = 1000

_pages = Pages()


def install(app: FastAPI) -> None:
    """Add the dashboard's routes and its static files (`/static`) to `app`."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=Path(STATIC_DIR)), name="static")


@dataclasses.dataclass(frozen=True)
class JobRow:
    """A row of the jobs list (and the head of the job page)."""

    job: Job
    owner: str
    show_owner: bool
    counts: list[tuple[str, int]]
    actions: list[str]
    progress: tuple[int, int]  # tasks at rest, tasks
    elapsed_s: float  # since its submission, to its end if it ended
    #: Why its tasks not yet placed wait (the job page's head only).
    waiting: JobWaiting | None = None


@dataclasses.dataclass(frozen=True)
class TaskRow:
    """A row of the job page's task table."""

    task: Task
    input: str
    actions: list[str]


@dataclasses.dataclass(frozen=True)
class TaskView:
    """The head of the task page: the task, its attempts on a timeline, its status file and
    outputs (the error details only for operators)."""

    task: Task
    job_name: str
    input: str
    bars: list[dashboard.Bar]
    status: str | None
    outputs: list[dict[str, Any]]
    actions: list[str]
    show_detail: bool
    #: When its job was purged, what to say instead of its outputs (their files and kept bytes
    #: are gone; the records stay for the history).
    purged: str | None = None
    #: Why it waits, if it does.
    waiting: Why | None = None


def _job_row(
    job: Job, owners: dict[str, str], viewer: User, waits: JobWaiting | None = None
) -> JobRow:
    return JobRow(
        job=job,
        owner=owners.get(job.owner_id, job.owner_id),
        show_owner=viewer.is_operator,
        counts=dashboard.ordered_counts(job.counts),
        actions=dashboard.job_actions(job),
        progress=dashboard.progress(job.counts),
        elapsed_s=dashboard.elapsed_s(job, _now()),
        waiting=waits,
    )


def _task_row(task: Task) -> TaskRow:
    return TaskRow(
        task,
        dashboard.short_input(task.input),
        dashboard.task_actions(task.state, superseded=task.superseded_by is not None),
    )


async def _page_user(request: Request, conn: Connection) -> User | None:
    """The signed-in user of a page request (cookie, or a bearer header), or None."""
    scheme, bearer = get_authorization_scheme_param(request.headers.get("Authorization"))
    token = session.token_of(request, bearer if scheme.lower() == "bearer" else None)
    return await users_repo.by_token(conn, token) if token else None


def _to_login() -> RedirectResponse:
    return RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)


def _page(template: str, user: User, page: str, data: dict[str, Any], **context: Any) -> Response:
    page_data = {"page": page, "operator": user.is_operator, **data}
    return _pages.render(template, user=user, page=page, page_data=page_data, **context)


def _error(user: User, status_code: int, title: str, message: str) -> Response:
    return _pages.render(
        "error.html",
        status_code=status_code,
        user=user,
        page="error",
        page_data={"page": "error", "operator": user.is_operator},
        title=title,
        message=message,
    )


def _refused(user: User, why: str) -> Response:
    return _error(user, status.HTTP_403_FORBIDDEN, "Not for you", why)


def _not_found(user: User, what: str) -> Response:
    message = f"{what} does not exist, or you may not see it."
    return _error(user, status.HTTP_404_NOT_FOUND, "Not found", message)


# ----- signing in ---------------------------------------------------------------------------


@router.get("/login")
async def login_page() -> Response:
    """The sign-in form."""
    return _pages.render("login.html", user=None, page="login", page_data={}, error=None)


@router.post("/login")
async def login(request: Request, pool: PoolDep) -> Response:
    """Check the posted token; on success keep it in the session cookie and go to the jobs."""
    if not session.same_origin(request):
        return _login_error("sign in from this site's own page", status.HTTP_403_FORBIDDEN)
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    token = (form.get("token") or [""])[0].strip()
    if not token or len(token) > _MAX_TOKEN_CHARS:
        return _login_error("paste a token", status.HTTP_422_UNPROCESSABLE_CONTENT)
    async with pool.acquire() as conn:
        user = await users_repo.by_token(conn, token)
        if user is None:
            return _login_error("this token is not valid", status.HTTP_401_UNAUTHORIZED)
        ttl_s = request.app.state.settings.session_ttl_s
        cookie = await users_repo.open_session(conn, user, ttl_s)
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    session.sign_in(response, request, cookie)
    logger.info("%s signed in to the dashboard", user.name, extra={"user": user.name})
    return response


def _login_error(message: str, code: int) -> Response:
    return _pages.render(
        "login.html", status_code=code, user=None, page="login", page_data={}, error=message
    )


@router.post("/logout")
async def logout(request: Request, pool: PoolDep, credentials: CredentialsDep) -> Response:
    """End the session: its token is revoked (a copy of the cookie no longer works) and the
    cookie removed."""
    cookie = request.cookies.get(session.COOKIE)
    if cookie and len(cookie) <= _MAX_TOKEN_CHARS:
        async with pool.acquire() as conn:
            await users_repo.close_session(conn, cookie)
        credentials.forget()
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    session.sign_out(response)
    return response


# ----- jobs ---------------------------------------------------------------------------------


@router.get("/")
async def jobs_page(
    request: Request,
    pool: PoolDep,
    state: Annotated[str, Query(max_length=40)] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_JOBS_PER_PAGE)] = 20,
    page: Annotated[str | None, Query(alias="cursor", max_length=cursor.MAX_CURSOR_CHARS)] = None,
) -> Response:
    """The jobs list, newest first, with task counts; live for the jobs shown."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        job_state = JobState(state) if state in {s.value for s in JobState} else None
        try:
            before = cursor.decode(page) if page else None
        except ValueError:
            before = None
        jobs = await jobs_repo.list_jobs(
            conn,
            owner_id=owner_filter(user),
            state=job_state,
            name=None,
            limit=limit + 1,
            before=before,
        )
        shown = jobs[:limit]
        counts, superseded = await queries.counts_for_jobs(conn, [j.id for j in shown])
        owners = await dashboard.owner_names(conn, [j.owner_id for j in shown])
        # The whole system's activity is for operators (a user's jobs are theirs alone).
        pictures = await dashboard.system_charts(conn, _now()) if user.is_operator else []
    shown = [
        dataclasses.replace(j, counts=counts.get(j.id, {}), superseded=superseded.get(j.id, 0))
        for j in shown
    ]
    query = {"limit": limit} | ({"state": job_state.value} if job_state else {})
    next_url = None
    if len(jobs) > limit:
        next_url = "/?" + urlencode(query | {"cursor": cursor.encode(*_key(shown[-1]))})
    data = {
        "operator": user.is_operator,
        "topics": _jobs_topics(user, shown),
        # New jobs are added live only where they belong: the first page, unfiltered.
        "live_new": before is None and job_state is None,
    }
    return _page(
        "jobs.html",
        user,
        "jobs",
        data,
        rows=[_job_row(j, owners, user) for j in shown],
        show_owner=user.is_operator,
        states=[s.value for s in JobState],
        state=job_state.value if job_state else "",
        limit=limit,
        max_limit=MAX_JOBS_PER_PAGE,
        first_url="/?" + urlencode(query) if before is not None else None,
        next_url=next_url,
        system_charts=pictures,
    )


def _key(job: Job) -> tuple[Any, str]:
    return job.created_at, job.id


def _jobs_topics(user: User, jobs: list[Job]) -> list[str]:
    """What the jobs list follows: everything for an operator; a user, the jobs shown."""
    if user.is_operator:
        return ["job.*.*", "task.*.*"]
    return [f"task.*.{job.id}" for job in jobs[:MAX_TOPICS]]


@router.get("/ui/new")
async def new_job_page(request: Request, pool: PoolDep) -> Response:
    """A form that submits a job (`POST /jobs`), its errors shown by their fields."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
    if user is None:
        return _to_login()
    return _page("new.html", user, "new", {})


@router.get("/ui/fixes")
async def fixes_page(request: Request, pool: PoolDep) -> Response:
    """Global fixes (`POST /bulk/actions`): a selector and an action, previewed as a dry run
    before they are applied; the recent ones (a user: their own)."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        records = await bulk_repo.latest(conn, None if user.is_operator else user.id, 20)
    return _page(
        "fixes.html",
        user,
        "fixes",
        {},
        records=records,
        states=[s.value for s in TaskState],
        classes=[c.value for c in FailureClass],
        actions=[a.value for a in TaskAction],
    )


@router.get("/ui/users")
async def users_page(request: Request, pool: PoolDep) -> Response:
    """Users and their tokens (operators): create a user, issue and revoke tokens, disable."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        if not user.is_operator:
            return _refused(user, "Users and tokens are for operators.")
        users = await users_repo.list_users(conn)
        tokens = {u.user.name: await users_repo.list_tokens(conn, u.user.name) for u in users}
    return _page("users.html", user, "users", {}, users=users, tokens=tokens)


@router.get("/ui/jobs/{job_id}")
async def job_page(
    request: Request,
    job_id: JobIdPath,
    pool: PoolDep,
    after: Annotated[int | None, Query(ge=-(2**31), le=2**31 - 1)] = None,
    state: Annotated[str, Query(max_length=40)] = "",
) -> Response:
    """One job: its state and counts, errors, tasks (a page at a time, test runs first: their
    indexes are negative; `state` shows those in one state only) and live logs."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        try:
            job = await visible_job(conn, user, job_id)
        except NotFound:
            return _not_found(user, f"Job {job_id}")
        limit = dashboard.TASKS_PER_PAGE
        only = TaskState(state) if state in {s.value for s in TaskState} else None
        read = await tasks_repo.page_for_job(
            conn, job_id, after=after, limit=limit + 1, states=[only] if only else []
        )
        failed = await dashboard.failed_tasks(conn, job_id)
        errors = await job_errors_repo.list_for_job(conn, job_id, dashboard.PROBLEMS)
        logs = await dashboard.log_tail(conn, job_id)
        owners = await dashboard.owner_names(conn, [job.owner_id])
        pictures = await dashboard.job_charts(conn, job, _now())
        waits = await waiting.of_job(conn, job)
    tasks, next_after = tasks_repo.first_indexes(read, limit)
    data = {
        "job_id": job_id,
        "topics": [f"task.*.{job_id}", f"job.*.{job_id}", f"log.*.{job_id}"],
        # Tasks appended later (new inputs, resubmitted clones) are added live on the last
        # page only (of all the tasks: a state filter shows those that were in it), a clone
        # after the rows of its index; on another page, a clone shows at the next load.
        "append_new_tasks": next_after is None and only is None,
    }
    return _page(
        "job.html",
        user,
        "job",
        data,
        view=_job_row(job, owners, user, waits),
        tasks=[_task_row(t) for t in tasks],
        failed=failed,
        errors=errors,
        logs=logs,
        log_tail=dashboard.LOG_TAIL,
        after=after,
        next_after=next_after,
        state=only.value if only else "",
        filter_query=f"&state={only.value}" if only else "",
        job_charts=pictures,
    )


@router.get("/ui/jobs/{job_id}/row")
async def job_row(user: CurrentUser, job_id: JobIdPath, pool: PoolDep) -> Response:
    """The jobs list's row of one job (HTML fragment)."""
    async with pool.acquire() as conn:
        job = await visible_job(conn, user, job_id)
        owners = await dashboard.owner_names(conn, [job.owner_id])
    return _pages.fragment("_rows.html", "job_row", _job_row(job, owners, user))


@router.get("/ui/jobs/{job_id}/summary")
async def job_summary(user: CurrentUser, job_id: JobIdPath, pool: PoolDep) -> Response:
    """The head of the job page: state, counts, why its tasks wait, and controls (HTML
    fragment)."""
    async with pool.acquire() as conn:
        job = await visible_job(conn, user, job_id)
        owners = await dashboard.owner_names(conn, [job.owner_id])
        waits = await waiting.of_job(conn, job)
    return _pages.fragment("_rows.html", "job_summary", _job_row(job, owners, user, waits))


@router.get("/ui/charts")
async def system_charts(_operator: OperatorUser, pool: PoolDep) -> Response:
    """The jobs page's charts of the whole system's last hour (HTML fragment; operators)."""
    async with pool.acquire() as conn:
        pictures = await dashboard.system_charts(conn, _now())
    return _pages.fragment("_charts.html", "charts_panel", pictures)


@router.get("/ui/jobs/{job_id}/charts")
async def job_charts(user: CurrentUser, job_id: JobIdPath, pool: PoolDep) -> Response:
    """The job page's charts (HTML fragment)."""
    async with pool.acquire() as conn:
        job = await visible_job(conn, user, job_id)
        pictures = await dashboard.job_charts(conn, job, _now())
    return _pages.fragment("_charts.html", "charts_panel", pictures)


def _now() -> datetime:
    return datetime.now(UTC)


@router.get("/ui/jobs/{job_id}/rows")
async def task_rows(
    user: CurrentUser,
    job_id: JobIdPath,
    pool: PoolDep,
    task: Annotated[
        list[Annotated[str, StringConstraints(pattern=ID_PATTERN)]],
        Query(max_length=dashboard.TASKS_PER_PAGE),
    ],
) -> Response:
    """The job page's rows of these tasks of the job, by index (HTML fragment): the page
    refreshes the rows that changed in one request, however many events it heard."""
    async with pool.acquire() as conn:
        await visible_job(conn, user, job_id)
        tasks = await dashboard.task_rows(conn, job_id, task)
    return _pages.fragment("_rows.html", "task_rows", [_task_row(t) for t in tasks])


@router.get("/ui/tasks/{task_id}/row")
async def task_row(user: CurrentUser, task_id: TaskIdPath, pool: PoolDep) -> Response:
    """The job page's row of one task (HTML fragment)."""
    async with pool.acquire() as conn:
        task = await visible_task(conn, user, task_id)
    return _pages.fragment("_rows.html", "task_row", _task_row(task))


@router.get("/ui/tasks/{task_id}")
async def task_page(
    request: Request,
    task_id: TaskIdPath,
    pool: PoolDep,
    run: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> Response:
    """One task: its attempts as a timeline, status file, outputs, and the log of one run (the
    current one by default, live; earlier runs one click away)."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        try:
            task = await visible_task(conn, user, task_id)
        except NotFound:
            return _not_found(user, f"Task {task_id}")
        shown = min(run or task.run_number, task.run_number)
        view = await _task_view(conn, task, user)
        logs = await dashboard.task_log_tail(conn, task.id, shown)
    data = {
        "task_id": task.id,
        "job_id": task.job_id,
        "run": shown,
        # Lines arrive live only for the current run; an earlier one is history.
        "live_log": shown == task.run_number,
        "topics": [f"task.*.{task.job_id}", f"log.*.{task.job_id}"],
    }
    return _page(
        "task.html",
        user,
        "task",
        data,
        view=view,
        logs=logs,
        run=shown,
        runs=list(range(1, task.run_number + 1)),
        log_tail=dashboard.TASK_LOG_TAIL,
    )


@router.get("/ui/tasks/{task_id}/head")
async def task_head(user: CurrentUser, task_id: TaskIdPath, pool: PoolDep) -> Response:
    """The head of the task page: facts, timeline, status file, outputs (HTML fragment)."""
    async with pool.acquire() as conn:
        task = await visible_task(conn, user, task_id)
        view = await _task_view(conn, task, user)
    return _pages.fragment("_rows.html", "task_head", view)


async def _task_view(conn: Connection, task: Task, user: User) -> TaskView:
    attempts = await attempts_repo.list_for_task(conn, task.id)
    job = await jobs_repo.get(conn, task.job_id, with_counts=False)
    purged = job.purged_at if job is not None else None
    outputs = await outputs_repo.latest(conn, task.id) if purged is None else {}
    status = dashboard.last_status(attempts)
    return TaskView(
        task=task,
        job_name=job.name if job else task.job_id,
        input=json.dumps(task.input, ensure_ascii=False, indent=2),
        bars=dashboard.timeline(attempts, _now()),
        status=json.dumps(status, ensure_ascii=False, indent=2) if status else None,
        outputs=list(outputs.values()),
        actions=dashboard.task_actions(task.state, superseded=task.superseded_by is not None),
        show_detail=user.is_operator,
        purged=(
            f"Purged {purged:%Y-%m-%d %H:%M:%S} UTC by {job.purged_by}: its outputs are gone."
            if job is not None and purged is not None
            else None
        ),
        waiting=await waiting.of_task(conn, task),
    )


# ----- hosts --------------------------------------------------------------------------------


@router.get("/ui/hosts")
async def hosts_page(request: Request, pool: PoolDep, redis: RedisDep) -> Response:
    """Every host: heartbeats, load and quarantine, and the live pilots: those that
    are a host say so in its row (refreshed by the page every few seconds)."""
    async with pool.acquire() as conn:
        user = await _page_user(request, conn)
        if user is None:
            return _to_login()
        found = await hosts.list_hosts(conn, redis, _keys(request))
        pilots = await dashboard.live_pilots(conn)
    return _page(
        "hosts.html",
        user,
        "hosts",
        {"topics": []},
        hosts=found,
        pilots=pilots,
        pilot_of=dashboard.pilots_by_host(pilots),
    )


@router.get("/ui/hosts/rows")
async def host_rows(
    user: CurrentUser, request: Request, pool: PoolDep, redis: RedisDep
) -> Response:
    """The hosts table's rows (HTML fragment)."""
    async with pool.acquire() as conn:
        found = await hosts.list_hosts(conn, redis, _keys(request))
        pilots = await dashboard.live_pilots(conn)
    return _pages.fragment(
        "_rows.html", "host_rows", found, user.is_operator, dashboard.pilots_by_host(pilots)
    )


@router.get("/ui/hosts/pilots")
async def pilot_rows(user: CurrentUser, pool: PoolDep) -> Response:
    """The rows of the hosts page's table of live pilots (HTML fragment)."""
    async with pool.acquire() as conn:
        pilots = await dashboard.live_pilots(conn)
    return _pages.fragment("_rows.html", "pilot_rows", pilots)


def _keys(request: Request) -> RedisKeys:
    keys: RedisKeys = request.app.state.redis_keys
    return keys
