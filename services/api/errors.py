"""How errors become HTTP answers: every 4xx body is `{"detail": ...}`, never a 500 for bad input.

422 bodies are always a list of `{loc, msg, type}` naming the field at fault (the user's input is
not echoed back: it may be megabytes). 404 bodies carry one human sentence; 409 bodies the
sentence (why; the next step) and `next_step` alone.
"""

import logging
from collections.abc import Sequence
from typing import Any, Final

import asyncpg
from fastapi import FastAPI, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api.rate_limit import QuotaExceeded
from shared.domain.errors import (
    CONNECTION_LOST,
    Conflict,
    InvalidTransition,
    NotFound,
    Refusal,
    StaleState,
)
from shared.objects import ObjectStoreError

logger = logging.getLogger(__name__)

Loc = Sequence[str | int]

_NOT_AN_OBJECT: Final = frozenset({"model_attributes_type", "dict_type", "model_type"})


def invalid(loc: Loc, msg: str) -> RequestValidationError:
    """A 422 error on the field at `loc` (e.g. `("body", "inputs")`), in FastAPI's own shape."""
    return RequestValidationError([{"type": "value_error", "loc": tuple(loc), "msg": msg}])


def _describe(error: dict[str, Any]) -> dict[str, Any]:
    kind = str(error.get("type", "value_error"))
    loc = list(error.get("loc", ()))
    msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "json_invalid":
        msg = f"request body is not valid JSON: {(error.get('ctx') or {}).get('error', '?')}"
    elif loc == ["body"] and kind in _NOT_AN_OBJECT:
        msg = "request body must be a JSON object sent with Content-Type: application/json"
    return {"loc": [_printable(part) for part in loc], "msg": _printable(msg), "type": kind}


def _printable(part: Any) -> Any:
    # A field name or message may hold a lone surrogate from the request: it must not make
    # rendering the error fail with a 500.
    if isinstance(part, str):
        return part.encode("utf-8", "backslashreplace").decode()
    return part


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [_describe(dict(e)) for e in exc.errors()]
    return JSONResponse({"detail": details}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _http(request: Request, exc: Exception) -> Response:
    """FastAPI's answer, except that a body it could not parse as JSON is a 422 like the rest."""
    assert isinstance(exc, StarletteHTTPException)
    reason = _unparsable_reason(exc)
    if reason is None:
        return await http_exception_handler(request, exc)
    error = {"type": "json_invalid", "loc": ("body",), "ctx": {"error": reason}}
    return await _validation(request, RequestValidationError([error]))


def _unparsable_reason(exc: StarletteHTTPException) -> str | None:
    # FastAPI turns a JSONDecodeError into a 422 but any other parse failure (bad UTF-8, deep
    # nesting, a 5000-digit number) into a bare 400, `raise ... from` the parser's error.
    cause = exc.__cause__
    if exc.status_code != status.HTTP_400_BAD_REQUEST:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return "it is not UTF-8"
    if isinstance(cause, RecursionError):
        return "it is nested too deeply"
    return str(cause) if isinstance(cause, ValueError) else None


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_404_NOT_FOUND)


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    """409: the sentence in `detail` (why; the next step), the next step alone in `next_step`.
    A compare-and-set that lost a race (`StaleState`) says to look again."""
    logger.info("refused %s %s: %s", request.method, request.url.path, exc)
    refusal = exc.refusal if isinstance(exc, Conflict) else Refusal(str(exc), _LOOK_AGAIN)
    body = {"detail": str(refusal), "next_step": refusal.next_step}
    return JSONResponse(body, status_code=status.HTTP_409_CONFLICT)


_LOOK_AGAIN: Final = "it changed meanwhile: look at it again, then retry if it still applies"


async def _raced(request: Request, exc: Exception) -> JSONResponse:
    # PostgreSQL aborted this request's transaction to let a concurrent one through (a
    # deadlock between two writers, e.g. a task action and a bulk action): nothing was written.
    logger.warning("concurrent change on %s %s: %s", request.method, request.url.path, exc)
    refusal = Refusal("a concurrent change got in the way and nothing was done", "try again")
    body = {"detail": str(refusal), "next_step": refusal.next_step}
    return JSONResponse(body, status_code=status.HTTP_409_CONFLICT)


async def _over_quota(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QuotaExceeded)
    logger.info("refused %s %s: %s", request.method, request.url.path, exc)
    if exc.retry_after_s is None:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_413_CONTENT_TOO_LARGE)
    return JSONResponse(
        {"detail": str(exc)},
        status_code=status.HTTP_429_TOO_MANY_REQUESTS,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


async def _connection_lost(request: Request, exc: Exception) -> JSONResponse:
    # The database dropped the connection under this request (a restart, a failover): the pool
    # renews its connections, and a retry (with its Idempotency-Key, for a submission) finds
    # out whether anything was done.
    logger.warning("database connection lost on %s %s: %s", request.method, request.url.path, exc)
    await request.app.state.pool.expire_connections()
    detail = "the connection to the database was lost; try again"
    return JSONResponse(
        {"detail": detail},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "1"},
    )


async def _store_failed(request: Request, exc: Exception) -> JSONResponse:
    # The object store (where outputs are kept) failed to answer: unreachable or refusing.
    logger.warning("object store failed on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": f"{exc}; try again"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "5"},
    )


def install(app: FastAPI) -> None:
    """Register the handlers: bad input → 422, NotFound → 404, Conflict and lost races (our
    compare-and-sets, and PostgreSQL's deadlock and serialization aborts) → 409, a database
    connection dropped mid-request or an object store that fails → 503 with Retry-After, more
    tasks than the user's quota → 429 with Retry-After (413 for more than it ever allows at
    once)."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(QuotaExceeded, _over_quota)
    for conflict in (Conflict, StaleState, InvalidTransition):
        app.add_exception_handler(conflict, _conflict)
    for raced in (asyncpg.DeadlockDetectedError, asyncpg.SerializationError):
        app.add_exception_handler(raced, _raced)
    for lost in CONNECTION_LOST:
        app.add_exception_handler(lost, _connection_lost)
    app.add_exception_handler(ObjectStoreError, _store_failed)
