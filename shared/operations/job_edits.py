"""Editing a submitted job (`PATCH /jobs/{id}`): what may change in which state, and the change.

While a job is configuring everything it runs can change: name, command, inputs, outputs,
params, policy, resources, priority, throttle and retention. Once it is active (or suspended,
or finished) tasks have run its command, so only operational settings change: the priority,
the throttle, the retention and the policy's budgets, backoff and probing (its resources no
more: its tasks are placed and held on their hosts by them). A cancelled job changes no more.
Every applied edit is recorded in `job_edits` (who, when, the job's state, the new values).
"""

from collections.abc import Collection, Mapping
from typing import Any, Final

from shared.domain.errors import Conflict, NotFound, Refusal
from shared.domain.states import JobState
from shared.store import jobs_repo
from shared.store.db import Connection

#: Job fields an edit may name, each a column of `jobs` (never user text as a name).
FIELDS: Final = (
    "name",
    "command",
    "inputs",
    "outputs",
    "params",
    "policy",
    "max_in_flight",
    "release_per_tick",
    "retention_s",
    "priority",
    "req_millicpus",
    "req_memory_mb",
    "req_gpus",
)
#: What may change once the job is active.
OPERATIONAL_FIELDS: Final = frozenset(
    {"max_in_flight", "release_per_tick", "retention_s", "priority"}
)
#: The columns of a job's request of resources, named `resources` to whoever edits them.
RESOURCE_FIELDS: Final = frozenset({"req_millicpus", "req_memory_mb", "req_gpus"})
OPERATIONAL_POLICY: Final = frozenset(
    {"max_infra_retries", "max_app_retries", "backoff", "probe_failure_rate", "probe_window"}
)


def changed(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `wanted` whose value differs from `current` (a policy counts as changed
    field by field: `policy.<name>`)."""
    found: dict[str, Any] = {}
    for name, value in wanted.items():
        if name == "policy":
            old = current.get("policy") or {}
            found |= {f"policy.{k}": v for k, v in value.items() if old.get(k) != v}
        elif current.get(name) != value:
            found[name] = value
    return found


def refusal(job_id: str, state: JobState, changes: Collection[str]) -> Refusal | None:
    """Why `changes` (names from `changed`) may not be made to a job in `state`, or None."""
    if not changes or state is JobState.CONFIGURING:
        return None
    if state is JobState.CANCELLED:
        return Refusal(
            f"job {job_id} is cancelled: it cannot be edited",
            "submit a new job with the changes (`vigil submit`)",
        )
    refused = sorted(
        {
            "resources" if name in RESOURCE_FIELDS else name
            for name in changes
            if name not in OPERATIONAL_FIELDS
            and name.removeprefix("policy.") not in OPERATIONAL_POLICY
        }
    )
    if not refused:
        return None
    allowed = sorted(OPERATIONAL_FIELDS) + [f"policy.{p}" for p in sorted(OPERATIONAL_POLICY)]
    hint = " (append inputs with POST /jobs/{id}/inputs)" if "inputs" in refused else ""
    return Refusal(
        f"job {job_id} is {state.value}: {', '.join(refused)} can no longer be changed (its"
        f" tasks have run with them); once {state.value}, a job can change only"
        f" {', '.join(allowed)}{hint}",
        "submit a new job with the changes, or a configuring one to try them first"
        " (`vigil submit --configuring`)",
    )


async def lock(conn: Connection, job_id: str) -> jobs_repo.Job:
    """The job, its row locked for an edit (in the caller's transaction) before the edit is
    validated against it: two edits of one job never merge onto the same old policy."""
    await jobs_repo.lock_state(conn, job_id)
    job = await jobs_repo.get(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


async def apply(
    conn: Connection, job_id: str, wanted: Mapping[str, Any], actor: str
) -> jobs_repo.Job:
    """Make the edit `wanted` (validated new values by field name of `FIELDS`; `policy` a
    complete policy) to job `job_id`; raises `NotFound` or `Conflict`. One transaction."""
    async with conn.transaction():
        record = await jobs_repo.lock(conn, job_id)
        if record is None:
            raise NotFound(f"no job {job_id}")
        state = JobState(record["state"])
        unknown = set(wanted) - set(FIELDS)
        if unknown:
            raise ValueError(f"not job fields: {sorted(unknown)}")
        diff = changed(dict(record), wanted)
        reason = refusal(job_id, state, diff)
        if reason is not None:
            raise Conflict.of(reason)
        columns = sorted({name.split(".")[0] for name in diff})
        if columns:  # names of FIELDS (checked above), never user text
            await jobs_repo.edit(conn, job_id, {c: wanted[c] for c in columns}, actor, state, diff)
        job = await jobs_repo.get(conn, job_id)
        assert job is not None
        return job
