"""A pure-ASGI guard that refuses request bodies larger than a limit with 413.

The declared `Content-Length` is checked first; then the body is read (declared or chunked) and
counted, so a client that lies or streams without a length is stopped at the limit too. The body
is buffered (at most the limit) and replayed to the app as one message, so nothing downstream
ever sees a partial body or has to deal with the limit itself.
"""

import json
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_JSON: Final = [(b"content-type", b"application/json")]


class _TooLarge(Exception):
    pass


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
            await _answer(send, 400, "the Content-Length header is not a number")
            return
        if declared > self.max_bytes:
            await _answer(send, 413, self._too_large())
            return
        try:
            body = await self._read(receive)
        except _TooLarge:
            await _answer(send, 413, self._too_large())
            return
        except _Disconnected:
            return  # the client went away before sending its body: nobody to answer
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        """The whole body; raises `_TooLarge` past the limit, `_Disconnected` if the client left."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes} bytes"


def _content_length(scope: Scope) -> int | None:
    """The declared length, 0 when absent (chunked or no body), None when malformed."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            if not (text.isascii() and text.isdigit()):
                return None
            return int(text.lstrip("0")[:19] or "0")  # more digits: too large anyway
    return 0


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # after the body: wait for the disconnect, as a server would
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [*_JSON, (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
