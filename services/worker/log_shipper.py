"""Ships a command's output lines: to per-run files, to PostgreSQL, and to the exchange.

Lines are numbered in the order they are read (both streams together), persisted in batches
(so a task's terminal state implies its lines are stored) and published as
`log.<severity>.<job id>` for live followers and the supervisor.

A stream's run file is made at its first line, and the periodic flush starts with the first
line: a silent command costs no file and no timer. Making a file is not free (on the ext4 of
our 2-core VMs, up to 0.3-0.8 ms of kernel CPU each), and most
short commands print nothing on one stream or both.
"""

import asyncio
import logging
from pathlib import Path
from typing import IO, Final, Literal

from redis.asyncio import Redis

from shared.domain.errors import UNAVAILABLE
from shared.domain.log_lines import ShellNotes, parse_line
from shared.domain.messages import LogRecord, Severity
from shared.host import job_files
from shared.messaging.amqp import Broker
from shared.messaging.redis_keys import JOB_TTL_S, RedisKeys
from shared.messaging.topology import event_key
from shared.store import logs_repo, tasks_repo
from shared.store.db import Pool

logger = logging.getLogger(__name__)

Stream = Literal["stdout", "stderr"]

#: What one run may keep of its output lines unless the worker's settings say otherwise.
DEFAULT_QUOTA_BYTES: Final = 16 * 1024 * 1024


class LogShipper:
    """Collects the lines of one attempt and flushes them; `close()` flushes the rest."""

    def __init__(
        self,
        *,
        pool: Pool,
        broker: Broker,
        redis: Redis,
        keys: RedisKeys,
        job_id: str,
        task_id: str,
        run_number: int,
        attempt: int,
        workdir: Path,
        files: dict[Stream, Path],
        fail_on: frozenset[Severity] = frozenset(),
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
        flush_every_s: float | None = None,
    ) -> None:
        self._pool, self._broker, self._redis, self._keys = pool, broker, redis, keys
        self._job_id, self._task_id = job_id, task_id
        self._run_number, self._attempt = run_number, attempt
        self._workdir, self._paths = workdir, files
        #: The run files opened so far (at their stream's first line kept).
        self._files: dict[Stream, IO[str]] = {}
        self._unwritable: set[Stream] = set()  # streams whose run file could not be opened
        self._flush_every_s = flush_every_s
        self._flusher: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()  # set by `close()`: the periodic flush ends
        self._pending: list[LogRecord] = []
        self._line_no = 0
        self._progress: int | None = None
        self._fail_on = fail_on
        self._quota_left = quota_bytes
        self._quota_bytes = quota_bytes
        #: The first line whose severity is in the job's `fail_on_log`, if any.
        self.failing: LogRecord | None = None
        #: What bash said on stderr of how the script went (its syntax, a command it could
        #: not run, a process killed): the cause a failure's brief names.
        self.shell = ShellNotes()

    def add(self, stream: Stream, raw: str) -> None:
        """Take one line (without waiting): number it, write it to its run file, queue it
        (within the run's quota)."""
        parsed = parse_line(raw, stream)
        if parsed.progress is not None:
            self._progress = parsed.progress
        keep = self._within_quota(stream, parsed.line)
        record = self._record(
            stream, parsed.severity, parsed.line, progress=parsed.progress, keep=keep
        )
        if self.failing is None and parsed.severity in self._fail_on:
            self.failing = record
        if stream == "stderr":
            self.shell.heard(parsed.line)

    def _within_quota(self, stream: Stream, line: str) -> bool:
        """Whether `line` still fits in the run's quota; the first that does not is replaced
        by a marker line that says so."""
        if self._quota_left < 0:
            return False
        self._quota_left -= len(line.encode()) + 1
        if self._quota_left >= 0:
            return True
        note = (
            f"[vigil: log truncated: this run printed more than {self._quota_bytes} bytes;"
            " the lines after this one are not kept]"
        )
        self._record(stream, Severity.WARNING, note)
        return False

    def _record(
        self,
        stream: Stream,
        severity: Severity,
        line: str,
        *,
        progress: int | None = None,
        keep: bool = True,
    ) -> LogRecord:
        """Number a line; with `keep`, write it to its run file and queue it."""
        self._line_no += 1
        record = LogRecord(
            job_id=self._job_id,
            task_id=self._task_id,
            run_number=self._run_number,
            attempt=self._attempt,
            line_no=self._line_no,
            severity=severity,
            stream=stream,
            line=line,
            progress=progress,
        )
        if keep:
            handle = self._file(stream)
            if handle is not None:
                handle.write(line + "\n")
            self._pending.append(record)
            if self._flusher is None and self._flush_every_s is not None:
                self._flusher = asyncio.create_task(
                    self._flush_every(self._flush_every_s), name=f"logs-{self._task_id}"
                )
        return record

    def _file(self, stream: Stream) -> IO[str] | None:
        """The stream's run file, opened (made if missing) at its first line, through no link:
        the job owns the work dir and may have left one there. None if it cannot be (what
        the job put there is never followed; the lines still go to PostgreSQL)."""
        if stream in self._unwritable:
            return None
        handle = self._files.get(stream)
        if handle is None:
            path = self._paths[stream]
            try:
                handle = job_files.open_append(self._workdir, path.relative_to(self._workdir))
            except (job_files.UnsafeFile, OSError) as exc:
                logger.warning("task %s: no run file for %s: %s", self._task_id, stream, exc)
                self._unwritable.add(stream)
                return None
            self._files[stream] = handle
        return handle

    async def _flush_every(self, period_s: float) -> None:
        """Flush every `period_s` until `close()`, which lets a flush under way end: one
        cancelled halfway could leave its lines stored (the logs say `PROGRESS: 100`) and the
        task's progress not (it showed 50), or drop its lines. Flushes never overlap: the
        progress a task shows is the last one it printed."""
        while not self._closing.is_set():
            try:
                await asyncio.wait_for(self._closing.wait(), period_s)
            except TimeoutError:
                await self.flush()

    async def flush(self) -> None:
        """Persist and publish what is pending. A database error keeps the lines for later."""
        for handle in self._files.values():
            handle.flush()
        batch, self._pending = self._pending, []
        progress, self._progress = self._progress, None
        if not batch:
            return
        try:
            async with self._pool.acquire() as conn:
                batch = await logs_repo.insert_splitting(conn, batch)
                if progress is not None:
                    await tasks_repo.set_progress(conn, self._task_id, progress)
        except UNAVAILABLE as exc:
            logger.warning("could not persist %d log lines, will retry: %s", len(batch), exc)
            self._pending = batch + self._pending
            if self._progress is None:  # unless a later line said more, it is still the last
                self._progress = progress
            return
        if progress is not None:
            await self._record_progress(progress)
        await self._publish(batch)

    async def _record_progress(self, progress: int) -> None:
        key = self._keys.job_progress(self._job_id)
        try:
            await self._redis.hset(key, self._task_id, progress)
            await self._redis.expire(key, JOB_TTL_S)
        except UNAVAILABLE as exc:
            logger.warning("could not record progress in Redis: %s", exc)

    async def _publish(self, batch: list[LogRecord]) -> None:
        publishes = [
            self._broker.publish_event(event_key("log", r.severity.value, r.job_id), r)
            for r in batch
        ]
        results = await asyncio.gather(*publishes, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            # The lines are persisted; only live followers miss them. Never fail the task for it.
            logger.warning(
                "could not publish %d of %d log lines: %s", len(failed), len(batch), failed[0]
            )

    async def close(self) -> None:
        """Stop the periodic flush (a flush under way ends first), flush everything and
        close the run files."""
        if self._flusher is not None:
            self._closing.set()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()
        if self._pending:  # one more try for lines kept back by a database error
            await self.flush()
        for handle in self._files.values():
            handle.close()
