"""Hosts' beats through Redis: a service writes its beat on the board, the leading
scheduler writes the board's new beats into `hosts` in one transaction and answers them, and
the answer renews the service's lease as of when that beat was sent. The real PostgreSQL and
Redis; the hosts' rows as the services leave them."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.scheduler.beat_relay import BeatRelay
from services.supervisor.heartbeat import LastBeat, heartbeat
from shared.host.beats import BeatBook, ThroughRedis, through_redis
from shared.host.fence import Lease
from shared.messaging.beat_board import BeatBoard, Kind, field_of
from shared.messaging.redis_client import open_redis
from shared.messaging.redis_keys import RedisKeys
from shared.store import db, hosts_repo
from shared.store.hosts_repo import SupervisorBeat, WorkerBeat
from tests.integration.test_host_beats import _task

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def redis(namespace: str) -> AsyncIterator[Redis]:
    async with open_redis(REDIS_URL) as client:
        yield client
        keys = RedisKeys(namespace)
        await client.delete(keys.beats(), keys.beat_answers())


@pytest.fixture
def board(redis: Redis, namespace: str) -> BeatBoard:
    return BeatBoard(redis, RedisKeys(namespace))


def _via(board: BeatBoard) -> ThroughRedis:
    """A service's way through Redis that reached PostgreSQL just now."""
    book = BeatBook(probe_every_s=60)
    book.reached(time.monotonic())
    return ThroughRedis(board, book)


async def _host(pool: db.Pool, worker_age_s: float = 100.0, worker: bool = True) -> str:
    """A host's row, its services' beats `worker_age_s` old."""
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    await pool.execute(
        "INSERT INTO hosts (id, slots, worker, heartbeat_at, supervisor, supervisor_heartbeat_at)"
        " VALUES ($1, 1, CASE WHEN $2 THEN $1 || '-w' END, now() - make_interval(secs => $3),"
        " $1 || '-s', now() - make_interval(secs => $3))",
        host_id,
        worker,
        worker_age_s,
    )
    return host_id


async def _age(pool: db.Pool, host_id: str, column: str = "heartbeat_at") -> float:
    age = await pool.fetchval(
        f"SELECT extract(epoch FROM now() - {column})::float8 FROM hosts WHERE id = $1", host_id
    )
    assert isinstance(age, float)
    return age


async def _backdate(redis: Redis, namespace: str, seconds: float) -> None:
    """As if the last beat on the board had reached Redis `seconds` earlier."""
    beats = RedisKeys(namespace).beats()
    *head, at = str(await redis.lindex(beats, -1)).split(" ")
    await redis.lset(beats, -1, " ".join([*head, repr(float(at) - seconds)]))


async def _worker_beat(via: ThroughRedis, pool: db.Pool, host_id: str) -> object:
    who = (Kind.WORKER, host_id, f"{host_id}-w")
    return await through_redis(via, pool, who, lambda read: WorkerBeat(*read))


async def test_a_beat_is_written_by_the_leader_and_its_answer_renews_as_of_its_sending(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool)
    via = _via(board)
    assert await _worker_beat(via, pool, host_id) is None  # not answered yet: beat PostgreSQL
    first_sent = via.book.sent[1]
    assert await BeatRelay(pool, board).run_once() == 1
    assert await _age(pool, host_id) < 5  # was 100 s
    answered = await _worker_beat(via, pool, host_id)
    assert answered == (first_sent, WorkerBeat(False, False, False, 0))


async def test_each_beat_is_written_once_and_dated_when_it_reached_redis(
    pool: db.Pool, board: BeatBoard, redis: Redis, namespace: str
) -> None:
    host_id = await _host(pool)
    await board.beat(Kind.WORKER, host_id, f"{host_id}-w", 1)
    await _backdate(redis, namespace, 30)  # reached Redis 30 s ago
    relay = BeatRelay(pool, board)
    assert await relay.run_once() == 1
    assert 29 < await _age(pool, host_id) < 35
    assert await relay.run_once() == 0  # taken: not written again
    await pool.execute("UPDATE hosts SET heartbeat_at = now() WHERE id = $1", host_id)
    await board.beat(Kind.WORKER, host_id, f"{host_id}-w", 2)
    await _backdate(redis, namespace, 30)
    assert await relay.run_once() == 1
    assert await _age(pool, host_id) < 5  # a beat older than the row never makes it older


async def test_of_two_beats_of_a_service_between_two_runs_the_latest_is_answered(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool)
    await board.beat(Kind.WORKER, host_id, f"{host_id}-w", 1)
    await board.beat(Kind.WORKER, host_id, f"{host_id}-w", 2)
    assert await BeatRelay(pool, board).run_once() == 1
    heard = await board.beat(Kind.WORKER, host_id, f"{host_id}-w", 3)
    assert heard.answer is not None and heard.answer.seq == 2


async def test_a_worker_declared_dead_is_not_brought_back_by_its_beats_on_the_board(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool, worker=False)  # declared dead: the row names no worker
    via = _via(board)
    assert await _worker_beat(via, pool, host_id) is None
    assert await BeatRelay(pool, board).run_once() == 0
    row = await pool.fetchrow("SELECT worker FROM hosts WHERE id = $1", host_id)
    assert row is not None and row["worker"] is None
    assert await _age(pool, host_id) > 99
    assert await _worker_beat(via, pool, host_id) is None  # unanswered: it beats PostgreSQL


async def test_a_service_that_has_not_reached_postgresql_lately_beats_it_itself(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool)
    book = BeatBook(probe_every_s=1)
    book.reached(time.monotonic() - 2.5)  # more than two probe periods ago
    assert await _worker_beat(ThroughRedis(board, book), pool, host_id) is None
    assert await board.take() == []  # nothing on the board: the scheduler cannot keep it alive


async def test_a_probe_due_reaches_postgresql_and_keeps_the_beats_on_redis(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool)
    book = BeatBook(probe_every_s=1)
    book.reached(time.monotonic() - 1.5)  # a probe is due, beats through Redis still allowed
    via = ThroughRedis(board, book)
    await _worker_beat(via, pool, host_id)
    await BeatRelay(pool, board).run_once()
    before = time.monotonic()
    assert await _worker_beat(via, pool, host_id) is not None
    assert via.probing is not None
    await via.probing  # beside the beats: they do not wait for it
    assert book.reached_at is not None and book.reached_at >= before


async def test_an_answer_to_an_older_beat_than_the_last_but_one_renews_nothing(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool)
    via = _via(board)
    await _worker_beat(via, pool, host_id)
    await BeatRelay(pool, board).run_once()  # answers beat 1
    await _worker_beat(via, pool, host_id)  # beat 2: answered for 1
    assert await _worker_beat(via, pool, host_id) is None  # beat 3: still answered for 1


async def test_a_supervisors_relayed_beat_reads_what_its_own_beat_reads(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool, worker_age_s=0)
    running = await _task(pool)
    await pool.execute(
        "UPDATE tasks SET state = 'on_cpu', claim = gen_random_uuid(), host = $2,"
        " worker = $2 || '-w', pid = 10, attempt = 1 WHERE id = $1",
        running,
        host_id,
    )
    await pool.execute(
        "UPDATE hosts SET heartbeat_at = now() - interval '11 seconds' WHERE id = $1", host_id
    )
    via, who = _via(board), (Kind.SUPERVISOR, host_id, f"{host_id}-s")
    parse = lambda read: SupervisorBeat(*read)  # noqa: E731
    assert await through_redis(via, pool, who, parse, 10.0) is None
    await BeatRelay(pool, board).run_once()
    answered = await through_redis(via, pool, who, parse, 10.0)
    assert answered is not None
    async with pool.acquire() as conn:
        direct = await hosts_repo.beat_supervisor(conn, host_id, f"{host_id}-s", 10.0)
    assert answered[1] == direct == SupervisorBeat(f"{host_id}-w", True, True, False, False)
    assert await _age(pool, host_id, "supervisor_heartbeat_at") < 5


async def test_the_supervisors_heartbeat_renews_its_lease_through_redis(
    pool: db.Pool, board: BeatBoard
) -> None:
    host_id = await _host(pool, worker_age_s=0)
    via, lease, last = _via(board), Lease(), LastBeat()
    stop = asyncio.Event()
    stop.set()  # one beat each
    await heartbeat(pool, host_id, f"{host_id}-s", 0.01, stop, lease, 10.0, last, via)
    await BeatRelay(pool, board).run_once()
    lease.renewed_at = 0.0  # as if long ago
    await heartbeat(pool, host_id, f"{host_id}-s", 0.01, stop, lease, 10.0, last, via)
    assert lease.renewed_at == via.book.sent[1]
    assert last.beat == SupervisorBeat(f"{host_id}-w", False, False, False, False)


async def test_the_answers_of_services_gone_for_good_are_forgotten(
    pool: db.Pool, board: BeatBoard
) -> None:
    gone, alive = await _host(pool), await _host(pool)
    relay = BeatRelay(pool, board, forget_after_s=0.0)  # gone as soon as not answered
    await board.beat(Kind.WORKER, gone, f"{gone}-w", 1)
    assert await relay.run_once() == 1
    await board.beat(Kind.WORKER, alive, f"{alive}-w", 1)
    assert await relay.run_once() == 1
    assert await board.answered() == [field_of(Kind.WORKER, alive)]


async def test_a_worker_beat_through_redis_refreshes_its_registration(
    board: BeatBoard, redis: Redis, namespace: str
) -> None:
    host_id = f"h-{uuid.uuid4().hex[:10]}"
    key = RedisKeys(namespace).worker(host_id)
    heard = await board.beat(Kind.WORKER, host_id, "w1", 1, registration_ttl_s=10)
    assert not heard.registered  # none to refresh: the worker announces itself again
    await redis.hset(key, "instance", "w1")
    heard = await board.beat(Kind.WORKER, host_id, "w1", 2, registration_ttl_s=10)
    assert heard.registered and 0 < await redis.ttl(key) <= 10
    await redis.delete(key)
