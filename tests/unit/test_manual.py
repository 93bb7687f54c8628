"""The manual stays true to the code: its HTTP reference is the api's schema as it is now; its
states, failure classes, events and commands are the code's; every setting, command, route
and page a page (or the code) names exists. (`scripts/docs build` checks the links and the
nav: `mkdocs build --strict`.)"""

import re
from pathlib import Path

import typer.main
from fastapi.routing import iter_route_contexts

from manual import http_reference, settings_mentioned
from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.domain.analyser import BLAMES_HOST, Verdict
from shared.domain.messages import (
    HostEvent,
    HostState,
    JobEvent,
    JobOutcome,
    LogRecord,
    Severity,
    TaskDecision,
    TaskEvent,
)
from shared.domain.states import TRANSITIONS, FailureClass, JobState, TaskState
from vigil import cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_http_reference_is_the_schema_of_the_routes_as_they_are() -> None:
    page = (ROOT / http_reference.PAGE).read_text()
    assert page == http_reference.render(http_reference.schema()), (
        f"{http_reference.PAGE} is out of date: run `scripts/docs api` and commit it"
    )


def test_the_http_reference_names_every_route() -> None:
    spec = http_reference.schema()
    page = http_reference.render(spec)
    for path, item in spec["paths"].items():
        for method in item:
            if method in http_reference.METHODS:
                assert f"### `{method.upper()} {path}`" in page


def test_every_setting_the_pages_mention_exists() -> None:
    assert settings_mentioned.unknown() == []


def test_a_misspelt_setting_is_found_with_where_it_is(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Set `VIGIL_DATABASE_URL`.\nOr `VIGIL_DATABSE_URL=postgresql://...`.\n")
    found = settings_mentioned.unknown([page], settings_mentioned.settings())
    assert found == [(f"{page}:2", "VIGIL_DATABSE_URL")]


def test_every_page_the_code_and_the_readme_name_exists() -> None:
    # a page moved or renamed leaves no comment, docstring, script or README pointing nowhere
    named = re.compile(r"\bdocs/[\w/.-]+?\.md\b")
    missing = []
    for path in _sources():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for page in named.findall(line):
                if not (ROOT / page).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {page}")
    assert missing == []


def _sources() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "docker-compose.yml"]
    for part in ("shared", "services", "vigil", "tests", "bench", "scripts", "deploy", "docs"):
        found += [p for p in (ROOT / part).rglob("*") if p.is_file() and p.suffix != ".pyc"]
    return found


def test_the_states_page_gives_every_state_and_where_it_may_move() -> None:
    page = (ROOT / "docs" / "reference" / "task-states.md").read_text()
    for state in TaskState:
        row = re.search(rf"^\| `{state.value}` \| [^|]+ \| ([^|]+) \|$", page, re.MULTILINE)
        assert row, f"no row for {state.value}"
        assert set(re.findall(r"`(\w+)`", row.group(1))) == {s.value for s in TRANSITIONS[state]}
    for job_state in JobState:
        assert f"| `{job_state.value}` |" in page


def test_the_failure_classes_page_gives_every_class() -> None:
    page = (ROOT / "docs" / "reference" / "failure-classes.md").read_text()
    for failure_class in FailureClass:
        blamed = "yes" if failure_class in BLAMES_HOST else "no"
        assert re.search(rf"^\| `{failure_class.value}` \| .+ \| {blamed} \|$", page, re.M)


def test_the_events_page_gives_every_body_field_and_every_topic_word() -> None:
    page = (ROOT / "docs" / "reference" / "events.md").read_text()
    bodies = page[page.index("**Body:**") : page.index("**Positions:**")]
    for model in (TaskEvent, TaskDecision, JobEvent, HostEvent, LogRecord):
        kind = model.model_fields["type"].default
        line = re.search(rf"- `{kind}`: (.+?)(?=\n  - |\Z)", bodies, re.S)
        assert line, f"no body for {kind}"
        named = set(re.findall(r"`(\w+)`", line.group(1))) | {"type", "message_id", "sent_at"}
        assert set(model.model_fields) <= named, f"{kind}: {set(model.model_fields) - named}"
    topics = page[: page.index("**Body:**")]
    for words in (Verdict, JobOutcome, HostState, Severity):
        for word in words:
            assert f"`{word.value}`" in topics, f"{word.value} is not among the topics"


def test_the_command_reference_gives_every_command() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    commands = typer.main.get_command(cli.app).commands  # type: ignore[attr-defined]
    assert commands
    assert [name for name in commands if f"`vigil {name}" not in page] == []


def test_every_command_a_page_names_exists() -> None:
    # `vigil NAME` in a page's text, or a shell line that runs it, names a real command
    commands = set(typer.main.get_command(cli.app).commands)  # type: ignore[attr-defined]
    named = re.compile(r"(?:`|^\s*(?:\$ )?|\$\(|[|;&] )vigil ([a-z][a-z-]*)")
    unknown = [
        f"{page.relative_to(ROOT)}:{number}: vigil {name}"
        for page in settings_mentioned.pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for name in named.findall(line)
        if name not in commands
    ]
    assert unknown == []


def test_every_route_a_page_names_exists() -> None:
    # `GET /jobs/{id}/errors` in a page is a route of the api (its parameters' names aside)
    app = create_app(ApiSettings())
    routes = {
        (method, _shape(context.path or ""))
        for context in iter_route_contexts(app.routes)
        for method in getattr(context.original_route, "methods", None) or ()
    }
    named = re.compile(r"\b(GET|POST|PATCH|PUT|DELETE) (/[\w{}/.-]*)")
    unknown = [
        f"{page.relative_to(ROOT)}:{number}: {method} {path}"
        for page in settings_mentioned.pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for method, path in named.findall(line)
        if (method, _shape(path)) not in routes
    ]
    assert unknown == []


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path.rstrip("/.") or "/")
