"""Submitting a job: references checked, then job, tasks, events and prerequisites written in
one transaction, so that a failure anywhere leaves no trace (never a half-created job). Its
tasks are placed by the leading scheduler's round, which the commit wakes.

A job with `inputs_from` is created without inputs and chained (design §6): one promised input
per task of the upstream job, each waiting for its upstream task to complete. A job submitted
during an emergency stop is created suspended (`shared.operations.stop_guard.hold_under`). A
job submitted `configuring` gets its tasks (and chaining) when it is activated
(`shared.operations.configuring`).
"""

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError

from services.api import object_check, queries
from services.api.access import owner_filter
from services.api.errors import invalid
from services.api.rate_limit import TaskQuota
from services.api.schemas.jobs import JobCreate, referenced_files
from shared.domain import store_quota
from shared.domain.errors import Conflict
from shared.domain.scheduling.model import DEFAULT_REQUEST
from shared.domain.scheduling.reasons import TooLarge
from shared.domain.scheduling.resources import Resources, coverage
from shared.objects import ObjectStore
from shared.operations import datasets, harvest, stop_guard
from shared.operations.datasets import UPSTREAM_KEY
from shared.store import jobs_repo, quota_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import Job
from shared.store.users_repo import User

logger = logging.getLogger(__name__)


async def submit(
    pool: Pool,
    user: User,
    body: JobCreate,
    idempotency_key: str | None,
    quota: TaskQuota,
    store: ObjectStore,
    store_url: str,
    store_quota_bytes: int = 0,
) -> tuple[Job, bool]:
    """Create the job (or find the one made earlier with `idempotency_key`); (job, created).
    It places none of its tasks: where they run depends on every host's free capacity and
    every user's share, which the scheduler's rounds, one at a time, see whole; its commit
    wakes the round.

    Raises a 422 `RequestValidationError` naming any prerequisite task, `inputs_from` job or
    input's `upstream_task` that does not exist or that the user may not see, `Conflict`
    when `inputs_from` names a purged job (its outputs are gone) or when the job declares
    outputs and the user's stored bytes are at their quota (`store_quota_bytes`: the
    installation's default; `check_room`), and `QuotaExceeded` when
    the user may not create that many tasks now; nothing is written then. Files given by
    reference are looked up in the store first (a 422 for one it does not hold as named, a
    503 when it cannot be reached), no transaction open meanwhile.
    """
    new_job = body.to_new_job(idempotency_key)
    refs = referenced_files(body.files)
    if refs:
        async with pool.acquire() as conn:
            files = await object_check.stored_files(conn, store, store_url, user, refs)
        new_job = dataclasses.replace(new_job, referenced=files)
    # First: the job may be held by a stop (see stop_guard). Its statements are lookups by
    # key: one plan each per connection (db.GENERIC_PLANS).
    async with pool.acquire() as conn, stop_guard.guarded(conn, generic_plans=True) as guard:
        await _check_references(conn, user, body, store_url)
        if body.inputs_from is not None:
            await harvest.check_not_purged(
                conn, body.inputs_from, "chain a job from it", share_lock=True
            )
        # a job made active wakes the round at commit (the notification is sent then, wherever
        # in the transaction it is asked for): the round places its tasks
        job, created = await jobs_repo.create(
            conn, user.id, new_job, wake_round=not body.configuring
        )
        if created and body.outputs:
            await check_room(conn, user.id, store_quota_bytes)
        if created and body.retention_s is not None:
            await harvest.set_retention(conn, job.id, body.retention_s)
            job = dataclasses.replace(job, retention_s=body.retention_s)
        if created and not body.configuring:  # a configuring job is filled at activation
            job = await _fill(conn, job, body)
            await quota.charge(user, sum(job.counts.values()))
            if await guard.hold(conn, job.id):  # made in a stop
                job = await _read(conn, job.id)
    if created:
        logger.info(
            "job submitted with %d task(s)",
            sum(job.counts.values()),
            extra={"action": "submit", "job_id": job.id, "user": user.name},
        )
    return job, created


async def check_room(conn: Connection, user_id: str, default: int) -> None:
    """`Conflict` naming the bytes used and the limit when user `user_id`'s stored bytes are
    at their quota (`default`: the installation's): a job's outputs would find no room."""
    usage = await quota_repo.of_user(conn, user_id, default)
    if usage.full:
        raise Conflict(
            f"{usage.describe()}: a job that declares outputs cannot store them",
            next_step=store_quota.NEXT_STEP,
        )


async def _fill(conn: Connection, job: Job, body: JobCreate) -> Job:
    """Give the new job its prerequisites, or its chained tasks; the job as it now is (read
    again only if something changed it: a plain job is as `jobs_repo.create` made it)."""
    if body.inputs_from is not None:
        upstream = await datasets.upstream_task_ids(conn, body.inputs_from)
        await datasets.chain(conn, job.id, upstream)
    elif body.prerequisites.referenced():
        await datasets.apply_job_prerequisites(
            conn, job.id, await datasets.task_ids_of(conn, job.id)
        )
    else:
        return job
    return await _read(conn, job.id)


async def _read(conn: Connection, job_id: str) -> Job:
    fresh = await jobs_repo.get(conn, job_id)
    assert fresh is not None  # created in this transaction
    return fresh


def _upstreams(inputs: Sequence[Any]) -> dict[int, str]:
    """The task ids that inputs name in `upstream_task`, by the input's position."""
    return {
        i: value[UPSTREAM_KEY]
        for i, value in enumerate(inputs)
        if isinstance(value, dict) and isinstance(value.get(UPSTREAM_KEY), str)
    }


async def upstream_errors(
    conn: Connection, user: User, inputs: Sequence[Any], loc: tuple[str | int, ...]
) -> list[Any]:
    """A 422 error (at `loc` + the input's position) for each input whose `upstream_task` is
    not a task the user may see: another user's task reads exactly like one that does not
    exist (its outputs would be linked into this job's work dir)."""
    named = _upstreams(inputs)
    if not named:
        return []
    found = await queries.visible_tasks(conn, sorted(set(named.values())), owner_filter(user))
    errors: list[Any] = []
    for i, task_id in named.items():
        if task_id not in found:
            msg = f"task {task_id!r} named in upstream_task does not exist"
            errors.extend(invalid((*loc, i, UPSTREAM_KEY), msg).errors())
    return errors


async def check_inputs(
    conn: Connection, user: User, inputs: Sequence[Any], loc: tuple[str | int, ...], store_url: str
) -> None:
    """Raise a 422 naming each task an input names in `upstream_task` that the user may not
    see (`upstream_errors`) and each object it names that the user may not stage
    (`object_check.input_errors`), if any."""
    errors = await upstream_errors(conn, user, inputs, loc)
    errors.extend(await object_check.input_errors(conn, store_url, user, inputs, loc))
    if errors:
        raise RequestValidationError(errors)


def check_network(user: User, policy: Mapping[str, Any]) -> None:
    """403 unless the job keeps to a network of its own or the caller is an operator: the
    host's network reaches the services' PostgreSQL, RabbitMQ and Redis."""
    if policy.get("network") == "host" and not user.is_operator:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail="only an operator may give a job the host's network (policy.network)",
        )


async def _check_references(conn: Connection, user: User, body: JobCreate, store_url: str) -> None:
    check_network(user, body.policy.model_dump())
    owner = owner_filter(user)
    inputs, loc = body.inputs or [], ("body", "inputs")
    errors: list[Any] = await upstream_errors(conn, user, inputs, loc)
    errors.extend(await object_check.input_errors(conn, store_url, user, inputs, loc))
    wanted = sorted(body.prerequisites.referenced())
    found = await queries.visible_tasks(conn, wanted, owner) if wanted else set()
    for stage, spec in (
        ("setup", body.prerequisites.setup),
        ("post_processing", body.prerequisites.post_processing),
    ):
        for task_id in sorted(set(spec) - found):
            msg = f"prerequisite task {task_id!r} does not exist"
            errors.extend(invalid(("body", "prerequisites", stage, task_id), msg).errors())
    if body.inputs_from and not await queries.job_visible(conn, body.inputs_from, owner):
        msg = f"job {body.inputs_from!r} named in inputs_from does not exist"
        errors.extend(invalid(("body", "inputs_from"), msg).errors())
    if errors:
        raise RequestValidationError(errors)


def unsatisfiable(request: Resources, capacities: Mapping[str, Resources]) -> str | None:
    """Why no host of `capacities` (host id -> capacity) can ever hold `request`, naming the
    one that comes closest (the most of the request, by its scarcest resource; then the
    largest); None when one can, or when none is known."""
    if not capacities or any(request.fits_in(c) for c in capacities.values()):
        return None
    host, largest = max(
        capacities.items(),
        key=lambda item: (
            coverage(request, item[1]),
            item[1].gpus,
            item[1].millicpus,
            item[1].memory_mb,
            item[0],
        ),
    )
    return TooLarge(request, host, largest).message()


async def why_unsatisfiable(
    conn: Connection, request: Resources, pool_name: str, fresh_s: float
) -> str | None:
    """Why no live host of the pool (its worker heartbeated within `fresh_s`) can ever hold
    `request`, naming the largest; None when one can. Hosts that have not advertised a
    capacity are left out; with none known, nothing is said."""
    return unsatisfiable(request, await queries.live_capacities(conn, pool_name, fresh_s))


async def too_large(pool: Pool, request: Resources, pool_name: str, fresh_s: float) -> str | None:
    """`why_unsatisfiable` for a submission; the default request (one CPU, which every host
    holds) asks nothing of the database, so that most submissions cost no more."""
    if request == DEFAULT_REQUEST:
        return None
    async with pool.acquire() as conn:
        return await why_unsatisfiable(conn, request, pool_name, fresh_s)


def unsatisfiable_refusal(why: str) -> RequestValidationError:
    """The 422 on `resources` of a request no live host can hold (`VIGIL_REFUSE_UNSATISFIABLE`)."""
    return invalid(("body", "resources"), f"{why} (the api refuses what no host can hold)")


def unsatisfiable_warning(why: str) -> str:
    """What an accepted job that no live host can hold is told (`VIGIL_REFUSE_UNSATISFIABLE`
    off): its tasks wait, `too_large`, until such a host joins (a pilot, a larger host)."""
    return (
        f"resources: {why}; its tasks wait (too_large) until a host that can hold them joins the"
        " pool (a larger host or pilot); VIGIL_REFUSE_UNSATISFIABLE makes the api refuse such"
        " a job"
    )


async def check_satisfiable(
    conn: Connection, request: Resources, pool_name: str, fresh_s: float
) -> None:
    """A 422 on `resources` when no live host of the pool can ever hold `request`
    (`VIGIL_REFUSE_UNSATISFIABLE`: `why_unsatisfiable`)."""
    why = await why_unsatisfiable(conn, request, pool_name, fresh_s)
    if why is not None:
        raise unsatisfiable_refusal(why)
