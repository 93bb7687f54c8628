"""The transactional outbox: ordered pending rows, SKIP LOCKED relays, pruning, and NOTIFY.

These tests need an outbox nobody else writes to, so the module works in a database of its own
and empties the outbox before each test.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from shared.domain.actions import JobAction, TaskAction
from shared.domain.messages import JobEvent, JobOutcome, RunStage, TaskEvent, to_jsonable
from shared.domain.states import QUIET, TERMINAL, Stage, TaskState
from shared.messaging.topology import host_key
from shared.operations import datasets, task_actions
from shared.store import db, jobs_repo, outbox, tasks_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def outbox_database_url() -> Iterator[str]:
    """A migrated database for this module only."""
    with fresh_database("vigil_outbox") as url:
        yield url


@pytest.fixture
async def opool(outbox_database_url: str) -> AsyncIterator[db.Pool]:
    """A pool on the module's database, with an empty outbox."""
    async with db.open_pool(outbox_database_url, max_size=4) as pool:
        await pool.execute("TRUNCATE outbox, events RESTART IDENTITY")
        await pool.execute("UPDATE event_positions SET last_given = 0, pruned_through = 0")
        yield pool


def _written(event: TaskEvent | JobEvent) -> dict[str, Any]:
    """The body its writer gives an event: all but its id and time."""
    body = to_jsonable(event)
    del body["message_id"], body["sent_at"]
    return body


def _task_event(state: TaskState = TaskState.NEW) -> TaskEvent:
    return TaskEvent(job_id="j-1", task_id=f"t-{uuid.uuid4().hex[:8]}", state=state)


@asynccontextmanager
async def _payloads(listener: db.Connection) -> AsyncIterator["asyncio.Queue[object]"]:
    """The payloads of the `vigil_outbox` notifications `listener` receives meanwhile."""
    received: asyncio.Queue[object] = asyncio.Queue()

    def on_notify(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        received.put_nowait(payload)

    await listener.add_listener("vigil_outbox", on_notify)
    try:
        yield received
    finally:
        await listener.remove_listener("vigil_outbox", on_notify)


async def _add_rows(conn: db.Connection, count: int) -> None:
    async with conn.transaction():
        for _ in range(count):
            await outbox.add_task_event(conn, _task_event())


async def test_when_messages_are_added__pending_gives_them_back_in_order_with_their_keys(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as conn:
        # given
        task_event = _task_event(TaskState.ON_CPU)
        job_event = JobEvent(job_id="j-1", outcome=JobOutcome.FAILED, brief="job failed")
        work = RunStage(job_id="j-1", task_id="t-1", stage=Stage.CLUSTER, claim=uuid.uuid4())
        async with conn.transaction():
            await outbox.add_task_event(conn, task_event)
            await outbox.add_job_event(conn, job_event)
            await outbox.add_work(conn, host_key("h-1"), work)
        # when
        async with conn.transaction():
            rows = await outbox.pending(conn, limit=10)
        # then (an event's id and time are PostgreSQL's, made as it was written)
        expected: list[tuple[str, str, dict[str, Any]]] = [
            ("events", "task.on_cpu.j-1", _written(task_event) | {"seq": 1}),
            ("events", "job.failed.j-1", _written(job_event) | {"seq": 2}),
            ("work", "host.h-1", to_jsonable(work)),
        ]
        bodies = [json.loads(r.body) for r in rows]
        for body in bodies[:2]:
            del body["message_id"], body["sent_at"]
        assert [(r.exchange, r.routing_key, b) for r, b in zip(rows, bodies, strict=True)] == (
            expected
        )
        assert [r.id for r in rows] == sorted(r.id for r in rows)
        assert [r.seq for r in rows] == [1, 2, None]


async def test_a_work_message_is_read_with_the_first_batch_whatever_events_came_before_it(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as conn:
        # given five events, then a work message, then two more events
        await _add_rows(conn, 5)
        work = RunStage(job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4())
        await outbox.add_work(conn, host_key("h-1"), work)
        await _add_rows(conn, 2)
        # when a batch of two is read, then the rest once those are confirmed
        first = await outbox.pending(conn, limit=2)
        rest = await outbox.pending(conn, limit=10, confirmed=[r.id for r in first])
        # then the work message goes with the first batch (the oldest of its kind), after the
        # two oldest events, and the events keep their order and positions
        assert [(r.id, r.exchange, r.seq) for r in first] == [
            (1, "events", 1),
            (2, "events", 2),
            (6, "work", None),
        ]
        assert [(r.id, r.seq) for r in rest] == [(3, 3), (4, 4), (5, 5), (7, 6), (8, 7)]


async def _outbox_entries_read(conn: db.Connection) -> int:
    """Index entries of the outbox read so far (this session's counts flushed first)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'outbox'"
        )
    )


async def test_a_batch_reads_its_rows_by_their_ids_whatever_the_statistics_say(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as conn:
        # given an outbox vacuumed when its rows were all gone (as the relay's own vacuum
        # finds it after a burst: pages, but no rows, say its statistics), then 5,000 events
        insert = (
            "INSERT INTO outbox (exchange, routing_key, body)"
            " SELECT 'events', 'task.new.j-1', jsonb_build_object('n', n)"
            " FROM generate_series(1, 5000) n"
        )
        await conn.execute(insert)
        await conn.execute("DELETE FROM outbox")
        await outbox.vacuum(conn)
        await conn.execute(insert)
        before = await _outbox_entries_read(conn)
        # when a batch of ten is read (and numbered)
        rows = await outbox.pending(conn, limit=10)
        # then it read about that many entries, not the whole outbox for each one
        read = await _outbox_entries_read(conn) - before
        assert [r.seq for r in rows] == list(range(1, 11))
        assert read < 100, f"{read} outbox index entries read for a batch of 10"


async def test_when_confirmed_rows_are_deleted__pending_keeps_the_rest_in_order(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as conn:
        # given
        await _add_rows(conn, 5)
        async with conn.transaction():
            first_two = await outbox.pending(conn, limit=2)
            # when
            await outbox.delete_confirmed(conn, [r.id for r in first_two])
        # then
        async with conn.transaction():
            rest = await outbox.pending(conn, limit=10)
        assert [r.id for r in first_two] == [1, 2]
        assert [r.id for r in rest] == [3, 4, 5]
        assert await conn.fetchval("SELECT array_agg(id ORDER BY id) FROM outbox") == [3, 4, 5]


async def test_a_read_that_deletes_the_last_batch_returns_the_next_one(opool: db.Pool) -> None:
    async with opool.acquire() as conn:
        # given five rows, the first two published
        await _add_rows(conn, 5)
        first_two = await outbox.pending(conn, limit=2)
        # when the next read carries their confirms
        rest = await outbox.pending(conn, limit=10, confirmed=[r.id for r in first_two])
        # then it reads the others, and the two are gone from the outbox
        assert [r.id for r in rest] == [3, 4, 5]
        assert await conn.fetchval("SELECT array_agg(id ORDER BY id) FROM outbox") == [3, 4, 5]


async def test_when_a_relay_rolls_back__its_rows_are_pending_again(opool: db.Pool) -> None:
    async with opool.acquire() as conn:
        await _add_rows(conn, 2)
        transaction = conn.transaction()
        await transaction.start()
        taken = await outbox.pending(conn, limit=10)
        await outbox.delete_confirmed(conn, [r.id for r in taken])
        await transaction.rollback()
        async with conn.transaction():
            again = await outbox.pending(conn, limit=10)
        assert [r.id for r in again] == [r.id for r in taken] == [1, 2]


async def test_when_a_row_is_committed__listeners_on_vigil_outbox_are_notified(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as listener, opool.acquire() as writer:
        # given
        notified = asyncio.Event()
        channels: list[str] = []

        def on_notify(_conn: object, _pid: int, channel: str, _payload: object) -> None:
            channels.append(channel)
            notified.set()

        await listener.add_listener("vigil_outbox", on_notify)
        try:
            # when
            async with writer.transaction():
                await outbox.add_task_event(writer, _task_event())
            # then
            async with asyncio.timeout(5):
                await notified.wait()
        finally:
            await listener.remove_listener("vigil_outbox", on_notify)
        assert channels == ["vigil_outbox"]


async def test_the_events_of_a_tasks_normal_path_notify_nobody_but_the_rest_do(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as listener, opool.acquire() as writer:
        async with _payloads(listener) as notified:
            # when the worker's in-path events commit, then one the round acts on
            for state in (TaskState.SETTING_UP, TaskState.ON_CPU, TaskState.POST_PROCESSING):
                await outbox.add_task_event(writer, _task_event(state))
            await outbox.add_task_event(writer, _task_event(TaskState.RECOVER_CLUSTER))
            # then exactly one notification came, and it came for the last one
            async with asyncio.timeout(5):
                assert await notified.get() == "round"
            await listener.execute("SELECT 1")  # any notification sent before is read by now
        assert notified.empty()


async def test_the_notification_says_whether_only_the_relay_has_something_to_do(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as listener, opool.acquire() as writer:
        async with _payloads(listener) as payloads:
            message = RunStage(job_id="j-1", task_id="t-1", stage=Stage.SETUP, claim=uuid.uuid4())
            await outbox.add_work(writer, "pool.default", message)
            await outbox.add_job_event(writer, JobEvent(job_id="j-1", outcome=JobOutcome.SUCCEEDED))
            await outbox.add_task_event(writer, _task_event(TaskState.FAILED_ON_CLUSTER))
            await outbox.add_task_event(writer, _task_event(TaskState.RESTART_CLUSTER))
            async with asyncio.timeout(5):
                got = [await payloads.get() for _ in range(4)]
        # a task's end names its job, for the round's finaliser (0030)
        assert got == ["relay", "relay", "ended j-1", "round"]


async def test_the_ends_of_tasks_name_each_of_their_jobs_once_two_hundred_to_a_notification(
    opool: db.Pool,
) -> None:
    jobs = [f"j-{n:04d}" for n in range(450)]
    async with opool.acquire() as listener, opool.acquire() as writer:
        async with _payloads(listener) as payloads:
            # when: one statement ends two tasks of every job, and moves others on the way
            await writer.execute(
                "INSERT INTO outbox (exchange, routing_key, body)"
                " SELECT 'events', 'task.' || s || '.' || j, '{}'::jsonb"
                " FROM unnest($1::text[]) AS j, unnest($2::text[]) AS s",
                jobs,
                ["completed", "failed_on_cluster", "on_cpu"],
            )
            # then
            async with asyncio.timeout(5):
                got = [str(await payloads.get()) for _ in range(3)]
            await listener.execute("SELECT 1")  # any notification sent before is read by now
        assert payloads.empty()
        assert all(payload.startswith("ended ") for payload in got)
        named = [payload.removeprefix("ended ").split(",") for payload in got]
        assert sorted(len(ids) for ids in named) == [50, 200, 200]
        assert sorted(job_id for ids in named for job_id in ids) == jobs


async def test_when_a_row_is_rolled_back__no_notification_is_sent(opool: db.Pool) -> None:
    async with opool.acquire() as listener, opool.acquire() as writer:
        # given
        notifications: list[str] = []
        committed = asyncio.Event()

        def on_notify(_conn: object, _pid: int, channel: str, _payload: object) -> None:
            notifications.append(channel)
            committed.set()

        await listener.add_listener("vigil_outbox", on_notify)
        try:
            # when: one insert rolls back, then one commits
            transaction = writer.transaction()
            await transaction.start()
            await outbox.add_task_event(writer, _task_event())
            await transaction.rollback()
            async with writer.transaction():
                await outbox.add_task_event(writer, _task_event())
            # then: notifications arrive in commit order, so only the committed one came
            async with asyncio.timeout(5):
                await committed.wait()
        finally:
            await listener.remove_listener("vigil_outbox", on_notify)
        assert notifications == ["vigil_outbox"]


async def test_the_task_new_events_made_in_sql_read_as_the_model_would_have_written_them(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as conn:
        await conn.execute(outbox.new_task_events("$1", "$2"), "j-sqlmade", ["t-1", "t-2"])
        rows = await conn.fetch(
            "SELECT routing_key, body FROM outbox WHERE body->>'job_id' = 'j-sqlmade' ORDER BY id"
        )

    events = [TaskEvent.model_validate(r["body"]) for r in rows]
    assert [r["routing_key"] for r in rows] == ["task.new.j-sqlmade"] * 2
    assert [e.task_id for e in events] == ["t-1", "t-2"]
    model = to_jsonable(_task_event())
    for row, event in zip(rows, events, strict=True):
        assert set(row["body"]) == set(model)  # the same fields, no more, no fewer
        assert event == TaskEvent(
            job_id="j-sqlmade",
            task_id=event.task_id,
            state=TaskState.NEW,
            message_id=event.message_id,
            sent_at=event.sent_at,
        )


async def _quiet(listener: db.Connection, notified: "asyncio.Queue[object]") -> None:
    """Drop what was notified so far (a notification sent before is read by the round trip)."""
    await listener.execute("SELECT 1")
    while not notified.empty():
        notified.get_nowait()


async def test_changes_that_make_tasks_releasable_without_an_event_wake_the_round(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as listener, opool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("j", "shell", "true", ["a"]))
        async with _payloads(listener) as notified:
            for action, changes in [
                (JobAction.SUSPEND, False),  # nothing to release: nobody woken
                (JobAction.RESUME, True),
                (JobAction.THROTTLE, True),
            ]:
                await _quiet(listener, notified)
                await task_actions.apply_to_job(conn, job.id, action, "ops", max_in_flight=3)
                await listener.execute("SELECT 1")
                payloads = [notified.get_nowait() for _ in range(notified.qsize())]
                assert payloads == (["round"] if changes else []), action
            # a claim given back by a worker
            [task_id] = await datasets.upstream_task_ids(conn, job.id)
            claim = uuid.uuid4()
            await conn.execute("UPDATE tasks SET claim = $2 WHERE id = $1", task_id, claim)
            await _quiet(listener, notified)
            task = await tasks_repo.get(conn, task_id)
            assert task is not None
            await tasks_repo.give_back(conn, task.id, claim, TaskState.NEW)  # `Tenure.release`
            async with asyncio.timeout(5):
                assert await notified.get() == "round"
        assert await conn.fetchval("SELECT claim FROM tasks WHERE id = $1", task_id) is None


async def test_quiet_states_notify_nobody_new_tasks_the_relay_and_ended_ones_name_their_job(
    opool: db.Pool,
) -> None:
    async with (
        opool.acquire() as listener,
        opool.acquire() as writer,
        _payloads(listener) as notified,
    ):
        for state in TaskState:
            # when
            await outbox.add_task_event(writer, _task_event(state))
            await listener.execute("SELECT 1")  # a notification sent is read by now
            # then
            payloads = [notified.get_nowait() for _ in range(notified.qsize())]
            expected = (
                ["ended j-1"]
                if state in TERMINAL
                else ["relay"]
                if state is TaskState.NEW
                else []
                if state in QUIET
                else ["round"]
            )
            assert payloads == expected, state


async def test_new_tasks_wake_the_round_unless_their_adder_releases_them_itself(
    opool: db.Pool,
) -> None:
    async with opool.acquire() as listener, opool.acquire() as writer:
        user = await users_repo.ensure_user(writer, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        for wake_round, expected in ((True, {"round", "relay"}), (False, {"relay"})):
            async with _payloads(listener) as notified:
                # when a job's tasks are added, with their task.new events
                await jobs_repo.create(
                    writer, user.id, NewJob("n", "shell", "true", ["a", "b"]), wake_round=wake_round
                )
                await listener.execute("SELECT 1")  # a notification sent is read by now
                # then the relay is woken for the events, and the round unless told not to
                assert {notified.get_nowait() for _ in range(notified.qsize())} == expected


async def test_a_recovery_into_a_quiet_state_wakes_the_round(opool: db.Pool) -> None:
    async with opool.acquire() as listener, opool.acquire() as conn:
        # given: a task failed on its post-processing prerequisites (recovered to data_ready,
        # whose event notifies nobody, and releasable at once)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(conn, user.id, NewJob("j", "shell", "true", ["a"]))
        [task_id] = await datasets.upstream_task_ids(conn, job.id)
        await conn.execute(
            "UPDATE tasks SET state = 'failed_post_processing_prerequisites', host = 'h-1'"
            " WHERE id = $1",
            task_id,
        )
        async with _payloads(listener) as notified:
            await _quiet(listener, notified)

            # when
            moved = await task_actions.apply_to_task(conn, task_id, TaskAction.RECOVER, "ops")

            # then
            assert moved.task.state is TaskState.DATA_READY
            async with asyncio.timeout(5):
                assert await notified.get() == "round"
