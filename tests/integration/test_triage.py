"""The scheduler's triage of failed tasks, against the real PostgreSQL."""

import uuid
from typing import Any

import pytest

from services.scheduler import breaker
from services.scheduler.triage import Triage, TriageSettings, end_probing
from shared.domain.analyser import Decision, DefaultAnalyser, Facts, Verdict
from shared.domain.states import FailureClass, TaskState
from shared.operations import configuring, datasets, quarantine
from shared.operations.configuring import TrialInput
from shared.store import jobs_repo, logs_repo, pilots_repo, tasks_repo, users_repo
from shared.store.db import Connection, Pool
from shared.store.jobs_repo import NewJob

pytestmark = pytest.mark.integration
S = TaskState


def triage_settings(
    quarantine_after: int = 0,
    fence_timeout_s: float = 60.0,
    probe_s: float = 30.0,
    quarantine_s: float = 600.0,
) -> TriageSettings:
    return TriageSettings(
        batch=1000,
        fence_timeout_s=fence_timeout_s,
        quarantine_after=quarantine_after,
        quarantine_window_s=600,
        quarantine_s=quarantine_s,
        quarantine_probe_s=probe_s,
    )


def _triage(
    pool: Pool, quarantine_after: int = 0, fence_timeout_s: float = 60.0, **kw: float
) -> Triage:
    settings = triage_settings(quarantine_after, fence_timeout_s, **kw)
    return Triage(pool, {"default": DefaultAnalyser(rand=lambda: 1.0)}, settings)


async def _job(conn: Connection, inputs: list[Any], policy: dict[str, Any]) -> list[str]:
    user = await users_repo.ensure_user(
        conn, f"u-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    job, _ = await jobs_repo.create(
        conn, user.id, NewJob("t", "shell", "true", inputs, policy=policy)
    )
    return await datasets.task_ids_of(conn, job.id)


async def _host(conn: Connection, heartbeat_age_s: float = 0.0) -> str:
    host = f"h-{uuid.uuid4().hex[:10]}"
    await conn.execute(
        "INSERT INTO hosts (id, slots, heartbeat_at, supervisor_heartbeat_at)"
        " VALUES ($1, 1, now() - make_interval(secs => $2), now() - make_interval(secs => $2))",
        host,
        heartbeat_age_s,
    )
    return host


async def _fail(
    conn: Connection, task_id: str, cls: FailureClass, host: str, pid: int | None = 4242
) -> None:
    """The task ran on `host` as pid and failed with `cls` (through a real transition)."""
    claim = uuid.uuid4()
    await conn.execute(
        "UPDATE tasks SET state = 'on_cpu', claim = $2, host = $3, pid = $4 WHERE id = $1",
        task_id,
        claim,
        host,
        pid,
    )
    await conn.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, host, claim, pid, ended_at,"
        " failure_class) SELECT $1, attempt + 1, 1, 'cluster', $2, $3, $4, now(), $5"
        " FROM tasks WHERE id = $1",
        task_id,
        host,
        claim,
        pid,
        cls.value,
    )
    await conn.execute("UPDATE tasks SET attempt = attempt + 1 WHERE id = $1", task_id)
    await tasks_repo.transition(
        conn,
        task_id,
        S.FAILED_ON_CLUSTER,
        changes={"failure_class": cls, "claim": None, "error_brief": cls.value},
    )


async def _kills(conn: Connection, host: str, task_id: str) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT body FROM outbox WHERE routing_key = $1 AND body->>'task_id' = $2",
        f"supervise.{host}",
        task_id,
    )
    return [dict(r["body"]) for r in rows]


async def _decision(conn: Connection, task_id: str) -> tuple[str | None, str | None]:
    row = await conn.fetchrow(
        "SELECT decision, decision_reason FROM attempts WHERE task_id = $1"
        " ORDER BY attempt DESC LIMIT 1",
        task_id,
    )
    assert row is not None
    return row["decision"], row["decision_reason"]


async def test_when_a_lost_task_may_still_run__it_is_resubmitted_only_once_its_process_is_gone(
    pool: Pool,
) -> None:
    triage = _triage(pool)
    async with pool.acquire() as conn:
        # given a restartable task lost on a host that is still heartbeating
        [task_id] = await _job(conn, ["x"], {"restartable": True})
        host = await _host(conn)
        await _fail(conn, task_id, FailureClass.LOST, host)

        # when triaged: its host's supervisor is asked to kill it, and nothing else happens
        await triage.run_once()
        task = await tasks_repo.get(conn, task_id)
        assert task is not None and (task.decided, task.superseded_by) == (False, None)
        assert (await _decision(conn, task_id))[0] == "fencing"
        assert [k["pid"] for k in await _kills(conn, host, task_id)] == [4242]
        await triage.run_once()
        assert len(await _kills(conn, host, task_id)) == 1  # asked once only

        # then once the supervisor reports the process reaped, the clone is made, with backoff
        await conn.execute("UPDATE attempts SET reaped_at = now() WHERE task_id = $1", task_id)
        await triage.run_once()
        task = await tasks_repo.get(conn, task_id)
        assert task is not None and task.decided and task.superseded_by is not None
        clone = await tasks_repo.get(conn, task.superseded_by)
        assert clone is not None and clone.state is S.NEW and clone.not_before is not None
        assert (await _decision(conn, task_id))[0] == "resubmitted"


async def test_when_the_host_stays_unreachable_past_the_fence_timeout__the_clone_is_made(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        [task_id] = await _job(conn, ["x"], {"restartable": True})
        host = await _host(conn, heartbeat_age_s=120)
        await _fail(conn, task_id, FailureClass.LOST, host)
        await _triage(pool, fence_timeout_s=60).run_once()
        task = await tasks_repo.get(conn, task_id)
        assert task is not None and task.superseded_by is not None


async def test_when_a_pilots_allocation_has_ended__its_lost_task_waits_for_no_fence(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        # given a restartable task lost on a pilot's host whose last heartbeat is fresh, and
        # the batch system reporting the pilot's allocation ended (`vigil pilots rm`)
        [task_id] = await _job(conn, ["x"], {"restartable": True})
        host = await _host(conn)
        [pilot] = await pilots_repo.request(
            conn, "default", "slurm", pilots_repo.Ask(cpus=1, walltime_s=600), 1, "op"
        )
        await conn.execute(
            "UPDATE pilots SET state = 'ended', host_id = $2, reason = 'cancelled',"
            " ended_at = now() WHERE id = $1",
            pilot.id,
            host,
        )
        await _fail(conn, task_id, FailureClass.LOST, host)

        # when triaged
        await _triage(pool, fence_timeout_s=600).run_once()

        # then it is resubmitted at once: no kill asked of a host whose processes are gone
        task = await tasks_repo.get(conn, task_id)
        assert task is not None and task.superseded_by is not None
        assert (await _decision(conn, task_id))[0] == "resubmitted"
        assert await _kills(conn, host, task_id) == []


async def _host_row(conn: Connection, host: str) -> Any:
    return await conn.fetchrow("SELECT * FROM hosts WHERE id = $1", host)


async def _host_events(conn: Connection, host: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await conn.fetch(
        "SELECT routing_key, body FROM outbox WHERE routing_key LIKE 'host.%.' || $1 ORDER BY id",
        host,
    )
    return [(r["routing_key"], dict(r["body"])) for r in rows]


async def _cool_down_over(conn: Connection, host: str) -> None:
    await conn.execute("UPDATE hosts SET quarantined_until = now() WHERE id = $1", host)


async def _attempt_on(conn: Connection, host: str, failure: FailureClass | None) -> None:
    """A task of a fresh job ran on `host` (started now), then ended with `failure`."""
    [task] = await _job(conn, ["probe"], {})
    await conn.execute(
        "INSERT INTO attempts (task_id, attempt, run_number, stage, host, ended_at,"
        " failure_class, error_brief) VALUES ($1, 1, 1, 'cluster', $2, now(), $3, $4)",
        task,
        host,
        failure.value if failure else None,
        f"{failure} there" if failure else None,
    )


async def test_when_a_host_loses_tasks_repeatedly__its_breaker_shuts_probes_and_heals(
    pool: Pool,
) -> None:
    triage = _triage(pool, quarantine_after=2, probe_s=5, quarantine_s=12)
    settings = triage_settings(quarantine_after=2, probe_s=5, quarantine_s=12).breaker
    async with pool.acquire() as conn:
        host = await _host(conn)
        first, second = await _job(conn, ["a", "b"], {})
        await _fail(conn, first, FailureClass.LOST, host, pid=None)
        await triage.run_once()
        assert not (await _host_row(conn, host))["quarantined"]

        await _fail(conn, second, FailureClass.LOST, host, pid=None)
        await triage.run_once()
        row = await _host_row(conn, host)
        assert row["quarantined"] and row["breaker"] and row["probing_since"] is None
        assert "2 tasks lost" in row["quarantine_reason"]
        assert row["cooldown_s"] == 5
        [(key, body)] = await _host_events(conn, host)
        assert key == f"host.quarantined.{host}" and body["until"] and body["by"] == "breaker"

        # within its cool-down it stays shut; past it, it probes (one task at a time)
        await breaker.sweep(pool, settings)
        assert (await _host_row(conn, host))["probing_since"] is None
        await _cool_down_over(conn, host)
        await breaker.sweep(pool, settings)
        row = await _host_row(conn, host)
        assert row["quarantined"] and row["probing_since"] is not None
        assert (await _host_events(conn, host))[-1][0] == f"host.probing.{host}"

        # a lost probe shuts it again, for twice as long
        await _attempt_on(conn, host, FailureClass.LOST)
        await breaker.sweep(pool, settings)
        row = await _host_row(conn, host)
        assert row["probing_since"] is None and row["cooldown_s"] == 10
        assert row["quarantine_reason"].startswith("probe failed (lost)")
        assert (await _host_events(conn, host))[-1][0] == f"host.quarantined.{host}"

        # the cool-down doubles up to quarantine_s
        await _cool_down_over(conn, host)
        await breaker.sweep(pool, settings)
        await _attempt_on(conn, host, FailureClass.LOST)
        await breaker.sweep(pool, settings)
        assert (await _host_row(conn, host))["cooldown_s"] == 12

        # a probe that ends, even failed by its own program, heals the host
        await _cool_down_over(conn, host)
        await breaker.sweep(pool, settings)
        await _attempt_on(conn, host, FailureClass.EXIT)
        await breaker.sweep(pool, settings)
        row = await _host_row(conn, host)
        assert not row["quarantined"] and not row["breaker"] and row["cooldown_s"] is None
        assert [k.split(".")[1] for k, _ in await _host_events(conn, host)] == [
            "quarantined",
            "probing",
            "quarantined",
            "probing",
            "quarantined",
            "probing",
            "released",
        ]

        # the failures before it healed no longer count
        [third] = await _job(conn, ["c"], {})
        await _fail(conn, third, FailureClass.LOST, host, pid=None)
        await triage.run_once()
        assert not (await _host_row(conn, host))["quarantined"]


async def test_an_operators_quarantine_is_a_wall_until_it_runs_out(pool: Pool) -> None:
    settings = triage_settings(quarantine_after=2, probe_s=1, quarantine_s=1).breaker
    async with pool.acquire() as conn:
        host = await _host(conn)
        await quarantine.quarantine(conn, host, "ops", "disk check", 3600)
        await conn.execute(
            "UPDATE hosts SET quarantined_until = now() + interval '1 hour' WHERE id = $1", host
        )
        await breaker.sweep(pool, settings)
        row = await _host_row(conn, host)
        assert row["quarantined"] and not row["breaker"] and row["probing_since"] is None

        await _cool_down_over(conn, host)
        await breaker.sweep(pool, settings)
        assert not (await _host_row(conn, host))["quarantined"]
        assert [(k.split(".")[1], b["by"]) for k, b in await _host_events(conn, host)] == [
            ("quarantined", "ops"),
            ("released", "operator"),
        ]


async def test_a_program_that_crashes_itself_or_hangs_never_quarantines_its_host(
    pool: Pool,
) -> None:
    # Design §5, blame: otherwise any user takes a pool out with `kill -SEGV $$`.
    triage = _triage(pool, quarantine_after=2)
    async with pool.acquire() as conn:
        host = await _host(conn)
        tasks = await _job(conn, ["a", "b", "c", "d"], {})
        for task_id, cls in zip(
            tasks,
            [FailureClass.SIGNAL, FailureClass.SIGNAL, FailureClass.HUNG, FailureClass.SIGNAL],
            strict=True,
        ):
            await _fail(conn, task_id, cls, host)
            await triage.run_once()

        assert not await conn.fetchval("SELECT quarantined FROM hosts WHERE id = $1", host)


async def test_when_most_recent_tasks_fail__the_job_probes_until_one_completes(
    pool: Pool,
) -> None:
    triage = _triage(pool)
    async with pool.acquire() as conn:
        host = await _host(conn)
        tasks = await _job(conn, list("abcdef"), {"probe_window": 4, "probe_failure_rate": 0.5})
        job_id = await conn.fetchval("SELECT job_id FROM tasks WHERE id = $1", tasks[0])
        await _fail(conn, tasks[0], FailureClass.EXIT, host)
        await triage.run_once()
        assert await conn.fetchval("SELECT probing_since FROM jobs WHERE id = $1", job_id) is None

        await _fail(conn, tasks[1], FailureClass.EXIT, host)
        await triage.run_once()
        assert await conn.fetchval("SELECT probing_since FROM jobs WHERE id = $1", job_id)

        await conn.execute(
            "UPDATE tasks SET state = 'completed', updated_at = now() WHERE id = $1", tasks[2]
        )
        await end_probing(pool)
        assert await conn.fetchval("SELECT probing_since FROM jobs WHERE id = $1", job_id) is None


async def test_while_a_failure_is_undecided__its_job_is_not_finalised(pool: Pool) -> None:
    async with pool.acquire() as conn:
        [task_id] = await _job(conn, ["x"], {"restartable": True})
        job_id = await conn.fetchval("SELECT job_id FROM tasks WHERE id = $1", task_id)
        await _fail(conn, task_id, FailureClass.SIGNAL, await _host(conn))
        candidates = [j for j, _ in await jobs_repo.finished_candidates(conn, 10_000)]
        assert job_id not in candidates
        await _triage(pool).run_once()  # resubmitted: the job has work again
        candidates = [j for j, _ in await jobs_repo.finished_candidates(conn, 10_000)]
        assert job_id not in candidates


async def test_with_fail_fast__a_final_failure_terminates_the_rest_of_the_job(pool: Pool) -> None:
    async with pool.acquire() as conn:
        failing, waiting, other = await _job(conn, ["a", "b", "c"], {"fail_fast": True})
        await _fail(conn, failing, FailureClass.EXIT, await _host(conn))
        await _triage(pool).run_once()
        tasks = [await tasks_repo.get(conn, t) for t in (failing, waiting, other)]
        assert [t.state if t else None for t in tasks] == [
            S.FAILED_ON_CLUSTER,
            S.TERMINATED,
            S.TERMINATED,
        ]
        assert tasks[1] is not None and "fail_fast" in (tasks[1].error_brief or "")
        job_id = tasks[0].job_id if tasks[0] else ""
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE routing_key = $1", f"job.failed.{job_id}"
            )
            == 1
        )


async def test_the_logs_of_jobs_ended_past_the_retention_are_pruned_and_no_others(
    pool: Pool,
) -> None:
    async with pool.acquire() as conn:
        old, recent = await _job(conn, ["a"], {}), await _job(conn, ["b"], {})
        for [task_id], age_s in ((old, 7200), (recent, 60)):
            await conn.execute(
                "UPDATE jobs SET state = 'completed',"
                " finished_at = now() - make_interval(secs => $2)"
                " WHERE id = (SELECT job_id FROM tasks WHERE id = $1)",
                task_id,
                age_s,
            )
            await conn.execute(
                "INSERT INTO logs (job_id, task_id, run_number, attempt, line_no, ts, severity,"
                " stream, line) SELECT job_id, id, 1, 1, 1, now(), 'info', 'stdout', 'hello'"
                " FROM tasks WHERE id = $1",
                task_id,
            )
        await logs_repo.prune_ended_jobs(conn, retention_s=3600)
        left = {
            r["task_id"]
            for r in await conn.fetch(
                "SELECT task_id FROM logs WHERE task_id = ANY($1)", [old[0], recent[0]]
            )
        }
        assert left == {recent[0]}


async def test_when_a_job_names_an_analyser__it_decides_and_a_missing_one_falls_back(
    pool: Pool,
) -> None:
    class GiveUp:
        def decide(self, facts: Facts) -> Decision:
            assert [a.failure_class for a in facts.history] == ["lost"]
            return Decision(Verdict.ABANDONED, f"site rule for {facts.task_id}")

    settings = TriageSettings(
        batch=1000, fence_timeout_s=60, quarantine_after=0, quarantine_window_s=1, quarantine_s=1
    )
    triage = Triage(pool, {"default": DefaultAnalyser(), "give-up": GiveUp()}, settings)
    async with pool.acquire() as conn:
        host = await _host(conn)
        [mine] = await _job(conn, ["a"], {"restartable": True, "analyser": "give-up"})
        [gone] = await _job(conn, ["b"], {"restartable": True, "analyser": "not-here"})
        for task_id in (mine, gone):
            await _fail(conn, task_id, FailureClass.LOST, host, pid=None)
        await triage.run_once()
        assert await _decision(conn, mine) == ("abandoned", f"site rule for {mine}")
        verdict, reason = await _decision(conn, gone)
        assert verdict == "resubmitted"
        assert reason is not None and reason.startswith("analyser 'not-here' is not installed")


async def _configuring(conn: Connection, inputs: list[Any], policy: dict[str, Any]) -> str:
    """A configuring job (see `shared.operations.configuring`); its id."""
    user = await users_repo.ensure_user(
        conn, f"u-{uuid.uuid4().hex[:10]}", "user", uuid.uuid4().hex
    )
    new = NewJob("t", "shell", "true", inputs, policy=policy, configuring=True)
    job, _ = await jobs_repo.create(conn, user.id, new)
    return job.id


async def test_a_test_run_failing_with_fail_fast_fails_no_job(pool: Pool) -> None:
    triage = _triage(pool)
    async with pool.acquire() as conn:
        # given a failed test run of a fail_fast job, and another test waiting
        job_id = await _configuring(conn, ["a", "b"], {"fail_fast": True})
        failing = await configuring.start_test(conn, job_id, TrialInput())
        waiting = await configuring.start_test(conn, job_id, TrialInput(index=1))
        await _fail(conn, failing.id, FailureClass.EXIT, await _host(conn))

        # when triaged
        await triage.run_once()

        # then it is given up, alone: no job.failed, nothing revoked
        assert (await _decision(conn, failing.id))[0] == "abandoned"
        assert (await tasks_repo.get(conn, waiting.id)).state is S.NEW  # type: ignore[union-attr]
        events = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE routing_key = $1", f"job.failed.{job_id}"
        )
        assert events == 0


async def test_a_lost_test_run_is_resubmitted_as_a_test_run(pool: Pool) -> None:
    triage = _triage(pool)
    async with pool.acquire() as conn:
        job_id = await _configuring(conn, ["a"], {"restartable": True})
        test = await configuring.start_test(conn, job_id, TrialInput())
        await _fail(conn, test.id, FailureClass.LOST, await _host(conn), pid=None)

        await triage.run_once()

        clone = await tasks_repo.get(conn, (await tasks_repo.get(conn, test.id)).superseded_by)  # type: ignore[arg-type, union-attr]
        assert clone is not None
        assert (clone.test, clone.index, clone.state) == (True, test.index, S.NEW)  # its own


async def test_a_test_run_undecided_at_activation_changes_nothing_after(pool: Pool) -> None:
    triage = _triage(pool)
    async with pool.acquire() as conn:
        # given a lost test run of a restartable fail_fast job, not yet triaged at activation
        job_id = await _configuring(conn, ["a", "b"], {"restartable": True, "fail_fast": True})
        test = await configuring.start_test(conn, job_id, TrialInput())
        await _fail(conn, test.id, FailureClass.LOST, await _host(conn), pid=None)
        await configuring.activate(conn, job_id, "op")

        # when triaged
        await triage.run_once()

        # then it is given up: no clone, the job's own tasks untouched, the job not failed
        decision, reason = await _decision(conn, test.id)
        assert (decision, reason) == ("abandoned", "a test run of a job activated since")
        assert (await tasks_repo.get(conn, test.id)).superseded_by is None  # type: ignore[union-attr]
        job = await jobs_repo.get(conn, job_id)
        assert job is not None
        assert (job.state.value, job.counts) == ("active", {"new": 2})
