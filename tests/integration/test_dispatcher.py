"""The dispatcher on the real PostgreSQL: what it places, where, and why the rest waits (see
also tests/e2e/test_shared_pool.py). Each test starts from a database where nothing
waits and no host is known, then registers the hosts it needs."""

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.scheduler.dispatcher import Dispatcher
from shared.domain.messages import RunStage, to_jsonable
from shared.domain.scheduling.model import Settings
from shared.domain.states import Stage
from shared.operations import configuring, emergency
from shared.operations.configuring import TrialInput
from shared.store import db, jobs_repo, plan_repo, pool_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob
from tests.conftest import fresh_database

pytestmark = pytest.mark.integration

POOL = "default"


@pytest.fixture(scope="module")
def dispatcher_database_url() -> Iterator[str]:
    with fresh_database("vigil_dispatcher") as url:
        yield url


@pytest.fixture
async def pool(dispatcher_database_url: str) -> AsyncIterator[Pool]:
    """A database of its own where nothing waits to be released and no host is known."""
    async with db.open_pool(dispatcher_database_url, max_size=2) as pool:
        await pool.execute("UPDATE tasks SET claim = NULL, state = 'completed'")
        await pool.execute("DELETE FROM hosts")
        await pool.execute("DELETE FROM job_waits")
        yield pool


async def _host(
    conn: Connection, cpus: float = 64, memory_mb: int = 0, gpus: tuple[str, ...] = ()
) -> str:
    """Given-step: a live host of the pool with this capacity (its worker heartbeats now)."""
    host_id = f"h-{uuid.uuid4().hex[:8]}"
    await conn.execute(
        "INSERT INTO hosts (id, slots, worker, pool, capacity_millicpus, capacity_memory_mb,"
        " gpu_ids) VALUES ($1, 1, 'w-' || $1, $2, $3, $4, $5)",
        host_id,
        POOL,
        round(cpus * 1000),
        memory_mb,
        list(gpus),
    )
    return host_id


async def _submitted(
    conn: Connection, new: NewJob, owner: str | None = None, cpus: float = 1, gpus: int = 0
) -> jobs_repo.Job:
    """Given-step: `new`, submitted by `owner` (a fresh user if None), asking `cpus`, `gpus`."""
    if owner is None:
        owner = (await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")).id
    job, _ = await jobs_repo.create(conn, owner, new)
    await conn.execute(
        "UPDATE jobs SET req_millicpus = $2, req_gpus = $3 WHERE id = $1",
        job.id,
        round(cpus * 1000),
        gpus,
    )
    return job


async def _claimed(conn: Connection, job_id: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE job_id = $1 AND claim IS NOT NULL", job_id
        )
    )


async def _end_one(conn: Connection, job_id: str) -> None:
    """One of the job's claimed tasks ends (its command exited and it completed)."""
    await conn.execute(
        "UPDATE tasks SET state = 'completed', claim = NULL WHERE id = (SELECT id FROM tasks"
        " WHERE job_id = $1 AND claim IS NOT NULL ORDER BY index LIMIT 1)",
        job_id,
    )


async def _wait(conn: Connection, job_id: str) -> tuple[str, str] | None:
    row = await conn.fetchrow("SELECT reason, message FROM job_waits WHERE job_id = $1", job_id)
    return None if row is None else (row["reason"], row["message"])


def _dispatcher(pool: Pool, per_user: int | None = None) -> Dispatcher:
    return Dispatcher(pool, 10_000, POOL, per_user, policy=Settings())


async def test_a_configuring_jobs_test_task_waits_out_an_emergency_stop(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a test task of a configuring job, a host, and an emergency stop in force
        await _host(conn)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        new = NewJob("trial", "shell", "true", ["a"], configuring=True)
        job, _ = await jobs_repo.create(conn, user.id, new)
        test = await configuring.start_test(conn, job.id, TrialInput())
        await emergency.stop(conn, "op", "dispatcher test")
        try:
            # when the dispatcher runs, the test task is not released
            await dispatcher.run_once()
            held = await conn.fetchval("SELECT claim FROM tasks WHERE id = $1", test.id)
        finally:
            await emergency.resume(conn, "op")

        # then once the stop is lifted it is
        await dispatcher.run_once()
        released = await conn.fetchval("SELECT claim FROM tasks WHERE id = $1", test.id)
    assert held is None
    assert released is not None


async def test_a_job_throttled_at_submission_never_has_more_in_flight(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        await _host(conn)
        new = NewJob("licensed", "shell", "true", list("abcdef"), max_in_flight=2)
        job = await _submitted(conn, new)

        in_flight = []
        for _ in range(3):  # rounds with nothing finishing in between
            await dispatcher.run_once()
            in_flight.append(await _claimed(conn, job.id))
        waits = await _wait(conn, job.id)

    assert in_flight == [2, 2, 2]
    assert waits is not None and waits[0] == "throttled"


async def test_a_probing_job_has_one_task_in_flight_at_a_time_whatever_its_limit(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        await _host(conn)
        job = await _submitted(conn, NewJob("probed", "shell", "true", list("abcd")))
        await conn.execute("UPDATE jobs SET probing_since = now() WHERE id = $1", job.id)

        in_flight = []
        for _ in range(3):  # rounds with nothing finishing in between
            await dispatcher.run_once()
            in_flight.append(await _claimed(conn, job.id))
        probing = await conn.fetchval("SELECT probing_since FROM jobs WHERE id = $1", job.id)

    assert in_flight == [1, 1, 1]
    assert probing is not None


async def test_the_work_messages_go_to_the_hosts_queue_as_run_stage_would_write_them(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        host = await _host(conn)
        job = await _submitted(conn, NewJob("made", "shell", "true", ["a", "b"]))

        assert (await dispatcher.run_once()).released == 2
        rows = await conn.fetch(
            "SELECT routing_key, body FROM outbox WHERE exchange = 'work'"
            " AND body->>'job_id' = $1 ORDER BY id",
            job.id,
        )
        tasks = await conn.fetch("SELECT id, claim, host FROM tasks WHERE job_id = $1", job.id)
        claims = {r["id"]: r["claim"] for r in tasks}

    messages = [RunStage.model_validate(r["body"]) for r in rows]
    assert [r["routing_key"] for r in rows] == [f"host.{host}"] * 2
    assert {r["host"] for r in tasks} == {host}
    model = to_jsonable(RunStage(job_id=job.id, task_id="t", stage=Stage.SETUP, claim=uuid.uuid4()))
    for row, message in zip(rows, messages, strict=True):
        assert set(row["body"]) == set(model)  # the same fields, no more, no fewer
        assert message.stage is Stage.SETUP
        assert message.claim == claims[message.task_id]
    assert sorted(m.task_id for m in messages) == sorted(claims)


async def test_work_is_handed_to_a_host_only_for_the_capacity_it_has_free(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a host of 2 CPUs and a job of 5 one-CPU tasks
        await _host(conn, cpus=2)
        job = await _submitted(conn, NewJob("many", "shell", "true", list("abcde")))

        # when rounds run with nothing ending, then one task ends
        claimed = []
        for _ in range(2):
            await dispatcher.run_once()
            claimed.append(await _claimed(conn, job.id))
        waits = await _wait(conn, job.id)
        await _end_one(conn, job.id)
        await dispatcher.run_once()
        claimed.append(await _claimed(conn, job.id))

    # then it holds 2 at most, and takes the next as soon as one ends
    assert claimed == [2, 2, 2]
    assert waits is not None and waits[0] == "resources"
    assert "2 cpus free" not in waits[1]


async def test_a_job_placed_on_several_hosts_sends_each_a_task_of_its_own(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        hosts = {await _host(conn, cpus=1) for _ in range(3)}
        job = await _submitted(conn, NewJob("spread", "shell", "true", list("abcd")))

        assert (await dispatcher.run_once()).released == 3
        rows = await conn.fetch(
            "SELECT host FROM tasks WHERE job_id = $1 AND claim IS NOT NULL", job.id
        )
    assert sorted(r["host"] for r in rows) == sorted(hosts)


async def test_a_user_who_comes_later_gets_the_next_free_capacity_not_the_queue(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given Alice's 12 tasks filling a host of 4 CPUs, then Bob's one task
        await _host(conn, cpus=4)
        alice = await _submitted(conn, NewJob("alice", "shell", "sleep 8", list("abcdefghijkl")))
        await dispatcher.run_once()
        bob = await _submitted(conn, NewJob("bob", "shell", "echo", ["x"]))
        await dispatcher.run_once()
        bob_before = await _claimed(conn, bob.id)
        reason = await _wait(conn, bob.id)

        # when one of Alice's tasks ends
        await _end_one(conn, alice.id)
        await dispatcher.run_once()

        # then Bob's task is the next to go, not Alice's fifth
        assert bob_before == 0
        assert reason is not None and reason[0] == "resources"
        assert await _claimed(conn, bob.id) == 1
        assert await _claimed(conn, alice.id) == 3
        assert await _wait(conn, bob.id) is None


async def test_a_request_goes_where_it_fits_and_one_no_host_holds_says_so(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        small = await _host(conn, cpus=2)
        large = await _host(conn, cpus=4)
        fits = await _submitted(conn, NewJob("four", "shell", "true", ["a"]), cpus=4)
        huge = await _submitted(conn, NewJob("eight", "shell", "true", ["a"]), cpus=8)

        await dispatcher.run_once()
        placed_on = await conn.fetchval("SELECT host FROM tasks WHERE job_id = $1", fits.id)
        reason = await _wait(conn, huge.id)
        loads = await plan_repo.read(conn, POOL, 10.0, 0, 100)

    assert placed_on == large
    assert reason is not None and reason[0] == "too_large"
    assert large in reason[1]
    free = {h.load.host_id: h.load.free.millicpus for h in loads.hosts}
    assert free == {small: 2000, large: 0}


async def test_each_gpu_task_gets_devices_of_its_own(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        await _host(conn, cpus=8, gpus=("0", "1"))
        job = await _submitted(conn, NewJob("gpu", "shell", "true", list("abc")), gpus=1)

        await dispatcher.run_once()
        devices = await conn.fetch(
            "SELECT gpu_ids FROM tasks WHERE job_id = $1 AND claim IS NOT NULL", job.id
        )
        reason = await _wait(conn, job.id)

    assert sorted(tuple(r["gpu_ids"]) for r in devices) == [("0",), ("1",)]
    assert reason is not None and reason[0] == "resources"


async def test_a_task_holding_two_gpus_counts_once_in_its_hosts_load(pool: Pool) -> None:
    # given a host of 4 CPUs and 4 GPUs, and a job of 1 CPU and 2 GPUs a task
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        host = await _host(conn, cpus=4, gpus=("0", "1", "2", "3"))
        job = await _submitted(conn, NewJob("gpu2", "shell", "true", list("ab")), gpus=2)

        # when both tasks are placed
        await dispatcher.run_once()
        [load] = (await pool_repo.loads(conn, [host])).values()
        assert await conn.fetchval("SELECT count(*) FROM tasks WHERE job_id = $1", job.id) == 2

    # then the host holds two tasks, 2 CPUs and all four devices, each counted once
    assert (load.tasks, load.held.millicpus, load.held.gpus) == (2, 2000, 4)
    assert sorted(load.held_gpu_ids) == ["0", "1", "2", "3"]


async def test_each_user_stays_within_the_per_user_cap(pool: Pool) -> None:
    dispatcher = _dispatcher(pool, per_user=3)
    async with pool.acquire() as conn:
        await _host(conn)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        jobs = [
            await _submitted(conn, NewJob("capped", "shell", "true", list("abcd")), user.id)
            for _ in range(2)
        ]
        for _ in range(2):
            await dispatcher.run_once()
        claimed = [await _claimed(conn, job.id) for job in jobs]
        reasons = {(await _wait(conn, job.id) or ("", ""))[0] for job in jobs}

    assert sum(claimed) == 3
    assert reasons == {"user_cap"}


async def test_users_holding_capacity_are_charged_for_it(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        await _host(conn, cpus=2)
        job = await _submitted(conn, NewJob("charged", "shell", "true", list("ab")))
        await dispatcher.run_once()
        await conn.execute(
            "UPDATE users SET usage_at = now() - interval '10 seconds' WHERE id = $1",
            job.owner_id,
        )
        dispatcher.planning.forget()  # charges at its first round
        await dispatcher.run_once()
        usage = await conn.fetchval("SELECT usage FROM users WHERE id = $1", job.owner_id)

    assert 19.0 < usage < 21.0  # 2 CPUs for 10 s, hardly decayed in a day's half-life


async def test_the_feed_counts_each_users_and_hosts_tasks_in_flight_and_what_those_hold(
    pool: Pool,
) -> None:
    """A user's tasks in flight are counted whatever they hold; what they hold is each
    holding task's job's request, summed; their host's load is read with them
    (`pool_repo.HELD_BY_HOST_AND_OWNER`)."""
    async with pool.acquire() as conn:
        host = await _host(conn)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        big = await _submitted(conn, NewJob("big", "shell", "true", list("abcd")), user.id, 2)
        gpu = await _submitted(conn, NewJob("gpu", "shell", "true", list("ab")), user.id, 1, 1)
        await conn.execute(
            "UPDATE tasks SET claim = gen_random_uuid(), host = $2,"
            " state = (CASE WHEN index = 0 THEN 'new' ELSE 'on_cpu' END)::task_state"
            " WHERE job_id = $1 AND index < 3",
            big.id,
            host,
        )
        await conn.execute(  # one running, one past its command (in flight, holding nothing)
            "UPDATE tasks SET claim = gen_random_uuid(), host = $2,"
            " state = (CASE WHEN index = 0 THEN 'on_cpu' ELSE 'post_processing' END)::task_state"
            " WHERE job_id = $1",
            gpu.id,
            host,
        )
        feed = await plan_repo.read(conn, POOL, 10.0, 0, 100)

    row = feed.users[user.id]
    assert row.in_flight == 5
    assert (row.held.millicpus, row.held.gpus) == (3 * 2000 + 1000, 1)
    # and the host's load, from the same read: the four holding tasks, one not started
    [load] = [h.load for h in feed.hosts if h.load.host_id == host]
    assert (load.tasks, load.pending) == (4, 1)
    assert (load.held.millicpus, load.running_millicpus) == (3 * 2000 + 1000, 2 * 2000 + 1000)


async def test_a_claimed_task_holds_what_its_job_asked_when_it_was_placed(pool: Pool) -> None:
    """The round's claim records each task's request and owner with it (migration 0043):
    the sums read those, not the job's row (which the test above, whose tasks no round
    claimed, still has them read)."""
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a job asking 2 CPUs, its two tasks placed by a round
        host = await _host(conn, cpus=8, gpus=("0", "1"))
        job = await _submitted(conn, NewJob("held", "shell", "true", ["a", "b"]), cpus=2, gpus=1)
        await dispatcher.run_once()
        holds = await conn.fetch(
            "SELECT hold_owner, hold_millicpus, hold_memory_mb, hold_gpus FROM tasks"
            " WHERE job_id = $1",
            job.id,
        )
        # when the job's row asks for something else afterwards
        await conn.execute(
            "UPDATE jobs SET req_millicpus = 500, req_gpus = 0 WHERE id = $1", job.id
        )
        feed = await plan_repo.read(conn, POOL, 10.0, 0, 100)

    # then each task holds what it was placed with, for its owner
    assert [tuple(r) for r in holds] == [(job.owner_id, 2000, 0, 1)] * 2
    [load] = [h.load for h in feed.hosts if h.load.host_id == host]
    assert (load.tasks, load.held.millicpus, load.held.gpus) == (2, 4000, 2)
    assert (feed.users[job.owner_id].held.millicpus, feed.users[job.owner_id].held.gpus) == (
        4000,
        2,
    )


async def test_a_probing_host_is_given_one_task_at_a_time(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        host = await _host(conn, cpus=8)
        await conn.execute(
            "UPDATE hosts SET quarantined = true, breaker = true, probing_since = now()"
            " WHERE id = $1",
            host,
        )
        job = await _submitted(conn, NewJob("probe", "shell", "true", list("abcd")))
        for _ in range(2):
            await dispatcher.run_once()
        assert await _claimed(conn, job.id) == 1


async def test_tasks_placed_on_a_host_whose_worker_is_gone_are_placed_again(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        gone = await _host(conn, cpus=1)
        job = await _submitted(conn, NewJob("moved", "shell", "true", ["a"]))
        await dispatcher.run_once()
        await conn.execute(
            "UPDATE hosts SET heartbeat_at = now() - interval '1 minute' WHERE id = $1", gone
        )
        given = await plan_repo.give_back_from_gone_hosts(conn, 10.0)
        other = await _host(conn, cpus=1)
        await dispatcher.run_once()
        now_on = await conn.fetchval("SELECT host FROM tasks WHERE job_id = $1", job.id)

    assert given == 1
    assert now_on == other


async def test_with_no_host__the_reason_says_so(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        job = await _submitted(conn, NewJob("alone", "shell", "true", ["a"]))
        await dispatcher.run_once()
        reason = await _wait(conn, job.id)
    assert reason is not None and reason[0] == "no_host"


async def _waiting_after(pool: Pool, *rounds: int) -> list[bool]:
    """The dispatcher's `waiting` over as many rounds as given (nothing ends in between)."""
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        await _host(conn)
    return [(await dispatcher.run_once()).waiting for _ in rounds]


async def test_with_nothing_unclaimed__no_task_waits(pool: Pool) -> None:
    assert await _waiting_after(pool, 1) == [False]


async def test_a_release_says_tasks_were_waiting_and_the_next_round_that_none_are(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        job = await _submitted(conn, NewJob("all", "shell", "true", ["a", "b"]))
    assert await _waiting_after(pool, 1, 2) == [True, False]
    async with pool.acquire() as conn:
        assert await _wait(conn, job.id) is None


async def test_tasks_a_throttle_holds_back_keep_waiting(pool: Pool) -> None:
    async with pool.acquire() as conn:
        await _submitted(conn, NewJob("held", "shell", "true", list("abc"), max_in_flight=1))
    assert await _waiting_after(pool, 1, 2) == [True, True]


async def test_a_task_waiting_on_a_prerequisite_keeps_waiting(pool: Pool) -> None:
    async with pool.acquire() as conn:
        first = await _submitted(conn, NewJob("first", "shell", "true", ["a"]))
        upstream = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", first.id)
        job = await _submitted(conn, NewJob("later", "shell", "true", ["b"]))
        task_id = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", job.id)
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " VALUES ($1, 'setup', $2, 'completed')",
            task_id,
            upstream,
        )
    assert await _waiting_after(pool, 1, 2) == [True, True]


async def test_a_suspended_jobs_tasks_do_not_wait_to_be_released(pool: Pool) -> None:
    async with pool.acquire() as conn:
        job = await _submitted(conn, NewJob("paused", "shell", "true", ["a"]))
        await conn.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", job.id)
    assert await _waiting_after(pool, 1) == [False]


async def test_a_task_goes_only_to_a_pilot_whose_allocation_outlasts_its_walltime(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        soon = await _host(conn, cpus=4)
        later = await _host(conn, cpus=1)
        await conn.execute(
            "UPDATE hosts SET ends_at = now() + CASE id WHEN $1 THEN interval '10 minutes'"
            " ELSE interval '2 hours' END WHERE id = ANY($2::text[])",
            soon,
            [soon, later],
        )
        job = await _submitted(conn, NewJob("hour", "shell", "true", ["a", "b"]))
        await conn.execute(
            "UPDATE jobs SET policy = '{\"walltime\": 3600}'::jsonb WHERE id = $1", job.id
        )

        await dispatcher.run_once()
        hosts = await conn.fetch(
            "SELECT host FROM tasks WHERE job_id = $1 AND claim IS NOT NULL", job.id
        )
        reason = await _wait(conn, job.id)

    assert [r["host"] for r in hosts] == [later]  # one CPU: the other task waits
    assert reason is not None and reason[0] == "resources"


async def _ran_lately(conn: Connection, job: jobs_repo.Job, host: str, seconds: float) -> None:
    """Given-step: three of the job's tasks ran on `host` a moment ago, `seconds` each."""
    tasks = await conn.fetch("SELECT id FROM tasks WHERE job_id = $1 ORDER BY index", job.id)
    for n, task in enumerate(tasks[:3]):
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE id = $1", task["id"])
        await conn.execute(
            "INSERT INTO attempts (task_id, attempt, run_number, stage, host, started_at,"
            " ended_at) VALUES ($1, $2, 1, 'cluster', $3, now() - make_interval(secs => $4),"
            " now())",
            task["id"],
            n + 1,
            host,
            seconds,
        )


async def test_a_task_without_walltime_goes_to_a_pilot_only_if_its_jobs_past_says_it_ends_there(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a pilot that ends in 8 minutes, and three jobs with no walltime, not
        # restartable: one whose tasks took 30 s, one whose took 400 s, one with none done
        pilot = await _host(conn, cpus=8)
        await conn.execute(
            "UPDATE hosts SET ends_at = now() + interval '8 minutes' WHERE id = $1", pilot
        )
        quick = await _submitted(conn, NewJob("took-30", "shell", "true", list("abcde")))
        slow = await _submitted(conn, NewJob("took-400", "shell", "true", list("abcde")))
        fresh = await _submitted(conn, NewJob("sleep-600", "shell", "sleep 600", ["a"]))
        await _ran_lately(conn, quick, pilot, 30)
        await _ran_lately(conn, slow, pilot, 400)

        # when a round runs
        await dispatcher.run_once()
        claimed = {job.id: await _claimed(conn, job.id) for job in (quick, slow, fresh)}
        waits = {job.id: await _wait(conn, job.id) for job in (slow, fresh)}

    # then only the job whose tasks end before the pilot does is placed on it
    assert claimed == {quick.id: 2, slow.id: 0, fresh.id: 0}
    slow_wait, fresh_wait = waits[slow.id], waits[fresh.id]
    assert slow_wait is not None and slow_wait[0] == "host_ends"
    assert "for 660 s (what its job's finished tasks took)" in slow_wait[1]
    assert fresh_wait is not None and "not restartable, no walltime" in fresh_wait[1]


@pytest.mark.parametrize(("seconds", "claimed"), [(0.05, 1 + 4), (5.0, 1)])
async def test_a_host_is_handed_more_than_it_can_run_only_of_short_work(
    pool: Pool, seconds: float, claimed: int
) -> None:
    dispatcher = Dispatcher(pool, 10_000, POOL, policy=Settings(), short_prefetch=4)
    async with pool.acquire() as conn:
        host = await _host(conn, cpus=1)
        job = await _submitted(conn, NewJob("w1", "shell", "true", list("abcdefghij")))
        await _ran_lately(conn, job, host, seconds)

        await dispatcher.run_once()
        assert await _claimed(conn, job.id) == claimed


async def test_a_quick_round_takes_the_users_next_job_and_keeps_the_others_reasons(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given one user's 20 one-task jobs, made oldest first, on a host of 1 CPU
        await _host(conn, cpus=1)
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        jobs = []
        for n in range(20):
            job = await _submitted(conn, NewJob(f"w{n}", "shell", "true", ["x"]), user.id)
            await conn.execute(
                "UPDATE jobs SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
                job.id,
                100 - n,
            )
            jobs.append(job)
        await dispatcher.run_once()  # the first round of a leader is a full one
        waiting_after_full = await conn.fetchval("SELECT count(*) FROM job_waits")

        # when the first job's task ends and a quick round follows
        await _end_one(conn, jobs[0].id)
        await dispatcher.run_once()

        # then it placed the next oldest, and the reasons of the jobs it did not read stay
        assert [await _claimed(conn, j.id) for j in jobs[:3]] == [0, 1, 0]
        assert waiting_after_full == 19
        assert await conn.fetchval("SELECT count(*) FROM job_waits") == 18


async def test_the_feed_finds_the_same_jobs_by_probing_every_job_or_from_the_pending_tasks(
    pool: Pool,
) -> None:
    """The two ways the feed finds the jobs with tasks to place (`plan_repo.read`'s
    `pending_first`): each placeable job probed, or the jobs with an unclaimed new task read
    from `tasks_new` first. A round takes either (`feed_from_pending`): they must agree."""
    async with pool.acquire() as conn:
        await _host(conn)
        user = (await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")).id
        other = (await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")).id
        # given jobs with tasks to place, of two users
        waiting = await _submitted(conn, NewJob("waits", "shell", "true", list("abc")), user)
        theirs = await _submitted(conn, NewJob("theirs", "shell", "true", ["a"]), other)
        trial, _ = await jobs_repo.create(
            conn, user, NewJob("trial", "shell", "true", ["a"], configuring=True)
        )
        await configuring.start_test(conn, trial.id, TrialInput())
        # and active jobs with nothing to place: all claimed, all ended, suspended, backing
        # off, waiting on a prerequisite
        claimed = await _submitted(conn, NewJob("claimed", "shell", "true", ["a"]), user)
        await conn.execute(
            "UPDATE tasks SET claim = gen_random_uuid() WHERE job_id = $1", claimed.id
        )
        ended = await _submitted(conn, NewJob("ended", "shell", "true", ["a"]), user)
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", ended.id)
        held = await _submitted(conn, NewJob("held", "shell", "true", ["a"]), user)
        await conn.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", held.id)
        later = await _submitted(conn, NewJob("later", "shell", "true", ["a"]), user)
        await conn.execute(
            "UPDATE tasks SET not_before = now() + interval '1 hour' WHERE job_id = $1", later.id
        )
        blocked = await _submitted(conn, NewJob("blocked", "shell", "true", ["a"]), user)
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " SELECT b.id, 'setup', c.id, 'completed' FROM tasks b, tasks c"
            " WHERE b.job_id = $1 AND c.job_id = $2",
            blocked.id,
            claimed.id,
        )

        # when the feed is read both ways, by a full round and by a quick one
        def found(feed: plan_repo.Feed) -> list[tuple[str, int]]:
            return sorted((j.job_id, j.waiting) for j in feed.jobs)

        full = {
            first: await plan_repo.read(conn, POOL, 10.0, 0, 100, None, first)
            for first in (False, True)
        }
        quick = {
            first: await plan_repo.read(conn, POOL, 10.0, 0, 100, (4, 1.0), first)
            for first in (False, True)
        }

    # then both find the jobs with tasks to place, and only those
    expected = sorted([(waiting.id, 3), (theirs.id, 1), (trial.id, 1)])
    assert found(full[False]) == found(full[True]) == expected
    assert found(quick[False]) == found(quick[True]) == expected
    # and a full round counts the placeable jobs (a quick one does not)
    counted = full[False].placeable_jobs
    assert counted is not None and counted >= 7
    assert quick[False].placeable_jobs is None


async def test_a_quick_round_reads_each_users_best_ranked_jobs_across_priorities_and_ages(
    pool: Pool,
) -> None:
    """A quick round reads each user's jobs with tasks to place by class (owner, priority),
    oldest first, and ranks those (`plan_repo._top_jobs`): what it reads must be each user's
    best-ranked ones, priority plus age, as a sort of all their jobs would give."""
    per_hour, extra = 10.0, 2  # one priority point per 6 minutes of age; top = (2, per_hour)
    async with pool.acquire() as conn:
        await _host(conn)
        users = [
            (await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")).id
            for _ in range(2)
        ]
        # given each user's jobs of three priorities and ages in minutes, more of a priority
        # than a quick round reads, some of them with nothing to place (all claimed)
        # (with nothing to place, (5, 45) and (10, 40) would rank first and third)
        shapes = [
            (0, 90, True),
            (0, 50, True),
            (0, 40, True),
            (0, 30, True),
            (0, 5, True),
            (5, 45, False),
            (5, 25, True),
            (5, 1, True),
            (10, 40, False),
            (10, 31, True),
            (10, 3, True),
            (10, 2, True),
            (10, 1, True),
        ]
        ranks: dict[str, dict[str, float]] = {user: {} for user in users}
        for n, user in enumerate(users):
            for priority, minutes, to_place in shapes:
                job = await _submitted(conn, NewJob(f"p{priority}", "shell", "true", ["a"]), user)
                await conn.execute(
                    "UPDATE jobs SET priority = $2,"
                    " created_at = now() - make_interval(mins => $3) WHERE id = $1",
                    job.id,
                    priority,
                    minutes + n,  # the users' jobs differ in age
                )
                if not to_place:
                    await conn.execute(
                        "UPDATE tasks SET claim = gen_random_uuid() WHERE job_id = $1", job.id
                    )
                else:
                    ranks[user][job.id] = priority + per_hour * (minutes + n) / 60

        # when a quick round reads the feed (one task counted a job: `batch` 1)
        feed = await plan_repo.read(conn, POOL, 10.0, 0, 1, (extra, per_hour), False)

    # then it read each user's best-ranked jobs with tasks to place, `extra` + 1 of them:
    # (10, 31), (0, 90) and (10, 3), neither by priority alone nor by age alone
    for user in users:
        best = sorted(ranks[user], key=lambda job_id: -ranks[user][job_id])[: extra + 1]
        assert sorted(j.job_id for j in feed.jobs if j.owner_id == user) == sorted(best)


async def test_among_many_jobs_with_nothing_to_place_the_rounds_read_the_pending_tasks(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a host and active jobs whose tasks have all ended (nothing to place)
        await _host(conn)
        for n in range(6):
            done = await _submitted(conn, NewJob(f"done-{n}", "shell", "true", ["a"]))
            await conn.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", done.id)
        # when a full round looks, then a job is submitted and the next round looks
        await dispatcher.run_once()
        pending_first = dispatcher.planning.pending_first
        job = await _submitted(conn, NewJob("new", "shell", "true", ["a", "b"]))
        await dispatcher.run_once()
        # then the rounds took the pending tasks' way, and it placed the new job's tasks
        assert pending_first
        assert await _claimed(conn, job.id) == 2


async def test_an_idle_pools_feed_stops_at_its_first_statement_but_a_waiting_job_is_read(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        await _host(conn)
        # given nothing waits: the feed is skipped, unless asked whole
        idle = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100)
        whole = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100, skip_idle=False)
        # when a job's one new task waits on a prerequisite (it cannot be placed yet)
        first = await _submitted(conn, NewJob("first", "shell", "true", ["a"]))
        await conn.execute("UPDATE tasks SET state = 'completed' WHERE job_id = $1", first.id)
        upstream = await conn.fetchval("SELECT id FROM tasks WHERE job_id = $1", first.id)
        job = await _submitted(conn, NewJob("later", "shell", "true", ["b"]))
        await conn.execute(
            "INSERT INTO task_prerequisites (task_id, stage, on_task_id, required)"
            " SELECT id, 'setup', $2, 'failed' FROM tasks WHERE job_id = $1",
            job.id,
            upstream,
        )
        waiting = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100)
        # and once its job is suspended, nothing placeable waits again
        await conn.execute("UPDATE jobs SET state = 'suspended' WHERE id = $1", job.id)
        suspended = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100)

    assert idle is None
    assert whole is not None and len(whole.hosts) == 1 and not whole.jobs
    assert waiting is not None and len(waiting.hosts) == 1
    assert suspended is None


async def test_a_reason_written_is_cleared_when_its_job_stops_waiting_in_an_idle_pool(
    pool: Pool,
) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a job that waits for a host, and its reason written
        job = await _submitted(conn, NewJob("alone", "shell", "true", ["a"]))
        await dispatcher.run_once()
        before = await _wait(conn, job.id)
        # when it is cancelled, nothing else waiting, and the next full round comes
        await conn.execute("UPDATE jobs SET state = 'cancelled' WHERE id = $1", job.id)
        dispatcher.planning._full_at = 0.0
        await dispatcher.run_once()
        after = await _wait(conn, job.id)

    assert before is not None and before[0] == "no_host"
    assert after is None


async def test_a_round_tells_the_jobs_it_saw_with_a_task_to_place(pool: Pool) -> None:
    dispatcher = _dispatcher(pool)
    async with pool.acquire() as conn:
        # given a job all of whose tasks are placed, and a job with one waiting (throttled)
        await _host(conn)
        placed = await _submitted(conn, NewJob("placed", "shell", "true", ["a"]))
        await dispatcher.run_once()
        new = NewJob("throttled", "shell", "true", ["a", "b"], max_in_flight=1)
        throttled = await _submitted(conn, new)

        # when two rounds run
        first, second = await dispatcher.run_once(), await dispatcher.run_once()

    # then each says it saw the throttled job, and not the one with nothing to place
    assert first.unfinished == second.unfinished == {throttled.id}
    assert placed.id not in first.unfinished


async def test_a_round_makes_again_only_the_hosts_that_read_otherwise_than_at_the_last_one(
    pool: Pool,
) -> None:
    known = plan_repo.KnownHosts()
    async with pool.acquire() as conn:
        # given three hosts, a job holding a task on the first, and a round's read
        busy, idle, going = [await _host(conn, cpus=4) for _ in range(3)]
        job = await _submitted(conn, NewJob("known", "shell", "true", ["a", "b"]))
        await conn.execute(
            "UPDATE tasks SET claim = gen_random_uuid(), host = $2 WHERE id ="
            " (SELECT id FROM tasks WHERE job_id = $1 ORDER BY index LIMIT 1)",
            job.id,
            busy,
        )
        first = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100, known=known)
        # when nothing changes, then the task on the first host ends and the third goes
        # silent, at the next reads
        same = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100, known=known)
        await _end_one(conn, job.id)
        await conn.execute(
            "UPDATE hosts SET heartbeat_at = now() - interval '1 hour' WHERE id = $1", going
        )
        later = await plan_repo.read_unless_idle(conn, POOL, 10.0, 0, 100, known=known)

    assert first is not None and same is not None and later is not None
    before = {h.load.host_id: h for h in first.hosts}
    again = {h.load.host_id: h for h in same.hosts}
    after = {h.load.host_id: h for h in later.hosts}
    # then what read the same is the same row, and what changed is read anew
    assert all(again[host] is before[host] for host in (busy, idle, going))
    assert before[busy].load.tasks == 1 and before[busy].load.free.millicpus == 3000
    assert after[busy].load.tasks == 0 and after[busy].load.free.millicpus == 4000
    assert before[going].live and not after[going].live
    assert after[idle] is before[idle]
