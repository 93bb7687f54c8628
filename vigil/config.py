"""Where the client finds the API and its token: the environment first, then a config file.

`VIGIL_URL` (one URL, or the apis of one installation separated by commas: a request goes to
the next when one does not answer, `vigil.endpoints`) and `VIGIL_TOKEN` win, each on its own,
over `url` and `token` in the TOML file named by `VIGIL_CONFIG`, else
`$XDG_CONFIG_HOME/vigil/config.toml` (`~/.config/vigil/config.toml`). The default file may
be missing; a file named by `VIGIL_CONFIG` must exist.
"""

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from vigil.errors import ConfigError

#: The api's own default address (`VIGIL_API_HOST`/`VIGIL_API_PORT` of services/api/settings.py).
DEFAULT_URL: Final = "http://127.0.0.1:8000"
_KEYS: Final = frozenset({"url", "token"})
_TOKEN_RE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in a header


@dataclass(frozen=True)
class Config:
    """The API's base URL and the bearer token (None: send none); `file` is the file consulted."""

    url: str
    token: str | None
    file: Path

    def token_hint(self) -> str:
        """Where a user sets the token, for error messages."""
        return f"set VIGIL_TOKEN, or token in {self.file}"


def config_path(env: Mapping[str, str]) -> Path:
    """The config file to read: `VIGIL_CONFIG`, else the XDG location."""
    named = env.get("VIGIL_CONFIG")
    if named:
        return Path(named).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "vigil" / "config.toml"


def load(env: Mapping[str, str] | None = None) -> Config:
    """The configuration from `env` (default `os.environ`) and the config file.

    Raises `ConfigError` for a file that is named but missing, unreadable, not TOML, has
    unknown keys or non-string values, and for a URL or token that cannot be used.
    """
    env = os.environ if env is None else env
    path = config_path(env)
    values = _read_file(path, required=bool(env.get("VIGIL_CONFIG")))
    url = env.get("VIGIL_URL") or values.get("url") or DEFAULT_URL
    token = env.get("VIGIL_TOKEN") or values.get("token") or None
    return Config(url=check_url(url), token=check_token(token), file=path)


def check_url(url: str) -> str:
    """`url` without a trailing slash, or several separated by commas (the apis of one
    installation, `check_urls`); raises `ConfigError` unless each is an http(s) URL."""
    return ",".join(check_urls(url))


def check_urls(url: str) -> tuple[str, ...]:
    """The API URLs in `url` (one, or several separated by commas), each without a trailing
    slash; raises `ConfigError` for none, or for one that is not an http(s) URL."""
    urls = tuple(part.strip().rstrip("/") for part in url.split(",") if part.strip())
    if not urls:
        raise ConfigError(f"the API URL {url!r} names no address")
    for each in urls:
        parts = urlsplit(each)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"the API URL {each!r} is not an http:// or https:// URL")
    return urls


def check_token(token: str | None) -> str | None:
    """The token with surrounding white space removed; raises `ConfigError` if unusable."""
    if token is None or not token.strip():
        return None
    token = token.strip()
    if not _TOKEN_RE.fullmatch(token):
        raise ConfigError("the token must be visible ASCII characters without spaces")
    return token


def _read_file(path: Path, *, required: bool) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path} (VIGIL_CONFIG) does not exist") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; use url, token"
        )
    for key, value in data.items():
        if not isinstance(value, str):
            raise ConfigError(f"config file {path}: {key} must be a string")
    return dict(data)
