"""HTTP side of scripts/up: run a demo job, print where to look (scripts/up waits for each
service with `python -m shared.runtime.health`).

Stdlib only. Reads VIGIL_API_URL (default http://127.0.0.1:8000) and VIGIL_TOKEN.

    python scripts/demo.py run --timeout 60 [--token-source file|env]
    python scripts/demo.py where [--token-source file|env]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

API = os.environ.get("VIGIL_API_URL", "http://127.0.0.1:8000").rstrip("/")
TOKEN = os.environ.get("VIGIL_TOKEN", "")
TERMINAL = {"completed", "failed", "cancelled"}
DEMO_JOB = {
    "name": "demo",
    "command": 'echo "hello $VIGIL_INPUT"; echo "WARNING: demo warning" >&2',
    "inputs": ["a", "b", "c"],
}


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def call(method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(API + path, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if TOKEN:
        request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise ApiError(exc.code, exc.read().decode(errors="replace")) from None
    return json.loads(raw) if raw else None


def items(payload: Any) -> list[dict[str, Any]]:
    """A list response, whether bare or wrapped in {"items": [...]}."""
    if isinstance(payload, dict):
        payload = payload.get("items", [])
    return [item for item in payload or [] if isinstance(item, dict)]


def print_where(job_id: str | None, token_source: str) -> None:
    out()
    out("Where to look:")
    rows: list[tuple[str, str | None]] = [("dashboard", "/"), ("API docs", "/docs")]
    if job_id:
        rows += [("its page", f"/ui/jobs/{job_id}")]
        rows += [("the job", f"/jobs/{job_id}"), ("its logs", f"/jobs/{job_id}/logs")]
    rows += [("metrics", "/metrics"), ("service logs", None)]
    for label, path in rows:
        out(f"  {label:<13} {API + path if path is not None else '.run/logs/<service>.log'}")
    out("  (the dashboard asks for the token once, and keeps it in a cookie for the session)")
    out()
    out("Use the API (Bearer token, operator role):")
    if token_source == "env":
        out('  export VIGIL_TOKEN="$VIGIL_BOOTSTRAP_TOKEN"')
    else:
        out("  export VIGIL_TOKEN=$(cat .run/token)")
    target = f"/jobs/{job_id}" if job_id else "/jobs"
    out(f'  curl -s -H "Authorization: Bearer $VIGIL_TOKEN" {API}{target}')
    out()
    out("Or the vigil command (installed in .venv; put it on your PATH first):")
    out("  source .venv/bin/activate")
    out(f"  export VIGIL_URL={API} VIGIL_TOKEN=$(cat .run/token)")
    out("  vigil submit docs/examples/campaign/campaign.yaml --wait   # try this one")
    out("  vigil status <job id>; vigil tasks <job id>; vigil --help")


def wait_job(job_id: str, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] | None = None
    shown = ""
    while time.monotonic() < deadline:
        job = call("GET", f"/jobs/{job_id}")
        assert job is not None
        counts = job.get("counts") or {}
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if n)
        line = f"    ..  {job.get('state')}: {summary or 'no tasks yet'}"
        if line != shown:
            out(line)
            shown = line
        if job.get("state") in TERMINAL:
            return job
        time.sleep(0.5)
    return None


def print_tasks(job_id: str) -> None:
    tasks = items(call("GET", f"/jobs/{job_id}/tasks"))
    out()
    out(f"  {'task':<6}{'input':<8}{'state':<14}{'exit':<6}error")
    for task in sorted(tasks, key=lambda t: t.get("index") or 0):
        exit_code = task.get("exit_code")
        out(
            f"  {task.get('index', '?')!s:<6}{task.get('input') or '':<8}"
            f"{task.get('state', '?'):<14}{'' if exit_code is None else exit_code!s:<6}"
            f"{task.get('error_brief') or ''}"
        )


def print_logs(job_id: str, limit: int = 8) -> None:
    # Logs are persisted by the scheduler a moment after the task reports; give them a few seconds.
    records: list[dict[str, Any]] = []
    for _ in range(10):
        records = items(call("GET", f"/jobs/{job_id}/logs"))
        if records:
            break
        time.sleep(0.5)
    out()
    if not records:
        out("  (no log lines stored yet)")
        return
    out(f"First log lines ({min(limit, len(records))} of {len(records)}):")
    for record in records[:limit]:
        severity = str(record.get("severity", "?"))
        task = str(record.get("task_id", ""))
        out(f"  {record.get('seq', ''):>4} {severity:<8} {task:<14} {record.get('line', '')}")


def cmd_run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        job = call("POST", "/jobs", DEMO_JOB)
    except ApiError as exc:
        sys.stderr.write(f"submitting the demo job failed: {exc}\n")
        if exc.status == 401:
            sys.stderr.write(
                "the running api does not know this token (started with another one?): "
                "scripts/down && scripts/up\n"
            )
        return 1
    job_id = str(job["id"])
    out(f"    ok  submitted {job_id}: {DEMO_JOB['command']}  over inputs a, b, c")
    final = wait_job(job_id, args.timeout)
    if final is None:
        sys.stderr.write(f"the demo job {job_id} did not finish within {args.timeout:.0f} s\n")
        print_tasks(job_id)
        print_where(job_id, args.token_source)
        return 1
    elapsed = time.monotonic() - started
    state = final.get("state")
    mark = "ok" if state == "completed" else "!!"
    out(f"    {mark}  demo job {job_id} {state} in {elapsed:.1f} s")
    print_tasks(job_id)
    print_logs(job_id)
    print_where(job_id, args.token_source)
    return 0 if state == "completed" else 1


def cmd_where(args: argparse.Namespace) -> int:
    print_where(None, args.token_source)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="submit the demo job and wait for it")
    run.add_argument("--timeout", type=float, default=60.0)
    run.add_argument("--token-source", choices=["file", "env"], default="file")
    run.set_defaults(func=cmd_run)
    where = sub.add_parser("where", help="print the URLs and how to use the token")
    where.add_argument("--token-source", choices=["file", "env"], default="file")
    where.set_defaults(func=cmd_where)
    args = parser.parse_args()
    try:
        return int(args.func(args))
    except ApiError as exc:
        sys.stderr.write(f"api error: {exc}\n")
    except OSError as exc:
        sys.stderr.write(f"cannot reach the api at {API}: {getattr(exc, 'reason', exc)}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
