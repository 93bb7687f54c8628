"""Stage-in: the objects a task names by reference, fetched through the host's cache
(`shared/host/object_cache.py`) and placed in its work dir before its setup, each checked
against its sha256: its job's files given by URL, a chained task's upstream outputs kept in
the store and not on this host, and the objects its input names
(`shared/domain/object_refs.py`). (The job's files given by their bytes come from the
database: `bundle_contents`, placed by `shared/host/bundle.py`.)

An object whose bytes are not the ones named (fetched twice: a transfer can be garbled) fails
the task's setup with a brief naming the object, its URL and both hashes, class `checksum`
(the store holds other bytes under that name: a retry would fetch the same ones); an object
not in the store fails it too, class `hook` (the job named what is not there).

A store that cannot be reached or refuses is tried again with a growing pause for at most
`VIGIL_STORE_PATIENCE_S` (`store_patience.py`, as stage-out does; the task stays
`setting_up`, holding no capacity), then fails the task as the platform's (class `platform`:
retried), naming the object, the store, how long it waited and the store's last error. Any
other error (the host's disk) is the worker's, as for any setup.

Nothing is left half-placed that a later setup could take for whole: an entry of the cache is
whole or absent, and each placement replaces what had its name.

A chained task's input (`{"upstream_task": id}`) is resolved at its take to the upstream
task's outputs (`resolve_input`): where each comes from, and the names the command sees.
"""

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from services.worker.settings import WorkerSettings
from services.worker.store_patience import StoreUnreachable, patiently
from shared.domain import object_refs
from shared.domain.bundle import with_bytes
from shared.domain.object_refs import ObjectRef
from shared.domain.outcomes import Outcome
from shared.domain.outputs import UpstreamOutput
from shared.domain.states import FailureClass, TaskState
from shared.host import bundle, staged_objects
from shared.host.object_cache import Fetch, ObjectCache, ObjectMismatch, Sink, Wanted
from shared.objects import ObjectNotFound, ObjectStore
from shared.objects.signed import AccessRefused
from shared.operations.datasets import UPSTREAM_KEY
from shared.store import bundle_repo, outputs_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import Job

logger = logging.getLogger(__name__)

#: The fetch of the object at a URL of the store (the store's client, streaming its bytes).
Fetcher = Callable[[str], Fetch]
#: Objects of one task fetched or placed at once.
_AT_ONCE = 8
#: The host's cache, under the work root (on the work dirs' file system: entries are linked).
CACHE_DIR = ".cache"


@dataclass
class StageIn:
    """The host's stage-in: its cache, the store's fetches, and whether an entry may be
    hard-linked into a work dir (only where jobs cannot write it: `staged_objects`)."""

    cache: ObjectCache
    link: bool
    #: The store's URL (`VIGIL_STORE_URL`): an object's URL is it, `/`, and its key.
    store_url: str
    #: How long a store that fails is tried again (`VIGIL_STORE_PATIENCE_S`).
    patience_s: float = 600.0

    @classmethod
    def of_host(cls, settings: WorkerSettings, confined: bool) -> "StageIn":
        """The stage-in of the worker of `settings`: from the store of `VIGIL_STORE_URL`,
        through the cache under its work root (`VIGIL_CACHE_BYTES`); entries linked into work
        dirs if jobs are `confined` (run as uids of their own)."""
        cache = ObjectCache(Path(settings.work_root) / CACHE_DIR, settings.cache_bytes)
        cache.open()
        return cls(cache, confined, settings.store_url, settings.store_patience_s)

    async def stage(
        self,
        store: ObjectStore,
        workdir: Path,
        files: list[dict[str, Any]],
        value: Any,
        upstream: Mapping[str, UpstreamOutput],
    ) -> Outcome | None:
        """Place in `workdir`, from `store` (as the task may use it: `host_store.py`), the
        objects a task names: its job's files given by URL
        (`jobs.files`), the upstream outputs of a chained task that are in the store and not
        on this host (by their names), and its input's `objects`. None when all are there,
        else the setup's failure naming the first that could not be had."""
        refs = [
            ObjectRef(f["path"], f["url"], f["sha256"], f["executable"])
            for f in files
            if "url" in f
        ]
        refs.extend(
            ObjectRef(name, f"{self.store_url}/{output.object_key}", output.sha256)
            for name, output in upstream.items()
            if output.object_key is not None
        )
        try:
            refs.extend(object_refs.input_objects(value))
        except ValueError as exc:  # the api refuses it: an input that came in another way
            brief = f"the input's objects cannot be staged: {exc}"
            return Outcome(TaskState.FAILED_TO_SETUP, FailureClass.HOOK, brief=brief)
        if not refs:
            return None
        return await self.place(store_fetcher(store, self.store_url), workdir, refs)

    async def place(self, fetcher: Fetcher, workdir: Path, refs: list[ObjectRef]) -> Outcome | None:
        """Place every object of `refs` in `workdir`, each fetched (when the cache has it not)
        by `fetcher`; None when all are there, else the setup's failure naming the first
        object that could not be had."""
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)  # the worker's
        room = asyncio.Semaphore(_AT_ONCE)

        async def one(ref: ObjectRef) -> Outcome | None:
            async with room:
                return await self._one(fetcher, workdir, ref)

        failures = await asyncio.gather(*(one(ref) for ref in refs))
        return next((failure for failure in failures if failure is not None), None)

    async def _one(self, fetcher: Fetcher, workdir: Path, ref: ObjectRef) -> Outcome | None:
        try:
            await patiently(
                lambda: self._place(fetcher, workdir, ref),
                self.patience_s,
                f"object {ref.path} ({ref.url}) not fetched yet",
                final=(ObjectNotFound, AccessRefused),
            )
        except ObjectMismatch as exc:
            return Outcome(
                TaskState.FAILED_TO_SETUP,
                FailureClass.CHECKSUM,
                brief=f"object {ref.path} ({ref.url}) is not the one named: {_hashes(exc)}",
                detail=str(exc),
            )
        except ObjectNotFound as exc:  # never put there, or deleted (a purge)
            return Outcome(
                TaskState.FAILED_TO_SETUP,
                FailureClass.HOOK,
                brief=f"object {ref.path} ({ref.url}) is not in the store: {exc}",
                detail=repr(exc),
            )
        except AccessRefused as exc:  # the signer's: the task is not this host's any more
            return Outcome(
                TaskState.FAILED_TO_SETUP,
                FailureClass.PLATFORM,
                brief=f"object {ref.path} ({ref.url}) could not be fetched: {exc}",
                detail=repr(exc),
            )
        except StoreUnreachable as exc:  # unreachable or refusing: the platform's, retried
            logger.warning("object %s (%s) could not be fetched: %s", ref.path, ref.url, exc.last)
            return Outcome(
                TaskState.FAILED_TO_SETUP,
                FailureClass.PLATFORM,
                brief=f"object {ref.path} ({ref.url}) could not be fetched: the object store"
                f" failed for {exc.waited_s:.0f} s (VIGIL_STORE_PATIENCE_S): {exc.last}",
                detail=repr(exc.last),
            )
        return None

    async def _place(self, fetcher: Fetcher, workdir: Path, ref: ObjectRef) -> None:
        """Place the object, fetched through the cache (whatever the fetch raises)."""
        wanted = Wanted(ref.sha256, ref.url)
        async with self.cache.held(wanted, fetcher(ref.url)) as held:
            link = (self.link or held.transient) and not ref.executable
            mode = 0o555 if ref.executable else 0o444
            await asyncio.to_thread(
                staged_objects.place, held.path, workdir, ref.path, link=link, mode=mode
            )


def _hashes(exc: ObjectMismatch) -> str:
    return f"its bytes have sha256 {exc.got}, not {exc.expected}"


def store_fetcher(store: ObjectStore, store_url: str) -> Fetcher:
    """The fetch of an object of `store` (whose URL is `store_url`) by its URL: its bytes
    streamed into the sink, each chunk hashed and written in a thread."""

    def fetch_of(url: str) -> Fetch:
        key = object_refs.key_in(store_url, url)

        async def fetch(sink: Sink) -> None:
            if key is None:  # the api lets none in: a job of a store since moved
                raise ObjectNotFound(f"{url} is not in the store ({store_url})")
            async for chunk in store.read(key):
                await asyncio.to_thread(sink.write, chunk)

        return fetch

    return fetch_of


async def bundle_contents(pool: Pool, work_root: Path, job: Job) -> dict[str, bytes] | None:
    """The bytes of the job's files given by their bytes, when they are not on this host yet
    (None: it has none, or they are here: `shared/host/bundle.py`)."""
    if not with_bytes(job.files) or bundle.on_host(work_root, job.id).is_dir():
        return None
    async with pool.acquire() as conn:
        return await bundle_repo.contents(conn, job.id)


# -- a chained task's input -------------------------------------------------------------------


def promised_input(value: Any) -> bool:
    """Whether an input is a promise of an upstream task's outputs: `{"upstream_task": id}`."""
    return isinstance(value, dict) and isinstance(value.get(UPSTREAM_KEY), str)


def _not_on_this_host(outputs: dict[str, UpstreamOutput], work_root: Path) -> list[str]:
    """The names of the outputs whose file is not here: not under this host's work root (made
    by another host), or gone (one stat each: cheap, never waits on the job: the paths are the
    workers' own record)."""
    return [
        name
        for name, output in outputs.items()
        if not Path(output.path).is_relative_to(work_root) or not os.path.lexists(output.path)
    ]


async def resolve_input(
    conn: Connection, value: Any, owner_id: str, workdir: Path
) -> tuple[Any, dict[str, UpstreamOutput]]:
    """A promised input `{"upstream_task": id}` gets the upstream task's outputs: the input the
    command sees names them by their place in its own work dir (`workdir`), and the records say
    where they come from (their key in the store when the file is not on this host, else
    their kept bytes). Only if
    that task is of a job of the same owner (the api refuses any other; this is the last line):
    another user's outputs are never placed. Any `outputs` the input itself carried are
    replaced."""
    if not promised_input(value):
        return value, {}
    upstream = value[UPSTREAM_KEY]
    of = await conn.fetchrow(
        "SELECT j.id, j.owner_id, j.purged_at FROM tasks t JOIN jobs j ON j.id = t.job_id"
        " WHERE t.id = $1",
        upstream,
    )
    owner = of["owner_id"] if of is not None else None
    if owner is not None and owner != owner_id:
        logger.warning("input names task %s of another owner: none of its outputs linked", upstream)
    records = await outputs_repo.latest(conn, upstream) if owner == owner_id else {}
    found = {
        name: UpstreamOutput(upstream, name, r["path"], r["host"], r["size"], r["sha256"])
        for name, r in records.items()
    }
    away = _not_on_this_host(found, workdir.parent.parent)  # <work root>/<job>/<task>
    purged = (
        f"job {of['id']} was purged at {of['purged_at']:%Y-%m-%d %H:%M:%S %Z}"
        if of is not None and of["purged_at"] is not None
        else None
    )
    stored = {n: records[n]["object_key"] for n in away if records[n]["object_key"]}
    if stored and purged is None:  # from another host: from the store, through its cache
        found |= {name: replace(found[name], object_key=key) for name, key in stored.items()}
        away = [name for name in away if name not in stored]
    if away:  # from another host, or purged: the bytes kept in the database, if they were
        kept = await outputs_repo.kept(conn, upstream, away)
        for name in away:
            why = purged or records[name]["not_kept"]
            found[name] = replace(found[name], content=kept.get(name), not_kept=why)
    local = {name: str(workdir / name) for name in found}
    return {**value, "outputs": local}, found
