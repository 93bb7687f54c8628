"""Every route of the app against every kind of caller (design §9: tokens, roles, ownership).

`MATRIX` holds one row per (method, path) and `OPEN` the routes that need no token, each with
its reason. `test_when_routes_are_enumerated__each_is_in_the_matrix_or_open` lists the app's
routes, so a route added without a row fails the suite instead of escaping it.

For each row: no token and a bad token get 401 (HTML pages: a redirect to `/login`); a user
on another user's job or task gets 404; a user on their own gets the row's success status;
an operator gets it on anyone's; a user on an operator-only route (every `/admin/*`) gets 403.
The api is served by uvicorn (so event streams are real), on a database of this module's own.
"""

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.store import users_repo
from tests.conftest import fresh_database
from tests.integration.served_api import Served, served_api
from tests.integration.test_api_harness import Caller

pytestmark = pytest.mark.integration

Key = tuple[str, str]


@dataclass(frozen=True)
class Row:
    """How to call one route, and what an allowed call answers.

    Strings in `body` and `query` may name `{job_id}`, `{task_id}` and `{host_id}`, like the
    path.
    """

    ok: int
    body: dict[str, Any] | None = None
    query: dict[str, str] = field(default_factory=dict)
    operators_only: bool = False
    page: bool = False  # an HTML page: without a valid token it redirects to /login
    stop_first: bool = False  # needs an emergency stop in force
    resume_after: bool = False  # leaves an emergency stop in force
    configuring: bool = False  # needs a configuring job (which has no task)
    output: bool = False  # needs the task to have recorded output `{name}` with its bytes kept


#: Routes that need no token, and why.
OPEN: Final[dict[Key, str]] = {
    ("GET", "/healthz"): "liveness probe of load balancers (design §9)",
    ("GET", "/openapi.json"): "the API contract; no data",
    ("GET", "/docs"): "the API documentation page; no data",
    ("GET", "/docs/oauth2-redirect"): "part of the documentation page",
    ("GET", "/redoc"): "the API documentation page; no data",
    ("GET", "/login"): "the dashboard's sign-in form",
    ("POST", "/login"): "signing in: it checks the token it is given",
    ("POST", "/logout"): "signing out: it revokes the cookie's session and clears the cookie",
    ("MOUNT", "/static"): "the dashboard's scripts and styles; no data",
}

MATRIX: Final[dict[Key, Row]] = {
    ("GET", "/metrics"): Row(200),
    ("POST", "/jobs"): Row(201, body={"command": "true"}),
    ("GET", "/jobs"): Row(200),
    ("GET", "/jobs/{job_id}"): Row(200),
    ("GET", "/jobs/{job_id}/tasks"): Row(200),
    ("GET", "/jobs/{job_id}/logs"): Row(200),
    ("GET", "/jobs/{job_id}/events"): Row(200),
    ("GET", "/jobs/{job_id}/errors"): Row(200),
    ("POST", "/jobs/{job_id}/actions"): Row(202, body={"action": "suspend"}),
    ("POST", "/jobs/{job_id}/inputs"): Row(201, body={"inputs": ["more"]}),
    ("PATCH", "/jobs/{job_id}"): Row(200, body={"max_in_flight": 3}),
    ("POST", "/jobs/{job_id}/tests"): Row(201, body={}, configuring=True),
    ("GET", "/tasks/{task_id}"): Row(200),
    ("POST", "/tasks/{task_id}/actions"): Row(202, body={"action": "hold"}),
    ("GET", "/events"): Row(200, query={"topic": "job.*.{job_id}"}),
    ("GET", "/hosts"): Row(200),
    ("GET", "/analysers"): Row(200),
    # no batch system configured for the matrix's api: an operator's request is refused
    ("POST", "/pilots"): Row(409, body={"count": 1}, operators_only=True),
    ("GET", "/pilots"): Row(200),
    ("DELETE", "/pilots/{pilot_id}"): Row(202, operators_only=True),
    ("POST", "/hosts/{host_id}/actions"): Row(
        202, body={"action": "quarantine", "reason": "matrix"}, operators_only=True
    ),
    ("DELETE", "/hosts/{host_id}"): Row(202, operators_only=True),
    ("POST", "/admin/emergency-stop"): Row(
        202, body={"reason": "matrix"}, operators_only=True, resume_after=True
    ),
    ("GET", "/admin/emergency-stop"): Row(200, operators_only=True),
    ("POST", "/admin/resume"): Row(202, operators_only=True, stop_first=True),
    ("GET", "/admin/users"): Row(200, operators_only=True),
    ("PATCH", "/admin/users/{user_name}"): Row(200, body={"share": 2}, operators_only=True),
    ("POST", "/admin/users"): Row(201, body={"name": "new-{job_id}"}, operators_only=True),
    ("GET", "/admin/users/{user_name}/tokens"): Row(200, operators_only=True),
    ("POST", "/admin/users/{user_name}/tokens"): Row(201, body={}, operators_only=True),
    ("POST", "/admin/users/{user_name}/disable"): Row(200, operators_only=True),
    ("DELETE", "/admin/tokens/{token_id}"): Row(200, operators_only=True),
    ("GET", "/"): Row(200, page=True),
    ("GET", "/ui/jobs/{job_id}"): Row(200, page=True),
    ("GET", "/ui/jobs/{job_id}/row"): Row(200),
    ("GET", "/ui/jobs/{job_id}/summary"): Row(200),
    ("GET", "/ui/tasks/{task_id}/row"): Row(200),
    ("GET", "/ui/jobs/{job_id}/rows"): Row(200, query={"task": "{task_id}"}),
    ("GET", "/ui/jobs/{job_id}/charts"): Row(200),
    ("GET", "/ui/tasks/{task_id}"): Row(200, page=True),
    ("GET", "/ui/tasks/{task_id}/head"): Row(200),
    ("GET", "/ui/charts"): Row(200, operators_only=True),
    ("GET", "/ui/new"): Row(200, page=True),
    ("GET", "/ui/fixes"): Row(200, page=True),
    ("GET", "/ui/users"): Row(200, page=True, operators_only=True),
    ("GET", "/ui/hosts"): Row(200, page=True),
    ("GET", "/ui/hosts/rows"): Row(200),
    ("GET", "/ui/hosts/pilots"): Row(200),
    # a user's selector is limited to their own jobs: no 404 to expect (test_api_bulk.py)
    ("POST", "/bulk/actions"): Row(
        200, body={"action": "hold", "selector": {"states": ["new"]}, "dry_run": True}
    ),
    ("GET", "/bulk/actions"): Row(200),
    ("GET", "/jobs/{job_id}/outputs"): Row(200),
    ("GET", "/tasks/{task_id}/outputs/{name}"): Row(200, output=True),
    # this api's store is a directory, which signs no upload links: past the token, a 409
    ("POST", "/uploads"): Row(409, body={"sha256": "0" * 64, "size": 1}),
    # a user deletes only their own uploads, and nobody uploaded this one: past the token, a 404
    ("DELETE", "/uploads/{sha256}"): Row(404),
}


def _app_routes() -> set[Key]:
    app = create_app(ApiSettings())
    found: set[Key] = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        path = context.path or ""
        if isinstance(route, Mount):
            found.add(("MOUNT", path))
            continue
        for method in getattr(route, "methods", None) or {"?"}:
            if method != "HEAD":  # answered by GET's handler
                found.add((method, path))
    return found


def test_when_routes_are_enumerated__each_is_in_the_matrix_or_open() -> None:
    routes = _app_routes()

    assert routes - MATRIX.keys() - OPEN.keys() == set(), "add these routes to MATRIX or OPEN"
    assert (MATRIX.keys() | OPEN.keys()) - routes == set(), "these rows name no route"
    assert not MATRIX.keys() & OPEN.keys()


def test_the_published_contract_lists_each_route_of_the_matrix_with_its_refusals() -> None:
    """The OpenAPI schema, as clients read it: every operation is in the matrix (or open), says
    it may answer 401, and 403 where only operators may call it."""
    schema = create_app(ApiSettings()).openapi()
    operations = {
        (method.upper(), path): operation
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }

    assert operations.keys() - MATRIX.keys() - OPEN.keys() == set(), "not in MATRIX or OPEN"
    for key in operations.keys() & MATRIX.keys():
        responses = operations[key]["responses"]
        assert "401" in responses, key
        assert ("403" in responses) >= MATRIX[key].operators_only, key


#: Operator-only routes outside `/admin/`: host quarantine changes the fleet for everyone.
OPERATOR_ROUTES: Final = frozenset(
    {
        ("POST", "/hosts/{host_id}/actions"),
        ("DELETE", "/hosts/{host_id}"),  # the fleet is everyone's
        ("POST", "/pilots"),  # the batch system's allocations: the site's, not a user's
        ("DELETE", "/pilots/{pilot_id}"),
        ("GET", "/ui/charts"),  # the whole system's activity: a user's jobs are theirs alone
        ("GET", "/ui/users"),  # users and tokens
    }
)


def test_when_a_route_is_under_admin__it_is_for_operators_only() -> None:
    for (method, path), row in MATRIX.items():
        expected = path.startswith("/admin/") or (method, path) in OPERATOR_ROUTES
        assert row.operators_only == expected, path


@pytest.fixture(scope="module")
def own_database() -> Iterator[str]:
    with fresh_database("vigil_access") as url:
        yield url


@pytest.fixture
async def api(own_database: str, namespace: str) -> AsyncIterator[Served]:
    async with served_api(own_database, namespace, submit_burst=10_000) as served:
        yield served


@pytest.mark.parametrize("key", sorted(k for k in OPEN if k[0] == "GET"), ids=" ".join)
async def test_when_an_open_page_is_read_without_a_token__it_answers(api: Served, key: Key) -> None:
    async with api.client() as client:
        response = await client.get(key[1])

    assert response.status_code == 200, response.text


class RouteCall:
    """Calls one route of `api` for one check, through one client."""

    def __init__(self, api: Served, client: httpx.AsyncClient, key: Key, row: Row) -> None:
        self.api, self.client, self.row = api, client, row
        self.method, self.path = key

    async def fresh(self, owner: Caller) -> dict[str, str]:
        """A new job of `owner` with one task: ids for the placeholders."""
        body = {"command": "true", "configuring": self.row.configuring}
        made = await self.client.post("/jobs", json=body, headers=owner.headers)
        assert made.status_code == 201, made.text
        job_id = made.json()["id"]
        task_id = await self.api.pool.fetchval("SELECT id FROM tasks WHERE job_id = $1", job_id)
        host_id = f"h-{job_id[2:]}"
        await self.api.pool.execute("INSERT INTO hosts (id, slots) VALUES ($1, 1)", host_id)
        if self.row.output:
            await self.api.pool.execute(_OUTPUT, task_id, host_id)
        pilot_id = f"p-{job_id[2:]}"
        await self.api.pool.execute(
            "INSERT INTO pilots (id, pool, backend, cpus, walltime_s, requested_by)"
            " VALUES ($1, 'default', 'slurm', 1, 60, 'matrix')",
            pilot_id,
        )
        token = uuid.uuid4().hex  # a throwaway user's, for the account routes
        async with self.api.pool.acquire() as conn:
            someone = await users_repo.ensure_user(conn, f"someone-{job_id}", "user", token)
        return {
            "job_id": job_id,
            "task_id": str(task_id),
            "host_id": host_id,
            "pilot_id": pilot_id,
            "name": "out.txt",
            "user_name": someone.name,
            "token_id": users_repo.token_id(users_repo.hash_token(token)),
            "sha256": "0" * 64,
        }

    async def call(self, headers: dict[str, str], ids: dict[str, str]) -> httpx.Response:
        """The route's answer; the body of a stream is not read (only its status line)."""
        url = self.path.format(**ids)
        query = {name: value.format(**ids) for name, value in self.row.query.items()}
        body = _fill(self.row.body, ids)
        async with self.client.stream(
            self.method, url, params=query, json=body, headers=headers
        ) as response:
            return response

    async def as_(self, caller: Caller, owner: Caller) -> httpx.Response:
        """Call as `caller` on a fresh job of `owner`, with the stop the row needs."""
        ids = await self.fresh(owner)
        if self.row.stop_first:
            await self._admin("/admin/emergency-stop", {"reason": "before resume"})
        try:
            return await self.call(caller.headers, ids)
        finally:
            if self.row.stop_first or self.row.resume_after:
                await self._admin("/admin/resume", None, accept=(202, 409))

    async def _admin(
        self, path: str, body: dict[str, str] | None, accept: tuple[int, ...] = (202,)
    ) -> None:
        response = await self.client.post(path, json=body, headers=self.api.operator.headers)
        assert response.status_code in accept, response.text


_OUTPUT: Final = (
    "INSERT INTO task_outputs (task_id, run_number, name, path, host, size, sha256, content)"
    " VALUES ($1, 1, 'out.txt', '/w/out.txt', $2, 2, 'not-checked', 'ok')"
)


def _fill(body: dict[str, Any] | None, ids: dict[str, str]) -> dict[str, Any] | None:
    if body is None:
        return None
    return {k: v.format(**ids) if isinstance(v, str) else v for k, v in body.items()}


def _refused_anonymous(response: httpx.Response, row: Row) -> bool:
    if row.page:
        return response.status_code == 303 and response.headers["location"] == "/login"
    return response.status_code == 401


@pytest.mark.parametrize("key", sorted(MATRIX), ids=" ".join)
async def test_when_a_route_is_called_by_each_kind_of_caller__access_follows_the_roles(
    api: Served, key: Key
) -> None:
    row = MATRIX[key]
    async with api.client() as client:
        await _check(RouteCall(api, client, key, row))


async def _check(route: RouteCall) -> None:
    api, row, key = route.api, route.row, (route.method, route.path)
    owned = any("{" in text for text in (key[1], *row.query.values()))

    # no token, and a token nobody holds
    ids = await route.fresh(api.user)
    anonymous = await route.call({}, ids)
    assert _refused_anonymous(anonymous, row), f"no token: {anonymous.status_code}"
    stranger = await route.call({"Authorization": "Bearer not-a-token-of-anyone"}, ids)
    assert _refused_anonymous(stranger, row), f"bad token: {stranger.status_code}"

    # a user on another user's job or task
    if owned and not row.operators_only:
        theirs = await route.as_(api.user, owner=api.other)
        assert theirs.status_code == 404, f"another user's: {theirs.status_code}"

    # a user on their own, or on an operator-only route
    own = await route.as_(api.user, owner=api.user)
    expected = 403 if row.operators_only else row.ok
    assert own.status_code == expected, f"a user on their own: {own.status_code}"

    # an operator on anyone's
    operator = await route.as_(api.operator, owner=api.user)
    assert operator.status_code == row.ok, f"an operator: {operator.status_code}"
