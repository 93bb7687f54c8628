"""The settings reference, `docs/reference/settings.md`, made from the settings models: every
setting's variable, type, default and description, grouped by the services that read it.

    python -m services.settings_reference          # writes the page
    python -m services.settings_reference --check  # exit 1 when the page is not current

A setting's description is its `Field(description=...)`, else the `#:` comment above it in
its model; settings declared together under one comment share it (one row of the page).
"""

import argparse
import ast
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from annotated_types import Ge, Gt, Le, Lt, MaxLen
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from services.settings_catalog import SERVICES, env_name
from shared.runtime.config import VigilSettings
from shared.runtime.settings_names import READ_ELSEWHERE

PAGE: Final = Path(__file__).resolve().parents[1] / "docs" / "reference" / "settings.md"
COMMAND: Final = "python -m services.settings_reference"


@dataclass(frozen=True)
class Row:
    """Settings declared together, under one description."""

    fields: tuple[str, ...]
    description: str


def declared_rows(model: type[VigilSettings]) -> list[Row]:
    """The settings `model` itself declares (not those it inherits), in order, grouped by the
    `#:` comment they follow; a `Field(description=...)` makes a row of its own."""
    lines = textwrap.dedent(inspect.getsource(model)).splitlines()
    body = ast.parse("\n".join(lines)).body[0]
    assert isinstance(body, ast.ClassDef)
    rows: list[Row] = []
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if name not in model.model_fields:
            continue
        given = model.model_fields[name].description
        comment = _comment_above(lines, node.lineno - 1)
        follows_field = bool(rows) and _is_field_line(lines[node.lineno - 2])
        if given or comment or not follows_field:
            rows.append(Row((name,), given or comment))
        else:
            rows[-1] = Row((*rows[-1].fields, name), rows[-1].description)
    return rows


def _comment_above(lines: list[str], index: int) -> str:
    """The `#:` lines right above line `index` (0-based), as one paragraph."""
    block: list[str] = []
    while index > 0 and lines[index - 1].strip().startswith("#:"):
        index -= 1
        block.insert(0, lines[index].strip()[2:].strip())
    return " ".join(block)


def _is_field_line(line: str) -> bool:
    """A line that ends a setting's declaration (the one before a setting grouped with it)."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith(("#", '"""', "@", "def ", "class "))


def _declaring_class(model: type[VigilSettings], name: str) -> type[VigilSettings]:
    for cls in model.__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return typing.cast(type[VigilSettings], cls)
    raise LookupError(name)


def _sections() -> Iterator[tuple[type[VigilSettings], tuple[str, ...]]]:
    """Each class that declares settings, with the services that read them, common first."""
    readers: dict[type[VigilSettings], list[str]] = {}
    for service, model in SERVICES.items():
        for name in model.model_fields:
            owner = _declaring_class(model, name)
            if service not in readers.setdefault(owner, []):
                readers[owner].append(service)
    order = list(SERVICES)
    yield from sorted(
        ((owner, tuple(names)) for owner, names in readers.items()),
        key=lambda item: (-len(item[1]), [order.index(s) for s in item[1]]),
    )


def _type_name(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(parts) + ", optional"
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "computed"
    if info.default is PydanticUndefined or info.default is None:
        return "unset"
    return f"`{info.default}`" if info.default != "" else '`""`'


_BOUNDS: Final = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))


def _bounds(info: FieldInfo) -> str:
    found = []
    for item in info.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                found.append(f"{sign} {getattr(item, attr)}")
        if isinstance(item, MaxLen):
            found.append(f"at most {item.max_length} characters")
    return f" ({', '.join(found)})" if found else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The page."""
    out = [
        "# Settings reference",
        "",
        "Every service reads its settings once, at its start, from `VIGIL_*` environment",
        "variables; a service warns at its start about each `VIGIL_*` variable it does not know,",
        "naming the closest known one. This page is generated from the settings models",
        f"(`services/settings_catalog.py`) by `{COMMAND}`: edit the models, not this page.",
    ]
    for owner, readers in _sections():
        title = " ".join((owner.__doc__ or owner.__name__).strip().split("\n\n")[0].split())
        out += ["", f"## {', '.join(readers)}", "", f"{title} (`{owner.__name__}`)", ""]
        out += ["| Variable | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for row in declared_rows(owner):
            infos = [owner.model_fields[name] for name in row.fields]
            out.append(
                "| "
                + " | ".join(
                    _cell("<br>".join(values))
                    for values in (
                        [f"`{env_name(name)}`" for name in row.fields],
                        [_type_name(info.annotation) + _bounds(info) for info in infos],
                        [_default(info) for info in infos],
                        [row.description],
                    )
                )
                + " |"
            )
    out += [
        "",
        "## Read elsewhere",
        "",
        "`VIGIL_*` variables that are no service's setting, but that Vigil reads or sets",
        "(`shared/runtime/settings_names.py`).",
        "",
        "| Variable | Read by |",
        "| --- | --- |",
    ]
    out += [f"| `{name}` | {_cell(what)} |" for name, what in READ_ELSEWHERE.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = PAGE.exists() and PAGE.read_text() == page
        if not current:
            sys.stderr.write(f"{PAGE} is not current: run {COMMAND}\n")
        return 0 if current else 1
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
