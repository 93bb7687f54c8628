"""Stage-out on a real worker's stage runner: a task completes only with its outputs in the
object store (under keys of their own, with their sha256), a store that cannot be reached
fails the task as the platform's after the worker's patience, and a job without outputs never
calls the store."""

import hashlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.worker.stages import StageRunner
from shared.domain.messages import RunStage
from shared.domain.states import Stage
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology
from shared.objects import ObjectInfo, open_store
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.object_stores import StoreAt, signer_of
from tests.integration.test_stage_runner import _runner, _settings, _task

pytestmark = pytest.mark.integration

#: Two outputs: one small, one over a multipart part.
COMMAND = "printf 'small %s' \"$VIGIL_INPUT\" > small.txt && head -c 9000000 /dev/urandom > big.bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def _runner_on(
    pool: db.Pool, database_url: str, namespace: str, root: Path, store_url: str, **more: Any
) -> AsyncIterator[StageRunner]:
    """A host's stage runner of the store at `store_url`; an S3 one's signer (the control
    plane's, with the credentials of the test's environment) answering it meanwhile."""
    settings = _settings(database_url, namespace, root, store_url=store_url, **more)
    endpoint = os.environ.get("VIGIL_S3_ENDPOINT_URL", "")
    at = StoreAt(open_store(store_url, endpoint), store_url, endpoint)
    redis = Redis.from_url(REDIS_URL)
    try:
        async with (
            signer_of(at, pool, namespace),
            open_broker(AMQP_URL, Topology(namespace), name="test-stage-out") as broker,
        ):
            made = _runner(settings, pool, broker, redis)
            try:
                yield made
            finally:
                await made.stores.close()
    finally:
        await redis.aclose()


async def _claimed(pool: db.Pool, command: str, outputs: list[str]) -> RunStage:
    """Given-step: a job of one task with `outputs`, claimed as the dispatcher would."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(
            conn, user.id, NewJob("s", "shell", command, ["a"], outputs=outputs)
        )
        claim = uuid.uuid4()
        task_id = await conn.fetchval(
            "UPDATE tasks SET claim = $2 WHERE job_id = $1 RETURNING id", job.id, claim
        )
    return RunStage(job_id=job.id, task_id=task_id, stage=Stage.SETUP, claim=claim)


async def _drive(runner: StageRunner, message: RunStage) -> dict[str, Any]:
    held = await runner.take(message)
    assert held is not None
    await runner.drive(held)
    return await _task(runner.pool, message.task_id)


@pytest.fixture(params=["directory", "s3"])
async def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    if request.param == "directory":
        return (tmp_path / "store").as_uri()
    env: dict[str, str] = request.getfixturevalue("s3_env")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("VIGIL_S3_ENDPOINT_URL", env["VIGIL_S3_ENDPOINT_URL"])
    return f"{env['VIGIL_STORE_URL']}/stage-out-{uuid.uuid4().hex[:8]}"


async def test_a_task_completes_with_every_output_in_the_store(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path, store_url: str
) -> None:
    message = await _claimed(pool, COMMAND, ["small.txt", "big.bin"])
    async with _runner_on(pool, session_database_url, namespace, tmp_path, store_url) as runner:
        task = await _drive(runner, message)
    store = open_store(store_url, os.environ.get("VIGIL_S3_ENDPOINT_URL", ""))

    assert task["state"] == "completed"
    rows = await pool.fetch(
        "SELECT name, size, sha256, object_key FROM task_outputs WHERE task_id = $1 ORDER BY name",
        message.task_id,
    )
    workdir = Path(task["workdir"])
    for row in rows:
        made = (workdir / row["name"]).read_bytes()
        assert (row["size"], row["sha256"]) == (len(made), hashlib.sha256(made).hexdigest())
        assert row["object_key"] == (
            f"outputs/{message.job_id}/{message.task_id}/3/{row['name']}"  # post-processing's
        )
        stored = await store.head(row["object_key"])
        assert stored == ObjectInfo(row["object_key"], row["size"], row["sha256"])
        copy = tmp_path / f"copy-{row['name']}"
        await store.get_file(row["object_key"], copy)
        assert copy.read_bytes() == made
    assert [r["name"] for r in rows] == ["big.bin", "small.txt"]


async def test_an_unreachable_store_fails_the_task_as_the_platforms_after_the_patience(
    caplog: pytest.LogCaptureFixture,
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VIGIL_S3_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    message = await _claimed(pool, "echo x > out.txt", ["out.txt"])
    async with _runner_on(
        pool, session_database_url, namespace, tmp_path, "s3://nowhere/vigil", store_patience_s=4.0
    ) as runner:
        task = await _drive(runner, message)

    tries = [r for r in caplog.records if "not stored yet" in r.getMessage()]
    assert len(tries) >= 2  # it waited for the store, trying again
    assert (task["state"], task["failure_class"]) == ("failed_to_post_process", "platform")
    assert task["error_brief"].startswith(
        "output out.txt could not be stored: the object store s3://nowhere/vigil failed for "
    )
    recorded = await pool.fetchval(
        "SELECT count(*) FROM task_outputs WHERE task_id = $1", message.task_id
    )
    assert recorded == 0  # nothing recorded as stored


async def test_a_job_without_outputs_never_calls_the_store(
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: a store that would fail any call (nothing listens there), with a long patience
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VIGIL_S3_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    message = await _claimed(pool, "echo done", [])
    async with _runner_on(
        pool,
        session_database_url,
        namespace,
        tmp_path,
        "s3://nowhere/vigil",
        store_patience_s=600.0,
    ) as runner:
        task = await _drive(runner, message)

    assert task["state"] == "completed"


async def test_a_pattern_declares_every_file_it_matches_and_one_matching_none_is_missing(
    pool: db.Pool, session_database_url: str, namespace: str, tmp_path: Path
) -> None:
    store_url = (tmp_path / "store").as_uri()
    made = "echo a > a.png && echo b > b.png && echo h > .h.png && mkdir d.png && echo r > r.txt"
    matched = await _claimed(pool, made, ["*.png", "r.txt"])
    unmatched = await _claimed(pool, made, ["*.jpg"])
    async with _runner_on(pool, session_database_url, namespace, tmp_path, store_url) as runner:
        done = await _drive(runner, matched)
        failed = await _drive(runner, unmatched)

    assert done["state"] == "completed"
    rows = await pool.fetch(
        "SELECT name, object_key FROM task_outputs WHERE task_id = $1 ORDER BY name",
        matched.task_id,
    )
    assert [r["name"] for r in rows] == ["a.png", "b.png", "r.txt"]  # no dot file, no dir
    assert all(r["object_key"] for r in rows)
    assert (failed["state"], failed["failure_class"]) == ("failed_on_cluster", "exit")
    assert failed["error_brief"] == "output *.jpg was not written"
