"""Health: the status a service's checks make, what its lease and its leadership say,
and what a probe answers before the service is up, when its checks hang or fail, and when many
ask at once."""

import asyncio
import time

import pytest

from services.scheduler.health import leading
from shared.host import fence
from shared.host.fence import Lease
from shared.runtime.health import Check, Health, answer, http_status, status, summary

OK = Check(True, "answers")


def test_a_service_whose_checks_all_hold_is_ok() -> None:
    assert status({"database": OK, "broker": OK}) == "ok"
    assert status({}) == "ok"


def test_a_failing_fact_changes_nothing() -> None:
    checks = {"database": OK, "leading": Check(False, "standing by", "none")}

    assert status(checks) == "ok"
    assert http_status(status(checks)) == 200


def test_a_failing_check_makes_the_service_what_it_says() -> None:
    away = Check(False, "reconnecting to Redis")
    gone = Check(False, "reconnecting to PostgreSQL", "unavailable")

    assert status({"database": OK, "redis": away}) == "degraded"
    assert status({"database": gone, "redis": away}) == "unavailable"
    assert http_status("degraded") == 200
    assert http_status("unavailable") == 503


def test_the_answer_names_the_service_its_status_and_each_check() -> None:
    body = answer("worker", {"database": OK, "broker": Check(False, "reconnecting to RabbitMQ")})

    assert body == {
        "service": "worker",
        "status": "degraded",
        "checks": {
            "database": {"ok": True, "detail": "answers"},
            "broker": {"ok": False, "detail": "reconnecting to RabbitMQ"},
        },
    }


def test_the_summary_line_says_the_status_and_what_fails_for_a_service_and_for_the_api() -> None:
    standby = answer("scheduler", {"database": OK, "leading": leading(False, OK)})
    api = {"status": "degraded", "reasons": ["no scheduler is leading", "reconnecting to Redis"]}

    assert summary(answer("worker", {"database": OK})) == "ok"
    assert summary(standby) == "ok: standing by: another scheduler leads"
    assert summary(api) == "degraded: no scheduler is leading; reconnecting to Redis"


def test_a_scheduler_says_whether_it_leads_and_a_standby_is_still_healthy() -> None:
    down = Check(False, "reconnecting to PostgreSQL", "unavailable")

    assert leading(True, OK) == Check(True, "leading")
    assert leading(False, OK) == Check(False, "standing by: another scheduler leads", "none")
    assert leading(False, down).detail == "not leading: PostgreSQL does not answer"
    assert status({"leading": leading(False, OK)}) == "ok"


def _aged(seconds: float) -> Lease:
    return Lease(renewed_at=time.monotonic() - seconds)


def test_a_fresh_lease_says_the_database_hears_the_host_and_it_is_not_fenced() -> None:
    checks = fence.health(_aged(0.5), heartbeat_s=1.0, fence_timeout_s=60.0)

    assert status(checks) == "ok"
    assert checks["database"].detail.startswith("last heartbeat landed 0.5 s ago")
    assert checks["fence"].detail.endswith("this host fences itself at 30 s")


def test_a_lease_older_than_a_few_heartbeats_says_degraded_no_database() -> None:
    checks = fence.health(_aged(12), heartbeat_s=1.0, fence_timeout_s=60.0)

    assert status(checks) == "degraded"
    assert checks["database"] == Check(False, "no heartbeat has reached PostgreSQL for 12 s")
    assert checks["fence"].ok


def test_a_lapsed_lease_says_unavailable_fenced() -> None:
    checks = fence.health(_aged(31), heartbeat_s=1.0, fence_timeout_s=60.0)

    assert status(checks) == "unavailable"
    assert checks["fence"].detail.startswith("fenced: cut off from PostgreSQL for 31 s")
    assert not checks["database"].ok


async def test_before_it_is_up_a_service_is_unavailable_saying_what_its_start_waits_for() -> None:
    health = Health("worker")
    health.starting("connecting to RabbitMQ")

    body = await health.answer()

    assert body["status"] == "unavailable"
    assert body["checks"] == {
        "started": {"ok": False, "detail": "starting: connecting to RabbitMQ"}
    }


async def test_once_up_its_probe_speaks_after_the_started_check() -> None:
    health = Health("worker")

    async def probe() -> dict[str, Check]:
        return {"redis": Check(False, "reconnecting to Redis")}

    health.up(probe)
    body = await health.answer()

    assert body["status"] == "degraded"
    assert list(body["checks"]) == ["started", "redis"]
    assert body["checks"]["started"]["ok"]


@pytest.mark.parametrize(
    ("behaviour", "detail"),
    [("hangs", "the checks took more than 0.05 s"), ("raises", "the checks failed: ")],
)
async def test_a_probe_that_hangs_or_raises_answers_unavailable(
    behaviour: str, detail: str
) -> None:
    health = Health("scheduler", timeout_s=0.05)

    async def probe() -> dict[str, Check]:
        if behaviour == "raises":
            raise RuntimeError("a bug")
        await asyncio.Event().wait()
        raise AssertionError("never")

    health.up(probe)
    checks = await health.checks()

    assert status(checks) == "unavailable"
    assert checks["probe"].detail.startswith(detail)


async def test_probes_asked_for_together_run_the_checks_once() -> None:
    health = Health("scheduler")
    release, runs = asyncio.Event(), []

    async def probe() -> dict[str, Check]:
        runs.append(1)
        await release.wait()
        return {"database": OK}

    health.up(probe)
    asking = [asyncio.create_task(health.checks()) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    answers = await asyncio.gather(*asking)

    assert runs == [1]
    assert all(a["database"] == OK for a in answers)
    await health.checks()  # a later probe runs them again
    assert runs == [1, 1]
