"""The API's addresses: one, or the several apis of one installation
(`VIGIL_URL=http://a:8000,http://b:8000`).

A request goes to the api that answered last. When none answers, it goes to the next one,
but only if sending it again cannot do a thing twice (`may_resend`): it never reached the
first, it only reads, or it carries an `Idempotency-Key` (the API answers a repeated
submission with the job the first one made).
"""

from typing import Final

import httpx

from vigil import config
from vigil.calls import Call

_READS: Final = frozenset({"GET", "HEAD"})


class Endpoints:
    """The apis' base URLs, and the one requests go to now (`url`)."""

    def __init__(self, url: str) -> None:
        self.urls = config.check_urls(url)
        self._current = 0

    @property
    def url(self) -> str:
        return self.urls[self._current]

    def next(self) -> str:
        """Move on to the next api (after a failure); returns its URL."""
        self._current = (self._current + 1) % len(self.urls)
        return self.url


def may_resend(call: Call, error: httpx.TransportError) -> bool:
    """Whether `call`, which met `error`, may be sent to another api."""
    never_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
    return never_sent or call.method in _READS or "Idempotency-Key" in call.headers
