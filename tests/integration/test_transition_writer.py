"""Group commit of task moves (`TransitionWriter`) against the real PostgreSQL: moves asked for
together share one commit, each caller gets its own outcome, and a bad move fails only its own
caller."""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from services.worker.claims import Taker
from services.worker.tenure import Tenure
from shared.domain import errors
from shared.domain.messages import RunStage
from shared.domain.states import Stage, TaskState
from shared.store import db, jobs_repo, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from shared.store.transition_writer import TransitionWriter

pytestmark = pytest.mark.integration

S = TaskState


async def _held_tasks(pool: db.Pool, count: int) -> list[tasks_repo.Task]:
    """Given-step: a job of `count` tasks, each resting in `on_cpu` under a claim of its own."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(
            conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
        )
        inputs = [f"in-{i}" for i in range(count)]
        job, _ = await jobs_repo.create(conn, user.id, NewJob("demo", "shell", "true", inputs))
        await conn.execute(
            "UPDATE tasks SET state = 'on_cpu', claim = gen_random_uuid(), host = 'h-1',"
            " worker = 'w-1' WHERE job_id = $1",
            job.id,
        )
        return await tasks_repo.list_for_job(conn, job.id)


def _finish(task: tasks_repo.Task, **changes: object) -> tasks_repo.Advance:
    assert task.claim is not None
    steps = tasks_repo.Steps((S.ON_CPU, S.DATA_READY), changes=dict(changes) or None)
    return steps.of(task, task.claim)


async def _states(pool: db.Pool, tasks: list[tasks_repo.Task]) -> list[TaskState]:
    rows = await pool.fetch(
        "SELECT state FROM tasks WHERE id = ANY($1::text[]) ORDER BY index",
        [t.id for t in tasks],
    )
    return [TaskState(r["state"]) for r in rows]


async def _event_count(pool: db.Pool, tasks: list[tasks_repo.Task]) -> int:
    count = await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE body->>'task_id' = ANY($1::text[])"
        " AND body->>'state' = 'data_ready'",
        [t.id for t in tasks],
    )
    return int(count)


async def test_moves_asked_for_together_share_one_commit_and_each_caller_gets_its_task(
    pool: db.Pool,
) -> None:
    tasks = await _held_tasks(pool, 5)
    writer = TransitionWriter(pool)

    moved = await asyncio.gather(*(writer.advance(_finish(t)) for t in tasks))

    assert [m.id if m else None for m in moved] == [t.id for t in tasks]
    assert all(m is not None and m.state is S.DATA_READY for m in moved)
    assert (writer.commits, writer.moves) == (1, 5)
    assert await _states(pool, tasks) == [S.DATA_READY] * 5
    assert await _event_count(pool, tasks) == 5


async def test_a_batch_of_moves_of_several_shapes_answers_each_caller_with_its_own_task(
    pool: db.Pool,
) -> None:
    tasks = await _held_tasks(pool, 6)
    writer = TransitionWriter(pool)
    # three shapes (query texts), interleaved: the moves of each are sent together
    moves = [
        _finish(t, exit_code=i)
        if i % 3 == 1
        else _finish(t, error_brief=f"b{i}")
        if i % 3 == 2
        else _finish(t)
        for i, t in enumerate(tasks)
    ]
    assert len({move.statement()[0] for move in moves}) == 3

    moved = await asyncio.gather(*(writer.advance(m) for m in moves))

    assert writer.commits == 1
    assert [m.id if m else None for m in moved] == [t.id for t in tasks]
    assert [m.exit_code if m else None for m in moved] == [None, 1, None, None, 4, None]
    assert [m.error_brief if m else None for m in moved] == [None, None, "b2", None, None, "b5"]
    assert await _states(pool, tasks) == [S.DATA_READY] * 6


async def test_a_batch_larger_than_the_cap_is_committed_in_several(pool: db.Pool) -> None:
    tasks = await _held_tasks(pool, 5)
    writer = TransitionWriter(pool, max_batch=2)

    moved = await asyncio.gather(*(writer.advance(_finish(t)) for t in tasks))

    assert all(m is not None for m in moved)
    assert (writer.commits, writer.moves) == (3, 5)


@contextlib.asynccontextmanager
async def _row_locked(pool: db.Pool, task: tasks_repo.Task) -> AsyncIterator[None]:
    """Given-step: another transaction holds `task`'s row, so a move of it waits."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", task.id)
        yield


async def test_a_move_asked_for_while_a_batch_waits_is_committed_beside_it(
    pool: db.Pool,
) -> None:
    slow, quick = await _held_tasks(pool, 2)
    writer = TransitionWriter(pool, max_commits=2)

    async with _row_locked(pool, slow):
        waiting = asyncio.ensure_future(writer.advance(_finish(slow)))
        await _until(lambda: writer.commits == 1)  # its batch is under way, and waits
        async with asyncio.timeout(10):
            moved = await writer.advance(_finish(quick))
        assert moved is not None and moved.state is S.DATA_READY
        assert not waiting.done()
    assert (await waiting) is not None
    assert (writer.commits, writer.moves) == (2, 2)


async def test_with_every_commit_under_way_the_moves_asked_for_go_together_into_the_next(
    pool: db.Pool,
) -> None:
    slow, *others = await _held_tasks(pool, 3)
    writer = TransitionWriter(pool, max_commits=1)

    async with _row_locked(pool, slow):
        waiting = asyncio.ensure_future(writer.advance(_finish(slow)))
        await _until(lambda: writer.commits == 1)
        later = asyncio.gather(*(writer.advance(_finish(t)) for t in others))
        await _until(lambda: writer.waiting == 2)
    moved = await asyncio.gather(waiting, later)

    assert moved[0] is not None and all(m is not None for m in moved[1])
    assert (writer.commits, writer.moves) == (2, 3)
    assert await _states(pool, [slow, *others]) == [S.DATA_READY] * 3


async def test_a_move_whose_guard_misses_gets_none_and_the_others_of_its_batch_go_through(
    pool: db.Pool,
) -> None:
    tasks = await _held_tasks(pool, 3)
    writer = TransitionWriter(pool)
    stale = tasks_repo.Steps((S.ON_CPU, S.DATA_READY)).of(tasks[1], uuid.uuid4())  # another claim's

    moved = await asyncio.gather(
        writer.advance(_finish(tasks[0])), writer.advance(stale), writer.advance(_finish(tasks[2]))
    )

    assert [m is not None for m in moved] == [True, False, True]
    assert writer.commits == 1
    assert await _states(pool, tasks) == [S.DATA_READY, S.ON_CPU, S.DATA_READY]
    assert await _event_count(pool, tasks) == 2


async def test_a_move_that_fails_its_batch_fails_only_its_own_caller(pool: db.Pool) -> None:
    tasks = await _held_tasks(pool, 3)
    writer = TransitionWriter(pool)
    broken = _finish(tasks[1], exit_code=2**40)  # out of range for the integer column

    moved = await asyncio.gather(
        writer.advance(_finish(tasks[0])),
        writer.advance(broken),
        writer.advance(_finish(tasks[2])),
        return_exceptions=True,
    )

    assert isinstance(moved[1], (asyncpg.DataError, OverflowError))
    assert [isinstance(m, tasks_repo.Task) for m in (moved[0], moved[2])] == [True, True]
    assert await _states(pool, tasks) == [S.DATA_READY, S.ON_CPU, S.DATA_READY]
    assert await _event_count(pool, tasks) == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"exit_code": 2**40},  # refused by the client: out of range for the integer column
        {"error_brief": "a NUL \x00 in text"},  # refused by the server
    ],
)
async def test_a_move_that_fails_a_batch_of_one_shape_fails_only_its_own_caller(
    pool: db.Pool, bad: dict[str, object]
) -> None:
    # A batch of one shape is one round trip with no transaction of its own: its statements
    # must still land all or none, or the others would be made twice (and miss).
    # (the failing move is the last in task id order: the batch sends the others first)
    tasks = sorted(await _held_tasks(pool, 3), key=lambda task: task.id)
    writer = TransitionWriter(pool)
    good = {"exit_code": 0, "error_brief": "x"}
    shape = {name: good.get(name) for name in bad}

    moved = await asyncio.gather(
        writer.advance(_finish(tasks[0], **shape)),
        writer.advance(_finish(tasks[1], **shape)),
        writer.advance(_finish(tasks[2], **bad)),
        return_exceptions=True,
    )

    assert isinstance(moved[2], (asyncpg.DataError, OverflowError))
    assert [isinstance(m, tasks_repo.Task) for m in moved[:2]] == [True, True]
    states = [await pool.fetchval("SELECT state FROM tasks WHERE id = $1", t.id) for t in tasks]
    assert states == ["data_ready", "data_ready", "on_cpu"]
    assert await _event_count(pool, tasks) == 2
    assert writer.commits == 1  # one batch (then each alone)


async def test_moves_done_again_after_a_lost_reply_write_nothing_twice(pool: db.Pool) -> None:
    # A worker that crashed between the commit and acting on its reply finds, on trying the
    # same moves again, that they are done: the guards miss and nothing is written twice.
    tasks = await _held_tasks(pool, 3)
    writer = TransitionWriter(pool)
    moves = [_finish(t) for t in tasks]
    await asyncio.gather(*(writer.advance(m) for m in moves))

    again = await asyncio.gather(*(TransitionWriter(pool).advance(m) for m in moves))

    assert again == [None, None, None]
    assert await _event_count(pool, tasks) == 3


async def test_a_caller_that_stops_waiting_leaves_the_batch_whole(pool: db.Pool) -> None:
    tasks = await _held_tasks(pool, 2)
    writer = TransitionWriter(pool)
    impatient = asyncio.create_task(writer.advance(_finish(tasks[0])))
    patient = asyncio.create_task(writer.advance(_finish(tasks[1])))
    await asyncio.sleep(0)  # both queued
    impatient.cancel()

    assert (await patient) is not None
    with pytest.raises(asyncio.CancelledError):
        await impatient
    assert await _states(pool, tasks) == [S.DATA_READY, S.DATA_READY]


async def test_more_takes_at_once_than_the_pool_has_connections_all_go_through(
    session_database_url: str, tmp_path: Path
) -> None:
    # A take that held its read connection while its move waited for the writer's commit
    # (which needs a connection of its own) hung the worker once as many takes as the pool's
    # size were under way: 32 slots on a pool of 20.
    async with db.open_pool(session_database_url, max_size=2) as small:
        async with small.acquire() as conn:
            user = await users_repo.ensure_user(
                conn, f"user-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
            )
            job, _ = await jobs_repo.create(
                conn, user.id, NewJob("demo", "shell", "true", [str(i) for i in range(6)])
            )
            await conn.execute(
                "UPDATE tasks SET claim = gen_random_uuid() WHERE job_id = $1", job.id
            )
            tasks = await tasks_repo.list_for_job(conn, job.id)
        taker = Taker(small, "w-1", "h-1", tmp_path, TransitionWriter(small))
        messages = [
            RunStage(job_id=job.id, task_id=t.id, stage=Stage.SETUP, claim=t.claim)
            for t in tasks
            if t.claim is not None
        ]

        async with asyncio.timeout(30):
            held = await asyncio.gather(*(Tenure.taking(taker, m) for m in messages))

        assert [h.state if h else None for h in held] == [S.SETTING_UP] * 6


async def test_after_quiet_moves_a_writer_nudges_the_relay_at_most_once_a_period(
    pool: db.Pool,
) -> None:
    tasks = await _held_tasks(pool, 3)
    writer = TransitionWriter(pool, nudge_every_s=600, nudge_delay_s=0.0)
    assert tasks[2].claim is not None
    ended = tasks_repo.Steps((S.ON_CPU, S.DATA_READY, S.POST_PROCESSING, S.COMPLETED)).of(
        tasks[2], tasks[2].claim
    )
    async with _notifications(pool) as payloads:
        # when: two moves whose events notify nobody, then one that ends its task
        await writer.advance(_finish(tasks[0]))
        await writer.advance(_finish(tasks[1]))
        await writer.advance(ended)
        async with asyncio.timeout(5):
            got = [await payloads.get(), await payloads.get()]

    # then: the first quiet move nudged the relay (after its delay), the second was within
    # the period, and the last one's event notified by itself (the trigger: a task's end
    # names its job, for the relay and the round's finaliser, migration 0030)
    assert sorted(map(str, got)) == [f"ended {tasks[2].job_id}", "relay"]
    assert payloads.empty() and writer.nudges == 1


class _Cable:
    """A TCP relay to PostgreSQL that can be cut (every connection dropped, new ones refused,
    as while the server restarts) and mended."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.is_cut = False
        self._writers: set[asyncio.StreamWriter] = set()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.is_cut:
            client_w.close()
            return
        server_r, server_w = await asyncio.open_connection(*self.target)
        self._writers |= {client_w, server_w}

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))
        self._writers -= {client_w, server_w}

    def cut(self) -> None:
        self.is_cut = True
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    def mend(self) -> None:
        self.is_cut = False


@pytest.fixture
async def cable(session_database_url: str) -> AsyncIterator[tuple[_Cable, str]]:
    parts = urlsplit(session_database_url)
    relay = _Cable((parts.hostname or "127.0.0.1", parts.port or 5432))
    server = await asyncio.start_server(relay._relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    async with server:
        yield relay, urlunsplit(parts._replace(netloc=netloc))
        relay.cut()


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():  # noqa: ASYNC110  (the writer has no event to wait on)
            await asyncio.sleep(0.01)


async def test_moves_under_way_while_the_database_restarts_wait_for_it_and_land_once(
    pool: db.Pool, cable: tuple[_Cable, str]
) -> None:
    relay, url = cable
    tasks = await _held_tasks(pool, 3)
    async with db.open_pool(url, max_size=2) as through:
        writer = TransitionWriter(through, ride_out_s=30)
        await writer.advance(_finish(tasks[0]))  # the pool holds a live connection

        # when: the database goes away while two moves are asked for
        relay.cut()
        moving = asyncio.gather(*(writer.advance(_finish(t)) for t in tasks[1:]))
        await _until(lambda: writer.commits >= 2)
        assert not moving.done()

        # then: once it is back, both land, once each
        relay.mend()
        moved = await moving

    assert all(m is not None and m.state is S.DATA_READY for m in moved)
    assert writer.ridden_out == 2
    assert await _states(pool, tasks) == [S.DATA_READY] * 3
    assert await _event_count(pool, tasks) == 3


async def test_a_database_away_longer_than_the_ride_out_fails_the_callers(
    pool: db.Pool, cable: tuple[_Cable, str]
) -> None:
    relay, url = cable
    [task] = await _held_tasks(pool, 1)
    async with db.open_pool(url, max_size=1) as through:
        writer = TransitionWriter(through, ride_out_s=0.3)
        relay.cut()

        with pytest.raises((OSError, asyncpg.InterfaceError, *errors.CONNECTION_LOST)):
            await writer.advance(_finish(task))
        relay.mend()

    assert await _states(pool, [task]) == [S.ON_CPU]


async def test_a_move_made_again_after_its_reply_was_lost_finds_it_landed(pool: db.Pool) -> None:
    tasks = await _held_tasks(pool, 2)
    landed, elsewhere = _finish(tasks[0]), _finish(tasks[1])
    async with pool.acquire() as conn:
        await landed.apply(conn)  # committed; its caller never heard
        await conn.execute(  # another worker's claim took the other task meanwhile
            "UPDATE tasks SET claim = gen_random_uuid(), state = 'data_ready' WHERE id = $1",
            tasks[1].id,
        )

        again = await landed.again(conn)
        stale = await elsewhere.again(conn)

    assert again is not None and again.state is S.DATA_READY and again.claim == tasks[0].claim
    assert stale is None
    assert await _event_count(pool, tasks[:1]) == 1


async def test_a_writer_given_a_nudger_nudges_through_it_not_postgresql(pool: db.Pool) -> None:
    tasks = await _held_tasks(pool, 1)
    sent = asyncio.Event()

    async def nudger() -> None:
        sent.set()

    writer = TransitionWriter(pool, nudge_every_s=600, nudge_delay_s=0.0, nudger=nudger)
    async with _notifications(pool) as payloads:
        # when a move whose events notify nobody commits
        await writer.advance(_finish(tasks[0]))
        async with asyncio.timeout(5):
            await sent.wait()

    # then the nudge went through the nudger, and PostgreSQL was told nothing
    assert writer.nudges == 1 and payloads.empty()


@contextlib.asynccontextmanager
async def _notifications(pool: db.Pool) -> AsyncIterator[asyncio.Queue[object]]:
    """The payloads of `vigil_outbox` notifications while in the block, and of those sent
    before it ended."""
    payloads: asyncio.Queue[object] = asyncio.Queue()

    def heard(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        payloads.put_nowait(payload)

    async with pool.acquire() as listener:
        await listener.add_listener("vigil_outbox", heard)
        yield payloads
        await listener.execute("SELECT 1")  # anything sent before is read by now
        await listener.remove_listener("vigil_outbox", heard)
