"""A pure-ASGI guard that refuses request bodies larger than a limit with 413.

The declared `Content-Length` is checked first; then the body is read (declared or chunked) and
counted, so a client that streams without a length is stopped at the limit too. The body is
buffered (at most the limit) and replayed to the app as one message, so nothing downstream ever
sees a partial body or has to deal with the limit itself.

A client sends its whole body before it reads the answer, and a server that closes with body
still unread makes the kernel reset the connection, which throws the answer away. So the rest of
an oversized body is read and discarded before the 413, up to `DRAIN_FACTOR` times the limit,
and the connection stays usable. A body beyond that bound is not read: the 413 is sent and the
connection closed, and such a client may see the connection reset instead of the answer. A
client that sent `Expect: 100-continue` has sent no body yet: it gets the 413 at once.
"""

import json
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: How many times the limit an oversized body is read (and discarded) to answer it cleanly.
DRAIN_FACTOR: Final = 4

_JSON: Final = [(b"content-type", b"application/json")]
_CLOSE: Final = [(b"connection", b"close")]


@dataclass(frozen=True)
class _Over:
    """An oversized body: its declared length (0: none), bytes read, whether it has ended."""

    declared: int
    read: int
    ended: bool


class _TooLarge(Exception):
    def __init__(self, over: _Over) -> None:
        super().__init__(over)
        self.over = over


class _Disconnected(Exception):
    pass


class BodyLimit:
    """Wraps an ASGI app; HTTP requests with more than `max_bytes` of body get a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is None:
            await _answer(send, 400, "the Content-Length header is not a number", close=True)
            return
        try:
            if declared > self.max_bytes:
                await self._refuse(scope, receive, send, _Over(declared, read=0, ended=False))
                return
            try:
                body = await self._read(receive)
            except _TooLarge as exc:
                await self._refuse(scope, receive, send, exc.over)
                return
        except _Disconnected:
            return  # the client went away before sending its body: nobody to answer
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        """The whole body; raises `_TooLarge` past the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk, more = await _next_chunk(receive)
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge(_Over(declared=0, read=size, ended=not more))
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, over: _Over) -> None:
        """The 413, once the rest of the body is discarded; one declared beyond the bound, or
        not sent yet (awaiting 100-continue), is not read: the connection is closed instead."""
        bound = DRAIN_FACTOR * self.max_bytes
        drained = over.ended or (
            over.declared <= bound
            and not (over.read == 0 and _expects_continue(scope))
            and await _drain(receive, over.read, bound)
        )
        detail = (
            f"request body is larger than the limit of {self.max_bytes} bytes"
            " (the api's VIGIL_MAX_BODY_BYTES setting)"
        )
        await _answer(send, 413, detail, close=not drained)


async def _next_chunk(receive: Receive) -> tuple[bytes, bool]:
    """The next piece of the body and whether more follows; raises `_Disconnected`."""
    message = await receive()
    if message["type"] != "http.request":
        raise _Disconnected
    return message.get("body", b""), message.get("more_body", False)


async def _drain(receive: Receive, read: int, bound: int) -> bool:
    """Read and discard the body up to `bound` bytes in all; whether it ended within it."""
    while read <= bound:
        chunk, more = await _next_chunk(receive)
        read += len(chunk)
        if not more:
            return read <= bound
    return False


def _content_length(scope: Scope) -> int | None:
    """The declared length, 0 when absent (chunked or no body), None when malformed."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            if not (text.isascii() and text.isdigit()):
                return None
            return int(text.lstrip("0")[:19] or "0")  # more digits: too large anyway
    return 0


def _expects_continue(scope: Scope) -> bool:
    return any(
        name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"]
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # after the body: wait for the disconnect, as a server would
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _answer(send: Send, status: int, detail: str, *, close: bool) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [*_JSON, (b"content-length", str(len(body)).encode()), *(_CLOSE if close else [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
