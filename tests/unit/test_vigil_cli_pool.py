"""The shared pool in the command: a request and a priority at submission,
`vigil priority`, `vigil users share`, hosts' capacity, `vigil why`, and `vigil status JOB`'s
waiting line. The commands run whole against a fake API (an `httpx.MockTransport` that
records what it was sent); the formatting functions are tested alone."""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from vigil import jobfile, pool, render
from vigil.cli import app
from vigil.client import Client
from vigil.errors import JobFileError
from vigil.session import Session

RESOURCES_WAIT = {
    "reason": "resources",
    "message": "next to run, waits for resources: needs 2 cpus, 4096 MiB; the closest host,"
    " h-2, has 1 cpu free",
    "detail": {
        "needs": {"cpus": 2.0, "memory_mb": 4096, "gpus": 0},
        "closest_host": "h-2",
        "closest_free": {"cpus": 1.0, "memory_mb": 512, "gpus": 0},
        "reserved_host": None,
    },
}
FAIR_SHARE_WAIT = {
    "reason": "fair_share",
    "message": "fair share: 12 tasks of other users ahead",
    "detail": {"ahead": 12},
}
JOB = {
    "id": "j-1",
    "name": "render",
    "state": "active",
    "type": "shell",
    "counts": {"new": 5, "on_cpu": 2, "completed": 3},
    "priority": 0,
    "resources": {"cpus": 1.0, "memory_mb": 0, "gpus": 0},
    "waiting": None,
}
TASK = {
    "id": "t-1",
    "job_id": "j-1",
    "index": 4,
    "state": "new",
    "host": None,
    "waiting_reason": None,
    "attempts": [],
}


@dataclass
class FakeApi:
    """Answers by (method, path); keeps every request it was sent."""

    answers: dict[tuple[str, str], Any] = field(default_factory=dict)
    sent: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        key = (request.method, request.url.path)
        if key not in self.answers:
            return httpx.Response(404, json={"detail": f"no route {key}"})
        answer = self.answers[key]
        body = answer(request) if callable(answer) else answer
        return httpx.Response(201 if request.method == "POST" else 200, json=body)

    def body(self, method: str, path: str) -> Any:
        found = [r for r in self.sent if (r.method, r.url.path) == (method, path)]
        assert found, f"nothing sent to {method} {path}: {[str(r.url) for r in self.sent]}"
        return json.loads(found[-1].content)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    fake = FakeApi()

    def client(self: Session) -> Client:
        return Client("http://api", "t", http=httpx.Client(transport=httpx.MockTransport(fake)))

    monkeypatch.setattr(Session, "client", client)
    yield fake


@pytest.fixture
def vigil(tmp_path: Path) -> Callable[..., Result]:
    env = {"VIGIL_URL": "http://127.0.0.1:9", "VIGIL_CONFIG": "/dev/null", "HOME": str(tmp_path)}
    return lambda *args: CliRunner().invoke(app, list(args), env=env)


def _echo_job(request: httpx.Request) -> dict[str, Any]:
    sent: dict[str, Any] = json.loads(request.content)
    return {"id": "j-1", "state": "active"} | sent


# -- submit ------------------------------------------------------------------------------------


def test_submit_sends_the_job_files_request_and_priority(
    api: FakeApi, vigil: Callable[..., Result], tmp_path: Path
) -> None:
    api.answers[("POST", "/jobs")] = _echo_job
    job = tmp_path / "job.yaml"
    job.write_text("command: train\nresources: {cpus: 2, memory_mb: 4096, gpus: 1}\npriority: 5\n")

    result = vigil("submit", str(job))

    assert result.exit_code == 0, result.output
    sent = api.body("POST", "/jobs")
    assert sent["resources"] == {"cpus": 2, "memory_mb": 4096, "gpus": 1}
    assert sent["priority"] == 5


def test_submit_flags_replace_what_the_job_file_says_one_by_one(
    api: FakeApi, vigil: Callable[..., Result], tmp_path: Path
) -> None:
    api.answers[("POST", "/jobs")] = _echo_job
    job = tmp_path / "job.yaml"
    job.write_text("command: train\nresources: {cpus: 2, memory_mb: 4096}\npriority: 5\n")

    result = vigil("submit", str(job), "--cpus", "0.5", "--gpus", "2", "--priority", "-3")

    assert result.exit_code == 0, result.output
    sent = api.body("POST", "/jobs")
    assert sent["resources"] == {"cpus": 0.5, "memory_mb": 4096, "gpus": 2}
    assert sent["priority"] == -3


def test_submit_without_a_request_sends_none(
    api: FakeApi, vigil: Callable[..., Result], tmp_path: Path
) -> None:
    api.answers[("POST", "/jobs")] = _echo_job
    job = tmp_path / "job.yaml"
    job.write_text("command: echo\n")

    result = vigil("submit", str(job), "--memory-mb", "512")

    assert result.exit_code == 0, result.output
    sent = api.body("POST", "/jobs")
    assert sent["resources"] == {"memory_mb": 512} and "priority" not in sent


def test_a_job_files_resources_that_is_not_a_mapping_is_refused_before_sending() -> None:
    with pytest.raises(JobFileError, match="resources: a mapping"):
        jobfile.with_request({"command": "x", "resources": 2}, cpus=1)


def test_submit_refuses_a_negative_request_before_sending(
    api: FakeApi, vigil: Callable[..., Result], tmp_path: Path
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("command: echo\n")

    result = vigil("submit", str(job), "--gpus", "-1")

    assert result.exit_code == 2 and not api.sent


# -- priority and shares -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["7", "-5", "0"])
def test_vigil_priority_patches_the_job_negative_numbers_too(
    api: FakeApi, vigil: Callable[..., Result], value: str
) -> None:
    api.answers[("PATCH", "/jobs/j-1")] = _echo_job

    result = vigil("priority", "j-1", value)

    assert result.exit_code == 0, result.output
    assert api.body("PATCH", "/jobs/j-1") == {"priority": int(value)}
    assert result.stdout == f"job j-1: priority {int(value)}\n"


def test_vigil_priority_takes_a_job_id_only(api: FakeApi, vigil: Callable[..., Result]) -> None:
    result = vigil("priority", "t-1", "3")

    assert result.exit_code == 2 and "priority takes a job id" in result.output
    assert not api.sent


def test_vigil_users_share_patches_the_user(api: FakeApi, vigil: Callable[..., Result]) -> None:
    api.answers[("PATCH", "/admin/users/bob")] = lambda r: {"name": "bob"} | json.loads(r.content)

    result = vigil("users", "share", "bob", "2.5")

    assert result.exit_code == 0, result.output
    assert api.body("PATCH", "/admin/users/bob") == {"share": 2.5}
    assert result.stdout == "user bob: share 2.5\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["users", "share", "bob"], "needs a NAME and a number X"),
        (["users", "share", "bob", "0"], "a share is a number above 0, not 0"),
        (["users", "share", "bob", "nan"], "a share is a number above 0"),
        (["users", "share", "../x", "1"], "is not a valid user name"),
    ],
)
def test_vigil_users_share_refuses_before_sending(
    api: FakeApi, vigil: Callable[..., Result], args: list[str], message: str
) -> None:
    result = vigil(*args)

    assert result.exit_code == 2 and message in result.output, result.output
    assert not api.sent


def test_the_users_list_shows_share_and_usage(api: FakeApi, vigil: Callable[..., Result]) -> None:
    api.answers[("GET", "/admin/users")] = [
        {"name": "alice", "role": "user", "share": 3.0, "usage": 123456.7, "tokens": 1},
        {"name": "bob", "role": "user", "share": 1.0, "usage": 0.25, "tokens": 1},
    ]

    result = vigil("users")

    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert lines["USER"][:4] == ["USER", "ROLE", "SHARE", "USAGE"]
    assert lines["alice"][2:4] == ["3", "123,457"]
    assert lines["bob"][2:4] == ["1", "0.25"]


# -- hosts -------------------------------------------------------------------------------------


def test_vigil_hosts_shows_what_each_host_has_free_of_its_capacity(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/hosts")] = [
        {
            "id": "gpu-1",
            "slots": 4,
            "running_tasks": 1,
            "quarantined": False,
            "capacity": {"cpus": 16.0, "memory_mb": 65536, "gpus": ["0", "1"]},
            "free": {"cpus": 14.5, "memory_mb": 61440, "gpus": ["1"]},
        },
        {
            "id": "cpu-1",
            "slots": 4,
            "running_tasks": 0,
            "quarantined": False,
            "capacity": {"cpus": 4.0, "memory_mb": 512, "gpus": []},
            "free": {"cpus": 4.0, "memory_mb": 512, "gpus": []},
        },
        {"id": "old", "slots": 4, "running_tasks": 0, "quarantined": False},
    ]

    result = vigil("hosts")

    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["HOST"][3:9] == ["CPUS", "FREE", "MEMORY", "FREE", "GPUS", "FREE"]
    assert rows["gpu-1"][3:8] == ["14.5/16", "60", "GiB/64", "GiB", "1/2"]
    assert "1/2 (1)" in result.stdout
    assert rows["cpu-1"][3:6] == ["4/4", "512", "MiB/512"]
    assert rows["old"][3:6] == ["-", "-", "-"]


# -- why ---------------------------------------------------------------------------------------


def test_vigil_why_task_says_its_state_reason_message_and_numbers(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/tasks/t-1")] = TASK | {"waiting_reason": RESOURCES_WAIT}

    result = vigil("why", "t-1")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "task t-1 (job j-1, index 4) is new, waiting: resources: next to run, waits for"
        " resources: needs 2 cpus, 4096 MiB; the closest host, h-2, has 1 cpu free",
        "  needs: 2 cpus, 4 GiB",
        "  closest host: h-2",
        "  closest free: 1 cpu, 512 MiB",
    ]


def test_vigil_why_task_that_does_not_wait_says_so(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/tasks/t-1")] = TASK | {"state": "on_cpu", "host": "h-1"}

    result = vigil("why", "t-1")

    assert result.stdout == "task t-1 (job j-1, index 4) is on_cpu on h-1: not waiting\n"


def test_vigil_why_job_says_how_many_wait_why_and_its_counts(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/jobs/j-1")] = JOB | {
        "priority": 5,
        "resources": {"cpus": 2.0, "memory_mb": 0, "gpus": 1},
        "waiting": FAIR_SHARE_WAIT | {"tasks": 5},
    }

    result = vigil("why", "j-1")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "job j-1 is active: 5 new, 3 completed, 2 on_cpu",
        "priority 5; each task needs 2 cpus, 1 gpu",
        "5 task(s) waiting: fair_share: 12 tasks of other users ahead",
        "  ahead: 12",
    ]


def test_vigil_why_job_with_nothing_waiting_says_so(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/jobs/j-1")] = JOB | {"counts": {"completed": 3}, "state": "completed"}

    result = vigil("why", "j-1")

    assert result.stdout.splitlines() == [
        "job j-1 is completed: 3 completed",
        "no task waits to start",
    ]


@pytest.mark.parametrize(("some_id", "path"), [("t-1", "/tasks/t-1"), ("j-1", "/jobs/j-1")])
def test_vigil_why_json_prints_the_apis_object(
    api: FakeApi, vigil: Callable[..., Result], some_id: str, path: str
) -> None:
    shown = (TASK | {"waiting_reason": FAIR_SHARE_WAIT}) if some_id == "t-1" else JOB
    api.answers[("GET", path)] = shown

    result = vigil("why", some_id, "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == shown


def test_vigil_why_refuses_what_is_neither_a_job_nor_a_task(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    result = vigil("why", "h-1")

    assert result.exit_code == 2 and "neither a job id" in result.output
    assert not api.sent


# -- status JOB --------------------------------------------------------------------------------


def _shown(parts: list[Any]) -> str:
    """The parts as printed, white space folded."""
    console = Console(width=300, record=True)
    for part in parts:
        console.print(part)
    return " ".join(console.export_text().split())


def test_vigil_status_job_shows_why_its_tasks_wait_and_its_request_when_not_default() -> None:
    job = JOB | {
        "priority": -2,
        "resources": {"cpus": 0.5, "memory_mb": 2048, "gpus": 0},
        "waiting": RESOURCES_WAIT | {"tasks": 5},
    }

    shown = _shown(render.job_detail(job, []))

    assert "priority -2" in shown
    assert "resources each task 0.5 cpus, 2 GiB" in shown
    assert "waiting 5 task(s): resources: next to run, waits for resources" in shown


def test_vigil_status_job_leaves_out_the_defaults_and_a_job_that_does_not_wait() -> None:
    shown = _shown(render.job_detail(JOB, []))

    assert "priority" not in shown and "resources" not in shown and "waiting" not in shown


def test_vigil_status_task_shows_its_waiting_reason() -> None:
    shown = _shown(render.task_detail(TASK | {"waiting_reason": FAIR_SHARE_WAIT}))

    assert "waiting fair_share: 12 tasks of other users ahead" in shown


def test_vigil_status_job_asks_the_job_and_its_tasks(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("GET", "/jobs/j-1")] = JOB | {"waiting": FAIR_SHARE_WAIT | {"tasks": 5}}
    api.answers[("GET", "/jobs/j-1/tasks")] = []

    result = vigil("status", "j-1")

    assert result.exit_code == 0, result.output
    assert "5 task(s): fair_share: 12 tasks of other users ahead" in result.stdout


# -- formatting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ({"cpus": 1.0, "memory_mb": 0, "gpus": 0}, "1 cpu"),
        ({"cpus": 0.25}, "0.25 cpus"),
        ({"cpus": 2, "memory_mb": 1536, "gpus": 1}, "2 cpus, 1.5 GiB, 1 gpu"),
        ({"cpus": 8, "memory_mb": 100, "gpus": ["0", "1"]}, "8 cpus, 100 MiB, 2 gpus"),
    ],
)
def test_resources_read_as_people_write_them(amount: dict[str, Any], shown: str) -> None:
    assert pool.resources(amount) == shown


@pytest.mark.parametrize(
    ("resources", "default"),
    [
        (None, True),
        ({"cpus": 1.0, "memory_mb": 0, "gpus": 0}, True),
        ({"cpus": 1, "memory_mb": 1, "gpus": 0}, False),
        ({"cpus": 2.0, "memory_mb": 0, "gpus": 0}, False),
        ({"cpus": 1.0, "memory_mb": 0, "gpus": 1}, False),
    ],
)
def test_a_request_is_default_only_when_it_is_one_cpu_and_nothing_else(
    resources: dict[str, Any] | None, default: bool
) -> None:
    assert pool.is_default(resources) is default


def test_a_reasons_numbers_read_one_a_line_whatever_the_reason() -> None:
    detail = {
        "in_flight": 4,
        "limit": 4,
        "until": "2026-11-27T10:00:00+00:00",
        "hosts": ["a", "b"],
        "fraction": 0.5,
        "held": True,
        "nothing": None,
        "largest": {"cpus": 4.0, "memory_mb": 16384, "gpus": 0},
    }

    assert pool.detail_lines(detail) == [
        "in flight: 4",
        "limit: 4",
        "until: 2026-11-27 10:00:00 UTC",
        "hosts: a, b",
        "fraction: 0.5",
        "held: yes",
        "largest: 4 cpus, 16 GiB",
    ]


def test_text_in_a_reason_is_shown_with_its_control_characters_escaped() -> None:
    wait = {"reason": "resources", "message": "\x1b[2Jx", "detail": {"closest_host": "h\r"}}

    lines = pool.why_task(TASK | {"waiting_reason": wait})

    assert lines == [
        "task t-1 (job j-1, index 4) is new, waiting: resources: \\x1b[2Jx",
        "  closest host: h\\x0d",
    ]


@pytest.mark.parametrize(
    ("value", "shown"),
    [(1.0, "1"), (2.5, "2.5"), (0.3333, "0.333"), (123456.7, "123,457"), (None, None)],
)
def test_shares_and_usage_read_short(value: float | None, shown: str | None) -> None:
    assert pool.number(value) == shown


def test_vigil_users_quota_sends_bytes_and_says_what_the_user_stores(
    api: FakeApi, vigil: Callable[..., Result]
) -> None:
    api.answers[("PATCH", "/admin/users/bob")] = {
        "name": "bob",
        "stored_bytes": 3 * 1024**3 // 2,
        "store_quota_bytes": 10 * 1024**3,
        "quota_bytes": 10 * 1024**3,
    }

    result = vigil("users", "quota", "bob", "10G")

    assert result.exit_code == 0, result.output
    assert api.body("PATCH", "/admin/users/bob") == {"store_quota_bytes": 10 * 1024**3}
    assert result.stdout == "user bob: stores 1.5 GiB of 10 GiB\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["users", "quota", "bob"], "needs a NAME and a SIZE"),
        (["users", "quota", "bob", "lots"], "'lots' is not a size"),
        (["users", "share", "bob", "x"], "a share is a number above 0, not 'x'"),
    ],
)
def test_vigil_users_quota_refuses_before_sending(
    api: FakeApi, vigil: Callable[..., Result], args: list[str], message: str
) -> None:
    result = vigil(*args)

    assert result.exit_code == 2 and message in result.output, result.output
    assert not api.sent
