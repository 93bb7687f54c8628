"""A host reaches the real SeaweedFS with no credential, each request signed by the control
plane's signer over the real RabbitMQ, after PostgreSQL says it may: a task's host reads what
the task names and writes only its own outputs while it post-processes them; anything else is
refused, saying why. The signed links themselves: write-once, whole or invisible, resumable,
and worthless with a wrong secret."""

import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis

from bench.stage_out import InProcessSigning
from services.scheduler.signer import Links
from services.worker.stages import StageRunner
from shared.domain.messages import RunStage, SignOp, SignRequest
from shared.domain.states import Stage
from shared.messaging.amqp import open_broker
from shared.messaging.signing import SignerClient, TaskSigning
from shared.messaging.topology import Topology
from shared.objects import CHUNK_BYTES, ContentChanged, ObjectExists, ObjectStoreError
from shared.objects.presign import Credentials
from shared.objects.signed import AccessRefused, SignedStore, http_client
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.object_stores import StoreAt, signer_of, store_at
from tests.integration.test_stage_runner import _runner, _settings, _task

pytestmark = pytest.mark.integration


@pytest.fixture
async def s3(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StoreAt]:
    """A prefix of the SeaweedFS of its own, opened with the credentials (the test's)."""
    at = store_at("s3", request, tmp_path, monkeypatch)
    try:
        yield at
    finally:
        await at.store.close()


async def _object(s3: StoreAt, tmp_path: Path, data: bytes) -> dict[str, str]:
    source = tmp_path / uuid.uuid4().hex
    source.write_bytes(data)
    info = await s3.store.put_file(f"data/{uuid.uuid4().hex}", source)
    return {"url": s3.url_of(info.key), "sha256": hashlib.sha256(data).hexdigest()}


async def _taken(runner: StageRunner, pool: db.Pool, value: Any) -> tuple[RunStage, Any]:
    """Given a job of one task of input `value` (output `out.txt`), claimed and taken by
    `runner`'s host (setting up): its message and its tenure."""
    async with pool.acquire() as conn:
        user = await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")
        job, _ = await jobs_repo.create(
            conn,
            user.id,
            NewJob("s", "shell", "cat in.bin > out.txt", [value], outputs=["out.txt"]),
        )
    claim = uuid.uuid4()
    task_id = await pool.fetchval(
        "UPDATE tasks SET claim = $2 WHERE job_id = $1 RETURNING id", job.id, claim
    )
    message = RunStage(job_id=job.id, task_id=task_id, stage=Stage.SETUP, claim=claim)
    held = await runner.take(message)
    assert held is not None and held.state == "setting_up"
    return message, held


async def test_a_host_reads_what_its_task_names_and_writes_only_its_own_outputs(
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    tmp_path: Path,
    s3: StoreAt,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    named = await _object(s3, tmp_path, b"named by the input")
    other = await _object(s3, tmp_path, b"named by nobody")
    settings = _settings(session_database_url, namespace, tmp_path, store_url=s3.url)
    redis = Redis.from_url(REDIS_URL)
    async with (
        signer_of(s3, pool, namespace),
        open_broker(AMQP_URL, Topology(namespace), name="test-signer-host") as broker,
    ):
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
            monkeypatch.delenv(name)  # the host's process holds none
        runner = _runner(settings, pool, broker, redis)
        message, held = await _taken(runner, pool, {"objects": {"in.bin": named}})
        client = SignerClient(broker.connection, broker.topology)
        own = TaskSigning(client, settings.host_id, message.task_id, message.claim)
        key = named["url"].removeprefix(s3.url + "/")
        output = f"outputs/{message.job_id}/{message.task_id}/3/out.txt"

        # when: the host asks for what its task names, and for what it does not
        [url] = (await own("get", key)).urls
        refusals = {}
        asked: list[tuple[str, TaskSigning, SignOp, str]] = [
            ("unnamed", own, "get", other["url"].removeprefix(s3.url + "/")),
            ("early", own, "put", output),
            ("other task", own, "put", f"outputs/{message.job_id}/t-other/3/out.txt"),
            ("other host", replace(own, host_id="h-elsewhere"), "get", key),
            ("other claim", replace(own, claim=uuid.uuid4()), "get", key),
            ("bad key", own, "get", "../secrets"),
        ]
        for what, signing, op, asked_key in asked:
            with pytest.raises(AccessRefused) as refused:
                await signing(op, asked_key, sha256="0" * 64)
            refusals[what] = str(refused.value)
        await runner.drive(held)  # its own output, put while it post-processes
        task = await _task(pool, message.task_id)
        with pytest.raises(AccessRefused) as late:
            await own("put", output, sha256="0" * 64)
        await runner.stores.close()
    await redis.aclose()

    async with httpx.AsyncClient() as http:
        assert (await http.get(url)).content == b"named by the input"
    task_id = message.task_id
    assert refusals == {
        "unnamed": refusals["unnamed"],  # the key is random: checked below
        "early": f"the store's signer refused to put {output}: task {task_id} is setting_up:"
        " attempt 3 is not its open post-processing attempt on this host",
        "other task": f"the store's signer refused to put outputs/{message.job_id}/t-other/3/"
        f"out.txt: outputs/{message.job_id}/t-other/3/out.txt is not an output key of task"
        f" {task_id}",
        "other host": f"the store's signer refused to get {key}: task {task_id} is not held by"
        f" host h-elsewhere under this claim (it is setting_up on host {settings.host_id})",
        "other claim": f"the store's signer refused to get {key}: task {task_id} is not held by"
        f" host {settings.host_id} under this claim (it is setting_up on host"
        f" {settings.host_id})",
        "bad key": "the store's signer refused to get ../secrets: not a valid object key:"
        " '../secrets'",
    }
    assert refusals["unnamed"].endswith(
        f"task {task_id} names no object {other['url'].removeprefix(s3.url + '/')} (its job's"
        " files, its input, its upstream)"
    )
    assert task["state"] == "completed", task
    stored = await s3.store.head(output)
    assert (stored.size, stored.sha256) == (18, hashlib.sha256(b"named by the input").hexdigest())
    assert "is not held by host" in str(late.value)  # completed: no longer its host's


@pytest.fixture
async def signed(s3: StoreAt) -> AsyncIterator[tuple[SignedStore, Links]]:
    links = Links.of_store(s3.url, s3.endpoint_url, 60)
    async with http_client() as http:
        yield SignedStore(s3.url, InProcessSigning(links), http), links


@pytest.mark.parametrize("size", [0, 1000, 2 * CHUNK_BYTES + 12345])
async def test_a_signed_put_is_written_once_and_reads_back_whole_and_from_an_offset(
    signed: tuple[SignedStore, Links], s3: StoreAt, tmp_path: Path, size: int
) -> None:
    store, _ = signed
    data = os.urandom(size)
    (tmp_path / "src").write_bytes(data)
    (tmp_path / "other").write_bytes(os.urandom(size))

    info = await store.put_file("outputs/j/t/1/r.bin", tmp_path / "src")
    with pytest.raises(ObjectExists):
        await store.put_file("outputs/j/t/1/r.bin", tmp_path / "other")

    assert (info.size, info.sha256) == (size, hashlib.sha256(data).hexdigest())
    assert await s3.store.head(info.key) == info  # as the credentialed client sees it
    assert await store.head(info.key) == info
    (tmp_path / "dest").write_bytes(data[: size // 3] + b"cut")
    written = await store.get_file(info.key, tmp_path / "dest", offset=size // 3)
    assert (written, (tmp_path / "dest").read_bytes()) == (size - size // 3, data)


async def test_a_multipart_put_of_other_bytes_than_named_leaves_nothing(
    signed: tuple[SignedStore, Links], s3: StoreAt, tmp_path: Path
) -> None:
    store, _ = signed
    (tmp_path / "src").write_bytes(os.urandom(CHUNK_BYTES + 1))

    with pytest.raises(ContentChanged):
        await store.put_file("outputs/j/t/1/big", tmp_path / "src", sha256="0" * 64)

    assert await s3.store.list_prefix("outputs/j/t/1") == []


async def test_a_link_signed_with_another_secret_is_refused_by_the_store(
    signed: tuple[SignedStore, Links], s3: StoreAt, tmp_path: Path
) -> None:
    store, links = signed
    (tmp_path / "src").write_bytes(b"x")
    await store.put_file("outputs/j/t/1/x", tmp_path / "src")
    key = links.presigner.credentials.access_key
    forged = replace(
        links,
        presigner=replace(links.presigner, credentials=Credentials(key, "not-the-secret")),
    )
    async with http_client() as http:
        thief = SignedStore(s3.url, InProcessSigning(forged), http)
        with pytest.raises(ObjectStoreError, match="403"):
            await thief.head("outputs/j/t/1/x")


async def test_a_hosts_asking_goes_on_after_the_broker_closed_its_channel(
    pool: db.Pool, namespace: str, s3: StoreAt
) -> None:
    async with (
        signer_of(s3, pool, namespace),
        open_broker(AMQP_URL, Topology(namespace), name="test-signer-channel") as broker,
    ):
        client = SignerClient(broker.connection, broker.topology)
        asked = SignRequest(host_id="h", task_id="t", claim=UUID(int=0), op="get", key="k")
        assert (await client.ask(asked)).refused == "no task t"
        channel = await client._open()
        # when: the broker closes the channel (as for a protocol error)
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.get_exchange(f"missing-{uuid.uuid4().hex}", ensure=True)

        # then: the next request is answered on the channel made again
        assert (await client.ask(asked)).refused == "no task t"
