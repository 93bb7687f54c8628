"""What a `vigil` command runs with: the configuration it found and how its errors end it.

Exit codes: 0 done; 1 the API refused the request (and `wait`: the job failed); 2 a usage or
configuration error, a bad job file or a refused token (and `wait`: the job was cancelled);
3 `wait` timed out; 4 the API could not be reached or did not answer like the Vigil API.
"""

from dataclasses import dataclass
from typing import Final

from vigil import config
from vigil.client import Client
from vigil.errors import (
    ApiError,
    BadResponse,
    ConfigError,
    JobFileError,
    NotFound,
    Unauthorized,
    Unreachable,
    UsageError,
    VigilError,
    WaitTimeout,
)

EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_TIMEOUT: Final = 3
EXIT_UNREACHABLE: Final = 4
EXIT_NOT_FOUND: Final = 5
#: `wait`'s exit code for each final job state.
EXIT_BY_STATE: Final = {"completed": 0, "failed": 1, "cancelled": 2}


@dataclass
class Session:
    """The global options; `client()` reads the configuration when a command needs it and
    keeps what it found, for the hints of error messages."""

    url: str | None
    found: config.Config | None = None

    def client(self) -> Client:
        self.found = config.load()
        return Client(self.url or self.found.url, self.found.token)


def explain(exc: VigilError, found: config.Config | None) -> tuple[str, int]:
    """The one line to print for `exc`, and the exit code; `found` gives the token hint."""
    hint = found.token_hint() if found else "set VIGIL_TOKEN"
    if isinstance(exc, Unauthorized):
        if found is not None and found.token is None:
            return f"no token is set and the API requires one (401): {hint}", EXIT_USAGE
        return f"the API refused the token (401): {hint}", EXIT_USAGE
    if isinstance(exc, NotFound):
        return f"{exc.message} ({exc.status})", EXIT_NOT_FOUND
    if isinstance(exc, ApiError):
        return f"{exc.message} ({exc.status})", EXIT_REFUSED
    if isinstance(exc, Unreachable):
        return f"{exc}; is it running there? (`scripts/up` starts it; --url or VIGIL_URL)", (
            EXIT_UNREACHABLE
        )
    if isinstance(exc, BadResponse):  # its message says what to check
        return str(exc), EXIT_UNREACHABLE
    if isinstance(exc, WaitTimeout):
        return str(exc), EXIT_TIMEOUT
    if isinstance(exc, ConfigError | UsageError | JobFileError):
        return str(exc), EXIT_USAGE
    return str(exc), EXIT_REFUSED
