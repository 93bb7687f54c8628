"""Rendering the dashboard's HTML: one Jinja2 environment, autoescaped, and strict headers.

Every value put in a page is escaped by Jinja2 (`autoescape=True` for every template), and the
pages forbid inline scripts and foreign resources (Content-Security-Policy), so user text (job
names, inputs, log lines) can only ever show as text.
"""

from datetime import datetime
from pathlib import Path
from typing import Any, Final

import jinja2
from starlette.responses import HTMLResponse

from shared.domain.sizes import human_size

TEMPLATE_DIR: Final = Path(__file__).parent / "templates"
STATIC_DIR: Final = Path(__file__).parent / "static"

#: Headers of every page and fragment.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it, browsers send `Origin: null` on form posts (see session.py).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def environment() -> jinja2.Environment:
    """The dashboard's templates, escaping every value, failing on undefined names."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ts"] = _timestamp
    env.filters["age"] = _age
    env.filters["duration"] = duration
    env.filters["size"] = human_size
    return env


def duration(seconds: float | None) -> str:
    """`M:SS`, `H:MM:SS` or `D-HH:MM:SS` (as `squeue` and `vigil tasks` show times)."""
    if seconds is None:
        return ""
    days, rest = divmod(int(seconds), 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _timestamp(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


class Pages:
    """Renders templates to responses with the security headers."""

    def __init__(self) -> None:
        self._env = environment()

    def render(self, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """`template` rendered with `context`, as an HTML response."""
        html = self._env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)

    def fragment(self, template: str, macro: str, *args: Any) -> HTMLResponse:
        """The HTML of one macro of `template` (a table row the scripts swap in)."""
        module = self._env.get_template(template).module
        html = str(getattr(module, macro)(*args))
        return HTMLResponse(html, headers=SECURITY_HEADERS)
