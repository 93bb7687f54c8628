"""`vigil.Client` against the real api served over HTTP (uvicorn in a thread, session database).

No scheduler or worker runs here: jobs stay where the api puts them, log lines are stored by
the test, and jobs end by being cancelled. tests/e2e/test_cli.py runs jobs to their end.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import pytest
import uvicorn

from bench.cluster import free_port
from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.domain.messages import LogRecord, Severity, TaskEvent, encode
from shared.domain.states import FailureClass, TaskState
from shared.messaging.topology import Topology, declare_events_exchange, event_key
from shared.store import db, logs_repo, outbox, users_repo
from tests.conftest import AMQP_URL, REDIS_URL
from tests.installed_cli import run_vigil
from vigil import (
    Client,
    Conflict,
    Event,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unauthorized,
    Unreachable,
    WaitTimeout,
    calls,
)

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Served:
    """The api at `url`, and tokens of the bootstrap operator and of two plain users."""

    url: str
    database_url: str
    namespace: str
    operator_token: str
    user_token: str
    other_token: str

    def client(self, token: str | None = None, **options: Any) -> Client:
        return Client(self.url, token or self.user_token, poll_s=0.05, **options)


async def _delete_events_exchange(namespace: str) -> None:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        await channel.exchange_delete(Topology(namespace).events_exchange)
    finally:
        await connection.close()


def _publish(namespace: str, *messages: TaskEvent) -> None:
    """Publish task events to the namespace's events exchange, as the scheduler's relay does."""

    async def publish() -> None:
        connection = await aio_pika.connect(AMQP_URL, timeout=10)
        try:
            exchange = await declare_events_exchange(
                await connection.channel(), Topology(namespace)
            )
            for message in messages:
                key = event_key("task", message.state.value, message.job_id)
                await exchange.publish(aio_pika.Message(encode(message)), key)
        finally:
            await connection.close()

    asyncio.run(publish())


async def _make_user(database_url: str) -> str:
    token = uuid.uuid4().hex
    async with db.open_pool(database_url, max_size=1) as pool, pool.acquire() as conn:
        await users_repo.ensure_user(conn, f"cli-{uuid.uuid4().hex[:8]}", "user", token)
    return token


@pytest.fixture(scope="module")
def served(session_database_url: str) -> Iterator[Served]:
    token = uuid.uuid4().hex
    namespace = f"cli-{uuid.uuid4().hex[:10]}"
    settings = ApiSettings(
        database_url=session_database_url,
        amqp_url=AMQP_URL,
        redis_url=REDIS_URL,
        namespace=namespace,
        bootstrap_token=token,
        max_inputs=5,
        submit_rate_per_s=1000,
        submit_burst=1000,
    )
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # set by uvicorn once the lifespan ran and the socket listens
        assert thread.is_alive() and time.monotonic() < deadline, "the api did not start"
        time.sleep(0.01)
    try:
        yield Served(
            url=f"http://127.0.0.1:{port}",
            database_url=session_database_url,
            namespace=namespace,
            operator_token=token,
            user_token=asyncio.run(_make_user(session_database_url)),
            other_token=asyncio.run(_make_user(session_database_url)),
        )
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        asyncio.run(_delete_events_exchange(namespace))


@pytest.fixture
def client(served: Served) -> Iterator[Client]:
    with served.client() as c:
        yield c


def _store_lines(
    served: Served, job_id: str, task_id: str, lines: list[str], first_no: int = 0
) -> None:
    records = [
        LogRecord(
            job_id=job_id,
            task_id=task_id,
            run_number=1,
            attempt=1,
            line_no=number,
            severity=Severity.ERROR if line.startswith("ERROR") else Severity.INFO,
            stream="stdout",
            line=line,
        )
        for number, line in enumerate(lines, start=first_no)
    ]

    async def insert() -> None:
        async with db.open_pool(served.database_url, max_size=1) as pool, pool.acquire() as conn:
            await logs_repo.insert(conn, records)

    asyncio.run(insert())


def test_when_a_job_is_submitted__it_can_be_read_back_with_its_tasks(client: Client) -> None:
    job = client.submit({"name": "sub", "command": "echo $VIGIL_INPUT", "inputs": ["a", "b"]})

    assert job["id"].startswith("j-") and job["state"] == "active"
    assert client.job(job["id"])["counts"] == {"new": 2}
    tasks = client.tasks(job["id"])
    assert [(t["index"], t["input"], t["state"]) for t in tasks] == [
        (0, "a", "new"),
        (1, "b", "new"),
    ]
    detail = client.task(tasks[0]["id"])
    assert (detail["job_id"], detail["attempts"]) == (job["id"], [])


def test_a_jobs_tasks_are_read_page_after_page_until_a_short_one(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calls, "TASKS_PAGE", 2)
    job = client.submit({"name": "pages", "command": "true", "inputs": list("abcde")})

    tasks = client.tasks(job["id"])

    assert [(t["index"], t["input"]) for t in tasks] == list(enumerate("abcde"))


def test_a_jobs_events_are_read_page_after_page_either_way(served: Served, client: Client) -> None:
    # given a job of three tasks whose task.new events the relay numbered
    job = client.submit({"name": "history", "command": "true", "inputs": ["a", "b", "c"]})

    async def number() -> None:
        async with db.open_pool(served.database_url, max_size=1) as pool, pool.acquire() as conn:
            while await outbox.pending(conn, 500):  # numbered, left unpublished
                if not await conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM outbox WHERE seq IS NULL AND exchange = 'events')"
                ):
                    return

    asyncio.run(number())
    # when
    oldest = list(client.job_events(job["id"], limit=2))
    newest = list(client.job_events(job["id"], newest_first=True, limit=2))
    # then
    assert [e.routing_key for e in oldest] == [f"task.new.{job['id']}"] * 3
    seqs = [e.seq for e in oldest if e.seq is not None]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert [e.seq for e in newest] == seqs[::-1]
    assert [e.body["seq"] for e in oldest] == seqs


def test_when_submitted_twice_with_one_idempotency_key__the_same_job_comes_back(
    client: Client,
) -> None:
    key = uuid.uuid4().hex
    first = client.submit({"command": "true"}, idempotency_key=key)
    again = client.submit({"command": "true"}, idempotency_key=key)

    assert again["id"] == first["id"]


def test_when_listing_jobs__every_page_is_followed_newest_first(served: Served) -> None:
    name = f"list-{uuid.uuid4().hex[:8]}"
    with served.client(served.other_token) as client:
        made = [client.submit({"name": name, "command": "true"})["id"] for _ in range(5)]

        listed = [job["id"] for job in client.jobs(name=name, limit=2)]
        first_page = client.jobs_page(name=name, limit=2)

    assert listed == made[::-1]
    assert len(first_page["items"]) == 2 and first_page["next_cursor"] is not None


def test_when_acting_on_a_job__each_action_returns_the_job_as_it_now_is(client: Client) -> None:
    job_id = client.submit({"command": "true", "inputs": [1, 2]})["id"]

    throttled = client.job_action(job_id, "throttle", max_in_flight=3, release_per_tick=2)
    assert (throttled["max_in_flight"], throttled["release_per_tick"]) == (3, 2)
    assert client.job_action(job_id, "suspend")["state"] == "suspended"
    assert client.job_action(job_id, "resume")["state"] == "active"
    added = client.append_inputs(job_id, [3])
    assert len(added["task_ids"]) == 1 and added["job"]["counts"] == {"new": 3}
    assert client.job_action(job_id, "cancel")["state"] == "cancelled"


def test_when_acting_on_a_task__the_answer_holds_the_task(client: Client) -> None:
    job_id = client.submit({"command": "true"})["id"]
    (task,) = client.tasks(job_id)

    held = client.task_action(task["id"], "hold")
    released = client.task_action(task["id"], "release")

    assert (held["task"]["state"], held["created"]) == ("on_hold", None)
    assert released["task"]["state"] == "new"


def test_when_the_state_does_not_allow_an_action__conflict_carries_the_apis_reason(
    client: Client,
) -> None:
    job_id = client.submit({"command": "true"})["id"]
    (task,) = client.tasks(job_id)

    with pytest.raises(Conflict) as caught:
        client.task_action(task["id"], "recover")

    assert caught.value.status == 409
    assert "cannot recover a task in state new" in caught.value.message


def test_when_a_job_is_configured__the_client_tests_edits_and_activates_it(
    client: Client,
) -> None:
    job_id = client.submit({"command": "true", "inputs": ["a", "b"], "configuring": True})["id"]

    test = client.test(job_id, input_index=1)
    explicit = client.test(job_id, input={"seed": 1})
    edited = client.edit(job_id, command="echo new", policy={"max_app_retries": 2})
    active = client.activate(job_id)

    assert (test["input"], test["index"], explicit["input"]) == ("b", -1, {"seed": 1})
    assert (edited["command"], edited["policy"]["max_app_retries"]) == ("echo new", 2)
    assert (active["state"], active["counts"]) == ("active", {"new": 2})
    with pytest.raises(Conflict, match="command can no longer be changed"):
        client.edit(job_id, command="echo later")
    assert client.edit(job_id, retention_s=3600)["retention_s"] == 3600
    assert client.edit(job_id, retention_s=None)["retention_s"] is None


def test_when_a_request_is_invalid__the_error_names_the_field(client: Client) -> None:
    with pytest.raises(InvalidRequest) as caught:
        client.submit({"command": "true", "inputs": list(range(6))})

    assert caught.value.status == 422
    assert caught.value.message.startswith("inputs: 6 inputs given")


def test_when_a_job_is_another_users__it_is_not_found(served: Served, client: Client) -> None:
    job_id = client.submit({"command": "true"})["id"]

    with served.client(served.other_token) as other, pytest.raises(NotFound):
        other.job(job_id)
    with pytest.raises(NotFound, match="404"):
        client.job("j-000000000000")


def test_when_the_token_is_wrong__every_call_is_unauthorized(served: Served) -> None:
    with served.client("not-a-known-token") as client, pytest.raises(Unauthorized):
        client.jobs_page()
    with Client(served.url, None) as anonymous, pytest.raises(Unauthorized):
        anonymous.job("j-1")


def test_when_nothing_listens_at_the_url__unreachable_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    with Client(url, "tok") as client, pytest.raises(Unreachable) as caught:
        client.job("j-1")

    assert caught.value.url == url
    assert str(caught.value).startswith(f"cannot reach the Vigil API at {url}: ")


def test_when_reading_logs__pages_are_followed_and_filters_apply(
    served: Served, client: Client
) -> None:
    job_id = client.submit({"command": "true", "inputs": ["a", "b"]})["id"]
    first, second = (t["id"] for t in client.tasks(job_id))
    lines = [f"line {n}" for n in range(5)]
    _store_lines(served, job_id, first, [*lines, "ERROR: boom"])
    _store_lines(served, job_id, second, ["other task"])

    everything = [line["line"] for line in client.logs(job_id, limit=2)]
    errors = [line["line"] for line in client.logs(job_id, severity="error")]
    of_second = [line["line"] for line in client.logs(job_id, task=second)]
    seqs = [line["seq"] for line in client.logs(job_id)]
    later = [line["line"] for line in client.logs(job_id, after=seqs[4])]

    assert everything == [*lines, "ERROR: boom", "other task"]
    assert (errors, of_second) == (["ERROR: boom"], ["other task"])
    assert later == ["ERROR: boom", "other task"]


def test_when_following_logs__new_lines_come_and_it_ends_once_the_job_ended(
    served: Served, client: Client
) -> None:
    job_id = client.submit({"command": "true"})["id"]
    (task,) = client.tasks(job_id)
    _store_lines(served, job_id, task["id"], ["before"])
    seen: list[str] = []

    for line in client.logs(job_id, follow=True):
        seen.append(line["line"])
        if line["line"] == "before":
            # The job is still active: the follower must go on polling for these.
            _store_lines(served, job_id, task["id"], ["during", "last"], first_no=1)
            client.job_action(job_id, "cancel")

    assert seen == ["before", "during", "last"]


def test_when_waiting__progress_is_reported_until_the_job_ends(served: Served) -> None:
    with served.client() as client, served.client() as controller:
        job_id = client.submit({"command": "true", "inputs": [1, 2, 3]})["id"]
        views: list[dict[str, Any]] = []

        def on_progress(job: dict[str, Any]) -> None:
            views.append(job)
            if len(views) == 2:
                controller.job_action(job_id, "cancel")

        final = client.wait(job_id, on_progress=on_progress, timeout=30)

    assert final["state"] == "cancelled"
    assert views[0]["state"] == "active" and views[-1] == final
    assert final["counts"] == {"terminated": 3}


def test_when_the_job_does_not_end_in_time__wait_times_out_with_the_last_view(
    client: Client,
) -> None:
    job_id = client.submit({"command": "true"})["id"]
    started = time.monotonic()

    with pytest.raises(WaitTimeout) as caught:
        client.wait(job_id, timeout=0.3)

    assert 0.3 <= time.monotonic() - started < 5
    assert caught.value.job["id"] == job_id and caught.value.job["state"] == "active"
    assert str(caught.value) == f"job {job_id} still active after 0.3s"


def test_when_a_user_asks_for_an_operators_route__it_is_forbidden(client: Client) -> None:
    with pytest.raises(Forbidden):
        client.emergency_stop("not mine to stop")


def test_when_listing_hosts__each_comes_with_its_slots_and_quarantine(client: Client) -> None:
    hosts = client.hosts()

    assert isinstance(hosts, list)
    assert all({"id", "slots", "running_tasks", "quarantined"} <= set(h) for h in hosts)


def test_when_listening__a_callback_gets_the_failures_its_pattern_names_and_nothing_else(
    served: Served,
) -> None:
    # given: an operator's resubmission rule on every job's cluster failures
    job_id, task_id = "j-" + uuid.uuid4().hex[:12], "t-" + uuid.uuid4().hex[:12]
    failed = TaskEvent(
        job_id=job_id,
        task_id=task_id,
        state=TaskState.FAILED_ON_CLUSTER,
        failure_class=FailureClass.SIGNAL,
        signal=9,
    )
    completed = TaskEvent(job_id=job_id, task_id=task_id, state=TaskState.COMPLETED)
    client = served.client(served.operator_token)
    seen: list[Event] = []
    subscribed = threading.Event()

    @client.on("task.failed_on_cluster.*")
    def on_failure(event: Event) -> None:
        seen.append(event)
        client.stop_listening()

    listener = threading.Thread(
        target=client.listen, kwargs={"on_open": subscribed.set}, name="listener", daemon=True
    )
    listener.start()
    try:
        assert subscribed.wait(10), "the event stream did not open"

        # when
        _publish(served.namespace, completed, failed)

        # then
        listener.join(timeout=10)
        assert not listener.is_alive(), "the failure event did not arrive"
    finally:
        client.stop_listening()
        client.close()
    (event,) = seen
    assert event.routing_key == f"task.failed_on_cluster.{job_id}"
    assert (event.body["task_id"], event.body["failure_class"], event.body["signal"]) == (
        task_id,
        "signal",
        9,
    )


def test_an_operator_manages_accounts_through_the_client(served: Served) -> None:
    name = f"dora-{uuid.uuid4().hex[:8]}"
    with served.client(served.operator_token) as operator:
        made = operator.add_user(name, label="first")
        more = operator.new_token(name)
        with served.client(made["token"]) as dora:
            assert isinstance(dora.hosts(), list)  # the token works

        revoked = operator.revoke_token(made["details"]["id"])
        listed = operator.tokens(name)
        with served.client(made["token"]) as dora, pytest.raises(Unauthorized):
            dora.hosts()
        operator.disable_user(name)
        users = {u["name"]: u for u in operator.users()}

    assert revoked["revoked_at"] is not None and more["token"] != made["token"]
    assert [(t["label"], t["revoked_at"] is None) for t in listed] == [
        ("first", False),
        (None, True),
    ]
    assert users[name]["disabled_at"] is not None and users[name]["tokens"] == 1


def test_the_account_commands_print_a_new_token_alone_and_json_when_asked(served: Served) -> None:
    env = {
        "VIGIL_URL": served.url,
        "VIGIL_TOKEN": served.operator_token,
        "VIGIL_CONFIG": "/dev/null",
    }
    name = f"ed-{uuid.uuid4().hex[:8]}"
    made = run_vigil(["add-user", name, "--label", "ci"], env)
    listed = run_vigil(["tokens", name, "--json"], env)

    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert "\n" not in token and len(token) >= 40 and "shown once" in made.stderr
    assert [t["label"] for t in json.loads(listed.stdout)] == ["ci"]
    with served.client(token) as ed:
        ed.hosts()
