"""`Client`: the Vigil HTTP API from Python, synchronously (see `AsyncClient` for asyncio).

    with Client.from_env() as client:
        job = client.submit({"name": "hello", "command": "echo $VIGIL_INPUT", "inputs": [1, 2]})
        final = client.wait(job["id"])

Results are the API's JSON objects as dicts (design §9 names their fields). Errors are
`vigil.errors.VigilError`s: `Unreachable` when no answer came, an `ApiError` subclass when the
API refused (`Unauthorized`, `NotFound`, `Conflict`, `InvalidRequest`).
"""

import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Final, Self, TypeVar, cast, overload

import httpx

from vigil import calls, config, endpoints, harvest
from vigil.calls import Call, Host, Job, LogLine, Output, Task
from vigil.endpoints import Endpoints
from vigil.errors import Unreachable, VigilError, WaitTimeout
from vigil.harvest import Fetched
from vigil.sse import Event, EventStream, Resume
from vigil.states import JOB_FINAL
from vigil.topics import Subscriptions

logger = logging.getLogger(__name__)

#: Seconds between two looks at a job (`wait`) or its log (`logs(follow=True)`).
POLL_S: Final = 0.5
#: A 429 asking to wait longer than this is not retried but raised (`RateLimited`).
MAX_RETRY_WAIT_S: Final = 30.0
#: An event stream silent for this long (the API sends keepalives far more often) is dead.
EVENTS_READ_TIMEOUT_S: Final = 90.0

EventHandler = Callable[[Event], object]
H = TypeVar("H", bound=EventHandler)


class Client:
    """A connection to one Vigil API as one user (the bearer `token`).

    Give `http` (an `httpx.Client`) to choose the transport, proxies or TLS settings; the
    client then does not close it. A submission refused with 429 is sent again after the
    `Retry-After` the API gives, up to `rate_limit_retries` times. Usable as a context
    manager; not thread-safe except for `stop_listening()`.
    """

    def __init__(
        self,
        url: str = config.DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        http: httpx.Client | None = None,
        poll_s: float = POLL_S,
        rate_limit_retries: int = 3,
    ) -> None:
        self._apis = Endpoints(url)
        self.poll_s = poll_s
        self.rate_limit_retries = rate_limit_retries
        self._timeout = timeout
        self._http = http or httpx.Client(timeout=timeout)
        self._owns_http = http is None
        token = config.check_token(token)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._subscriptions: Subscriptions[EventHandler] = Subscriptions()
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        """The base URL of the api requests go to now (of those given, the last to answer)."""
        return self._apis.url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> Self:
        """A client for `VIGIL_URL`/`VIGIL_TOKEN`, else the config file (see `vigil.config`)."""
        found = config.load(env)
        return cls(found.url, found.token, **options)

    def close(self) -> None:
        """Close the connections (unless the `httpx.Client` was given). Idempotent."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- jobs and tasks ------------------------------------------------------------------------

    def submit(self, job: Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        """Submit a job (the body of `POST /jobs`); returns it. The same `idempotency_key`
        again returns the job made the first time instead of a second one."""
        return cast(Job, self._send(calls.submit(job, idempotency_key)))

    def upload(self, path: Path) -> dict[str, str]:
        """Put the file at `path` in the store, straight (the api hands out a signed link:
        `POST /uploads`), unless the store holds its bytes there already; its reference,
        `{"url", "sha256"}`, to name it by in a job's `files`. `VigilError` when the store
        refuses it (a directory store takes no direct uploads: the api's 409 says so);
        `Conflict` when it would take the user over their quota of stored bytes."""
        digest = hashlib.sha256()
        size = 0
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        sha256 = digest.hexdigest()
        answer = cast(dict[str, Any], self._send(calls.start_upload(sha256, size)))
        if answer["put_url"] is not None:
            with path.open("rb") as stream:  # streamed, its length given
                response = self._http.put(answer["put_url"], content=stream, timeout=None)
            if not response.is_success:
                raise VigilError(
                    f"{path}: the store refused its upload ({response.status_code}):"
                    f" {response.text[:300]}"
                )
        return {"url": answer["url"], "sha256": sha256}

    def delete_upload(self, sha256: str) -> None:
        """Delete the file of `sha256` this user uploaded (`upload`) from the store: its bytes
        no longer count against their quota. `NotFound` when they uploaded none."""
        self._send(calls.delete_upload(sha256))

    def job(self, job_id: str) -> Job:
        """The job with its task `counts` per state."""
        return cast(Job, self._send(calls.job(job_id)))

    def jobs_page(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of jobs, newest first: `{"items": [...], "next_cursor": ... or None}`."""
        return cast(dict[str, Any], self._send(calls.jobs_page(state, name, limit, cursor)))

    def jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Iterator[Job]:
        """Every job (an operator's: everyone's), newest first, fetched `limit` at a time."""
        while True:
            page = self.jobs_page(state=state, name=name, limit=limit, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def tasks(self, job_id: str, state: Iterable[str] = ()) -> list[Task]:
        """Every task of the job, by index (read a page at a time); only those in the states
        `state` names, if it names any."""
        states = list(state)
        found: list[Task] = []
        while True:
            after = found[-1]["index"] if found else None
            page = cast(list[Task], self._send(calls.tasks(job_id, after, states)))
            found += page
            if len(page) < calls.TASKS_PAGE:
                return found

    def task(self, task_id: str) -> Task:
        """One task, with `attempts` (the audit rows, oldest first)."""
        return cast(Task, self._send(calls.task(task_id)))

    def append_inputs(self, job_id: str, inputs: list[Any]) -> dict[str, Any]:
        """Add one task per input; returns `{"job": ..., "task_ids": [...]}`."""
        return cast(dict[str, Any], self._send(calls.append_inputs(job_id, inputs)))

    def edit(self, job_id: str, **fields: Any) -> Job:
        """Change fields of the job (`PATCH /jobs/{id}`): while it is configuring `name`,
        `command`, `inputs`, `outputs`, `params`, `policy` (only the policy fields given
        change) and the throttle; once active only the throttle and the policy's budgets,
        backoff and probing (`Conflict` names what was refused). Returns the job."""
        return cast(Job, self._send(calls.edit(job_id, fields)))

    def set_priority(self, job_id: str, priority: int) -> Job:
        """Set the job's priority among its owner's jobs (higher first), while it has not
        ended: a user within the API's range (±100 by default), an operator any. Returns the
        job."""
        return self.edit(job_id, priority=priority)

    def test(self, job_id: str, **test_input: Any) -> Task:
        """Run a test task of a configuring job: on the held input `input_index=n` (0 when
        nothing is given) or on an explicit `input=value`; returns the task."""
        return cast(Task, self._send(calls.start_test(job_id, test_input)))

    def activate(self, job_id: str) -> Job:
        """Put a configuring job into production: its test outputs are discarded and its
        tasks made from the held inputs. Returns the job."""
        return self.job_action(job_id, "activate")

    def job_action(self, job_id: str, action: str, **fields: Any) -> Job:
        """`cancel`, `suspend`, `resume`, `recover_failed`, `throttle` (with `max_in_flight`
        and/or `release_per_tick`), `activate` or `purge`; returns the job. `Conflict` when its
        state does not allow it."""
        return cast(Job, self._send(calls.job_action(job_id, action, fields)))

    def task_action(self, task_id: str, action: str) -> dict[str, Any]:
        """`recover`, `restart_setup|cluster|post_processing`, `duplicate`, `cancel`, `hold`
        or `release`; returns `{"task": ..., "created": new task of a duplicate, or None}`."""
        return cast(dict[str, Any], self._send(calls.task_action(task_id, action)))

    # -- results and cleanup ------------------------------------------------------------------

    def outputs_page(
        self, job_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of the job's outputs: `{"items": [...], "next_cursor": ... or None,
        "purged": None}`; a purged job has none, and `purged` says who purged it, when, why."""
        return cast(dict[str, Any], self._send(calls.outputs_page(job_id, limit, cursor)))

    def outputs(self, job_id: str, *, limit: int = 100) -> Iterator[Output]:
        """The outputs of the latest run of each of the job's tasks, by task index and name:
        `task_id`, `name`, `size`, `sha256`, `host`, `path`, `downloadable`..."""
        cursor = None
        while True:
            page = self.outputs_page(job_id, limit=limit, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def download(self, task_id: str, name: str) -> bytes:
        """The bytes of output `name` of the task (checked against their sha256). `Conflict`
        when they were not kept (too large: the message says where the file is) or the job
        was purged; `NotFound` for an output the task did not record."""
        return cast(bytes, self._send(calls.download(task_id, name)))

    def download_file(self, task_id: str, name: str, dest: Path, sha256: str) -> Fetched:
        """Save output `name` of the task, any size, to `dest`, streamed: a `dest.part` left
        by a cut download is resumed with a ranged read, and `dest` appears only once its
        sha256 is `sha256` (the listing's; `BadResponse` otherwise). Safe to call from several
        threads at once."""
        request = calls.download(task_id, name).request_args(self._apis.url, self._auth)
        return harvest.fetch(self._http, request, dest, sha256)

    def purge(self, job_id: str) -> Job:
        """Delete an ended job's logs, kept outputs and work dirs for good; returns the job
        (with `purged_at`). `Conflict` while anything of it runs, or once purged."""
        return self.job_action(job_id, "purge")

    # -- operators ----------------------------------------------------------------------------

    def hosts(self) -> list[Host]:
        """The worker hosts: heartbeat age, slots, running tasks, quarantine."""
        return cast(list[Host], self._send(calls.hosts()))

    def host_action(self, host_id: str, action: str, **fields: Any) -> dict[str, Any]:
        """`drain`, `undrain`, `quarantine` (`reason`, `duration_s`) or `release` a host
        (operators only)."""
        return cast(dict[str, Any], self._send(calls.host_action(host_id, action, fields)))

    def remove_host(self, host_id: str, force: bool = False) -> dict[str, Any]:
        """Remove a host (operators only): `{"host", "removed", "tasks_lost"}`. `Conflict`
        when it is alive and holds tasks, unless `force` (its tasks are then lost)."""
        return cast(dict[str, Any], self._send(calls.remove_host(host_id, force)))

    def pilots(self, live: bool = False) -> list[dict[str, Any]]:
        """The pilots (hosts run as batch jobs), newest first; only those not ended with
        `live`."""
        return cast(list[dict[str, Any]], self._send(calls.pilots(live)))

    def add_pilots(self, **fields: Any) -> list[dict[str, Any]]:
        """Ask the batch system for pilots (`count`, `walltime_s`, `cpus`, `memory_mb`,
        `gpus`; operators only; `Conflict` when no batch system is configured)."""
        return cast(list[dict[str, Any]], self._send(calls.add_pilots(fields)))

    def remove_pilot(self, pilot_id: str) -> dict[str, Any]:
        """Stop a pilot (operators only): its batch job is cancelled; returns it."""
        return cast(dict[str, Any], self._send(calls.remove_pilot(pilot_id)))

    def analysers(self) -> list[str]:
        """The analysers a job's `policy.analyser` may name (`default` and those installed)."""
        return cast(list[str], self._send(calls.analysers()))

    def emergency_stop(self, reason: str) -> dict[str, Any]:
        """Suspend every active job and kill all running work (operators only; `Forbidden`
        otherwise, `Conflict` while a stop is in force); returns the stop."""
        return cast(dict[str, Any], self._send(calls.emergency_stop(reason)))

    def resume_all(self) -> dict[str, Any]:
        """Lift the emergency stop in force: returns `{"stop", "jobs_resumed",
        "tasks_recovered"}`. `Conflict` when no stop is in force."""
        return cast(dict[str, Any], self._send(calls.resume_all()))

    def users(self) -> list[dict[str, Any]]:
        """Every user: name, role, live tokens, creation, disabled (operators only)."""
        return cast(list[dict[str, Any]], self._send(calls.users()))

    def add_user(self, name: str, role: str = "user", label: str | None = None) -> dict[str, Any]:
        """Create a user: `{"token", "details"}`, the token shown this once (operators only;
        `Conflict` when the name is taken)."""
        return cast(dict[str, Any], self._send(calls.add_user(name, role, label)))

    def tokens(self, name: str) -> list[dict[str, Any]]:
        """A user's tokens by public id, revoked ones included (never a token)."""
        return cast(list[dict[str, Any]], self._send(calls.tokens(name)))

    def new_token(self, name: str, label: str | None = None) -> dict[str, Any]:
        """One more token for a user: `{"token", "details"}`, the token shown this once."""
        return cast(dict[str, Any], self._send(calls.new_token(name, label)))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Revoke a token by its id (`k-...`): it stops working at once."""
        return cast(dict[str, Any], self._send(calls.revoke_token(token_id)))

    def disable_user(self, name: str) -> dict[str, Any]:
        """Disable a user: none of their tokens works any more."""
        return cast(dict[str, Any], self._send(calls.disable_user(name)))

    def set_share(self, name: str, share: float) -> dict[str, Any]:
        """Set a user's fair share (default 1; operators only): users with tasks waiting get
        the pool in proportion to their shares. Returns the user."""
        return cast(dict[str, Any], self._send(calls.edit_user(name, {"share": share})))

    def set_store_quota(self, name: str, quota_bytes: int | None) -> dict[str, Any]:
        """Set a user's quota of stored bytes (0: none; None: the installation's,
        VIGIL_STORE_QUOTA_BYTES; operators only). Returns the user."""
        return cast(
            dict[str, Any], self._send(calls.edit_user(name, {"store_quota_bytes": quota_bytes}))
        )

    def bulk_action(
        self,
        action: str,
        selector: Mapping[str, Any],
        *,
        dry_run: bool = False,
        confirm: bool = False,
    ) -> dict[str, Any]:
        """Apply a task action (`recover`, `restart_cluster`, `cancel`...) to every task the
        `selector` matches (`states`, `failure_classes`, `hosts`, `job_ids`, `job_name` glob,
        `updated_after`/`updated_before`); a user's only among their own jobs. Returns the
        record with `matched`, `jobs`, `applied`, `refused`, `refusals` (reason -> count) and a
        `sample` of matched tasks. `dry_run` changes nothing. `Conflict` when more tasks match
        than the API's threshold and `confirm` is false; `InvalidRequest` for an empty
        selector or one matching more than one bulk action may touch."""
        call = calls.bulk_action(action, selector, dry_run, confirm)
        return cast(dict[str, Any], self._send(call))

    def bulk_actions(self, *, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
        """The recorded bulk actions, newest first (a user's own; an operator's: everyone's),
        with ids below `before` if given."""
        return cast(list[dict[str, Any]], self._send(calls.bulk_actions(limit, before)))

    # -- following ----------------------------------------------------------------------------

    def wait(
        self,
        job_id: str,
        on_progress: Callable[[Job], object] | None = None,
        timeout: float | None = None,
    ) -> Job:
        """Poll the job until it is completed, failed or cancelled; returns it then.

        `on_progress(job)` is called with every view read, the last one included. Raises
        `WaitTimeout` (holding the last view) after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["state"] in JOB_FINAL:
                return job
            left = _left(deadline)
            if left is not None and left <= 0:
                raise WaitTimeout(job_id, cast(float, timeout), job)
            time.sleep(self.poll_s if left is None else min(self.poll_s, left))

    def logs(
        self,
        job_id: str,
        *,
        task: str | None = None,
        run: int | None = None,
        severity: str | None = None,
        after: int = 0,
        follow: bool = False,
        limit: int = 1000,
    ) -> Iterator[LogLine]:
        """The job's log lines in order, from the one after sequence number `after`.

        With `follow`, keeps polling for new lines until the job has ended (completed, failed
        or cancelled) and every line of it was given.
        """
        ended = False
        while True:
            call = calls.logs_page(
                job_id, task=task, run=run, severity=severity, after=after, limit=limit
            )
            page = cast(dict[str, Any], self._send(call))
            yield from page["items"]
            after = page["next_after"] if page["next_after"] is not None else after
            if len(page["items"]) == limit:
                continue
            if not follow or ended:
                return
            # Lines are stored before a task's end is, so once the job has ended one more
            # read gets the rest.
            ended = self.job(job_id)["state"] in JOB_FINAL
            if not ended:
                time.sleep(self.poll_s)

    def job_events(
        self, job_id: str, *, newest_first: bool = False, limit: int = 1000
    ) -> Iterator[Event]:
        """The job's events as the API keeps them (`GET /jobs/{id}/events`), oldest first (or
        newest first), page after page."""
        order = "newest" if newest_first else "oldest"
        start: int | None = None
        while True:
            call = calls.job_events(job_id, order=order, start=start, limit=limit)
            page = cast(dict[str, Any], self._send(call))
            yield from (Event(e["routing_key"], e["body"], e["seq"]) for e in page["items"])
            start = page["next"]
            if start is None:
                return

    @contextmanager
    def subscribe(
        self,
        patterns: Iterable[str],
        *,
        after: int | None = None,
        read_timeout: float | None = EVENTS_READ_TIMEOUT_S,
    ) -> Iterator[EventStream]:
        """Open `GET /events` for the topic `patterns`: within the block the subscription is in
        place (the API binds it before answering) and the iterator gives events as they come,
        first those after the position `after` that the API still keeps (if given). The
        iterator's `position` is the last position it gave (or where it started).

        The iterator ends when the API closes the stream. `Unreachable` when the stream cannot
        be opened, breaks, or stays silent longer than `read_timeout` (keepalives count);
        `Gone` when the API no longer keeps every event after `after`.
        """
        call = calls.events(patterns, after)
        timeout = httpx.Timeout(self._timeout, read=read_timeout)
        try:
            request = call.request_args(self.url, self._auth)
            with self._http.stream(**request, timeout=timeout) as response:
                if not response.is_success:
                    response.read()
                    calls.result(response)
                yield EventStream(response.iter_lines())
        except httpx.TransportError as exc:
            url = self.url
            self._apis.next()  # the next attempt (`follow` reconnecting) goes to the next api
            raise calls.unreachable(url, exc) from exc

    def events(
        self,
        patterns: Iterable[str],
        *,
        after: int | None = None,
        read_timeout: float | None = EVENTS_READ_TIMEOUT_S,
    ) -> Generator[Event, None, None]:
        """The events matching `patterns` from when the stream opens (or after the position
        `after`) until it ends (see `subscribe`). `follow()` reconnects and resumes."""
        with self.subscribe(patterns, after=after, read_timeout=read_timeout) as stream:
            yield from stream

    @overload
    def on(self, pattern: str) -> Callable[[H], H]: ...
    @overload
    def on(self, pattern: str, fn: H) -> H: ...
    def on(self, pattern: str, fn: H | None = None) -> H | Callable[[H], H]:
        """Call `fn(event)` for every event matching the topic `pattern`, while `listen()` runs.

        Usable as a decorator: `@client.on("task.failed_on_cluster.*")`.
        """

        def register(handler: H) -> H:
            self._subscriptions.add(pattern, handler)
            return handler

        return register if fn is None else register(fn)

    def follow(
        self,
        patterns: Iterable[str],
        *,
        since: int | None = None,
        reconnect: bool = True,
        retry_s: float = 1.0,
        on_open: Callable[[], object] | None = None,
    ) -> Generator[Event, None, None]:
        """`events(patterns)` from now (or after the position `since`; 0: everything the API
        keeps) that, with `reconnect`, opens the stream again `retry_s` after it broke or the
        API closed it, resuming after the last position it saw: no job or task event is
        missed or given twice across reconnections and api restarts. `on_open()` is called
        each time a subscription is in place. Ends at `stop_listening()` (noticed at the next
        event or keepalive); errors the API answers (401, 403, 404, 410 `Gone`) end it too."""
        patterns = list(patterns)
        resume = Resume(since)
        self._stop.clear()
        while not self._stop.is_set():
            try:
                with self.subscribe(patterns, after=resume.last) as stream:
                    try:
                        if on_open is not None:
                            on_open()
                        for event in stream:
                            if resume.fresh(event):
                                yield event
                            resume.reached(event.seq)
                            if self._stop.is_set():
                                return
                    finally:
                        resume.reached(stream.position)
            except Unreachable as exc:
                if not reconnect:
                    raise
                logger.warning("%s; following again in %gs", exc, retry_s)
            if not reconnect or self._stop.wait(retry_s):
                return

    def listen(
        self,
        *,
        since: int | None = None,
        reconnect: bool = True,
        retry_s: float = 1.0,
        on_open: Callable[[], object] | None = None,
    ) -> None:
        """Follow the events of every registered pattern, calling the matching callbacks (once
        per event, across reconnections).

        Runs until `stop_listening()`; see `follow()` for `since`, reconnecting and `on_open`.
        An exception a callback raises ends it.
        """
        patterns = self._subscriptions.patterns()
        following = self.follow(
            patterns, since=since, reconnect=reconnect, retry_s=retry_s, on_open=on_open
        )
        with closing(following) as stream:
            for event in stream:
                self.dispatch(event)

    def stop_listening(self) -> None:
        """Make `listen()` return (safe from another thread or from a callback)."""
        self._stop.set()

    def dispatch(self, event: Event) -> None:
        """Call every registered callback whose pattern matches the event's routing key."""
        for handler in self._subscriptions.handlers_for(event.routing_key):
            handler(event)

    # -- sending ------------------------------------------------------------------------------

    def _request(self, call: Call) -> httpx.Response:
        """Send `call` to the current api, else to the next ones in turn while it may be sent
        again (`endpoints.may_resend`); `Unreachable` from the last one tried."""
        for tried in itertools.count(1):
            url = self._apis.url
            try:
                return self._http.request(**call.request_args(url, self._auth))
            except httpx.TransportError as exc:
                if tried >= len(self._apis.urls) or not endpoints.may_resend(call, exc):
                    raise calls.unreachable(url, exc) from exc
                logger.warning("%s; trying %s", calls.unreachable(url, exc), self._apis.next())
        raise AssertionError("unreachable")

    def _send(self, call: Call) -> Any:
        for attempt in itertools.count(1):
            response = self._request(call)
            delay = calls.retry_after(response)
            if delay is None or attempt > self.rate_limit_retries or delay > MAX_RETRY_WAIT_S:
                break
            logger.info("rate limited by the API; retrying in %gs", delay)
            time.sleep(delay)
        return calls.answer(call, response)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()
