"""Settings of the api service, read once from `VIGIL_*` environment variables."""

import re
from typing import Final

from pydantic import Field, field_validator

from shared.runtime.config import CommonSettings

#: Shortest bootstrap token accepted: a guessable operator token is worse than none.
MIN_TOKEN_CHARS: Final = 16
_TOKEN_RE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in a header


class ApiSettings(CommonSettings):
    """`VIGIL_API_HOST`, `VIGIL_API_PORT`, `VIGIL_BOOTSTRAP_TOKEN`, request and rate limits."""

    #: The address the api listens on (`VIGIL_API_HOST`), and its port (`VIGIL_API_PORT`).
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    #: When set, the api makes (or keeps) the operator `operator` holding this token.
    bootstrap_token: str | None = None
    #: Larger request bodies are refused with 413, whether or not they declare their length
    #: (16 MiB: a submission of `max_inputs` short inputs fits); the rest of one up to four
    #: times this is read and discarded first, for the client to read the answer.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    #: Most inputs (hence tasks) one submission may carry (more: a 422 that says so).
    max_inputs: int = Field(default=100_000, ge=1)
    #: `GET /events` sends a `: keepalive` comment this often.
    sse_keepalive_s: float = Field(default=15.0, gt=0)
    #: How long a dashboard sign-in lasts (`VIGIL_SESSION_TTL_S`) unless signed out sooner.
    session_ttl_s: float = Field(default=12 * 3600.0, gt=0, le=30 * 86400.0)
    #: Most event streams (SSE clients) one api process serves at once (a channel each).
    max_event_streams: int = Field(default=500, ge=1, le=2000)
    #: Most of them one user (not an operator) holds at once: their share.
    max_event_streams_per_user: int = Field(default=20, ge=1, le=2000)
    #: Submissions (`POST /jobs`, `POST /jobs/{id}/inputs`) one user token may make per second,
    #: on average (`VIGIL_SUBMIT_RATE_PER_S`); more get 429 with `Retry-After`. Operators are
    #: not limited.
    submit_rate_per_s: float = Field(default=5.0, gt=0, le=1_000_000)
    #: Submissions one token may make at once after a quiet spell (`VIGIL_SUBMIT_BURST`).
    submit_burst: int = Field(default=20, ge=1, le=1_000_000)
    #: Tasks one user (not an operator) may create per second, on average, whatever the route
    #: (`VIGIL_TASK_RATE_PER_S`): submissions, appended inputs, test runs, duplicates,
    #: activation; more get 429 with `Retry-After`.
    task_rate_per_s: float = Field(default=500.0, gt=0, le=1_000_000)
    #: Tasks one user may create at once after a quiet spell (`VIGIL_TASK_BURST`); a request
    #: that would create more is 413 (to be split).
    task_burst: int = Field(default=100_000, ge=1, le=10_000_000)
    #: Shortest `retention_s` a job may be submitted with (`VIGIL_MIN_RETENTION_S`).
    min_retention_s: float = Field(default=60.0, ge=1)
    #: How long a download link of an output in an S3 store is good for
    #: (`VIGIL_DOWNLOAD_LINK_S`): `GET /tasks/{id}/outputs/{name}` redirects to one.
    download_link_s: int = Field(default=300, ge=10, le=7 * 86400)
    #: Most tasks one bulk action (`POST /bulk/actions`) may touch; more is 422.
    bulk_max_tasks: int = Field(default=10_000, ge=1, le=1_000_000)
    #: A bulk action on more tasks than this needs `"confirm": true` (409 otherwise).
    bulk_confirm_over: int = Field(default=100, ge=0)
    #: Tasks a bulk action changes per transaction.
    bulk_batch: int = Field(default=200, ge=1, le=10_000)
    #: A user (not an operator) sets their jobs' priority within plus or minus this
    #: (`VIGIL_PRIORITY_USER_RANGE`); operators within `PRIORITY_LIMIT`.
    priority_user_range: int = Field(default=100, ge=0, le=1_000_000)
    #: Refuse at submission (422) a request of resources that no live host of the pool can
    #: ever hold (`VIGIL_REFUSE_UNSATISFIABLE`); off, such a job waits (`too_large`).
    refuse_unsatisfiable: bool = False

    @field_validator("bootstrap_token")
    @classmethod
    def _check_token(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if len(value) < MIN_TOKEN_CHARS or not _TOKEN_RE.fullmatch(value):
            raise ValueError(
                f"VIGIL_BOOTSTRAP_TOKEN must be at least {MIN_TOKEN_CHARS} visible ASCII"
                " characters (no spaces): it travels in an HTTP header"
            )
        return value
