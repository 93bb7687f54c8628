"""The worker's stage runner driven directly: a work message taken and its
task driven through setup, the command and post-processing, against the real PostgreSQL,
RabbitMQ and Redis, with real commands; no other service runs.

Each test makes a job, claims its task as the dispatcher would, and hands the runner the work
message; what it asserts is what the database holds afterwards.
"""

import asyncio
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.worker import launch, runs
from services.worker.claims import Ack
from services.worker.launch import Command, Launch
from services.worker.settings import WorkerSettings
from services.worker.stages import StageRunner
from services.worker.tenure import Tenure
from shared.domain.messages import RunStage, WatchProcess, decode
from shared.domain.states import NORMAL_PATH, Stage
from shared.host.cgroups import Cgroups
from shared.messaging.amqp import Broker, open_broker
from shared.messaging.redis_keys import RedisKeys
from shared.messaging.topology import Topology, declare_all_work_queues
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.task_types import TaskContext
from shared.task_types.registry import load_task_types
from shared.task_types.shell import ShellTaskType
from tests.conftest import AMQP_URL, REDIS_URL

pytestmark = pytest.mark.integration


def _settings(
    database_url: str, namespace: str, work_root: Path, *, default: bool = False, **more: Any
) -> WorkerSettings:
    """A worker of a host of its own, unconfined, without cgroups; with `default`, confined
    and in cgroups as a worker runs by default (as root, as here)."""
    unconfined = {} if default else {"job_isolation": "off", "cgroup_root": "off"}
    return WorkerSettings(
        database_url=database_url,
        amqp_url=AMQP_URL,
        redis_url=REDIS_URL,
        namespace=namespace,
        host_id=f"h-{uuid.uuid4().hex[:8]}",
        work_root=str(work_root),
        **({"store_url": (work_root / "store").as_uri()} | unconfined | more),
    )


def _runner(
    settings: WorkerSettings, pool: db.Pool, broker: Broker, redis: Redis, **more: Any
) -> StageRunner:
    """A stage runner of the host of `settings`, every task type installed (`more`: its
    optional fields)."""
    keys = RedisKeys(settings.namespace)
    instance = f"{settings.host_id}-test"
    return StageRunner(settings, pool, broker, redis, keys, load_task_types(), instance, **more)


@pytest.fixture
async def runner(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[StageRunner]:
    settings = _settings(session_database_url, namespace, tmp_path, worker_slots=2)
    redis = Redis.from_url(REDIS_URL)
    try:
        async with open_broker(AMQP_URL, Topology(namespace), name="test-stages") as broker:
            made = _runner(settings, pool, broker, redis)
            yield made
            # its hand-overs to the supervisor use Redis: done before the client closes, else
            # one reconnects it after, and the socket outlives the test's loop
            await made.background_done()
    finally:
        await redis.aclose()


async def _claimed(pool: db.Pool, command: str, **policy: Any) -> RunStage:
    """Given-step: a job of one task, claimed as the dispatcher would; its work message."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("s", "shell", command, ["a"], policy=policy)
        )
        claim = uuid.uuid4()
        task_id = await conn.fetchval(
            "UPDATE tasks SET claim = $2 WHERE job_id = $1 RETURNING id", job.id, claim
        )
    return RunStage(job_id=job.id, task_id=task_id, stage=Stage.SETUP, claim=claim)


async def _task(pool: db.Pool, task_id: str) -> dict[str, Any]:
    row = await pool.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
    assert row is not None
    return dict(row)


async def _attempts(pool: db.Pool, task_id: str) -> list[tuple[str, str | None]]:
    rows = await pool.fetch(
        "SELECT stage, outcome FROM attempts WHERE task_id = $1 ORDER BY attempt", task_id
    )
    return [(r["stage"], r["outcome"]) for r in rows]


async def test_a_task_is_set_up_run_and_post_processed_to_completed(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, 'echo "hello $VIGIL_INPUT"')

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert (task["state"], task["claim"], task["worker"]) == ("completed", None, None)
    assert await _attempts(pool, message.task_id) == [
        ("setup", "queued"),
        ("cluster", "data_ready"),
        ("post_processing", "completed"),
    ]
    line = await pool.fetchval("SELECT line FROM logs WHERE task_id = $1", message.task_id)
    assert line == "hello a"


async def test_a_command_that_exits_non_zero_fails_the_task_as_exit_and_lets_it_go(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, "exit 3")

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert (task["state"], task["failure_class"], task["exit_code"]) == (
        "failed_on_cluster",
        "exit",
        3,
    )
    assert task["claim"] is None and task["decided"] is False  # the triage's to decide
    assert (await _attempts(pool, message.task_id))[-1] == ("cluster", "failed_on_cluster")


async def test_a_command_that_logs_an_error_and_exits_keeps_its_exit_code_beside_error_log(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, 'echo "ERROR: no input"; exit 3')

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert (task["state"], task["failure_class"], task["exit_code"]) == (
        "failed_on_cluster",
        "error_log",
        3,
    )
    assert task["error_brief"] == "error logged: ERROR: no input"
    exit_code = await pool.fetchval(
        "SELECT exit_code FROM attempts WHERE task_id = $1 AND stage = 'cluster'",
        message.task_id,
    )
    assert exit_code == 3


async def test_a_command_bash_cannot_parse_fails_with_a_brief_that_says_so(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, 'echo "unterminated')

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert (task["failure_class"], task["exit_code"]) == ("exit", 2)
    assert task["error_brief"] == (
        "command exited with code 2: a shell syntax error:"
        " bash: -c: line 1: unexpected EOF while looking for matching `\"'"
    )


async def test_a_message_whose_claim_is_not_the_tasks_any_more_is_a_no_op(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, "echo never")
    await pool.execute("UPDATE tasks SET claim = $2 WHERE id = $1", message.task_id, uuid.uuid4())

    held = await runner.take(message)

    assert held is None
    assert (await _task(pool, message.task_id))["state"] == "new"
    assert await _attempts(pool, message.task_id) == []


async def _running_until(
    go: Path, runner: StageRunner, pool: db.Pool, exit_code: int
) -> tuple[RunStage, asyncio.Task[None]]:
    """Given-step: a command that runs until `go` exists, then exits `exit_code`, driven
    until its task is on_cpu: (its work message, its driving)."""
    message = await _claimed(pool, f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit {exit_code}')
    held = await runner.take(message)
    assert held is not None
    driving = asyncio.create_task(runner.drive(held))
    async with asyncio.timeout(20):
        while (await _task(pool, message.task_id))["state"] != "on_cpu":  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # (nothing to wait on: no other service runs)
    return message, driving


async def test_a_report_that_comes_after_the_task_was_taken_away_is_kept_not_applied(
    runner: StageRunner, pool: db.Pool, tmp_path: Path
) -> None:
    # given: a command that waits for the test, running under its claim
    go = tmp_path / "go"
    message, driving = await _running_until(go, runner, pool, exit_code=0)

    # when: the task is declared lost meanwhile (its claim taken away), then the command ends
    await pool.execute(
        "UPDATE tasks SET state = 'failed_on_cluster', failure_class = 'lost', claim = NULL,"
        " worker = NULL WHERE id = $1",
        message.task_id,
    )
    go.touch()
    await asyncio.wait_for(driving, 20)

    # then: the task stays as it was made, and the worker's report is kept on its attempt
    task = await _task(pool, message.task_id)
    assert (task["state"], task["failure_class"]) == ("failed_on_cluster", "lost")
    late = await pool.fetchval(
        "SELECT late_report FROM attempts WHERE task_id = $1 AND stage = 'cluster'",
        message.task_id,
    )
    assert late["state"] == "data_ready" and late["exit_code"] == 0
    assert "is failed_on_cluster, not movable to data_ready" in late["rejected_because"]


async def _exit_note(redis: Redis, namespace: str, message: RunStage) -> bytes | str | None:
    return await redis.hget(RedisKeys(namespace).job_exits(message.job_id), message.task_id)


async def test_only_a_command_that_outlives_follow_after_is_handed_over_and_its_exit_noted(
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    passable_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a note put off cannot fall due during the test; each run's note is kept to look at
    monkeypatch.setattr(runs, "NOTE_AFTER_S", 600.0)
    notings: list[runs.ExitNoting] = []

    class _Kept(runs.ExitNoting):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            notings.append(self)

    monkeypatch.setattr(runs, "ExitNoting", _Kept)
    # as a worker runs by default: confined as the job's owner, in cgroups
    settings = _settings(
        session_database_url, namespace, passable_dir, default=True, follow_after_s=0.3
    )
    redis = Redis.from_url(REDIS_URL)
    async with open_broker(AMQP_URL, Topology(namespace), name="test-hand-over") as broker:
        await declare_all_work_queues(broker.channel, broker.topology, settings.host_id)
        runner = _runner(settings, pool, broker, redis, launcher=_default_launcher(settings, pool))
        short, long = await _claimed(pool, "true"), await _claimed(pool, "sleep 1")
        for message in (short, long):
            held = await runner.take(message)
            assert held is not None
            await runner.drive(held)
        await runner.background_done()

        key = RedisKeys(namespace).handovers(settings.host_id)
        handed = [decode(body) for body in await redis.lrange(key, 0, -1)]
        await redis.delete(key)
        channel = await broker.channel_for_consuming(prefetch=10)
        queue = await channel.declare_queue(
            broker.topology.supervisor_queue(settings.host_id), passive=True
        )
        through_the_broker = await queue.get(fail=False, no_ack=True)
        await channel.close()
        notes = [await _exit_note(redis, namespace, m) for m in (short, long)]
    await redis.aclose()

    assert [(m.task_id, m.ran_s) for m in handed if isinstance(m, WatchProcess)] == [
        (long.task_id, 0.3)
    ]
    assert len(handed) == 1
    assert through_the_broker is None  # a hand-over between two processes of one host
    assert (await _task(pool, short.task_id))["state"] == "completed"
    # the supervisor watched the long one exit: noted at once; the short one's note was put
    # off, then given up once its exit was reported
    assert notes == [None, f"{long.claim} 0".encode()]
    assert [noting.pending for noting in notings] == [False, False]


def _default_launcher(settings: WorkerSettings, pool: db.Pool) -> launch.Launcher:
    """The launcher a worker of `settings` chooses; with the default settings (as root, as
    here) jobs run confined as their owner's uid, in cgroups where the host has them."""
    cgroups = Cgroups.detect(settings.namespace, settings.cgroup_root)
    launcher = launch.choose(settings).launcher(pool, cgroups)
    assert isinstance(launcher, launch.LocalConfined)  # the default, as root
    return launcher


@pytest.fixture
def signals_dir() -> Iterator[Path]:
    """A new directory the test writes in and confined jobs may read (see `default_runner`)."""
    made = Path(tempfile.mkdtemp(prefix="vigil-signals-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
async def default_runner(
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    passable_dir: Path,
    signals_dir: Path,
) -> AsyncIterator[StageRunner]:
    """A stage runner as a worker runs by default (`_default_launcher`); its jobs see one
    directory of the test's, read-only (`VIGIL_JOB_READ_ONLY_PATHS`: the sealed room shows
    them nothing else of the host's `/tmp` or of the work root but their own work dir)."""
    settings = _settings(
        session_database_url,
        namespace,
        passable_dir,
        default=True,
        job_read_only_paths=str(signals_dir),
    )
    redis = Redis.from_url(REDIS_URL)
    try:
        async with open_broker(AMQP_URL, Topology(namespace), name="test-stages") as broker:
            made = _runner(
                settings, pool, broker, redis, launcher=_default_launcher(settings, pool)
            )
            yield made
            await made.background_done()  # its hand-overs use Redis (see `runner`)
    finally:
        await redis.aclose()


async def test_the_exit_of_a_short_command_whose_report_is_late_is_noted_for_the_supervisor(
    default_runner: StageRunner, pool: db.Pool, namespace: str
) -> None:
    runner = default_runner
    # given: a short command running under its claim (not handed over), confined
    go = runner.settings.read_only_paths()[0] / "go"  # where the job can look
    message, driving = await _running_until(go, runner, pool, exit_code=3)

    # when: it exits while its task's row is held, so that its report waits
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", message.task_id)
        go.touch()
        # then: its exit is noted while the report waits (the supervisor's reconcile may
        # find the task on_cpu with its process gone)
        async with asyncio.timeout(20):
            while await _exit_note(runner.redis, namespace, message) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # (Redis tells no one of a write here)
        assert (await _task(pool, message.task_id))["state"] == "on_cpu"
    await asyncio.wait_for(driving, 20)

    assert await _exit_note(runner.redis, namespace, message) == f"{message.claim} 3".encode()
    assert (await _task(pool, message.task_id))["state"] == "failed_on_cluster"


class _ThreadsSeen(ShellTaskType):
    """The shell type, noting the thread each hook ran in; only `cluster_commands` inline."""

    inline_hooks = frozenset({"cluster_commands"})

    def __init__(self) -> None:
        self.threads: dict[str, int] = {}

    def setup(self, ctx: TaskContext) -> bool:
        self.threads["setup"] = threading.get_ident()
        return super().setup(ctx)

    def cluster_commands(self, ctx: TaskContext) -> str:
        self.threads["cluster_commands"] = threading.get_ident()
        return super().cluster_commands(ctx)


async def test_a_types_inline_hooks_run_on_the_event_loop_and_the_others_in_a_thread(
    runner: StageRunner, pool: db.Pool
) -> None:
    seen = _ThreadsSeen()
    runner.task_types = {"shell": seen}
    message = await _claimed(pool, "true")

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    assert seen.threads["cluster_commands"] == threading.get_ident()
    assert seen.threads["setup"] != threading.get_ident()
    assert (await _task(pool, message.task_id))["state"] == "completed"


# -- a setup's take folded into the on_cpu move -------------------------------------------------


async def _folded(
    runner: StageRunner, pool: db.Pool, command: str, ack: Ack | None = None
) -> tuple[RunStage, Tenure]:
    """Given-step: a task of `command` claimed, and taken by `runner` with its take folded
    (`ack` acks its message)."""
    message = await _claimed(pool, command)
    held = await runner.take(message, ack)
    assert held is not None and held.promised
    return message, held


async def test_a_folded_take_writes_nothing_until_one_move_makes_the_task_on_cpu(
    runner: StageRunner, pool: db.Pool
) -> None:
    states_when_acked: list[str] = []
    task_id = ""

    async def acked() -> None:
        states_when_acked.append((await _task(pool, task_id))["state"])

    message, held = await _folded(runner, pool, "true", acked)
    task_id = message.task_id
    assert (await _task(pool, message.task_id))["state"] == "new"  # nothing written yet

    await runner.drive(held)

    assert states_when_acked == ["on_cpu"]  # once, when the move that took it committed
    task = await _task(pool, message.task_id)
    assert (task["state"], task["claim"], task["host"]) == (
        "completed",
        None,
        runner.settings.host_id,
    )
    assert await _attempts(pool, message.task_id) == [
        ("setup", "queued"),
        ("cluster", "data_ready"),
        ("post_processing", "completed"),
    ]
    assert runner.writer.moves == 2  # take + setup + on_cpu, then the rest to completed
    keys = await pool.fetch(
        "SELECT routing_key FROM outbox WHERE exchange = 'events' AND body->>'task_id' = $1"
        " ORDER BY id",
        message.task_id,
    )
    assert [k["routing_key"].split(".")[1] for k in keys] == [s.value for s in NORMAL_PATH]


async def test_a_folded_take_of_a_task_taken_away_meanwhile_never_runs_its_command(
    runner: StageRunner, pool: db.Pool, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    acks = []

    async def acked() -> None:
        acks.append(True)

    message, held = await _folded(runner, pool, f'touch "{ran}"', acked)
    # cancelled between the take and its move
    await pool.execute(
        "UPDATE tasks SET state = 'terminated', failure_class = 'cancelled', claim = NULL"
        " WHERE id = $1",
        message.task_id,
    )

    await runner.drive(held)

    assert not ran.exists() and acks == [True]  # its message acked as stale, once
    assert (await _task(pool, message.task_id))["state"] == "terminated"
    assert await _attempts(pool, message.task_id) == []


async def test_a_folded_take_of_a_job_suspended_meanwhile_gives_its_claim_back_unstarted(
    runner: StageRunner, pool: db.Pool, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    message, held = await _folded(runner, pool, f'touch "{ran}"')
    await pool.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", message.job_id)

    await runner.drive(held)

    task = await _task(pool, message.task_id)
    assert not ran.exists()
    assert (task["state"], task["claim"]) == ("new", None)  # released again on resume


async def test_with_its_request_not_free_a_setup_is_taken_the_general_way(
    runner: StageRunner, pool: db.Pool
) -> None:
    message = await _claimed(pool, "true")
    others = runner.ledger.hold(runner.ledger.capacity.resources)
    await others.take()
    try:
        held = await runner.take(message)
    finally:
        others.free()

    assert held is not None and not held.promised
    assert (await _task(pool, message.task_id))["state"] == "setting_up"
    await runner.drive(held)
    assert (await _task(pool, message.task_id))["state"] == "completed"


async def test_a_command_whose_request_went_while_it_was_made_ready_waits_durably_queued(
    runner: StageRunner, pool: db.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its request is taken just before the spawn: the work dir, cgroup and confinement are
    # made ready without it, and other commands may take the whole host meanwhile.
    message, held = await _folded(runner, pool, "true")
    others = runner.ledger.hold(runner.ledger.capacity.resources)
    prepare = runner.launcher.prepare

    async def while_others_take_the_whole_host(command: Command) -> Launch:
        await others.take()
        return await prepare(command)

    monkeypatch.setattr(runner.launcher, "prepare", while_others_take_the_whole_host)
    driving = asyncio.ensure_future(runner.drive(held))
    try:
        async with asyncio.timeout(10):
            while (await _task(pool, message.task_id))["state"] != "queued":  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert not driving.done()
    finally:
        others.free()

    async with asyncio.timeout(10):
        await driving
    assert (await _task(pool, message.task_id))["state"] == "completed"
    assert await _attempts(pool, message.task_id) == [
        ("setup", "queued"),
        ("cluster", "data_ready"),
        ("post_processing", "completed"),
    ]
    assert runner.ledger.free == runner.ledger.capacity.resources  # all given back


async def test_a_streams_run_file_is_made_at_its_first_line_only(
    runner: StageRunner, pool: db.Pool, tmp_path: Path
) -> None:
    silent, chatty = await _claimed(pool, "true"), await _claimed(pool, "echo out; echo out2")
    for message in (silent, chatty):
        held = await runner.take(message)
        assert held is not None
        await runner.drive(held)

    def run_files(message: RunStage) -> list[str]:
        found = (tmp_path / message.job_id / message.task_id / ".vigil").glob("run*")
        return sorted(path.name for path in found)

    assert run_files(silent) == []
    assert run_files(chatty) == ["run1.stdout"]
    run_file = tmp_path / chatty.job_id / chatty.task_id / ".vigil" / "run1.stdout"
    assert run_file.read_text() == "out\nout2\n"


async def test_a_run_file_the_job_made_a_link_is_not_followed_and_its_lines_are_kept(
    runner: StageRunner, pool: db.Pool, tmp_path: Path
) -> None:
    target = tmp_path / "not-the-jobs"
    target.write_text("")
    message = await _claimed(pool, f"ln -s {target} .vigil/run1.stdout; echo planted")

    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)

    assert target.read_text() == ""  # nothing written through the link
    assert (await _task(pool, message.task_id))["state"] == "completed"
    line = await pool.fetchval("SELECT line FROM logs WHERE task_id = $1", message.task_id)
    assert line == "planted"
