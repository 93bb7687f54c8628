"""What a host may do in the object store for a task it holds, as the database says: write the
task's own output keys while it post-processes, read the objects the task names (its job's
files and its input's objects given by URL, its upstream task's stored outputs). The signer
(`services/scheduler/signer.py`) asks before it signs anything; each answer is None (granted)
or why not, in words an operator can act on."""

from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from shared.domain import object_refs
from shared.domain.states import Stage, TaskState
from shared.objects.keys import OUTPUTS
from shared.operations.datasets import UPSTREAM_KEY
from shared.store.db import Connection

_HELD: Final = (
    "SELECT t.job_id, t.state::text AS state, t.claim, t.host, t.input, j.files, j.owner_id,"
    " EXISTS (SELECT 1 FROM attempts a WHERE a.task_id = t.id AND a.attempt = $2"
    " AND a.stage = $3 AND a.claim = t.claim AND a.host = t.host AND a.ended_at IS NULL)"
    " AS attempt_open"
    " FROM tasks t JOIN jobs j ON j.id = t.job_id WHERE t.id = $1"
)
_UPSTREAM_KEY: Final = (
    "SELECT 1 FROM task_outputs o JOIN tasks u ON u.id = o.task_id JOIN jobs j ON j.id = u.job_id"
    " WHERE o.task_id = $1 AND j.owner_id = $2 AND o.object_key = $3"
)
#: The states in which a host reads for its task: setting up (its stage-in), post-processing
#: (a look at an output it put).
_READING: Final = frozenset({TaskState.SETTING_UP.value, TaskState.POST_PROCESSING.value})


@dataclass(frozen=True)
class Asker:
    """Who asks: the host, and the task it says it holds under `claim`."""

    host_id: str
    task_id: str
    claim: UUID


def _output_attempt(task_id: str, key: str) -> int | None:
    """The post-processing attempt whose output `key` is, when it is one of `task_id`'s
    (`outputs/JOB/TASK/ATTEMPT/NAME`), else None."""
    parts = key.split("/")
    if len(parts) != 5 or parts[0] != OUTPUTS or parts[2] != task_id or not parts[3].isdigit():
        return None
    return int(parts[3])


async def _held(conn: Connection, asker: Asker, attempt: int) -> tuple[Any, str | None]:
    """The task's row, and why the asker does not hold it (None: it does)."""
    row = await conn.fetchrow(_HELD, asker.task_id, attempt, Stage.POST_PROCESSING.value)
    if row is None:
        return None, f"no task {asker.task_id}"
    if row["claim"] != asker.claim or row["host"] != asker.host_id:
        where = f"host {row['host']}" if row["host"] else "no host"
        return row, (
            f"task {asker.task_id} is not held by host {asker.host_id} under this claim"
            f" (it is {row['state']} on {where})"
        )
    return row, None


async def why_not_write(conn: Connection, asker: Asker, key: str) -> str | None:
    """None when the asker may write `key`: an output key of the task it holds, of the
    post-processing attempt it has open; else why not."""
    attempt = _output_attempt(asker.task_id, key)
    if attempt is None:
        return f"{key} is not an output key of task {asker.task_id}"
    row, why = await _held(conn, asker, attempt)
    if why is not None:
        return why
    if not key.startswith(f"{OUTPUTS}/{row['job_id']}/"):
        return f"{key} is not an output key of task {asker.task_id}"
    if row["state"] != TaskState.POST_PROCESSING.value or not row["attempt_open"]:
        return (
            f"task {asker.task_id} is {row['state']}: attempt {attempt} is not its open"
            " post-processing attempt on this host"
        )
    return None


async def why_not_read(conn: Connection, asker: Asker, key: str, store_url: str) -> str | None:
    """None when the asker may read `key`: an object the task it holds names (its job's files
    by URL, its input's objects, its upstream task's stored outputs), or one of the task's own
    outputs it may write (a look after a put whose answer was lost); else why not."""
    if _output_attempt(asker.task_id, key) is not None:
        return await why_not_write(conn, asker, key)
    row, why = await _held(conn, asker, 0)
    if why is not None:
        return why
    if row["state"] not in _READING:
        return f"task {asker.task_id} is {row['state']}: it reads no object now"
    if key in _named_keys(row["files"], row["input"], store_url):
        return None
    upstream = row["input"].get(UPSTREAM_KEY) if isinstance(row["input"], dict) else None
    if isinstance(upstream, str) and await conn.fetchval(
        _UPSTREAM_KEY, upstream, row["owner_id"], key
    ):
        return None
    return f"task {asker.task_id} names no object {key} (its job's files, its input, its upstream)"


def _named_keys(files: Any, value: Any, store_url: str) -> set[str]:
    """The keys of the objects of the store that a job's files and a task's input name."""
    urls = [f["url"] for f in files or () if isinstance(f, dict) and "url" in f]
    with suppress(ValueError):  # an input the api would refuse names nothing
        urls.extend(ref.url for ref in object_refs.input_objects(value))
    keys = (object_refs.key_in(store_url, url) for url in urls)
    return {key for key in keys if key is not None}
