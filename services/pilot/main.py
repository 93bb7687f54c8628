"""The pilot's life: mark the host's end, run its worker and supervisor, drain before the
walltime, and stop them (and so every command they run) when the allocation ends or the
batch system says so."""

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Final

from services.pilot.allocation import Allocation, from_slurm
from services.pilot.settings import PilotSettings
from shared.objects import STORE_CREDENTIALS
from shared.store import hosts_repo
from shared.store.db import Pool, open_pool

logger = logging.getLogger(__name__)

#: Why a pilot stops, besides its allocation's end.
_SIGNALLED: Final = "told to stop (a signal: the batch system's cancel or walltime)"
_CHILD_EXITED: Final = "its worker or supervisor exited"

#: Settings of the pilot's own that its children must not read as theirs.
_NOT_INHERITED = ("VIGIL_WORKER_SLOTS",)


def child_env(environ: Mapping[str, str], allocation: Allocation, host_id: str) -> dict[str, str]:
    """The environment of the host's worker and supervisor: the pilot's, with the host's id
    and capacity from the allocation, and no health ports (several pilots may share a node);
    never the store's credentials (a pilot an operator submitted with them in its
    environment): a host's links are signed by the control plane."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in _NOT_INHERITED and not k.startswith(STORE_CREDENTIALS)
    }
    env.update(allocation.host_env())
    env["VIGIL_HOST_ID"] = host_id
    env["VIGIL_WORKER_HEALTH_PORT"] = "0"
    env["VIGIL_SUPERVISOR_HEALTH_PORT"] = "0"
    return env


async def _start(service: str, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"services.{service}", env=dict(env)
    )


async def _stop(process: asyncio.subprocess.Process, within_s: float, signalled: bool) -> None:
    """Stop a child: SIGTERM (unless the batch system signalled the whole job: the child
    has its signal already, and a second one would stop it hard), then SIGTERM anyway if it
    still runs after `within_s` (the signal was the pilot's alone: `scancel --batch`), then
    SIGKILL after as long again."""
    for send in (not signalled, True):
        if process.returncode is not None:
            return
        if send:
            with suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        with suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), within_s)
    if process.returncode is None:
        with suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def run(settings: PilotSettings) -> int:
    """Run the pilot; its exit status (0: it ended as planned or was told to)."""
    allocation = from_slurm(os.environ, time.time(), settings.pilot_walltime_s)
    host_id = allocation.host_id(settings.pilot_host_prefix)
    not_root = os.geteuid() != 0
    logger.info(
        "pilot of batch job %s: host %s, %g cpus, %s MiB, gpus [%s], ends at %s%s",
        allocation.batch_job_id,
        host_id,
        allocation.cpus,
        allocation.memory_mb if allocation.memory_mb is not None else "unsaid",
        ",".join(allocation.gpu_ids),
        time.strftime("%H:%M:%S", time.localtime(allocation.ends_at)),
        ": unprivileged, jobs run as this user, with the network, within the allocation's"
        " limits only"
        if not_root
        else "",
    )
    async with open_pool(settings.database_url, max_size=1) as pool:
        async with pool.acquire() as conn:
            ends_at = allocation.tasks_end(settings.pilot_stop_s)
            await hosts_repo.prepare_pilot(conn, host_id, settings.worker_pool, ends_at)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        env = child_env(os.environ, allocation, host_id)
        supervisor = await _start("supervisor", env)
        worker = await _start("worker", env)
        why = await _watch(pool, host_id, allocation, settings, stop, (supervisor, worker))
        logger.info("pilot %s stopping: %s", host_id, why)
        signalled = why == _SIGNALLED
        await _stop(worker, settings.graceful_timeout_s + 5, signalled)
        await _stop(supervisor, 10, signalled)
    return 1 if why == _CHILD_EXITED else 0


async def _watch(
    pool: Pool,
    host_id: str,
    allocation: Allocation,
    settings: PilotSettings,
    stop: asyncio.Event,
    children: tuple[asyncio.subprocess.Process, ...],
) -> str:
    """Wait for the end: a signal, a child's exit, or the time to stop; drain on the way."""
    drain_at = allocation.ends_at - settings.pilot_drain_s
    stop_at = allocation.ends_at - settings.pilot_stop_s
    drained = False
    exits = [asyncio.ensure_future(c.wait()) for c in children]
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            now = time.time()
            if now >= stop_at:
                return "its allocation ends"
            if not drained and now >= drain_at:
                async with pool.acquire() as conn:
                    await hosts_repo.drain(conn, host_id)
                drained = True
                logger.info("pilot %s draining: its allocation ends soon", host_id)
            wake = min(stop_at, drain_at if not drained else stop_at) - now
            done, _ = await asyncio.wait(
                [*exits, stopped], timeout=max(wake, 0.05), return_when=asyncio.FIRST_COMPLETED
            )
            if stopped in done:
                return _SIGNALLED
            if any(e in done for e in exits):
                return _CHILD_EXITED
    finally:
        for future in (*exits, stopped):
            future.cancel()
