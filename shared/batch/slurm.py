"""Slurm through its commands: `sbatch` submits, `squeue` follows, `scancel` cancels.

Every call is an asyncio subprocess with a timeout (the event loop never waits on one), run with
`SLURM_CONF` when a configuration is given.
What the commands print is read by the pure functions below (`parse_squeue`, ...).

Without accounting (`sacct`) a job is known only while `squeue -t all` lists it: for `MinJobAge`
after it ends (300 s by default), then never again. So a job that `jobs` does not answer about
has ended, and how is no longer known.
"""

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

#: What `squeue -o` prints for a job, `|`-separated; the reason last (it is free text).
SQUEUE_FIELDS = "%i|%T|%S|%e|%L|%r"
#: Slurm's states of a job that has not ended (`squeue -t all` also shows ended ones).
ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)
#: What Slurm prints where it has no time (or no limit).
_NO_VALUE = frozenset({"", "N/A", "NONE", "UNKNOWN", "UNLIMITED", "NOT_SET", "INVALID"})
#: What `scancel` says of a job that has already ended, or that it no longer knows.
_GONE = ("Invalid job id specified", "already completing or completed")


class BatchError(Exception):
    """A Slurm command failed or did not answer in time; the message says which, and how."""


@dataclass(frozen=True)
class BatchJob:
    """A job as `squeue` shows it now."""

    job_id: str
    #: Slurm's state: PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT,
    #: NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, SUSPENDED...
    state: str
    #: Slurm's reason (`%r`): why a pending job waits ("Resources", "Priority",
    #: "PartitionConfig"...), or how one ended ("NonZeroExitCode"...); None for Slurm's "None".
    reason: str | None
    #: When it started; None while pending.
    started_at: datetime | None
    #: When it ended, or, while it runs, when its walltime ends; None when Slurm does not say.
    ends_at: datetime | None
    #: Walltime left while it runs (None otherwise, and for a job without a limit).
    time_left_s: float | None

    @property
    def active(self) -> bool:
        """True until the job has ended (pending, running, completing...)."""
        return self.state in ACTIVE_STATES


def walltime_minutes(walltime_s: float) -> int:
    """`sbatch --time` is in whole minutes: `walltime_s` rounded up, at least 1."""
    return max(1, math.ceil(walltime_s / 60))


def sbatch_args(
    *,
    name: str,
    cpus: int,
    memory_mb: int | None,
    walltime_s: float,
    partition: str | None,
    account: str | None,
    workdir: str,
    output: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """`sbatch`'s options for one single-node job of `cpus` CPUs (the script on stdin); the
    `extra` options last, so that they can override ours."""
    args = [
        "--parsable",
        f"--job-name={name}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={cpus}",
        f"--time={walltime_minutes(walltime_s)}",
        f"--chdir={workdir}",
        f"--output={output}",
    ]
    if memory_mb is not None:
        args.append(f"--mem={memory_mb}M")
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    return [*args, *extra]


def parse_job_id(stdout: str) -> str:
    """The job id of `sbatch --parsable`'s answer (`<id>` or `<id>;<cluster>`)."""
    job_id = stdout.strip().split(";", 1)[0]
    if not job_id:
        raise BatchError(f"sbatch printed no job id: {stdout!r}")
    return job_id


def parse_time(text: str) -> datetime | None:
    """A Slurm time (`2026-11-27T11:08:16`, this machine's local time) as an aware datetime;
    None for "N/A", "Unknown" and the like."""
    text = text.strip()
    if text.upper() in _NO_VALUE:
        return None
    return datetime.fromisoformat(text).astimezone()


def parse_duration(text: str) -> float | None:
    """A Slurm duration (`[days-][hours:]minutes:seconds`) in seconds; None for "UNLIMITED",
    "NOT_SET" and the like."""
    text = text.strip()
    if text.upper() in _NO_VALUE:
        return None
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def parse_squeue_line(line: str) -> BatchJob:
    """One line of `squeue -h -o SQUEUE_FIELDS`."""
    try:
        job_id, state, start, end, left, reason = line.strip().split("|", 5)
    except ValueError:
        raise BatchError(f"unexpected squeue line: {line!r}") from None
    state = state.strip().upper()
    return BatchJob(
        job_id=job_id.strip(),
        state=state,
        reason=None if reason.strip() in ("", "None") else reason.strip(),
        # While pending, %S is the scheduler's guess of a start, and %L the whole limit.
        started_at=None if state == "PENDING" else parse_time(start),
        ends_at=parse_time(end),
        time_left_s=parse_duration(left) if state == "RUNNING" else None,
    )


def parse_squeue(stdout: str) -> dict[str, BatchJob]:
    """Every job of `squeue -h -o SQUEUE_FIELDS`'s answer, by job id."""
    jobs = (parse_squeue_line(line) for line in stdout.splitlines() if line.strip())
    return {job.job_id: job for job in jobs}


class Slurm:
    """Slurm's commands, from `bin_dir` (else the PATH), on the cluster of `conf` (a
    `slurm.conf`; else Slurm's own default: `SLURM_CONF`, `/etc/slurm/slurm.conf`, DNS)."""

    def __init__(
        self, conf: str | None = None, bin_dir: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.conf = conf
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s

    async def submit(
        self,
        script: str,
        *,
        name: str,
        cpus: int,
        memory_mb: int | None,
        walltime_s: float,
        partition: str | None,
        account: str | None,
        extra: Sequence[str] = (),
        workdir: str,
        output: str,
        env: Mapping[str, str] | None = None,
        withheld: Sequence[str] = (),
    ) -> str:
        """Submit `script` (a batch script, `#!` first) as one job; returns its job id.

        The job gets this process's environment (Slurm's `--export=ALL`) with `env` over it,
        less every variable whose name starts with one of `withheld` (credentials).
        `output` may hold sbatch's patterns (`%j`: the job id). Raises BatchError with sbatch's
        own words when it refuses the job (an unknown partition, more memory than a node has...).
        """
        args = sbatch_args(
            name=name,
            cpus=cpus,
            memory_mb=memory_mb,
            walltime_s=walltime_s,
            partition=partition,
            account=account,
            workdir=workdir,
            output=output,
            extra=extra,
        )
        code, out, err = await self._run("sbatch", args, stdin=script, env=env, withheld=withheld)
        if code != 0:
            raise BatchError(f"sbatch refused job {name!r} (exit {code}): {err.strip()}")
        return parse_job_id(out)

    async def jobs(self, job_ids: Sequence[str]) -> dict[str, BatchJob]:
        """What `squeue -t all` says of these jobs, by job id: one call for all of them. A job
        it does not list is absent from the answer: it ended long enough ago to be forgotten
        (`MinJobAge`), or never was."""
        if not job_ids:
            return {}
        args = ["-h", "-t", "all", "-j", ",".join(job_ids), "-o", SQUEUE_FIELDS]
        code, out, err = await self._run("squeue", args, env={"SLURM_TIME_FORMAT": "standard"})
        if code != 0:
            # squeue fails so when the only job asked about is unknown.
            if "Invalid job id specified" in err:
                return {}
            raise BatchError(f"squeue failed (exit {code}): {err.strip()}")
        return parse_squeue(out)

    async def cancel(self, job_id: str, signal: str | None = None) -> None:
        """Cancel the job (a pending one ends there; a running one gets SIGTERM, then SIGKILL
        after `KillWait`: every process Slurm tracks as the job's). With `signal` ("USR1",
        "TERM"...), only send that signal, to the batch script alone (`scancel --batch`: not to
        its children); Slurm refuses to signal a job still pending (BatchError). A job that has
        already ended, or that Slurm no longer knows, is no error."""
        args = [f"--signal={signal}", "--batch", job_id] if signal else [job_id]
        code, _, err = await self._run("scancel", args)
        if code != 0 and not any(gone in err for gone in _GONE):
            raise BatchError(f"scancel {job_id} failed (exit {code}): {err.strip()}")

    async def _run(
        self,
        command: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        withheld: Sequence[str] = (),
    ) -> tuple[int, str, str]:
        """Run one Slurm command within the timeout: (exit code, stdout, stderr)."""
        program = str(Path(self.bin_dir) / command) if self.bin_dir else command
        environment = {
            name: value
            for name, value in {**os.environ, **(env or {})}.items()
            if not name.startswith(tuple(withheld))
        }
        if self.conf:
            environment["SLURM_CONF"] = self.conf
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
            )
        except FileNotFoundError:
            raise BatchError(
                f"{program} not found: install Slurm's commands (apt-get install slurm-client)"
            ) from None
        try:
            async with asyncio.timeout(self.timeout_s):
                out, err = await process.communicate(stdin.encode() if stdin is not None else None)
        except BaseException as exc:
            # A timeout, or our caller's cancellation: the command must not outlive the call.
            if process.returncode is None:
                process.kill()
                await process.wait()
            if isinstance(exc, TimeoutError):
                raise BatchError(f"{command} did not answer within {self.timeout_s} s") from None
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
