"""`python -m services.api.admin`: users and tokens, on the real database.

The command runs `asyncio.run` itself, so these tests are synchronous; one test runs it as a
real process, the others in-process through typer's runner.
"""

import asyncio
import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from typer.testing import CliRunner

from services.api.admin import app
from tests.integration.test_api_harness import running_api

pytestmark = pytest.mark.integration


@pytest.fixture
def database(session_database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("VIGIL_DATABASE_URL", session_database_url)
    yield session_database_url


def _name() -> str:
    return f"alice-{uuid.uuid4().hex[:8]}"


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(fetch())


_TOKENS_OF = "SELECT t.token_hash FROM tokens t JOIN users u ON u.id = t.user_id WHERE u.name = $1"


def test_when_a_user_is_created__a_token_is_printed_and_only_its_hash_is_stored(
    database: str,
) -> None:
    name = _name()

    result = _run("create-user", name, "--role", "user")

    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert len(token) >= 40 and " " not in token
    [user] = _fetch(database, "SELECT role FROM users WHERE name = $1", name)
    assert user["role"] == "user"
    stored = [r["token_hash"] for r in _fetch(database, _TOKENS_OF, name)]
    assert stored == [hashlib.sha256(token.encode()).hexdigest()]
    assert not _fetch(database, "SELECT 1 FROM tokens WHERE token_hash = $1", token)


def test_when_a_second_token_is_created__both_are_valid_and_different(database: str) -> None:
    name = _name()
    first = _run("create-user", name, "--role", "operator").stdout.strip()

    result = _run("create-token", name)

    assert result.exit_code == 0, result.output
    second = result.stdout.strip()
    assert second != first
    hashes = {r["token_hash"] for r in _fetch(database, _TOKENS_OF, name)}
    assert hashes == {hashlib.sha256(t.encode()).hexdigest() for t in (first, second)}


def test_when_users_are_listed__names_roles_and_token_counts_are_shown_never_tokens(
    database: str,
) -> None:
    name = _name()
    token = _run("create-user", name, "--role", "operator").stdout.strip()
    _run("create-token", name)

    result = _run("list-users")

    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if line.startswith(name + " ")]
    assert line.split()[1:3] == ["operator", "2"]
    assert token not in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("create-token", "nobody-at-all"), "no user named 'nobody-at-all'"),
        (("create-user", "bad name", "--role", "user"), "is not valid"),
        (("create-user", "--role", "user", "--", "-x"), "is not valid"),
        (("create-user", "u" * 65, "--role", "user"), "is not valid"),
    ],
    ids=["unknown-user", "space-in-name", "leading-dash", "too-long"],
)
def test_when_the_user_is_unknown_or_the_name_bad__the_error_says_so(
    database: str, args: tuple[str, ...], words: str
) -> None:
    result = _run(*args)

    assert result.exit_code == 1
    assert words in result.stderr
    assert "Traceback" not in result.output


def test_when_the_name_is_taken__create_user_fails_and_keeps_the_user(database: str) -> None:
    name = _name()
    _run("create-user", name, "--role", "user")

    result = _run("create-user", name, "--role", "operator")

    assert result.exit_code == 1
    assert f"a user named {name!r} already exists" in result.stderr
    [user] = _fetch(database, "SELECT role FROM users WHERE name = $1", name)
    assert user["role"] == "user"
    assert len(_fetch(database, _TOKENS_OF, name)) == 1


@pytest.mark.parametrize("role", ["admin", "", "Operator"])
def test_when_the_role_is_bad__the_command_is_refused_naming_the_roles(
    database: str, role: str
) -> None:
    name = _name()

    result = _run("create-user", name, "--role", role)

    assert result.exit_code == 2
    assert "'user'" in result.output and "'operator'" in result.output
    assert not _fetch(database, "SELECT 1 FROM users WHERE name = $1", name)


def test_when_the_database_is_unreachable__the_error_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VIGIL_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nowhere")

    result = _run("list-users")

    assert result.exit_code == 1
    assert "cannot use the database at VIGIL_DATABASE_URL" in result.stderr


async def test_when_run_as_a_module__the_token_it_prints_opens_the_api(
    session_database_url: str,
) -> None:
    # given: a user made by the real command
    name = _name()
    env = os.environ | {"VIGIL_DATABASE_URL": session_database_url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.api.admin", "create-user", name, "--role", "user"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()

    # when / then: the api knows them by that token
    async with running_api(session_database_url) as api:
        headers = {"Authorization": f"Bearer {token}"}
        response = await api.client.get("/jobs", headers=headers)
        assert response.status_code == 200
        wrong: httpx.Response = await api.client.get(
            "/jobs", headers={"Authorization": f"Bearer {token}x"}
        )
        assert wrong.status_code == 401


def test_a_token_listed_by_id_can_be_revoked_and_a_user_disabled(database: str) -> None:
    name = _name()
    token = _run("create-user", name, "--role", "user").stdout.strip()
    _run("create-token", name)

    listed = _run("list-tokens", name)
    ids = [line.split()[0] for line in listed.stdout.splitlines()]
    revoked = _run("revoke-token", ids[0])
    disabled = _run("disable-user", name)
    missing = _run("revoke-token", "k-000000000000")

    assert listed.exit_code == revoked.exit_code == disabled.exit_code == 0, listed.output
    assert len(ids) == 2 and all(i.startswith("k-") for i in ids) and token not in listed.stdout
    states = [line.split()[2] for line in _run("list-tokens", name).stdout.splitlines()]
    assert states == ["revoked", "live"]
    assert "disabled" in _run("list-users").stdout.split(name, 1)[1].splitlines()[0]
    assert missing.exit_code == 1 and "no token" in missing.output
