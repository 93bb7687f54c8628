"""`GET /events`: follow topic patterns of the events exchange as Server-Sent Events (design §9).

The wire format is `services.api.sse`'s. A user may follow only their own jobs, each named by
id; an operator may follow anything, wildcards included. A stream resumes after a position
(`after=`, or the `Last-Event-ID` a reconnecting `EventSource` sends): it first sends every
retained event after it that matches, then goes on live, with no gap and no duplicate at the
seam; a position older than the history holds answers 410 Gone.
"""

import logging
from typing import Annotated, Any, Final

from fastapi import APIRouter, Header, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, Response

from services.api import sse
from services.api.access import owner_filter
from services.api.deps import AUTH_RESPONSES, CurrentUser, EventHubDep, PoolDep, SettingsDep
from services.api.errors import invalid
from services.api.event_hub import StreamsUnavailable, TooManyStreams
from shared.domain import topics
from shared.domain.errors import UNAVAILABLE, NotFound
from shared.domain.topics import InvalidTopic, Topic
from shared.store import db, event_log, users_repo
from shared.store.db import Connection, Pool
from shared.store.users_repo import User

logger = logging.getLogger(__name__)

router = APIRouter(tags=["events"], responses=AUTH_RESPONSES)

#: Largest position (PostgreSQL bigint).
_INT8_MAX: Final = 2**63 - 1
#: Events one read of the history gives a stream.
HISTORY_PAGE: Final = 500

_STREAM_DOC: Final = (
    'One event per message: `data: {"routing_key": "<key>", "body": <JSON body>}` and a'
    " blank line (default event type), plus a `: keepalive` comment every 15 s."
)
_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
        "description": _STREAM_DOC,
    },
    403: {"description": "A user named a wildcard job (users follow their own jobs by id)."},
    410: {
        "description": "The position to resume after is older than the history keeps:"
        " `oldest_retained` says where it starts now; read the state again, then follow."
    },
    429: {"description": "A user holds their share of the api's streams already."},
    404: {"description": "A named job does not exist or belongs to another user."},
    503: {"description": "The message broker does not answer, or the api serves too many streams."},
}


async def _check_access(conn: Connection, user: User, wanted: list[Topic]) -> None:
    """Raise 403 for a user's wildcard job word and `NotFound` for a job that is not theirs."""
    owner = owner_filter(user)
    if owner is None:
        return
    for topic in wanted:
        if topic.job is None:
            raise HTTPException(
                status_code=status.HTTP_403_FORBIDDEN,
                detail=f"topic {topic.pattern!r}: users may follow only their own jobs, each"
                " named by its id (no '*' or '#' in the job word)",
            )
    job_ids = sorted({t.job for t in wanted if t.job is not None})
    rows = await conn.fetch(
        "SELECT id FROM jobs WHERE id = ANY($1::text[]) AND owner_id = $2", job_ids, owner
    )
    missing = set(job_ids) - {r["id"] for r in rows}
    if missing:
        raise NotFound(f"job {min(missing)!r} not found")


@router.get(
    "/events",
    response_class=sse.EventStream,
    status_code=status.HTTP_200_OK,  # FastAPI cannot read it from EventStream.__init__
    responses=_RESPONSES,
)
async def follow_events(
    request: Request,
    user: CurrentUser,
    pool: PoolDep,
    hub: EventHubDep,
    settings: SettingsDep,
    topic: Annotated[
        list[str] | None,
        Query(
            description="A pattern `<family>.<word>.<job>`: family `log`, `job` or `task`; word"
            " a severity, outcome or state, or `*`; job a job id, `*` or `#`. Repeat for more"
            f" (at most {topics.MAX_TOPICS}).",
            examples=["job.*.*", "log.error.j-3k9x0q7mzt1a"],
        ),
    ] = None,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=_INT8_MAX,
            description="Resume after this position: every retained event after it that"
            " matches is sent first, then the stream goes on live.",
        ),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            description="What a reconnecting `EventSource` sends: the last position it saw"
            " (wins over `after`)."
        ),
    ] = None,
) -> Response:
    """Stream the events matching the topics, from now on (or after a position), until the
    client goes away (or its token is revoked: the stream then ends within a second).

    When the response headers arrive, the subscription is in place. 422 names a malformed
    topic or position; 410 says the position is older than the history keeps.
    """
    try:
        wanted = topics.parse_all(topic or [])
    except InvalidTopic as exc:
        raise invalid(("query", "topic"), str(exc)) from exc
    resume = after if last_event_id is None else _position(last_event_id)
    async with pool.acquire() as conn:
        await _check_access(conn, user, wanted)
        bounds = await event_log.bounds(conn)
    if resume is not None and bounds.lost(resume):
        return _gone(resume, bounds)
    try:
        subscription = await hub.subscribe(
            [t.pattern for t in wanted], holder=None if user.is_operator else user.id
        )
    except TooManyStreams as exc:
        raise HTTPException(status_code=status.HTTP_429_TOO_MANY_REQUESTS, detail=str(exc)) from exc
    except StreamsUnavailable as exc:
        raise HTTPException(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc)
        ) from exc
    logger.info(
        "%s follows %s",
        user.name,
        ", ".join(t.pattern for t in wanted),
        extra={"action": "follow", "user": user.name},
    )
    return sse.EventStream(
        hub,
        subscription,
        settings.sse_keepalive_s,
        _history(pool, wanted, bounds.last_given if resume is None else resume),
        _token_check(pool, request.state.token, user),
    )


def _position(header: str) -> int:
    """The position a `Last-Event-ID` header holds; 422 when it is not one."""
    text = header.strip()
    if not text.isdigit() or not text.isascii() or int(text) > _INT8_MAX:
        raise invalid(
            ("header", "last-event-id"),
            f"{header[:30]!r} is not an event position (a whole number, the `id:` of an event)",
        )
    return int(text)


def _gone(resume: int, bounds: event_log.Bounds) -> JSONResponse:
    oldest = bounds.oldest_retained
    return JSONResponse(
        {
            "detail": f"events after position {resume} are no longer all kept: the history"
            f" starts at position {oldest} now",
            "oldest_retained": oldest,
            "next_step": "read the state again (GET /jobs, GET /jobs/{id}/tasks), then follow"
            " without a position, or after the newest one you read",
        },
        status_code=status.HTTP_410_GONE,
    )


def _history(pool: Pool, wanted: list[Topic], start: int) -> sse.History | None:
    """Where the stream reads its numbered events (None when it follows only log lines)."""
    numbered = event_log.numbered(wanted)
    if not numbered:
        return None

    async def read(position: int) -> list[event_log.LoggedEvent]:
        try:
            async with pool.acquire() as conn:
                return await event_log.after(conn, position, numbered, HISTORY_PAGE)
        except UNAVAILABLE as exc:  # read again at the next delivery or poll
            logger.warning("cannot read the event history for a stream: %s", exc)
            return []

    return sse.History(read=read, start=start, page=HISTORY_PAGE)


def _token_check(pool: Pool, token: str, user: User) -> sse.TokenCheck:
    """Whether `token` still belongs to `user` (not revoked, user not disabled); a database
    that does not answer keeps the stream open (it cannot tell)."""

    async def still_valid() -> bool:
        try:
            now = await db.read(pool, lambda conn: users_repo.by_token(conn, token))
        except UNAVAILABLE as exc:
            logger.warning("cannot check an event stream's token: %s", exc)
            return True
        return now is not None and now.id == user.id

    return still_valid
