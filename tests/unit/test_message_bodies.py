"""A message body the outbox holds is made by its type's SQL function only (`event_body_*`,
`work_body_*`: `shared/store/schema.sql`): no statement in the code and no other function of
the schema writes one out (`docs/explanation/architecture.md`, "Messages between the
services")."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "shared" / "store" / "schema.sql"
#: A body's key written as an SQL string: what `jsonb_build_object` of a message names.
_BODY_KEY = re.compile(r"'(message_id|sent_at)'")
#: The functions that make the bodies.
_BUILDER = re.compile(r"(event|work)_body_\w+")


def _written_out(folder: Path) -> list[str]:
    """`file:line` of each string of the Python code under `folder` that names a body's key
    as SQL does."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _BODY_KEY.search(node.value)
            ):
                found.append(f"{path.relative_to(folder)}:{node.lineno}")
    return found


def _schema_writers(schema: str) -> list[str]:
    """The functions of a schema dump whose text names a body's key as SQL does."""
    functions = re.split(r"^CREATE FUNCTION public\.", schema, flags=re.MULTILINE)[1:]
    return sorted(f.split("(", 1)[0] for f in functions if _BODY_KEY.search(f))


def test_no_code_writes_a_message_body_out() -> None:
    for folder in ("shared", "services", "vigil"):
        assert _written_out(ROOT / folder) == [], folder


def test_only_the_body_functions_of_the_schema_write_one() -> None:
    writers = _schema_writers(SCHEMA.read_text())

    assert [w for w in writers if not _BUILDER.fullmatch(w)] == []
    assert "event_body_task" in writers  # the check reads the dump's functions


def test_the_checks_find_a_body_written_out(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "q = \"SELECT jsonb_build_object('message_id', gen_random_uuid(), 'x', 1)\"\n"
        'ok = {"message_id": 1}\n'
    )
    schema = (
        "CREATE FUNCTION public.event_body_job(a text) RETURNS jsonb\n"
        "    AS $$ SELECT jsonb_build_object('message_id', gen_random_uuid()) $$;\n"
        "CREATE FUNCTION public.end_finished_jobs(ids text[]) RETURNS jsonb\n"
        "    AS $$ SELECT jsonb_build_object('sent_at', now()) $$;\n"
    )

    assert _written_out(tmp_path) == ["m.py:1"]
    assert _schema_writers(schema) == ["end_finished_jobs", "event_body_job"]
