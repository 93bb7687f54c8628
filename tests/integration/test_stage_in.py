"""Stage-in driven by the worker's stage runner on the real PostgreSQL, RabbitMQ and Redis,
against a directory store and the real SeaweedFS: a job's file given by URL and an input's
objects are in the work dir before the command, checked against their sha256; bytes that are
not the ones named fail the setup saying which object and both hashes; a corrupt cache entry
is found and fetched again; a store that fails is waited for, within the worker's patience,
then fails the setup as the platform's, leaving nothing in the cache."""

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from services.worker.stages import StageRunner
from shared.domain.bundle import BundleFile
from shared.domain.messages import RunStage
from shared.domain.states import Stage
from shared.messaging.amqp import open_broker
from shared.messaging.topology import Topology
from shared.objects import open_store
from shared.store import db, jobs_repo, users_repo
from shared.store.jobs_repo import NewJob
from tests.conftest import AMQP_URL, REDIS_URL
from tests.integration.gated_port import gated_port
from tests.integration.object_stores import KINDS, StoreAt, signer_of, store_at
from tests.integration.test_stage_runner import (
    _default_launcher,
    _runner,
    _settings,
    _task,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=KINDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StoreAt]:
    opened = store_at(request.param, request, tmp_path, monkeypatch)
    try:
        yield opened
    finally:
        await opened.store.close()


@asynccontextmanager
async def _runner_on(
    pool: db.Pool, database_url: str, namespace: str, work_root: Path, store: StoreAt, **more: Any
) -> AsyncIterator[StageRunner]:
    """The stage runner of a host of its own (its work root `work_root`) of the store, as a
    worker runs by default (as root, as here): its jobs confined, so the cache's entries are
    linked into their work dirs. `more`: other settings of the worker."""
    settings = _settings(
        database_url, namespace, work_root, default=True, **(store.settings() | more)
    )
    redis = Redis.from_url(REDIS_URL)
    try:
        async with (
            signer_of(store, pool, namespace),
            open_broker(AMQP_URL, Topology(namespace), name="test-stage-in") as broker,
        ):
            launcher = _default_launcher(settings, pool)
            made = _runner(settings, pool, broker, redis, launcher=launcher)
            yield made
            await made.background_done()
            await made.writer.nudged()
            await made.stores.close()
    finally:
        await redis.aclose()


@pytest.fixture
async def runner(
    pool: db.Pool, session_database_url: str, namespace: str, passable_dir: Path, store: StoreAt
) -> AsyncIterator[StageRunner]:
    async with _runner_on(pool, session_database_url, namespace, passable_dir, store) as made:
        yield made


async def _object(store: StoreAt, tmp_path: Path, data: bytes) -> dict[str, str]:
    source = tmp_path / uuid.uuid4().hex
    source.write_bytes(data)
    info = await store.store.put_file(f"shared/{uuid.uuid4().hex}.bin", source)
    return {"url": store.url_of(info.key), "sha256": hashlib.sha256(data).hexdigest()}


async def _ran(
    pool: db.Pool,
    runner: StageRunner,
    command: str,
    inputs: list[Any],
    files: list[BundleFile],
    **job: Any,
) -> list[str]:
    """Given a job of these inputs and files by reference (`job`: its other fields, `owner`
    its owner's id, else a new user's), claimed as the dispatcher would, each task driven by
    the runner in turn; the ids of its tasks."""
    async with pool.acquire() as conn:
        owner = (
            job.pop("owner", None)
            or (await users_repo.ensure_user(conn, f"u-{uuid.uuid4().hex[:8]}", "user", "x")).id
        )
        made, _ = await jobs_repo.create(
            conn, owner, NewJob("s", "shell", command, inputs, referenced=files, **job)
        )
    task_ids = []
    for index in range(len(inputs)):
        claim = uuid.uuid4()
        task_id = await pool.fetchval(
            "UPDATE tasks SET claim = $3 WHERE job_id = $1 AND index = $2 RETURNING id",
            made.id,
            index,
            claim,
        )
        held = await runner.take(
            RunStage(job_id=made.id, task_id=task_id, stage=Stage.SETUP, claim=claim)
        )
        assert held is not None
        await runner.drive(held)
        task_ids.append(task_id)
    return task_ids


async def _lines(pool: db.Pool, task_id: str) -> list[str]:
    rows = await pool.fetch("SELECT line FROM logs WHERE task_id = $1 ORDER BY seq", task_id)
    return [r["line"] for r in rows]


async def test_a_jobs_file_and_an_inputs_objects_are_staged_once_and_read_by_the_command(
    runner: StageRunner, pool: db.Pool, store: StoreAt, tmp_path: Path
) -> None:
    shared_data, own = os.urandom(300_000), os.urandom(1000)
    genome = await _object(store, tmp_path, shared_data)
    reads = [await _object(store, tmp_path, own + bytes([n])) for n in range(2)]
    files = [BundleFile("ref/genome.fa", len(shared_data), genome["sha256"], False, genome["url"])]
    inputs = [{"sample": n, "objects": {"in/reads.bam": ref}} for n, ref in enumerate(reads)]

    task_ids = await _ran(
        pool,
        runner,
        "sha256sum ref/genome.fa in/reads.bam; id -u; touch ref/genome.fa || true",
        inputs,
        files,
    )

    for task_id, ref in zip(task_ids, reads, strict=True):
        assert (await _task(pool, task_id))["state"] == "completed"
        lines = await _lines(pool, task_id)
        assert lines[:2] == [
            f"{genome['sha256']}  ref/genome.fa",
            f"{ref['sha256']}  in/reads.bam",
        ]
        assert lines[2] != "0"  # confined: the entries it reads are root's, read-only
    cache = runner.stager.cache
    assert (cache.fetches, cache.hits) == (3, 1)  # the shared file once, each input's own
    entry = cache.root / "objects" / genome["sha256"]
    assert entry.read_bytes() == shared_data and entry.stat().st_nlink == 3  # linked, no copy


async def test_bytes_not_the_ones_named_fail_the_setup_naming_the_object_and_both_hashes(
    runner: StageRunner, pool: db.Pool, store: StoreAt, tmp_path: Path
) -> None:
    held = await _object(store, tmp_path, b"what the store holds")
    named = hashlib.sha256(b"what the user named").hexdigest()
    url = held["url"]

    [task_id] = await _ran(
        pool, runner, "echo never", [{"objects": {"data.bin": {"url": url, "sha256": named}}}], []
    )

    task = await _task(pool, task_id)
    assert (task["state"], task["failure_class"]) == ("failed_to_setup", "checksum")
    assert task["error_brief"] == (
        f"object data.bin ({url}) is not the one named: its bytes have sha256"
        f" {held['sha256']}, not {named}"
    )
    assert await _lines(pool, task_id) == []
    assert os.listdir(runner.stager.cache.root / "objects") == []


async def test_an_object_corrupted_in_the_store_is_fetched_again_then_fails_the_setup_saying_so(
    runner: StageRunner, pool: db.Pool, store: StoreAt, tmp_path: Path
) -> None:
    # given: an object named by its sha256, whose bytes in the store then rot (same size)
    data = os.urandom(100_000)
    ref = await _object(store, tmp_path, data)
    key = ref["url"].removeprefix(f"{store.url}/")
    rotten = tmp_path / "rotten"
    rotten.write_bytes(b"rot" + data[3:])
    await store.store.delete([key])
    await store.store.put_file(key, rotten)

    # when
    [task_id] = await _ran(pool, runner, "echo never", [{"objects": {"data.bin": ref}}], [])

    # then: fetched twice (a garbled transfer would have been cured), then failed with its cause
    task = await _task(pool, task_id)
    got = hashlib.sha256(rotten.read_bytes()).hexdigest()
    assert (task["state"], task["failure_class"]) == ("failed_to_setup", "checksum")
    assert task["error_brief"] == (
        f"object data.bin ({ref['url']}) is not the one named: its bytes have sha256 {got},"
        f" not {ref['sha256']}"
    )
    assert runner.stager.cache.fetches == 2
    assert _settled(runner) == ([], [])


@pytest.mark.parametrize("store", ["s3"], indirect=True)
async def test_a_corrupt_cache_entry_is_found_and_fetched_again(
    runner: StageRunner, pool: db.Pool, store: StoreAt, tmp_path: Path
) -> None:
    data = os.urandom(100_000)
    ref = await _object(store, tmp_path, data)
    objects = {"objects": {"data.bin": ref}}
    await _ran(pool, runner, "true", [objects], [])
    entry = runner.stager.cache.root / "objects" / ref["sha256"]
    with entry.open("r+b") as handle:  # the disk's rot, or an operator's mistake
        handle.write(b"rot")

    [task_id] = await _ran(pool, runner, "sha256sum data.bin", [objects], [])

    assert await _lines(pool, task_id) == [f"{ref['sha256']}  data.bin"]
    assert (runner.stager.cache.fetches, runner.stager.cache.corrupt) == (2, 1)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
async def test_a_chained_task_on_another_host_reads_its_upstream_output_from_the_store(
    runner: StageRunner,
    pool: db.Pool,
    store: StoreAt,
    session_database_url: str,
    namespace: str,
    passable_dir: Path,
) -> None:
    # given an output over the 1 MiB kept in the database, made on one host
    make = "head -c 3000000 /dev/urandom > big.bin"
    [upstream] = await _ran(pool, runner, make, [""], [], outputs=["big.bin"])
    made = await pool.fetchrow(
        "SELECT j.owner_id, o.sha256, o.object_key, o.content IS NULL AS not_kept"
        " FROM task_outputs o JOIN tasks t ON t.id = o.task_id JOIN jobs j ON j.id = t.job_id"
        " WHERE o.task_id = $1",
        upstream,
    )
    assert made is not None and made["object_key"] is not None and made["not_kept"]

    # when a task chained from it is set up on another host
    other_root = passable_dir / "other-host"
    other_root.mkdir(mode=0o711)
    async with _runner_on(pool, session_database_url, namespace, other_root, store) as other:
        [chained] = await _ran(
            pool,
            other,
            'sha256sum big.bin; echo "$VIGIL_INPUT"',
            [{"upstream_task": upstream}],
            [],
            owner=made["owner_id"],
        )

        # then it read the output from the store, through that host's cache
        assert (await _task(pool, chained))["state"] == "completed"
        lines = await _lines(pool, chained)
        assert lines[0] == f"{made['sha256']}  big.bin"
        placed = json.loads(lines[1])["outputs"]["big.bin"]
        assert placed.startswith(f"{other_root}/")  # a file of its own work dir
        assert (other.stager.cache.fetches, other.stager.cache.fetched_bytes) == (1, 3000000)


def _settled(runner: StageRunner) -> tuple[list[str], list[str]]:
    """The cache's entries and its temporary files."""
    root = runner.stager.cache.root
    return os.listdir(root / "objects"), os.listdir(root / "tmp")


async def test_a_store_that_stays_unreachable_fails_the_setup_as_the_platforms_after_the_patience(
    caplog: pytest.LogCaptureFixture,
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    passable_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    async with gated_port("127.0.0.1", 9) as gate:  # never opened: a store that is down
        nowhere = StoreAt(
            open_store("s3://nowhere/vigil", gate.url), "s3://nowhere/vigil", gate.url
        )
        url = nowhere.url_of("shared/data.bin")
        objects = {"objects": {"data.bin": {"url": url, "sha256": "ab" * 32}}}
        async with _runner_on(
            pool, session_database_url, namespace, passable_dir, nowhere, store_patience_s=3.0
        ) as runner:
            [task_id] = await _ran(pool, runner, "echo never", [objects], [])
        await nowhere.store.close()

    task = await _task(pool, task_id)
    tries = [r for r in caplog.records if "not fetched yet" in r.getMessage()]
    assert len(tries) >= 2  # it waited for the store, trying again
    assert gate.refused > len(tries)
    assert (task["state"], task["failure_class"]) == ("failed_to_setup", "platform")
    assert task["error_brief"].startswith(
        f"object data.bin ({url}) could not be fetched: the object store failed for "
    )
    assert "s (VIGIL_STORE_PATIENCE_S): " in task["error_brief"]
    assert await _lines(pool, task_id) == []
    assert _settled(runner) == ([], [])  # nothing that looks complete, nothing half-fetched


async def test_a_store_back_within_the_patience_is_waited_for_and_the_task_runs(
    caplog: pytest.LogCaptureFixture,
    pool: db.Pool,
    session_database_url: str,
    namespace: str,
    passable_dir: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = store_at("s3", request, tmp_path, monkeypatch)
    data = os.urandom(100_000)
    ref = await _object(real, tmp_path, data)
    endpoint = urlsplit(real.endpoint_url)
    assert endpoint.hostname is not None and endpoint.port is not None
    async with gated_port(endpoint.hostname, endpoint.port) as gate:
        gated = StoreAt(open_store(real.url, gate.url), real.url, gate.url)
        async with _runner_on(
            pool, session_database_url, namespace, passable_dir, gated, store_patience_s=60.0
        ) as runner:
            # when: the store is down while the task is set up, and comes back
            ran = asyncio.create_task(
                _ran(pool, runner, "sha256sum data.bin", [{"objects": {"data.bin": ref}}], [])
            )
            await gate.refusals(4)  # more than one try of the worker's (each: 3 connections)
            gate.open()
            [task_id] = await ran
        await gated.store.close()
    await real.store.close()

    # then: it waited, tried again, and ran with the object
    task = await _task(pool, task_id)
    assert task["state"] == "completed", task
    assert [r for r in caplog.records if "not fetched yet" in r.getMessage()]
    assert await _lines(pool, task_id) == [f"{ref['sha256']}  data.bin"]
    assert _settled(runner) == ([ref["sha256"]], [])
