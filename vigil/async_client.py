"""`AsyncClient`: the same API as `vigil.client.Client`, for asyncio programs.

    async with AsyncClient.from_env() as client:
        job = await client.submit({"command": "echo hi"})
        async for line in client.logs(job["id"], follow=True):
            print(line["line"])

Callbacks given to `on()` may be plain functions or coroutine functions.
"""

import asyncio
import inspect
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Self, TypeVar, cast, overload

import httpx

from vigil import calls, config, endpoints
from vigil.calls import Call, Host, Job, LogLine, Output, Task
from vigil.client import EVENTS_READ_TIMEOUT_S, MAX_RETRY_WAIT_S, POLL_S
from vigil.endpoints import Endpoints
from vigil.errors import Unreachable
from vigil.sse import AsyncEventStream, Event, Resume
from vigil.states import JOB_FINAL
from vigil.topics import Subscriptions

logger = logging.getLogger(__name__)

AsyncEventHandler = Callable[[Event], object]
H = TypeVar("H", bound=AsyncEventHandler)


class AsyncClient:
    """A connection to one Vigil API as one user; see `Client` for each method's contract.

    Give `http` (an `httpx.AsyncClient`, e.g. over `httpx.ASGITransport`) to choose the
    transport; the client then does not close it.
    """

    def __init__(
        self,
        url: str = config.DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        http: httpx.AsyncClient | None = None,
        poll_s: float = POLL_S,
        rate_limit_retries: int = 3,
    ) -> None:
        self._apis = Endpoints(url)
        self.poll_s = poll_s
        self.rate_limit_retries = rate_limit_retries
        self._timeout = timeout
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http is None
        token = config.check_token(token)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._subscriptions: Subscriptions[AsyncEventHandler] = Subscriptions()
        self._stop = asyncio.Event()

    @property
    def url(self) -> str:
        """The base URL of the api requests go to now (of those given, the last to answer)."""
        return self._apis.url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> Self:
        """A client for `VIGIL_URL`/`VIGIL_TOKEN`, else the config file (see `vigil.config`)."""
        found = config.load(env)
        return cls(found.url, found.token, **options)

    async def aclose(self) -> None:
        """Close the connections (unless the `httpx.AsyncClient` was given). Idempotent."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def submit(self, job: Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        return cast(Job, await self._send(calls.submit(job, idempotency_key)))

    async def job(self, job_id: str) -> Job:
        return cast(Job, await self._send(calls.job(job_id)))

    async def jobs_page(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        call = calls.jobs_page(state, name, limit, cursor)
        return cast(dict[str, Any], await self._send(call))

    async def jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> AsyncIterator[Job]:
        while True:
            page = await self.jobs_page(state=state, name=name, limit=limit, cursor=cursor)
            for item in page["items"]:
                yield item
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def tasks(self, job_id: str, state: Iterable[str] = ()) -> list[Task]:
        states = list(state)
        found: list[Task] = []
        while True:
            after = found[-1]["index"] if found else None
            page = cast(list[Task], await self._send(calls.tasks(job_id, after, states)))
            found += page
            if len(page) < calls.TASKS_PAGE:
                return found

    async def task(self, task_id: str) -> Task:
        return cast(Task, await self._send(calls.task(task_id)))

    async def append_inputs(self, job_id: str, inputs: list[Any]) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.append_inputs(job_id, inputs)))

    async def edit(self, job_id: str, **fields: Any) -> Job:
        return cast(Job, await self._send(calls.edit(job_id, fields)))

    async def set_priority(self, job_id: str, priority: int) -> Job:
        return await self.edit(job_id, priority=priority)

    async def test(self, job_id: str, **test_input: Any) -> Task:
        return cast(Task, await self._send(calls.start_test(job_id, test_input)))

    async def activate(self, job_id: str) -> Job:
        return await self.job_action(job_id, "activate")

    async def job_action(self, job_id: str, action: str, **fields: Any) -> Job:
        return cast(Job, await self._send(calls.job_action(job_id, action, fields)))

    async def task_action(self, task_id: str, action: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.task_action(task_id, action)))

    async def outputs_page(
        self, job_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.outputs_page(job_id, limit, cursor)))

    async def outputs(self, job_id: str, *, limit: int = 100) -> AsyncIterator[Output]:
        cursor = None
        while True:
            page = await self.outputs_page(job_id, limit=limit, cursor=cursor)
            for item in page["items"]:
                yield item
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def download(self, task_id: str, name: str) -> bytes:
        return cast(bytes, await self._send(calls.download(task_id, name)))

    async def purge(self, job_id: str) -> Job:
        return await self.job_action(job_id, "purge")

    async def hosts(self) -> list[Host]:
        return cast(list[Host], await self._send(calls.hosts()))

    async def host_action(self, host_id: str, action: str, **fields: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.host_action(host_id, action, fields)))

    async def pilots(self, live: bool = False) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._send(calls.pilots(live)))

    async def add_pilots(self, **fields: Any) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._send(calls.add_pilots(fields)))

    async def remove_pilot(self, pilot_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.remove_pilot(pilot_id)))

    async def analysers(self) -> list[str]:
        return cast(list[str], await self._send(calls.analysers()))

    async def emergency_stop(self, reason: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.emergency_stop(reason)))

    async def resume_all(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.resume_all()))

    async def users(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._send(calls.users()))

    async def add_user(
        self, name: str, role: str = "user", label: str | None = None
    ) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.add_user(name, role, label)))

    async def tokens(self, name: str) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._send(calls.tokens(name)))

    async def new_token(self, name: str, label: str | None = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.new_token(name, label)))

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.revoke_token(token_id)))

    async def disable_user(self, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.disable_user(name)))

    async def set_share(self, name: str, share: float) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(calls.edit_user(name, {"share": share})))

    async def bulk_action(
        self,
        action: str,
        selector: Mapping[str, Any],
        *,
        dry_run: bool = False,
        confirm: bool = False,
    ) -> dict[str, Any]:
        call = calls.bulk_action(action, selector, dry_run, confirm)
        return cast(dict[str, Any], await self._send(call))

    async def bulk_actions(
        self, *, limit: int = 50, before: int | None = None
    ) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._send(calls.bulk_actions(limit, before)))

    async def wait(self, job_id: str, on_progress: Callable[[Job], object] | None = None) -> Job:
        """Poll the job until it is completed, failed or cancelled; returns it then.

        For a time limit, wrap the call in `asyncio.timeout()` (the asyncio way).
        """
        while True:
            job = await self.job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["state"] in JOB_FINAL:
                return job
            await asyncio.sleep(self.poll_s)

    async def logs(
        self,
        job_id: str,
        *,
        task: str | None = None,
        run: int | None = None,
        severity: str | None = None,
        after: int = 0,
        follow: bool = False,
        limit: int = 1000,
    ) -> AsyncIterator[LogLine]:
        ended = False
        while True:
            call = calls.logs_page(
                job_id, task=task, run=run, severity=severity, after=after, limit=limit
            )
            page = cast(dict[str, Any], await self._send(call))
            for item in page["items"]:
                yield item
            after = page["next_after"] if page["next_after"] is not None else after
            if len(page["items"]) == limit:
                continue
            if not follow or ended:
                return
            ended = (await self.job(job_id))["state"] in JOB_FINAL
            if not ended:
                await asyncio.sleep(self.poll_s)

    async def job_events(
        self, job_id: str, *, newest_first: bool = False, limit: int = 1000
    ) -> AsyncIterator[Event]:
        order = "newest" if newest_first else "oldest"
        start: int | None = None
        while True:
            call = calls.job_events(job_id, order=order, start=start, limit=limit)
            page = cast(dict[str, Any], await self._send(call))
            for e in page["items"]:
                yield Event(e["routing_key"], e["body"], e["seq"])
            start = page["next"]
            if start is None:
                return

    @asynccontextmanager
    async def subscribe(
        self,
        patterns: Iterable[str],
        *,
        after: int | None = None,
        read_timeout: float | None = EVENTS_READ_TIMEOUT_S,
    ) -> AsyncIterator[AsyncEventStream]:
        call = calls.events(patterns, after)
        timeout = httpx.Timeout(self._timeout, read=read_timeout)
        try:
            request = call.request_args(self.url, self._auth)
            async with self._http.stream(**request, timeout=timeout) as response:
                if not response.is_success:
                    await response.aread()
                    calls.result(response)
                yield AsyncEventStream(response.aiter_lines())
        except httpx.TransportError as exc:
            url = self.url
            self._apis.next()  # the next attempt (`follow` reconnecting) goes to the next api
            raise calls.unreachable(url, exc) from exc

    async def events(
        self,
        patterns: Iterable[str],
        *,
        after: int | None = None,
        read_timeout: float | None = EVENTS_READ_TIMEOUT_S,
    ) -> AsyncGenerator[Event, None]:
        async with self.subscribe(patterns, after=after, read_timeout=read_timeout) as stream:
            async for event in stream:
                yield event

    @overload
    def on(self, pattern: str) -> Callable[[H], H]: ...
    @overload
    def on(self, pattern: str, fn: H) -> H: ...
    def on(self, pattern: str, fn: H | None = None) -> H | Callable[[H], H]:
        def register(handler: H) -> H:
            self._subscriptions.add(pattern, handler)
            return handler

        return register if fn is None else register(fn)

    async def follow(
        self,
        patterns: Iterable[str],
        *,
        since: int | None = None,
        reconnect: bool = True,
        retry_s: float = 1.0,
        on_open: Callable[[], object] | None = None,
    ) -> AsyncGenerator[Event, None]:
        patterns = list(patterns)
        resume = Resume(since)
        self._stop.clear()
        while not self._stop.is_set():
            try:
                async with self.subscribe(patterns, after=resume.last) as stream:
                    try:
                        if on_open is not None:
                            on_open()
                        async for event in stream:
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
            if not reconnect or await self._stopped_within(retry_s):
                return

    async def listen(
        self,
        *,
        since: int | None = None,
        reconnect: bool = True,
        retry_s: float = 1.0,
        on_open: Callable[[], object] | None = None,
    ) -> None:
        patterns = self._subscriptions.patterns()
        stream = self.follow(
            patterns, since=since, reconnect=reconnect, retry_s=retry_s, on_open=on_open
        )
        async with aclosing(stream):
            async for event in stream:
                await self.dispatch(event)

    def stop_listening(self) -> None:
        """Make `listen()` return (from a callback or another task of the same loop)."""
        self._stop.set()

    async def dispatch(self, event: Event) -> None:
        """Call (and await, for coroutine functions) every callback matching the event."""
        for handler in self._subscriptions.handlers_for(event.routing_key):
            outcome = handler(event)
            if inspect.isawaitable(outcome):
                await outcome

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._stop.wait()
        except TimeoutError:
            return False
        return True

    async def _request(self, call: Call) -> httpx.Response:
        """Send `call` to the current api, else to the next ones in turn while it may be sent
        again (`endpoints.may_resend`); `Unreachable` from the last one tried."""
        for tried in itertools.count(1):
            url = self._apis.url
            try:
                return await self._http.request(**call.request_args(url, self._auth))
            except httpx.TransportError as exc:
                if tried >= len(self._apis.urls) or not endpoints.may_resend(call, exc):
                    raise calls.unreachable(url, exc) from exc
                logger.warning("%s; trying %s", calls.unreachable(url, exc), self._apis.next())
        raise AssertionError("unreachable")

    async def _send(self, call: Call) -> Any:
        for attempt in itertools.count(1):
            response = await self._request(call)
            delay = calls.retry_after(response)
            if delay is None or attempt > self.rate_limit_retries or delay > MAX_RETRY_WAIT_S:
                break
            logger.info("rate limited by the API; retrying in %gs", delay)
            await asyncio.sleep(delay)
        return calls.answer(call, response)
