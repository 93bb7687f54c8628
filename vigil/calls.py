"""Every API request as data (`Call`), and how an answer becomes a result or an error.

Shared by `Client` and `AsyncClient`, which only send the calls: the paths, parameters and
error mapping of the HTTP contract (design §9) live here once. Ids are checked before they
go into a path, so a malformed one never reaches another route.
"""

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import httpx

from vigil import topics
from vigil.errors import BadResponse, Gone, RateLimited, Unreachable, UsageError, api_error

_ID_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # shared/domain/ids.py's ID_PATTERN
_SHA256_RE: Final = re.compile(r"[0-9a-f]{64}")
#: A bulk action acts on up to 10 000 tasks, a few milliseconds each: wait for its answer.
BULK_TIMEOUT_S: Final = 600.0

Job = dict[str, Any]
Task = dict[str, Any]
LogLine = dict[str, Any]
Host = dict[str, Any]
Output = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One HTTP request to the API; `path` is relative to the API's base URL."""

    method: str
    path: str
    params: list[tuple[str, str | int]] = field(default_factory=list)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Seconds to wait for the answer, when longer than the client's own timeout.
    timeout: float | None = None
    #: The answer is a file: its bytes are the result (`answer`), not JSON.
    binary: bool = False

    def request_args(self, base_url: str, auth: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments for `httpx.Client.request` / `stream` (and the async ones)."""
        args = {
            "method": self.method,
            "url": base_url + self.path,
            "params": self.params,
            "json": self.json,
            "headers": {**auth, **self.headers},
        }
        if self.binary:  # a file may be answered by a link to it (an S3 store's)
            args["follow_redirects"] = True
        return args if self.timeout is None else args | {"timeout": self.timeout}


def check_id(kind: str, value: str) -> str:
    """`value` if it is well-formed server id; raises `UsageError` naming `kind` otherwise."""
    if not _ID_RE.fullmatch(value):
        raise UsageError(f"{value[:100]!r} is not a valid {kind} id (e.g. j-3k9x0q7mzt1a)")
    return value


def submit(job: Mapping[str, Any], idempotency_key: str | None) -> Call:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    return Call("POST", "/jobs", json=dict(job), headers=headers)


def start_upload(sha256: str, size: int) -> Call:
    return Call("POST", "/uploads", json={"sha256": sha256, "size": size})


def delete_upload(sha256: str) -> Call:
    return Call("DELETE", f"/uploads/{quote(sha256, safe='')}")


def job(job_id: str) -> Call:
    return Call("GET", f"/jobs/{check_id('job', job_id)}")


def jobs_page(state: str | None, name: str | None, limit: int, cursor: str | None) -> Call:
    params = _params(state=state, name=name, limit=limit, cursor=cursor)
    return Call("GET", "/jobs", params=params)


#: Tasks asked for per page by `tasks()` (the api's default page).
TASKS_PAGE = 10_000


def tasks(job_id: str, after: int | None = None, states: Iterable[str] = ()) -> Call:
    """A page of the job's tasks after index `after`, only those in `states` if any."""
    params = _params(after=after, limit=TASKS_PAGE) + [("state", s) for s in states]
    return Call("GET", f"/jobs/{check_id('job', job_id)}/tasks", params=params)


def task(task_id: str) -> Call:
    return Call("GET", f"/tasks/{check_id('task', task_id)}")


def logs_page(
    job_id: str, *, task: str | None, run: int | None, severity: str | None, after: int, limit: int
) -> Call:
    params = _params(task=task, run=run, severity=severity, after=after, limit=limit)
    return Call("GET", f"/jobs/{check_id('job', job_id)}/logs", params=params)


def job_action(job_id: str, action: str, fields: Mapping[str, Any]) -> Call:
    body = {"action": action} | {k: v for k, v in fields.items() if v is not None}
    return Call("POST", f"/jobs/{check_id('job', job_id)}/actions", json=body)


def task_action(task_id: str, action: str) -> Call:
    return Call("POST", f"/tasks/{check_id('task', task_id)}/actions", json={"action": action})


def append_inputs(job_id: str, inputs: list[Any]) -> Call:
    return Call("POST", f"/jobs/{check_id('job', job_id)}/inputs", json={"inputs": inputs})


def edit(job_id: str, fields: Mapping[str, Any]) -> Call:
    """Every field given is sent, null too (`retention_s: None` keeps the data forever)."""
    return Call("PATCH", f"/jobs/{check_id('job', job_id)}", json=dict(fields))


def start_test(job_id: str, test_input: Mapping[str, Any]) -> Call:
    """`test_input`: `{}`, `{"input_index": n}` or `{"input": value}`."""
    return Call("POST", f"/jobs/{check_id('job', job_id)}/tests", json=dict(test_input))


def outputs_page(job_id: str, limit: int, cursor: str | None) -> Call:
    params = _params(limit=limit, cursor=cursor)
    return Call("GET", f"/jobs/{check_id('job', job_id)}/outputs", params=params)


def check_output_name(name: str) -> str:
    """`name` if it is a plain file name (as outputs are); raises `UsageError` otherwise."""
    if not name or "/" in name or name in (".", ".."):
        raise UsageError(f"{name[:100]!r} is not an output name (a plain file name)")
    return name


def download(task_id: str, name: str) -> Call:
    """`GET /tasks/{id}/outputs/{name}`: the output's bytes."""
    path = f"/tasks/{check_id('task', task_id)}/outputs/{quote(check_output_name(name), safe='')}"
    return Call("GET", path, binary=True)


def hosts() -> Call:
    return Call("GET", "/hosts")


def host_action(host_id: str, action: str, fields: Mapping[str, Any]) -> Call:
    body = {"action": action} | {k: v for k, v in fields.items() if v is not None}
    return Call("POST", f"/hosts/{check_id('host', host_id)}/actions", json=body)


def remove_host(host_id: str, force: bool) -> Call:
    params: list[tuple[str, str | int]] = [("force", "true")] if force else []
    return Call("DELETE", f"/hosts/{check_id('host', host_id)}", params=params)


def pilots(live: bool) -> Call:
    return Call("GET", "/pilots", params=[("live", "true")] if live else [])


def add_pilots(fields: Mapping[str, Any]) -> Call:
    return Call("POST", "/pilots", json={k: v for k, v in fields.items() if v is not None})


def remove_pilot(pilot_id: str) -> Call:
    return Call("DELETE", f"/pilots/{check_id('pilot', pilot_id)}")


def analysers() -> Call:
    return Call("GET", "/analysers")


def emergency_stop(reason: str) -> Call:
    return Call("POST", "/admin/emergency-stop", json={"reason": reason})


def resume_all() -> Call:
    return Call("POST", "/admin/resume")


#: shared/store/users_repo.py's NAME_PATTERN and a token's public id (`k-` and 12 hex digits).
_USER_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_TOKEN_ID_RE: Final = re.compile(r"k-[0-9a-f]{12}")


def _user_name(name: str) -> str:
    if not _USER_NAME_RE.fullmatch(name):
        raise UsageError(
            f"{name[:100]!r} is not a valid user name (1 to 64 letters, digits or '._@-')"
        )
    return name


def users() -> Call:
    return Call("GET", "/admin/users")


def add_user(name: str, role: str, label: str | None) -> Call:
    return Call("POST", "/admin/users", json={"name": name, "role": role, "label": label})


def tokens(name: str) -> Call:
    return Call("GET", f"/admin/users/{_user_name(name)}/tokens")


def new_token(name: str, label: str | None) -> Call:
    return Call("POST", f"/admin/users/{_user_name(name)}/tokens", json={"label": label})


def revoke_token(token_id: str) -> Call:
    if not _TOKEN_ID_RE.fullmatch(token_id):
        raise UsageError(f"{token_id[:100]!r} is not a token id (k- and 12 hex digits)")
    return Call("DELETE", f"/admin/tokens/{token_id}")


def disable_user(name: str) -> Call:
    return Call("POST", f"/admin/users/{_user_name(name)}/disable")


def edit_user(name: str, fields: Mapping[str, Any]) -> Call:
    """`PATCH /admin/users/{name}`: e.g. `{"share": 2.0}` (operators)."""
    return Call("PATCH", f"/admin/users/{_user_name(name)}", json=dict(fields))


def bulk_action(action: str, selector: Mapping[str, Any], dry_run: bool, confirm: bool) -> Call:
    body = {"action": action, "selector": dict(selector), "dry_run": dry_run, "confirm": confirm}
    return Call("POST", "/bulk/actions", json=body, timeout=BULK_TIMEOUT_S)


def bulk_actions(limit: int, before: int | None) -> Call:
    return Call("GET", "/bulk/actions", params=_params(limit=limit, before=before))


def events(patterns: Iterable[str], after: int | None = None) -> Call:
    """`GET /events` for the topic patterns (at least one, each checked), resuming after the
    position `after` if given."""
    checked = list(dict.fromkeys(topics.check_pattern(p) for p in patterns))
    if not checked:
        raise UsageError("name at least one topic pattern, e.g. 'job.*.*'")
    if after is not None and after < 0:
        raise UsageError(f"an event position is a whole number from 0, not {after}")
    params: list[tuple[str, str | int]] = [("topic", p) for p in checked]
    return Call("GET", "/events", params=params + _params(after=after))


def job_events(job_id: str, *, order: str, start: int | None, limit: int) -> Call:
    """One page of `GET /jobs/{id}/events` (oldest first after `start`, or newest first
    before it)."""
    bound = {"after": start} if order == "oldest" else {"before": start}
    return Call(
        "GET",
        f"/jobs/{check_id('job', job_id)}/events",
        params=_params(order=order, limit=limit, **bound),
    )


def _params(**values: str | int | None) -> list[tuple[str, str | int]]:
    return [(name, value) for name, value in values.items() if value is not None]


def retry_after(response: httpx.Response) -> float | None:
    """For a 429 whose `Retry-After` is a number of seconds: that number; else None."""
    if response.status_code != httpx.codes.TOO_MANY_REQUESTS:
        return None
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


def answer(call: Call, response: httpx.Response) -> Any:
    """What `call` gives: its file's bytes (`content`) or its JSON (`result`)."""
    return content(response) if call.binary else result(response)


def content(response: httpx.Response) -> bytes:
    """The bytes of a 2xx file answer, checked against the sha256 its `ETag` names (or, from
    an S3 store, its `x-amz-meta-sha256`), when it names one; raises `ApiError` like `result`,
    or `BadResponse` when they differ."""
    if not response.is_success:
        result(response)
    data = response.content
    tag = response.headers.get("ETag", "").strip('"')
    if not _SHA256_RE.fullmatch(tag):  # an S3 store's object (after the api's redirect)
        tag = response.headers.get("x-amz-meta-sha256", "")
    if _SHA256_RE.fullmatch(tag) and hashlib.sha256(data).hexdigest() != tag:
        raise BadResponse(
            f"the file from {response.request.url} does not match its sha256 {tag}"
            f" ({len(data)} bytes received): the download was damaged, try again"
        )
    return data


def result(response: httpx.Response) -> Any:
    """The decoded JSON of a 2xx answer (None when empty); raises `ApiError` or `BadResponse`."""
    if response.is_success:
        return _json(response) if response.content else None
    body = _json(response) if _is_json(response) else None
    detail = body.get("detail") if isinstance(body, dict) else body
    if detail is None:
        detail = response.text[:200] or response.reason_phrase
    error = api_error(response.status_code, detail)
    if isinstance(error, RateLimited):
        error.retry_after = retry_after(response)
    if isinstance(error, Gone) and isinstance(body, dict):
        oldest = body.get("oldest_retained")
        error.oldest_retained = oldest if isinstance(oldest, int) else None
    raise error


def unreachable(url: str, exc: httpx.TransportError) -> Unreachable:
    """The `Unreachable` error for a transport failure talking to `url`."""
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        reason = f"no answer in time ({type(exc).__name__})"
    return Unreachable(url, reason)


def _is_json(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("application/json")


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise BadResponse(
            f"the answer to {response.request.method} {response.request.url} is not JSON"
            f" (status {response.status_code}): is this the Vigil API?"
        ) from exc
