"""The client's exception tree: every error it raises on purpose is a `VigilError`.

VigilError
├── ConfigError         no usable URL/token configuration
├── UsageError          an argument refused before sending (a malformed id or topic pattern)
├── JobFileError        a job file that cannot be read or is not a JSON-compatible mapping
├── Unreachable         the API could not be reached (refused, timed out, cut off)
├── BadResponse         something answered, but not like the Vigil API
├── WaitTimeout         `wait()` gave up before the job ended
└── ApiError            the API answered with an error status (`status`, `detail`)
    ├── Unauthorized    401: no token or a token the API does not know
    ├── Forbidden       403: the token's user may not do this (operators only, others' jobs)
    ├── NotFound        404: no such job or task, or another user's
    ├── Conflict        409: the current state does not allow the action
    ├── Gone            410: events after that position are no longer kept (`oldest_retained`)
    ├── InvalidRequest  400/413/422: the request itself is wrong (the message names the field)
    └── RateLimited     429: too many submissions; `retry_after` seconds (the client retries)
"""

from typing import Any, Final

_MAX_DETAIL_CHARS: Final = 500


class VigilError(Exception):
    """Base of every error the client raises on purpose."""


class ConfigError(VigilError):
    """The configuration (URL, token, config file) cannot be used as given."""


class UsageError(VigilError):
    """An argument the client refuses before sending anything: a malformed id or topic."""


class JobFileError(VigilError):
    """A job file that cannot be read or parsed, or that is not a job (a mapping)."""


class Unreachable(VigilError):
    """No answer from the API at `url`: connection refused, timed out or cut off."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the Vigil API at {url}: {reason}")
        self.url = url
        self.reason = reason


class BadResponse(VigilError):
    """An answer that is not what the Vigil API sends (wrong URL, a proxy's error page)."""


class WaitTimeout(VigilError):
    """The job had not ended when `wait()` gave up; `job` is the last view of it."""

    def __init__(self, job_id: str, timeout_s: float, job: dict[str, Any]) -> None:
        state = job.get("state", "?")
        super().__init__(f"job {job_id} still {state} after {timeout_s:g}s")
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.job = job


class ApiError(VigilError):
    """The API refused or failed a request: `status` is the HTTP code, `detail` its body's."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"the API answered {status}: {describe_detail(detail)}")
        self.status = status
        self.detail = detail

    @property
    def message(self) -> str:
        """The API's own explanation, flattened to one line."""
        return describe_detail(self.detail)


class Unauthorized(ApiError):
    """401: the token is missing, or the API does not know it."""


class Forbidden(ApiError):
    """403: the user may not do this (an operator's route, a wildcard over others' jobs)."""


class NotFound(ApiError):
    """404: no such job or task (another user's looks the same)."""


class Conflict(ApiError):
    """409: the request is valid but the current state does not allow it."""


class Gone(ApiError):
    """410: the events after the position to resume from are no longer all kept; read the
    state again, then follow from now (`oldest_retained`: where the history starts)."""

    def __init__(self, status: int, detail: Any, oldest_retained: int | None = None) -> None:
        super().__init__(status, detail)
        self.oldest_retained = oldest_retained


class InvalidRequest(ApiError):
    """400, 413 or 422: the request is wrong; the message names the field at fault."""


class RateLimited(ApiError):
    """429: too many submissions with this token; `retry_after` is when to try again (s)."""

    def __init__(self, status: int, detail: Any, retry_after: float | None = None) -> None:
        super().__init__(status, detail)
        self.retry_after = retry_after


_BY_STATUS: Final[dict[int, type[ApiError]]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
}


def api_error(status: int, detail: Any) -> ApiError:
    """The `ApiError` subclass for an HTTP error `status`."""
    return _BY_STATUS.get(status, ApiError)(status, detail)


def describe_detail(detail: Any) -> str:
    """One line from a `{"detail": ...}` body: a sentence, or `field: reason; ...` for a 422."""
    if isinstance(detail, list):
        text = "; ".join(_describe_item(item) for item in detail)
    else:
        text = str(detail)
    text = " ".join(text.split())
    if len(text) > _MAX_DETAIL_CHARS:
        return text[: _MAX_DETAIL_CHARS - 3] + "..."
    return text or "(no detail)"


def _describe_item(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    # The first part of `loc` says where (body, query, path): the field is what follows.
    loc = [str(part) for part in item.get("loc", [])]
    where = ".".join(loc[1:] if len(loc) > 1 else loc)
    msg = str(item.get("msg", "invalid"))
    return f"{where}: {msg}" if where else msg
