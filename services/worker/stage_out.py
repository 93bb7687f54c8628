"""Stage-out: a task's recorded outputs put in the object store before it may complete.

After `save_results` recorded the outputs (name, size, sha256, computed on this host), each is
put under its own write-once key (`shared.objects.keys.output_key`: job, task, post-processing
attempt, name), streamed, and the put checks the bytes against the recorded sha256. The task's
completing move then records the keys with the outputs, in one transaction: a task is
`completed` only with every output durable in the store.

A store that cannot be reached is retried with a growing pause, for at most
`VIGIL_STORE_PATIENCE_S` (`store_patience.py`); then the task fails `failed_to_post_process`
with class `platform` (the installation's failure, never the job's: triage retries it), its
brief naming the store.
An output whose bytes changed after they were recorded, or that went away, fails the task as
the job's (class `exit`): it is something the job's processes did. A put the store's signer
refuses (on S3, where the host holds no credential: the task is not this host's any more)
fails the task at once, class `platform`, its brief saying why.

The outputs' bytes count against the quota of the job's owner (`shared/domain/store_quota.py`):
outputs that would go over it fail the task `failed_to_post_process`, class `quota`, with a
brief naming the bytes used and the limit; checked before any is put (nothing is stored
then), and again in the completing move, which adds them to the owner's count (tasks storing
at once cannot both take the last room). Outputs refused there stay under the job's prefix,
uncounted, until its purge.
"""

import asyncio
import logging
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from services.worker.store_patience import StoreUnreachable, patiently
from services.worker.tenure import Tenure
from shared.domain.outcomes import Outcome
from shared.domain.outputs import OutputRecord
from shared.domain.states import FailureClass, TaskState
from shared.domain.status_report import StatusReport
from shared.domain.store_quota import NEXT_STEP, OverQuota
from shared.host import job_files
from shared.objects import ContentChanged, ObjectExists, ObjectStore, ObjectStoreError
from shared.objects.keys import output_key
from shared.objects.signed import AccessRefused
from shared.store import quota_repo

logger = logging.getLogger(__name__)
S = TaskState

#: Outputs of one task put at once.
CONCURRENCY: Final = 4


class _JobChangedIt(Exception):
    """The output is no longer the file that was recorded: the job's doing."""


class Refused(Exception):
    """The store's signer refused a put of an output: the task is no longer this host's."""

    def __init__(self, name: str, refusal: AccessRefused) -> None:
        super().__init__(name, refusal)
        self.name, self.refusal = name, refusal


class Unreachable(Exception):
    """The store failed every put of an output for the whole patience."""

    def __init__(self, name: str, waited_s: float, last: ObjectStoreError) -> None:
        super().__init__(name, waited_s, last)
        self.name, self.waited_s, self.last = name, waited_s, last


@dataclass
class StageOut:
    """Puts a task's outputs in the store at `url` (`VIGIL_STORE_URL`), patiently
    (`patience_s`), within their owner's quota (`quota_bytes`: the installation's default,
    `VIGIL_STORE_QUOTA_BYTES`)."""

    url: str
    patience_s: float
    quota_bytes: int = 0

    async def complete(
        self,
        store: ObjectStore,
        held: Tenure,
        attempt: int,
        workdir: Path,
        outputs: list[OutputRecord],
        status: StatusReport | None,
    ) -> None:
        """End the post-processing `attempt` of `held` whose `outputs` are recorded: completed
        with every one in `store` (the store as the task may use it: `host_store.py`) and
        counted, or failed saying why not."""
        task = held.task
        size = sum(record.size for record in outputs)
        async with held.taker.pool.acquire() as conn:
            usage = await quota_repo.of_job(conn, task.job_id, self.quota_bytes)
        if not usage.room_for(size):  # refused before any byte is put
            refused = OverQuota(usage, size, f"the outputs of task {task.id}")
            await held.finish(S.POST_PROCESSING, attempt, over_quota(refused), status=status)
            return
        stored = await self.put_outputs(store, task.job_id, task.id, attempt, workdir, outputs)
        if isinstance(stored, Outcome):
            await held.finish(S.POST_PROCESSING, attempt, stored, status=status)
            return
        done = Outcome(S.COMPLETED)
        try:
            await held.finish(
                S.POST_PROCESSING,
                attempt,
                done,
                status=status,
                outputs=stored,
                store_quota_bytes=self.quota_bytes,
            )
        except OverQuota as refused:  # others took the room meanwhile
            await held.finish(S.POST_PROCESSING, attempt, over_quota(refused), status=status)

    async def put_outputs(
        self,
        store: ObjectStore,
        job_id: str,
        task_id: str,
        attempt: int,
        workdir: Path,
        outputs: list[OutputRecord],
    ) -> list[OutputRecord] | Outcome:
        """The records with their object keys once every output is in `store` (the store as
        the task may use it: `host_store.py`); or, when one could not be put, the failure of
        the task's post-processing saying why."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def put(record: OutputRecord) -> OutputRecord:
            async with gate:
                key = output_key(job_id, task_id, attempt, record.name)
                await self._put_patiently(store, key, workdir, record)
                return replace(record, object_key=key)

        done = await asyncio.gather(*(put(record) for record in outputs), return_exceptions=True)
        for kind in (_JobChangedIt, Refused, Unreachable, BaseException):  # the job's first
            failed = next((d for d in done if isinstance(d, kind)), None)
            if isinstance(failed, _JobChangedIt):
                return Outcome(
                    TaskState.FAILED_TO_POST_PROCESS, FailureClass.EXIT, brief=str(failed)
                )
            if isinstance(failed, Refused):
                return _refused(failed)
            if isinstance(failed, Unreachable):
                return _unreachable(self.url, failed)
            if failed is not None:
                raise failed
        return [d for d in done if isinstance(d, OutputRecord)]

    async def _put_patiently(
        self, store: ObjectStore, key: str, workdir: Path, record: OutputRecord
    ) -> None:
        """Put one output, trying again while the store fails, within the patience (a
        refusal of the store's signer is final)."""
        try:
            await patiently(
                lambda: self._put(store, key, workdir, record),
                self.patience_s,
                f"output {key} not stored yet",
                final=(AccessRefused,),
            )
        except AccessRefused as exc:
            raise Refused(record.name, exc) from exc
        except StoreUnreachable as exc:
            raise Unreachable(record.name, exc.waited_s, exc.last) from exc

    async def _put(self, store: ObjectStore, key: str, workdir: Path, record: OutputRecord) -> None:
        """Put the recorded file, read through a descriptor opened without following links
        (the job may have replaced the name meanwhile: whatever it is now, only the recorded
        bytes are accepted)."""
        with ExitStack() as opened:
            try:
                handle = await asyncio.to_thread(
                    opened.enter_context, job_files.open_regular(workdir, record.name)
                )
            except (OSError, job_files.UnsafeFile) as exc:
                raise _JobChangedIt(
                    f"output {record.name} went away before it was stored: {exc}"
                ) from exc
            source = Path(f"/proc/self/fd/{handle.fileno()}")
            try:
                await store.put_file(key, source, sha256=record.sha256)
            except ObjectExists:
                # An earlier try of this same put was stored, its answer lost: the same bytes?
                if (await store.head(key)).sha256 != record.sha256:
                    raise
            except ContentChanged:
                raise _JobChangedIt(
                    f"output {record.name} changed after it was recorded (sha256"
                    f" {record.sha256}): a process of the job still wrote to it"
                ) from None


def over_quota(refused: OverQuota) -> Outcome:
    """The failure of a task whose outputs would take their owner over their quota."""
    return Outcome(
        S.FAILED_TO_POST_PROCESS,
        FailureClass.QUOTA,
        brief=f"{refused}: nothing stored; {NEXT_STEP}, then recover the task",
        detail=f"used {refused.usage.used} + outputs {refused.size} > limit {refused.usage.limit}",
    )


def _unreachable(url: str, failed: Unreachable) -> Outcome:
    brief = (
        f"output {failed.name} could not be stored: the object store {url} failed for"
        f" {failed.waited_s:.0f} s (VIGIL_STORE_PATIENCE_S)"
    )
    return Outcome(
        TaskState.FAILED_TO_POST_PROCESS,
        FailureClass.PLATFORM,
        brief=brief,
        detail=str(failed.last),
    )


def _refused(failed: Refused) -> Outcome:
    brief = f"output {failed.name} could not be stored: {failed.refusal}"
    return Outcome(
        TaskState.FAILED_TO_POST_PROCESS,
        FailureClass.PLATFORM,
        brief=brief,
        detail=repr(failed.refusal),
    )
