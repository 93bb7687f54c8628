"""The refusals `docs/reference/cli.md` shows, reproduced with the installed `vigil` command (a
subprocess, as a user's shell runs it) against a real api.

Every `vigil: ...` line of the page's console blocks is paired with the `$ ` command before it;
each pair has a scenario here that makes the state the page implies, runs that command and
compares what it prints with the page (ids aside, `(...)` standing for any text). A refusal
of the API (409) says why and then, after `; `, the next step. A refusal added to the page
without a scenario, or a scenario the page no longer shows, fails the walk.
"""

import asyncio
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.cluster import free_port
from shared.store import db
from tests.installed_cli import run_vigil
from tests.integration.test_client import Served, served  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
_ID = re.compile(r"\b[jt]-[0-9a-z]{12}\b")
_EXIT_NOTE = re.compile(r"\s+#\s*exits?\s+\d+.*$")


@dataclass(frozen=True)
class Run:
    """How a scenario runs its command: the arguments, more environment, and text of the
    actual run to show as the page shows it (a port, a path)."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    shown_as: dict[str, str] = field(default_factory=dict)


def documented_refusals() -> list[tuple[str, str]]:
    """(command line, refusal line) for each `vigil: ` line in the page's console blocks."""
    pairs, command, inside = [], "", False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            inside = line == "```console"
            continue
        if inside and line.startswith("$ "):
            command = _EXIT_NOTE.sub(
                "", line[2:]
            )  # the runner's `# exit N` (tests/doc_examples.py)
        elif inside and line.startswith("vigil: "):
            pairs.append((command, line))
    return pairs


def _sql(api: Served, statement: str, *args: object) -> None:
    async def run() -> None:
        async with db.open_pool(api.database_url, max_size=1) as pool:
            await pool.execute(statement, *args)

    asyncio.run(run())


def _job(api: Served) -> str:
    with api.client() as client:
        job: dict[str, object] = client.submit({"command": "./run.sh"})
    return str(job["id"])


def _edit_active(api: Served, tmp: Path) -> Run:
    job_id = _job(api)
    (tmp / "faster.yaml").write_text('command: ./faster.sh "$VIGIL_INPUT"\n')
    return Run(["edit", job_id, str(tmp / "faster.yaml")])


def _unreachable(api: Served, tmp: Path) -> Run:
    url = f"http://127.0.0.1:{free_port()}"
    return Run(["status"], {"VIGIL_URL": url}, {url: "http://127.0.0.1:8000"})


def _wrong_token(api: Served, tmp: Path) -> Run:
    config = tmp / "config.toml"
    config.write_text("")  # no token in it: VIGIL_TOKEN alone
    shown = {str(config): "/home/me/.config/vigil/config.toml"}
    return Run(["status"], {"VIGIL_TOKEN": "wrong", "VIGIL_CONFIG": str(config)}, shown)


def _cancel_completed(api: Served, tmp: Path) -> Run:
    job_id = _job(api)
    _sql(api, "UPDATE tasks SET state = 'completed' WHERE job_id = $1", job_id)
    _sql(api, "UPDATE jobs SET state = 'completed' WHERE id = $1", job_id)
    return Run(["cancel", job_id])


def _purge_running(api: Served, tmp: Path) -> Run:
    job_id = _job(api)
    _sql(
        api,
        "UPDATE tasks SET state = 'on_cpu', claim = gen_random_uuid() WHERE job_id = $1",
        job_id,
    )
    return Run(["purge", job_id, "--yes"])


#: The page's command line -> its scenario.
SCENARIOS: dict[str, Callable[[Served, Path], Run]] = {
    'printf \'command: ./faster.sh "$VIGIL_INPUT"\\n\' > faster.yaml && vigil edit "$JOB"'
    " faster.yaml": _edit_active,
    "vigil status": _unreachable,
    "VIGIL_TOKEN=wrong vigil status": _wrong_token,
    "vigil cancel j-3k9x0q7mzt1a": _cancel_completed,
    'vigil purge "$JOB" --yes': _purge_running,
}


def _pattern(documented: str) -> re.Pattern[str]:
    """The page's line as a pattern: any id for an id, any text for `(...)`."""
    parts = [re.escape(p) for p in _ID.sub("\0", documented).split("(...)")]
    return re.compile("(.*)".join(parts).replace("\0", _ID.pattern.replace(r"\b", "")))


def test_every_documented_refusal_has_a_scenario_and_every_scenario_is_documented() -> None:
    documented = [command for command, _ in documented_refusals()]

    assert sorted(documented) == sorted(SCENARIOS)


@pytest.mark.parametrize(
    ("command", "documented"), documented_refusals(), ids=lambda text: text[:40]
)
def test_a_documented_refusal_is_what_the_command_prints(
    served: Served,  # noqa: F811 (the fixture)
    tmp_path: Path,
    command: str,
    documented: str,
) -> None:
    # given
    run = SCENARIOS[command](served, tmp_path)
    env = {"VIGIL_URL": served.url, "VIGIL_TOKEN": served.user_token, "VIGIL_CONFIG": "/dev/null"}

    # when
    result = run_vigil(run.args, env | run.env)

    # then
    printed = result.stderr.strip()
    for actual, shown in run.shown_as.items():
        printed = printed.replace(actual, shown)
    assert result.exit_code != 0, result.output
    assert result.stderr.count("\n") == 1, f"not one line: {result.stderr}"
    assert _pattern(documented).fullmatch(printed), f"the page shows\n{documented}\nnot\n{printed}"
    if documented.endswith("(409)"):  # why; the next step
        why, _, next_step = documented.removesuffix(" (409)").rpartition("; ")
        assert why and next_step.strip(), f"{documented!r} names no next step"


def test_an_unknown_id_is_seen_as_any_id() -> None:
    assert _pattern("vigil: job j-3k9x0q7mzt1a (...) (409)").fullmatch(
        f"vigil: job j-{uuid.uuid4().hex[:12]} is whatever (409)"
    )
