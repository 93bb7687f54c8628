"""Every `VIGIL_*` name the manual and the README mention must exist: a setting of one of the
services' settings models, or a variable the code reads or sets (a job's environment, the
command's configuration, the scripts' switches). A setting renamed in the code then fails
`scripts/docs build` (and `tests/unit/test_manual.py`) instead of staying wrong in a page.

`python -m manual.settings_mentioned` prints the unknown names with where they are, and exits
1 if there is any."""

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from pydantic_settings import BaseSettings

from services.settings_catalog import SERVICES

ROOT: Final = Path(__file__).resolve().parents[1]
NAME: Final = re.compile(r"\bVIGIL_[A-Z0-9_]*[A-Z0-9]\b")
#: The settings models of the services (each includes what it inherits).
MODELS: Final[tuple[type[BaseSettings], ...]] = tuple(SERVICES.values())
#: Where the code names the variables it reads or sets outside the settings models.
_CODE: Final = (
    "shared",
    "services",
    "vigil",
    "scripts",
    "bench",
    "tests",
    "deploy",
    "docker-compose.yml",
)


def settings() -> set[str]:
    """The environment variable of every field of the services' settings models."""
    names: set[str] = set()
    for model in MODELS:
        prefix = str(model.model_config.get("env_prefix", ""))
        names.update(f"{prefix}{field}".upper() for field in model.model_fields)
    return names


def named_in_code() -> set[str]:
    """Every `VIGIL_*` name the code, the scripts and the deploy files spell out."""
    return set(_names(_files(ROOT / part for part in _CODE)))


def pages() -> list[Path]:
    """The README and every page of the manual."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def unknown(
    among: Iterable[Path] | None = None, known: set[str] | None = None
) -> list[tuple[str, str]]:
    """(where, name) for each `VIGIL_*` name the pages (by default the README and the
    manual's) mention that is not `known` (by default: the settings and the code's names)."""
    known = settings() | named_in_code() if known is None else known
    found = []
    for page in pages() if among is None else among:
        where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for name in NAME.findall(line):
                if name not in known:
                    found.append((f"{where}:{number}", name))
    return found


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from (p for p in path.rglob("*") if p.is_file() and p.suffix != ".pyc")


def _names(files: Iterable[Path]) -> Iterator[str]:
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        yield from NAME.findall(text)


def main() -> None:
    """Print every unknown name with where it is; exit 1 if there is any."""
    found = unknown()
    for where, name in found:
        sys.stderr.write(f"{where}: {name} is neither a setting nor a variable the code uses\n")
    if found:
        sys.exit(1)


if __name__ == "__main__":
    main()
