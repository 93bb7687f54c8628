"""What a service says of its own health, served over HTTP and told to systemd.

The scheduler, the worker and the supervisor each serve `GET /healthz` (and `HEAD`) on
`VIGIL_HEALTH_HOST` (loopback by default) and a port of their own (`VIGIL_SCHEDULER_HEALTH_PORT`,
`VIGIL_WORKER_HEALTH_PORT`, `VIGIL_SUPERVISOR_HEALTH_PORT`; 0, the default: not served); the
api answers its own `/healthz`. The answer is JSON, `{"service", "status", "checks"}`: 200 when
the status is `ok` or `degraded`, 503 when it is `unavailable`. Each check says whether it holds
(`ok`) and what it found, in words (`detail`); a failing check makes its service unavailable,
degraded, or nothing at all (a fact worth showing: a standby scheduler is not leading). The
server starts first in `main()`, so a service still waiting for a server at its start answers
too: unavailable, its check `started` saying what it waits for.

Under systemd (`Type=notify`: `NOTIFY_SOCKET` set), a service sends `READY=1` once started, its
status line (`systemctl status`) every `STATUS_EVERY_S`, and `WATCHDOG=1` from its event loop
every half `WatchdogSec=`: a loop that stops turning is killed and started again; a server that
went away is only reported (a restart would not bring it back).

`python -m shared.runtime.health URL [--wait S [--pid PID]]` probes a service (the api's
`/healthz` too) without curl: one line (the status, and what fails), exit 0 when it answered
200, 1 otherwise. Standard library only: a container's healthcheck runs it at every tick.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

logger = logging.getLogger(__name__)

Status = Literal["ok", "degraded", "unavailable"]
#: What a failing check makes of its service.
Effect = Literal["unavailable", "degraded", "none"]

#: Longest a probe's checks may take together (each server's own check is bounded tighter).
PROBE_TIMEOUT_S: Final = 5.0
#: How often the status line given to systemd is brought up to date.
STATUS_EVERY_S: Final = 10.0
#: Longest a client may take to send its request.
_READ_TIMEOUT_S: Final = 2.0
_MAX_HEADER_LINES: Final = 64
_PATH: Final = "/healthz"


@dataclass(frozen=True)
class Check:
    """One thing a service relies on, or one fact about it: whether it holds, in words."""

    ok: bool
    detail: str
    fails: Effect = "degraded"


Checks = Mapping[str, Check]
Probe = Callable[[], Awaitable[dict[str, Check]]]


def status(checks: Checks) -> Status:
    """The worst that the failing checks make of the service."""
    failing = {check.fails for check in checks.values() if not check.ok}
    if "unavailable" in failing:
        return "unavailable"
    return "degraded" if "degraded" in failing else "ok"


def http_status(said: Status) -> int:
    """503 for an unavailable service (load balancers and healthchecks look at the code)."""
    return 503 if said == "unavailable" else 200


def answer(service: str, checks: Checks) -> dict[str, Any]:
    """The JSON body of `GET /healthz`."""
    return {
        "service": service,
        "status": status(checks),
        "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in checks.items()},
    }


def summary(body: Mapping[str, Any]) -> str:
    """One line: the status, then what fails (a service's failing checks, or the api's
    reasons), e.g. `ok: standing by: another scheduler leads`."""
    checks = body.get("checks")
    said = [
        str(check.get("detail"))
        for check in (checks.values() if isinstance(checks, dict) else ())
        if isinstance(check, dict) and not check.get("ok")
    ]
    reasons = body.get("reasons")
    said += [str(reason) for reason in reasons] if isinstance(reasons, list) else []
    line = str(body.get("status", "no status"))
    return f"{line}: {'; '.join(said)}" if said else line


class Health:
    """One service's health: what its start waits for, then what its probe finds."""

    def __init__(self, service: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.service = service
        self._timeout_s = timeout_s
        self._waiting = "not up yet"
        self._probe: Probe | None = None
        self._up_at = 0.0
        #: The probe under way: concurrent requests share it (a burst of probes costs one).
        self._running: asyncio.Future[dict[str, Check]] | None = None
        self._systemd = _Systemd.take_from_environment()

    def starting(self, what: str) -> None:
        """Say what the start waits for now (`started` tells it until `up`)."""
        self._waiting = what
        self._systemd.notify(f"STATUS=starting: {what}")

    def up(self, probe: Probe) -> None:
        """Started: from now on `probe` says how the service is; systemd is told READY=1."""
        self._probe, self._up_at = probe, time.monotonic()
        self._systemd.notify("READY=1")

    @property
    def started(self) -> bool:
        return self._probe is not None

    async def checks(self) -> dict[str, Check]:
        """`started`, and once started what the probe finds (within the timeout)."""
        if self._probe is None:
            return {"started": Check(False, f"starting: {self._waiting}", "unavailable")}
        started = Check(True, f"up for {time.monotonic() - self._up_at:.0f} s")
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._probe_within(self._probe))
        return {"started": started, **await asyncio.shield(self._running)}

    async def _probe_within(self, probe: Probe) -> dict[str, Check]:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await probe()
        except TimeoutError:
            detail = f"the checks took more than {self._timeout_s:g} s"
        except Exception as exc:  # a health probe reports, it never brings a service down
            logger.exception("health probe failed")
            detail = f"the checks failed: {exc!r}"
        return {"probe": Check(False, detail, "unavailable")}

    async def answer(self) -> dict[str, Any]:
        """The JSON body of `GET /healthz` now."""
        return answer(self.service, await self.checks())

    @asynccontextmanager
    async def serve(self, host: str, port: int) -> AsyncIterator[None]:
        """For the block: `GET /healthz` on `host:port` (port 0: not served), and systemd told
        (status line, watchdog) when the service runs under it."""
        server = None
        if port:
            server = await asyncio.start_server(self._serve_one, host, port, limit=8192)
            logger.info("health at http://%s:%d%s", host, port, _PATH)
        tasks = self._systemd.tasks(self)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if server is not None:
                server.close()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1):
                        await server.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request, HTTP/1.0: the answer, then the connection is closed."""
        try:
            request = await _read_request(reader)
            method, path = request or ("", "")
            code, body = await self._respond(method, path) if request else (400, _BAD_REQUEST)
            payload = (json.dumps(body) + "\n").encode()
            head = (
                f"HTTP/1.0 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else payload))
            await writer.drain()
        except (ConnectionError, TimeoutError):
            pass  # the client went away, or never finished its request
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def _respond(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        if path.split("?", 1)[0] != _PATH:
            return 404, {"error": f"not found: the health probe is GET {_PATH}"}
        if method not in ("GET", "HEAD"):
            return 405, {"error": f"method not allowed: GET {_PATH}"}
        body = await self.answer()
        return http_status(body["status"]), body


_BAD_REQUEST: Final = {"error": f"bad request: the health probe is GET {_PATH} HTTP/1.0"}
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """(method, target) of the request line, once the headers are read; None if malformed."""
    async with asyncio.timeout(_READ_TIMEOUT_S):
        try:
            first = await reader.readline()
            for _ in range(_MAX_HEADER_LINES):
                if (await reader.readline()).strip() == b"":
                    break
            else:
                return None
        except (asyncio.LimitOverrunError, ValueError):
            return None
    parts = first.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    return parts[0], parts[1]


@dataclass(frozen=True)
class _Systemd:
    """systemd's notification socket and watchdog period, if the service runs under it."""

    socket: str | None
    watchdog_s: float | None

    @classmethod
    def take_from_environment(cls) -> "_Systemd":
        """Read `NOTIFY_SOCKET` and `WATCHDOG_USEC` and take them out of the environment (as
        `sd_notify`'s `unset_environment` does): the commands a worker starts never see them."""
        address = os.environ.pop("NOTIFY_SOCKET", None) or None
        usec = os.environ.pop("WATCHDOG_USEC", None)
        pid = os.environ.pop("WATCHDOG_PID", None)
        mine = pid is None or pid == str(os.getpid())
        watchdog_s = int(usec) / 1e6 if usec and usec.isdigit() and mine else None
        return cls(address, watchdog_s)

    def notify(self, state: str) -> None:
        """Send `state` (`READY=1`, `STATUS=...`, `WATCHDOG=1`) to systemd, if it listens."""
        if self.socket is None:
            return
        address = "\0" + self.socket[1:] if self.socket.startswith("@") else self.socket
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.sendall(state.encode())
        except OSError as exc:
            logger.warning("cannot notify systemd at %s: %s", self.socket, exc)

    def tasks(self, health: Health) -> list["asyncio.Task[None]"]:
        """The status line's updates and the watchdog's pings, if systemd listens."""
        if self.socket is None:
            return []
        found = [asyncio.create_task(self._status(health), name="systemd-status")]
        if self.watchdog_s is not None:
            found.append(asyncio.create_task(self._watchdog(self.watchdog_s), name="watchdog"))
        return found

    async def _status(self, health: Health) -> None:
        while True:
            if health.started:  # before, `starting` told what the start waits for
                self.notify(f"STATUS={summary(await health.answer())}")
            await asyncio.sleep(STATUS_EVERY_S)

    async def _watchdog(self, period_s: float) -> None:
        """Ping from the event loop: a loop that stops turning stops the pings."""
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(period_s / 2)


def probe(url: str, timeout_s: float) -> tuple[int | None, str]:
    """GET `url` (no proxy): the HTTP status (None: no answer) and the summary line."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            code, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        code, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return None, f"no answer from {url}: {getattr(exc, 'reason', exc)}"
    try:
        body = json.loads(raw)
    except ValueError:
        return code, f"HTTP {code} from {url}: {raw[:200]!r}"
    return code, summary(body) if isinstance(body, dict) else f"HTTP {code}: {body!r}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m shared.runtime.health URL`: 0 when the service answered 200 (ok or
    degraded), 1 otherwise; the summary line on stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m shared.runtime.health",
        description="Probe a Vigil service's /healthz: exit 0 on 200 (ok or degraded), else 1.",
    )
    parser.add_argument("url", help="e.g. http://127.0.0.1:8101/healthz")
    parser.add_argument("--timeout", type=float, default=3.0, help="per request (seconds)")
    parser.add_argument("--wait", type=float, default=0.0, help="ask again until 200, this long")
    parser.add_argument("--pid", type=int, help="with --wait: give up once this process is gone")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.wait
    while True:
        code, said = probe(args.url, args.timeout)
        gone = args.pid is not None and not _alive(args.pid)
        if code == 200 or gone or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    sys.stdout.write(said + (f" (process {args.pid} exited)" if gone else "") + "\n")
    return 0 if code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
